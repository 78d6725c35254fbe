//! A layer kind per layer: Qwen3-MoE checkpoints whose dense-MLP layers sit among the MoE
//! layers (`mlp_only_layers`, `decoder_sparse_step`), made by transformers'
//! `Qwen3MoeForCausalLM` (random weights, norms random too: `model/tests/hf_reference.py`),
//! run by the megakernel in the interpreter on 1 and 2 devices and held to transformers'
//! own forward pass teacher-forced (every step fed transformers' bf16 model's ids):
//!
//! - the relative L2 error of the logits against transformers' f32 forward pass on the bf16
//!   weights at most [`REL_L2`];
//! - the same argmax as that f32 pass, except at a near tie of its top-2 logits (within the
//!   project's logits tolerance) or downstream of a routing near tie (an f32 router margin
//!   below [`ROUTER_TIE`] at a token fed so far; the margins come from the plain-Rust f32
//!   reference along the same ids, itself checked to be transformers' f32 computation).
//!
//! On 2 devices the experts are split EP (the planner's choice at batch 1) and the dense
//! MLP by intermediate columns, summed by the FFN's all-reduce. Measured numbers are
//! printed (`-- --nocapture`).

use crate::hf_oracle;

use hf_oracle::run_oracle;
use palladium_decode::{Decoder, ROUTER_TIE, pack::pack_devices};
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::Ffn;
use palladium_fusion::{megakernel::Megakernel, plan::PlanOptions};
use palladium_model::ModelSpec;
use palladium_model::reference::{Precision, Reference, argmax};
use palladium_model::tolerance::logits_tolerance;
use palladium_model::weights::Weights;

/// The relative L2 error of the logits the issue holds the megakernel to.
const REL_L2: f32 = 0.03;

/// The plain-Rust f32 reference's tolerance against transformers' f32 logits (the model
/// crate's): within it, its router margins are transformers'.
const F32_REFERENCE_TOL: f32 = 1e-4;

fn rel_l2(ours: &[f32], want: &[f32]) -> f32 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (&a, &b) in ours.iter().zip(want) {
        err += f64::from(a - b).powi(2);
        norm += f64::from(b).powi(2);
    }
    (err / norm).sqrt() as f32
}

/// `config` (a fixture with dense-MLP layers `dense`) against transformers on 1 and 2
/// devices, teacher-forced along transformers' bf16 ids.
fn check(config: &str, dense: &[usize], seed: u64, prompt: &[u32], steps: usize) {
    let oracle = run_oracle(config, seed, prompt, steps, true);
    let spec = ModelSpec::from_path(oracle.dir.join("config.json")).unwrap();
    let weights = Weights::load(&spec, oracle.dir.join("model.safetensors")).unwrap();
    let (hf, hf_f32) = (&oracle.bf16, oracle.f32_on_bf16.as_ref().unwrap());
    let context = (prompt.len() + steps) as u64;
    // The ids fed: the prompt, then transformers' bf16 ids; step i's logits follow feed
    // `prompt.len() - 1 + i`.
    let feed: Vec<u32> =
        prompt.iter().copied().chain(hf.generated_ids.iter().copied().take(steps - 1)).collect();

    // The f32 reference's router margins along the same ids (the smallest so far).
    let rf = Reference::new(&spec, &weights, Precision::F32).unwrap();
    let mut cache = rf.new_cache();
    let mut margins = Vec::new();
    let mut margin = f32::INFINITY;
    for (k, &t) in feed.iter().enumerate() {
        let (logits, m) = rf.step_traced(&mut cache, t).unwrap();
        margin = margin.min(m);
        if let Some(i) = (k + 1).checked_sub(prompt.len()) {
            let e = logits
                .iter()
                .zip(&hf_f32.steps[i].logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                e <= F32_REFERENCE_TOL,
                "{config} step {i}: the f32 reference is {e} from transformers' f32"
            );
            margins.push(margin);
        }
    }

    for devices in [1, 2] {
        let options =
            PlanOptions { devices, logits: true, ..PlanOptions::new(Chip::V6e, 1, context) };
        let mk = Megakernel::build(&spec, &options).unwrap_or_else(|e| panic!("{config}: {e}"));
        assert_eq!(
            mk.plan.layer_ffns.layers_of(Ffn::DenseMlp),
            dense.iter().map(|&l| l as u64).collect::<Vec<_>>()
        );
        let mut dec = Decoder::new(&mk, pack_devices(&spec, &mk.plan, &weights).unwrap()).unwrap();
        for (k, &t) in feed.iter().enumerate() {
            let ours = dec.step(&[t]).unwrap().logits.unwrap().remove(0);
            let Some(i) = (k + 1).checked_sub(prompt.len()) else { continue };
            let want = &hf_f32.steps[i].logits;
            let err = rel_l2(&ours, want);
            let (id, want_id) = (argmax(&ours), argmax(want));
            // transformers' f32 top-2 margin.
            let mut sorted = want.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let top2 = sorted[0] - sorted[1];
            println!(
                "{config} seed {seed}, {devices} device(s), step {i}: rel L2 {err:.5}, id {id} (transformers f32 {want_id}, top-2 margin {top2:.4}), router margin {:.4}",
                margins[i]
            );
            assert!(
                err <= REL_L2,
                "{config}, {devices} device(s), step {i}: relative L2 error {err} > {REL_L2}"
            );
            let near_tie = top2 <= logits_tolerance(want) || margins[i] < ROUTER_TIE;
            assert!(
                id == want_id || near_tie,
                "{config}, {devices} device(s), step {i}: id {id}, transformers' f32 {want_id} (top-2 margin {top2}, router margin {})",
                margins[i]
            );
        }
    }
    oracle.remove();
}

