//! Plain-Rust references for the library kernels, and the seeded generator their test
//! inputs come from.
//!
//! No DSL here: f32 math over row-major slices, written the obvious way (no tiling, no
//! online softmax), so that a wrong answer from a kernel cannot be the same wrong answer
//! here.
//!
//! Rounding, to match what the kernels compute:
//! - bf16 *inputs* are passed as f32 values that are already bf16 values ([`round_bf16`]
//!   applied by the generator), so reading them as f32 is exact;
//! - all math is f32, accumulating in f32 (a matmul's k sum, a row's sum of squares);
//! - a bf16 *output* is rounded once, at the end, to nearest even ([`round_bf16`]), as the
//!   kernel's final `.cast(bf16)` does. Intermediate bf16 casts inside a kernel (e.g. the
//!   softmax weights fed to the MXU in decode attention) are *not* mirrored: they are the
//!   kernel's business and show up as a small relative error.

use palladium_array::round_bf16;

/// `SplitMix64`: small, seeded, deterministic; the same seed gives the same inputs on
/// every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), never exactly zero.
    pub fn unit(&mut self) -> f32 {
        let x = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if x == 0.0 { 0.5 } else { x }
    }

    /// `n` values in [-1, 1] (rounding can reach 1.0) rounded to bf16 (as f32); never zero.
    pub fn bf16s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| round_bf16(self.unit())).collect()
    }

    /// `n` values in [-1, 1); never zero.
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// A random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<i32> {
        let mut v: Vec<i32> = (0..n as i32).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// `x[m, k] @ y[k, n]` with f32 accumulation in index order, f32 out.
pub fn matmul_f32(x: &[f32], y: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert_eq!((x.len(), y.len()), (m * k, k * n), "matmul operand sizes");
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for kk in 0..k {
            let a = x[i * k + kk];
            for j in 0..n {
                out[i * n + j] += a * y[kk * n + j];
            }
        }
    }
    out
}

/// A quantized `[k, n]` weight as the quantized kernels take it, dequantized:
/// `codes[kk, j] * scales[kk / group, j]` in f32 (`scales` `[k / group, n]`), the weight
/// their references multiply by.
pub fn dequantize(codes: &[f32], scales: &[f32], k: usize, n: usize, group: usize) -> Vec<f32> {
    assert_eq!((codes.len(), scales.len()), (k * n, k / group * n), "quantized operand sizes");
    (0..k * n).map(|i| codes[i] * scales[(i / n) / group * n + i % n]).collect()
}

/// A ring permute over `devices` devices: `x` is their operands stacked (device `d`'s the
/// `d`-th of `devices` equal slabs) and device `d + shift`'s output is device `d`'s operand.
pub fn ring_permute(x: &[f32], devices: usize, shift: usize) -> Vec<f32> {
    let slab = x.len() / devices;
    (0..devices)
        .flat_map(|d| &x[(d + devices - shift % devices) % devices * slab..][..slab])
        .copied()
        .collect()
}

/// The sum over `devices` devices of their operands (stacked in `x` as in [`ring_permute`],
/// each `[devices * block_rows, cols]`) as a ring reduce-scatter computes it: row block `b`
/// of the sum starts as device `b + dir`'s rows, travels the ring in direction `dir` (`1` or
/// `-1` per column, `dirs[c]`), and each device on the way adds its rows in f32 and rounds the
/// partial to bf16 (the wire's type), device `b` last. The same additions in the same order
/// as the kernel, so its bf16 result is matched bit for bit at any ring size.
pub fn ring_reduce_sum(x: &[f32], devices: usize, block_rows: usize, dirs: &[i64]) -> Vec<f32> {
    let cols = dirs.len();
    let slab = x.len() / devices;
    let n = devices as i64;
    (0..slab)
        .map(|i| {
            let (block, col) = (i / cols / block_rows, i % cols);
            let device = |k: i64| (block as i64 + dirs[col] * k).rem_euclid(n) as usize;
            (2..=n).fold(x[device(1) * slab + i], |partial, k| {
                round_bf16(partial + x[device(k) * slab + i])
            })
        })
        .collect()
}

/// `x[m, k] @ y[k, n]`: f32 accumulation, output rounded to bf16.
pub fn matmul(x: &[f32], y: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    matmul_f32(x, y, m, k, n).into_iter().map(round_bf16).collect()
}

/// RMSNorm over rows of `x[rows, hidden]`: `x / sqrt(mean(x^2) + eps) * w`, f32 math,
/// output rounded to bf16.
pub fn rmsnorm(x: &[f32], w: &[f32], rows: usize, hidden: usize, eps: f32) -> Vec<f32> {
    assert_eq!((x.len(), w.len()), (rows * hidden, hidden), "rmsnorm operand sizes");
    let mut out = vec![0f32; rows * hidden];
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let ms = row.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for h in 0..hidden {
            out[r * hidden + h] = round_bf16(row[h] * inv * w[h]);
        }
    }
    out
}

