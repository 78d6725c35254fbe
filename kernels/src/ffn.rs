//! MoE expert FFN for decode: for every token `t` and each of its `top_k` routed experts
//! `e = ids[t * top_k + j]` with weight `w = weights[t, j]`,
//! `out[t] += w * (silu(x[t] @ gate[e]) * (x[t] @ up[e])) @ down[e]`, accumulated in f32
//! and written once as bf16. Inputs are exactly what `moe_router` produces (ids flattened
//! to `[tokens * top_k]` for scalar prefetch; weights in SMEM).
//!
//! Why it is shaped this way:
//! - Decode MoE is bound by the expert weight stream (Qwen3-30B-A3B: 9 MiB of bf16 per
//!   expert, 8 experts per token), so the kernel is one long, double-buffered DMA stream
//!   over work items, with the math hidden under it. A work item is one (token, slot)
//!   pair and one `block_ffn`-wide chunk of the expert's intermediate dim: `gate[e][:, c]`,
//!   `up[e][:, c]` (`[hidden, block_ffn]`) and `down[e][c, :]` (`[block_ffn, hidden]`).
//!   SwiGLU is separable along the intermediate dim, so chunk results just add up; chunking
//!   keeps the two-slot ring small (3 MiB per slot at the defaults, under every chip's
//!   default scoped VMEM) and the first matmul starts after 3 MiB instead of 9 MiB arrived.
//! - Manual DMAs from HBM (`space = any`) by the scalar-prefetched expert id, as in
//!   `gather_rows` and `decode_attention`: item `i + 1` is in flight while item `i`
//!   computes, across (token, slot) boundaries too, so the weight stream never drains.
//!   This is the form a fused decode megakernel wants (it owns the DMA queue and can keep
//!   streaming the next layer's weights). The `BlockSpec` alternative (`grid = (tokens *
//!   top_k, ffn / block_ffn)`, `w_gate` block `[None, hidden, block_ffn]` with `map = |p, c,
//!   ids| (ids[p], 0, c)`) lets the Pallas pipeline issue the same DMAs and skips a refetch
//!   when consecutive steps hit the same block, but it cannot be fused into a larger
//!   kernel, so the manual version is the default (and only) one here.
//! - No grid, one traced loop over the items (cursor and ring slot carried): `x`
//!   (`[tokens, hidden]`, a few KiB) stays in VMEM and every item multiplies *all* tokens
//!   (the MXU streams at least 8 rows anyway; here 16, see the libtpu note in the body),
//!   then masks the result to the item's token with a per-row coefficient (`weight` on row
//!   `t`, 0 elsewhere) before accumulating. That avoids unaligned single-row slices of
//!   `x`/`acc` (bf16 rows are packed in pairs).
//! - Duplicate experts across tokens are fetched once per (token, slot), not deduplicated:
//!   at batch 8 and 128 experts about 20% of fetches are repeats. Deduplication needs a
//!   different interface (distinct expert list + dense `[tokens, experts]` combine
//!   weights) and is left to the caller / a later variant.
//!
//! Numerics: bf16 x bf16 MXU matmuls with f32 accumulation; `silu(g) * u` in f32, rounded
//! to bf16 before the down projection; the weighted combine in f32; one final bf16
//! rounding. See `moe_reference::expert_ffn`.

use crate::body::{ExpertItem, RowSelect, WeightLayout, routed, swiglu_chunk};
use palladium_dsl::build::{Drain, pipeline, range};
use palladium_dsl::prelude::*;

