//! The mixture-of-experts math, implemented once: how a token's router logits become its
//! chosen experts and their weights ([`route`]), and how the chosen experts' SwiGLU outputs
//! are combined ([`moe_ffn`], [`swiglu`]) and a shared expert's added ([`add_shared`]). [`crate::reference::Reference`] (transformers'
//! float32 and bfloat16 models) and the kernel library's references
//! (`palladium_kernels::moe_reference`, each kernel's convention) both call these functions;
//! they differ only in data: the [`RouterScoring`] and [`TopKWeights`] of the model, where
//! results are rounded to bf16 ([`FfnRounding`]), and how the router logits were computed
//! (rounded to bf16 like transformers' bf16 `gate` output, or kept in f32 like the kernels'
//! MXU result), which is the caller's.
//!
//! Routing, as transformers 4.57 computes it (`Qwen3MoeSparseMoeBlock`,
//! `MixtralSparseMoeBlock`): scores are [`RouterScoring`] of the f32 logits (softmax over all
//! experts, max-subtracted; or an elementwise sigmoid, `DeepSeek` style), the `top_k` largest
//! are chosen in descending order with ties to the lower expert id (`torch.topk` and
//! `jax.lax.top_k`), and with [`TopKWeights::Renormalized`] their weights are divided by their
//! sum (in f32, summed in that order).
//!
//! Non-finite logits: a NaN score ranks below every number (torch ranks it above; either way
//! the row's output is NaN, see below), so any row gets `top_k` *distinct* experts, the
//! lowest NaN ids where all scores are NaN: this is what the kernels' `top_k` body does, so a
//! fetch by id stays in bounds. A row with any NaN score gets NaN for every weight (the
//! kernels add `sum(scores * 0)` to the weights), so the poison reaches the output. With the
//! softmax, one NaN or infinite logit makes every score NaN.

use crate::spec::{
    Activation, ExpertGroups, ExpertWeighting, GroupScore, RouterScoring, TopKWeights,
};
use palladium_array::round_bf16;

/// A token's routing: its chosen experts in descending score order, and the best expert it
/// did not choose.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// `(expert, weight)`, `top_k` of them, the highest score first (ties: lower id first).
    pub chosen: Vec<(usize, f32)>,
    /// The `(top_k + 1)`-th ranked expert; `None` when every expert is chosen. The gap
    /// between its logit and the last chosen one is the routing's margin: implementations
    /// whose logits differ by rounding may disagree on the choice when it is small.
    pub runner_up: Option<usize>,
    /// The routing's margin, relative: the gap between the last chosen expert's and the
    /// runner-up's logits over the largest `|logit|` (with a correction bias or groups: of
    /// their choice scores, over the largest `|choice score|`); infinite when every expert
    /// is chosen. With expert groups, also the gap between the last kept group's score and
    /// the best dropped one's over the largest `|group score|`, where smaller: a flip of
    /// the kept groups changes the choice as much as a flip of the last expert. Small: a
    /// near tie.
    pub margin: f32,
}

/// Routes one token: its router `logits` (one per expert) scored by `scoring`, the `top_k`
/// best chosen and weighted by `weights` (see the module docs for ties and NaN).
///
/// # Panics
/// If `top_k` is 0 or more than the number of experts.
pub fn route(logits: &[f32], top_k: usize, scoring: RouterScoring, weights: TopKWeights) -> Route {
    route_with(logits, top_k, scoring, weights, &Choice::TOP_K)
}

/// How the scores choose the experts beyond their plain order, and how the chosen weights
/// are scaled: `DeepSeek`-V3's `noaux_tc` router (GLM-4.5) and `DeepSeek`-V2's `greedy` /
/// `group_limited_greedy`, as transformers 4.57 computes them (`DeepseekV3TopkRouter`,
/// `Glm4MoeTopkRouter`, `DeepseekV2MoEGate`).
#[derive(Debug, Clone, Copy)]
pub struct Choice<'a> {
    /// `e_score_correction_bias`, one per expert: added to the scores to choose experts and
    /// groups, never to the weights.
    pub correction_bias: Option<&'a [f32]>,
    /// The experts in `n_group` equal consecutive groups, each scored by its
    /// [`GroupScore`], the `topk_group` best kept (ties to the lower group), every other
    /// expert's choice score set to 0.
    pub groups: Option<ExpertGroups>,
    /// `routed_scaling_factor`, multiplying the weights after any renormalisation.
    pub scaling: f32,
}

