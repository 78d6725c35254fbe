//! Multi-head latent attention in its absorbed decode form: the algebra an MLA megakernel
//! stage computes over a latent KV cache (`docs/deepseek.md`), in plain f32.
//!
//! [`crate::reference`] computes MLA as transformers does: every head's key and value are
//! expanded by `kv_b_proj` and cached. Decoding needs neither: with `c_j` the cached latent
//! (after `kv_a_layernorm`) and `r_j` the cached, rotated rope key of position `j`, head `h`
//! scores `((W_UK_h^T q_nope_h) . c_j + q_rope_h . r_j) * scale` and outputs
//! `W_UV_h (sum_j p_hj c_j)`. `W_UK_h` and `W_UV_h` are head `h`'s row blocks of `kv_b_proj`
//! as shipped (`[heads * (nope + v), kv_lora_rank]`: per head `nope` rows of `W_UK`, then `v`
//! rows of `W_UV`), read in place by [`KvB`] without a re-exported checkpoint.
//!
//! The stage's form ([`latent_entry`], [`fold_latent_norm`], [`StageRotation`]) changes the
//! algebra only where a dot product cannot see it: the cache holds the latent normed
//! *without* `kv_a_layernorm`'s weight `g` (its scale is folded into `kv_b_proj`'s inputs,
//! which both `W_UK_h^T` and `W_UV_h` contract with the latent, the way the other stages fold
//! an RMSNorm into the projection after it), and the rope parts of query and key are
//! rotated in place by pairs (or halves), never permuted, since a common permutation of
//! both leaves `q_rope . r_j` unchanged.

use crate::moe::dot64;
use crate::spec::{MlaSpec, RopeStyle};

/// `kv_b_proj`'s weight `[heads * (nope + v), kv_lora_rank]`, split by head on the fly.
#[derive(Debug, Clone, Copy)]
pub struct KvB<'a> {
    pub weight: &'a [f32],
    pub heads: usize,
    pub mla: MlaSpec,
}

impl<'a> KvB<'a> {
    fn dims(&self) -> (usize, usize, usize) {
        let m = &self.mla;
        (m.qk_nope_head_dim as usize, m.v_head_dim as usize, m.kv_lora_rank as usize)
    }

    /// Row `i` of head `h`'s `W_UK` (`i < qk_nope_head_dim`): `kv_lora_rank` values.
    pub fn uk_row(&self, h: usize, i: usize) -> &'a [f32] {
        let (nope, v, lora) = self.dims();
        let r = h * (nope + v) + i;
        &self.weight[r * lora..(r + 1) * lora]
    }

    /// Row `i` of head `h`'s `W_UV` (`i < v_head_dim`): `kv_lora_rank` values.
    pub fn uv_row(&self, h: usize, i: usize) -> &'a [f32] {
        let (nope, v, lora) = self.dims();
        let r = h * (nope + v) + nope + i;
        &self.weight[r * lora..(r + 1) * lora]
    }
}

/// Values one cached position holds per layer: `[latent (kv_lora_rank) | rope key
/// (qk_rope_head_dim)]`, 576 for DeepSeek-V3 ([`MlaSpec::latent_cache_width`]).
pub fn cache_entry(latent: &[f32], rope_key: &[f32]) -> Vec<f32> {
    [latent, rope_key].concat()
}

/// How the stage rotates a rope part (query's or key's, both alike): the rotation's pair
/// structure, which is all `q_rope . r_j` depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageRotation {
    /// Dimensions `2i`, `2i+1` rotate together by frequency `i`, left in place: DeepSeek-V2's
    /// [`RopeStyle::ComplexPairs`] as it is, and DeepSeek-V3's
    /// [`RopeStyle::DeinterleaveRotateHalf`] up to the de-interleaving permutation it applies
    /// to query and key alike (the kernels' interleaved `rope_rotation`).
    Pairs,
    /// Dimensions `i`, `i + d/2` rotate together ([`RopeStyle::NeoxRotateHalf`]:
    /// `rope_interleave: false`).
    Halves,
}

