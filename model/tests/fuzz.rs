//! Property tests that last: mutated configs through `ModelSpec` parsing and the cost model,
//! mutated safetensors headers (repeated names included) and truncated files through
//! checkpoint loading, FP8 `quantization_config`s, mutated FP8 scale entries
//! (`weight_scale_inv` shapes, dtypes and values) and shard indexes that disagree with
//! their shards. Nothing may panic; an error names the field or the tensor it is about;
//! what loads is finite and what the index says.
//!
//! `cargo test -p palladium-model --test tests fuzz::` runs a modest number of cases; run longer
//! with `PROPTEST_CASES=100000 cargo test --release -p palladium-model --test tests fuzz::`.

use crate::common;
use crate::config_fuzz;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use config_fuzz::{config, mutate, mutations};
use palladium_model::ModelSpec;
use palladium_model::quant::{QuantError, QuantizedWeights};
use palladium_model::weights::{SaveDtype, Weights, WeightsError};
use proptest::prelude::*;
use serde_json::{Value, json};

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_configs_parse_or_name_a_field(
        fixture in prop::sample::select(&["tiny-qwen3-moe.json", "tiny-mixtral.json", "qwen3-30b-a3b.json", "tiny-qwen3-moe-tf5.json", "tiny-deepseek-v3.json", "tiny-deepseek-v2.json"][..]),
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
    ModelSpec::from_json(&small_config()).unwrap()
}

