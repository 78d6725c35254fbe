//! Palladium's decode megakernel (work in progress; see the module docs).
pub mod emit;
pub mod graph;
pub mod plan;
pub mod report;
pub mod rewrite;
