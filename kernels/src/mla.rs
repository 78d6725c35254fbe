//! Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) for decode, absorbed, over a
//! latent KV cache: the algebra of `palladium_model::mla` (`docs/deepseek.md`) as a kernel.
//!
//! The cache holds, per sequence and position, one row `[latent (rank) | rope key]`
//! ([`LatentRow`]): the latent in whole 128-lane tiles (zero past `rank`: the tiny
//! checkpoints' rank of 64 pads to 128), the rope key in a 128-lane block of its own
//! (`rope <= 128` values, zero past them): 640 lanes for DeepSeek-V3's 512 + 64, against
//! every head's K and V expanded. One grid step per
//! sequence, all heads at once:
//! 1. the query's nope part is taken into the latent space, `q_lat_h = q_nope_h W_UK_h`,
//!    with `W_UK_h` head `h`'s first `nope` rows of `kv_b` (`kv_b_proj.weight` as shipped,
//!    `[heads * (nope + v_dim), rank]`, read in place: no re-exported checkpoint);
//! 2. `[q_lat | q_rope]` attends to the cache's rows as one multi-query head whose key is
//!    the whole row and whose value is the row too (the latent doubles as the value): K/V
//!    tiles of `block_kv` positions streamed by manual DMAs through a two-slot ring, online
//!    softmax ([`crate::body::OnlineSoftmax`], the GQA kernels' own);
//! 3. the output's latent lanes go through `W_UV_h` (the next `v_dim` rows of `kv_b`):
//!    `o_h = W_UV_h (sum_j p_hj c_j)`.
//!
//! Each head's product is computed for every head's rows and the head's own row kept (a
//! masked select): the MXU pads a step's few rows to its tile anyway, and no row is sliced
//! at an unaligned sublane. The query's rope part comes rotated (RoPE is the caller's: its
//! layout is the model's, see `palladium_model::mla::StageRotation`), zero past `rope`; the
//! softmax scale (`qk_head_dim^-0.5`, times YaRN's correction where the model has one) is a
//! parameter.

use crate::body::{KvMask, LatentRow, OnlineSoftmax};
use palladium_dsl::build::{Drain, eq, pipeline, range};
use palladium_dsl::prelude::*;

#[kernel(
    grid = (batch,),
    semantics = (arbitrary,),
    requires = [max_context % block_kv == 0, rope % 2 == 0, rope <= 128, (nope + v_dim) % 16 == 0]
)]
pub fn mla_decode_attention(
    #[default(2)] batch: usize,
    #[default(16)] heads: usize,
    #[default(128)] nope: usize,
    #[default(64)] rope: usize,
    #[default(128)] v_dim: usize,
    #[default(512)] rank: usize,
    #[default(1024)] max_context: usize,
    #[default(256)] block_kv: usize,
    #[default(0.07216878364870323)] scale: f64,
    #[prefetch(i32[batch], range = 1..=max_context)] lens: Ref,
    #[input(bf16[batch, heads, nope], block = [None, heads, nope], map = |b, _lens| (b, 0, 0))]
    q_nope: Ref,
    #[input(bf16[batch, heads, 128], block = [None, heads, 128], map = |b, _lens| (b, 0, 0))]
    q_rope: Ref,
    #[input(bf16[heads * (nope + v_dim), rank], block = [heads * (nope + v_dim), rank], map = |_b, _lens| (0, 0))]
    kv_b: Ref,
    #[input(bf16[batch, max_context, (rank + 127) / 128 * 128 + 128], space = any)] cache: Ref,
    #[output(bf16[batch, heads, v_dim], block = [None, heads, v_dim], map = |b, _lens| (b, 0, 0))]
    o: Ref,
    #[scratch(vmem, bf16[2, block_kv, (rank + 127) / 128 * 128 + 128])] buf: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let _ = rope;
    let b = program_id(0);
    let len = lens[b];
    let tiles = (len + (block_kv as i32 - 1)) / block_kv as i32;
    let row = LatentRow { rank: rank as u64 };
    // Head `h`'s rows of `x @ w` (or `x @ w.T`) for every head's rows, stacked.
    let per_head = |x: Val, w: &dyn Fn(u64) -> Val, transposed: bool, cols: u64| {
        let row = iota([heads as u64, cols], 0);
        (0..heads as u64).fold(zeros([heads as u64, cols], f32), |acc, h| {
            let y = if transposed { dot_t(x, w(h)) } else { dot(x, w(h)) };
            select(eq(row, h as i32), y, acc)
        })
    };
    let stride = (nope + v_dim) as u64;
    let (nope_u, v_u, rank_u) = (nope as u64, v_dim as u64, rank as u64);
    let uk = |h: u64| kv_b[(h * stride..h * stride + nope_u, ..)];
    let uv = |h: u64| kv_b[(h * stride + nope_u..(h + 1) * stride, ..)];
    let q_lat = per_head(q_nope[(0, .., ..)], &uk, false, rank_u);
    let q = row.query(q_lat.cast(bf16), q_rope[(0, .., ..)]);
    let fetch = |tile: Val, slot: Val| {
        let start = (tile * block_kv as i32).multiple_of(block_kv as u32);
        async_copy(cache.at((b, ds(start, block_kv as u64), ..)), buf.at(slot), sems.at(slot))
    };
    fetch(scalar(0), scalar(0)).start();
    let last = tiles - 1;
    let (state, _) = pipeline(
        range(scalar(0), last),
        Drain::Peeled { start: last, count: 1 },
        1,
        (OnlineSoftmax::start(heads as u64, row.width()), scalar(0)),
        |next: Val, &(_, slot): &(OnlineSoftmax, Val)| fetch(next, 1 - slot).start(),
        |t: Val, (state, slot): (OnlineSoftmax, Val), _draining: bool| {
            fetch(t, slot).wait();
            // Positions from `len` on are masked out of the scores; the rows there are the
            // caller's finite data (stale or zero), as `decode_attention`'s.
            let mask = KvMask {
                start: t * block_kv as i32,
                last: len - 1,
                queries: None,
                window: None,
                zero_values: false,
            };
            let tile = buf[slot];
            (state.attend(q, tile, tile, Some(scale), Some(mask)), 1 - slot)
        },
    );
    let latent = row.latent(state.output()).cast(bf16);
    o[(0, .., ..)] = per_head(latent, &uv, true, v_u).cast(bf16);
}
