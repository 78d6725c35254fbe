//! The roofline cost model that ranks candidates from their [`Traffic`]: a *model*, not a
//! measurement. All per-chip constants live in [`ChipModel::of`], each an assumption taken
//! from published numbers (cited there) so they can be checked and replaced.
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
//! narrower than the MXU wastes it), non-bf16 MXU rates and megacore/two-core splitting.
//!
//! Ranking within one chip does not depend on the assumed clock: every term scales with it.

use crate::traffic::Traffic;
use palladium_dsl::spec::Chip;
use serde::Serialize;

/// Per-TensorCore throughput constants of one chip, as used by the model.
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
    /// The constants for `chip`. Sources (Google Cloud TPU system-architecture pages, per
    /// chip; a chip whose tensor cores are separate JAX devices is split per core):
    ///
    /// | chip | bf16 peak | HBM BW | clock | notes |
    /// |---|---|---|---|---|
    /// | v4  | 275 TFLOP/s  | 1200 GB/s | 1.05 GHz | megacore: both TCs are one device; not split |
    /// | v5e | 197 TFLOP/s  | 819 GB/s  | 1.5 GHz  | clock = 197e12 / (4 MXU × 128² × 2), derived |
    /// | v5p | 459 TFLOP/s  | 2765 GB/s | 1.75 GHz | megacore; clock derived as for v5e (2 TCs) |
    /// | v6e | 918 TFLOP/s  | 1640 GB/s | 1.75 GHz | clock = 918e12 / (4 MXU × 256² × 2), derived |
    /// | v7x | 2307 TFLOP/s | 7380 GB/s | 2.0 GHz  | per chip; 2 TCs are 2 devices, so halved; clock assumed (unpublished) |
    pub fn of(chip: Chip) -> ChipModel {
        const G: f64 = 1e9;
        const T: f64 = 1e12;
        let (hbm, flops, clock) = match chip {
            Chip::V4 => (1200.0 * G, 275.0 * T, 1.05 * G),
            Chip::V5e => (819.0 * G, 197.0 * T, 1.5 * G),
            Chip::V5p => (2765.0 * G, 459.0 * T, 1.75 * G),
            Chip::V6e => (1640.0 * G, 918.0 * T, 1.75 * G),
            Chip::V7x => (7380.0 * G / 2.0, 2307.0 * T / 2.0, 2.0 * G),
        };
        ChipModel { chip: chip.name(), hbm_bytes_per_s: hbm, mxu_bf16_flops_per_s: flops, clock_hz: clock, per_step_overhead_s: PER_STEP_OVERHEAD_S }
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
        ModelEstimate { hbm_cycles, mxu_cycles, overhead_cycles, cycles, bound: if hbm_cycles >= mxu_cycles { "hbm" } else { "mxu" } }
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
