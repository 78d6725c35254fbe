//! `palladium compile` and `palladium megakernel --compile`: a lowered kernel compiled by
//! libtpu, deviceless, through the runtime crate's workers (PJRT), with its code size, memory
//! stats and libtpu's static cycle estimate.

use palladium_dsl::spec::Chip;
use palladium_lowering::Lowered;
use palladium_runtime::{CallSpec, Compiled, Compiler, Estimate, Job, wrap};
use serde_json::{Value as Json, json};

/// A kernel compiled for a chip.
#[derive(Debug)]
pub struct CompileReport {
    pub kernel: String,
    pub chip: Chip,
    /// The StableHLO program libtpu compiled (`KERNEL.stablehlo.mlir`).
    pub stablehlo: String,
    /// The scoped VMEM the kernel is compiled against: its `vmem_limit_bytes`, else the
    /// chip's default (PJRT's memory stats cover HBM only).
    pub vmem_limit_bytes: u64,
    pub compiled: Compiled,
}

/// Wrap `lowered` and compile it for `chip` with libtpu's estimate (a compile the estimator
/// aborts is compiled again without it; `estimate_note` then says why there is no estimate).
pub fn compile(lowered: &Lowered, chip: Chip) -> Result<CompileReport, String> {
    let spec = CallSpec::from_json(&lowered.call_json)?;
    let stablehlo = wrap(&lowered.body, &spec)?;
    let compiler = Compiler::new(Estimate::Yes).map_err(|e| e.to_string())?.with_workers(1);
    let job = Job { program: stablehlo.clone(), chip, serialize: true };
    let compiled = compiler.compile_all_estimated(std::slice::from_ref(&job)).pop().expect("one result per job");
    let compiled = compiled.map_err(|e| format!("cannot compile `{}` for {chip}: {e}", spec.name))?;
    let vmem_limit_bytes = spec.vmem_limit_bytes.unwrap_or_else(|| chip.target().default_scoped_vmem_bytes);
    Ok(CompileReport { kernel: spec.name, chip, stablehlo, vmem_limit_bytes, compiled })
}

impl CompileReport {
    /// `ok`, `chip`, `code_size_bytes`, `vmem_limit_bytes`, `hbm`, `estimated_cycles`,
    /// `estimate_note`, `ops`.
    pub fn json(&self) -> Json {
        let c = &self.compiled;
        json!({
            "ok": true,
            "kernel": self.kernel,
            "chip": self.chip.name(),
            "code_size_bytes": c.code_size_bytes,
            "vmem_limit_bytes": self.vmem_limit_bytes,
            "hbm": c.hbm,
            "estimated_cycles": c.estimated_cycles,
            "estimate_note": c.estimate_note,
            "ops": c.ops,
        })
    }

    pub fn text(&self) -> String {
        let c = &self.compiled;
        let estimate = match (c.estimated_cycles, &c.estimate_note) {
            (Some(n), _) => format!("{n} cycles (libtpu's static estimate)"),
            (None, Some(why)) => format!("none: {why}"),
            (None, None) => "none".into(),
        };
        format!(
            "{} compiled by libtpu for {} (deviceless)\n  code size        {} bytes\n  VMEM limit       {} bytes\n  HBM              arguments {} B, outputs {} B, aliased {} B, temporaries {} B, peak {} B\n  estimated cycles {estimate}\n",
            self.kernel, self.chip, c.code_size_bytes, self.vmem_limit_bytes, c.hbm.argument_bytes, c.hbm.output_bytes, c.hbm.alias_bytes, c.hbm.temp_bytes, c.hbm.peak_bytes
        )
    }

    /// `NAME.stablehlo.mlir` and `NAME.executable` (the serialized PJRT executable).
    pub fn files(&self, name: &str) -> Vec<(String, Vec<u8>)> {
        vec![
            (format!("{name}.stablehlo.mlir"), self.stablehlo.clone().into_bytes()),
            (format!("{name}.executable"), self.compiled.executable.clone().unwrap_or_default()),
        ]
    }
}
