//! `palladium_model::quant` on its own: the round-trip error bounds of every format
//! (proptest), edge cases, which tensors each weights dtype converts, the FP8
//! `quantization_config` and its field-named errors, and the FP8 checkpoint loader's checks.
//! The bit-exact comparisons with `ml_dtypes` / XLA / torch are in `quant_oracle.rs`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Entries, edited};
use palladium_model::quant::{
    FP8_BLOCK, INT4_GROUP, QuantError, QuantFormat, QuantizedTensor, QuantizedWeights,
    StoredTensor, WeightsDtype,
};
use palladium_model::reference::{Precision, Reference};
use palladium_model::weights::{Tensor, Weights, WeightsError};
use palladium_model::{ModelSpec, Quantization};
use proptest::prelude::*;
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};

const INT8: QuantFormat = QuantFormat::Int8PerChannel;
const FP8: QuantFormat = QuantFormat::Fp8Block { block: FP8_BLOCK };
const INT4: QuantFormat = QuantFormat::Int4Group { group: INT4_GROUP };

/// A `[rows, cols]` weight of magnitudes spread over `2^-20 .. 2^8`, some rows all zero.
fn weight() -> impl Strategy<Value = Tensor> {
    (1usize..4, 1usize..300).prop_flat_map(|(rows, cols)| {
        let value = (-1.0f32..1.0, -20i32..8).prop_map(|(m, e)| m * 2f32.powi(e));
        (prop::collection::vec(value, rows * cols), prop::collection::vec(any::<bool>(), rows))
            .prop_map(move |(mut data, zero_rows)| {
                for (r, zero) in zero_rows.iter().enumerate() {
                    if *zero {
                        data[r * cols..(r + 1) * cols].fill(0.0);
                    }
                }
                Tensor { shape: vec![rows, cols], data }
            })
    })
}

/// Every element within `bound(code, scale)` of its dequantized value, scales never zero.
fn check_bound(
    w: &Tensor,
    format: QuantFormat,
    bound: impl Fn(f32, f32) -> f32,
) -> Result<(), TestCaseError> {
    let q = QuantizedTensor::quantize("w", w, format).unwrap();
    let deq = q.dequantize();
    let cols = w.shape[1];
    prop_assert_eq!(q.scales.shape.clone(), format.scales_shape([w.shape[0], cols]));
    prop_assert_eq!(q.data.len(), w.shape[0] * format.row_bytes(cols));
    for (i, (&x, &y)) in w.data.iter().zip(&deq.data).enumerate() {
        let scale = q.scale(i / cols, i % cols);
        prop_assert!(scale >= f32::MIN_POSITIVE, "scale {scale}");
        let limit = bound(x, scale);
        prop_assert!(
            (x - y).abs() <= limit,
            "element {i}: {x} -> {y}, scale {scale}, bound {limit}"
        );
        if x == 0.0 {
            prop_assert_eq!(y, 0.0);
        }
    }
    Ok(())
}

/// Half a step of the integer grid, plus the f32 rounding of `w / scale` and `code * scale`
/// (each within 2^-24 relative; codes are at most 127, so 2^-15 of a step covers both).
fn integer_bound(_w: f32, scale: f32) -> f32 {
    scale * (0.5 + 2f32.powi(-15))
}

/// Half the `float8_e4m3fn` spacing at `|w| / scale` (2^(e-3) in binade e, 2^-9 below 2^-6),
/// plus the f32 rounding of the division and the multiply.
fn fp8_bound(w: f32, scale: f32) -> f32 {
    let v = w.abs() / scale;
    let binade = if v < 2f32.powi(-6) { -6 } else { v.log2().floor() as i32 };
    scale * 2f32.powi(binade - 4) + w.abs() * 2f32.powi(-20)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn int8_round_trip_is_within_half_a_scale(w in weight()) {
        check_bound(&w, INT8, integer_bound)?;
    }

    #[test]
    fn int4_round_trip_is_within_half_a_scale(w in weight()) {
        check_bound(&w, INT4, integer_bound)?;
    }

    #[test]
    fn fp8_round_trip_is_within_half_an_e4m3fn_step(w in weight()) {
        check_bound(&w, FP8, fp8_bound)?;
    }
}

