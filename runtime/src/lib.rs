//! libtpu in-process through PJRT: `pjrt-sys`'s bindings of the PJRT C API 0.54 header,
//! called from `ffi.rs` (libtpu 0.0.42.1 speaks 0.112 and accepts older callers, except for
//! the few argument structs `ffi.rs` extends). (The `pjrt` crate, a safe wrapper over the
//! same bindings, is not used: it sends the 0.54 structs that current plugins refuse for
//! `PJRT_Client_Create`, `PJRT_ExecuteOptions` and the compiled memory stats, hides the raw
//! handles needed to work around that, and has no bf16 host buffers.)
//!
//! - [`libtpu`]: find libtpu (`PALLADIUM_LIBTPU`, or the wheel in the TPU venv) and the
//!   deviceless topology of each chip.
//! - [`stablehlo`]: a lowered kernel (serialized Mosaic body + [`CallSpec`]) as the
//!   StableHLO `tpu_custom_call` program JAX would build for it.
//! - [`worker`]: [`Compiler`] compiles programs deviceless in worker processes, in
//!   parallel, with libtpu's static cycle estimate; a libtpu abort rejects one program.
//! - [`compile`]: what a worker does for one program (memory stats, serialized executable,
//!   the estimate read from libtpu's profile dump).
//! - [`exec`]: a PJRT client: compile for it, buffers, execute (several outputs, donated
//!   aliases), results back; libtpu's where a TPU is attached, XLA's CPU plugin in tests.

pub mod compile;
pub mod exec;
mod ffi;
pub mod libtpu;
pub mod stablehlo;
pub mod worker;

pub use compile::{Compiled, HbmStats, OpCycles};
pub use stablehlo::{ArrayType, CallSpec, wrap};
pub use worker::{CompileError, Compiler, Estimate, Job};
