//! `palladium_model::quant` against independent implementations: `quant_reference.py` (run
//! with the oracle venv's python) computes the conversions with `ml_dtypes`, the int4 packing
//! with XLA (`bitcast_convert_type`), fp8 block quantization with torch, and writes a tiny
//! block-scaled FP8 checkpoint with torch plus torch's dequantization of it. Everything is
//! compared bit for bit: both sides do the same IEEE f32 operations in the same order.
//!
//! Without torch/transformers in the venv these tests fail, naming the setup script.

use crate::hf_oracle;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hf_oracle::{repo_root, venv_python};
use palladium_model::ModelSpec;
use palladium_model::quant::convert::{e4m3fn_to_f32, f32_to_e4m3fn, f32_to_e4m3fn_saturating};
use palladium_model::quant::{
    FP8_BLOCK, INT4_GROUP, QuantFormat, QuantizedTensor, QuantizedWeights, ScaleDtype,
    StoredTensor, WeightsDtype,
};
use palladium_model::weights::{Tensor, Weights, WeightsError};
use safetensors::SafeTensors;

/// The script's output folder, shared by every test process (under `cargo nextest` each
/// test is one) and written once per content of the script and the fixtures it reads: it is
/// named by their hash, written under a temporary name and renamed into place, so a reader
/// sees it whole or not at all; another process that wrote it too drops its own copy.
fn oracle() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = repo_root().join("model/tests/quant_reference.py");
        let fixtures = repo_root().join("fixtures/models");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(format!("quant-oracle-{:016x}", content_hash(&script, &fixtures)));
        if dir.is_dir() {
            return dir;
        }
        let partial = tmp.join(format!("quant-oracle-partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        let out = Command::new(venv_python())
            .arg(&script)
            .arg("--fixtures")
            .arg(&fixtures)
            .arg("--out-dir")
            .arg(&partial)
            .output()
            .expect("run quant_reference.py");
        assert!(
            out.status.success(),
            "quant_reference.py failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&partial, &dir).is_err() {
            // Another process renamed its copy first.
            let _ = std::fs::remove_dir_all(&partial);
        }
        dir
    })
}

