//! The real and tiny configs parse to the documented shapes and sizes, and the transformers 4.x
//! and 5.x spellings give identical descriptions.

use crate::common;

use common::{edited, fixture_json, spec};
use palladium_model::{
    AttentionForm, AttentionKind, Dtype, Family, FfnKind, LmHead, MlaSpec, ModelSpec, QkNorm,
    RopeScaling, RopeStyle, TopKWeights, expected_distinct_experts,
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

/// DeepSeek-V3 as shipped: 3 dense layers, then MoE layers with DeepSeek-V3's routing (the
/// one GLM-4.5 reuses) and one shared expert. Its MLA numbers are the paper's: 576 cached
/// values per position and layer, against 128 heads x (192 + 128) for the expanded K/V; the
/// softmax scale carries YaRN's `mscale_all_dim` correction.
#[test]
fn deepseek_v3() {
    use palladium_model::spec::{ExpertGroups, GroupScore, RouterPrecision, RouterScoring};
    let s = spec("deepseek-v3.json");
    assert_eq!(s.layers.len(), 61);
    for l in &s.layers[..3] {
        assert_eq!(l.ffn, FfnKind::Dense { intermediate: 18432 }, "layer {}", l.index);
    }
    let m = moe(&s, 3);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (256, 8, 2048));
    let r = m.routing;
    assert_eq!(r.scoring, RouterScoring::Sigmoid);
    assert!(r.correction_bias);
    assert_eq!(r.top_k_weights, TopKWeights::Renormalized);
    assert_eq!(
        r.groups,
        Some(ExpertGroups { groups: 8, chosen_groups: 4, score: GroupScore::TopTwoSum })
    );
    assert_eq!((r.scaling, r.precision), (2.5, RouterPrecision::F32));
    assert!(s.report().contains("best 4 of 8 groups by their best two"), "{}", s.report());
    let shared = m.shared.expect("DeepSeek-V3's MoE layers have a shared expert");
    assert_eq!((shared.intermediate, shared.sigmoid_gate), (2048, false));
    assert_eq!(s.layers[60].ffn, s.layers[3].ffn);
    // Kimi-K2 ships the same architecture as `model_type` "kimi_k2".
    let kimi = edited("deepseek-v3.json", &[("model_type", Some(json!("kimi_k2")))]).unwrap();
    assert_eq!((kimi.family, &kimi.layers), (Family::DeepseekV3, &s.layers));
    // An unknown router method is refused by name.
    let e = edited("deepseek-v3.json", &[("topk_method", Some(json!("group_limited_greedy")))])
        .unwrap_err();
    assert_eq!(e.field(), Some("topk_method"), "{e}");

    let s = edited("deepseek-v3.json", &[("first_k_dense_replace", Some(json!(61)))]).unwrap();
    assert_eq!(s.family, Family::DeepseekV3);
    let a = &s.attention;
    assert_eq!((a.num_heads, a.num_kv_heads, a.head_dim), (128, 128, 192));
    assert_eq!(
        a.form,
        AttentionForm::Mla(MlaSpec {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        })
    );
    assert_eq!(a.rope.style, RopeStyle::DeinterleaveRotateHalf);
    assert_eq!(a.rope.rotary_dim, 64);
    match &a.rope.scaling {
        &RopeScaling::Yarn {
            factor, original_max_position_embeddings, attention_factor, ..
        } => {
            assert_eq!((factor, original_max_position_embeddings), (40.0, 4096));
            assert_eq!(attention_factor, 1.0, "mscale == mscale_all_dim");
        }
        other => panic!("{other:?}"),
    }
    let mscale = 0.1 * 40f64.ln() + 1.0;
    assert!((a.scale - 192f64.powf(-0.5) * mscale * mscale).abs() < 1e-12, "{}", a.scale);
    assert_eq!(s.kv_bytes_per_token_per_layer(2), 1152);
    assert_eq!(s.expanded_kv_bytes_per_token_per_layer(2), 128 * (192 + 128) * 2);
    // q_a 7168x1536, q_b 1536x(128*192), kv_a 7168x576, kv_b 512x(128*256), o (128*128)x7168.
    let layer = s.layer_params(&s.layers[0]);
    assert_eq!(layer.attention, 187_105_280);
    assert_eq!(layer.norms, 2 * 7168 + 1536 + 512);
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 18432 });
    let report = s.report();
    assert!(report.contains("MLA latent cache: kv_lora_rank 512 + qk_rope_head_dim 64 = 576"));
}

