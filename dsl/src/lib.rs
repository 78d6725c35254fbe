//! Palladium's front end: the core kernel IR ([`ir`]), the call spec ([`spec`]) and the
//! tracing builder ([`trace`]) that `#[kernel]` functions run to produce a [`ir::Kernel`].

pub mod ir;
pub mod spec;

pub use ir::{DType, Kernel};
