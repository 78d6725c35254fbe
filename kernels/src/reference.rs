//! Plain-Rust reference implementations of the library kernels, over row-major f32 slices,
//! for checking interpret-mode results.
//!
//! Rounding model: bf16 operands are passed as f32 values that are already exactly
//! representable in bf16 (convert with [`bf16_round`]); the math is done in f32 as the
//! kernels do it, and wherever a kernel stores or feeds the MXU a bf16 value, the reference
//! rounds with [`bf16_round`] (round to nearest, ties to even, as `astype(bf16)`) at that
//! same point. Products accumulate in f32 in index order; the MXU's summation order differs,
//! so compare dot results with a tolerance of a few f32 ulps of the accumulated magnitude.
//! Transcendentals (`rsqrt`) use Rust's `1.0 / sqrt`, which can differ from the TPU's by an
//! ulp or so before the bf16 rounding.

/// Round an f32 to the nearest bf16 value (ties to even), returned as f32. NaN stays NaN.
pub fn bf16_round(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7fff + lsb) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// `gemv`: `o[batch, n] = x[batch, k] @ w[k, n]`, f32 accumulation, f32 out (no rounding
/// after the inputs).
pub fn gemv(x: &[f32], w: &[f32], batch: usize, k: usize, n: usize) -> Vec<f32> {
    assert_eq!((x.len(), w.len()), (batch * k, k * n));
    let mut o = vec![0.0f32; batch * n];
    for b in 0..batch {
        for kk in 0..k {
            let xv = x[b * k + kk];
            for j in 0..n {
                o[b * n + j] += xv * w[kk * n + j];
            }
        }
    }
    o
}

/// `residual_add`: `bf16(x + residual)`, the sum in f32 (exact for bf16 inputs of similar
/// magnitude; one rounding at the store).
pub fn residual_add(x: &[f32], residual: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), residual.len());
    x.iter().zip(residual).map(|(a, b)| bf16_round(a + b)).collect()
}

/// `rmsnorm_matmul`: `bf16(bf16(x * rsqrt(mean(x^2) + eps) * norm_w) @ w)` for `x[rows,
/// hidden]`, `norm_w[hidden]`, `w[hidden, n]`: f32 norm, one bf16 rounding of the
/// normalised activations (the MXU operand), f32 accumulation, one bf16 rounding of the
/// output.
pub fn rmsnorm_matmul(x: &[f32], norm_w: &[f32], w: &[f32], rows: usize, hidden: usize, n: usize, eps: f32) -> Vec<f32> {
    assert_eq!((x.len(), norm_w.len(), w.len()), (rows * hidden, hidden, hidden * n));
    let mut normed = vec![0.0f32; rows * hidden];
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for (h, v) in row.iter().enumerate() {
            normed[r * hidden + h] = bf16_round(v * inv * norm_w[h]);
        }
    }
    gemv(&normed, w, rows, hidden, n).into_iter().map(bf16_round).collect()
}

/// `rope`: for `x[tokens, heads * head_dim]` and tables `cos`, `sin` `[tokens, head_dim]`
/// (expanded to the full head dim in the style's order), `bf16(x * cos + rotate(x) * sin)`
/// per head, in f32. `rotate` is exact (a signed permutation): neox
/// `concat(-x[d/2:], x[:d/2])`; interleaved `(-x[2i+1], x[2i])` at `(2i, 2i+1)`.
pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], tokens: usize, heads: usize, head_dim: usize, interleaved: bool) -> Vec<f32> {
    let d = head_dim;
    assert_eq!((x.len(), cos.len(), sin.len()), (tokens * heads * d, tokens * d, tokens * d));
    assert!(d % 2 == 0, "head_dim must be even");
    let width = heads * d;
    let mut o = vec![0.0f32; x.len()];
    for t in 0..tokens {
        for h in 0..heads {
            let head = &x[t * width + h * d..t * width + (h + 1) * d];
            for j in 0..d {
                let rotated = if interleaved {
                    if j % 2 == 0 { -head[j + 1] } else { head[j - 1] }
                } else if j < d / 2 {
                    -head[j + d / 2]
                } else {
                    head[j - d / 2]
                };
                o[t * width + h * d + j] = bf16_round(head[j] * cos[t * d + j] + rotated * sin[t * d + j]);
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(bf16_round(1.0), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16_round(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(bf16_round(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(bf16_round(1.0 + 1.0 / 200.0), 1.0 + 1.0 / 128.0);
        assert_eq!(bf16_round(-3.0), -3.0);
        assert!(bf16_round(f32::NAN).is_nan());
    }

    #[test]
    fn gemv_by_hand() {
        // x = [[1, 2], [3, 4]], w = [[1, 0, 2], [0, 1, -1]].
        let o = gemv(&[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0, 2.0, 0.0, 1.0, -1.0], 2, 2, 3);
        assert_eq!(o, vec![1.0, 2.0, 0.0, 3.0, 4.0, 2.0]);
    }

    #[test]
    fn residual_add_by_hand() {
        // 256 + 1 = 257 is not a bf16 (8 significant bits): ties to even gives 256.
        assert_eq!(residual_add(&[1.0, 256.0, -0.5], &[2.0, 1.0, 0.25]), vec![3.0, 256.0, -0.25]);
    }

    #[test]
    fn rmsnorm_matmul_by_hand() {
        // One row x = [3, 4] (hidden 2): mean(x^2) = 12.5, rsqrt = 1/sqrt(12.5), so
        // normalised = [3, 4] / 3.5355 = [0.8485, 1.1314]; norm_w = [1, 2] gives
        // [0.8485, 2.2627], rounded to bf16 [0.84765625, 2.265625]; w = identity then
        // [1, 1] column: out = [0.84765625, 2.265625, 3.11328125 -> bf16 3.109375].
        let o = rmsnorm_matmul(&[3.0, 4.0], &[1.0, 2.0], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0], 1, 2, 3, 0.0);
        assert_eq!(o, vec![0.84765625, 2.265625, 3.109375]);
    }

    #[test]
    fn rope_by_hand() {
        // One token, one head, head_dim 4, x = [1, 2, 3, 4]; cos = 0, sin = 1 leaves just
        // rotate(x).
        let x = [1.0, 2.0, 3.0, 4.0];
        let (zeros, ones) = ([0.0; 4], [1.0; 4]);
        assert_eq!(rope(&x, &zeros, &ones, 1, 1, 4, false), vec![-3.0, -4.0, 1.0, 2.0]);
        assert_eq!(rope(&x, &zeros, &ones, 1, 1, 4, true), vec![-2.0, 1.0, -4.0, 3.0]);
        // cos = 1, sin = 0 is the identity.
        assert_eq!(rope(&x, &ones, &zeros, 1, 1, 4, true), x.to_vec());
        // A quarter turn of the pair (1, 3) in neox: angle 90° → (-3, 1); cos = 0.5, sin = 0.5:
        // out[0] = 0.5 * 1 - 0.5 * 3 = -1, out[2] = 0.5 * 3 + 0.5 * 1 = 2.
        let half = [0.5; 4];
        assert_eq!(rope(&x, &half, &half, 1, 1, 4, false), vec![-1.0, -1.0, 2.0, 3.0]);
    }
}