/// The tiny DeepSeek configs: V3 with a low-rank query and interleaved rope, V2 with complex-pair
/// rope and `q_lora_rank: null`; YaRN's cos/sin factor is `mscale / mscale_all_dim` by
/// `get_mscale`, and V2 has no softmax-scale correction.
#[test]
fn tiny_deepseek() {
    let v3 = spec("tiny-deepseek-v3.json");
    assert!(matches!(v3.attention.form, AttentionForm::Mla(m) if m.q_lora_rank == Some(96)));
    assert_eq!(v3.layers.len(), 3);
    let v2 = spec("tiny-deepseek-v2.json");
    assert_eq!(v2.family, Family::DeepseekV2);
    assert_eq!(v2.attention.rope.style, RopeStyle::ComplexPairs);
    assert!(matches!(v2.attention.form, AttentionForm::Mla(m) if m.q_lora_rank.is_none()));
    assert_eq!(v2.attention.scale, 48f64.powf(-0.5));
    let get = |m: f64| 0.1 * m * 4f64.ln() + 1.0;
    match v2.attention.rope.scaling {
        RopeScaling::Yarn { attention_factor, .. } => {
            assert!((attention_factor - get(1.0) / get(0.8)).abs() < 1e-15)
        }
        other => panic!("{other:?}"),
    }
    // rope_interleave: false is NeoX on the rope dims.
    let neox = edited("tiny-deepseek-v3.json", &[("rope_interleave", Some(json!(false)))]).unwrap();
    assert_eq!(neox.attention.rope.style, RopeStyle::NeoxRotateHalf);
}

/// DeepSeek-V2's MoE layers: softmax scores, raw weights times `routed_scaling_factor`, f32
/// router, `n_shared_experts` ungated shared experts; `group_limited_greedy` groups scored by
/// their best expert; `greedy` reads no groups.
#[test]
fn tiny_deepseek_v2_moe() {
    use palladium_model::spec::{ExpertGroups, GroupScore, RouterPrecision, RouterScoring};
    let s = edited("tiny-deepseek-v2.json", &[("first_k_dense_replace", Some(json!(1)))]).unwrap();
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 512 });
    let m = moe(&s, 1);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (8, 2, 128));
    let r = m.routing;
    assert_eq!((r.scoring, r.top_k_weights), (RouterScoring::Softmax, TopKWeights::Raw));
    assert_eq!((r.correction_bias, r.groups), (false, None));
    assert_eq!((r.scaling, r.precision), (1.0, RouterPrecision::F32));
    let shared = m.shared.expect("DeepSeek-V2's MoE layers have shared experts");
    assert_eq!((shared.intermediate, shared.sigmoid_gate), (256, false));
    let s = edited(
        "tiny-deepseek-v2.json",
        &[
            ("first_k_dense_replace", None),
            ("topk_method", Some(json!("group_limited_greedy"))),
            ("n_group", Some(json!(4))),
            ("topk_group", Some(json!(2))),
            ("routed_scaling_factor", Some(json!(16.0))),
        ],
    )
    .unwrap();
    // DeepseekV2Config's default: every layer MoE.
    assert!(s.defaulted.contains_key("first_k_dense_replace"));
    let r = moe(&s, 0).routing;
    assert_eq!(
        r.groups,
        Some(ExpertGroups { groups: 4, chosen_groups: 2, score: GroupScore::Max })
    );
    assert_eq!(r.scaling, 16.0);
    let report = s.report();
    assert!(report.contains("softmax, best 2 of 4 groups by their best, weights x 16"), "{report}");
    let names: Vec<String> = palladium_model::weights::tensor_layout(&s)
        .unwrap()
        .into_iter()
        .filter(|t| t.name.starts_with("model.layers.0.mlp.") && !t.name.contains(".experts."))
        .map(|t| format!("{} {:?}", t.name, t.shape))
        .collect();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.gate.weight [8, 256]",
            "model.layers.0.mlp.shared_experts.gate_proj.weight [256, 256]",
            "model.layers.0.mlp.shared_experts.up_proj.weight [256, 256]",
            "model.layers.0.mlp.shared_experts.down_proj.weight [256, 256]",
        ]
    );
}

