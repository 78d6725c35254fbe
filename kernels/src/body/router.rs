//! The MoE router: scores, top-k and the routing table's entries. Their reference, the one
//! the interpret tests compare with, is `palladium_model::moe::route`.

use palladium_dsl::build::{IntoVal, eq, ge, lt};
use palladium_dsl::prelude::*;
use palladium_model::spec::{ExpertGroups, GroupScore};

/// The router's scores from its f32 logits `[rows, width]`, the first `experts` columns real
/// (columns past them, padding, score zero): softmax over the experts (max-subtracted), or an
/// elementwise sigmoid (DeepSeek-V3 style).
pub fn router_scores(logits: Val, experts: u64, sigmoid: bool) -> Val {
    let dims = logits.shape().0;
    let (rows, width) = (dims[0], dims[1]);
    let logits = if width > experts {
        select(lt(iota([rows, width], 1), experts as i32), logits, f64::NEG_INFINITY)
    } else {
        logits
    };
    if sigmoid {
        logits.sigmoid()
    } else {
        let e = (logits - logits.max_keepdims(1)).exp();
        e / e.sum_keepdims(1)
    }
}

/// Top-`k` of the router's `scores` (`[rows, width]`, non-negative, the first `experts`
/// columns real) without a sort: `k` rounds of (row max, the lowest column holding it, mask
/// that column), so ties go to the lower id as in `jax.lax.top_k` and the weights come out
/// in descending order; optionally renormalised to sum to one. Returns `(ids, weights)`,
/// `[rows, k]` i32 and f32.
///
/// Whatever the scores, every row's `k` ids are distinct real experts, so a fetch by id
/// stays in bounds and a stream that counts on row 0's `k` distinct experts finds them:
/// a NaN score (from non-finite logits) ranks below every number and above the chosen
/// ones, so a NaN row picks its lowest NaN ids. Such a row's weights are all NaN (`x * 0`
/// is NaN exactly for NaN), so the poison still reaches the output; finite scores route
/// and weigh exactly as without the guard (`+ 0.0` leaves a non-negative weight as it is).
pub fn top_k(scores: Val, experts: u64, k: u64, renormalize: bool) -> (Val, Val) {
    let dims = scores.shape().0;
    let (rows, width) = (dims[0], dims[1]);
    let col = iota([rows, width], 1);
    let slot = iota([rows, k], 1);
    let real = |x: Val, padding: f64| match width > experts {
        true => select(lt(col, experts as i32), x, padding),
        false => x,
    };
    // Scores are in [0, 1] or NaN (`eq(x, x)` is false exactly for NaN): -1 marks a padded
    // or already chosen expert, -0.5 a NaN score.
    let mut remaining = real(select(eq(scores, scores), scores, -0.5), -1.0);
    let poison = (real(scores, 0.0) * 0.0).sum_keepdims(1);
    let mut ids = zeros([rows, k], i32);
    let mut weights = zeros([rows, k], f32);
    for j in 0..k {
        let best = remaining.max_keepdims(1);
        let best_id = select(eq(remaining, best), col, width as i32).min_keepdims(1);
        ids = select(eq(slot, j as i32), best_id, ids);
        weights = select(eq(slot, j as i32), best, weights);
        remaining = select(eq(col, best_id), -1.0, remaining);
    }
    weights = weights + poison;
    if renormalize {
        weights = weights / weights.sum_keepdims(1);
    }
    (ids, weights)
}

