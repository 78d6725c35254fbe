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

use crate::moe::dot64;
use crate::spec::MlaSpec;

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