/// [`small_spec`]'s config.
fn small_config() -> Value {
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
    v
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
    /// The entry listed a second time (the header's text holds the name twice).
    Repeat,
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
        Just(Edit::Repeat),
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
        let mut repeated = None;
        for e in edits {
            let map = header.as_object_mut().unwrap();
            if let Edit::Rename(n) = e {
                if let Some(v) = map.remove(&name) {
                    map.insert(n, v);
                }
                continue;
            }
            if let Edit::Repeat = e {
                repeated = map.get(&name).map(|v| (name.clone(), v.clone()));
                continue;
            }
            let Some(entry) = map.get_mut(&name).and_then(Value::as_object_mut) else { continue };
            match e {
                Edit::Dtype(v) => { entry.insert("dtype".into(), v); }
                Edit::Shape(v) => { entry.insert("shape".into(), v); }
                Edit::Offsets(v) => { entry.insert("data_offsets".into(), v); }
                Edit::Remove(k) => { entry.remove(k); }
                Edit::Rename(_) | Edit::Repeat => unreachable!("handled above"),
            }
        }
        let mutated = match &repeated {
            // The entry as it was at the repeat, before the (sorted) others.
            Some((n, v)) => {
                let rest = header.to_string();
                let text = format!("{{{}:{v},{}", Value::from(n.as_str()), &rest[1..]);
                let mut out = (text.len() as u64).to_le_bytes().to_vec();
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(data);
                out
            }
            None => join(&header, data),
        };
        let still_there = repeated.as_ref().filter(|(n, _)| header.get(n).is_some());
        match Weights::from_safetensors(&spec, &[(Path::new("m.safetensors"), &mutated)]) {
            Ok(w) => {
                prop_assert!(still_there.is_none(), "a repeated name loaded");
                prop_assert_eq!(w.len(), palladium_model::weights::tensor_layout(&spec).unwrap().len());
            }
            Err(e) => {
                check_error(&e)?;
                if let Some((n, _)) = still_there {
                    prop_assert!(e.to_string().contains("duplicate") && e.tensor() == Some(n.as_str()), "{e}");
                }
            }
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

/// [`small_spec`] as an FP8 checkpoint's config (routers and `lm_head` kept in bf16).
fn small_fp8_spec() -> ModelSpec {
    let mut v = small_config();
    v["quantization_config"] =
        json!({"quant_method": "fp8", "modules_to_not_convert": ["lm_head", "mlp.gate"]});
    ModelSpec::from_json(&v).unwrap()
}

/// What a mutation does to one `weight_scale_inv` entry.
#[derive(Debug, Clone)]
enum ScaleEdit {
    Dtype(safetensors::Dtype),
    Shape(Vec<usize>),
    /// Scale `index` (modulo their number) set to `value`.
    Value(usize, f32),
    Remove,
}

fn scale_edit() -> impl Strategy<Value = ScaleEdit> {
    use safetensors::Dtype;
    let value = prop_oneof![
        Just(0.0f32),
        Just(-1.0),
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(3e38),
        Just(f32::MAX),
        Just(1e35),
        Just(1e-45),
        (-40i32..40).prop_map(|e| 2f32.powi(e)),
    ];
    prop_oneof![
        prop::sample::select(
            &[Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F64, Dtype::I32, Dtype::F8_E4M3][..]
        )
        .prop_map(ScaleEdit::Dtype),
        prop::collection::vec(0usize..4, 0..4).prop_map(ScaleEdit::Shape),
        (0usize..64, value).prop_map(|(i, v)| ScaleEdit::Value(i, v)),
        Just(ScaleEdit::Remove),
    ]
}

proptest! {
    #![proptest_config(config(128))]

    /// A `weight_scale_inv` entry with another dtype, shape or values (zero, negative,
    /// non-finite, huge enough to overflow the dequantized weights, tiny), or none: the
    /// checkpoint loads with every dequantized weight finite, or the error names the file
    /// and the tensor.
    #[test]
    fn mutated_fp8_scales_load_finite_or_name_the_tensor(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(scale_edit(), 1..4),
    ) {
        use safetensors::Dtype;
        let spec = small_fp8_spec();
        let (_, mut entries) = common::fp8_entries(&spec, 3);
        let scales: Vec<String> = entries.keys().filter(|k| k.ends_with("_scale_inv")).cloned().collect();
        let name = which.get(&scales).clone();
        for e in edits {
            let Some(entry) = entries.get_mut(&name) else { continue };
            let width = |d: Dtype| match d { Dtype::F64 => 8, Dtype::F32 | Dtype::I32 => 4, Dtype::F8_E4M3 => 1, _ => 2 };
            match e {
                ScaleEdit::Dtype(d) => {
                    // Keep the bytes whole for the new dtype: its number of elements.
                    let n = entry.1.iter().product::<usize>();
                    entry.0 = d;
                    entry.2.resize(n * width(d), 0);
                }
                ScaleEdit::Shape(s) => {
                    entry.2.resize(s.iter().product::<usize>() * width(entry.0), 0);
                    entry.1 = s;
                }
                ScaleEdit::Value(i, v) => {
                    let w = width(entry.0);
                    let n = entry.2.len() / w;
                    if n == 0 { continue; }
                    let at = (i % n) * w;
                    let bytes = match entry.0 {
                        Dtype::F32 => v.to_le_bytes().to_vec(),
                        Dtype::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                        Dtype::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                        Dtype::F64 => f64::from(v).to_le_bytes().to_vec(),
                        Dtype::I32 => (v as i32).to_le_bytes().to_vec(),
                        _ => vec![palladium_model::quant::convert::f32_to_e4m3fn_saturating(v)],
                    };
                    entry.2[at..at + w].copy_from_slice(&bytes);
                }
                ScaleEdit::Remove => {
                    entries.remove(&name);
                }
            }
        }
        let views: BTreeMap<String, safetensors::tensor::TensorView<'_>> = entries
            .iter()
            .map(|(n, (d, s, b))| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        match QuantizedWeights::from_fp8_safetensors(&spec, &[(Path::new("m.safetensors"), &bytes)]) {
            Ok(q) => {
                for (n, t) in q.dequantize().iter() {
                    prop_assert!(t.data.iter().all(|x| x.is_finite()), "{n}: a dequantized weight is not finite");
                }
            }
            Err(QuantError::Weights(e)) => check_error(&e)?,
            Err(e @ QuantError::Overflow { .. }) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("m.safetensors") && msg.contains(name.trim_end_matches("_scale_inv")), "{msg}");
            }
            Err(e) => prop_assert!(false, "an error that names no file: {e}"),
        }
    }

    /// An FP8 `quantization_config` of present, absent, `null` and wrong fields: it parses
    /// only where transformers' FineGrainedFP8Config would (no `null` block size or
    /// activation scheme), and an error names its field.
    #[test]
    fn fp8_quantization_configs_parse_as_transformers_or_name_a_field(
        block in prop::sample::select(vec![None, Some(json!(null)), Some(json!([128, 128])), Some(json!([64, 128])), Some(json!(128))]),
        scheme in prop::sample::select(vec![None, Some(json!(null)), Some(json!("dynamic")), Some(json!("DYNAMIC")), Some(json!("static"))]),
        skip in prop::sample::select(vec![None, Some(json!(null)), Some(json!(["lm_head"])), Some(json!([""]))]),
    ) {
        let mut q = json!({"quant_method": "fp8"});
        for (k, v) in [("weight_block_size", &block), ("activation_scheme", &scheme), ("modules_to_not_convert", &skip)] {
            if let Some(v) = v {
                q[k] = v.clone();
            }
        }
        let mut v = common::fixture_json("tiny-qwen3-moe.json");
        v["quantization_config"] = q.clone();
        match ModelSpec::from_json(&v) {
            Ok(_) => {
                prop_assert!(block != Some(json!(null)) && scheme != Some(json!(null)), "{q} parsed");
            }
            Err(e) => {
                let field = e.field();
                prop_assert!(field.is_some_and(|f| f.starts_with("quantization_config.")), "{e}");
                prop_assert!(e.to_string().contains(&format!("\"{}\"", field.unwrap())), "{e}");
            }
        }
    }
}

/// One shard's tensors: name, bytes, shape.
type Shard = Vec<(String, Vec<u8>, Vec<usize>)>;

/// A checkpoint folder of [`small_spec`]'s weights in shards `0..2` (tensor `i` in shard
/// `i % 2`); returns it and the true `weight_map`.
fn two_shards(dir: &Path, w: &Weights) -> BTreeMap<String, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut shards: [Shard; 2] = Default::default();
    let mut map = BTreeMap::new();
    for (i, (n, t)) in w.iter().enumerate() {
        let bytes = t.data.iter().flat_map(|&x| x.to_le_bytes()).collect();
        map.insert(n.to_string(), shard_file(i % 2));
        shards[i % 2].push((n.to_string(), bytes, t.shape.clone()));
    }
    for (i, shard) in shards.iter().enumerate() {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = shard
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                        .unwrap(),
                )
            })
            .collect();
        std::fs::write(dir.join(shard_file(i)), safetensors::serialize(views, None).unwrap())
            .unwrap();
    }
    map
}

