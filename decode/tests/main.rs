//! Every integration test of this crate, in one binary: each former `tests/<file>.rs` is
//! a module of it (`cargo test -p palladium-decode --test tests <file>::`),
//! so the test build links this crate's dependencies (MLIR among them) once, not once per
//! file. A new test file gets its `mod` line here (`autotests = false` in Cargo.toml).

#[path = "../../model/tests/hf_oracle/mod.rs"]
mod hf_oracle;

mod devices;
mod hf_conformance;
mod interpret;
mod latent;
mod layer_kinds;
mod numerics;
mod quantized;
mod routing;
mod verify;
