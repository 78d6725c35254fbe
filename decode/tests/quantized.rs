//! The quantized megakernel (issue 16) in interpret mode: the tiny Qwen3-MoE and Mixtral in
//! int8, fp8 and int4-expert form, quantized at load, and FP8 block-scaled checkpoints
//! written by torch (`model/tests/quant_reference.py --megakernel`), each against the
//! reference forward pass on the DEQUANTIZED weights within the project's logits tolerance
//! (the `--check` rules, [`palladium_decode::compare_with`]).

use crate::hf_oracle;

use std::path::PathBuf;
use std::process::Command;

use hf_oracle::{repo_root, venv_python};
use palladium_decode::pack::{PackError, pack, pack_quantized};
use palladium_decode::{Comparison, Decoder, compare_with};
use palladium_dsl::spec::Chip;
use palladium_fusion::megakernel::Megakernel;
use palladium_fusion::plan::{PlanError, PlanOptions, weights_dtype};
use palladium_model::ModelSpec;
use palladium_model::quant::{QuantizedWeights, WeightsDtype};
use palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE;
use palladium_model::weights::Weights;

const PROMPT: [u32; 5] = [1, 17, 300, 42, 5];

fn fixture(name: &str) -> ModelSpec {
    ModelSpec::from_path(repo_root().join(format!("fixtures/models/{name}.json"))).unwrap()
}

fn megakernel(spec: &ModelSpec, weights: WeightsDtype) -> Megakernel {
    Megakernel::build(spec, &PlanOptions { weights, ..PlanOptions::new(Chip::V6e, 1, 16) }).unwrap()
}

/// Greedy decode of `steps` tokens after [`PROMPT`] through the megakernel of `quantized`,
/// compared with the references on its dequantized weights.
fn run_and_compare(spec: &ModelSpec, quantized: &QuantizedWeights, steps: usize) -> Comparison {
    let mk = megakernel(spec, quantized.dtype());
    let mut decoder =
        Decoder::new(&mk, vec![pack_quantized(spec, &mk.plan, quantized).unwrap()]).unwrap();
    let generation = decoder.generate(&PROMPT, steps).unwrap();
    compare_with(spec, &quantized.dequantize(), &PROMPT, &generation, LOGITS_RELATIVE_TOLERANCE)
        .unwrap()
}

#[test]
fn quantized_at_load_megakernels_match_the_reference_on_dequantized_weights() {
    for name in ["tiny-qwen3-moe", "tiny-mixtral"] {
        let spec = fixture(name);
        let weights = Weights::random(&spec, 3).unwrap();
        for dtype in [WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4] {
            let quantized = QuantizedWeights::quantize(&spec, &weights, dtype).unwrap();
            let c = run_and_compare(&spec, &quantized, 4);
            assert!(c.passed(), "{name} {}: {}", dtype.name(), c.summary());
        }
    }
}

/// Shared experts with quantized weights: their entries of `w_experts` hold codes in the
/// routed experts' format and their scales sit in the experts' scale operands, streamed as
/// an expert's chunks are. Qwen2-MoE (a gated shared expert) in every format; GLM-4.5 (an
/// ungated one, DeepSeek-V3 routing, a dense first layer, so no int4: its dense MLP would
/// be int8) in int8 and fp8; Hunyuan-MoE (an ungated one, q/k norms after RoPE) in int8
/// and int4.
#[test]
fn quantized_shared_experts_match_the_reference_on_dequantized_weights() {
    for (name, dtypes) in [
        ("tiny-qwen2-moe", &[WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4][..]),
        ("tiny-glm4-moe", &[WeightsDtype::Int8, WeightsDtype::Fp8][..]),
        ("tiny-hunyuan-moe", &[WeightsDtype::Int8, WeightsDtype::Int4][..]),
    ] {
        let spec = fixture(name);
        let weights = Weights::random(&spec, 5).unwrap();
        for &dtype in dtypes {
            let quantized = QuantizedWeights::quantize(&spec, &weights, dtype).unwrap();
            let c = run_and_compare(&spec, &quantized, 4);
            println!("{name} {}: {}", dtype.name(), c.summary());
            assert!(c.passed(), "{name} {}: {}", dtype.name(), c.summary());
        }
    }
}

