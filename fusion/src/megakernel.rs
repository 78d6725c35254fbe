//! Compile apart from run: [`Megakernel::build`] takes a model and plan options to the
//! plan, the traced kernel, its layout and the lowered module, and stops there. Running it
//! (packing weights, decoding, comparing with references) is the run layer's
//! (`palladium-decode`), on top of what this returns.

use crate::emit::emit;
use crate::layout::StreamLayout;
use crate::plan::{Plan, PlanError, PlanOptions};
use palladium_dsl::{BuildErrors, Kernel};
use palladium_lowering::{LowerError, LowerOptions, Lowered, lower};
use palladium_model::ModelSpec;

/// Why a megakernel could not be built; each message says which step refused it.
#[derive(Debug, thiserror::Error)]
pub enum MegakernelError {
    #[error("megakernel refused: {0}")]
    Plan(#[from] PlanError),
    #[error("cannot build the megakernel:\n{0}")]
    Emit(BuildErrors),
    #[error("cannot lower the megakernel for {chip}:\n{error}")]
    Lower { chip: palladium_dsl::spec::Chip, error: LowerError },
}

/// A decode megakernel, compiled: the plan (and its [`StreamLayout`]), the verified kernel,
/// and the Mosaic module, serialized body and call spec lowered from it for the plan's chip.
#[derive(Debug)]
pub struct Megakernel {
    pub plan: Plan,
    pub kernel: Kernel,
    pub lowered: Lowered,
}

impl Megakernel {
    /// Plan, emit and lower the megakernel of `spec` for `options`.
    pub fn build(spec: &ModelSpec, options: &PlanOptions) -> Result<Megakernel, MegakernelError> {
        Megakernel::from_plan(Plan::new(spec, options)?)
    }

    /// Emit and lower the megakernel of a plan already made (a caller that checks the plan
    /// first, as `palladium run` checks host memory, does not plan twice).
    pub fn from_plan(plan: Plan) -> Result<Megakernel, MegakernelError> {
        let kernel = emit(&plan).map_err(MegakernelError::Emit)?;
        let chip = plan.chip;
        let lowered = lower(&kernel, &LowerOptions { chip })
            .map_err(|error| MegakernelError::Lower { chip, error })?;
        Ok(Megakernel { plan, kernel, lowered })
    }

    /// Where every operand and weight sits: what the weight packer fills.
    pub fn layout(&self) -> &StreamLayout {
        &self.plan.layout
    }
}