/// A hash of the script and of every fixture file (sorted by name): what the oracle's
/// output depends on besides the venv.
fn content_hash(script: &Path, fixtures: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures)
        .expect("fixtures/models")
        .map(|e| e.expect("a fixture").path())
        .collect();
    files.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in std::iter::once(script.to_path_buf()).chain(files) {
        file.file_name().hash(&mut hasher);
        std::fs::read(&file).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// All tensors of a safetensors file: name → (shape, raw bytes).
fn read(file: &str) -> std::collections::HashMap<String, (Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(oracle().join(file)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().into_iter().map(|(n, v)| (n, (v.shape().to_vec(), v.data().to_vec()))).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn tensor((shape, bytes): &(Vec<usize>, Vec<u8>)) -> Tensor {
    Tensor { shape: shape.clone(), data: f32s(bytes) }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn e4m3fn_conversions_match_ml_dtypes() {
    let t = read("conversions.safetensors");
    let decoded = f32s(&t["e4m3fn_decoded"].1);
    for (b, want) in decoded.iter().enumerate() {
        let got = e4m3fn_to_f32(b as u8);
        assert_eq!(got.to_bits(), want.to_bits(), "byte {b:#04x}: ours {got}, ml_dtypes {want}");
    }
    let sweep = f32s(&t["sweep"].1);
    let (plain, sat) = (&t["sweep_e4m3fn"].1, &t["sweep_e4m3fn_sat"].1);
    let mut mismatches = Vec::new();
    for (i, &x) in sweep.iter().enumerate() {
        let (a, b) = (f32_to_e4m3fn(x), f32_to_e4m3fn_saturating(x));
        if a != plain[i] || b != sat[i] {
            mismatches.push(format!(
                "{x:e} ({:#010x}): ours {a:#04x}/{b:#04x}, ml_dtypes {:#04x}/{:#04x}",
                x.to_bits(),
                plain[i],
                sat[i]
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} inputs differ:\n{}",
        mismatches.len(),
        sweep.len(),
        mismatches.join("\n")
    );
    eprintln!(
        "float8_e4m3fn: 256 bytes decoded and {} f32 inputs rounded exactly as ml_dtypes",
        sweep.len()
    );
}

/// Our quantization of `prefix_w` to `format` against the script's codes and scales.
fn check_quantized(prefix: &str, format: QuantFormat) {
    let t = read("conversions.safetensors");
    let w = tensor(&t[&format!("{prefix}_w")]);
    let q = QuantizedTensor::quantize(prefix, &w, format).unwrap();
    let (scale_shape, scale_bytes) = &t[&format!("{prefix}_scale")];
    assert_eq!(&q.scales.shape, scale_shape, "{prefix} scales shape");
    assert!(same_bits(&q.scales.values, &f32s(scale_bytes)), "{prefix} scales differ");
    let (code_shape, codes) = &t[&format!("{prefix}_q")];
    assert_eq!(code_shape, &[w.shape[0], format.row_bytes(w.shape[1])], "{prefix} packed shape");
    let differ = q.data.iter().zip(codes).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{prefix}: {differ} of {} code bytes differ", codes.len());
}

#[test]
fn int8_per_channel_matches_numpy() {
    check_quantized("int8", QuantFormat::Int8PerChannel);
}

#[test]
fn int4_groups_match_numpy_and_xla_packing() {
    check_quantized("int4", QuantFormat::Int4Group { group: INT4_GROUP });
}

#[test]
fn fp8_blocks_match_torch() {
    check_quantized("fp8", QuantFormat::Fp8Block { block: FP8_BLOCK });
}

fn checkpoint_spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(oracle().join(name).join("config.json")).unwrap()
}

/// Loads the torch-written checkpoint `name` and checks it against torch: every tensor
/// dequantizes to torch's values bit for bit, exactly the tensors torch converted are
/// quantized, and our quantization of torch's source weights gives torch's codes and scales.
/// Returns the checkpoint and how many of its tensors are quantized.
fn check_torch_checkpoint(name: &str) -> (QuantizedWeights, usize) {
    let spec = checkpoint_spec(name);
    let loaded = QuantizedWeights::load(&spec, oracle().join(name), None).unwrap();
    assert_eq!(loaded.dtype(), WeightsDtype::Fp8);
    let expected = read(&format!("{name}-dequantized.safetensors"));
    let source = read(&format!("{name}-source.safetensors"));
    let dequantized = loaded.dequantize();
    assert_eq!(dequantized.len(), expected.len());
    let (mut quantized, mut bf16_scales) = (0, 0);
    for (tensor_name, stored) in loaded.iter() {
        let want = tensor(&expected[tensor_name]);
        let got = dequantized.get(tensor_name).unwrap();
        assert_eq!(got.shape, want.shape, "{tensor_name}");
        assert!(
            same_bits(&got.data, &want.data),
            "{tensor_name}: dequantized values differ from torch's"
        );
        assert_eq!(
            matches!(stored, StoredTensor::Quantized(_)),
            source.contains_key(tensor_name),
            "{tensor_name}"
        );
        if let StoredTensor::Quantized(q) = stored {
            quantized += 1;
            bf16_scales += usize::from(q.scales.dtype == ScaleDtype::Bf16);
            let ours =
                QuantizedTensor::quantize(tensor_name, &tensor(&source[tensor_name]), q.format)
                    .unwrap();
            assert_eq!(ours.data, q.data, "{tensor_name}: codes differ from torch's");
            let torch_scales = f32s(&source[&format!("{tensor_name}_scale_inv")].1);
            assert!(
                same_bits(&ours.scales.values, &torch_scales),
                "{tensor_name}: scales differ from torch's"
            );
        }
    }
    assert!(bf16_scales > 0 && bf16_scales < quantized, "{name}: both scale dtypes are exercised");
    assert!(matches!(loaded.get("lm_head.weight"), Some(StoredTensor::Plain(_))));
    (loaded, quantized)
}

#[test]
fn torch_fp8_qwen3_checkpoint_loads_and_dequantizes_as_torch_does() {
    let (loaded, quantized) = check_torch_checkpoint("qwen3-fp8");
    // Layer 0: q/k/v/o + 4 experts x 3; layer 1 (dense): q/k/v/o + 3. Not lm_head, not the router.
    assert_eq!(quantized, 4 + 12 + 4 + 3);
    assert!(matches!(loaded.get("model.layers.0.mlp.gate.weight"), Some(StoredTensor::Plain(_))));
    match loaded.get("model.layers.0.self_attn.o_proj.weight") {
        Some(StoredTensor::Quantized(q)) => {
            assert_eq!(q.scales.shape, [2, 2], "[160, 256] in 128x128 tiles")
        }
        other => panic!("o_proj: {other:?}"),
    }
}

#[test]
fn torch_fp8_mixtral_checkpoint_loads_and_dequantizes_as_torch_does() {
    let (loaded, quantized) = check_torch_checkpoint("mixtral-fp8");
    // One layer: q/k/v/o + 3 experts x (w1, w2, w3); not the router.
    assert_eq!(quantized, 4 + 9);
    assert!(matches!(
        loaded.get("model.layers.0.block_sparse_moe.gate.weight"),
        Some(StoredTensor::Plain(_))
    ));
}

/// DeepSeek's FP8 layout on MLA: `q_a_proj`, `q_b_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`
/// and `o_proj` with no side a multiple of 128, so every one has partial edge blocks whose
/// `weight_scale_inv` covers only the elements they hold; the norms stay plain. The
/// reference runs on what loads.
#[test]
fn torch_fp8_deepseek_checkpoint_loads_and_dequantizes_as_torch_does() {
    let (loaded, quantized) = check_torch_checkpoint("deepseek-fp8");
    // Per layer: q_a, q_b, kv_a, kv_b, o + the dense MLP's 3; not lm_head.
    assert_eq!(quantized, 2 * (5 + 3));
    for (proj, scales) in [
        ("q_a_proj", [1, 2]),
        ("q_b_proj", [2, 1]),
        ("kv_a_proj_with_mqa", [1, 2]),
        ("kv_b_proj", [2, 1]),
        ("o_proj", [2, 1]),
    ] {
        match loaded.get(&format!("model.layers.1.self_attn.{proj}.weight")) {
            Some(StoredTensor::Quantized(q)) => assert_eq!(q.scales.shape, scales, "{proj}"),
            other => panic!("{proj}: {other:?}"),
        }
    }
    assert!(matches!(
        loaded.get("model.layers.0.self_attn.kv_a_layernorm.weight"),
        Some(StoredTensor::Plain(_))
    ));
    let spec = checkpoint_spec("deepseek-fp8");
    let reference = palladium_model::reference::Reference::new(
        &spec,
        &loaded.dequantize(),
        palladium_model::reference::Precision::Bf16,
    )
    .unwrap();
    let g = reference.generate(&[1, 2, 3], 3).unwrap();
    assert!(g.steps.iter().all(|s| s.logits.iter().all(|x| x.is_finite())));
}

#[test]
fn fp8_checkpoint_refuses_other_dtypes_and_the_unquantized_loader() {
    let spec = checkpoint_spec("qwen3-fp8");
    let dir = oracle().join("qwen3-fp8");
    let err = QuantizedWeights::load(&spec, &dir, Some(WeightsDtype::Int8)).unwrap_err();
    assert!(err.to_string().contains("already quantized"), "{err}");
    let err = Weights::load(&spec, &dir).unwrap_err();
    assert!(matches!(err, WeightsError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("quantization_config"), "{err}");
}
