//! Palladium's interpret mode: run the Mosaic module we actually hand to libtpu (the
//! serialized `stable_mosaic` body text) on the CPU.
//!
//! JAX Pallas's interpret mode runs the kernel *before* lowering, so lowering bugs slip
//! through. This crate runs the *lowered* module: a wrong index map, a swapped dimension
//! number or a missing DMA wait shows up as a wrong answer (or a named error) on the CPU.
//!
//! ```text
//! let module = Module::parse(&lowered.body)?;    // generic MLIR, no MLIR dependency
//! let program = module.prepare()?;               // slots + typed instructions, once
//! let outputs = program.run(&[x, y])?;           // scalar prefetch, then inputs
//! ```
//!
//! Map of the crate:
//! - `parse/`: the text → [`parse::ModuleAst`] (generic ops, regions, types, attributes).
//! - `prepare.rs`: [`parse::ModuleAst`] → [`Program`] (numbered value slots, one typed
//!   instruction per op, every attribute resolved).
//! - `value.rs`: element types, tiles and the elementwise math (bf16 rounded to nearest even
//!   after every op that produces it).
//! - `view.rs`: memref views (a box of a buffer) and their overlap test.
//! - `memory.rs`: buffers, resolving views against them, the DMA/semaphore model and race
//!   detection.
//! - `exec.rs`: the instruction loop, matmul, reductions, shape ops.
//! - `gemm.rs`: the tile matmul kernel (a fixed order of products: k in pairs for bf16, as
//!   `vdpbf16ps` takes them, k in order otherwise; AVX-512 when present).
//! - `grid.rs`: the grid walk (points of leading `parallel` dims on the rayon pool),
//!   `transform_N` block indices, window copy-in/write-back.
//! - `devices.rs`: N virtual devices of a mesh ([`Program::run_devices`]): turns, remote
//!   copies and signals between them, deadlock detection.
//! - `recycle.rs`: large vectors kept from run to run (no page faults per run).
//! - `host.rs`: host arrays ([`HostArray`], the project's one, from `palladium-array`) to and
//!   from the interpreter's values, and [`CallSpec`].

// Errors carry the op site and grid point by value; they are cold.
#![allow(clippy::result_large_err)]

mod devices;
mod error;
mod exec;
mod gemm;
mod grid;
mod host;
mod memory;
pub mod parse;
mod prepare;
mod recycle;
mod rules;
mod value;
mod view;

pub use error::{ErrorKind, InterpError, OpSite};
pub use host::{CallSpec, parse_array_type};
pub use memory::Space;
pub use palladium_array::HostArray;
pub use parse::ParseError;
pub use prepare::Program;
pub use value::DType;

/// A parsed module (keeps its text for error messages).
#[derive(Clone, Debug)]
pub struct Module {
    pub ast: parse::ModuleAst,
    text: String,
}

impl Module {
    /// Parse the serialized body (`module attributes {stable_mosaic.version = …} {…}`) or any
    /// module in generic op form.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        Ok(Module { ast: parse::parse_module(text)?, text: text.to_string() })
    }

    /// The `stable_mosaic.version` attribute, if any.
    pub fn version(&self) -> Option<i64> {
        self.ast
            .attrs
            .iter()
            .find(|(k, _)| k == "stable_mosaic.version")
            .and_then(|(_, v)| v.as_int())
    }

    /// Translate into an executable [`Program`].
    pub fn prepare(&self) -> Result<Program, InterpError> {
        prepare::prepare(&self.ast, &self.text)
    }
}

/// Parse, prepare and run in one go.
pub fn run(text: &str, inputs: &[HostArray]) -> Result<Vec<HostArray>, Box<dyn std::error::Error>> {
    let p = Module::parse(text)?.prepare()?;
    Ok(p.run(inputs)?)
}