/// `out[i] = table[ids[i]] * scale` over blocks of `r * d` elements, rounded to bf16.
pub fn gather_rows(ids: &[i32], table: &[f32], r: usize, d: usize, scale: f32) -> Vec<f32> {
    let block = r * d;
    ids.iter()
        .flat_map(|&i| {
            let i = usize::try_from(i).expect("gather id is negative");
            table[i * block..(i + 1) * block].iter().map(move |v| round_bf16(v * scale))
        })
        .collect()
}

/// Shapes of [`decode_attention`].
#[derive(Copy, Clone, Debug)]
pub struct AttentionShape {
    pub batch: usize,
    pub kv_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub max_context: usize,
}

/// GQA decode attention: for sequence `b`, kv head `h` and each of its `group` query heads,
/// `softmax(q · k[..lens[b]] / sqrt(head_dim)) @ v[..lens[b]]`, a plain (not online)
/// softmax in f32, output rounded to bf16.
///
/// `q`/`o`: `[batch, kv_heads, group, head_dim]`; `k`/`v`: `[batch, kv_heads, max_context,
/// head_dim]`; positions at or past `lens[b]` are ignored.
/// Shape of [`flash_attention`]: `heads` independent (batch x head) problems.
#[derive(Copy, Clone, Debug)]
pub struct FlashShape {
    pub heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    /// Query `i` sees keys `0..=i` only.
    pub causal: bool,
}

/// Softmax attention `softmax(q k^T / sqrt(head_dim)) v` per head, in f32; output rounded
/// to bf16. `q`: `[heads, seq_q, head_dim]`, `k`, `v`: `[heads, seq_k, head_dim]`.
pub fn flash_attention(q: &[f32], k: &[f32], v: &[f32], s: FlashShape) -> Vec<f32> {
    let FlashShape { heads, seq_q, seq_k, head_dim: hd, causal } = s;
    assert_eq!(q.len(), heads * seq_q * hd, "q size");
    assert_eq!((k.len(), v.len()), (heads * seq_k * hd, heads * seq_k * hd), "k/v sizes");
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    for h in 0..heads {
        let (kh, vh) =
            (&k[h * seq_k * hd..(h + 1) * seq_k * hd], &v[h * seq_k * hd..(h + 1) * seq_k * hd]);
        for i in 0..seq_q {
            let row = (h * seq_q + i) * hd;
            let qr = &q[row..row + hd];
            let visible = if causal { (i + 1).min(seq_k) } else { seq_k };
            let scores: Vec<f32> = (0..visible)
                .map(|j| {
                    qr.iter().zip(&kh[j * hd..(j + 1) * hd]).map(|(a, b)| a * b).sum::<f32>()
                        * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = weights.iter().sum();
            for (j, w) in weights.iter().enumerate() {
                for (o, x) in out[row..row + hd].iter_mut().zip(&vh[j * hd..(j + 1) * hd]) {
                    *o += w / total * x;
                }
            }
        }
    }
    out.into_iter().map(round_bf16).collect()
}

pub fn decode_attention(
    lens: &[i32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: AttentionShape,
) -> Vec<f32> {
    let AttentionShape { batch, kv_heads, group, head_dim: hd, max_context: t } = s;
    assert_eq!(lens.len(), batch, "one length per sequence");
    assert_eq!(q.len(), batch * kv_heads * group * hd, "q size");
    assert_eq!(
        (k.len(), v.len()),
        (batch * kv_heads * t * hd, batch * kv_heads * t * hd),
        "cache sizes"
    );
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    let mut scores = Vec::with_capacity(t);
    for (b, &len) in lens.iter().enumerate() {
        let len = usize::try_from(len).expect("negative length").min(t);
        for h in 0..kv_heads {
            let cache = (b * kv_heads + h) * t * hd;
            for g in 0..group {
                let row = ((b * kv_heads + h) * group + g) * hd;
                let qr = &q[row..row + hd];
                scores.clear();
                scores.extend((0..len).map(|p| {
                    qr.iter()
                        .zip(&k[cache + p * hd..cache + (p + 1) * hd])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                }));
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                for (p, w) in weights.iter().enumerate() {
                    let vr = &v[cache + p * hd..cache + (p + 1) * hd];
                    for (o, x) in out[row..row + hd].iter_mut().zip(vr) {
                        *o += w / total * x;
                    }
                }
            }
        }
    }
    out.into_iter().map(round_bf16).collect()
}

/// `kv_cache_update`: the caches (`[batch, kv_heads, max_context, head_dim]`) with row
/// `positions[b]` of every `(b, h)` replaced by the new token's `new[b, h, :]`
/// (`[batch, kv_heads, head_dim]`); every other row unchanged. Returns the updated cache.
pub fn kv_cache_update(
    positions: &[i32],
    new: &[f32],
    cache: &[f32],
    kv_heads: usize,
    max_context: usize,
    head_dim: usize,
) -> Vec<f32> {
    let batch = positions.len();
    assert_eq!(new.len(), batch * kv_heads * head_dim, "new token size");
    assert_eq!(cache.len(), batch * kv_heads * max_context * head_dim, "cache size");
    let mut out = cache.to_vec();
    for (b, &pos) in positions.iter().enumerate() {
        let pos = usize::try_from(pos).expect("negative position");
        assert!(pos < max_context, "position {pos} outside the cache ({max_context})");
        for h in 0..kv_heads {
            let src = (b * kv_heads + h) * head_dim;
            let dst = ((b * kv_heads + h) * max_context + pos) * head_dim;
            out[dst..dst + head_dim].copy_from_slice(&new[src..src + head_dim]);
        }
    }
    out
}

/// `gemv`: `o[batch, n] = x[batch, k] @ w[k, n]`, f32 accumulation, f32 out (no rounding
/// after the inputs).
pub fn gemv(x: &[f32], w: &[f32], batch: usize, k: usize, n: usize) -> Vec<f32> {
    matmul_f32(x, w, batch, k, n)
}

/// `residual_add`: `bf16(x + residual)`, the sum in f32 (exact for bf16 inputs of similar
/// magnitude; one rounding at the store).
pub fn residual_add(x: &[f32], residual: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), residual.len());
    x.iter().zip(residual).map(|(a, b)| round_bf16(a + b)).collect()
}

/// `rmsnorm_matmul`: `bf16(bf16(x * rsqrt(mean(x^2) + eps) * norm_w) @ w)` for `x[rows,
/// hidden]`, `norm_w[hidden]`, `w[hidden, n]`: f32 norm, one bf16 rounding of the
/// normalised activations (the MXU operand), f32 accumulation, one bf16 rounding of the
/// output.
pub fn rmsnorm_matmul(
    x: &[f32],
    norm_w: &[f32],
    w: &[f32],
    rows: usize,
    hidden: usize,
    n: usize,
    eps: f32,
) -> Vec<f32> {
    assert_eq!((x.len(), norm_w.len(), w.len()), (rows * hidden, hidden, hidden * n));
    let mut normed = vec![0.0f32; rows * hidden];
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for (h, v) in row.iter().enumerate() {
            normed[r * hidden + h] = round_bf16(v * inv * norm_w[h]);
        }
    }
    matmul(&normed, w, rows, hidden, n)
}

