//! Test cases for the registry: per kernel, random inputs for given parameters and the
//! reference outputs for those inputs ([`crate::reference`] does the math).
//!
//! Each kernel has a module here with
//! - `inputs(&Params, seed) -> Vec<HostArray>`: scalar-prefetch arrays then inputs, in the
//!   kernel's operand order, random (never all zero) and within the kernel's constraints;
//! - `reference(&Params, &[HostArray]) -> Vec<HostArray>`: the outputs, in order.
//!
//! and `entry!(kernel, "...", cases::kernel)` in `lib.rs` hooks it into the registry.

use crate::reference::{self as r, Rng};
use palladium_array::{DType, HostArray, f32_to_bf16};

pub mod matmul {
    use super::*;
    use crate::matmul::Params;
    use palladium_dsl::DType;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![bf16_array(&mut rng, &[p.m, p.k], 1.0), bf16_array(&mut rng, &[p.k, p.n], 1.0)]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let shape = [p.m, p.n];
        match p.out_dtype {
            DType::F32 => vec![HostArray::from_f32(
                &shape,
                &r::matmul_f32(&x[0].to_f32(), &x[1].to_f32(), p.m, p.k, p.n),
            )],
            _ => vec![HostArray::bf16_from_f32(
                &shape,
                &r::matmul(&x[0].to_f32(), &x[1].to_f32(), p.m, p.k, p.n),
            )],
        }
    }
}

pub mod rmsnorm {
    use super::*;
    use crate::rmsnorm::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![
            bf16_array(&mut rng, &[p.rows, p.hidden], 1.0),
            bf16_array(&mut rng, &[1, p.hidden], 1.0),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::bf16_from_f32(
            &[p.rows, p.hidden],
            &r::rmsnorm(&x[0].to_f32(), &x[1].to_f32(), p.rows, p.hidden, p.eps as f32),
        )]
    }
}

pub mod gather_rows {
    use super::*;
    use crate::gather_rows::Params;

    /// `ids`: distinct while `n <= table_rows` (a prefix of a permutation), then repeating
    /// that permutation; all in range.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let perm = rng.permutation(p.table_rows);
        let ids: Vec<i32> = (0..p.n).map(|i| perm[i % p.table_rows.max(1)]).collect();
        vec![
            HostArray::from_i32(&[p.n], &ids),
            bf16_array(&mut rng, &[p.table_rows, p.r, p.d], 1.0),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::bf16_from_f32(
            &[p.n, p.r, p.d],
            &r::gather_rows(&x[0].to_i32(), &x[1].to_f32(), p.r, p.d, p.scale as f32),
        )]
    }
}

pub mod decode_attention {
    use super::*;
    use crate::decode_attention::Params;

    /// `lens` in `1..=max_context`, not all multiples of `block_kv` (a partial last tile is
    /// always exercised when `block_kv > 1`); all `max_context` with `bench_full_context`.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let mut lens: Vec<i32> =
            (0..p.batch).map(|_| rng.range(1, p.max_context as i64) as i32).collect();
        let bkv = p.block_kv as i32;
        if p.bench_full_context {
            // The benchmark variant attends to every position whatever `lens` says.
            lens = vec![p.max_context as i32; p.batch];
        } else if bkv > 1 && lens.iter().all(|l| l % bkv == 0) {
            lens[0] -= 1;
        }
        let q = [p.batch, p.kv_heads, p.group, p.head_dim];
        let kv = [p.batch, p.kv_heads, p.max_context, p.head_dim];
        vec![
            HostArray::from_i32(&[p.batch], &lens),
            bf16_array(&mut rng, &q, 1.0),
            bf16_array(&mut rng, &kv, 1.0),
            bf16_array(&mut rng, &kv, 1.0),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let s = r::AttentionShape {
            batch: p.batch,
            kv_heads: p.kv_heads,
            group: p.group,
            head_dim: p.head_dim,
            max_context: p.max_context,
        };
        let o =
            r::decode_attention(&x[0].to_i32(), &x[1].to_f32(), &x[2].to_f32(), &x[3].to_f32(), s);
        vec![HostArray::bf16_from_f32(&[p.batch, p.kv_heads, p.group, p.head_dim], &o)]
    }
}

pub mod mla_decode_attention {
    use super::*;
    use crate::body::LatentRow;
    use crate::mla_decode_attention::Params;
    use palladium_model::mla::{KvB, absorbed_attention};
    use palladium_model::spec::MlaSpec;