#[test]
fn partial_tiles_and_groups_take_the_ceiling() {
    let w = |rows: usize, cols: usize| Tensor {
        shape: vec![rows, cols],
        data: (0..rows * cols).map(|i| (i % 17) as f32 - 8.0).collect(),
    };
    let q = QuantizedTensor::quantize("w", &w(200, 300), FP8).unwrap();
    assert_eq!(q.scales.shape, [2, 3]);
    let q = QuantizedTensor::quantize("w", &w(3, 301), INT4).unwrap();
    assert_eq!((q.scales.shape.as_slice(), q.data.len()), (&[3, 3][..], 3 * 151));
    // The odd last element of each row sits alone in its row's last low nibble.
    let deq = q.dequantize();
    for r in 0..3 {
        assert_eq!(q.data[r * 151 + 150] >> 4, 0, "row {r}: padding nibble");
        assert!(
            (deq.data[r * 301 + 300] - w(3, 301).data[r * 301 + 300]).abs()
                <= q.scale(r, 300) / 2.0
        );
    }
    let q = QuantizedTensor::quantize("w", &w(5, 7), INT8).unwrap();
    assert_eq!(q.scales.shape, [5]);
}

#[test]
fn zero_and_tiny_groups_never_get_a_zero_scale() {
    let w = Tensor { shape: vec![2, 4], data: vec![0.0, 0.0, 0.0, 0.0, 1e-45, -1e-45, 0.0, 1e-45] };
    for format in [INT8, FP8, INT4] {
        let q = QuantizedTensor::quantize("w", &w, format).unwrap();
        assert!(
            q.scales.values.iter().all(|&s| s == f32::MIN_POSITIVE),
            "{format:?}: {:?}",
            q.scales.values
        );
        assert_eq!(q.dequantize().data[..4], [0.0; 4], "{format:?}");
    }
}

#[test]
fn non_finite_weights_are_refused_by_name_and_index() {
    let mut data = vec![0.5; 6];
    data[4] = f32::NAN;
    let w = Tensor { shape: vec![2, 3], data };
    for format in [INT8, FP8, INT4] {
        let err = QuantizedTensor::quantize("model.layers.3.self_attn.q_proj.weight", &w, format)
            .unwrap_err();
        assert!(matches!(&err, QuantError::NonFinite { index, .. } if index == &[1, 1]), "{err:?}");
        assert!(
            err.to_string().contains("\"model.layers.3.self_attn.q_proj.weight\"")
                && err.to_string().contains("[1, 1]"),
            "{err}"
        );
    }
    let err = QuantizedTensor::quantize(
        "model.norm.weight",
        &Tensor { shape: vec![4], data: vec![1.0; 4] },
        INT8,
    )
    .unwrap_err();
    assert!(matches!(err, QuantError::NotMatrix { .. }), "{err}");
}

fn spec(name: &str) -> ModelSpec {
    common::spec(name)
}

#[test]
fn each_weights_dtype_converts_the_tensors_issue_16_names() {
    let s = spec("tiny-qwen3-moe.json");
    let count = |d: WeightsDtype, f: QuantFormat| {
        d.format_of(&s).unwrap().values().filter(|&&x| x == f).count()
    };
    let (layers, experts) = (4, 8);
    assert!(WeightsDtype::Bf16.format_of(&s).unwrap().is_empty());
    // int8: q/k/v/o and the experts of every layer, and lm_head; never the router.
    let int8 = WeightsDtype::Int8.format_of(&s).unwrap();
    assert_eq!(int8.len(), layers * (4 + 3 * experts) + 1);
    assert!(
        int8.contains_key("lm_head.weight") && !int8.contains_key("model.layers.0.mlp.gate.weight")
    );
    // fp8: the same without lm_head (what Hugging Face's FP8 checkpoints convert).
    let fp8 = WeightsDtype::Fp8.format_of(&s).unwrap();
    assert_eq!(fp8.len(), layers * (4 + 3 * experts));
    assert!(
        !fp8.contains_key("lm_head.weight") && !fp8.contains_key("model.layers.2.mlp.gate.weight")
    );
    // int4: experts int4, attention and lm_head int8.
    assert_eq!(count(WeightsDtype::Int4, INT4), layers * 3 * experts);
    assert_eq!(count(WeightsDtype::Int4, INT8), layers * 4 + 1);
    let m = spec("tiny-mixtral.json");
    let fp8 = WeightsDtype::Fp8.format_of(&m).unwrap();
    assert!(fp8.keys().all(|n| !n.contains("block_sparse_moe.gate.") && n != "lm_head.weight"));
    assert!(fp8.contains_key("model.layers.0.block_sparse_moe.experts.0.w2.weight"));
}