impl Choice<'_> {
    /// Plain top-k of the scores, weights unscaled.
    pub const TOP_K: Choice<'static> = Choice { correction_bias: None, groups: None, scaling: 1.0 };
}

/// Descending order of `scores`, NaN below every number, the lower id first among equals.
fn ranking(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (scores[a], scores[b]);
        match (x.is_nan(), y.is_nan()) {
            (false, false) => y.total_cmp(&x),
            (nan_a, nan_b) => nan_a.cmp(&nan_b),
        }
        .then(a.cmp(&b))
    });
    order
}

/// [`route`] with `choice`'s correction bias, expert groups and weight scaling: the experts
/// are ranked by their *choice* scores (the scores plus the bias, outside the kept groups
/// 0), the weights are the chosen experts' unbiased scores, renormalised where `weights`
/// says (transformers adds 1e-20 to the sum, which changes no sum above 2^-43), then
/// times `choice.scaling`. [`Route::runner_up`] is by choice score too.
///
/// # Panics
/// If `top_k` is 0 or more than the number of experts, the bias has another length, or the
/// groups do not divide the experts equally (into groups of at least two for
/// [`GroupScore::TopTwoSum`], transformers' `topk(2)`).
pub fn route_with(
    logits: &[f32],
    top_k: usize,
    scoring: RouterScoring,
    weights: TopKWeights,
    choice: &Choice<'_>,
) -> Route {
    let n = logits.len();
    assert!((1..=n).contains(&top_k), "top_k {top_k} of {n} experts");
    let scores: Vec<f32> = match scoring {
        RouterScoring::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            e.iter().map(|&v| v / sum).collect()
        }
        RouterScoring::Sigmoid => logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
    };
    let mut for_choice = scores.clone();
    if let Some(bias) = choice.correction_bias {
        assert_eq!(bias.len(), n, "one correction bias per expert");
        for (s, b) in for_choice.iter_mut().zip(bias) {
            *s += b;
        }
    }
    let mut group_margin = f32::INFINITY;
    if let Some(g) = choice.groups {
        let (groups, kept) = (g.groups as usize, g.chosen_groups as usize);
        let size = n / groups;
        let least = if g.score == GroupScore::TopTwoSum { 2 } else { 1 };
        assert!(size >= least && size * groups == n, "{n} experts in {groups} groups");
        assert!((1..=groups).contains(&kept), "topk_group {kept} of {groups} groups");
        let group_scores: Vec<f32> = for_choice
            .chunks_exact(size)
            .map(|group| {
                let best = ranking(group);
                match g.score {
                    GroupScore::TopTwoSum => group[best[0]] + group[best[1]],
                    GroupScore::Max => group[best[0]],
                }
            })
            .collect();
        let group_order = ranking(&group_scores);
        let kept_groups = &group_order[..kept];
        if let Some(&next) = group_order.get(kept) {
            let scale = crate::tolerance::max_abs(&group_scores);
            let gap = group_scores[group_order[kept - 1]] - group_scores[next];
            group_margin = if scale > 0.0 { gap / scale } else { 0.0 };
        }
        for (g, chunk) in for_choice.chunks_exact_mut(size).enumerate() {
            if !kept_groups.contains(&g) {
                chunk.fill(0.0);
            }
        }
    }
    let order = ranking(&for_choice);
    let poisoned = scores.iter().any(|s| s.is_nan());
    let mut chosen: Vec<(usize, f32)> =
        order[..top_k].iter().map(|&e| (e, if poisoned { f32::NAN } else { scores[e] })).collect();
    if weights == TopKWeights::Renormalized {
        let sum: f32 = chosen.iter().map(|c| c.1).sum();
        for c in &mut chosen {
            c.1 /= sum;
        }
    }
    if choice.scaling != 1.0 {
        for c in &mut chosen {
            c.1 *= choice.scaling;
        }
    }
    let runner_up = order.get(top_k).copied();
    let plain = choice.correction_bias.is_none() && choice.groups.is_none();
    let ranked_by = if plain { logits } else { &for_choice[..] };
    let margin = match (chosen.last(), runner_up) {
        (Some(&(kth, _)), Some(next)) => {
            let scale = crate::tolerance::max_abs(ranked_by);
            let gap = ranked_by[kth] - ranked_by[next];
            if scale > 0.0 { gap / scale } else { 0.0 }
        }
        _ => f32::INFINITY,
    };
    Route { chosen, runner_up, margin: margin.min(group_margin) }
}