    /// `lens` in `1..=max_context`, a partial last tile exercised as `decode_attention`'s;
    /// the latent and the rope parts random on their `rank` and `rope` lanes and zero past
    /// them (the [`LatentRow`] layout's padding); `kv_b` scaled by `1 / sqrt(nope)` so the
    /// absorbed query is `O(1)`.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let mut lens: Vec<i32> =
            (0..p.batch).map(|_| rng.range(1, p.max_context as i64) as i32).collect();
        let bkv = p.block_kv as i32;
        if bkv > 1 && lens.iter().all(|l| l % bkv == 0) {
            lens[0] -= 1;
        }
        // `rows` rows of `lanes` values: the lanes of the `(start, end)` runs in `dense`
        // random, the rest zero padding.
        let padded = |rows: usize, dense: &[(usize, usize)], lanes: usize, rng: &mut Rng| {
            let mut values = vec![0f32; rows * lanes];
            for row in values.chunks_mut(lanes) {
                for v in dense.iter().flat_map(|&(start, end)| start..end) {
                    row[v] = rng.unit();
                }
            }
            values
        };
        let q_rope = padded(p.batch * p.heads, &[(0, p.rope)], 128, &mut rng);
        let row = LatentRow { rank: p.rank as u64 };
        let lat = row.latent_lanes() as usize;
        let cache = padded(
            p.batch * p.max_context,
            &[(0, p.rank), (lat, lat + p.rope)],
            row.width() as usize,
            &mut rng,
        );
        vec![
            HostArray::from_i32(&[p.batch], &lens),
            bf16_array(&mut rng, &[p.batch, p.heads, p.nope], 1.0),
            HostArray::bf16_from_f32(&[p.batch, p.heads, 128], &q_rope),
            bf16_array(&mut rng, &[p.heads * (p.nope + p.v_dim), p.rank], fan_in_scale(p.nope)),
            HostArray::bf16_from_f32(&[p.batch, p.max_context, row.width() as usize], &cache),
        ]
    }

    /// [`absorbed_attention`], the model crate's algebra, per sequence over its first
    /// `lens[b]` cache rows (the latent's and the rope key's padding lanes dropped), rounded
    /// to bf16.
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let (lens, q_nope, q_rope, kv_b, cache) =
            (x[0].to_i32(), x[1].to_f32(), x[2].to_f32(), x[3].to_f32(), x[4].to_f32());
        let mla = MlaSpec {
            q_lora_rank: None,
            kv_lora_rank: p.rank as u64,
            qk_nope_head_dim: p.nope as u64,
            qk_rope_head_dim: p.rope as u64,
            v_head_dim: p.v_dim as u64,
        };
        let kv_b = KvB { weight: &kv_b, heads: p.heads, mla };
        let row = LatentRow { rank: p.rank as u64 };
        let (width, lat) = (row.width() as usize, row.latent_lanes() as usize);
        let mut out = Vec::with_capacity(p.batch * p.heads * p.v_dim);
        for (b, &len) in lens.iter().enumerate() {
            let q: Vec<f32> = (0..p.heads)
                .flat_map(|h| {
                    let row = b * p.heads + h;
                    q_nope[row * p.nope..(row + 1) * p.nope]
                        .iter()
                        .chain(&q_rope[row * 128..row * 128 + p.rope])
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            let rows: Vec<f32> = (0..len as usize)
                .flat_map(|j| {
                    let at = (b * p.max_context + j) * width;
                    [&cache[at..at + p.rank], &cache[at + lat..at + lat + p.rope]].concat()
                })
                .collect();
            out.extend(absorbed_attention(&kv_b, &q, &rows, p.scale as f32));
        }
        vec![HostArray::bf16_from_f32(&[p.batch, p.heads, p.v_dim], &out)]
    }
}

pub mod kv_cache_update {
    use super::*;
    use crate::kv_cache_update::Params;