/// Layer 1 dense among MoE layers 0, 2, 3 (`mlp_only_layers: [1]`).
#[test]
fn mlp_only_layers_match_transformers_on_1_and_2_devices() {
    check("fixtures/models/tiny-qwen3-moe-mlp-only-layers.json", &[1], 5, &[1, 17, 300, 42], 4);
}

/// Layers 0 and 2 dense, 1 and 3 MoE (`decoder_sparse_step: 2`): the first layer dense.
#[test]
fn decoder_sparse_step_matches_transformers_on_1_and_2_devices() {
    check("fixtures/models/tiny-qwen3-moe-sparse-step-2.json", &[0, 2], 9, &[3, 99, 250, 7], 4);
}

/// GLM-4.5 with sizes that fill no 128-lane tile (hidden 192, expert and shared expert
/// intermediate 80, its dense first layer's 200), padded with zeros by the megakernel (its
/// RMS norms dividing by the model's 192), on 1 and 2 devices (each holding 128 of the
/// dense MLP's and the shared expert's padded columns).
#[test]
fn padded_sizes_match_transformers_on_1_and_2_devices() {
    check("fixtures/models/tiny-glm4-moe-padded.json", &[0], 13, &[4, 23, 280, 11, 63], 10);
}

/// Quantized weights (int8, fp8; quantized at load) with dense-MLP layers: the dense MLP's
/// codes and scales as an expert's, on 1 and 2 devices, against the reference forward pass
/// on the dequantized weights within the project's logits tolerance (the `--check` rules).
#[test]
fn quantized_dense_mlp_layers_match_the_reference_on_dequantized_weights() {
    use palladium_decode::compare_with;
    use palladium_decode::pack::pack_quantized_devices;
    use palladium_model::quant::{QuantizedWeights, WeightsDtype};
    use palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE;
    let prompt = [1, 17, 300, 42];
    for name in ["tiny-qwen3-moe-mlp-only-layers", "tiny-qwen3-moe-sparse-step-2"] {
        let spec = ModelSpec::from_path(format!(
            "{}/../fixtures/models/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let weights = Weights::random(&spec, 3).unwrap();
        for dtype in [WeightsDtype::Int8, WeightsDtype::Fp8] {
            let quantized = QuantizedWeights::quantize(&spec, &weights, dtype).unwrap();
            for devices in [1, 2] {
                let options = PlanOptions {
                    weights: dtype,
                    devices,
                    logits: true,
                    ..PlanOptions::new(Chip::V6e, 1, 16)
                };
                let mk = Megakernel::build(&spec, &options).unwrap_or_else(|e| panic!("{e}"));
                assert!(!mk.plan.layer_ffns.all_routed());
                let packed = pack_quantized_devices(&spec, &mk.plan, &quantized).unwrap();
                let mut decoder = Decoder::new(&mk, packed).unwrap();
                let generation = decoder.generate(&prompt, 3).unwrap();
                let c = compare_with(
                    &spec,
                    &quantized.dequantize(),
                    &prompt,
                    &generation,
                    LOGITS_RELATIVE_TOLERANCE,
                )
                .unwrap();
                println!("{name} {} on {devices} device(s): {}", dtype.name(), c.summary());
                assert!(
                    c.passed(),
                    "{name} {} on {devices} device(s): {}",
                    dtype.name(),
                    c.summary()
                );
            }
        }
    }
}