/// How the scores choose the experts beyond their plain order, and how the chosen weights
/// are scaled: `DeepSeek`-V3's `noaux_tc` router (GLM-4.5), as
/// `palladium_model::moe::route_with` computes it (`Choice` there). [`Choice::TOP_K`] is
/// the plain top-k ([`top_k`], unchanged).
#[derive(Clone, Copy)]
pub struct Choice {
    /// `e_score_correction_bias` as an f32 `[1, width]` row (lanes past the experts
    /// anything): added to the scores to choose the experts and groups, never to the
    /// weights.
    pub correction_bias: Option<Val>,
    /// The model's [`ExpertGroups`]: the experts in `n_group` equal consecutive groups, a
    /// group scored by the sum of its two best choice scores, the `topk_group` best kept
    /// (ties to the lower group), every other expert's choice score 0 (transformers'
    /// `masked_fill(..., 0.0)`).
    pub groups: Option<ExpertGroups>,
    /// `routed_scaling_factor`, multiplying the weights after any renormalisation.
    pub scaling: f64,
}

impl Choice {
    /// Plain top-k of the scores, weights unscaled.
    pub const TOP_K: Choice = Choice { correction_bias: None, groups: None, scaling: 1.0 };

    fn is_plain(&self) -> bool {
        self.correction_bias.is_none() && self.groups.is_none() && self.scaling == 1.0
    }
}

/// Top-`k` of the router's `scores` (`[rows, width]`, the first `experts` columns real) by
/// `choice`'s choice scores (the scores plus the correction bias, outside the kept groups
/// 0), weighted by the unbiased scores (renormalised where asked, then scaled). As
/// [`top_k`]: ties to the lower id, a NaN choice score below every number (so the ids stay
/// distinct real experts) and every weight of a row with a NaN score NaN. Choice scores may
/// be negative (a negative bias), so chosen and padded columns are marked -inf here, a NaN
/// the most negative finite f32.
fn choose(scores: Val, experts: u64, k: u64, renormalize: bool, choice: Choice) -> (Val, Val) {
    let dims = scores.shape().0;
    let (rows, width) = (dims[0], dims[1]);
    let col = iota([rows, width], 1);
    let slot = iota([rows, k], 1);
    let real = lt(col, experts as i32);
    let ninf = f64::NEG_INFINITY;
    let biased = match choice.correction_bias {
        Some(bias) => scores + bias,
        None => scores,
    };
    let biased = select(eq(biased, biased), biased, f32::MIN as f64);
    let mut for_choice = select(real, biased, ninf);
    // The lowest column holding each row's maximum of `v`, and that maximum.
    let first_max = |v: Val| {
        let best = v.max_keepdims(1);
        (best, select(eq(v, best), col, width as i32).min_keepdims(1))
    };
    if let Some(g) = choice.groups {
        let (groups, kept, by) = (g.groups, g.chosen_groups, g.score);
        let size = (experts / groups) as i32;
        // The group of each column (of `at`: a column per row), by comparisons.
        let group_of = |c: Val, shape: [u64; 2]| {
            (1..groups).fold(zeros(shape, i32), |g, i| select(ge(c, i as i32 * size), i as i32, g))
        };
        let col_group = group_of(col, [rows, width]);
        // Each column holds its group's score: the sum of the group's two best
        // (`DeepSeek`-V3), or its best (`DeepSeek`-V2's `group_limited_greedy`).
        let mut group_score = full([rows, width], ninf, f32);
        for g in 0..groups {
            let members = eq(col_group, g as i32) & real;
            let s = select(members, for_choice, ninf);
            let (best, at) = first_max(s);
            let second = select(eq(col, at), ninf, s).max_keepdims(1);
            let score = match by {
                GroupScore::TopTwoSum => best + second,
                GroupScore::Max => best,
            };
            group_score = select(members, score, group_score);
        }
        // The best group is the one holding the lowest column of the best group score
        // (a group's columns are consecutive): ties go to the lower group.
        let mut keep = lt(col, 0);
        for _ in 0..kept {
            let (_, at) = first_max(group_score);
            let chosen = eq(col_group, group_of(at, [rows, 1])) & real;
            keep = keep | chosen;
            group_score = select(chosen, ninf, group_score);
        }
        let dropped = select(real, zeros([rows, width], f32), ninf);
        for_choice = select(keep, for_choice, dropped);
    }
    let mut ids = zeros([rows, k], i32);
    let mut weights = zeros([rows, k], f32);
    for j in 0..k {
        let (_, at) = first_max(for_choice);
        let weight = select(eq(col, at), scores, 0.0).sum_keepdims(1);
        ids = select(eq(slot, j as i32), at, ids);
        weights = select(eq(slot, j as i32), weight, weights);
        for_choice = select(eq(col, at), ninf, for_choice);
    }
    weights = weights + (select(real, scores, 0.0) * 0.0).sum_keepdims(1);
    if renormalize {
        weights = weights / weights.sum_keepdims(1);
    }
    if choice.scaling != 1.0 {
        weights = weights * choice.scaling;
    }
    (ids, weights)
}