#[test]
fn the_reference_runs_on_dequantized_weights() {
    let s = spec("tiny-qwen3-moe.json");
    let w = Weights::random(&s, 3).unwrap();
    let bf16 = Reference::new(&s, &w, Precision::F32).unwrap().generate(&[1, 2, 3], 2).unwrap();
    for dtype in [WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4] {
        let q = QuantizedWeights::quantize(&s, &w, dtype).unwrap();
        let deq = q.dequantize();
        let names: Vec<&str> = deq.iter().map(|(n, _)| n).collect();
        assert_eq!(names, w.iter().map(|(n, _)| n).collect::<Vec<_>>(), "same tensors, same order");
        for (name, stored) in q.iter() {
            if let StoredTensor::Plain(t) = stored {
                assert_eq!(Some(t), w.get(name), "{name} is kept as loaded");
            }
        }
        let got =
            Reference::new(&s, &deq, Precision::F32).unwrap().generate(&[1, 2, 3], 2).unwrap();
        let a = got.agreement(&bf16);
        assert!(a.max_abs.is_finite());
        // The quantization error against the unquantized model, reported, not bounded.
        eprintln!(
            "{}: max |logit - unquantized logit| {:.3e} ({:.3e} of max |logit|), ids {:?} vs {:?}",
            dtype.name(),
            a.max_abs,
            a.max_rel,
            got.generated_ids,
            bf16.generated_ids
        );
    }
}

fn with_quantization(config: Value) -> Result<ModelSpec, palladium_model::ConfigError> {
    edited("tiny-qwen3-moe.json", &[("quantization_config", Some(config))])
}

#[test]
fn fp8_quantization_config_is_read_with_transformers_defaults() {
    let s = with_quantization(json!({"quant_method": "fp8"})).unwrap();
    assert_eq!(
        s.quantization,
        Some(Quantization::Fp8Block {
            weight_block_size: [128, 128],
            modules_to_not_convert: vec!["lm_head".into()]
        })
    );
    assert!(s.defaulted.contains_key("quantization_config.modules_to_not_convert"));
    assert_eq!(WeightsDtype::of_checkpoint(&s), WeightsDtype::Fp8);
    // transformers converts every nn.Linear not named: with the default list, the router too.
    assert!(
        WeightsDtype::Fp8.format_of(&s).unwrap().contains_key("model.layers.0.mlp.gate.weight")
    );
    let s = with_quantization(
        json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "mlp.gate"]}),
    )
    .unwrap();
    assert!(
        !WeightsDtype::Fp8.format_of(&s).unwrap().contains_key("model.layers.0.mlp.gate.weight")
    );
    assert!(s.report().contains("quant_method \"fp8\""), "{}", s.report());
    assert_eq!(spec("tiny-qwen3-moe.json").quantization, None);
}