/// Sizes padded to 128-lane tiles with quantized weights (tiny GLM-4.5 of hidden 192,
/// intermediates 80 and 200): fp8's 128x128 tiles and int8's channels end inside the
/// padded blocks, whose codes are zero, so each group's scale is the checkpoint tile's.
#[test]
fn quantized_padded_sizes_match_the_reference_on_dequantized_weights() {
    let spec = fixture("tiny-glm4-moe-padded");
    let weights = Weights::random(&spec, 5).unwrap();
    for dtype in [WeightsDtype::Int8, WeightsDtype::Fp8] {
        let quantized = QuantizedWeights::quantize(&spec, &weights, dtype).unwrap();
        let c = run_and_compare(&spec, &quantized, 4);
        println!("tiny-glm4-moe-padded {}: {}", dtype.name(), c.summary());
        assert!(c.passed(), "tiny-glm4-moe-padded {}: {}", dtype.name(), c.summary());
    }
}

#[test]
fn weights_of_another_dtype_are_refused_when_packing() {
    let spec = fixture("tiny-qwen3-moe");
    let weights = Weights::random(&spec, 3).unwrap();
    let int8 = QuantizedWeights::quantize(&spec, &weights, WeightsDtype::Int8).unwrap();
    let mk = megakernel(&spec, WeightsDtype::Int4);
    let err = pack_quantized(&spec, &mk.plan, &int8).unwrap_err();
    assert_eq!(err, PackError::Layout("int8 weights for a int4 megakernel".into()));
    let bf16 = megakernel(&spec, WeightsDtype::Bf16);
    let err = pack_quantized(&spec, &bf16.plan, &int8).unwrap_err();
    assert!(err.to_string().contains("quantized weights for a bf16 megakernel"), "{err}");
    // bf16 weights for a quantized plan: refused up front, not packed as codes.
    let err = pack(&spec, &mk.plan, &weights).unwrap_err();
    assert!(err.to_string().contains("bf16 weights for a int4 megakernel"), "{err}");
}

/// `quant_reference.py --megakernel`'s checkpoints, written once per test binary.
fn torch_checkpoints() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fp8-megakernel-{}", std::process::id()));
    let out = Command::new(venv_python())
        .arg(repo_root().join("model/tests/quant_reference.py"))
        .args(["--megakernel", "--fixtures"])
        .arg(repo_root().join("fixtures/models"))
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .expect("run quant_reference.py");
    assert!(
        out.status.success(),
        "quant_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

#[test]
fn fp8_checkpoints_written_by_torch_run_and_match_the_reference() {
    let dir = torch_checkpoints();
    for name in ["qwen3-fp8-mk", "mixtral-fp8-mk"] {
        let ckpt = dir.join(name);
        let spec = ModelSpec::from_path(ckpt.join("config.json")).unwrap();
        // The config's quantization_config selects fp8 by itself, and refuses another dtype.
        assert_eq!(weights_dtype(&spec, None), Ok(WeightsDtype::Fp8));
        let err = weights_dtype(&spec, Some(WeightsDtype::Int8)).unwrap_err();
        assert!(
            matches!(err, PlanError::Invalid(_))
                && err.to_string().contains("stores the weights as fp8"),
            "{err}"
        );
        let loaded = QuantizedWeights::load(&spec, &ckpt, None).unwrap();
        assert_eq!(loaded.dtype(), WeightsDtype::Fp8);
        let c = run_and_compare(&spec, &loaded, 4);
        assert!(c.passed(), "{name}: {}", c.summary());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// DBRX in fp8: the fused `Wqkv` and the row-stacked experts quantized as whole tensors in
/// 128 x 128 blocks (each block one expert's), their codes and scales placed by the
/// source maps (`w2`'s transposed: its blocks group the down projection's inputs); the
/// kernel applies the `LayerNorms`' weights from `norms`. int8 and int4, which would group
/// `w2` by its outputs, are refused naming the stacked experts.
#[test]
fn dbrx_fp8_matches_the_reference_on_dequantized_weights() {
    let spec = fixture("tiny-dbrx");
    let weights = Weights::random(&spec, 5).unwrap();
    let fp8 = QuantizedWeights::quantize(&spec, &weights, WeightsDtype::Fp8).unwrap();
    let c = run_and_compare(&spec, &fp8, 4);
    println!("tiny-dbrx fp8: {}", c.summary());
    assert!(c.passed(), "tiny-dbrx fp8: {}", c.summary());
    for dtype in [WeightsDtype::Int8, WeightsDtype::Int4] {
        let err = QuantizedWeights::quantize(&spec, &weights, dtype).unwrap_err();
        assert!(err.to_string().contains("experts stacked by rows"), "{err}");
    }
}