    /// Positions in `0..max_context`, arbitrary (not tile-aligned; the first sequence's is
    /// odd whenever `max_context > 1`, so a row inside a (16, 128) bf16 tile is always
    /// written); random caches, so a wrong or missing row and any clobbered neighbour show.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let mut positions: Vec<i32> =
            (0..p.batch).map(|_| rng.range(0, p.max_context as i64 - 1) as i32).collect();
        if p.max_context > 1 && positions[0] % 2 == 0 {
            positions[0] += if positions[0] + 1 < p.max_context as i32 { 1 } else { -1 };
        }
        let new = [p.batch, p.kv_heads, p.head_dim];
        let cache = [p.batch, p.kv_heads, p.max_context, p.head_dim];
        vec![
            HostArray::from_i32(&[p.batch], &positions),
            bf16_array(&mut rng, &new, 1.0),
            bf16_array(&mut rng, &new, 1.0),
            bf16_array(&mut rng, &cache, 1.0),
            bf16_array(&mut rng, &cache, 1.0),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let cache = [p.batch, p.kv_heads, p.max_context, p.head_dim];
        let update = |new: &HostArray, old: &HostArray| {
            r::kv_cache_update(
                &x[0].to_i32(),
                &new.to_f32(),
                &old.to_f32(),
                p.kv_heads,
                p.max_context,
                p.head_dim,
            )
        };
        vec![
            HostArray::bf16_from_f32(&cache, &update(&x[1], &x[3])),
            HostArray::bf16_from_f32(&cache, &update(&x[2], &x[4])),
        ]
    }
}

pub mod flash_attention {
    use super::*;
    use crate::flash_attention::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let q = [p.batch, p.heads, p.seq_q, p.head_dim];
        let kv = [p.batch, p.heads, p.seq_k, p.head_dim];
        vec![
            bf16_array(&mut rng, &q, 1.0),
            bf16_array(&mut rng, &kv, 1.0),
            bf16_array(&mut rng, &kv, 1.0),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let s = r::FlashShape {
            heads: p.batch * p.heads,
            seq_q: p.seq_q,
            seq_k: p.seq_k,
            head_dim: p.head_dim,
            causal: p.causal,
        };
        let o = r::flash_attention(&x[0].to_f32(), &x[1].to_f32(), &x[2].to_f32(), s);
        vec![HostArray::bf16_from_f32(&[p.batch, p.heads, p.seq_q, p.head_dim], &o)]
    }
}

/// A bf16 array of `shape` holding `rng.unit() * scale` (in `[-scale, scale)`, never zero)
/// rounded once, written straight into the array's bytes: the same bits as
/// `HostArray::bf16_from_f32` of the scaled `Rng::f32s` (or of `Rng::bf16s` at scale 1),
/// without the f32 vectors (the MoE kernels' weights are GiB-sized at their defaults, and
/// the copies took most of the registry tests' time).
fn bf16_array(rng: &mut Rng, shape: &[usize], scale: f32) -> HostArray {
    let n: usize = shape.iter().product();
    let mut bytes = Vec::with_capacity(2 * n);
    for _ in 0..n {
        bytes.extend_from_slice(&f32_to_bf16(rng.unit() * scale).to_ne_bytes());
    }
    HostArray::new(DType::Bf16, shape, bytes).expect("the shape holds the bytes")
}

/// `1 / sqrt(fan_in)`: keeps a dot product over `fan_in` uniform inputs at `O(1)`.
fn fan_in_scale(fan_in: usize) -> f32 {
    1.0 / (fan_in.max(1) as f32).sqrt()
}

pub mod moe_router {
    use super::*;
    use crate::moe_reference as moe;
    use crate::moe_router::Params;
    use moe::{RouterScoring, TopKWeights};

    /// `w_router` scaled by `1 / sqrt(hidden)` so the logits are `O(1)` and the softmax is
    /// not one-hot (with unscaled inputs the logits' spread is ~15 and every slot past the
    /// first weighs ~0): the selected weights then all matter, and near-ties stay far
    /// apart compared with f32 accumulation-order differences (ids must match exactly).
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![
            bf16_array(&mut rng, &[p.tokens, p.hidden], 1.0),
            bf16_array(&mut rng, &[p.hidden, p.experts], fan_in_scale(p.hidden)),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let (ids, weights) = moe::moe_router(
            &x[0].to_f32(),
            &x[1].to_f32(),
            p.tokens,
            p.hidden,
            p.experts,
            p.top_k,
            if p.sigmoid { RouterScoring::Sigmoid } else { RouterScoring::Softmax },
            if p.renormalize { TopKWeights::Renormalized } else { TopKWeights::Raw },
        );
        vec![
            HostArray::from_i32(&[p.tokens, p.top_k], &ids),
            HostArray::from_f32(&[p.tokens, p.top_k], &weights),
        ]
    }
}

