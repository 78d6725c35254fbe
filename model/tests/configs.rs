//! The real and tiny configs parse to the documented shapes and sizes, and the transformers 4.x
//! and 5.x spellings give identical descriptions.

use crate::common;

use common::{edited, fixture_json, spec};
use palladium_model::{
    AttentionKind, Dtype, Family, FfnKind, LmHead, ModelSpec, QkNorm, RopeStyle, TopKWeights,
    expected_distinct_experts,
};
use serde_json::json;

fn moe(spec: &ModelSpec, layer: usize) -> &palladium_model::MoeSpec {
    match &spec.layers[layer].ffn {
        FfnKind::Moe(m) => m,
        other => panic!("layer {layer} is {other:?}"),
    }
}

fn close(x: u64, public: f64, tolerance: f64) -> bool {
    ((x as f64 - public) / public).abs() <= tolerance
}

/// Qwen3-30B-A3B. Public figures (model card): 30.5B total, 3.3B activated, 48 layers,
/// 128 experts, 8 activated, 32 Q / 4 KV heads.
#[test]
fn qwen3_30b_a3b() {
    let s = spec("qwen3-30b-a3b.json");
    assert_eq!(s.family, Family::Qwen3Moe);
    assert_eq!(s.layers.len(), 48);
    assert_eq!(s.hidden_size, 2048);
    assert_eq!(s.vocab_size, 151_936);
    assert_eq!(s.max_position_embeddings, 40_960);
    assert_eq!(s.dtype, Some(Dtype::BFloat16));
    assert_eq!(
        (s.attention.num_heads, s.attention.num_kv_heads, s.attention.head_dim),
        (32, 4, 128)
    );
    assert_eq!(s.attention.qk_norm, QkNorm::PerHeadRms { weight_len: 128 });
    assert_eq!(s.attention.rope.style, RopeStyle::NeoxRotateHalf);
    assert_eq!(s.attention.rope.theta, 1e6);
    assert_eq!(s.norm.eps, 1e-6);
    assert_eq!(s.lm_head, LmHead::Untied);
    assert!(s.defaulted.is_empty(), "{:?}", s.defaulted);
    for l in &s.layers {
        assert_eq!(l.attention, AttentionKind::Full);
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (128, 8, 768));
        assert_eq!(m.routing.top_k_weights, TopKWeights::Renormalized);
        assert!(m.shared.is_none());
    }

    let p = s.params();
    // Per layer: attention 2048*(4096+2*512) + 4096*2048, norms 2*2048 + 2*128, router
    // 2048*128, experts 128 * 3*2048*768.
    let layer = s.layer_params(&s.layers[0]);
    assert_eq!(layer.attention, 18_874_368);
    assert_eq!(layer.norms, 4_352);
    assert_eq!(layer.router, 262_144);
    assert_eq!(layer.experts_total, 603_979_776);
    assert_eq!(layer.experts_active, 37_748_736);
    assert_eq!(p.embedding, 311_164_928);
    assert_eq!(p.lm_head, 311_164_928);
    assert_eq!(p.total(), 30_532_122_624);
    assert_eq!(p.active(), 3_353_032_704);
    assert!(close(p.total(), 30.5e9, 0.01) && close(p.active(), 3.3e9, 0.02));
    // The megakernel anchors' 3.04B "active params/token" excludes the embedding matrix (one
    // row is read per token) and the norms.
    assert_eq!(p.active_without_embedding() - p.layers.norms - p.final_norm, 3_041_656_832);

    // KV cache: 2 (K, V) * 4 heads * 128 * 2 bytes.
    assert_eq!(s.kv_bytes_per_token_per_layer(2), 2048);
}

/// Qwen3-235B-A22B. Public figures: 235B total, 22B activated, 94 layers, 64 Q / 4 KV heads.
#[test]
fn qwen3_235b_a22b() {
    let s = spec("qwen3-235b-a22b.json");
    assert_eq!(s.layers.len(), 94);
    assert_eq!(s.hidden_size, 4096);
    assert_eq!(
        (s.attention.num_heads, s.attention.num_kv_heads, s.attention.head_dim),
        (64, 4, 128)
    );
    let m = moe(&s, 93);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (128, 8, 1536));
    let p = s.params();
    assert_eq!(p.total(), 235_093_634_560);
    assert_eq!(p.active(), 22_190_763_520);
    assert!(close(p.total(), 235e9, 0.01) && close(p.active(), 22e9, 0.01));
}