// Whole chunks per expert (a partial last chunk would DMA past `ffn`); the work-item loop
// bound, `tokens * top_k * (ffn / block_ffn)`, is an i32.
#[kernel(requires = [top_k <= experts, ffn % block_ffn == 0, tokens * top_k * (ffn / block_ffn) <= 2147483647])]
pub fn expert_ffn(
    #[default(8)] tokens: usize,
    #[default(2048)] hidden: usize,
    #[default(128)] experts: usize,
    #[default(8)] top_k: usize,
    #[default(768)] ffn: usize,
    #[default(256)] block_ffn: usize,
    #[prefetch(i32[tokens * top_k], range = 0..=experts - 1)] ids: Ref,
    #[input(f32[tokens, top_k], space = smem)] weights: Ref,
    #[input(bf16[tokens, hidden])] x: Ref,
    #[input(bf16[experts, hidden, ffn], space = any)] w_gate: Ref,
    #[input(bf16[experts, hidden, ffn], space = any)] w_up: Ref,
    #[input(bf16[experts, ffn, hidden], space = any)] w_down: Ref,
    #[output(bf16[tokens, hidden])] o: Ref,
    #[scratch(vmem, bf16[2, hidden, block_ffn])] gate_buf: Ref,
    #[scratch(vmem, bf16[2, hidden, block_ffn])] up_buf: Ref,
    #[scratch(vmem, bf16[2, block_ffn, hidden])] down_buf: Ref,
    #[scratch(vmem, f32[tokens.div_ceil(16) * 16, hidden])] x_pad: Ref,
    #[scratch(vmem, f32[tokens.div_ceil(16) * 16, hidden])] acc: Ref,
    #[scratch(dma_sem[3, 2])] sems: SemRef,
) {
    let chunks = (ffn / block_ffn) as i32;
    let pairs = (tokens * top_k) as i32;
    // The three copies of work item (pair, chunk) into ring slot `slot`.
    let fetch = |pair: Val, chunk: Val, slot: Val| {
        let e = ids[pair];
        let col = (chunk * block_ffn as i32).multiple_of(block_ffn as u32);
        let g = async_copy(
            w_gate.at((e, .., ds(col, block_ffn as u64))),
            gate_buf.at(slot),
            sems.at((0, slot)),
        );
        let u = async_copy(
            w_up.at((e, .., ds(col, block_ffn as u64))),
            up_buf.at(slot),
            sems.at((1, slot)),
        );
        let d = async_copy(
            w_down.at((e, ds(col, block_ffn as u64), ..)),
            down_buf.at(slot),
            sems.at((2, slot)),
        );
        (g, u, d)
    };
    let (g0, u0, d0) = fetch(scalar(0), scalar(0), scalar(0));
    g0.start();
    u0.start();
    d0.start();
    // The matmuls run on `rows` = tokens rounded up to the bf16 tile (16): libtpu 0.0.42.1
    // crashes on v5e for bf16 matmuls whose lhs has 8 rows ("Expected vector-bf16packed"
    // in vmatmul; JAX Pallas's own bf16[8, 256] x bf16[256, 128] dot aborts the same way).
    // The padding rows of `x` are zero and their results are dropped at the end.
    let rows = tokens.div_ceil(16) * 16;
    acc[..] = 0.0;
    x_pad[..] = 0.0;
    x_pad[0..tokens] = x[..].cast(f32);
    let xv = x_pad[..].cast(bf16);
    let row_ids = RowSelect::new(rows as u64, 1);
    // One flat pipelined loop over the items, the (pair, chunk, token) cursor and the ring
    // slot carried: every item but the last issues its successor unconditionally (libtpu's
    // v6e profiler barely prices, or aborts on, a DMA issued under an `if`).
    let zero = scalar(0);
    let last = scalar(pairs * chunks - 1);
    let _ = pipeline(
        range(zero, last),
        Drain::Peeled { start: last, count: 1 },
        1,
        (zero, zero, zero, zero),
        |_, &(pair, chunk, _, slot): &(Val, Val, Val, Val)| {
            let next = ExpertItem { pair, chunk }.next(chunks as u64);
            let (g, u, d) = fetch(next.pair, next.chunk, 1 - slot);
            g.start();
            u.start();
            d.start();
        },
        |_, (pair, chunk, t, slot): (Val, Val, Val, Val), _| {
            let (g, u, d) = fetch(pair, chunk, slot);
            g.wait();
            u.wait();
            d.wait();
            let chunk_out =
                swiglu_chunk(xv, gate_buf[slot], up_buf[slot], down_buf[slot], WeightLayout::InOut);
            acc[..] += routed(chunk_out, row_ids, t, weights[(t, pair - t * top_k as i32)]);
            let next = ExpertItem { pair, chunk }.next(chunks as u64);
            (next.pair, next.chunk, next.row_from(t, top_k as u64), 1 - slot)
        },
    );
    o[..] = acc[0..tokens].cast(bf16);
}
