//! The `palladium` package's library side: what the CLI does, callable from tests and
//! benches.

pub mod check;
pub mod compile;
pub mod host_memory;
pub mod output;
pub mod profile;
pub mod run;
