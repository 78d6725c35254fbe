//! Palladium's lowering: a verified [`Kernel`] → Mosaic MLIR, the IR JAX Pallas hands to
//! libtpu.
//!
//! [`lower`] produces three texts:
//! - [`Lowered::module`]: the Mosaic module as Pallas ships it (uncanonicalized; `tpu` ops in
//!   generic form because the `tpu` dialect is not registered here),
//! - [`Lowered::canonical`]: the same after MLIR's `canonicalize` + `cse`, which is what
//!   Pallas prints with `debug=True`,
//! - [`Lowered::body`]: the serialized `stable_mosaic` text for the `tpu_custom_call` body,
//!   (`module` and `body` carry each op's Rust source line as `loc("kernels/src/foo.rs":L:C)`),
//! - [`Lowered::call_json`]: the oracle's call spec.
//!
//! Map of the crate:
//! - `context.rs`: the MLIR context (dialects, unregistered `tpu`, diagnostics capture).
//! - `tpu.rs`: the only place that spells `tpu` ops, attributes and types.
//! - `types.rs`: our types → MLIR types.
//! - `rules/`: one lowering rule per op family, dispatched by one exhaustive `match`.
//! - `grid.rs`: the kernel `func.func`, its Mosaic attributes and the `transform_N` funcs.
//! - `serialize.rs`: the `stable_mosaic` body (and why version 15).
//! - `call_spec.rs`: the oracle call JSON.
//!
//! No melior type appears in this API: MLIR lives and dies inside [`lower`].

mod build;
mod call_spec;
mod context;
mod error;
mod grid;
mod rules;
mod serialize;
mod tpu;
mod types;

pub use error::{LowerError, OpError};
pub use serialize::VERSION as SERIALIZATION_VERSION;

use context::MlirContext;
use melior::{
    ir::{
        Module,
        operation::{OperationLike, OperationPrintingFlags},
    },
    pass::{PassManager, transform},
};
use palladium_dsl::ir::{Kernel, VerifyOptions, verify};
use palladium_dsl::spec::Chip;

/// What to lower for.
#[derive(Copy, Clone, Debug)]
pub struct LowerOptions {
    /// The chip the kernel's VMEM budget is checked against.
    pub chip: Chip,
}

/// The lowered kernel.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The pretty Mosaic module (Pallas's op sequence, before canonicalization).
    pub module: String,
    /// `module` after MLIR `canonicalize` + `cse`: what Pallas prints with `debug=True`.
    pub canonical: String,
    /// The serialized `stable_mosaic` text for the `tpu_custom_call` body.
    pub body: String,
    /// The oracle call spec JSON (`inputs`, `outputs`, `vmem_limit_bytes`,
    /// `input_output_aliases`, `name`).
    pub call_json: String,
}

/// Verify `kernel`, lower it to Mosaic MLIR, verify that with MLIR, and print it.
pub fn lower(kernel: &Kernel, options: &LowerOptions) -> Result<Lowered, LowerError> {
    verify(kernel, VerifyOptions { chip: Some(options.chip) })
        .map_err(|errors| LowerError::Verify { kernel: kernel.name.clone(), errors })?;
    let mc = MlirContext::new();
    let ctx = &mc.ctx;
    let mut module = Module::new(rules::location(ctx, kernel.loc));
    {
        let emitted = grid::build(ctx, kernel, &module)?;
        if let Err(diagnostics) = mc.verify(&module.as_operation()) {
            return Err(blame(&mc, kernel, &emitted, diagnostics));
        }
    }
    let text = with_locations(&kernel.name, &module.as_operation())?;
    let body = serialize::serialize(&mc, &kernel.name, &module)?;

    let pm = PassManager::new(ctx);
    pm.add_pass(transform::create_canonicalizer());
    pm.add_pass(transform::create_cse());
    mc.take_diagnostics();
    if let Err(e) = pm.run(&mut module) {
        return Err(LowerError::Module {
            kernel: kernel.name.clone(),
            loc: kernel.loc,
            message: format!("canonicalization failed: {e}"),
            diagnostics: mc.take_diagnostics(),
        });
    }
    let canonical = module.as_operation().to_string();
    Ok(Lowered { module: text, canonical, body, call_json: call_spec::call_json(kernel) })
}

/// `op` printed with its source locations (`loc("kernels/src/foo.rs":12:5)`, as Pallas's
/// modules carry Python lines), so that the interpreter's and libtpu's errors name the Rust line.
pub(crate) fn with_locations<'c: 'a, 'a>(
    kernel: &str,
    op: &impl OperationLike<'c, 'a>,
) -> Result<String, LowerError> {
    op.to_string_with_flags(OperationPrintingFlags::new().enable_debug_info(true, false)).map_err(
        |e| LowerError::Module {
            kernel: kernel.to_string(),
            loc: None,
            message: format!("printing the module: {e}"),
            diagnostics: Vec::new(),
        },
    )
}

/// Turn a failed module verification into an error about the kernel op whose MLIR failed:
/// ops without regions first (their failure is their own), then region ops.
fn blame(
    mc: &MlirContext,
    k: &Kernel,
    emitted: &grid::Emitted<'_, '_>,
    module_diags: Vec<String>,
) -> LowerError {
    for with_regions in [false, true] {
        for (op, mop) in emitted {
            if (mop.region_count() > 0) != with_regions {
                continue;
            }
            if let Err(diags) = mc.verify(mop) {
                return rules::op_error(
                    k,
                    *op,
                    "the MLIR this op lowers to does not verify".into(),
                    diags,
                );
            }
        }
    }
    LowerError::Module {
        kernel: k.name.clone(),
        loc: k.loc,
        message: "the Mosaic module does not verify".into(),
        diagnostics: module_diags,
    }
}