/// Phi-3.5-MoE's router at inference (`sparsemixer(scores, jitter_eps, training=False)` in
/// `modeling_phimoe.py`), two experts: the best logit `m1` (the lower id on ties, as
/// `max(dim=-1)`), weighted by its softmax over the logits `s` kept by
/// `(m1 - s) / max(|s|, m1) <= 2 * jitter_eps`; then the best logit `m2` of the others,
/// weighted by its softmax over the others kept by the same test against `m2`. `round` is
/// where the logits' dtype rounds (the differences, the quotients, the threshold and the
/// two weights: transformers computes all of it in the router logits' dtype).
pub fn sparse_mixer(logits: &[f32], jitter_eps: f64, round: impl Fn(f32) -> f32) -> Route {
    let n = logits.len();
    assert!(n >= 2, "the sparsemixer chooses 2 of {n} experts");
    let threshold = round((2.0 * jitter_eps) as f32);
    let order = ranking(logits);
    // The weight of `best` (its logit the maximum of `candidates`): its softmax among the
    // candidates within the relative threshold of it.
    let weight = |best: usize, candidates: &dyn Fn(usize) -> bool| {
        let m = logits[best];
        let kept = |j: usize| {
            let factor = logits[j].abs().max(m);
            // `masked_fill` where the quotient is `> threshold` (a NaN quotient is kept).
            let masked = round(round(m - logits[j]) / factor) > threshold;
            candidates(j) && !masked
        };
        let sum: f32 = (0..n).filter(|&j| kept(j)).map(|j| (logits[j] - m).exp()).sum();
        round(1.0 / sum)
    };
    let (first, second) = (order[0], order[1]);
    let chosen = vec![(first, weight(first, &|_| true)), (second, weight(second, &|j| j != first))];
    let runner_up = order.get(2).copied();
    let margin = match runner_up {
        Some(next) => {
            let scale = crate::tolerance::max_abs(logits);
            if scale > 0.0 { (logits[second] - logits[next]) / scale } else { 0.0 }
        }
        None => f32::INFINITY,
    };
    Route { chosen, runner_up, margin }
}

/// Where an FFN rounds to bf16. The math between the rounding points is f32, dot products
/// accumulating in f64 and rounded once to f32 ([`Projection::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnRounding {
    /// Nowhere: transformers' float32 model.
    None,
    /// Every tensor transformers' bfloat16 model materialises: each projection's output,
    /// `silu(gate)`, the activation `silu(gate) * up`, the routing weight (cast to the
    /// hidden dtype), each weighted expert output, and the running sum after each expert
    /// (`index_add_` into a bf16 buffer).
    Transformers,
    /// transformers' bfloat16 model of a `DeepSeek`-V3-style MoE block (GLM-4.5,
    /// [`crate::spec::RouterPrecision::F32`]): each expert as [`Self::Transformers`], but the
    /// f32 routing weights, the weighted outputs and their running sum stay f32 (`index_add_`
    /// into an f32 buffer), rounded once at the end.
    TransformersF32Sum,
    /// The kernels' (`expert_ffn`, and the megakernel's experts): f32 products and
    /// accumulators; the activation rounded (it is the down projection's bf16 MXU operand)
    /// and the combined output rounded once, when stored.
    Kernel,
}

impl FfnRounding {
    /// A projection's output, `silu(gate)`, a routing weight, a weighted expert output or the
    /// running sum (transformers' bf16 model rounds them all).
    fn each_op(self, x: f32) -> f32 {
        match self {
            Self::Transformers | Self::TransformersF32Sum => round_bf16(x),
            Self::None | Self::Kernel => x,
        }
    }

