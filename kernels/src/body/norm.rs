//! RMSNorm and the residual add: the decoder layer's elementwise phases.

use palladium_dsl::prelude::*;

/// `x * rsqrt(mean(x^2) + eps)` over the last dim, f32, `n` being the true length of that
/// dim (lanes past it must hold zeros). No weight: see [`rms_norm`].
pub fn rms_unit(x: Val, n: u64, eps: f64) -> Val {
    let mean_square = (x * x).sum_keepdims(1) / n as f64;
    x * (mean_square + eps).rsqrt()
}

/// RMSNorm as the next matmul's operand: [`rms_unit`] of `x` (any float dtype, computed in
/// f32), times `weight` (broadcast over rows) when it is not folded into the next projection's
/// weights (the megakernel folds it), rounded once to bf16.
pub fn rms_norm(x: Val, weight: Option<Val>, n: u64, eps: f64) -> Val {
    let normed = rms_unit(x.cast(f32), n, eps);
    match weight {
        Some(w) => (normed * w.cast(f32)).cast(bf16),
        None => normed.cast(bf16),
    }
}

/// The residual add in f32 (`x.astype(f32) + residual.astype(f32)`): the caller rounds where
/// its residual stream is stored in bf16 (the megakernel keeps it in f32).
pub fn residual_add(x: Val, residual: Val) -> Val {
    x.cast(f32) + residual.cast(f32)
}

/// `nn.LayerNorm` without its weight and bias: `(x - mean(x)) * rsqrt(var(x) + eps)` over
/// the last dim of `x` (`[rows, lanes]`), f32, the biased variance, `n` being the true
/// length of that dim (lanes past it must hold zeros). The lanes past `n` of the centred
/// `x` are masked back to zero, so they count in neither the variance nor the result.
pub fn layer_norm_unit(x: Val, n: u64, eps: f64) -> Val {
    let [rows, lanes] = [x.shape().0[0], x.shape().0[1]];
    let centred = x - x.sum_keepdims(1) / n as f64;
    let centred = match n < lanes {
        true => select(palladium_dsl::build::lt(iota([rows, lanes], 1), n as i32), centred, 0.0),
        false => centred,
    };
    let variance = (centred * centred).sum_keepdims(1) / n as f64;
    centred * (variance + eps).rsqrt()
}

/// `nn.LayerNorm` (no bias) as the next matmul's operand, as [`rms_norm`] is RMSNorm:
/// [`layer_norm_unit`] of `x` in f32, times `weight` where it is not folded, rounded once
/// to bf16.
pub fn layer_norm(x: Val, weight: Option<Val>, n: u64, eps: f64) -> Val {
    let normed = layer_norm_unit(x.cast(f32), n, eps);
    match weight {
        Some(w) => (normed * w.cast(f32)).cast(bf16),
        None => normed.cast(bf16),
    }
}