/// The expert kernels' routing and activations: per token `top_k` distinct expert ids (a
/// prefix of a random permutation of the experts; flattened `[tokens * top_k]`), positive
/// weights summing to 1 (`[tokens, top_k]`), and bf16 activations `[tokens, hidden]`.
fn routed_tokens(
    rng: &mut Rng,
    tokens: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
) -> [HostArray; 3] {
    assert!(top_k <= experts, "expert cases: top_k {top_k} > experts {experts}");
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        ids.extend_from_slice(&rng.permutation(experts)[..top_k]);
        let w: Vec<f32> = (0..top_k).map(|_| rng.unit().abs()).collect();
        let total: f32 = w.iter().sum();
        weights.extend(w.into_iter().map(|v| v / total));
    }
    [
        HostArray::from_i32(&[tokens * top_k], &ids),
        HostArray::from_f32(&[tokens, top_k], &weights),
        bf16_array(rng, &[tokens, hidden], 1.0),
    ]
}

pub mod expert_ffn {
    use super::*;
    use crate::expert_ffn::Params;
    use crate::moe_reference as moe;

    /// Router-shaped routing: per token `top_k` distinct expert ids (a prefix of a random
    /// permutation of the experts) and positive weights summing to 1. Weights scaled by
    /// `1 / sqrt(fan_in)` (`hidden` for gate/up, `ffn` for down) so activations stay `O(1)`.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let [ids, weights, x] = routed_tokens(&mut rng, p.tokens, p.hidden, p.experts, p.top_k);
        let (e, h, f) = (p.experts, p.hidden, p.ffn);
        vec![
            ids,
            weights,
            x,
            bf16_array(&mut rng, &[e, h, f], fan_in_scale(h)),
            bf16_array(&mut rng, &[e, h, f], fan_in_scale(h)),
            bf16_array(&mut rng, &[e, f, h], fan_in_scale(f)),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let o = moe::expert_ffn(
            &x[2].to_f32(),
            &x[0].to_i32(),
            &x[1].to_f32(),
            &x[3].to_f32(),
            &x[4].to_f32(),
            &x[5].to_f32(),
            p.tokens,
            p.hidden,
            p.top_k,
            p.ffn,
        );
        vec![HostArray::bf16_from_f32(&[p.tokens, p.hidden], &o)]
    }
}

/// Grouped-matmul metadata for `m` rows in `groups` groups (scalar prefetch: offsets, visit
/// groups, visit m tiles, visit count) whose visits fill the kernel's `grid_visits` steps
/// ([`crate::gmm::visits`]): with the worst case (any routing), random group sizes
/// ([`random_group_sizes`]); with fewer, a routing of exactly that many visits, or of the
/// most these rows can make if fewer ([`group_sizes_with_visits`]). The metadata comes from
/// [`crate::moe_reference::group_metadata`].
fn grouped_rows(
    rng: &mut Rng,
    (m, groups, block_m): (usize, usize, usize),
    grid_visits: usize,
) -> [HostArray; 4] {
    let sizes = if grid_visits == m / block_m + groups - 1 {
        random_group_sizes(rng, m, groups)
    } else {
        group_sizes_with_visits(rng, (m, groups, block_m), grid_visits)
    };
    let (offsets, gids, tids, num) = crate::moe_reference::group_metadata(&sizes, m, block_m);
    let visits = gids.len();
    [
        HostArray::from_i32(&[groups + 1], &offsets),
        HostArray::from_i32(&[visits], &gids),
        HostArray::from_i32(&[visits], &tids),
        HostArray::from_i32(&[1], &[num]),
    ]
}