    /// A routing weight, a weighted expert output or the running sum of the routed experts.
    fn combine(self, x: f32) -> f32 {
        match self {
            Self::Transformers => round_bf16(x),
            Self::None | Self::Kernel | Self::TransformersF32Sum => x,
        }
    }

    /// The SwiGLU activation, the down projection's input.
    fn activation(self, x: f32) -> f32 {
        match self {
            Self::Transformers | Self::TransformersF32Sum | Self::Kernel => round_bf16(x),
            Self::None => x,
        }
    }

    /// The combined output of the routed experts.
    fn output(self, x: f32) -> f32 {
        match self {
            Self::Transformers | Self::TransformersF32Sum | Self::Kernel => round_bf16(x),
            Self::None => x,
        }
    }
}

/// How a weight matrix of `outputs x inputs` values is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[outputs, inputs]` row-major: torch's `nn.Linear.weight`, checkpoints.
    OutIn,
    /// `[inputs, outputs]` row-major: the kernels' operands (`x @ w`).
    InOut,
}

/// A borrowed projection weight (no bias).
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    data: &'a [f32],
    inputs: usize,
    outputs: usize,
    layout: Layout,
}

impl<'a> Projection<'a> {
    /// `data` holds `inputs * outputs` values in `layout`.
    ///
    /// # Panics
    /// If it does not.
    pub fn new(data: &'a [f32], inputs: usize, outputs: usize, layout: Layout) -> Self {
        assert_eq!(data.len(), inputs * outputs, "projection of {inputs} -> {outputs}");
        Self { data, inputs, outputs, layout }
    }

    /// `W x + b`, each output accumulated in f64 in input order and rounded once to f32.
    ///
    /// # Panics
    /// If `x` or `bias` has the wrong length.
    pub fn apply(&self, x: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        assert_eq!(x.len(), self.inputs, "projection input");
        let mut acc: Vec<f64> = match self.layout {
            Layout::OutIn => self.data.chunks_exact(self.inputs).map(|row| dot64(row, x)).collect(),
            Layout::InOut => {
                let mut acc = vec![0f64; self.outputs];
                for (row, &v) in self.data.chunks_exact(self.outputs).zip(x) {
                    for (a, &w) in acc.iter_mut().zip(row) {
                        *a += f64::from(w) * f64::from(v);
                    }
                }
                acc
            }
        };
        if let Some(b) = bias {
            assert_eq!(b.len(), self.outputs, "projection bias");
            for (a, &b) in acc.iter_mut().zip(b) {
                *a += f64::from(b);
            }
        }
        acc.into_iter().map(|a| a as f32).collect()
    }
}

/// One gated FFN (an expert, or a dense MLP): `down(act(gate(x), up(x)))`, `act` the
/// model's [`Activation`] (`silu(gate) * up` but for gpt-oss).
#[derive(Debug, Clone, Copy)]
pub struct SwiGlu<'a> {
    pub gate: Projection<'a>,
    pub up: Projection<'a>,
    pub down: Projection<'a>,
    /// gpt-oss's expert biases; `None` elsewhere.
    pub bias: Option<GluBias<'a>>,
    pub activation: Activation,
}

impl<'a> SwiGlu<'a> {
    /// `down(silu(gate(x)) * up(x))` without biases: every family but gpt-oss.
    pub fn silu(gate: Projection<'a>, up: Projection<'a>, down: Projection<'a>) -> Self {
        Self { gate, up, down, bias: None, activation: Activation::Silu }
    }
}

/// The biases of a gated FFN's three projections.
#[derive(Debug, Clone, Copy)]
pub struct GluBias<'a> {
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

