//! Stage: the router. The post-attention norm of the residual stream (folded into the
//! router and FFN weights, or applied from a quantized plan's norm rows), the router's
//! logits (the dense stream's `Router` segment, or a quantized plan's own bf16 `router`
//! operand), the scoring and top-k, the distinct chosen experts to SMEM for
//! [`super::experts`], and the per-layer record of non-finite router logits.
//!
//! The routing is the model's as data ([`Choice`]): softmax or sigmoid scores, and for
//! `DeepSeek`-V3's router (GLM-4.5) the `correction_bias` operand's row (copied per MoE
//! layer) added to choose only, the expert groups and `routed_scaling_factor`. The logits
//! are the MXU's f32 products of the bf16 activations and weights, never rounded: what
//! transformers' f32 router (`RouterPrecision::F32`) computes, up to the folded norm.

use super::o_proj::OProjection;
use super::{Handles, LayerCopies, LayerOperand, Norm, WeightTile};
use crate::layout::OperandKind;
use crate::plan::Plan;
use crate::spmd::Spmd;
use palladium_dsl::build::{eq, ge, lt};
use palladium_dsl::prelude::*;
use palladium_kernels::body::{Choice, Routing, WeightLayout};
use palladium_model::spec::RouterScoring;
use std::ops::Range;

/// Where the router's weights arrive: as the last segment of each layer's dense stream
/// (bf16 plans), or whole per layer from its own operand (a quantized plan's, bf16, among
/// the layer's copies).
#[derive(Clone, Copy)]
enum RouterWeights {
    Segment,
    Own(LayerCopies),
}

#[derive(Clone, Copy)]
pub struct Router {
    weights: RouterWeights,
    norm: Norm,
    logits: Ref,
    non_finite: Ref,
    ids: Ref,
    /// The layer's correction-bias rows: the operand, its buffer, the copy's semaphore.
    correction_bias: Option<(Ref, Ref, SemRef)>,
    /// The layer's router-bias row (gpt-oss), as the correction bias's.
    bias: Option<(Ref, Ref, SemRef)>,
    spmd: Option<Spmd>,
}

impl Router {
    pub fn new(hs: &Handles) -> Router {
        let copies = LayerCopies::new(hs);
        Router {
            weights: copies.map_or(RouterWeights::Segment, RouterWeights::Own),
            norm: Norm::of(copies.map(|c| c.buffer(LayerOperand::Norms)), 1),
            logits: hs.buffer(hs.keys.router_logits),
            non_finite: hs.must(OperandKind::RouterNonFinite),
            ids: hs.buffer(hs.keys.expert_ids),
            correction_bias: hs.keys.correction_bias.map(|(buf, sem)| {
                (hs.must(OperandKind::CorrectionBias), hs.buffer(buf), hs.sems(sem))
            }),
            bias: hs
                .keys
                .router_bias
                .map(|(buf, sem)| (hs.must(OperandKind::RouterBias), hs.buffer(buf), hs.sems(sem))),
            spmd: hs.spmd,
        }
    }

    /// The prologue's: no layer's logits recorded non-finite yet.
    pub fn clear(self) {
        self.non_finite.store(.., 0.0);
    }

    /// The residual stream after attention ([`OProjection::residual`]), normed for the FFN.
    fn post_attention_norm(self, p: &Plan, o_proj: OProjection, layer: Val) -> Val {
        let x = o_proj.residual(layer);
        self.norm.apply(p, x)
    }

    /// A piece of the `Router` segment: its logit columns `seg_cols` from the weight tile
    /// `w`, on the normed post-attention residual `xn2` (computed at the first piece).
    pub fn piece(
        self,
        p: &Plan,
        o_proj: OProjection,
        layer: Val,
        xn2: &mut Option<Val>,
        w: Val,
        seg_cols: Range<u64>,
    ) {
        let xn = *xn2.get_or_insert_with(|| self.post_attention_norm(p, o_proj, layer));
        self.logits.store((.., seg_cols), WeightTile::Bf16(w).product(p, xn, WeightLayout::InOut));
    }