/// DeepSeek-V2-Lite as shipped: 27 layers (layer 0 dense, intermediate 10944), 64 routed
/// experts top-6 of 1408 with 2 shared, softmax `greedy` routing; 16 heads of MLA without a
/// query `LoRA`; per position and layer the latent cache holds 576 values (1152 B in bf16)
/// against 16 x (192 + 128) values (20480 B) of expanded K/V.
#[test]
fn deepseek_v2_lite() {
    use palladium_model::spec::RouterScoring;
    let s = spec("deepseek-v2-lite.json");
    assert_eq!(
        (s.family, s.layers.len(), s.hidden_size, s.vocab_size),
        (Family::DeepseekV2, 27, 2048, 102400)
    );
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 10944 });
    let m = moe(&s, 1);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (64, 6, 1408));
    assert_eq!(
        (m.routing.scoring, m.routing.top_k_weights),
        (RouterScoring::Softmax, TopKWeights::Raw)
    );
    assert_eq!((m.routing.groups, m.routing.scaling), (None, 1.0));
    assert_eq!(m.shared.map(|sh| sh.intermediate), Some(2816));
    assert_eq!(s.layers[26].ffn, s.layers[1].ffn);
    let AttentionForm::Mla(mla) = s.attention.form else { panic!("MLA") };
    assert_eq!(mla.q_lora_rank, None);
    assert_eq!((mla.kv_lora_rank, mla.latent_cache_width()), (512, 576));
    assert_eq!((s.attention.num_heads, s.attention.head_dim), (16, 192));
    assert_eq!(s.kv_bytes_per_token_per_layer(2), 1152);
    assert_eq!(s.expanded_kv_bytes_per_token_per_layer(2), 16 * (192 + 128) * 2);
}

/// Qwen2-MoE: the sigmoid-gated shared expert on every MoE layer, q/k/v biases (`qkv_bias`,
/// default true) without an `o_proj` bias, no q/k norm, raw top-k weights; its dense
/// layers by the same rule as Qwen3-MoE's.
#[test]
fn tiny_qwen2_moe() {
    let s = spec("tiny-qwen2-moe.json");
    assert_eq!(s.family, Family::Qwen2Moe);
    assert_eq!((s.attention.qkv_bias, s.attention.o_bias), (true, false));
    assert_eq!(s.attention.qk_norm, QkNorm::None);
    for l in &s.layers {
        let m = moe(&s, l.index);
        assert_eq!(m.routing.top_k_weights, TopKWeights::Raw);
        let shared = m.shared.expect("every Qwen2-MoE MoE layer has a shared expert");
        assert_eq!((shared.intermediate, shared.sigmoid_gate), (256, true));
    }
    let s =
        edited("tiny-qwen2-moe.json", &[("qkv_bias", None), ("mlp_only_layers", Some(json!([1])))])
            .expect("parses");
    assert!(s.attention.qkv_bias);
    assert_eq!(s.defaulted.get("qkv_bias").map(String::as_str), Some("true"));
    assert_eq!(s.layers[1].ffn, FfnKind::Dense { intermediate: 512 });
    // Tensors as Qwen2-MoE checkpoints name them.
    let names: Vec<String> = palladium_model::weights::tensor_layout(&s)
        .unwrap()
        .into_iter()
        .filter(|t| t.name.starts_with("model.layers.0.mlp.shared"))
        .map(|t| format!("{} {:?}", t.name, t.shape))
        .collect();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.shared_expert.gate_proj.weight [256, 256]",
            "model.layers.0.mlp.shared_expert.up_proj.weight [256, 256]",
            "model.layers.0.mlp.shared_expert.down_proj.weight [256, 256]",
            "model.layers.0.mlp.shared_expert_gate.weight [1, 256]",
        ]
    );
}