/// `down(act(gate(x), up(x)))`, rounded where `rounding` says. A bias is added to its
/// projection's rounded output as an op of its own (gpt-oss computes `x @ W + b`, not one
/// `nn.Linear`).
pub fn swiglu(ffn: &SwiGlu<'_>, x: &[f32], rounding: FfnRounding) -> Vec<f32> {
    let r = |v: f32| rounding.each_op(v);
    let project = |p: &Projection<'_>, x: &[f32], bias: Option<&[f32]>| -> Vec<f32> {
        let y = p.apply(x, None).into_iter().map(r);
        match bias {
            Some(b) => y.zip(b).map(|(y, &b)| r(y + b)).collect(),
            None => y.collect(),
        }
    };
    let gate = project(&ffn.gate, x, ffn.bias.map(|b| b.gate));
    let up = project(&ffn.up, x, ffn.bias.map(|b| b.up));
    let act: Vec<f32> = gate
        .into_iter()
        .zip(up)
        .map(|(g, u)| match ffn.activation {
            Activation::Silu => rounding.activation(r(g / (1.0 + (-g).exp())) * u),
            Activation::ClampedSwiGlu { alpha, limit } => {
                let limit = limit as f32;
                let (g, u) = (g.min(limit), u.clamp(-limit, limit));
                let sigmoid = r(1.0 / (1.0 + (-r(g * alpha as f32)).exp()));
                rounding.activation(r(u + 1.0) * r(g * sigmoid))
            }
        })
        .collect();
    project(&ffn.down, &act, ffn.bias.map(|b| b.down))
}

/// A token's routed-experts output (`hidden` values): `sum over chosen (e, w) of
/// w * swiglu(expert(e), x)`, in increasing expert id (transformers' `index_add_` order),
/// rounded where `rounding` says.
pub fn moe_ffn<'a>(
    x: &[f32],
    hidden: usize,
    chosen: &[(usize, f32)],
    expert: impl Fn(usize) -> SwiGlu<'a>,
    rounding: FfnRounding,
) -> Vec<f32> {
    moe_ffn_weighted(x, hidden, chosen, expert, rounding, ExpertWeighting::Output)
}

/// [`moe_ffn`] with the weight applied where `weighting` says. With
/// [`ExpertWeighting::Input`] (Llama 4): `sum over chosen (e, w) of swiglu(expert(e), w * x)`,
/// the weight and the scaled input rounded where the FFN rounds each op, the outputs summed
/// in f32 in increasing expert id (transformers' `sum(dim=0)` over every expert's bf16 output
/// accumulates in f32; the unchosen ones are exact zeros) and rounded once.
pub fn moe_ffn_weighted<'a>(
    x: &[f32],
    hidden: usize,
    chosen: &[(usize, f32)],
    expert: impl Fn(usize) -> SwiGlu<'a>,
    rounding: FfnRounding,
    weighting: ExpertWeighting,
) -> Vec<f32> {
    let mut by_id = chosen.to_vec();
    by_id.sort_by_key(|c| c.0);
    let mut acc = vec![0f32; hidden];
    for (e, w) in by_id {
        let (y, weight) = match weighting {
            ExpertWeighting::Output => (swiglu(&expert(e), x, rounding), rounding.combine(w)),
            ExpertWeighting::Input => {
                let w = rounding.each_op(w);
                let scaled: Vec<f32> = x.iter().map(|&v| rounding.each_op(v * w)).collect();
                (swiglu(&expert(e), &scaled, rounding), 1.0)
            }
        };
        assert_eq!(y.len(), hidden, "expert {e}'s output");
        for (a, y) in acc.iter_mut().zip(y) {
            *a = match weighting {
                ExpertWeighting::Output => rounding.combine(*a + rounding.combine(y * weight)),
                ExpertWeighting::Input => *a + y,
            };
        }
    }
    acc.into_iter().map(|a| rounding.output(a)).collect()
}

/// An always-on shared expert ([`crate::spec::SharedExpert`]): its MLP, and the
/// `[hidden] -> 1` projection of its sigmoid gate where it has one (Qwen2-MoE's
/// `shared_expert_gate`; `DeepSeek`'s shared experts are ungated).
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    pub mlp: SwiGlu<'a>,
    pub gate: Option<Projection<'a>>,
}