/// The routing of a batch: each row's top-k expert ids and weights (`[rows, k]` vectors),
/// read out entry by entry into SMEM, where the expert stream fetches by id.
#[derive(Clone, Copy)]
pub struct Routing {
    pub ids: Val,
    pub weights: Val,
    rows: Val,
    slots: Val,
}

impl Routing {
    /// Route the router's f32 logits `[rows, width]` (the first `experts` columns real):
    /// [`router_scores`], then [`top_k`].
    pub fn new(logits: Val, experts: u64, k: u64, sigmoid: bool, renormalize: bool) -> Routing {
        Self::choosing(logits, experts, k, sigmoid, renormalize, Choice::TOP_K)
    }

    /// [`Self::new`] with `choice`'s correction bias, expert groups and weight scaling
    /// (the plain [`top_k`] where it has none).
    pub fn choosing(
        logits: Val,
        experts: u64,
        k: u64,
        sigmoid: bool,
        renormalize: bool,
        choice: Choice,
    ) -> Routing {
        let rows = logits.shape().0[0];
        let scores = router_scores(logits, experts, sigmoid);
        let (ids, weights) = if choice.is_plain() {
            top_k(scores, experts, k, renormalize)
        } else {
            choose(scores, experts, k, renormalize, choice)
        };
        Routing { ids, weights, rows: iota([rows, k], 0), slots: iota([rows, k], 1) }
    }

    /// `(id, weight)` of row `row`'s `slot`-th choice, as scalars: SMEM stores are scalar,
    /// so each element is pulled out of the vectors with a masked `max_all` (a
    /// `vector.multi_reduction` to a scalar).
    pub fn entry(&self, row: impl IntoVal, slot: impl IntoVal) -> (Val, Val) {
        let here = self.here(row, slot);
        (
            select(here, self.ids, -1).max_all(),
            select(here, self.weights, f64::NEG_INFINITY).max_all(),
        )
    }

    /// The id alone of [`Self::entry`].
    pub fn id(&self, row: impl IntoVal, slot: impl IntoVal) -> Val {
        select(self.here(row, slot), self.ids, -1).max_all()
    }

    fn here(&self, row: impl IntoVal, slot: impl IntoVal) -> Val {
        eq(self.rows, row) & eq(self.slots, slot)
    }

    /// Whether `id`, row `row`'s `slot`-th choice, is the batch's first choice of that
    /// expert (choices ordered row-major, slot-minor): the expert stream fetches each
    /// distinct expert once, at its first choice.
    pub fn first_choice(&self, row: u64, slot: u64, id: Val) -> Val {
        let k = self.ids.shape().0[1];
        let earlier =
            lt(self.rows * k as i32 + self.slots, (row * k + slot) as i32) & eq(self.ids, id);
        // Ids are >= 0: the max is -1 exactly when no earlier choice is `id`.
        lt(select(earlier, self.ids, -1).max_all(), 0)
    }

    /// Each row's combine weight for `expert` (`[rows, 1]` f32): its routing weight where it
    /// chose the expert, zero elsewhere and on the rows from `real` on (padding).
    pub fn weights_for(&self, expert: Val, real: u64) -> Val {
        let chosen = eq(self.ids, expert) & lt(self.rows, real as i32);
        select(chosen, self.weights, 0.0).sum_keepdims(1)
    }
}