impl StageRotation {
    pub fn of(style: RopeStyle) -> StageRotation {
        match style {
            RopeStyle::ComplexPairs | RopeStyle::DeinterleaveRotateHalf => StageRotation::Pairs,
            RopeStyle::NeoxRotateHalf => StageRotation::Halves,
        }
    }

    /// `x` (a rope part, even length) rotated in place by `cos`/`sin` of its `x.len() / 2`
    /// frequencies, in f32.
    pub fn apply(self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = x.len() / 2;
        for i in 0..half {
            let (a, b) = match self {
                StageRotation::Pairs => (2 * i, 2 * i + 1),
                StageRotation::Halves => (i, i + half),
            };
            let (xa, xb) = (x[a], x[b]);
            x[a] = xa * cos[i] - xb * sin[i];
            x[b] = xb * cos[i] + xa * sin[i];
        }
    }
}

/// `kv_b_proj`'s weight (`[rows, kv_lora_rank]`) with `kv_a_layernorm`'s weight `g`
/// (`[kv_lora_rank]`) folded into its inputs: `W diag(g)`. With it, the cache holds the
/// latent normed without `g` ([`latent_entry`]) and [`absorbed_attention`] computes what
/// the model computes with `g` applied to the latent.
pub fn fold_latent_norm(kv_b: &[f32], g: &[f32]) -> Vec<f32> {
    assert_eq!(kv_b.len() % g.len(), 0, "kv_b_proj's rows are kv_lora_rank wide");
    kv_b.chunks_exact(g.len()).flat_map(|row| row.iter().zip(g).map(|(&w, &s)| w * s)).collect()
}

/// The cache entry the stage writes from the new position's `kv_a_proj_with_mqa` output
/// `kv_a` (`[kv_lora_rank | qk_rope_head_dim]`): the latent RMS-normed without its weight
/// (see [`fold_latent_norm`]), then the rope key rotated by `rotation` at the position's
/// `cos`/`sin`.
pub fn latent_entry(
    kv_a: &[f32],
    kv_lora_rank: usize,
    eps: f32,
    rotation: StageRotation,
    (cos, sin): (&[f32], &[f32]),
) -> Vec<f32> {
    let (latent, rope) = kv_a.split_at(kv_lora_rank);
    let mean_square = (dot64(latent, latent) / kv_lora_rank as f64) as f32;
    let inv = 1.0 / (mean_square + eps).sqrt();
    let mut rope = rope.to_vec();
    rotation.apply(&mut rope, cos, sin);
    cache_entry(&latent.iter().map(|&c| c * inv).collect::<Vec<_>>(), &rope)
}