/// GLM-4.5: `DeepSeek`-V3's routing as data, ungated shared experts, a dense first layer,
/// partial rotary; the `Glm4MoeConfig` defaults where fields are absent.
#[test]
fn tiny_glm4_moe() {
    use palladium_model::spec::{ExpertGroups, GroupScore, RouterPrecision, RouterScoring};
    let s = spec("tiny-glm4-moe.json");
    assert_eq!(s.family, Family::Glm4Moe);
    assert_eq!(s.attention.rope.rotary_dim, 32);
    assert_eq!((s.attention.qkv_bias, s.attention.o_bias), (true, false));
    assert_eq!(s.attention.qk_norm, QkNorm::PerHeadRms { weight_len: 64 });
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 512 });
    let m = moe(&s, 1);
    assert_eq!((m.num_experts, m.top_k, m.intermediate), (8, 2, 128));
    let r = m.routing;
    assert_eq!(r.scoring, RouterScoring::Sigmoid);
    assert!(r.correction_bias);
    assert_eq!(
        r.groups,
        Some(ExpertGroups { groups: 2, chosen_groups: 1, score: GroupScore::TopTwoSum })
    );
    assert_eq!((r.scaling, r.precision), (2.5, RouterPrecision::F32));
    let shared = m.shared.expect("GLM-4.5's MoE layers have shared experts");
    assert_eq!((shared.intermediate, shared.sigmoid_gate), (128, false));
    // Absent fields take Glm4MoeConfig's defaults, recorded.
    let s = edited(
        "tiny-glm4-moe.json",
        &[
            ("partial_rotary_factor", None),
            ("n_group", None),
            ("topk_group", None),
            ("routed_scaling_factor", None),
            ("first_k_dense_replace", None),
        ],
    )
    .expect("parses");
    assert_eq!(s.attention.rope.rotary_dim, 32);
    assert_eq!(moe(&s, 1).routing.groups, None);
    assert_eq!(moe(&s, 1).routing.scaling, 1.0);
    for field in ["partial_rotary_factor", "n_group", "routed_scaling_factor"] {
        assert!(s.defaulted.contains_key(field), "{field}");
    }
    let names: Vec<String> = palladium_model::weights::tensor_layout(&s)
        .unwrap()
        .into_iter()
        .filter(|t| t.name.starts_with("model.layers.1.mlp.") && !t.name.contains(".experts."))
        .map(|t| format!("{} {:?}", t.name, t.shape))
        .collect();
    assert_eq!(
        names,
        [
            "model.layers.1.mlp.gate.weight [8, 256]",
            "model.layers.1.mlp.gate.e_score_correction_bias [8]",
            "model.layers.1.mlp.shared_experts.gate_proj.weight [128, 256]",
            "model.layers.1.mlp.shared_experts.up_proj.weight [128, 256]",
            "model.layers.1.mlp.shared_experts.down_proj.weight [256, 128]",
        ]
    );
}

/// `OLMoE`: q/k norms over the whole projections (k's `kv_heads * head_dim` long), `clip_qkv`,
/// biases on every projection with `attention_bias`, raw top-k weights by default.
#[test]
fn tiny_olmoe() {
    let s = spec("tiny-olmoe.json");
    assert_eq!(s.family, Family::Olmoe);
    assert_eq!(s.attention.qk_norm, QkNorm::WholeRms { q_len: 256, k_len: 128 });
    assert_eq!(s.attention.clip_qkv, None);
    assert_eq!(moe(&s, 0).routing.top_k_weights, TopKWeights::Raw);
    assert_eq!(moe(&s, 0).intermediate, 128);
    let s = edited(
        "tiny-olmoe.json",
        &[("clip_qkv", Some(json!(8.0))), ("attention_bias", Some(json!(true)))],
    )
    .expect("parses");
    assert_eq!(s.attention.clip_qkv, Some(8.0));
    assert_eq!((s.attention.qkv_bias, s.attention.o_bias), (true, true));
    let norms: Vec<(String, Vec<usize>)> = palladium_model::weights::tensor_layout(&s)
        .unwrap()
        .into_iter()
        .filter(|t| t.name.starts_with("model.layers.0.self_attn.") && t.name.contains("_norm"))
        .map(|t| (t.name, t.shape))
        .collect();
    assert_eq!(
        norms,
        [
            ("model.layers.0.self_attn.q_norm.weight".to_string(), vec![256]),
            ("model.layers.0.self_attn.k_norm.weight".to_string(), vec![128]),
        ]
    );
}