    /// After the layer's dense chunks: the normed post-attention residual, the router's
    /// logits computed from its own operand where they were not a segment.
    pub fn finish(self, p: &Plan, o_proj: OProjection, layer: Val, xn2: Option<Val>) -> Val {
        match (xn2, self.weights) {
            (Some(xn), _) => xn,
            (None, RouterWeights::Own(copies)) => {
                let xn = self.post_attention_norm(p, o_proj, layer);
                copies.dma(LayerOperand::Router, layer).wait();
                let w = copies.buffer(LayerOperand::Router).load(..);
                self.logits.store(.., WeightTile::Bf16(w).product(p, xn, WeightLayout::InOut));
                xn
            }
            (None, RouterWeights::Segment) => {
                panic!("a plan whose router is a dense-stream segment has the segment")
            }
        }
    }

    /// Scoring over the experts, top-k (lowest id wins ties), optional renormalisation; the
    /// distinct experts the real rows chose, in order of first choice (row-major,
    /// slot-minor), to SMEM: returns the routing and their count (each row's `top_k`
    /// choices are distinct, so at least `top_k`; at most [`Plan::distinct_experts`]). A
    /// choice that is not the first of its expert is stored to the trash entry past the
    /// list. Under EP only the device's own experts are listed, by local id (possibly
    /// none: entry 0 then holds local expert 0). Records which rows' router logits are not
    /// finite in lane `layer` of `router_non_finite`.
    pub fn route(self, p: &Plan, layer: Val) -> (Routing, Val) {
        let d = &p.dims;
        let k = d.top_k;
        let trash = p.distinct_experts() as i32;
        // A bias row of the layer (a small copy, waited at once: routing needs it).
        let row = |(operand, buf, sem): (Ref, Ref, SemRef)| {
            let copy = async_copy(operand.at(layer), buf, sem.at(0));
            copy.start();
            copy.wait();
            buf.load((0..1, ..))
        };
        let logits = self.logits.load(..);
        // gpt-oss's router bias: part of the logits (padding columns zero).
        let logits = match self.bias {
            Some(bias) => logits + row(bias),
            None => logits,
        };
        record_non_finite(p, self.non_finite, layer, logits);
        let sigmoid = d.scoring == RouterScoring::Sigmoid;
        let correction_bias = self.correction_bias.map(row);
        let choice = Choice { correction_bias, groups: d.expert_groups, scaling: d.routed_scaling };
        let routing = Routing::choosing(logits, d.experts, k, sigmoid, d.renormalize, choice);
        let own_first = self.spmd.and_then(|spmd| spmd.expert_first());
        if own_first.is_some() {
            self.ids.store(0, scalar(0));
        }
        let mut distinct = scalar(0);
        for r in 0..d.tokens {
            for j in 0..k {
                let id = routing.id(r as i32, j as i32);
                let first = routing.first_choice(r, j, id);
                let (listed, stored) = match own_first {
                    Some(lo) => {
                        (first & ge(id, lo) & lt(id, lo + d.experts_per_device as i32), id - lo)
                    }
                    None => (first, id),
                };
                self.ids.store(select(listed, distinct, trash), stored);
                distinct = select(listed, distinct + 1, distinct);
            }
        }
        (routing, distinct)
    }
}

/// Lane `layer` of `status` (`[rows, lanes]` f32): 1 on the real token rows whose router
/// `logits` (`[rows, experts_pad]`, the first `experts` columns real) hold a NaN or an
/// infinity, else 0. A few vector ops per layer, read by the host after the step.
fn record_non_finite(p: &Plan, status: Ref, layer: Val, logits: Val) {
    let d = &p.dims;
    let (rows, width) = (d.rows, d.experts_pad);
    let real = lt(iota([rows, width], 1), d.experts as i32);
    // `x * 0` is NaN exactly for NaN and infinities, and their sum is added.
    let poison = (select(real, logits, 0.0) * 0.0).sum_keepdims(1);
    let fine = eq(poison, 0.0) | ge(iota([rows, 1], 0), d.tokens as i32);
    let bad = select(fine, zeros([rows, 1], f32), 1.0);
    let lanes = status.shape().0[1];
    status.store(.., select(eq(iota([rows, lanes], 1), layer), bad, status.load(..)));
}
