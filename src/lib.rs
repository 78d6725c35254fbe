//! Palladium's entry crate: what an author of TPU kernels depends on. It re-exports the DSL
//! ([`dsl`], with [`macro@kernel`] and the [`prelude`]), lowering to Mosaic ([`lowering`]),
//! libtpu through PJRT ([`runtime`]), the CPU interpreter of the emitted Mosaic
//! ([`interpreter`]) and host arrays ([`mod@array`]), and adds a small API over them
//! ([`author`]): [`emit`] a kernel's files to a folder, [`compile_for`] a chip with libtpu,
//! [`interpret`] it on the CPU and [`interpret_against`] a reference. The CLI's commands are
//! the same code ([`check`], [`compile`], [`output`], [`profile`], [`run`]).
//!
//! ```ignore
//! use palladium::prelude::*;
//!
//! #[kernel(grid = (rows / block,), semantics = (parallel,))]
//! pub fn double(
//!     #[default(64)] rows: usize,
//!     #[default(8)] block: usize,
//!     #[input(f32[rows, 128], block = [block, 128], map = |i| (i, 0))] x: Ref,
//!     #[output(f32[rows, 128], block = [block, 128], map = |i| (i, 0))] o: Ref,
//! ) {
//!     o[..] = x[..] * 2.0;
//! }
//!
//! let k = double::build(&double::Params::default())?;
//! palladium::emit(&k, Chip::V6e, "out".as_ref())?;
//! ```
//!
//! `examples/` is such a crate, walked through in the book's first chapter
//! (`docs/guide.md`).

pub mod author;
pub mod check;
pub mod compile;
pub mod host_memory;
pub mod output;
pub mod profile;
pub mod run;

pub use author::{Comparison, Error, compile_for, emit, interpret, interpret_against};
pub use palladium_array as array;
pub use palladium_array::HostArray;
pub use palladium_dsl as dsl;
pub use palladium_dsl::Kernel;
pub use palladium_dsl::spec::Chip;
pub use palladium_interpret as interpreter;
pub use palladium_lowering as lowering;
/// `#[kernel]` for a crate that depends on `palladium`: its generated code reaches the DSL
/// through `::palladium::dsl` (`palladium_dsl::kernel` is the same macro through
/// `::palladium_dsl`).
pub use palladium_macros::kernel_in_palladium as kernel;
pub use palladium_runtime as runtime;

/// What kernel code imports: the DSL's prelude, with this crate's [`macro@kernel`].
pub mod prelude {
    pub use palladium_dsl::prelude::*;
    pub use palladium_macros::kernel_in_palladium as kernel;
}
