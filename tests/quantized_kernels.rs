//! The model's quantized weights through the kernels: `QuantizedTensor::quantize` in each
//! format, `kernel_operands`, then `gemv_quantized` in interpret mode against the plain
//! product with `QuantizedTensor::dequantize` (the weights the reference forward pass uses).

use palladium::check::prepare;
use palladium_array::HostArray;
use palladium_dsl::spec::Chip;
use palladium_kernels::reference::{Rng, gemv};
use palladium_model::quant::{FP8_BLOCK, INT4_GROUP, QuantFormat, QuantizedTensor};
use palladium_model::weights::Tensor;

#[test]
fn model_quantized_weights_run_through_gemv_quantized() {
    let (batch, out, inp) = (8, 256, 512);
    let mut rng = Rng::new(16);
    let w = Tensor { shape: vec![out, inp], data: rng.bf16s(out * inp).into_iter().map(|v| v * 0.05).collect() };
    let x = rng.bf16s(batch * inp);
    for format in [QuantFormat::Int8PerChannel, QuantFormat::Fp8Block { block: FP8_BLOCK }, QuantFormat::Int4Group { group: INT4_GROUP }] {
        let q = QuantizedTensor::quantize("w", &w, format).unwrap();
        let ops = q.kernel_operands().unwrap();
        let set = |n: &str, v: String| (n.to_string(), v);
        let settings = [
            set("batch", batch.to_string()),
            set("k", inp.to_string()),
            set("n", out.to_string()),
            set("block_n", out.to_string()),
            set("block_k", inp.to_string()),
            set("wdtype", ops.codes.dtype.name().to_string()),
            set("group", ops.group.to_string()),
        ];
        let (_, _, program, _) = prepare("gemv_quantized", &settings, Chip::V6e).unwrap_or_else(|e| panic!("{}: {e}", format.name()));
        let got = program.run(&[HostArray::bf16_from_f32(&[batch, inp], &x), ops.codes, ops.scales]).unwrap()[0].to_f32();
        // `x @ W.T` on the dequantized weight.
        let dq = q.dequantize();
        let wt: Vec<f32> = (0..inp).flat_map(|c| (0..out).map(move |r| (r, c))).map(|(r, c)| dq.data[r * inp + c]).collect();
        let want = gemv(&x, &wt, batch, inp, out);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(scale > 0.0 && err < 1e-5, "{}: max rel err {err:e}", format.name());
    }
}

#[test]
fn a_partial_group_has_no_kernel_operands() {
    let w = Tensor { shape: vec![4, 200], data: vec![0.5; 800] };
    let q = QuantizedTensor::quantize("w", &w, QuantFormat::Int4Group { group: INT4_GROUP }).unwrap();
    let err = q.kernel_operands().unwrap_err().to_string();
    assert!(err.contains("200 inputs are not whole groups of 128"), "{err}");
}