/// One decode token's attention output `[heads, v_head_dim]` (before `o_proj`) over `cache`
/// (`[len, kv_lora_rank + qk_rope_head_dim]`, [`cache_entry`] per position): `q` is
/// `[heads, nope + rope]` after RoPE, as the reference forms it. Computed absorbed: the
/// query's nope part is taken into the latent space by `W_UK_h^T`, the probabilities weight
/// the latents, and `W_UV_h` maps their sum to the value head.
pub fn absorbed_attention(kv_b: &KvB<'_>, q: &[f32], cache: &[f32], scale: f32) -> Vec<f32> {
    let (nope, v, lora) = kv_b.dims();
    let rope = kv_b.mla.qk_rope_head_dim as usize;
    let (qk, width) = (nope + rope, lora + rope);
    let mut out = Vec::with_capacity(kv_b.heads * v);
    for h in 0..kv_b.heads {
        let qh = &q[h * qk..(h + 1) * qk];
        // W_UK_h^T q_nope: a latent-space query, `[kv_lora_rank | rope]` like a cache entry.
        let mut q_latent = vec![0f64; lora];
        for (i, &qi) in qh[..nope].iter().enumerate() {
            for (acc, &w) in q_latent.iter_mut().zip(kv_b.uk_row(h, i)) {
                *acc += f64::from(qi) * f64::from(w);
            }
        }
        let q_entry: Vec<f32> =
            q_latent.iter().map(|&x| x as f32).chain(qh[nope..].iter().copied()).collect();
        let scores: Vec<f32> =
            cache.chunks(width).map(|entry| dot64(&q_entry, entry) as f32 * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|&s| (s - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        // sum_j p_j c_j: the latent the value head is read from.
        let mut latent = vec![0f64; lora];
        for (entry, &ej) in cache.chunks(width).zip(&e) {
            let p = f64::from(ej / sum);
            for (acc, &c) in latent.iter_mut().zip(&entry[..lora]) {
                *acc += p * f64::from(c);
            }
        }
        let latent: Vec<f32> = latent.iter().map(|&x| x as f32).collect();
        out.extend((0..v).map(|i| dot64(kv_b.uv_row(h, i), &latent) as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random value in [-1, 1).
    fn value(seed: u64, i: usize) -> f32 {
        let mut z = seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn values(seed: u64, n: usize) -> Vec<f32> {
        (0..n).map(|i| value(seed, i)).collect()
    }

    /// transformers' rotation of a rope part (`RopeStyle`), by hand.
    fn rotate_as_transformers(style: RopeStyle, x: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let half = x.len() / 2;
        let halves = |d: &[f32]| {
            let mut out = d.to_vec();
            for i in 0..half {
                out[i] = d[i] * cos[i] - d[i + half] * sin[i];
                out[i + half] = d[i + half] * cos[i] + d[i] * sin[i];
            }
            out
        };
        match style {
            RopeStyle::NeoxRotateHalf => halves(x),
            RopeStyle::DeinterleaveRotateHalf => {
                let d: Vec<f32> =
                    (0..half).map(|i| x[2 * i]).chain((0..half).map(|i| x[2 * i + 1])).collect();
                halves(&d)
            }
            RopeStyle::ComplexPairs => {
                let mut out = x.to_vec();
                for i in 0..half {
                    out[2 * i] = x[2 * i] * cos[i] - x[2 * i + 1] * sin[i];
                    out[2 * i + 1] = x[2 * i] * sin[i] + x[2 * i + 1] * cos[i];
                }
                out
            }
        }
    }

    /// The stage's form equals the model's: a cache of [`latent_entry`] rows (latent normed
    /// without `kv_a_layernorm`'s weight, rope key rotated by [`StageRotation`]) and
    /// [`absorbed_attention`] over [`fold_latent_norm`]'s `kv_b_proj`, against every head's
    /// expanded key and value from the weighted latent, rotated as transformers does, for
    /// each rope layout.
    #[test]
    fn stage_form_equals_expanded() {
        let mla = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: 16,
            qk_nope_head_dim: 8,
            qk_rope_head_dim: 6,
            v_head_dim: 4,
        };
        let (heads, len, scale, eps) = (2, 6, 0.4f32, 1e-6f32);
        let (nope, rope, v, lora) = (8, 6, 4, 16);
        let weight = values(3, heads * (nope + v) * lora);
        let g: Vec<f32> = values(4, lora).iter().map(|x| 1.0 + 0.5 * x).collect();
        let folded = fold_latent_norm(&weight, &g);
        let kv_a: Vec<Vec<f32>> = (0..len).map(|j| values(20 + j as u64, lora + rope)).collect();
        // Position j's cos/sin; the query is the newest position's.
        let table = |j: usize| -> (Vec<f32>, Vec<f32>) {
            let f: Vec<f32> = (0..rope / 2).map(|i| j as f32 * 0.7f32.powi(i as i32)).collect();
            (f.iter().map(|x| x.cos()).collect(), f.iter().map(|x| x.sin()).collect())
        };
        let q_raw = values(5, heads * (nope + rope));
        for style in
            [RopeStyle::NeoxRotateHalf, RopeStyle::DeinterleaveRotateHalf, RopeStyle::ComplexPairs]
        {
            let rotation = StageRotation::of(style);
            let (qc, qs) = table(len - 1);
            // The stage: the query's rope part rotated in place, the cache of latent entries.
            let mut q = q_raw.clone();
            for qh in q.chunks_mut(nope + rope) {
                rotation.apply(&mut qh[nope..], &qc, &qs);
            }
            let cache: Vec<f32> = kv_a
                .iter()
                .enumerate()
                .flat_map(|(j, e)| {
                    let (c, s) = table(j);
                    latent_entry(e, lora, eps, rotation, (&c, &s))
                })
                .collect();
            let kv_b = KvB { weight: &folded, heads, mla };
            let got = absorbed_attention(&kv_b, &q, &cache, scale);

            // The model: the latent normed with g, every head's key and value expanded.
            let plain = KvB { weight: &weight, heads, mla };
            let latents: Vec<Vec<f32>> = kv_a
                .iter()
                .map(|e| {
                    let c = &e[..lora];
                    let inv = 1.0 / ((dot64(c, c) / lora as f64) as f32 + eps).sqrt();
                    c.iter().zip(&g).map(|(&x, &w)| x * inv * w).collect()
                })
                .collect();
            for h in 0..heads {
                let qh = &q_raw[h * (nope + rope)..(h + 1) * (nope + rope)];
                let q_full: Vec<f32> = qh[..nope]
                    .iter()
                    .copied()
                    .chain(rotate_as_transformers(style, &qh[nope..], &qc, &qs))
                    .collect();
                let scores: Vec<f32> = (0..len)
                    .map(|j| {
                        let (c, s) = table(j);
                        let k: Vec<f32> = (0..nope)
                            .map(|i| dot64(plain.uk_row(h, i), &latents[j]) as f32)
                            .chain(rotate_as_transformers(style, &kv_a[j][lora..], &c, &s))
                            .collect();
                        dot64(&q_full, &k) as f32 * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|&s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                for d in 0..v {
                    let want: f32 = (0..len)
                        .map(|j| dot64(plain.uv_row(h, d), &latents[j]) as f32 * e[j] / sum)
                        .sum();
                    let have = got[h * v + d];
                    assert!(
                        (have - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{style:?} head {h} dim {d}: {have} {want}"
                    );
                }
            }
        }
    }

    /// The absorbed form equals attention over every head's expanded key
    /// `[W_UK_h c_j | r_j]` and value `W_UV_h c_j` (what the reference caches), for a
    /// `kv_b_proj` laid out as shipped; only the summation order differs.
    #[test]
    fn absorbed_equals_expanded() {
        let mla = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: 24,
            qk_nope_head_dim: 8,
            qk_rope_head_dim: 4,
            v_head_dim: 6,
        };
        let (heads, len, scale) = (3, 5, 0.3f32);
        let (nope, rope, v, lora) = (8, 4, 6, 24);
        let weight = values(1, heads * (nope + v) * lora);
        let kv_b = KvB { weight: &weight, heads, mla };
        let q = values(2, heads * (nope + rope));
        let latents: Vec<Vec<f32>> = (0..len).map(|j| values(10 + j as u64, lora)).collect();
        let ropes: Vec<Vec<f32>> = (0..len).map(|j| values(100 + j as u64, rope)).collect();
        let cache: Vec<f32> =
            latents.iter().zip(&ropes).flat_map(|(c, r)| cache_entry(c, r)).collect();
        assert_eq!(cache.len(), len * mla.latent_cache_width() as usize);
        let got = absorbed_attention(&kv_b, &q, &cache, scale);

        for h in 0..heads {
            let qh = &q[h * (nope + rope)..(h + 1) * (nope + rope)];
            let keys: Vec<Vec<f32>> = latents
                .iter()
                .zip(&ropes)
                .map(|(c, r)| {
                    let mut k: Vec<f32> =
                        (0..nope).map(|i| dot64(kv_b.uk_row(h, i), c) as f32).collect();
                    k.extend_from_slice(r);
                    k
                })
                .collect();
            let vals: Vec<Vec<f32>> = latents
                .iter()
                .map(|c| (0..v).map(|i| dot64(kv_b.uv_row(h, i), c) as f32).collect())
                .collect();
            let scores: Vec<f32> = keys.iter().map(|k| dot64(qh, k) as f32 * scale).collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|&s| (s - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            for d in 0..v {
                let want: f32 = vals.iter().zip(&e).map(|(val, &ej)| val[d] * ej / sum).sum();
                let have = got[h * v + d];
                assert!(
                    (have - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{h} {d}: {have} {want}"
                );
            }
        }
    }
}