/// Mixtral-8x7B (config values from megakernel-anchors §6; public figures 46.7B total,
/// 12.9B active).
#[test]
fn mixtral_8x7b() {
    let config = json!({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": null,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"
    });
    let s = ModelSpec::from_json(&config).expect("parses");
    assert_eq!(s.family, Family::Mixtral);
    assert_eq!(s.attention.head_dim, 128);
    assert_eq!(s.attention.qk_norm, QkNorm::None);
    assert_eq!(moe(&s, 0).routing.top_k_weights, TopKWeights::Renormalized);
    let p = s.params();
    assert_eq!(p.total(), 46_702_792_704);
    assert_eq!(p.active(), 12_879_925_248);
    assert!(close(p.total(), 46.7e9, 0.01) && close(p.active(), 12.9e9, 0.01));
}

#[test]
fn tiny_configs() {
    let q = spec("tiny-qwen3-moe.json");
    assert_eq!((q.layers.len(), q.hidden_size, q.vocab_size), (4, 256, 512));
    assert_eq!((q.attention.num_heads, q.attention.num_kv_heads, q.attention.head_dim), (4, 2, 64));
    let m = moe(&q, 0);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (8, 2, 128));

    let x = spec("tiny-mixtral.json");
    assert_eq!(x.family, Family::Mixtral);
    assert_eq!(x.attention.head_dim, 64);
    assert_eq!(x.defaulted.get("head_dim").map(String::as_str), Some("64"));
    // The same shapes as the tiny Qwen3 but without q/k norms.
    assert_eq!(x.params().total(), q.params().total() - 4 * 2 * 64);
}

#[test]
fn transformers_4_and_5_spellings_agree() {
    let v4 = spec("tiny-qwen3-moe.json");
    let v5 = spec("tiny-qwen3-moe-tf5.json");
    assert_eq!(v4, v5);
    // `num_local_experts` (5.x attribute map) for `num_experts`.
    let local = edited(
        "tiny-qwen3-moe.json",
        &[("num_experts", None), ("num_local_experts", Some(json!(8)))],
    )
    .expect("parses");
    assert_eq!(local, v4);
    // Both spellings at once, agreeing; `rope_scaling` as a `default` dict.
    let both = edited(
        "tiny-qwen3-moe.json",
        &[
            ("rope_parameters", Some(json!({"rope_theta": 1e6, "rope_type": "default"}))),
            ("rope_scaling", Some(json!({"rope_type": "default"}))),
            ("dtype", Some(json!("bfloat16"))),
            ("num_local_experts", Some(json!(8))),
        ],
    )
    .expect("parses");
    assert_eq!(both, v4);
}

#[test]
fn qwen3_dense_layers_from_mlp_only_layers_and_sparse_step() {
    let s =
        edited("tiny-qwen3-moe.json", &[("mlp_only_layers", Some(json!([0])))]).expect("parses");
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 512 });
    assert!(matches!(s.layers[1].ffn, FfnKind::Moe(_)));

    // decoder_sparse_step 2: layers 1 and 3 ((i+1) % 2 == 0) are MoE.
    let s =
        edited("tiny-qwen3-moe.json", &[("decoder_sparse_step", Some(json!(2)))]).expect("parses");
    let kinds: Vec<bool> = s.layers.iter().map(|l| matches!(l.ffn, FfnKind::Moe(_))).collect();
    assert_eq!(kinds, [false, true, false, true]);

    // Without dense layers `intermediate_size` is not needed.
    let s = edited("tiny-qwen3-moe.json", &[("intermediate_size", None)]).expect("parses");
    assert!(s.layers.iter().all(|l| matches!(l.ffn, FfnKind::Moe(_))));
}

#[test]
fn qwen3_sliding_window_layers() {
    // 4.x rule: layers >= max_window_layers slide.
    let s = edited(
        "tiny-qwen3-moe.json",
        &[
            ("use_sliding_window", Some(json!(true))),
            ("sliding_window", Some(json!(128))),
            ("max_window_layers", Some(json!(2))),
        ],
    )
    .expect("parses");
    let kinds: Vec<AttentionKind> = s.layers.iter().map(|l| l.attention).collect();
    let w = AttentionKind::Sliding { window: 128 };
    assert_eq!(kinds, [AttentionKind::Full, AttentionKind::Full, w, w]);

    // `layer_types` wins over max_window_layers.
    let s = edited(
        "tiny-qwen3-moe.json",
        &[
            ("use_sliding_window", Some(json!(true))),
            ("sliding_window", Some(json!(128))),
            (
                "layer_types",
                Some(json!([
                    "sliding_attention",
                    "full_attention",
                    "sliding_attention",
                    "full_attention"
                ])),
            ),
        ],
    )
    .expect("parses");
    let kinds: Vec<AttentionKind> = s.layers.iter().map(|l| l.attention).collect();
    assert_eq!(kinds, [w, AttentionKind::Full, w, AttentionKind::Full]);

    // use_sliding_window false: a sliding_window value is ignored, as in Hugging Face.
    let s = edited("tiny-qwen3-moe.json", &[("sliding_window", Some(json!(128)))]).expect("parses");
    assert!(s.layers.iter().all(|l| l.attention == AttentionKind::Full));
}