/// GLM-4.5-Air as shipped. Public figures (model card): 106B total, 12B active parameters;
/// 46 layers (the MTP layer, `num_nextn_predict_layers: 1`, is not part of the forward pass
/// and not counted here), the first one dense, 128 routed experts top-8 and one shared.
#[test]
fn glm_4_5_air() {
    use palladium_model::spec::RouterScoring;
    let s = spec("glm-4.5-air.json");
    assert_eq!(s.family, Family::Glm4Moe);
    assert_eq!(s.layers.len(), 46);
    assert_eq!(
        (s.attention.num_heads, s.attention.num_kv_heads, s.attention.head_dim),
        (96, 8, 128)
    );
    assert_eq!(s.attention.rope.rotary_dim, 64);
    assert_eq!((s.attention.qkv_bias, s.attention.o_bias), (true, false));
    assert_eq!(s.attention.qk_norm, QkNorm::None);
    assert_eq!(s.layers[0].ffn, FfnKind::Dense { intermediate: 10944 });
    for l in &s.layers[1..] {
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (128, 8, 1408));
        assert_eq!(m.routing.scoring, RouterScoring::Sigmoid);
        assert!(m.routing.correction_bias && m.routing.groups.is_none());
        assert_eq!(m.shared.map(|s| s.intermediate), Some(1408));
    }
    assert!(s.defaulted.is_empty(), "{:?}", s.defaulted);
    let p = s.params();
    assert!(close(p.total(), 106e9, 0.02), "total {}", p.total());
    // The card's 12B active counts neither the embedding nor `lm_head` (12.18B here; 13.42B
    // with both).
    let active = p.active_without_embedding() - p.lm_head;
    assert!(close(active, 12e9, 0.02), "active {active}");
}

/// GLM-4.5 (355B) as shipped: 92 decoder layers (the first 3 dense MLPs of 12288, then 160
/// routed experts top-8 of 1536 + 1 shared, `routed_scaling_factor` 2.5; its MTP layer 92
/// outside the forward pass), hidden 5120, 96 heads / 8 KV heads of 128 with half rotated,
/// attention biases, per-head q/k norms: the card's 355B total and 32B active parameters.
#[test]
fn glm_4_5() {
    let s = spec("glm-4.5.json");
    assert_eq!(s.family, Family::Glm4Moe);
    assert_eq!(s.layers.len(), 92);
    assert_eq!(s.attention.rope.rotary_dim, 64);
    assert_eq!(s.attention.qk_norm, QkNorm::PerHeadRms { weight_len: 128 });
    for l in &s.layers[..3] {
        assert_eq!(l.ffn, FfnKind::Dense { intermediate: 12288 });
    }
    for l in &s.layers[3..] {
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (160, 8, 1536));
        assert_eq!((m.routing.scaling, m.routing.groups), (2.5, None));
        assert_eq!(m.shared.map(|s| s.intermediate), Some(1536));
    }
    assert!(s.defaulted.is_empty(), "{:?}", s.defaulted);
    let p = s.params();
    assert!(close(p.total(), 355e9, 0.02), "total {}", p.total());
    let active = p.active_without_embedding() - p.lm_head;
    assert!(close(active, 32e9, 0.03), "active {active}");
}

/// Qwen1.5-MoE-A2.7B as shipped: every layer MoE (60 experts top-4, raw top-k weights) with
/// the sigmoid-gated shared expert of 5632 (4 experts' width), q/k/v biases by `qkv_bias`'s
/// default. Its card: 14.3B parameters in total, 2.7B activated.
#[test]
fn qwen1_5_moe_a2_7b() {
    let s = spec("qwen1.5-moe-a2.7b.json");
    assert_eq!(s.family, Family::Qwen2Moe);
    assert_eq!(s.layers.len(), 24);
    assert_eq!((s.attention.qkv_bias, s.attention.o_bias), (true, false));
    assert_eq!(s.defaulted.get("qkv_bias").map(String::as_str), Some("true"));
    for l in &s.layers {
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (60, 4, 1408));
        assert_eq!(m.routing.top_k_weights, TopKWeights::Raw);
        let shared = m.shared.expect("every Qwen2-MoE MoE layer has a shared expert");
        assert_eq!((shared.intermediate, shared.sigmoid_gate), (5632, true));
    }
    let p = s.params();
    assert!(close(p.total(), 14.3e9, 0.02), "total {}", p.total());
    // The card's 2.7B counts the embedding and `lm_head` (2.69B here; 2.38B without the
    // embedding).
    assert!(close(p.active(), 2.7e9, 0.02), "active {}", p.active());
}

