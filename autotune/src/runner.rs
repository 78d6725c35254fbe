//! Runners: what turns one built, verified candidate kernel into a [`CostRecord`].
//!
//! The search only needs a cost per candidate and does not care where it comes from, so the
//! trait is deliberately small: [`CompileOnly`] prices a kernel with the static traffic model
//! and the roofline model ([`crate::model`]); [`crate::Libtpu`], which lowers the kernel and
//! reads libtpu's cycle counts through PJRT, implements the same trait and returns
//! [`CostKind::Measured`] records (keeping the model's traffic alongside if it likes).

use crate::model::{ChipModel, ModelEstimate};
use crate::traffic::{Prefetch, Traffic, analyze};
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use serde::Serialize;

/// Whether a cost was computed by a model or measured on (or by) the real toolchain.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostKind {
    Modeled,
    Measured,
}

/// The cost of one candidate, as a runner reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostRecord {
    /// [`Runner::name`] of the runner that produced it.
    pub runner: String,
    pub kind: CostKind,
    /// The ranking key, in cycles of the chip: lower is better. Only records from the same
    /// runner and chip are comparable.
    pub cycles: f64,
    /// The pipeline traffic, when the runner computed it.
    pub traffic: Option<Traffic>,
    /// The model's terms, for modelled costs.
    pub model: Option<ModelEstimate>,
}

/// Why a runner could not cost a candidate (the search records it as a rejection).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RunnerError(pub String);

/// Something that prices a verified kernel on a chip.
pub trait Runner {
    /// Short name recorded in reports, e.g. `compile-only`.
    fn name(&self) -> &str;
    /// Cost `kernel` (already built and verified for `chip`).
    fn run(&mut self, kernel: &Kernel, chip: Chip) -> Result<CostRecord, RunnerError>;

    /// Cost many kernels at once, one result per kernel in order. The search calls this
    /// with every verified candidate; the default runs [`Runner::run`] on each in turn.
    /// Runners with a costly start (libtpu) override it to share starts and compile in parallel.
    fn run_batch(
        &mut self,
        kernels: &[&Kernel],
        chip: Chip,
    ) -> Vec<Result<CostRecord, RunnerError>> {
        kernels.iter().map(|k| self.run(k, chip)).collect()
    }
}

/// The compile-only runner: the static pipeline traffic model priced by the roofline model
/// of [`ChipModel`]. No device, no lowering; deterministic.
#[derive(Clone, Debug, Default)]
pub struct CompileOnly {
    /// Contents of scalar-prefetch arrays that index maps read.
    pub prefetch: Prefetch,
}

impl CompileOnly {
    pub fn new() -> CompileOnly {
        CompileOnly::default()
    }

    pub fn with_prefetch(prefetch: Prefetch) -> CompileOnly {
        CompileOnly { prefetch }
    }
}

impl Runner for CompileOnly {
    fn name(&self) -> &str {
        "compile-only"
    }

    fn run(&mut self, kernel: &Kernel, chip: Chip) -> Result<CostRecord, RunnerError> {
        let traffic = analyze(kernel, &self.prefetch)
            .map_err(|e| RunnerError(format!("traffic model: {e}")))?;
        let model = ChipModel::of(chip).estimate(&traffic);
        Ok(CostRecord {
            runner: self.name().to_string(),
            kind: CostKind::Modeled,
            cycles: model.cycles,
            traffic: Some(traffic),
            model: Some(model),
        })
    }
}
