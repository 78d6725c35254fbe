//! Every integration test of this crate, in one binary: each former `tests/<file>.rs` is
//! a module of it (`cargo test -p palladium-kernels --test tests <file>::`),
//! so the test build links this crate's dependencies (MLIR among them) once, not once per
//! file. A new test file gets its `mod` line here (`autotests = false` in Cargo.toml).

mod ir_snapshots;
mod registry;