#[test]
fn unsupported_quantization_configs_name_their_field() {
    let cases: &[(Value, &str, &str)] = &[
        (json!({"quant_method": "awq", "bits": 4}), "quantization_config.bits", "absent"),
        (
            json!({"quant_method": "awq"}),
            "quantization_config.quant_method",
            "unsupported value \"awq\"",
        ),
        (json!({"weight_block_size": [128, 128]}), "quantization_config.quant_method", "missing"),
        (json!({"quant_method": "fp8", "fmt": "e5m2"}), "quantization_config.fmt", "\"e4m3\""),
        (
            json!({"quant_method": "fp8", "activation_scheme": "static"}),
            "quantization_config.activation_scheme",
            "\"dynamic\"",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [64, 128]}),
            "quantization_config.weight_block_size",
            "[128, 128]",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, -1]}),
            "quantization_config.weight_block_size[1]",
            "non-negative integer",
        ),
        (
            json!({"quant_method": "fp8", "modules_to_not_convert": ["lm_head", ""]}),
            "quantization_config.modules_to_not_convert[1]",
            "every module",
        ),
        (json!("fp8"), "quantization_config", "an object"),
        // transformers' FineGrainedFP8Config refuses None for these (TypeError, AttributeError).
        (
            json!({"quant_method": "fp8", "weight_block_size": null}),
            "quantization_config.weight_block_size",
            "unsupported value null",
        ),
        (
            json!({"quant_method": "fp8", "activation_scheme": null}),
            "quantization_config.activation_scheme",
            "unsupported value null",
        ),
    ];
    for (config, field, text) in cases {
        let err = with_quantization(config.clone()).unwrap_err();
        assert_eq!(err.field(), Some(*field), "{config}: {err}");
        assert!(err.to_string().contains(text), "{config}: {err}");
    }
}

/// The tiny Qwen3-MoE as an FP8 checkpoint (router and `lm_head` not converted).
fn fp8_spec() -> ModelSpec {
    with_quantization(
        json!({"quant_method": "fp8", "modules_to_not_convert": ["lm_head", "mlp.gate"]}),
    )
    .unwrap()
}

fn load(spec: &ModelSpec, entries: &Entries) -> Result<QuantizedWeights, QuantError> {
    let views: BTreeMap<String, TensorView<'_>> = entries
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    QuantizedWeights::from_fp8_safetensors(spec, &[(Path::new("ckpt.safetensors"), &bytes)])
}

#[test]
fn an_fp8_checkpoint_round_trips() {
    let spec = fp8_spec();
    let (q, entries) = common::fp8_entries(&spec, 5);
    assert_eq!(load(&spec, &entries).unwrap(), q);
}

