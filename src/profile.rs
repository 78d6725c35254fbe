//! `palladium profile --megakernel ... --unfused`: the same decode step split into library
//! kernels (`palladium_fusion::unfused`), each profiled by the same model, plus a fixed cost
//! per call (the calibration's `kernel_call_cycles`: libtpu's estimate of a minimal call,
//! since no published launch cost exists).

use palladium_dsl::spec::Chip;
use palladium_model::ModelSpec;
use palladium_profile::calibration::Coefficients;
use palladium_profile::{Inputs, simulate};
use serde_json::{Value as Json, json};
use std::fmt::Write;

/// One library kernel of the unfused step under the model.
#[derive(Debug)]
pub struct UnfusedCall {
    pub label: String,
    pub kernel: &'static str,
    pub times: u64,
    /// The model's cycles of one call, without the per-call cost.
    pub cycles: f64,
}

/// The unfused step: every kernel's model cycles times its calls, plus the per-call cost.
#[derive(Debug)]
pub struct UnfusedStep {
    pub calls: Vec<UnfusedCall>,
    pub call_cycles: f64,
}

impl UnfusedStep {
    pub fn new(
        spec: &ModelSpec,
        layers: usize,
        batch: u64,
        context: u64,
        chip: Chip,
        c: &Coefficients,
    ) -> Result<UnfusedStep, String> {
        let mut calls = Vec::new();
        for k in palladium_fusion::unfused::unfused_kernels(spec, layers, batch, context)? {
            let built = palladium_kernels::build(k.kernel, &k.settings)
                .map_err(|e| format!("unfused {}: {e}", k.label))?;
            let t = simulate(&built, chip, c, &Inputs::default())
                .map_err(|e| format!("unfused {}: {e}", k.label))?;
            calls.push(UnfusedCall {
                label: k.label,
                kernel: k.kernel,
                times: k.times,
                cycles: t.cycles,
            });
        }
        Ok(UnfusedStep { calls, call_cycles: c.kernel_call_cycles })
    }

    pub fn call_count(&self) -> u64 {
        self.calls.iter().map(|c| c.times).sum()
    }

    /// Every call's model cycles plus its fixed cost.
    pub fn cycles(&self) -> f64 {
        self.calls.iter().map(|c| c.times as f64 * (c.cycles + self.call_cycles)).sum()
    }

    pub fn text(&self, fused_cycles: f64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "unfused step ({} calls of library kernels, each + {:.0} cycles: libtpu's estimate of a minimal call, as no published launch cost exists):",
            self.call_count(),
            self.call_cycles
        );
        for c in &self.calls {
            let _ = writeln!(
                s,
                "  {:<38} {:<18} {:>10.0} cycles x {}",
                c.label, c.kernel, c.cycles, c.times
            );
        }
        let _ = writeln!(
            s,
            "  total {:.0} cycles; fused / unfused {:.3}",
            self.cycles(),
            fused_cycles / self.cycles()
        );
        s
    }

    pub fn json(&self, fused_cycles: f64) -> Json {
        json!({
            "calls": self.calls.iter().map(|c| json!({"label": c.label, "kernel": c.kernel, "times": c.times, "cycles": c.cycles})).collect::<Vec<_>>(),
            "call_cycles": self.call_cycles,
            "cycles": self.cycles(),
            "fused_over_unfused": fused_cycles / self.cycles(),
        })
    }
}