/// gpt-oss-120b and gpt-oss-20b as shipped: every layer MoE (top-4, a softmax over the
/// chosen logits), sliding (window 128) and full attention alternating, sinks and biases,
/// YaRN not truncated, MXFP4 experts. Their card: 116.83B / 20.91B parameters in total,
/// 5.13B / 3.61B active per token.
#[test]
fn gpt_oss() {
    use palladium_model::spec::{Activation, AttentionKind, RopeScaling};
    for (file, layers, experts, total, active) in [
        ("gpt-oss-120b.json", 36, 128, 116.83e9, 5.13e9),
        ("gpt-oss-20b.json", 24, 32, 20.91e9, 3.61e9),
    ] {
        let s = spec(file);
        assert_eq!(s.family, Family::GptOss);
        assert_eq!(s.layers.len(), layers);
        let a = &s.attention;
        assert_eq!((a.num_heads, a.num_kv_heads, a.head_dim), (64, 8, 64));
        assert!(a.sinks && a.qkv_bias && a.o_bias);
        assert!(matches!(
            a.rope.scaling,
            RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                truncate: false,
                ..
            }
        ));
        assert_eq!(s.mlp.activation, Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
        for l in &s.layers {
            let want = if l.index % 2 == 0 {
                AttentionKind::Sliding { window: 128 }
            } else {
                AttentionKind::Full
            };
            assert_eq!(l.attention, want, "layer {}", l.index);
            let m = moe(&s, l.index);
            assert_eq!((m.num_experts, m.top_k, m.intermediate), (experts, 4, 2880));
            assert_eq!(m.routing.top_k_weights, TopKWeights::Renormalized);
            assert!(m.routing.router_bias);
        }
        assert!(s.defaulted.is_empty(), "{file}: {:?}", s.defaulted);
        let p = s.params();
        assert!(close(p.total(), total, 0.005), "{file}: total {}", p.total());
        // The card's active count leaves the embedding out.
        let active_count = p.active_without_embedding();
        assert!(close(active_count, active, 0.01), "{file}: active {active_count}");
    }
}

/// Llama 4 Scout and Maverick as shipped (`model_type: "llama4"`, the text model in
/// `text_config`, tensors under `language_model.`): Scout every layer MoE (16 experts) with
/// Llama 3 RoPE scaling and the L2 q/k norm, `attn_temperature_tuning` given as 4; Maverick
/// MoE on odd layers (128 experts, dense MLPs of 16384 between), no scaling, no q/k norm.
/// Both: every fourth layer `NoPE` with full attention, the others chunked (8192). Their cards:
/// 109B / 400B total parameters (the vision model included), 17B active.
#[test]
fn llama_4() {
    use palladium_model::spec::{AttentionKind, ExpertWeighting, Positions, RopeScaling};
    for (file, experts, moe_every, total) in [
        ("llama-4-scout-17b-16e.json", 16, 1, 109e9),
        ("llama-4-maverick-17b-128e.json", 128, 2, 400e9),
    ] {
        let s = spec(file);
        assert_eq!(s.family, Family::Llama4);
        assert_eq!(s.checkpoint_prefix, "language_model.");
        assert_eq!(s.layers.len(), 48);
        let scout = experts == 16;
        assert_eq!(s.attention.qk_norm == QkNorm::L2AfterRope, scout);
        assert_eq!(matches!(s.attention.rope.scaling, RopeScaling::Llama3(_)), scout);
        for l in &s.layers {
            let nope = (l.index + 1) % 4 == 0;
            assert_eq!(!l.positions.is_rope(), nope, "layer {}", l.index);
            if let Positions::NoPe { temperature } = l.positions {
                assert!(
                    temperature.is_some_and(|t| t.floor_scale == 8192.0 && t.attn_scale == 0.1)
                );
            }
            let span =
                if nope { AttentionKind::Full } else { AttentionKind::Chunked { chunk: 8192 } };
            assert_eq!(l.attention, span, "layer {}", l.index);
            if (l.index + 1) % moe_every == 0 {
                let m = moe(&s, l.index);
                assert_eq!((m.num_experts, m.top_k, m.intermediate), (experts, 1, 8192));
                assert_eq!(m.routing.weighting, ExpertWeighting::Input);
                assert_eq!(m.shared.map(|s| s.intermediate), Some(8192));
            } else {
                assert_eq!(l.ffn, FfnKind::Dense { intermediate: 16384 });
            }
        }
        let p = s.params();
        // The vision model (about 1B of the card's total) is not read.
        assert!(close(p.total(), total, 0.03), "{file}: total {}", p.total());
        // The card's 17B active counts the embedding and lm_head (1.03B each).
        assert!(close(p.active(), 17e9, 0.03), "{file}: active {}", p.active());
    }
}

