//! Config mutations shared by the fuzz tests of the model crate (parsing, cost model) and of
//! the fusion crate (planning): `#[path]`-included from `fusion/tests/fuzz.rs`.

#![allow(dead_code)]

use proptest::prelude::*;
use serde_json::{Value, json};

/// `PROPTEST_CASES`, or `default`.
pub fn config(default: u32) -> ProptestConfig {
    ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default),
    )
}

/// Every field any supported config reads (and some it must refuse).
pub const KEYS: &[&str] = &[
    "model_type",
    "architectures",
    "hidden_act",
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "attention_bias",
    "partial_rotary_factor",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
    "norm_topk_prob",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "first_k_dense_replace",
    "n_shared_experts",
    "shared_expert_intermediate_size",
];

/// A JSON value of any type, with the sizes that break arithmetic.
pub fn junk() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(Value::from),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1u64 << 24)),
        Just(json!((1u64 << 24) + 1)),
        Just(json!(1u64 << 40)),
        (0u64..100_000).prop_map(Value::from),
        any::<f64>()
            .prop_map(|x| serde_json::Number::from_f64(x).map_or(json!(0.5), Value::Number)),
        Just(json!(1e308)),
        Just(json!("x")),
        Just(json!("bfloat16")),
        Just(json!("full_attention")),
        Just(json!([])),
        Just(json!([0, 1, 2])),
        Just(json!(["sliding_attention", "full_attention"])),
        Just(json!({})),
        Just(json!({"rope_type": "default", "rope_theta": 1e6})),
        Just(json!({"rope_type": "yarn", "factor": 4})),
    ]
}

/// Deletions or replacements of up to 5 fields.
pub fn mutations() -> impl Strategy<Value = Vec<(usize, Option<Value>)>> {
    prop::collection::vec((0..KEYS.len(), prop::option::weighted(0.8, junk())), 1..6)
}

pub fn mutate(base: &Value, edits: &[(usize, Option<Value>)]) -> Value {
    let mut v = base.clone();
    let map = v.as_object_mut().expect("object");
    for (k, value) in edits {
        match value {
            Some(x) => map.insert(KEYS[*k].to_string(), x.clone()),
            None => map.remove(KEYS[*k]),
        };
    }
    v
}