/// Adds the shared expert's output on `x` to the routed experts' output `routed` in place,
/// as transformers computes it (`Qwen2MoeSparseMoeBlock.forward`):
/// `routed + sigmoid(gate(x)) * swiglu(x)`, the gate's logit, its sigmoid, the product and
/// the sum rounded where `rounding` rounds each op ([`FfnRounding::Transformers`]).
pub fn add_shared(routed: &mut [f32], shared: &Shared<'_>, x: &[f32], rounding: FfnRounding) {
    let r = |v: f32| rounding.each_op(v);
    let y = swiglu(&shared.mlp, x, rounding);
    assert_eq!(y.len(), routed.len(), "the shared expert's output");
    let scale = shared.gate.map(|g| {
        let logit = r(g.apply(x, None)[0]);
        r(1.0 / (1.0 + (-logit).exp()))
    });
    for (a, y) in routed.iter_mut().zip(y) {
        let y = scale.map_or(y, |s| r(s * y));
        *a = rounding.output(*a + y);
    }
}

/// `a . b` accumulated in f64 in index order.
pub(crate) fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: &Route) -> Vec<usize> {
        r.chosen.iter().map(|c| c.0).collect()
    }

    #[test]
    fn softmax_routing_by_hand() {
        // Logits [1, 2, 3, 2]: expert 2, then the tie between 1 and 3 goes to 1; 3 is next.
        let logits = [1.0, 2.0, 3.0, 2.0];
        let r = route(&logits, 2, RouterScoring::Softmax, TopKWeights::Renormalized);
        assert_eq!((ids(&r), r.runner_up), (vec![2, 1], Some(3)));
        // Renormalised: a softmax over the two chosen logits, e / (e + 1) and 1 / (e + 1).
        let e = std::f32::consts::E;
        assert!((r.chosen[0].1 - e / (e + 1.0)).abs() < 1e-6);
        assert!((r.chosen[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6);
        // Raw: the softmax over all four.
        let r = route(&logits, 2, RouterScoring::Softmax, TopKWeights::Raw);
        let z = e.powi(3) + 2.0 * e.powi(2) + e;
        assert!((r.chosen[0].1 - e.powi(3) / z).abs() < 1e-6);
        assert!((r.chosen[1].1 - e.powi(2) / z).abs() < 1e-6);
        // All chosen: no runner-up.
        assert_eq!(route(&logits, 4, RouterScoring::Softmax, TopKWeights::Raw).runner_up, None);
    }

    #[test]
    fn sigmoid_routing_by_hand() {
        let logits = [1.0, -2.0, 3.0, 0.0];
        let r = route(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Raw);
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(r.chosen, vec![(2, sigmoid(3.0)), (0, sigmoid(1.0))]);
        let r = route(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Renormalized);
        let sum = sigmoid(3.0) + sigmoid(1.0);
        assert_eq!(r.chosen, vec![(2, sigmoid(3.0) / sum), (0, sigmoid(1.0) / sum)]);
    }

    const TWO_GROUPS_ONE_KEPT: ExpertGroups =
        ExpertGroups { groups: 2, chosen_groups: 1, score: GroupScore::TopTwoSum };

    /// `DeepSeek`-V3's router by hand: 8 experts in 2 groups of 4, sigmoid scores.
    #[test]
    fn grouped_biased_routing_by_hand() {
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let logits = [2.0, 1.0, 0.0, -1.0, 1.5, 1.4, 1.3, -3.0];
        // The bias lifts expert 3 over 0 in the choice only; its weight stays sigmoid(-1).
        let bias = [0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0];
        let choice = Choice { correction_bias: Some(&bias), groups: None, scaling: 1.0 };
        let r = route_with(&logits, 1, RouterScoring::Sigmoid, TopKWeights::Raw, &choice);
        assert_eq!(r.chosen, vec![(3, sigmoid(-1.0))]);
        assert_eq!(r.runner_up, Some(0));
        // Groups: group 0's two best (biased) sum to sigmoid(-1) + 0.9 + sigmoid(2), group 1's
        // sigmoid(1.5) + sigmoid(1.4), less: with one group kept, every choice is group 0's
        // even though experts 4 and 5 outscore expert 1.
        let choice = Choice {
            correction_bias: Some(&bias),
            groups: Some(TWO_GROUPS_ONE_KEPT),
            scaling: 1.0,
        };
        let r = route_with(&logits, 3, RouterScoring::Sigmoid, TopKWeights::Raw, &choice);
        assert_eq!(ids(&r), vec![3, 0, 1]);
        // Without the bias group 1 wins (sigmoid(1.5) + sigmoid(1.4) > sigmoid(2) + sigmoid(1)).
        let choice =
            Choice { correction_bias: None, groups: Some(TWO_GROUPS_ONE_KEPT), scaling: 1.0 };
        let r = route_with(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Raw, &choice);
        assert_eq!(ids(&r), vec![4, 5]);
        // The dropped group's experts score 0 for the choice, as transformers' masked_fill:
        // with top-k past the kept group's experts, a dropped expert (0) outranks a kept one
        // whose biased score is negative (expert 7: sigmoid(-3) - 0.5).
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5];
        let logits = [-5.0, -5.0, -5.0, -5.0, 1.0, 1.0, 1.0, -3.0];
        let choice = Choice {
            correction_bias: Some(&bias),
            groups: Some(TWO_GROUPS_ONE_KEPT),
            scaling: 1.0,
        };
        let r = route_with(&logits, 4, RouterScoring::Sigmoid, TopKWeights::Raw, &choice);
        assert_eq!(ids(&r), vec![4, 5, 6, 0]);
        // Renormalised, then scaled.
        let logits = [2.0, 1.0, 0.0, -1.0, 1.5, 1.4, 1.3, -3.0];
        let choice = Choice { correction_bias: None, groups: None, scaling: 2.5 };
        let r = route_with(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Renormalized, &choice);
        let sum = sigmoid(2.0) + sigmoid(1.5);
        assert_eq!(r.chosen, vec![(0, sigmoid(2.0) / sum * 2.5), (4, sigmoid(1.5) / sum * 2.5)]);
    }

    /// `DeepSeek`-V2's `group_limited_greedy` by hand: softmax scores, a group scored by its
    /// best expert, not by its best two as `DeepSeek`-V3's.
    #[test]
    fn max_scored_groups_by_hand() {
        let logits = [2.0, -5.0, -5.0, -5.0, 1.5, 1.4, 1.3, 1.2];
        let groups = |groups, chosen_groups, score| Choice {
            correction_bias: None,
            groups: Some(ExpertGroups { groups, chosen_groups, score }),
            scaling: 1.0,
        };
        let r =
            |c: &Choice<'_>| route_with(&logits, 2, RouterScoring::Softmax, TopKWeights::Raw, c);
        // Group 0's best (expert 0) beats group 1's: group 0 is kept, expert 1 its second.
        assert_eq!(ids(&r(&groups(2, 1, GroupScore::Max))), vec![0, 1]);
        // Group 1's best two sum to more than group 0's.
        assert_eq!(ids(&r(&groups(2, 1, GroupScore::TopTwoSum))), vec![4, 5]);
        // Groups of one expert: the 3 best groups are the 3 best experts, so plain top-k.
        let plain = route(&logits, 2, RouterScoring::Softmax, TopKWeights::Raw);
        assert_eq!(r(&groups(8, 3, GroupScore::Max)).chosen, plain.chosen);
        // The weights are the softmax over all experts, scaled, not renormalised.
        let scaled = Choice { scaling: 2.0, ..groups(2, 1, GroupScore::Max) };
        let w: Vec<f32> = r(&scaled).chosen.iter().map(|c| c.1).collect();
        assert_eq!(
            w,
            vec![plain.chosen[0].1 * 2.0, r(&groups(2, 1, GroupScore::Max)).chosen[1].1 * 2.0]
        );
    }

    /// Two groups whose scores nearly tie: which one is kept decides every choice, so the
    /// routing's margin is that near tie's, however far apart the experts inside them.
    #[test]
    fn a_near_tie_of_the_groups_is_a_near_tie_of_the_routing() {
        let logits = [2.0, 1.0, -3.0, -3.0, 2.0, 1.0001, -3.0, -3.0];
        let choice = Choice {
            correction_bias: None,
            groups: Some(ExpertGroups {
                groups: 2,
                chosen_groups: 1,
                score: GroupScore::TopTwoSum,
            }),
            scaling: 1.0,
        };
        let r = route_with(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Raw, &choice);
        assert_eq!((ids(&r), r.runner_up), (vec![4, 5], Some(6)));
        assert!(r.margin < 1e-4, "margin {}", r.margin);
        // Without the groups the same logits route with a wide margin.
        let r = route(&logits, 2, RouterScoring::Sigmoid, TopKWeights::Raw);
        assert!(r.margin > 0.1, "margin {}", r.margin);
    }

    /// What the kernels' `top_k` body does with NaN scores: they rank below every number,
    /// so the ids stay distinct, and every weight of the row is NaN.
    #[test]
    fn a_nan_row_gets_distinct_ids_and_nan_weights() {
        for scoring in [RouterScoring::Softmax, RouterScoring::Sigmoid] {
            let r = route(&[f32::NAN; 6], 3, scoring, TopKWeights::Renormalized);
            assert_eq!(ids(&r), vec![0, 1, 2], "{scoring:?}");
            assert!(r.chosen.iter().all(|c| c.1.is_nan()), "{scoring:?}");
            // One infinite logit: the softmax is NaN everywhere (the lowest ids are chosen);
            // the sigmoid is finite (1 for it).
            let r = route(&[0.0, f32::INFINITY, 1.0], 2, scoring, TopKWeights::Raw);
            let softmax = scoring == RouterScoring::Softmax;
            assert_eq!(ids(&r), if softmax { vec![0, 1] } else { vec![1, 2] }, "{scoring:?}");
            assert_eq!(r.chosen.iter().all(|c| c.1.is_nan()), softmax, "{scoring:?}");
        }
        // Sigmoid scores one NaN logit alone NaN: it ranks last, the numbers route as usual.
        let r = route(&[f32::NAN, 0.5, -1.0, 2.0], 3, RouterScoring::Sigmoid, TopKWeights::Raw);
        assert_eq!((ids(&r), r.runner_up), (vec![3, 1, 2], Some(0)));
        assert!(r.chosen.iter().all(|c| c.1.is_nan()));
    }

    #[test]
    fn projection_layouts_agree() {
        // W = [[1, 2, 3], [4, 5, 6]] (2 outputs, 3 inputs), stored both ways.
        let out_in = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let in_out = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
        let x = [1.0, -1.0, 2.0];
        let a = Projection::new(&out_in, 3, 2, Layout::OutIn).apply(&x, Some(&[0.5, 0.0]));
        let b = Projection::new(&in_out, 3, 2, Layout::InOut).apply(&x, Some(&[0.5, 0.0]));
        assert_eq!((a, b), (vec![5.5, 11.0], vec![5.5, 11.0]));
    }

    /// One expert of one hidden and one intermediate value: x = 2, gate 1, up 3, down 0.5.
    #[test]
    fn swiglu_rounding_points() {
        let p = |w: &'static [f32]| Projection::new(w, 1, 1, Layout::OutIn);
        let ffn = SwiGlu::silu(p(&[1.0]), p(&[3.0]), p(&[0.5]));
        let silu2 = 2.0 / (1.0 + (-2.0f32).exp());
        assert_eq!(swiglu(&ffn, &[2.0], FfnRounding::None), vec![silu2 * 6.0 * 0.5]);
        let kernel = round_bf16(silu2 * 6.0) * 0.5;
        assert_eq!(swiglu(&ffn, &[2.0], FfnRounding::Kernel), vec![kernel]);
        let hf = round_bf16(round_bf16(round_bf16(silu2) * 6.0) * 0.5);
        assert_eq!(swiglu(&ffn, &[2.0], FfnRounding::Transformers), vec![hf]);
        // Combined with weight 0.3 (not a bf16): transformers rounds the weight, the product
        // and the sum; the kernels round the sum once.
        let out = |r| moe_ffn(&[2.0], 1, &[(0, 0.3)], |_| ffn, r);
        assert_eq!(out(FfnRounding::Kernel), vec![round_bf16(kernel * 0.3)]);
        assert_eq!(out(FfnRounding::Transformers), vec![round_bf16(hf * round_bf16(0.3))]);
    }
}
