//! Invariants of the reference forward pass (no Python needed).

use std::path::Path;

use palladium_model::ModelSpec;
use palladium_model::reference::{ForwardError, Generation, Precision, Reference, argmax};
use palladium_model::weights::Weights;

fn spec(name: &str) -> ModelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models").join(name);
    ModelSpec::from_path(path).unwrap()
}

fn config_json(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const MODELS: [&str; 4] =
    ["tiny-qwen3-moe.json", "tiny-mixtral.json", "tiny-deepseek-v3.json", "tiny-deepseek-v2.json"];
const PRECISIONS: [Precision; 2] = [Precision::F32, Precision::Bf16];

#[test]
fn one_token_prompt_gives_finite_logits() {
    for m in MODELS {
        let s = spec(m);
        let w = Weights::random(&s, 1).unwrap();
        for p in PRECISIONS {
            let r = Reference::new(&s, &w, p).unwrap();
            let g = r.generate(&[5], 1).unwrap();
            let l = &g.steps[0].logits;
            assert_eq!(l.len(), 512);
            assert!(l.iter().all(|x| x.is_finite()), "{m} {p:?}");
            // O(1) logits that are not all equal: random weights keep activations alive.
            let max = l.iter().fold(0f32, |a, &b| a.max(b.abs()));
            assert!((0.3..50.0).contains(&max), "{m} {p:?}: max |logit| {max}");
            assert_eq!(g.generated_ids, vec![argmax(l) as u32]);
            if p == Precision::Bf16 {
                assert!(l.iter().all(|&x| half::bf16::from_f32(x).to_f32() == x));
            }
        }
    }
}

#[test]
fn kv_cache_decode_equals_full_prefix_recompute() {
    for m in MODELS {
        let s = spec(m);
        let w = Weights::random(&s, 2).unwrap();
        for p in PRECISIONS {
            let r = Reference::new(&s, &w, p).unwrap();
            let g = r.generate(&[7, 300, 12], 8).unwrap();
            // Recompute every step from scratch: the whole prefix as one block, no cache.
            let mut seq = vec![7, 300, 12];
            for (i, step) in g.steps.iter().enumerate() {
                let mut fresh = r.new_cache();
                let all = r.forward_block(&mut fresh, &seq).unwrap();
                assert_eq!(fresh.len(), seq.len());
                assert_eq!(all.last().unwrap(), &step.logits, "{m} {p:?} step {i}");
                seq.push(g.generated_ids[i]);
            }
            // Block prefill then cached steps give the same as token-by-token too.
            let mut c = r.new_cache();
            r.forward_block(&mut c, &[7, 300]).unwrap();
            let l = r.step(&mut c, 12).unwrap();
            assert_eq!(l, g.steps[0].logits);
        }
    }
}

#[test]
fn batch_rows_are_independent() {
    for m in MODELS {
        let s = spec(m);
        let w = Weights::random(&s, 3).unwrap();
        let r = Reference::new(&s, &w, Precision::Bf16).unwrap();
        let a: &[u32] = &[1, 2, 3];
        let b: &[u32] = &[400, 9];
        let outs = r.generate_batch(&[a, a, b, a], 8).unwrap();
        let single_a = r.generate(a, 8).unwrap();
        let single_b = r.generate(b, 8).unwrap();
        assert_eq!(outs[0], outs[1]);
        assert_eq!(outs[0], outs[3]);
        assert_eq!(outs[0], single_a, "{m}");
        assert_eq!(outs[2], single_b, "{m}");
    }
}

#[test]
fn generation_is_deterministic_and_seed_dependent() {
    let s = spec("tiny-qwen3-moe.json");
    let prompt = [11, 22, 33, 44];
    let run = |seed| {
        let w = Weights::random(&s, seed).unwrap();
        Reference::new(&s, &w, Precision::Bf16).unwrap().generate(&prompt, 8).unwrap()
    };
    let (a, b, c) = (run(4), run(4), run(5));
    assert_eq!(a, b);
    assert_ne!(a.steps[0].logits, c.steps[0].logits);
    assert_eq!(a.generated_ids.len(), 8);
    assert_eq!(a.steps.len(), 8);
    // The `--logits-out` JSON layout.
    let v: serde_json::Value = serde_json::to_value(&a).unwrap();
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 8);
    assert_eq!(v["steps"][0]["logits"].as_array().unwrap().len(), 512);
    let back: Generation = serde_json::from_value(v).unwrap();
    assert_eq!(back, a);
}

