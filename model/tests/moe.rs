//! Properties of the MoE math in `palladium_model::moe`, the one copy the reference forward
//! pass and the kernels' references share (fixed seeds: the same cases on every run).
//!
//! - Routing, whatever the logits (NaN and infinities included): `top_k` distinct experts in
//!   range, in descending score order (ties to the lower id), weights NaN exactly when a
//!   score is, renormalised weights summing to one.
//! - The kernels' rounding convention ([`FfnRounding::Kernel`]: f32 accumulators, the
//!   activation and the output rounded to bf16) against transformers' bf16 model
//!   ([`FfnRounding::Transformers`]: every materialised tensor rounded) on the same experts and
//!   routing: within 2^-6 of the largest output magnitude (the project's logits tolerance,
//!   four bf16 ulps; measured about one), and both within it of the unrounded f32 result.

use palladium_array::round_bf16;
use palladium_model::moe::{FfnRounding, Layout, Projection, SwiGlu, moe_ffn, route};
use palladium_model::tolerance::{LOGITS_RELATIVE_TOLERANCE, max_abs, max_abs_diff};
use palladium_model::{RouterScoring, TopKWeights};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config(cases: u32) -> Config {
    Config { cases, rng_seed: RngSeed::Fixed(0x4d6f45), ..Config::default() }
}

/// A logit: mostly ordinary values, sometimes ties, NaN or infinite.
fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -8.0f32..8.0,
        2 => Just(1.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn routing_picks_distinct_experts_in_score_order(
        logits in prop::collection::vec(logit(), 1..40),
        k in 1usize..40,
        sigmoid in any::<bool>(),
        renormalize in any::<bool>(),
    ) {
        let top_k = k.min(logits.len());
        let scoring = if sigmoid { RouterScoring::Sigmoid } else { RouterScoring::Softmax };
        let weights = if renormalize { TopKWeights::Renormalized } else { TopKWeights::Raw };
        let r = route(&logits, top_k, scoring, weights);
        let mut ids: Vec<usize> = r.chosen.iter().map(|c| c.0).collect();
        prop_assert_eq!(ids.len(), top_k);
        prop_assert!(ids.iter().all(|&e| e < logits.len()));
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), top_k, "distinct: {:?}", r.chosen);
        // Scores are NaN everywhere (softmax: a NaN or +inf logit, or all -inf) or where the
        // logit is NaN (sigmoid).
        let poisoned = match scoring {
            RouterScoring::Softmax => {
                logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY)
                    || logits.iter().all(|l| *l == f32::NEG_INFINITY)
            }
            RouterScoring::Sigmoid => logits.iter().any(|l| l.is_nan()),
        };
        prop_assert!(r.chosen.iter().all(|c| c.1.is_nan() == poisoned), "{:?}", r.chosen);
        // The whole ranking, with the raw scores: the choice is its prefix, the runner-up next.
        let all = route(&logits, logits.len(), scoring, TopKWeights::Raw).chosen;
        let ranked: Vec<usize> = all.iter().map(|c| c.0).collect();
        prop_assert_eq!(&ranked[..top_k], &r.chosen.iter().map(|c| c.0).collect::<Vec<_>>()[..]);
        prop_assert_eq!(ranked.get(top_k).copied(), r.runner_up);
        if !poisoned {
            for w in all.windows(2) {
                let ((a, sa), (b, sb)) = (w[0], w[1]);
                prop_assert!(sa > sb || sa == sb && a < b, "order {:?} of {:?}", all, logits);
            }
            if renormalize {
                let sum: f32 = r.chosen.iter().map(|c| c.1).sum();
                prop_assert!((sum - 1.0).abs() < 1e-5, "sum {}", sum);
            }
        }
    }
}

/// An MoE layer's shapes and values: `(hidden, ffn, top_k)`, then `x`, the experts'
/// gate, up and down weights (`[out, in]`, fan-in scaled so every activation is O(1), as in
/// a trained model) and the router logits, all bf16 values.
#[allow(clippy::type_complexity)]
fn moe_layer()
-> impl Strategy<Value = ((usize, usize, usize), Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>)>
{
    (16usize..96, 8usize..96, 1usize..6, 1usize..6).prop_flat_map(|(hidden, ffn, experts, k)| {
        let values = |n: usize, scale: f32| {
            prop::collection::vec((-1.0f32..1.0).prop_map(move |v| round_bf16(v * scale)), n)
        };
        let (h, f) = (1.0 / (hidden as f32).sqrt(), 1.0 / (ffn as f32).sqrt());
        (
            Just((hidden, ffn, k.min(experts))),
            values(hidden, 1.0),
            values(experts * hidden * ffn, h),
            values(experts * hidden * ffn, h),
            values(experts * ffn * hidden, f),
            values(experts, 2.0),
        )
    })
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn the_kernels_rounding_stays_within_the_logits_tolerance_of_transformers(
        ((hidden, ffn, top_k), x, gate, up, down, logits) in moe_layer(),
    ) {
        let chosen = route(&logits, top_k, RouterScoring::Softmax, TopKWeights::Renormalized).chosen;
        let (gs, ds) = (hidden * ffn, ffn * hidden);
        let expert = |e: usize| SwiGlu::silu(
            Projection::new(&gate[e * gs..(e + 1) * gs], hidden, ffn, Layout::OutIn),
            Projection::new(&up[e * gs..(e + 1) * gs], hidden, ffn, Layout::OutIn),
            Projection::new(&down[e * ds..(e + 1) * ds], ffn, hidden, Layout::OutIn),
        );
        let out = |r| moe_ffn(&x, hidden, &chosen, expert, r);
        let (exact, hf, kernel) =
            (out(FfnRounding::None), out(FfnRounding::Transformers), out(FfnRounding::Kernel));
        let bound = LOGITS_RELATIVE_TOLERANCE * max_abs(&hf);
        prop_assert!(max_abs_diff(&kernel, &hf) <= bound, "kernel vs transformers {} > {}", max_abs_diff(&kernel, &hf), bound);
        prop_assert!(max_abs_diff(&hf, &exact) <= bound, "transformers vs f32 {} > {}", max_abs_diff(&hf, &exact), bound);
        prop_assert!(max_abs_diff(&kernel, &exact) <= bound, "kernel vs f32 {} > {}", max_abs_diff(&kernel, &exact), bound);
    }
}