#[test]
fn mixtral_sliding_window_applies_to_every_layer() {
    let s = edited("tiny-mixtral.json", &[("sliding_window", Some(json!(1024)))]).expect("parses");
    assert!(s.layers.iter().all(|l| l.attention == AttentionKind::Sliding { window: 1024 }));
    // KV reads stop growing at the window.
    let at = |t| s.decode_traffic(1, t, 2).kv_read;
    assert_eq!(at(4096), at(1024));
    assert_eq!(at(512) * 2, at(1024));
}

#[test]
fn qwen3_options() {
    let s =
        edited("tiny-qwen3-moe.json", &[("norm_topk_prob", Some(json!(false)))]).expect("parses");
    assert_eq!(moe(&s, 0).routing.top_k_weights, TopKWeights::Raw);
    let s = edited("tiny-qwen3-moe.json", &[("tie_word_embeddings", Some(json!(true)))])
        .expect("parses");
    assert_eq!(s.lm_head, LmHead::Tied);
    assert_eq!(s.params().lm_head, 0);
    let s =
        edited("tiny-qwen3-moe.json", &[("attention_bias", Some(json!(true)))]).expect("parses");
    assert!(s.attention.qkv_bias && s.attention.o_bias);
    // q, k, v biases (256 + 2*128) and o bias (256) per layer.
    let plain = spec("tiny-qwen3-moe.json");
    assert_eq!(s.params().total() - plain.params().total(), 4 * (512 + 256));
    // head_dim absent: hidden / heads.
    let s = edited("tiny-qwen3-moe.json", &[("head_dim", None)]).expect("parses");
    assert_eq!(s.attention.head_dim, 64);
    assert_eq!(s.defaulted.get("head_dim").map(String::as_str), Some("64"));
    // Optional fields absent take the Hugging Face defaults, and say so.
    let mut v = fixture_json("tiny-qwen3-moe.json");
    for key in [
        "hidden_act",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_bias",
        "decoder_sparse_step",
        "mlp_only_layers",
        "use_sliding_window",
        "norm_topk_prob",
        "torch_dtype",
    ] {
        v.as_object_mut().expect("object").remove(key);
    }
    let s = ModelSpec::from_json(&v).expect("parses");
    assert_eq!(s.dtype, None);
    assert_eq!(s.norm.eps, 1e-6);
    let keys: Vec<&str> = s.defaulted.keys().copied().collect();
    assert_eq!(
        keys,
        [
            "hidden_act",
            "attention_bias",
            "rms_norm_eps",
            "tie_word_embeddings",
            "decoder_sparse_step",
            "mlp_only_layers",
            "norm_topk_prob",
            "use_sliding_window"
        ]
    );
}

#[test]
fn expected_experts_under_uniform_routing() {
    assert_eq!(expected_distinct_experts(128, 8, 1), 8.0);
    assert_eq!(expected_distinct_experts(128, 8, 0), 0.0);
    assert_eq!(expected_distinct_experts(8, 8, 5), 8.0);
    // 1 - (15/16)^2 = 31/256 of 128.
    assert!((expected_distinct_experts(128, 8, 2) - 15.5).abs() < 1e-9);
    assert!(expected_distinct_experts(128, 8, 1000) > 127.99);
}

#[test]
fn decode_traffic_qwen3_30b() {
    let s = spec("qwen3-30b-a3b.json");
    let p = s.params();
    // B=1: every weight a token uses, one embedding row, and the whole KV cache of one sequence.
    let t = s.decode_traffic(1, 4096, 2);
    let weights = 2 * (p.active_without_embedding() + s.hidden_size);
    assert_eq!(t.weights(), weights as f64);
    assert_eq!(t.kv_read, 48 * 4096 * 2048);
    assert_eq!(t.kv_write, 48 * 2048);
    // B=64: nearly all experts are read (128 * (1 - (15/16)^64) = 126.2 per layer).
    let t64 = s.decode_traffic(64, 4096, 2);
    let expert = 2 * 3 * 2048 * 768;
    let expect = 48.0 * expected_distinct_experts(128, 8, 64) * expert as f64;
    assert!((t64.expert_weights - expect).abs() < 1.0);
    assert!(t64.expert_weights > 0.98 * (2 * p.layers.experts_total) as f64);
    assert_eq!(t64.kv_read, 64 * t.kv_read);
}