#[test]
fn bf16_and_f32_runs_are_close_but_not_identical() {
    let s = spec("tiny-mixtral.json");
    let w = Weights::random(&s, 6).unwrap();
    let f = Reference::new(&s, &w, Precision::F32).unwrap().generate(&[3, 4], 1).unwrap();
    let b = Reference::new(&s, &w, Precision::Bf16).unwrap().generate(&[3, 4], 1).unwrap();
    let err = f.steps[0]
        .logits
        .iter()
        .zip(&b.steps[0].logits)
        .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(err > 0.0 && err < 1.0, "max |f32 - bf16| = {err}");
}

#[test]
fn config_variants_run() {
    // Qwen3-MoE with attention biases, a dense layer, raw top-k weights and a tied head;
    // Mixtral with a sliding window shorter than the sequence.
    let mut v = config_json("tiny-qwen3-moe.json");
    v["attention_bias"] = true.into();
    v["mlp_only_layers"] = serde_json::json!([1]);
    v["norm_topk_prob"] = false.into();
    v["tie_word_embeddings"] = true.into();
    let s = ModelSpec::from_json(&v).unwrap();
    let w = Weights::random(&s, 8).unwrap();
    assert!(w.get("lm_head.weight").is_none());
    for p in PRECISIONS {
        let r = Reference::new(&s, &w, p).unwrap();
        let g = r.generate(&[1, 2, 3], 4).unwrap();
        assert!(g.steps.iter().all(|st| st.logits.iter().all(|x| x.is_finite())));
    }

    let mut v = config_json("tiny-mixtral.json");
    v["sliding_window"] = 4.into();
    let s = ModelSpec::from_json(&v).unwrap();
    let w = Weights::random(&s, 9).unwrap();
    let r = Reference::new(&s, &w, Precision::F32).unwrap();
    let g = r.generate(&[1, 2, 3, 4, 5, 6], 6).unwrap();
    let mut seq = vec![1, 2, 3, 4, 5, 6];
    seq.extend_from_slice(&g.generated_ids[..5]);
    let mut c = r.new_cache();
    let all = r.forward_block(&mut c, &seq).unwrap();
    assert_eq!(all.last().unwrap(), &g.steps[5].logits);
    // The window matters: the same weights with full attention give other logits.
    let full = Reference::new(&spec("tiny-mixtral.json"), &w, Precision::F32).unwrap();
    let gf = full.generate(&[1, 2, 3, 4, 5, 6], 1).unwrap();
    assert_ne!(gf.steps[0].logits, g.steps[0].logits);
}

#[test]
fn bad_inputs_are_errors() {
    let s = spec("tiny-qwen3-moe.json");
    let w = Weights::random(&s, 1).unwrap();
    let r = Reference::new(&s, &w, Precision::F32).unwrap();
    assert_eq!(r.generate(&[], 3).unwrap_err(), ForwardError::EmptyPrompt);
    assert_eq!(
        r.generate(&[1, 512], 3).unwrap_err(),
        ForwardError::TokenOutOfRange { id: 512, vocab: 512 }
    );
    // Weights of another model are refused, naming a tensor.
    let wm = Weights::random(&spec("tiny-mixtral.json"), 1).unwrap();
    let e = Reference::new(&s, &wm, Precision::F32).unwrap_err();
    assert!(e.tensor().is_some(), "{e}");
}
