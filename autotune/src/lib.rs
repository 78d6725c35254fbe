//! Block-size search for Palladium's library kernels.
//!
//! A Pallas kernel's block sizes decide how often the grid pipeline re-reads each operand
//! from HBM, how many grid steps pay the per-step overhead, and whether the double-buffered
//! blocks fit the chip's VMEM. This crate searches a space of compile-time parameters:
//!
//! 1. [`SearchSpace`] enumerates candidates (cartesian product, deterministic order);
//! 2. each is built through [`palladium_kernels::build`] and verified for the chip
//!    ([`palladium_dsl::ir::verify`] with the chip's VMEM budget); failures are kept as
//!    rejections with their reason;
//! 3. a [`Runner`] costs the survivors. [`CompileOnly`] uses the static pipeline traffic
//!    model ([`traffic`]) and a roofline *model* of the chip ([`model`]); [`Libtpu`]
//!    lowers each candidate and takes libtpu's estimated cycles (deviceless, through PJRT
//!    in parallel worker processes);
//! 4. [`SearchReport::ranking`] orders them by cost, ties by enumeration order.
//!
//! ```no_run
//! use palladium_autotune::{CompileOnly, SearchSpace, search};
//! use palladium_dsl::spec::Chip;
//! let space = SearchSpace::new("matmul").param("bm", [128, 256, 512]).param("bn", [128, 256, 512]);
//! let report = search(&space, Chip::V6e, &mut CompileOnly::new()).unwrap();
//! println!("{}", report.table());
//! ```

pub mod floor;
pub mod libtpu;
pub mod model;
pub mod runner;
pub mod search;
pub mod traffic;

pub use libtpu::Libtpu;
pub use model::{ChipModel, ModelEstimate};
pub use runner::{CompileOnly, CostKind, CostRecord, Runner, RunnerError};
pub use search::{
    Candidate, CandidateResult, Outcome, SearchError, SearchReport, SearchSpace, Stage, search,
};
pub use traffic::{OperandTraffic, Prefetch, Traffic, TrafficError, analyze};
