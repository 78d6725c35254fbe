//! Every rejection names its field, and the message says what is wrong. No input panics.

use crate::common;

use common::edited;
use palladium_model::{ConfigError, ModelSpec};
use serde_json::{Value, json};

type Edits = Vec<(&'static str, Option<Value>)>;

fn set(key: &'static str, v: Value) -> (&'static str, Option<Value>) {
    (key, Some(v))
}

fn del(key: &'static str) -> (&'static str, Option<Value>) {
    (key, None)
}

/// (fixture, edits, field named, text the message must contain).
fn cases() -> Vec<(&'static str, Edits, &'static str, &'static str)> {
    const Q: &str = "tiny-qwen3-moe.json";
    const M: &str = "tiny-mixtral.json";
    const D3: &str = "tiny-deepseek-v3.json";
    const D2: &str = "tiny-deepseek-v2.json";
    const Q2: &str = "tiny-qwen2-moe.json";
    const G: &str = "tiny-glm4-moe.json";
    const O: &str = "tiny-olmoe.json";
    const P: &str = "tiny-phimoe.json";
    let long_rope = |short: Value, mscale: Option<f64>| {
        let mut r = json!({"type": "longrope", "short_factor": short, "long_factor": vec![1.0; 32],
            "long_mscale": 1.2, "original_max_position_embeddings": 8});
        if let Some(m) = mscale {
            r["short_mscale"] = json!(m);
        }
        set("rope_scaling", r)
    };
    let sliding = || vec![set("use_sliding_window", json!(true)), set("sliding_window", json!(64))];
    let yarn = |extra: Value| {
        let mut r = json!({"type": "yarn", "factor": 4, "original_max_position_embeddings": 1024});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        set("rope_scaling", r)
    };
    vec![
        (
            P,
            vec![set("sliding_window", json!(64))],
            "sliding_window",
            "at least max_position_embeddings",
        ),
        (P, vec![set("num_experts_per_tok", json!(3))], "num_experts_per_tok", "sparsemixer"),
        (
            P,
            vec![long_rope(json!([1.0, 1.0, 1.0]), Some(1.1))],
            "rope_scaling.short_factor",
            "needs 32",
        ),
        (P, vec![long_rope(json!(vec![1.0; 32]), None)], "rope_scaling.short_mscale", "missing"),
        (M, vec![set("lm_head_bias", json!(true))], "lm_head_bias", "not part of the mixtral"),
        (
            D3,
            vec![set("topk_method", json!("greedy"))],
            "topk_method",
            "unsupported value \"greedy\" (supported: \"noaux_tc\" or absent)",
        ),
        (
            D3,
            vec![set("scoring_func", json!("softmax"))],
            "scoring_func",
            "unsupported value \"softmax\"",
        ),
        (
            D2,
            vec![del("first_k_dense_replace"), set("topk_method", json!("noaux_tc"))],
            "topk_method",
            "unsupported value \"noaux_tc\" (supported: \"greedy\", \"group_limited_greedy\" or absent)",
        ),
        (
            D2,
            vec![del("first_k_dense_replace"), set("norm_topk_prob", json!(true))],
            "norm_topk_prob",
            "the two disagree",
        ),
        (
            D2,
            vec![del("first_k_dense_replace"), set("topk_method", json!("group_limited_greedy"))],
            "n_group",
            "missing required field \"n_group\"",
        ),
        (
            D2,
            vec![
                del("first_k_dense_replace"),
                set("topk_method", json!("group_limited_greedy")),
                set("n_group", json!(3)),
                set("topk_group", json!(1)),
            ],
            "n_group",
            "must divide n_routed_experts (8) into groups of at least 1 experts",
        ),
        (
            D3,
            vec![set("num_key_value_heads", json!(2))],
            "num_key_value_heads",
            "must equal num_attention_heads (4)",
        ),
        // DeepseekV3Config's default of 128 key/value heads is not the fixture's 4 heads.
        (D3, vec![del("num_key_value_heads")], "num_key_value_heads", "invalid value 128"),
        (D3, vec![set("head_dim", json!(32))], "head_dim", "must equal qk_rope_head_dim (16)"),
        (D3, vec![set("attention_bias", json!(true))], "attention_bias", "not implemented"),
        (D3, vec![set("qk_rope_head_dim", json!(15))], "qk_rope_head_dim", "must be even"),
        (D3, vec![set("kv_lora_rank", json!(0))], "kv_lora_rank", "at least 1"),
        (D3, vec![set("q_lora_rank", json!("96"))], "q_lora_rank", "non-negative integer"),
        (D3, vec![set("rope_interleave", json!(1))], "rope_interleave", "true or false"),
        (D2, vec![set("mlp_bias", json!(true))], "mlp_bias", "not implemented"),
        (D3, vec![set("moe_layer_freq", json!(2))], "moe_layer_freq", "the two disagree"),
        (D3, vec![yarn(json!({"foo": 1}))], "rope_scaling.foo", "the yarn rope_scaling keys"),
        (D3, vec![yarn(json!({"factor": 0.5}))], "rope_scaling.factor", ">= 1"),
        (D3, vec![yarn(json!({"mscale": -1}))], "rope_scaling.mscale", ">= 0"),
        (
            D3,
            vec![set("rope_scaling", json!({"type": "yarn"}))],
            "rope_scaling.factor",
            "missing required field",
        ),
        (
            D3,
            vec![set("rope_scaling", json!({"rope_type": "linear", "factor": 2.0}))],
            "rope_scaling.rope_type",
            "unsupported value \"linear\"",
        ),
        (
            D3,
            vec![set("rope_scaling", json!({"type": "default", "mscale_all_dim": 1.0}))],
            "rope_scaling.mscale_all_dim",
            "only yarn takes parameters",
        ),
        // YaRN is read for the DeepSeek families only (the megakernel's RoPE is the default).
        (
            Q,
            vec![yarn(json!({}))],
            "rope_scaling.type",
            "unsupported value \"yarn\" (supported: default)",
        ),
        (
            D3,
            vec![set("architectures", json!(["DeepseekV2ForCausalLM"]))],
            "architectures",
            "DeepseekV3ForCausalLM",
        ),
        (
            Q,
            vec![del("model_type")],
            "model_type",
            "missing required field \"model_type\" (supported: qwen3_moe, mixtral, deepseek_v3, kimi_k2, deepseek_v2, qwen2_moe, glm4_moe, olmoe, gpt_oss, llama4_text, llama4, granitemoe, ernie4_5_moe, phimoe, hunyuan_v1_moe, dbrx)",
        ),
        (
            Q,
            vec![set("model_type", json!("llama"))],
            "model_type",
            "unsupported value \"llama\" (supported: qwen3_moe, mixtral, deepseek_v3, kimi_k2, deepseek_v2, qwen2_moe, glm4_moe, olmoe, gpt_oss, llama4_text, llama4, granitemoe, ernie4_5_moe, phimoe, hunyuan_v1_moe, dbrx)",
        ),
        (Q, vec![set("model_type", json!(3))], "model_type", "expected a string, got 3"),
        (
            Q,
            vec![set("architectures", json!(["MixtralForCausalLM"]))],
            "architectures",
            "Qwen3MoeForCausalLM",
        ),
        (
            Q,
            vec![set("hidden_act", json!("gelu"))],
            "hidden_act",
            "config.json: field \"hidden_act\": unsupported value \"gelu\" (supported: silu)",
        ),
        (Q, vec![del("hidden_size")], "hidden_size", "missing required field \"hidden_size\""),
        (Q, vec![set("hidden_size", json!(null))], "hidden_size", "missing required field"),
        (
            Q,
            vec![set("hidden_size", json!("256"))],
            "hidden_size",
            "expected a non-negative integer, got \"256\"",
        ),
        (
            Q,
            vec![set("hidden_size", json!(256.5))],
            "hidden_size",
            "expected a non-negative integer, got 256.5",
        ),
        (Q, vec![set("hidden_size", json!(1u64 << 25))], "hidden_size", "larger than 16777216"),
        (Q, vec![set("num_experts", json!(u64::MAX))], "num_experts", "larger than"),
        (
            Q,
            vec![set("num_hidden_layers", json!(1u64 << 17))],
            "num_hidden_layers",
            "larger than 65536, the most Palladium accepts for a layer count",
        ),
        (Q, vec![set("num_hidden_layers", json!(0))], "num_hidden_layers", "must be at least 1"),
        (Q, vec![set("num_hidden_layers", json!(-4))], "num_hidden_layers", "non-negative integer"),
        (Q, vec![del("vocab_size")], "vocab_size", "missing"),
        (Q, vec![del("max_position_embeddings")], "max_position_embeddings", "missing"),
        (Q, vec![del("num_attention_heads")], "num_attention_heads", "missing"),
        (Q, vec![del("num_key_value_heads")], "num_key_value_heads", "missing"),
        (
            Q,
            vec![set("num_key_value_heads", json!(3))],
            "num_key_value_heads",
            "num_attention_heads (4) must be a multiple of it",
        ),
        (
            Q,
            vec![set("num_key_value_heads", json!(8))],
            "num_key_value_heads",
            "must be a multiple",
        ),
        (
            Q,
            vec![
                del("head_dim"),
                set("num_attention_heads", json!(3)),
                set("num_key_value_heads", json!(1)),
            ],
            "num_attention_heads",
            "hidden_size (256) must be divisible",
        ),
        (Q, vec![set("head_dim", json!(0))], "head_dim", "at least 1"),
        (Q, vec![set("head_dim", json!(63))], "head_dim", "even head_dim"),
        (Q, vec![set("rms_norm_eps", json!(0.0))], "rms_norm_eps", "finite number > 0"),
        (Q, vec![set("rms_norm_eps", json!("1e-6"))], "rms_norm_eps", "expected a number"),
        (
            Q,
            vec![del("rope_theta")],
            "rope_theta",
            "missing required field \"rope_theta\" (or \"rope_parameters.rope_theta\")",
        ),
        (Q, vec![set("rope_theta", json!(-1.0))], "rope_theta", "finite number > 0"),
        (
            Q,
            vec![set("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0}))],
            "rope_scaling.rope_type",
            "unsupported value \"yarn\" (supported: default)",
        ),
        (
            Q,
            vec![set("rope_scaling", json!({"type": "linear", "factor": 2.0}))],
            "rope_scaling.type",
            "unsupported value \"linear\"",
        ),
        (Q, vec![set("rope_scaling", json!("yarn"))], "rope_scaling", "expected an object or null"),
        (
            Q,
            vec![set("rope_parameters", json!({"rope_theta": 1e6, "rope_type": "llama3"}))],
            "rope_parameters.rope_type",
            "unsupported value \"llama3\"",
        ),
        (
            Q,
            vec![set("rope_parameters", json!({"rope_theta": 1e4, "rope_type": "default"}))],
            "rope_theta",
            "fields \"rope_theta\" and \"rope_parameters.rope_theta\" disagree",
        ),
        (
            Q,
            vec![del("rope_theta"), set("rope_parameters", json!({"rope_type": "default"}))],
            "rope_theta",
            "missing",
        ),
        (
            Q,
            vec![set("rope_parameters", json!({"full_attention": {"rope_theta": 1e6}}))],
            "rope_parameters",
            "per-layer-type",
        ),
        (
            Q,
            vec![set("rope_parameters", json!({"rope_theta": 1e6, "partial_rotary_factor": 0.5}))],
            "rope_parameters.partial_rotary_factor",
            "unsupported value 0.5",
        ),
        (
            Q,
            vec![set("partial_rotary_factor", json!(0.5))],
            "partial_rotary_factor",
            "supported: 1.0",
        ),
        (
            Q,
            vec![set("torch_dtype", json!("float8_e4m3fn"))],
            "torch_dtype",
            "supported: bfloat16, float16, float32",
        ),
        (Q, vec![set("dtype", json!("float32"))], "torch_dtype", "disagree"),
        (
            Q,
            vec![set("tie_word_embeddings", json!("no"))],
            "tie_word_embeddings",
            "expected true or false",
        ),
        (Q, vec![set("attention_bias", json!(1))], "attention_bias", "expected true or false"),
        (Q, vec![del("num_experts")], "num_experts", "(or \"num_local_experts\")"),
        (
            Q,
            vec![set("num_local_experts", json!(16))],
            "num_experts",
            "disagree: num_experts = 8, num_local_experts = 16",
        ),
        (Q, vec![del("num_experts_per_tok")], "num_experts_per_tok", "missing"),
        (
            Q,
            vec![set("num_experts_per_tok", json!(9))],
            "num_experts_per_tok",
            "more than the 8 experts",
        ),
        (Q, vec![set("num_experts_per_tok", json!(0))], "num_experts_per_tok", "at least 1"),
        (Q, vec![del("moe_intermediate_size")], "moe_intermediate_size", "missing"),
        (
            Q,
            vec![set("mlp_only_layers", json!([1])), del("intermediate_size")],
            "intermediate_size",
            "missing",
        ),
        (
            Q,
            vec![set("mlp_only_layers", json!([4]))],
            "mlp_only_layers[0]",
            "not a layer index (num_hidden_layers is 4)",
        ),
        (
            Q,
            vec![set("mlp_only_layers", json!(["1"]))],
            "mlp_only_layers[0]",
            "expected a non-negative integer",
        ),
        (Q, vec![set("mlp_only_layers", json!(1))], "mlp_only_layers", "expected an array"),
        (Q, vec![set("decoder_sparse_step", json!(0))], "decoder_sparse_step", "at least 1"),
        (Q, vec![set("norm_topk_prob", json!("yes"))], "norm_topk_prob", "expected true or false"),
        (
            Q,
            vec![set("use_sliding_window", json!(true))],
            "sliding_window",
            "missing required field \"sliding_window\" (use_sliding_window is true)",
        ),
        (
            Q,
            [sliding(), vec![set("sliding_window", json!(0))]].concat(),
            "sliding_window",
            "at least 1",
        ),
        (
            Q,
            [sliding(), vec![del("max_window_layers")]].concat(),
            "max_window_layers",
            "no \"layer_types\"",
        ),
        (
            Q,
            [sliding(), vec![set("layer_types", json!(["full_attention"]))]].concat(),
            "layer_types",
            "one entry per layer (4)",
        ),
        (
            Q,
            [
                sliding(),
                vec![set(
                    "layer_types",
                    json!([
                        "full_attention",
                        "chunked_attention",
                        "full_attention",
                        "full_attention"
                    ]),
                )],
            ]
            .concat(),
            "layer_types[1]",
            "unsupported value \"chunked_attention\"",
        ),
        (
            Q,
            vec![set(
                "layer_types",
                json!(["full_attention", "full_attention", "sliding_attention", "full_attention"]),
            )],
            "layer_types[2]",
            "use_sliding_window is false",
        ),
        (
            Q,
            vec![set("n_shared_experts", json!(1))],
            "n_shared_experts",
            "not part of the qwen3_moe architecture",
        ),
        (
            Q,
            vec![set("first_k_dense_replace", json!(1))],
            "first_k_dense_replace",
            "not part of the qwen3_moe architecture",
        ),
        (
            Q,
            vec![set("shared_expert_intermediate_size", json!(512))],
            "shared_expert_intermediate_size",
            "absent",
        ),
        (
            Q2,
            vec![set("use_sliding_window", json!(true))],
            "use_sliding_window",
            "Qwen2-MoE's sliding window is not implemented",
        ),
        (
            Q2,
            vec![set("shared_expert_intermediate_size", json!(0))],
            "shared_expert_intermediate_size",
            "at least 1",
        ),
        (
            Q2,
            vec![set("head_dim", json!(32))],
            "head_dim",
            "head_dim is hidden_size (256) / num_attention_heads (4)",
        ),
        (
            Q2,
            vec![set("n_shared_experts", json!(1))],
            "n_shared_experts",
            "not part of the qwen2_moe architecture",
        ),
        (G, vec![set("topk_method", json!("greedy"))], "topk_method", "\"noaux_tc\" or absent"),
        (G, vec![set("scoring_func", json!("softmax"))], "scoring_func", "\"sigmoid\" or absent"),
        (G, vec![set("n_group", json!(3))], "n_group", "groups of at least 2 experts"),
        (G, vec![set("n_group", json!(8))], "n_group", "groups of at least 2 experts"),
        (G, vec![set("topk_group", json!(3))], "topk_group", "more than the 2 groups"),
        (G, vec![set("n_shared_experts", json!(0))], "n_shared_experts", "at least 1"),
        (
            G,
            vec![set("routed_scaling_factor", json!(0))],
            "routed_scaling_factor",
            "finite number > 0",
        ),
        (
            G,
            vec![set("partial_rotary_factor", json!(0.01))],
            "partial_rotary_factor",
            "even number",
        ),
        (
            G,
            vec![set("shared_expert_intermediate_size", json!(64))],
            "shared_expert_intermediate_size",
            "not part of the glm4_moe architecture",
        ),
        (O, vec![set("clip_qkv", json!(-1))], "clip_qkv", "finite number > 0"),
        (O, vec![set("head_dim", json!(32))], "head_dim", "OLMoE's head_dim"),
        (
            O,
            vec![set("moe_intermediate_size", json!(64))],
            "moe_intermediate_size",
            "not part of the olmoe architecture",
        ),
        (
            M,
            vec![set("attention_bias", json!(true))],
            "attention_bias",
            "Mixtral's attention projections have no bias",
        ),
        (M, vec![set("norm_topk_prob", json!(false))], "norm_topk_prob", "always renormalises"),
        (M, vec![del("num_local_experts")], "num_experts", "missing"),
        (M, vec![set("num_local_experts", json!(0))], "num_local_experts", "at least 1"),
        (M, vec![del("intermediate_size")], "intermediate_size", "missing"),
        (M, vec![set("sliding_window", json!(0))], "sliding_window", "at least 1"),
        (
            M,
            vec![set("mlp_only_layers", json!([0]))],
            "mlp_only_layers",
            "not part of the mixtral architecture",
        ),
        (
            M,
            vec![set("use_sliding_window", json!(true))],
            "use_sliding_window",
            "not part of the mixtral architecture",
        ),
        (
            M,
            vec![set(
                "layer_types",
                json!(["full_attention", "sliding_attention", "full_attention", "full_attention"]),
            )],
            "layer_types[1]",
            "every layer or in none",
        ),
    ]
}

#[test]
fn every_error_names_its_field() {
    let mut failures = Vec::new();
    for (fixture, edits, field, text) in cases() {
        let described = format!("{fixture} with {edits:?}");
        match edited(fixture, &edits) {
            Ok(_) => {
                failures.push(format!("{described}: accepted, expected an error about {field:?}"))
            }
            Err(e) => {
                let msg = e.to_string();
                if e.field() != Some(field) {
                    failures.push(format!(
                        "{described}: names {:?}, expected {field:?}: {msg}",
                        e.field()
                    ));
                }
                if !msg.contains(&format!("\"{field}\"")) {
                    failures.push(format!(
                        "{described}: message does not quote the field {field:?}: {msg}"
                    ));
                }
                if !msg.contains(text) {
                    failures.push(format!("{described}: message lacks {text:?}: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn exact_message_for_unsupported_activation() {
    let err = edited("tiny-qwen3-moe.json", &[set("hidden_act", json!("gelu"))]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"config.json: field "hidden_act": unsupported value "gelu" (supported: silu)"#
    );
}

#[test]
fn malformed_json_and_files() {
    assert!(matches!(ModelSpec::from_json_str("{"), Err(ConfigError::Json { .. })));
    assert!(matches!(ModelSpec::from_json_str("[1, 2]"), Err(ConfigError::Json { .. })));
    assert!(matches!(ModelSpec::from_json_str(""), Err(ConfigError::Json { .. })));
    assert!(matches!(
        ModelSpec::from_path("/nonexistent/config.json"),
        Err(ConfigError::Io { .. })
    ));
    let e = ModelSpec::from_json_str(" \n").unwrap_err();
    assert!(e.to_string().contains("the file is empty"), "{e}");
}

/// A file's errors start with the user's path, not `config.json`.
#[test]
fn errors_in_a_file_name_the_file() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("config-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut v = common::fixture_json("tiny-qwen3-moe.json");
    v["hidden_act"] = json!("gelu");
    let path = dir.join("my-model.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let e = ModelSpec::from_path(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            r#"{}: field "hidden_act": unsupported value "gelu" (supported: silu)"#,
            path.display()
        )
    );
    assert_eq!(e.field(), Some("hidden_act"));
    std::fs::write(&path, "").unwrap();
    let e = ModelSpec::from_path(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: the file is empty (expected a Hugging Face config.json object)",
            path.display()
        )
    );
    assert!(matches!(e.inner(), ConfigError::Json { .. }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Any field of a real config replaced by a value of any other JSON type, or removed, gives
/// `Ok` or an error naming a field; never a panic.
#[test]
fn no_panics_on_mangled_fields() {
    let base = common::fixture_json("tiny-qwen3-moe.json");
    let keys: Vec<String> = base.as_object().expect("object").keys().cloned().collect();
    let junk = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1.5),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!({}),
    ];
    for key in &keys {
        for value in junk.iter().map(Some).chain([None]) {
            let mut v = base.clone();
            let map = v.as_object_mut().expect("object");
            match value {
                Some(value) => map.insert(key.clone(), value.clone()),
                None => map.remove(key),
            };
            let result = std::panic::catch_unwind(|| ModelSpec::from_json(&v));
            match result {
                Err(_) => panic!("panicked with {key} = {value:?}"),
                Ok(Err(e)) => assert!(e.field().is_some(), "{key} = {value:?}: {e}"),
                Ok(Ok(spec)) => {
                    // A spec that parses must be usable by the cost model without overflow panics.
                    let _ = std::panic::catch_unwind(|| spec.decode_traffic(8, 4096, 2))
                        .unwrap_or_else(|_| panic!("cost model panicked with {key} = {value:?}"));
                }
            }
        }
    }
}
