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
    /// The devices the program runs on (1 but for a mesh kernel) and the deviceless
    /// topology libtpu compiled it for (`palladium_runtime::libtpu::topology`).
    pub devices: u64,
    pub topology: &'static str,
    pub compiled: Compiled,
}

/// Wrap `lowered` and compile it for `chip` with libtpu's estimate (a compile the estimator
/// aborts is compiled again without it; `estimate_note` then says why there is no estimate).
pub fn compile(lowered: &Lowered, chip: Chip) -> Result<CompileReport, String> {
    let spec = CallSpec::from_json(&lowered.call_json)?;
    let stablehlo = wrap(&lowered.body, &spec)?;
    let devices = spec.devices.unwrap_or(1);
    // Refused here, before a worker starts, when no slice of the chip has the devices.
    let topology = palladium_runtime::libtpu::topology(chip, devices)
        .map_err(|e| format!("cannot compile `{}` for {chip}: {e}", spec.name))?;
    let compiler = Compiler::new(Estimate::Yes).map_err(|e| e.to_string())?.with_workers(1);
    let job = Job { program: stablehlo.clone(), chip, serialize: true };
    let compiled = compiler
        .compile_all_estimated(std::slice::from_ref(&job))
        .pop()
        .expect("one result per job");
    let mut compiled =
        compiled.map_err(|e| format!("cannot compile `{}` for {chip}: {e}", spec.name))?;
    if spec.has_communication == Some(true) {
        withhold_estimate(&mut compiled, devices);
    }
    let vmem_limit_bytes =
        spec.vmem_limit_bytes.unwrap_or_else(|| chip.target().default_scoped_vmem_bytes);
    Ok(CompileReport {
        kernel: spec.name,
        chip,
        stablehlo,
        vmem_limit_bytes,
        devices,
        topology,
        compiled,
    })
}

/// No cycle figure for a kernel that communicates: libtpu's static estimator prices remote
/// DMAs and semaphore signals at 0 cycles, so what it reports (the copies around the custom
/// call) says nothing about the kernel's own time. `estimate_note` says so.
fn withhold_estimate(compiled: &mut Compiled, devices: u64) {
    let priced = compiled
        .estimated_cycles
        .map_or(String::new(), |n| format!(" (it reports {n} cycles, the copies around the call)"));
    compiled.estimate_note = Some(format!(
        "not given for a kernel that communicates ({devices} devices): libtpu's static estimator prices remote DMAs at 0 cycles{priced}"
    ));
    compiled.estimated_cycles = None;
    compiled.ops.clear();
}

impl CompileReport {
    /// `ok`, `chip`, `devices`, `topology`, `code_size_bytes`, `vmem_limit_bytes`, `hbm`, `estimated_cycles`,
    /// `estimate_note`, `ops`.
    pub fn json(&self) -> Json {
        let c = &self.compiled;
        json!({
            "ok": true,
            "kernel": self.kernel,
            "chip": self.chip.name(),
            "devices": self.devices,
            "topology": self.topology,
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
        let devices = if self.devices > 1 {
            format!(", {} devices of {}", self.devices, self.topology)
        } else {
            String::new()
        };
        format!(
            "{} compiled by libtpu for {} (deviceless{devices})\n  code size        {} bytes\n  VMEM limit       {} bytes\n  HBM              arguments {} B, outputs {} B, aliased {} B, temporaries {} B, peak {} B\n  estimated cycles {estimate}\n",
            self.kernel,
            self.chip,
            c.code_size_bytes,
            self.vmem_limit_bytes,
            c.hbm.argument_bytes,
            c.hbm.output_bytes,
            c.hbm.alias_bytes,
            c.hbm.temp_bytes,
            c.hbm.peak_bytes
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
