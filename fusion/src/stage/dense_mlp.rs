//! Stage: a dense-MLP layer's FFN (Qwen3-MoE's `mlp_only_layers` / `decoder_sparse_step`):
//! its chunks (`[gate^T | up^T | down]`, the post-attention norm folded, as an expert's)
//! from `w_mlp` through [`ExpertRing`], every row at weight 1. On N devices each holds its
//! slice of the intermediate columns; the accumulator's all-reduce sums them.

use super::Handles;
use super::expert_ring::{ExpertRing, RingWeights};
use crate::layout::OperandKind;
use crate::plan::Plan;
use palladium_dsl::prelude::*;

#[derive(Clone, Copy)]
pub struct DenseMlp {
    /// `w_mlp` (and a quantized plan's `mlp_scales`, `mlp_down_scales`), where layers mix
    /// kinds.
    weights: Option<RingWeights>,
}

impl DenseMlp {
    pub fn new(hs: &Handles) -> DenseMlp {
        DenseMlp {
            weights: RingWeights::of(
                hs,
                OperandKind::WMlp,
                OperandKind::MlpScales,
                OperandKind::MlpDownScales,
            ),
        }
    }

    /// The MLP of dense layer `slot` (its slot in `w_mlp`) on `xn2`.
    pub fn emit(self, p: &Plan, ring: ExpertRing, slot: Val, xn2: Val) {
        let weights = self.weights.expect("a plan with dense-MLP layers has w_mlp");
        let chunks = p.layout.mlp_chunks;
        let fetch = |_: Val, c: Val, ring_slot: Val| ring.fetch(weights, (slot, c), ring_slot);
        let ahead = (p.expert_slots - 1).min(chunks - 1);
        let intermediate = p.dims.dense_intermediate.expect("a plan with dense-MLP layers");
        ring.stream(p, scalar(chunks as i32), ahead, chunks, fetch, |ring_slot, _, _| {
            (ring.swiglu(p, ring_slot, xn2, intermediate), None)
        });
    }
}
