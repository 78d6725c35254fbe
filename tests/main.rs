//! Every integration test of this crate, in one binary: each former `tests/<file>.rs` is
//! a module of it (`cargo test -p palladium --test tests <file>::`),
//! so the test build links this crate's dependencies (MLIR among them) once, not once per
//! file. A new test file gets its `mod` line here (`autotests = false` in Cargo.toml).

mod common;

mod cli;
mod docs;
mod fuzz_flags;
mod fuzz_kernels;
mod interpret;
mod jax_interop;
mod outputs;
mod profile;
mod quantized_kernels;
mod run;
mod test_binaries;