/// Shard `i`'s file (shard 2 is never written).
fn shard_file(i: usize) -> String {
    format!("model-{:05}-of-00002.safetensors", i + 1)
}

/// What a mutation does to a `weight_map`.
#[derive(Debug, Clone)]
enum MapEdit {
    /// Tensor `index` (of the true map) mapped to shard `shard` (0, 1, or 2: no such file).
    Move(prop::sample::Index, usize),
    Remove(prop::sample::Index),
    /// A name no shard holds, mapped to shard `shard`.
    Add(String, usize),
}

fn map_edit() -> impl Strategy<Value = MapEdit> {
    prop_oneof![
        (any::<prop::sample::Index>(), 0usize..3).prop_map(|(i, s)| MapEdit::Move(i, s)),
        any::<prop::sample::Index>().prop_map(MapEdit::Remove),
        ("[a-z._0-9]{1,12}", 0usize..3).prop_map(|(n, s)| MapEdit::Add(n, s)),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    /// A `model.safetensors.index.json` whose `weight_map` moves, drops or adds tensors:
    /// the checkpoint loads exactly when the map still tells the truth, else the error
    /// names the index and the tensor.
    #[test]
    fn shard_indexes_load_only_when_they_tell_the_truth(
        edits in prop::collection::vec(map_edit(), 0..4),
        case in any::<u32>(),
    ) {
        let spec = small_spec();
        let w = Weights::random(&spec, 4).unwrap();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-index-{}-{case}", std::process::id()));
        let truth = two_shards(&dir, &w);
        let names: Vec<String> = truth.keys().cloned().collect();
        let mut map = truth.clone();
        for e in edits {
            match e {
                MapEdit::Move(i, s) => { map.insert(i.get(&names).clone(), shard_file(s)); }
                MapEdit::Remove(i) => { map.remove(i.get(&names)); }
                MapEdit::Add(n, s) => { if !truth.contains_key(&n) { map.insert(n, shard_file(s)); } }
            }
        }
        let index = dir.join("model.safetensors.index.json");
        std::fs::write(&index, json!({"weight_map": map}).to_string()).unwrap();
        let result = Weights::load(&spec, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        match result {
            Ok(loaded) => {
                prop_assert_eq!(&map, &truth, "a disagreeing index loaded");
                prop_assert_eq!(loaded, w);
            }
            Err(e) => {
                prop_assert!(map != truth, "the truth failed: {e}");
                let msg = e.to_string();
                prop_assert!(matches!(e, WeightsError::Index { .. }), "{msg}");
                prop_assert!(msg.contains("model.safetensors.index.json"), "{msg}");
                prop_assert!(e.tensor().is_some_and(|t| msg.contains(t)), "{msg}");
            }
        }
    }
}