/// `rope`: for `x[tokens, heads * head_dim]` and tables `cos`, `sin` `[tokens, head_dim]`
/// (expanded to the full head dim in the style's order), `bf16(x * cos + rotate(x) * sin)`
/// per head, in f32. `rotate` is exact (a signed permutation): neox
/// `concat(-x[d/2:], x[:d/2])`; interleaved `(-x[2i+1], x[2i])` at `(2i, 2i+1)`.
pub fn rope(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    tokens: usize,
    heads: usize,
    head_dim: usize,
    interleaved: bool,
) -> Vec<f32> {
    let d = head_dim;
    assert_eq!((x.len(), cos.len(), sin.len()), (tokens * heads * d, tokens * d, tokens * d));
    assert!(d.is_multiple_of(2), "head_dim must be even");
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
                o[t * width + h * d + j] =
                    round_bf16(head[j] * cos[t * d + j] + rotated * sin[t * d + j]);
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let o =
            rmsnorm_matmul(&[3.0, 4.0], &[1.0, 2.0], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0], 1, 2, 3, 0.0);
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

    #[test]
    fn matmul_by_hand() {
        // [1 2; 3 4] @ [5 6; 7 8] = [19 22; 43 50]
        assert_eq!(matmul(&[1., 2., 3., 4.], &[5., 6., 7., 8.], 2, 2, 2), vec![19., 22., 43., 50.]);
    }

    #[test]
    fn rmsnorm_by_hand() {
        // mean square of [3, 4] = 12.5
        let out = rmsnorm(&[3., 4.], &[1., 2.], 1, 2, 0.0);
        let inv = 1.0 / 12.5f32.sqrt();
        assert_eq!(out, vec![round_bf16(3. * inv), round_bf16(8. * inv)]);
    }

    #[test]
    fn attention_of_one_position_is_its_value() {
        let s = AttentionShape { batch: 1, kv_heads: 1, group: 2, head_dim: 2, max_context: 3 };
        let v = [0.5, -0.25, 9., 9., 9., 9.];
        let out = decode_attention(&[1], &[1., 2., 3., 4.], &[1., 1., 7., 7., 7., 7.], &v, s);
        assert_eq!(out, vec![0.5, -0.25, 0.5, -0.25]);
    }

    #[test]
    fn attention_of_equal_scores_is_the_mean() {
        let s = AttentionShape { batch: 1, kv_heads: 1, group: 1, head_dim: 1, max_context: 4 };
        let out = decode_attention(&[2], &[1.], &[1., 1., 5., 5.], &[1., 3., 100., 100.], s);
        assert_eq!(out, vec![2.]);
    }

    #[test]
    fn rng_never_gives_zero_and_permutes() {
        let mut r = Rng::new(3);
        assert!(r.bf16s(10_000).iter().all(|&x| x != 0.0 && (-1.0..=1.0).contains(&x)));
        let mut p = r.permutation(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
