//! The roofline cost model that ranks candidates from their [`Traffic`]: a *model*, not a
//! measurement. Its per-chip figures come from the one target table
//! ([`palladium_dsl::target`], sources cited there), taken per device: a library kernel's
//! parallel grid dimensions use every TensorCore of its device.
//!
//! ```text
//! modeled_cycles = max(hbm_bytes / hbm_bytes_per_cycle, mxu_flops / mxu_flops_per_cycle)
//!                + grid_steps * per_step_overhead_cycles
//! ```
//!
//! Why this shape: the Pallas pipeline overlaps the DMA of block `s + 1` with the compute of
//! block `s`, so a well-pipelined kernel costs roughly its larger side (HBM or MXU), and every
//! grid step pays a fixed pipeline cost (DMA issue, semaphore waits, loop bookkeeping). It
//! ignores the exposed prologue/epilogue DMAs, VPU/EUP work, MXU shape efficiency (a block
//! narrower than the MXU wastes it), non-bf16 MXU rates and how evenly a grid splits across
//! the two TensorCores of a megacore device.
//!
//! Ranking within one chip does not depend on the assumed clock: every term scales with it.

use crate::traffic::Traffic;
use palladium_dsl::spec::Chip;
use serde::Serialize;

/// One device's throughput figures, as the model uses them.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct ChipModel {
    pub chip: &'static str,
    /// HBM bandwidth one kernel sees, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Peak dense bf16 MXU throughput one kernel sees, flop/s.
    pub mxu_bf16_flops_per_s: f64,
    /// Clock used to express the model in cycles, Hz.
    pub clock_hz: f64,
    /// Fixed cost of one grid step, seconds.
    pub per_step_overhead_s: f64,
}

/// The per-grid-step pipeline overhead: ~0.35 µs, the figure the JAX Pallas TPU guides quote
/// for the cost of one grid iteration. Assumed equal on every chip.
pub const PER_STEP_OVERHEAD_S: f64 = 0.35e-6;

impl ChipModel {
    /// The figures for `chip`: one device's HBM bandwidth and bf16 peak, at the chip's clock.
    pub fn of(chip: Chip) -> ChipModel {
        let t = chip.target();
        ChipModel {
            chip: chip.name(),
            hbm_bytes_per_s: t.hbm_bandwidth_per_device(),
            mxu_bf16_flops_per_s: t.bf16_flops_per_device(),
            clock_hz: t.clock_hz,
            per_step_overhead_s: PER_STEP_OVERHEAD_S,
        }
    }

    pub fn hbm_bytes_per_cycle(&self) -> f64 {
        self.hbm_bytes_per_s / self.clock_hz
    }

    pub fn mxu_flops_per_cycle(&self) -> f64 {
        self.mxu_bf16_flops_per_s / self.clock_hz
    }

    pub fn per_step_overhead_cycles(&self) -> f64 {
        self.per_step_overhead_s * self.clock_hz
    }

    /// Apply the model to one candidate's traffic.
    pub fn estimate(&self, t: &Traffic) -> ModelEstimate {
        let hbm_cycles = t.hbm_bytes() as f64 / self.hbm_bytes_per_cycle();
        let mxu_cycles = t.mxu_flops as f64 / self.mxu_flops_per_cycle();
        let overhead_cycles = t.grid_steps as f64 * self.per_step_overhead_cycles();
        let cycles = hbm_cycles.max(mxu_cycles) + overhead_cycles;
        ModelEstimate {
            hbm_cycles,
            mxu_cycles,
            overhead_cycles,
            cycles,
            bound: if hbm_cycles >= mxu_cycles { "hbm" } else { "mxu" },
        }
    }
}

/// The model's terms for one candidate (all in cycles at [`ChipModel::clock_hz`]).
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct ModelEstimate {
    pub hbm_cycles: f64,
    pub mxu_cycles: f64,
    pub overhead_cycles: f64,
    /// `max(hbm_cycles, mxu_cycles) + overhead_cycles`.
    pub cycles: f64,
    /// Which side of the roofline dominates: `hbm` or `mxu`.
    pub bound: &'static str,
}