/// Random group sizes summing to exactly `m` (rows past the last offset are undefined in the
/// kernel, so every row belongs to a group), from `groups - 1` uniform cut points in
/// `0..=m`, sorted, so tiles straddle groups; with 3 or more groups, group 1 is forced empty
/// so the metadata's skipping of empty groups is always exercised.
fn random_group_sizes(rng: &mut Rng, m: usize, groups: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (1..groups).map(|_| rng.range(0, m as i64) as usize).collect();
    cuts.sort_unstable();
    if cuts.len() >= 2 {
        cuts[1] = cuts[0];
    }
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain(std::iter::once(m)).collect();
    bounds.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Group sizes summing to `m` whose metadata has exactly `visits` visits (at least
/// `m / block_m`: every tile is visited once, and each group boundary inside a tile adds a
/// visit), or as many as `m` rows allow. The `visits - m / block_m` boundaries are random
/// rows inside tiles; the non-empty groups a random sorted choice of groups (group 1 kept
/// empty when there is room, as in [`random_group_sizes`]).
fn group_sizes_with_visits(
    rng: &mut Rng,
    (m, groups, block_m): (usize, usize, usize),
    visits: usize,
) -> Vec<usize> {
    let mut inside: Vec<usize> = (1..m).filter(|r| r % block_m != 0).collect();
    let extra = (visits - m / block_m).min(inside.len());
    // The first `extra` of a random permutation of the rows inside tiles.
    for i in 0..extra {
        let j = rng.range(i as i64, inside.len() as i64 - 1) as usize;
        inside.swap(i, j);
    }
    let mut cuts = inside[..extra].to_vec();
    cuts.sort_unstable();
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain(std::iter::once(m)).collect();
    let mut candidates: Vec<usize> = (0..groups).collect();
    if groups >= 3 && extra + 1 < groups {
        candidates.remove(1);
    }
    let mut chosen: Vec<usize> = rng
        .permutation(candidates.len())
        .into_iter()
        .take(extra + 1)
        .map(|i| candidates[i as usize])
        .collect();
    chosen.sort_unstable();
    let mut sizes = vec![0; groups];
    for (g, w) in chosen.iter().zip(bounds.windows(2)) {
        sizes[*g] = w[1] - w[0];
    }
    sizes
}

/// `parts` (same dtype) one after the other as one array of `shape`.
fn stacked(parts: &[HostArray], shape: &[usize]) -> HostArray {
    HostArray::new(
        parts[0].dtype,
        shape,
        parts.iter().flat_map(|a| a.bytes.iter().copied()).collect(),
    )
    .expect("the parts fill the shape")
}

/// The f32 values of `count` standalone quantized `[k, n]` matrices stored one after the
/// other in `codes` (one byte per code) with their `[k / group, n]` f32 scales in `scales`,
/// dequantized (`code * scale`); `which` picks the matrices (by index) and their order.
fn dequantized(
    codes: &HostArray,
    scales: &HostArray,
    (k, n, group): (usize, usize, usize),
    which: impl Iterator<Item = usize>,
) -> Vec<f32> {
    let per = (k * n, k / group * n);
    which
        .flat_map(|b| {
            let codes = HostArray::new(
                codes.dtype,
                &[k, n],
                codes.bytes[b * per.0..(b + 1) * per.0].to_vec(),
            )
            .expect("one byte per code");
            let scales = HostArray::new(
                scales.dtype,
                &[k / group, n],
                scales.bytes[4 * b * per.1..4 * (b + 1) * per.1].to_vec(),
            )
            .expect("f32 scales");
            r::dequantize(&codes.to_f32(), &scales.to_f32(), k, n, group)
        })
        .collect()
}

pub mod grouped_matmul {
    use super::*;
    use crate::grouped_matmul::Params;
    use crate::moe_reference as moe;

    /// `grouped_rows`' metadata, bf16 rows and experts.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let visits = crate::gmm::visits(p.m, p.block_m, p.groups, p.num_tiles);
        let mut x = grouped_rows(&mut rng, (p.m, p.groups, p.block_m), visits).to_vec();
        x.push(bf16_array(&mut rng, &[p.m, p.k], 1.0));
        x.push(bf16_array(&mut rng, &[p.groups, p.k, p.n], 1.0));
        x
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::bf16_from_f32(
            &[p.m, p.n],
            &moe::grouped_matmul(&x[4].to_f32(), &x[5].to_f32(), &x[0].to_i32(), p.m, p.k, p.n),
        )]
    }
}

pub mod grouped_matmul_quantized {
    use super::*;
    use crate::grouped_matmul_quantized::Params;
    use crate::moe_reference as moe;

    /// `grouped_rows`' metadata and bf16 rows; per expert, `wdtype` codes `[k, n]` and
    /// their `[k / group, n]` scales (`quantized_weight`).
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let visits = crate::gmm::visits(p.m, p.block_m, p.groups, p.num_tiles);
        let mut x = grouped_rows(&mut rng, (p.m, p.groups, p.block_m), visits).to_vec();
        x.push(bf16_array(&mut rng, &[p.m, p.k], 1.0));
        let experts: Vec<[HostArray; 2]> = (0..p.groups)
            .map(|_| quantized_weight(&mut rng, p.wdtype, p.k, p.n, p.group))
            .collect();
        let (codes, scales): (Vec<HostArray>, Vec<HostArray>) =
            experts.into_iter().map(|[c, s]| (c, s)).unzip();
        x.push(stacked(&codes, &[p.groups, p.k, p.n]));
        x.push(stacked(&scales, &[p.groups, p.k / p.group, p.n]));
        x
    }

    /// `grouped_matmul`'s reference on the dequantized experts (every group's, empty ones
    /// included: the reference indexes experts by group).
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let rhs = dequantized(&x[5], &x[6], (p.k, p.n, p.group), 0..p.groups);
        vec![HostArray::bf16_from_f32(
            &[p.m, p.n],
            &moe::grouped_matmul(&x[4].to_f32(), &rhs, &x[0].to_i32(), p.m, p.k, p.n),
        )]
    }
}

