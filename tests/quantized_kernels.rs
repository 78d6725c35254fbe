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
    let w = Tensor {
        shape: vec![out, inp],
        data: rng.bf16s(out * inp).into_iter().map(|v| v * 0.05).collect(),
    };
    let x = rng.bf16s(batch * inp);
    for format in [
        QuantFormat::Int8PerChannel,
        QuantFormat::Fp8Block { block: FP8_BLOCK },
        QuantFormat::Int4Group { group: INT4_GROUP },
    ] {
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
        let (_, _, program, _) = prepare("gemv_quantized", &settings, Chip::V6e)
            .unwrap_or_else(|e| panic!("{}: {e}", format.name()));
        let got = program
            .run(&[HostArray::bf16_from_f32(&[batch, inp], &x), ops.codes, ops.scales])
            .unwrap()[0]
            .to_f32();
        // `x @ W.T` on the dequantized weight.
        let dq = q.dequantize();
        let wt: Vec<f32> = (0..inp)
            .flat_map(|c| (0..out).map(move |r| (r, c)))
            .map(|(r, c)| dq.data[r * inp + c])
            .collect();
        let want = gemv(&x, &wt, batch, inp, out);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(scale > 0.0 && err < 1e-5, "{}: max rel err {err:e}", format.name());
    }
}

#[test]
fn a_partial_group_has_no_kernel_operands() {
    let w = Tensor { shape: vec![4, 200], data: vec![0.5; 800] };
    let q =
        QuantizedTensor::quantize("w", &w, QuantFormat::Int4Group { group: INT4_GROUP }).unwrap();
    let err = q.kernel_operands().unwrap_err().to_string();
    assert!(err.contains("200 inputs are not whole groups of 128"), "{err}");
}

/// The int8 digits of the activations (`project_quantized` with i8 codes against at most 8
/// rows): through identity codes with unit scales the product is each row recombined from
/// its digits, `s (d0 + d1 / 2^7 + d2 / 2^14)` with `s = max|x| / 127`, which docs/quantization.md
/// and `Digits` document as within `2^-15 s` of `x` plus the f32 rounding of `v = x / s` (a few
/// ulps of 127, here `2^-21 max|x|`); two digits would miss by up to `2^-8 s`. Rows cover
/// magnitudes from 2^-60 to 2^60, a negative maximum, values at digit ties and a zero row
/// (padding, which must give zeros).
#[test]
fn int8_digits_recombine_within_their_bound() {
    let (batch, k) = (8, 256);
    let mut rng = Rng::new(7);
    let mut x = rng.bf16s(batch * k);
    let row = |x: &mut Vec<f32>, r: usize, f: &dyn Fn(usize, f32) -> f32| {
        (0..k).for_each(|c| x[r * k + c] = f(c, x[r * k + c]))
    };
    row(&mut x, 1, &|_, v| v * 2f32.powi(-60));
    row(&mut x, 2, &|_, v| v * 2f32.powi(60));
    row(&mut x, 3, &|c, v| if c == 5 { -4.0 } else { v });
    // Row 4: max 127, so v = x: ties of d0 (0.5, -2.5, 1.5) and of d1 (129/256: d0 = 1,
    // then -63.5; -65/256: d0 = 0, then -32.5), all exact in bf16.
    row(&mut x, 4, &|c, _| [127.0, 0.5, -2.5, 1.5, 129.0 / 256.0, -65.0 / 256.0, 0.0][c % 7]);
    row(&mut x, 7, &|_, _| 0.0);
    let x: Vec<f32> = x.into_iter().map(palladium_array::round_bf16).collect();
    let codes: Vec<i8> = (0..k * k).map(|i| i8::from(i / k == i % k)).collect();
    let set = |n: &str, v: usize| (n.to_string(), v.to_string());
    let settings = [
        set("batch", batch),
        set("k", k),
        set("n", k),
        set("block_n", k),
        set("block_k", k),
        ("wdtype".into(), "i8".into()),
        set("group", k),
    ];
    let (_, _, program, _) = prepare("gemv_quantized", &settings, Chip::V6e).unwrap();
    let inputs = [
        HostArray::bf16_from_f32(&[batch, k], &x),
        HostArray::from_i8(&[k, k], &codes),
        HostArray::from_f32(&[1, k], &vec![1.0; k]),
    ];
    let got = program.run(&inputs).unwrap()[0].to_f32();
    for r in 0..batch {
        let xr = &x[r * k..(r + 1) * k];
        let amax = xr.iter().fold(0f32, |m, v| m.max(v.abs()));
        let bound = amax * (2f32.powi(-15) / 127.0 + 2f32.powi(-21));
        for c in 0..k {
            let err = (got[r * k + c] - xr[c]).abs();
            assert!(
                err <= bound,
                "row {r} col {c}: x {} recombined {} (error {err:e} > bound {bound:e})",
                xr[c],
                got[r * k + c]
            );
        }
        if amax == 0.0 {
            assert!(got[r * k..(r + 1) * k].iter().all(|&v| v == 0.0), "a zero row gives zeros");
        }
    }
}