/// Phi-3.5-MoE-instruct as shipped (`PhiMoEForCausalLM`, the remote-code class name): 32
/// layers of 16 experts top-2 by the sparsemixer (`router_jitter_noise` 0.01), `LayerNorms`
/// with bias, q/k/v/o and `lm_head` biases, `LongRoPE` over 4096 original positions (its
/// mscales 1.2432), the window equal to the 131072 positions (full attention). Its card: 42B
/// total parameters, 6.6B active.
#[test]
fn phi_3_5_moe() {
    use palladium_model::spec::{AttentionKind, NormKind, RopeScaling};
    let s = spec("phi-3.5-moe-instruct.json");
    assert_eq!(s.family, Family::Phimoe);
    assert_eq!(s.norm.kind, NormKind::Layer { bias: true });
    assert!(s.lm_head_bias && s.attention.qkv_bias && s.attention.o_bias);
    match &s.attention.rope.scaling {
        RopeScaling::LongRope(l) => {
            assert_eq!(l.original_max_position_embeddings, 4096);
            assert_eq!((l.short_factor.len(), l.long_factor.len()), (64, 64));
            assert_eq!((l.short_mscale, l.long_mscale), (1.243163121016122, 1.243163121016122));
        }
        other => panic!("{other:?}"),
    }
    for l in &s.layers {
        assert_eq!(l.attention, AttentionKind::Full);
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (16, 2, 6400));
        assert_eq!(m.routing.sparse_mixer.map(|m| m.jitter_eps), Some(0.01));
    }
    let p = s.params();
    assert_eq!(p.total(), 41_873_153_344);
    assert_eq!(p.active(), 6_640_999_744);
    assert!(close(p.total(), 42e9, 0.01) && close(p.active(), 6.6e9, 0.01));
}

/// Hunyuan-A13B-Instruct as shipped (`hunyuan_v1_moe`, the per-layer lists of its hub file):
/// 32 layers of 64 experts top-8 of intermediate 3072 plus the shared MLP, per-head q/k
/// norms after RoPE, RoPE's base raised by `alpha` 1000. Its card: 80B total, 13B active.
#[test]
fn hunyuan_a13b() {
    use palladium_model::spec::RouterPrecision;
    let s = spec("hunyuan-a13b-instruct.json");
    assert_eq!(s.family, Family::HunyuanMoe);
    assert_eq!(s.attention.qk_norm, QkNorm::PerHeadRmsAfterRope { weight_len: 128 });
    assert_eq!(s.attention.rope.scaling, RopeScaling::NtkAlpha { alpha: 1000.0 });
    for l in &s.layers {
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (64, 8, 3072));
        assert_eq!(m.shared.map(|s| (s.intermediate, s.sigmoid_gate)), Some((3072, false)));
        assert_eq!(m.routing.precision, RouterPrecision::F32Logits);
        assert_eq!(m.routing.top_k_weights, TopKWeights::Renormalized);
    }
    // `alpha` raises the base to 10000 * 1000^(128/126): the slowest frequency far slower.
    let (inv, factor) = s.attention.rope.scaling.inv_freq(1e4, 128, 0);
    let base = 1e4 * 1000f64.powf(128.0 / 126.0);
    assert_eq!(factor, 1.0);
    assert!(((inv[63] as f64) - base.powf(-126.0 / 128.0)).abs() < 1e-12);
    let p = s.params();
    eprintln!("hunyuan-a13b: {} parameters, {} active", p.total(), p.active());
    assert!(close(p.total(), 80e9, 0.02), "total {}", p.total());
    assert!(close(p.active(), 13e9, 0.03), "active {}", p.active());
}