pub mod gemv {
    use super::*;
    use crate::gemv::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![bf16_array(&mut rng, &[p.batch, p.k], 1.0), bf16_array(&mut rng, &[p.k, p.n], 1.0)]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::from_f32(
            &[p.batch, p.n],
            &r::gemv(&x[0].to_f32(), &x[1].to_f32(), p.batch, p.k, p.n),
        )]
    }
}

/// `residual_add` and `residual_add_inplace` share parameters, inputs and reference.
macro_rules! residual_cases {
    ($name:ident) => {
        pub mod $name {
            use super::*;
            use crate::$name::Params;

            pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
                let mut rng = Rng::new(seed);
                vec![
                    bf16_array(&mut rng, &[p.rows, p.hidden], 1.0),
                    bf16_array(&mut rng, &[p.rows, p.hidden], 1.0),
                ]
            }

            pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
                vec![HostArray::bf16_from_f32(
                    &[p.rows, p.hidden],
                    &r::residual_add(&x[0].to_f32(), &x[1].to_f32()),
                )]
            }
        }
    };
}
residual_cases!(residual_add);
residual_cases!(residual_add_inplace);

pub mod rmsnorm_matmul {
    use super::*;
    use crate::rmsnorm_matmul::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![
            bf16_array(&mut rng, &[p.rows, p.hidden], 1.0),
            bf16_array(&mut rng, &[1, p.hidden], 1.0),
            bf16_array(&mut rng, &[p.hidden, p.n], fan_in_scale(p.hidden)),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let o = r::rmsnorm_matmul(
            &x[0].to_f32(),
            &x[1].to_f32(),
            &x[2].to_f32(),
            p.rows,
            p.hidden,
            p.n,
            p.eps as f32,
        );
        vec![HostArray::bf16_from_f32(&[p.rows, p.n], &o)]
    }
}

pub mod rope {
    use super::*;
    use crate::rope::Params;

    /// Real rotary tables: a random position per token, `inv_freq[i] = 10000^(-2i/d)`,
    /// expanded to the full head dim in the style's order (neox `j % (d/2)`, interleaved
    /// `j / 2`), as the kernel's doc specifies.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let d = p.head_dim;
        let x = rng.bf16s(p.tokens * p.heads * d);
        let (mut cos, mut sin) =
            (Vec::with_capacity(p.tokens * d), Vec::with_capacity(p.tokens * d));
        for _ in 0..p.tokens {
            let pos = rng.range(0, 8191) as f64;
            for j in 0..d {
                let i = if p.interleaved { j / 2 } else { j % (d / 2) };
                let angle = pos * 10000f64.powf(-2.0 * i as f64 / d as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        vec![
            HostArray::bf16_from_f32(&[p.tokens, p.heads * d], &x),
            HostArray::from_f32(&[p.tokens, d], &cos),
            HostArray::from_f32(&[p.tokens, d], &sin),
        ]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let o = r::rope(
            &x[0].to_f32(),
            &x[1].to_f32(),
            &x[2].to_f32(),
            p.tokens,
            p.heads,
            p.head_dim,
            p.interleaved,
        );
        vec![HostArray::bf16_from_f32(&[p.tokens, p.heads * p.head_dim], &o)]
    }
}

/// A quantized weight's operands for the `*_quantized` kernels: random `wdtype` codes
/// `[k, n]` over the format's whole range (i8 `-127..=127`, i4 `-8..=7`, every finite
/// f8e4m3fn byte) and positive f32 scales `[k / group, n]` that keep a product over `k`
/// inputs at `O(1)`.
fn quantized_weight(
    rng: &mut Rng,
    wdtype: palladium_dsl::DType,
    k: usize,
    n: usize,
    group: usize,
) -> [HostArray; 2] {
    use palladium_dsl::DType;
    let (codes, code_max) = match wdtype {
        DType::I8 => (
            HostArray::from_i32_values(
                DType::I8,
                &[k, n],
                &(0..k * n).map(|_| rng.range(-127, 127) as i32).collect::<Vec<_>>(),
            ),
            127.0,
        ),
        DType::I4 => (
            HostArray::from_i32_values(
                DType::I4,
                &[k, n],
                &(0..k * n).map(|_| rng.range(-8, 7) as i32).collect::<Vec<_>>(),
            ),
            8.0,
        ),
        _ => {
            // The 254 finite bytes: 0x7F and 0xFF are e4m3fn's NaNs.
            let bytes = (0..k * n)
                .map(|_| rng.range(0, 0xFD) as u8)
                .map(|b| if b >= 0x7F { b + 1 } else { b })
                .collect();
            (HostArray::new(DType::F8E4M3, &[k, n], bytes), 448.0)
        }
    };
    let codes = codes.expect("codes of a quantized weight dtype");
    let scales: Vec<f32> =
        (0..k / group * n).map(|_| (1.5 + rng.unit()) * fan_in_scale(k) / code_max).collect();
    [codes, HostArray::from_f32(&[k / group, n], &scales)]
}

pub mod gemv_quantized {
    use super::*;
    use crate::gemv_quantized::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let x = bf16_array(&mut rng, &[p.batch, p.k], 1.0);
        let [codes, scales] = quantized_weight(&mut rng, p.wdtype, p.k, p.n, p.group);
        vec![x, codes, scales]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let w = r::dequantize(&x[1].to_f32(), &x[2].to_f32(), p.k, p.n, p.group);
        vec![HostArray::from_f32(&[p.batch, p.n], &r::gemv(&x[0].to_f32(), &w, p.batch, p.k, p.n))]
    }
}

pub mod matmul_quantized {
    use super::*;
    use crate::matmul_quantized::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let x = bf16_array(&mut rng, &[p.m, p.k], 1.0);
        let [codes, scales] = quantized_weight(&mut rng, p.wdtype, p.k, p.n, p.group);
        vec![x, codes, scales]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let w = r::dequantize(&x[1].to_f32(), &x[2].to_f32(), p.k, p.n, p.group);
        vec![HostArray::bf16_from_f32(&[p.m, p.n], &r::matmul(&x[0].to_f32(), &w, p.m, p.k, p.n))]
    }
}

