//! Stage: the routed experts. Each distinct expert the router listed is fetched once by id
//! (right after routing), chunk by chunk through [`ExpertRing`], and applied to every row
//! at that row's routing weight for it (zero for rows that did not choose it).

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
            weights: weights.expect("the plan's layout has no w_experts operand"),
            ids: hs.buffer(hs.keys.expert_ids),
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
        let own_first = self.spmd.and_then(|spmd| spmd.expert_first());
        let worst_case = p.expert_fetch == ExpertFetch::WorstCase || own_first.is_some();
        let total = match worst_case {
            false => distinct * ec as i32,
            true => scalar((p.distinct_experts() * ec) as i32),
        };
        // Row 0 alone chose `top_k` distinct experts: that many items exist whatever the
        // routing (on one device, or under TP; under EP the static worst case's items do),
        // and the lagged stream issues item `ahead` before its loop.
        let ahead = (slots - 1).min(d.top_k.min(p.distinct_experts()) * ec - 1);
        let last = || match own_first {
            Some(_) => select(ge(distinct, 1), distinct - 1, 0),
            None => distinct - 1,
        };
        let entry = |e: Val| if worst_case { select(lt(e, distinct), e, last()) } else { e };
        // Entry `e`'s (local) expert id, clamped into `w_experts`.
        let expert_id = |e: Val| clamp_index(self.ids.load(entry(e)), d.experts_per_device);
        let fetch = |e: Val, c: Val, slot: Val| {
            let id = expert_id(e);
            ring.fetch(self.weights, (layer, id, c), slot)
        };
        ring.stream(p, total, ahead, ec, fetch, |slot, e, _| {
            let chunk = ring.swiglu(p, slot, xn2, d.intermediate);
            let expert = match own_first {
                Some(lo) => expert_id(e) + lo,
                None => expert_id(e),
            };
            let weights = routing.weights_for(expert, d.tokens);
            let weights = if worst_case { select(lt(e, distinct), weights, 0.0) } else { weights };
            (chunk, Some(weights))
        });
    }
}
