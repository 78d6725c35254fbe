//! Property tests that last: mutated configs through `ModelSpec` parsing and the cost model,
//! mutated safetensors headers and truncated files through checkpoint loading. Nothing may
//! panic; an error names the field or the tensor it is about.
//!
//! `cargo test -p palladium-model --test fuzz` runs a modest number of cases; run longer with
//! `PROPTEST_CASES=100000 cargo test --release -p palladium-model --test fuzz`.

mod common;
mod config_fuzz;

use std::path::Path;

use config_fuzz::{config, mutate, mutations};
use palladium_model::ModelSpec;
use palladium_model::weights::{SaveDtype, Weights, WeightsError};
use proptest::prelude::*;
use serde_json::{Value, json};

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_configs_parse_or_name_a_field(
        fixture in prop::sample::select(&["tiny-qwen3-moe.json", "tiny-mixtral.json", "qwen3-30b-a3b.json", "tiny-qwen3-moe-tf5.json"][..]),
        edits in mutations(),
        batch in 0u64..64,
        context in prop_oneof![0u64..10_000, Just(u64::MAX), Just(1u64 << 52)],
    ) {
        let v = mutate(&common::fixture_json(fixture), &edits);
        match ModelSpec::from_json(&v) {
            Err(e) => {
                let field = e.field();
                prop_assert!(field.is_some(), "{e}");
                prop_assert!(e.to_string().contains(&format!("\"{}\"", field.unwrap())), "{e}");
            }
            Ok(spec) => {
                // The cost model of anything that parses is total (saturating, never wrapping).
                let p = spec.params();
                prop_assert!(p.total() >= p.active_without_embedding());
                let t = spec.decode_traffic(batch, context, 2);
                prop_assert!(t.total() >= 0.0);
                let _ = spec.report();
            }
        }
    }
}

/// Every size at the parser's cap (2^24; 2^16 layers) at once: the cost model and the
/// report saturate, never wrap or panic.
#[test]
fn every_size_at_its_cap_at_once() {
    let mut v = common::fixture_json("tiny-qwen3-moe.json");
    v["num_hidden_layers"] = json!(1u64 << 16);
    for k in [
        "hidden_size",
        "vocab_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "intermediate_size",
    ] {
        v[k] = json!(1u64 << 24);
    }
    let spec = ModelSpec::from_json(&v).unwrap();
    let t = spec.decode_traffic(u64::MAX, u64::MAX, u64::MAX);
    assert!(t.total().is_finite() && t.total() > 0.0);
    assert!(spec.report().contains("KV cache"));
}

/// A small model, so that every case reads a whole checkpoint quickly.
fn small_spec() -> ModelSpec {
    let mut v = common::fixture_json("tiny-qwen3-moe.json");
    for (k, x) in [
        ("hidden_size", 128),
        ("num_hidden_layers", 1),
        ("vocab_size", 32),
        ("num_experts", 2),
        ("num_experts_per_tok", 1),
        ("moe_intermediate_size", 16),
        ("num_attention_heads", 2),
        ("num_key_value_heads", 1),
        ("head_dim", 16),
    ] {
        v[k] = json!(x);
    }
    ModelSpec::from_json(&v).unwrap()
}

/// The header of a safetensors file: length, JSON, and where the data starts.
fn split(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).unwrap(), &bytes[8 + n..])
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

/// What a mutation does to one header entry.
#[derive(Debug, Clone)]
enum Edit {
    Dtype(Value),
    Shape(Value),
    Offsets(Value),
    Remove(&'static str),
    Rename(String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let number = prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        (0u64..5000).prop_map(Value::from),
        Just(json!("8")),
        Just(json!(null))
    ];
    prop_oneof![
        prop::sample::select(
            &["BF16", "F16", "F32", "F64", "I32", "U8", "BOOL", "F8_E4M3", "Q4", ""][..]
        )
        .prop_map(|d| Edit::Dtype(json!(d))),
        prop::collection::vec(number.clone(), 0..4).prop_map(|v| Edit::Shape(Value::Array(v))),
        prop::collection::vec(number, 0..4).prop_map(|v| Edit::Offsets(Value::Array(v))),
        prop::sample::select(&["dtype", "shape", "data_offsets"][..]).prop_map(Edit::Remove),
        "[a-z._0-9]{0,12}".prop_map(Edit::Rename),
    ]
}

/// The error must name the tensor when it is about one, and the file always.
fn check_error(e: &WeightsError) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    prop_assert!(msg.contains("m.safetensors"), "{msg}");
    if let Some(t) = e.tensor() {
        prop_assert!(msg.contains(t), "{msg}");
    }
    if matches!(
        e,
        WeightsError::Header { .. }
            | WeightsError::Shape { .. }
            | WeightsError::Dtype { .. }
            | WeightsError::NonFinite { .. }
    ) {
        prop_assert!(e.tensor().is_some(), "{msg}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn mutated_safetensors_headers_load_or_name_the_tensor(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..4),
        dtype in prop::sample::select(&[SaveDtype::BFloat16, SaveDtype::Float32][..]),
    ) {
        let spec = small_spec();
        let bytes = Weights::random(&spec, 1).unwrap().to_safetensors_bytes(dtype).unwrap();
        let (mut header, data) = split(&bytes);
        let names: Vec<String> = header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
        let name = which.get(&names).clone();
        for e in edits {
            let map = header.as_object_mut().unwrap();
            if let Edit::Rename(n) = e {
                if let Some(v) = map.remove(&name) {
                    map.insert(n, v);
                }
                continue;
            }
            let Some(entry) = map.get_mut(&name).and_then(Value::as_object_mut) else { continue };
            match e {
                Edit::Dtype(v) => { entry.insert("dtype".into(), v); }
                Edit::Shape(v) => { entry.insert("shape".into(), v); }
                Edit::Offsets(v) => { entry.insert("data_offsets".into(), v); }
                Edit::Remove(k) => { entry.remove(k); }
                Edit::Rename(_) => unreachable!("handled above"),
            }
        }
        let mutated = join(&header, data);
        match Weights::from_safetensors(&spec, &[(Path::new("m.safetensors"), &mutated)]) {
            Ok(w) => prop_assert_eq!(w.len(), palladium_model::weights::tensor_layout(&spec).unwrap().len()),
            Err(e) => check_error(&e)?,
        }
    }

    #[test]
    fn truncated_and_corrupted_files_never_panic(
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        dtype in prop::sample::select(&[SaveDtype::BFloat16, SaveDtype::Float32][..]),
    ) {
        let spec = small_spec();
        let mut bytes = Weights::random(&spec, 2).unwrap().to_safetensors_bytes(dtype).unwrap();
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= b;
        }
        let len = cut.index(bytes.len() + 1);
        match Weights::from_safetensors(&spec, &[(Path::new("m.safetensors"), &bytes[..len])]) {
            Ok(w) => prop_assert!(w.iter().all(|(_, t)| t.data.iter().all(|x| x.is_finite()))),
            Err(e) => check_error(&e)?,
        }
    }
}