pub mod rmsnorm_matmul_quantized {
    use super::*;
    use crate::rmsnorm_matmul_quantized::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let x = bf16_array(&mut rng, &[p.rows, p.hidden], 1.0);
        let norm_w = bf16_array(&mut rng, &[1, p.hidden], 1.0);
        let [codes, scales] = quantized_weight(&mut rng, p.wdtype, p.hidden, p.n, p.group);
        vec![x, norm_w, codes, scales]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let w = r::dequantize(&x[2].to_f32(), &x[3].to_f32(), p.hidden, p.n, p.group);
        let o = r::rmsnorm_matmul(
            &x[0].to_f32(),
            &x[1].to_f32(),
            &w,
            p.rows,
            p.hidden,
            p.n,
            p.eps as f32,
        );
        vec![HostArray::bf16_from_f32(&[p.rows, p.n], &o)]
    }
}

pub mod expert_ffn_quantized {
    use super::*;
    use crate::expert_ffn_quantized::Params;
    use crate::moe_reference as moe;

    /// `expert_ffn`'s routing and activations; per expert, gate/up codes `[hidden, ffn]` with
    /// scales `[hidden / group, ffn]`, and down codes cut into `ffn / block_ffn` chunks
    /// `[block_ffn, hidden]`, each with its own `[block_ffn / down_group, hidden]` scales.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        let [ids, weights, x] = routed_tokens(&mut rng, p.tokens, p.hidden, p.experts, p.top_k);
        let (e, h, f, bf) = (p.experts, p.hidden, p.ffn, p.block_ffn);
        let mut projection = |k: usize, n: usize, group: usize, blocks: usize| -> [HostArray; 2] {
            let parts: Vec<[HostArray; 2]> = (0..e * blocks)
                .map(|_| quantized_weight(&mut rng, p.wdtype, k, n, group))
                .collect();
            let codes: Vec<HostArray> = parts.iter().map(|[c, _]| c.clone()).collect();
            let scales: Vec<HostArray> = parts.iter().map(|[_, s]| s.clone()).collect();
            [stacked(&codes, &[e, k * blocks, n]), stacked(&scales, &[e, blocks, k / group, n])]
        };
        let [gate, s_gate] = projection(h, f, p.group, 1);
        let [up, s_up] = projection(h, f, p.group, 1);
        let [down, s_down] = projection(bf, h, p.down_group, f / bf);
        let flat = |a: HostArray, shape: &[usize]| HostArray { shape: shape.to_vec(), ..a };
        vec![
            ids,
            weights,
            x,
            gate,
            up,
            down,
            flat(s_gate, &[e, h / p.group, f]),
            flat(s_up, &[e, h / p.group, f]),
            s_down,
        ]
    }

    /// `expert_ffn`'s reference on the dequantized weights of the routed experts only (the
    /// ids renumbered over them: the defaults' 128 experts would be several GiB of f32).
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        let (h, f, bf) = (p.hidden, p.ffn, p.block_ffn);
        let ids = x[0].to_i32();
        let mut used: Vec<i32> = Vec::new();
        let local: Vec<i32> = ids
            .iter()
            .map(|&e| match used.iter().position(|&u| u == e) {
                Some(i) => i as i32,
                None => {
                    used.push(e);
                    used.len() as i32 - 1
                }
            })
            .collect();
        // An expert's projection is `blocks` standalone quantized `[k, n]` matrices.
        let routed = |codes: &HostArray, k: usize, n: usize| {
            let blocks = codes.len() / (k * n * p.experts);
            used.iter().flat_map(move |&e| (0..blocks).map(move |b| e as usize * blocks + b))
        };
        let gate = dequantized(&x[3], &x[6], (h, f, p.group), routed(&x[3], h, f));
        let up = dequantized(&x[4], &x[7], (h, f, p.group), routed(&x[4], h, f));
        let down = dequantized(&x[5], &x[8], (bf, h, p.down_group), routed(&x[5], bf, h));
        let o = moe::expert_ffn(
            &x[2].to_f32(),
            &local,
            &x[1].to_f32(),
            &gate,
            &up,
            &down,
            p.tokens,
            h,
            p.top_k,
            f,
        );
        vec![HostArray::bf16_from_f32(&[p.tokens, h], &o)]
    }
}