/// Hunyuan's per-layer lists must describe the model transformers builds: one shared MLP and
/// experts of `intermediate_size`, one entry per layer; `use_cla` and a `"dynamic"` RoPE
/// without `alpha` are refused by name.
#[test]
fn hunyuan_refusals_name_the_field() {
    for (key, value, field) in [
        ("moe_intermediate_size", json!([128, 64, 128]), "moe_intermediate_size[1]"),
        ("num_shared_expert", json!(2), "num_shared_expert[0]"),
        ("moe_topk", json!([2, 2]), "moe_topk"),
        ("moe_topk", json!([2, 9, 2]), "moe_topk[1]"),
        ("use_cla", json!(true), "use_cla"),
        ("use_qk_norm", json!(false), "use_qk_norm"),
        ("rope_scaling", json!({"type": "dynamic", "factor": 2.0}), "rope_scaling.alpha"),
        ("rope_scaling", json!({"type": "linear", "factor": 2.0}), "rope_scaling"),
        ("head_dim", serde_json::Value::Null, "head_dim"),
    ] {
        let err = edited("tiny-hunyuan-moe.json", &[(key, Some(value.clone()))])
            .expect_err(&format!("{key}: {value}"))
            .to_string();
        assert!(err.contains(field), "{key}: {value}: {err}");
    }
}

/// DBRX-instruct as shipped (`dbrx`, its own config layout): 40 layers of 16 experts top-4
/// (intermediate 10752), `d_model` 6144, 48 heads / 8 KV heads of 128, `clip_qkv` 8, RoPE base
/// 500000, `LayerNorms` without bias. Its card: 132B total, 36B active.
#[test]
fn dbrx_instruct() {
    use palladium_model::spec::NormKind;
    let s = spec("dbrx-instruct.json");
    assert_eq!(s.family, Family::Dbrx);
    assert_eq!((s.hidden_size, s.vocab_size, s.max_position_embeddings), (6144, 100352, 32768));
    assert_eq!(
        (s.attention.num_heads, s.attention.num_kv_heads, s.attention.head_dim),
        (48, 8, 128)
    );
    assert_eq!((s.attention.clip_qkv, s.attention.rope.theta), (Some(8.0), 500000.0));
    assert_eq!(s.norm.kind, NormKind::Layer { bias: false });
    assert_eq!(s.lm_head, LmHead::Untied);
    assert_eq!(s.layers.len(), 40);
    for l in &s.layers {
        let m = moe(&s, l.index);
        assert_eq!((m.num_experts, m.top_k, m.intermediate), (16, 4, 10752));
        assert_eq!(m.routing.top_k_weights, TopKWeights::Renormalized);
    }
    assert_eq!(
        s.defaulted.get("ffn_config.moe_normalize_expert_weights").map(String::as_str),
        Some("1")
    );
    let p = s.params();
    eprintln!("dbrx-instruct: {} parameters, {} active", p.total(), p.active());
    assert!(close(p.total(), 132e9, 0.01), "total {}", p.total());
    assert!(close(p.active(), 36e9, 0.02), "active {}", p.active());
}

/// DBRX's sub-configs refuse what transformers refuses (an unknown key, a tied head) and what
/// is not implemented (another activation, a p-norm other than 1), naming the field.
#[test]
fn dbrx_refusals_name_the_field() {
    let sub = |key: &str, extra: serde_json::Value| {
        let mut v = fixture_json("tiny-dbrx.json");
        let obj = v[key].as_object_mut().expect("sub-config");
        for (k, x) in extra.as_object().expect("object") {
            obj.insert(k.clone(), x.clone());
        }
        v
    };
    for (config, field) in [
        (sub("attn_config", json!({"qk_ln": true})), "attn_config.qk_ln"),
        (
            sub("ffn_config", json!({"moe_normalize_expert_weights": 2.0})),
            "ffn_config.moe_normalize_expert_weights",
        ),
        (sub("ffn_config", json!({"ffn_act_fn": {"name": "gelu"}})), "ffn_config.ffn_act_fn.name"),
        (sub("ffn_config", json!({"moe_top_k": 9})), "ffn_config.moe_top_k"),
        (sub("attn_config", json!({"kv_n_heads": 3})), "attn_config.kv_n_heads"),
    ] {
        let err = ModelSpec::from_json(&config).expect_err(field).to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let err = edited("tiny-dbrx.json", &[("tie_word_embeddings", Some(json!(true)))])
        .expect_err("tied")
        .to_string();
    assert!(err.contains("tie_word_embeddings"), "{err}");
    // `null` leaves the top-k weights raw.
    let raw =
        ModelSpec::from_json(&sub("ffn_config", json!({"moe_normalize_expert_weights": null})))
            .unwrap();
    assert_eq!(moe(&raw, 0).routing.top_k_weights, TopKWeights::Raw);
}
