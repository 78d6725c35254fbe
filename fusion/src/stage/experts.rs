//! Stage: the routed experts. Each distinct expert the router listed is fetched once by id
//! (right after routing), chunk by chunk through [`ExpertRing`], and applied to every row
//! at that row's routing weight for it (zero for rows that did not choose it). A shared
//! expert streams first in the same item stream: its entries of `w_experts` (after the
//! device's experts), every real row at its gate's weight (`sigmoid` of the router logit
//! column after the experts', or 1 ungated).

use super::expert_ring::{ExpertRing, RingWeights};
use super::{Handles, clamp_index};
use crate::layout::OperandKind;
use crate::plan::{ExpertFetch, Plan};
use crate::spmd::Spmd;
use palladium_dsl::build::{ge, lt};
use palladium_dsl::prelude::*;
use palladium_kernels::body::Routing;

#[derive(Clone, Copy)]
pub struct RoutedExperts {
    /// `w_experts` (and a quantized plan's `expert_scales`, `expert_down_scales`).
    weights: RingWeights,
    ids: Ref,
    /// The router's logits (a sigmoid-gated shared expert's gate logit after the experts').
    logits: Ref,
    spmd: Option<Spmd>,
}

impl RoutedExperts {
    pub fn new(hs: &Handles) -> RoutedExperts {
        let weights = RingWeights::of(
            hs,
            OperandKind::WExperts,
            OperandKind::ExpertScales,
            OperandKind::ExpertDownScales,
        );
        RoutedExperts {
            weights: weights
                .expect("the plan's layout has no w_experts operand")
                .with_bias(hs, OperandKind::ExpertBias),
            ids: hs.buffer(hs.keys.expert_ids),
            logits: hs.buffer(hs.keys.router_logits),
            spmd: hs.spmd,
        }
    }

    /// The expert stream of MoE layer `layer` (its slot in `w_experts`: its index where
    /// every layer is MoE) on `xn2`, for `routing` and the `distinct` experts listed: for
    /// each (distinct expert, chunk) item, the chunk fetched into the ring `slots - 1`
    /// items ahead, each item computed after the next one's wait ([`ExpertRing::stream`]).
    /// One flat pipelined loop over the items, `distinct * chunks` of them (a run-time
    /// count; the static worst case [`Plan::distinct_experts`] with
    /// [`ExpertFetch::WorstCase`], the entries past the distinct ones fetching the last one
    /// again at weight zero): the (expert, chunk) cursor is carried and advanced by
    /// compares, not divided out of the item index (libtpu's v6e estimator fails on the
    /// scalar division by a chunk count that is not a power of two). Under EP a device may
    /// hold none of the chosen experts: its stream is the static worst case, entry 0
    /// standing in (at weight zero) when the list is empty.
    pub fn emit(
        self,
        p: &Plan,
        ring: ExpertRing,
        layer: Val,
        xn2: Val,
        routing: Routing,
        distinct: Val,
    ) {
        let d = &p.dims;
        let (ec, slots) = (p.layout.expert_chunks, p.expert_slots);
        let shared = p.layout.shared_entries;
        let own_first = self.spmd.and_then(|spmd| spmd.expert_first());
        let worst_case = p.expert_fetch == ExpertFetch::WorstCase || own_first.is_some();
        let total = match worst_case {
            false if shared == 0 => distinct * ec as i32,
            false => (distinct + shared as i32) * ec as i32,
            true => scalar(((p.distinct_experts() + shared) * ec) as i32),
        };
        // Row 0 alone chose `top_k` distinct experts: that many items exist whatever the
        // routing (on one device, or under TP; under EP the static worst case's items do),
        // and the lagged stream issues item `ahead` before its loop.
        let ahead = (slots - 1).min((d.top_k.min(p.distinct_experts()) + shared) * ec - 1);
        let last = || match own_first {
            Some(_) => select(ge(distinct, 1), distinct - 1, 0),
            None => distinct - 1,
        };
        // Item entry `e`'s routed entry: `e` itself, or past the shared expert's entries
        // (0 for those, so every load stays in the list).
        let routed = |e: Val| match shared {
            0 => e,
            s => select(lt(e, s as i32), 0, e - s as i32),
        };
        let entry = |r: Val| if worst_case { select(lt(r, distinct), r, last()) } else { r };
        // Routed entry `r`'s (local) expert id, clamped into `w_experts`.
        let expert_id = |r: Val| clamp_index(self.ids.load(entry(r)), d.experts_per_device);
        // Item entry `e`'s entry of `w_experts`: a shared expert's after the device's experts.
        let w_entry = |e: Val| match shared {
            0 => expert_id(e),
            s => select(lt(e, s as i32), e + d.experts_per_device as i32, expert_id(routed(e))),
        };
        let fetch = |e: Val, c: Val, slot: Val| {
            let id = w_entry(e);
            ring.fetch(self.weights, (layer, id, c), slot)
        };
        let shared_weights = (shared > 0).then(|| self.shared_weights(p));
        ring.stream(p, total, ahead, ec, fetch, |slot, e, _| {
            let chunk = ring.swiglu(p, slot, xn2, d.intermediate);
            let r = routed(e);
            let expert = match own_first {
                Some(lo) => expert_id(r) + lo,
                None => expert_id(r),
            };
            let weights = routing.weights_for(expert, d.tokens);
            let weights = if worst_case { select(lt(r, distinct), weights, 0.0) } else { weights };
            let weights = match shared_weights {
                Some(g) => select(lt(e, shared as i32), g, weights),
                None => weights,
            };
            (chunk, Some(weights))
        });
    }

    /// The shared expert's weight per row (`[rows, 1]`): `sigmoid` of its gate's logit
    /// (the router's column after the experts') where gated, else 1; 0 on padding rows.
    fn shared_weights(self, p: &Plan) -> Val {
        let d = &p.dims;
        let rows = d.rows;
        let gate = match d.shared_gate {
            true => self.logits.load((.., d.experts..d.experts + 1)).sigmoid(),
            false => zeros([rows, 1], f32) + 1.0,
        };
        select(lt(iota([rows, 1], 0), d.tokens as i32), gate, 0.0)
    }
}