/// The mesh collectives' cases: every input and output is the `n` devices' operands stacked
/// on dim 0 (device order), as [`crate::KernelEntry`] documents for mesh kernels.
///
/// `devices` operands of `rows x cols` random bf16 values, stacked.
fn device_operands(seed: u64, devices: usize, rows: usize, cols: usize) -> HostArray {
    HostArray::bf16_from_f32(&[devices * rows, cols], &Rng::new(seed).bf16s(devices * rows * cols))
}

/// The sum over `p.n` devices of their stacked operands `x` (`[n * n * rows, cols]`) in the
/// ring's order and roundings ([`r::ring_reduce_sum`]): each device's share of a
/// reduce-scatter, the whole of an all-reduce; `bidirectional` sends the second half of the
/// columns the other way round (`body::collective::directions`).
fn ring_sum(x: &HostArray, n: usize, rows: usize, cols: usize, bidirectional: bool) -> HostArray {
    let dirs: Vec<i64> =
        (0..cols).map(|c| if bidirectional && c >= cols / 2 { -1 } else { 1 }).collect();
    HostArray::bf16_from_f32(&[n * rows, cols], &r::ring_reduce_sum(&x.to_f32(), n, rows, &dirs))
}

pub mod permute {
    use super::*;
    use crate::permute::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        let mut rng = Rng::new(seed);
        vec![HostArray::from_f32(&[p.n * p.rows, p.cols], &rng.f32s(p.n * p.rows * p.cols))]
    }

    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::from_f32(
            &[p.n * p.rows, p.cols],
            &r::ring_permute(&x[0].to_f32(), p.n, p.shift),
        )]
    }
}

pub mod all_gather {
    use super::*;
    use crate::all_gather::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        vec![device_operands(seed, p.n, p.rows, p.cols)]
    }

    /// Every device's output is every device's operand, in device order.
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![HostArray::stack_leading(&vec![x[0].clone(); p.n]).expect("copies of one array stack")]
    }
}

pub mod reduce_scatter {
    use super::*;
    use crate::reduce_scatter::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        vec![device_operands(seed, p.n, p.n * p.rows, p.cols)]
    }

    /// Device `i`'s output is row block `i` of the sum over devices, so the stacked outputs
    /// are the whole sum.
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![ring_sum(&x[0], p.n, p.rows, p.cols, false)]
    }
}

pub mod all_reduce {
    use super::*;
    use crate::all_reduce::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostArray> {
        vec![device_operands(seed, p.n, p.n * p.rows, p.cols)]
    }

    /// Every device's output is the sum over devices.
    pub fn reference(p: &Params, x: &[HostArray]) -> Vec<HostArray> {
        vec![
            HostArray::stack_leading(&vec![
                ring_sum(&x[0], p.n, p.rows, p.cols, p.bidirectional);
                p.n
            ])
            .expect("copies of one array stack"),
        ]
    }
}