#[test]
fn fp8_checkpoint_errors_name_the_tensor() {
    let spec = fp8_spec();
    let (_, good) = common::fp8_entries(&spec, 5);
    let q = "model.layers.1.self_attn.q_proj.weight";
    let q_scale = "model.layers.1.self_attn.q_proj.weight_scale_inv";
    let router = "model.layers.0.mlp.gate.weight";
    type Edit = Box<dyn Fn(&mut Entries)>;
    let cases: Vec<(Edit, &str, &str)> = vec![
        (
            Box::new(move |e| {
                e.remove(q_scale);
            }),
            q_scale,
            "missing tensor",
        ),
        (
            Box::new(move |e| {
                e.get_mut(q_scale).unwrap().1 = vec![2, 1];
                e.get_mut(q_scale).unwrap().2.truncate(8);
            }),
            q_scale,
            "expected [2, 2]",
        ),
        (
            Box::new(move |e| {
                let s = e.get_mut(q_scale).unwrap();
                s.0 = Dtype::F16;
                s.2.truncate(8);
            }),
            q_scale,
            "scales stored as F16",
        ),
        (
            Box::new(move |e| {
                let s = e.get_mut(q_scale).unwrap();
                s.2[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
            }),
            q_scale,
            "non-finite value inf at index [0, 0]",
        ),
        (
            Box::new(move |e| {
                let s = e.get_mut(q_scale).unwrap();
                s.2[4..8].copy_from_slice(&(-1f32).to_le_bytes());
            }),
            q_scale,
            "negative scale -1 at index [0, 1]",
        ),
        (
            Box::new(move |e| {
                let w = e.get_mut(q).unwrap();
                w.0 = Dtype::BF16;
                w.2.extend_from_within(..);
            }),
            q,
            "expected F8_E4M3",
        ),
        (
            Box::new(move |e| {
                e.get_mut(q).unwrap().2[256 + 3] = 0xFF;
            }),
            q,
            "index [1, 3]",
        ),
        (
            Box::new(move |e| {
                let r = e.get_mut(router).unwrap();
                r.0 = Dtype::F8_E4M3;
                r.2.truncate(r.2.len() / 4);
            }),
            router,
            "keeps it unquantized",
        ),
        (
            Box::new(move |e| {
                e.insert(format!("{router}_scale_inv"), (Dtype::F32, vec![1, 2], vec![0; 8]));
            }),
            "model.layers.0.mlp.gate.weight_scale_inv",
            "block scales for",
        ),
    ];
    for (edit, name, text) in cases {
        let mut entries = good.clone();
        edit(&mut entries);
        let err = load(&spec, &entries).unwrap_err();
        let QuantError::Weights(inner) = &err else { panic!("{err:?}") };
        assert_eq!(inner.tensor(), Some(name), "{err}");
        assert!(err.to_string().contains(text), "{name}: {err}");
        assert!(
            matches!(
                inner,
                WeightsError::Missing { .. }
                    | WeightsError::Shape { .. }
                    | WeightsError::Header { .. }
                    | WeightsError::NonFinite { .. }
            ),
            "{err:?}"
        );
    }
}

/// Finite codes under a finite scale so large that their product overflows (a
/// `weight_scale_inv` of 3e38): refused at load, naming the file, the tensor and the block,
/// before any step could turn them into infinite logits. A large scale whose block's codes
/// stay in range loads.
#[test]
fn fp8_scales_that_overflow_when_dequantized_are_refused_naming_the_block() {
    let spec = fp8_spec();
    let (_, good) = common::fp8_entries(&spec, 5);
    let q = "model.layers.1.self_attn.q_proj.weight";
    let q_scale = "model.layers.1.self_attn.q_proj.weight_scale_inv";
    for dtype in [Dtype::F32, Dtype::BF16] {
        let mut entries = good.clone();
        let s = entries.get_mut(q_scale).unwrap();
        // [2, 2] scales of the [256, 256] q_proj: block [1, 0] is rows 128..256, columns 0..128.
        let mut values: Vec<f32> =
            s.2.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        values[2] = 3e38;
        s.0 = dtype;
        s.2 = match dtype {
            Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            _ => values.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        };
        let err = load(&spec, &entries).unwrap_err();
        assert!(matches!(err, QuantError::Overflow { .. }), "{err:?}");
        let msg = err.to_string();
        for text in [q, "ckpt.safetensors", "rows 128..256, columns 0..128", "index [1, 0]"] {
            assert!(msg.contains(text), "{text}: {msg}");
        }
        if dtype == Dtype::F32 {
            assert!(msg.contains("(scale 3e38 at"), "{msg}");
        }
    }
    // 1e35 times codes of at most 448 stays finite: loads.
    let mut entries = good.clone();
    entries.get_mut(q_scale).unwrap().2[8..12].copy_from_slice(&1e35f32.to_le_bytes());
    let loaded = load(&spec, &entries).unwrap();
    assert!(loaded.dequantize().iter().all(|(_, t)| t.data.iter().all(|x| x.is_finite())));
}

/// Quantizing at load (`--weights-dtype`) converts MLA's projections as it converts q/k/v/o:
/// `q_a_proj`, `q_b_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, `o_proj` and the dense MLP,
/// never the low-rank norms; the tiny DeepSeek's sides (80, 96, 192 rows) take partial
/// blocks, and the reference runs on what dequantizes.
#[test]
fn mla_projections_quantize_like_the_attention_they_replace() {
    let s = spec("tiny-deepseek-v3.json");
    let fp8 = WeightsDtype::Fp8.format_of(&s).unwrap();
    assert_eq!(fp8.len(), 3 * (5 + 3), "{:?}", fp8.keys().collect::<Vec<_>>());
    assert!(fp8.contains_key("model.layers.2.self_attn.kv_a_proj_with_mqa.weight"));
    assert!(fp8.keys().all(|n| !n.contains("layernorm")));
    let w = Weights::random(&s, 9).unwrap();
    let q = QuantizedWeights::quantize(&s, &w, WeightsDtype::Fp8).unwrap();
    match q.get("model.layers.0.self_attn.kv_a_proj_with_mqa.weight") {
        Some(StoredTensor::Quantized(t)) => assert_eq!(t.scales.shape, [1, 2], "[80, 256]"),
        other => panic!("{other:?}"),
    }
    let g = Reference::new(&s, &q.dequantize(), Precision::F32)
        .unwrap()
        .generate(&[1, 2, 3], 2)
        .unwrap();
    assert!(g.steps.iter().all(|s| s.logits.iter().all(|x| x.is_finite())));
}
