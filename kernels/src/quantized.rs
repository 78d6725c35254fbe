//! The library's projections with quantized weights (issue 16): `gemv_quantized`,
//! `matmul_quantized` and `rmsnorm_matmul_quantized` are `gemv`, `matmul` and
//! `rmsnorm_matmul` with the weight as 8- or 4-bit codes (`wdtype`: `i8`, `i4` or
//! `f8e4m3fn`) plus f32 scales `[k / group, n]` ([`GroupScales`]: one per `group` consecutive
//! inputs of each output column). The formats of `palladium_model::quant` are settings:
//! int8 per output channel `wdtype=i8 group=K` (the default), int4 groups of 128
//! `wdtype=i4 group=128`, fp8 128 x 128 blocks `wdtype=f8e4m3fn group=128` with each block's
//! scale repeated over its 128 columns. The weight is `[in, out]` (`x @ w`), as the bf16
//! kernels take it; an i4 array holds one value per element (packed two per byte on the TPU).
//!
//! libtpu 0.0.42.1 takes `tpu.matmul` of a bf16 lhs and i8 / i4 / f8e4m3fn rhs directly on v6e
//! and v7x (what `jnp.dot(x_bf16, w_int8)` lowers to in Pallas): the codes convert on their
//! way into the MXU, so the weight bytes are what the HBM stream moves and no separate
//! `.astype` pass over the tile is emitted (on v6e an explicit f8 -> bf16 `arith.extf` of the
//! tile costs 2.4x the direct form's estimated cycles; for i8 and i4 libtpu fuses the
//! `sitofp` into the matmul and both forms estimate the same). v5e refuses a bf16 x int8
//! `vmatmul` at batch 8 (`Expected vector-bf16packed, got vector-int16`), as it does the bf16
//! `gemv` there. The scale multiplies each group's f32 partial product (a K-blocked loop for
//! groups narrower than the block), so a group's scale never touches the codes.

use crate::body::{
    GroupScales, QuantizedBlock, RowSelect, WeightLayout, project_quantized, routed, swiglu_chunk,
};
use crate::decode::gemv_step;
use crate::norm_matmul::{RmsNormed, rmsnorm_matmul_step};
use palladium_dsl::prelude::*;

/// Rows of a `[block_k, ..]` weight block's scales block: `block_k / group`, or one when the
/// block lies inside one group. The TPU block rule wants a multiple of 8 unless it is all of
/// `k / group`: with 128-groups a k split needs `block_k` a multiple of 1024.
pub fn scale_rows(block_k: usize, group: usize) -> usize {
    (block_k / group.max(1)).max(1)
}

/// Inputs one scales block covers (`group * scale_rows`): k step `kk`'s scales block is
/// `kk * block_k / scale_span` (`kk` itself when groups are narrower than the block).
pub fn scale_span(block_k: usize, group: usize) -> usize {
    group * scale_rows(block_k, group)
}

/// `gemv` (`o[batch, n] = x @ dequant(w)`, f32 out) with a quantized weight streamed in
/// `[block_k, block_n]` code blocks and their scale blocks. The VMEM limit is `gemv`'s for
/// bf16 blocks of the same shape, an upper bound (the codes are half or a quarter of it;
/// the scales' block is at most 1/32 of a bf16 block for `group >= 128`).
#[kernel(
    grid = (n / block_n, k / block_k),
    semantics = (parallel, arbitrary),
    vmem_limit = crate::decode::vmem_limit_bytes(batch, block_k, block_n),
    requires = [wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, k % group == 0, block_k % group == 0 || group % block_k == 0]
)]
pub fn gemv_quantized(
    #[default(8)] batch: usize,
    #[default(4096)] k: usize,
    #[default(14336)] n: usize,
    #[default(896)] block_n: usize,
    #[default(4096)] block_k: usize,
    #[default(i8)] wdtype: DType,
    #[default(4096)] group: usize,
    #[input(bf16[batch, k], block = [batch, block_k], map = |_j, kk| (0, kk))] x: Ref,
    #[input(wdtype[k, n], block = [block_k, block_n], map = |j, kk| (kk, j))] w: Ref,
    #[input(f32[k / group, n], block = [scale_rows(block_k, group), block_n], map = |j, kk| (kk * block_k / scale_span(block_k, group), j))]
    scales: Ref,
    #[output(f32[batch, n], block = [batch, block_n], map = |j, _kk| (0, j))] o: Ref,
) {
    gemv_step(
        x,
        || QuantizedBlock {
            codes: w[..],
            scales: GroupScales { values: scales[..], group: group as u64 },
        },
        o,
        k / block_k,
    );
}

/// `matmul` (bf16 out) with a quantized `[k, n]` weight and its `[k / group, n]` scales:
/// the f32 accumulator sums each `[bk, bn]` code block's scaled product.
#[kernel(
    grid = (m / bm, n / bn, k / bk),
    semantics = (parallel, parallel, arbitrary),
    requires = [wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, k % group == 0, bk % group == 0 || group % bk == 0]
)]
pub fn matmul_quantized(
    #[default(1024)] m: usize,
    #[default(2048)] k: usize,
    #[default(1024)] n: usize,
    #[default(256)] bm: usize,
    #[default(512)] bk: usize,
    #[default(256)] bn: usize,
    #[default(i8)] wdtype: DType,
    #[default(2048)] group: usize,
    #[input(bf16[m, k], block = [bm, bk], map = |i, _j, kk| (i, kk))] x: Ref,
    #[input(wdtype[k, n], block = [bk, bn], map = |_i, j, kk| (kk, j))] y: Ref,
    #[input(f32[k / group, n], block = [scale_rows(bk, group), bn], map = |_i, j, kk| (kk * bk / scale_span(bk, group), j))]
    scales: Ref,
    #[output(bf16[m, n], block = [bm, bn], map = |i, j, _kk| (i, j))] o: Ref,
    #[scratch(vmem, f32[bm, bn])] acc: Ref,
) {
    if program_id(2) == 0 {
        acc[..] = 0.0;
    }
    acc[..] += project_quantized(
        x[..],
        y[..],
        GroupScales { values: scales[..], group: group as u64 },
        WeightLayout::InOut,
    );
    if program_id(2) == num_programs(2) - 1 {
        o[..] = acc[..].cast(bf16);
    }
}

/// `rmsnorm_matmul` with a quantized `[hidden, n]` weight and its `[hidden / group, n]`
/// scales (the whole `hidden` per weight block, as there).
#[kernel(
    grid = (rows / block_rows, n / block_n),
    semantics = (parallel, arbitrary),
    requires = [eps >= 0.0, wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, hidden % group == 0]
)]
pub fn rmsnorm_matmul_quantized(
    #[default(256)] rows: usize,
    #[default(4096)] hidden: usize,
    #[default(4096)] n: usize,
    #[default(256)] block_rows: usize,
    #[default(256)] block_n: usize,
    #[default(1e-6)] eps: f64,
    #[default(i8)] wdtype: DType,
    #[default(4096)] group: usize,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i, _j| (i, 0))] x: Ref,
    #[input(bf16[1, hidden], block = [1, hidden], map = |_i, _j| (0, 0))] norm_w: Ref,
    #[input(wdtype[hidden, n], block = [hidden, block_n], map = |_i, j| (0, j))] w: Ref,
    #[input(f32[hidden / group, n], block = [hidden / group, block_n], map = |_i, j| (0, j))]
    scales: Ref,
    #[output(bf16[rows, n], block = [block_rows, block_n], map = |i, j| (i, j))] o: Ref,
    #[scratch(vmem, bf16[block_rows, hidden])] normed: Ref,
) {
    let weight = || QuantizedBlock {
        codes: w[..],
        scales: GroupScales { values: scales[..], group: group as u64 },
    };
    rmsnorm_matmul_step(RmsNormed { x, norm_w, normed, hidden, eps }, weight, o);
}

/// `expert_ffn` with quantized experts (the int4 experts: `wdtype=i4`, groups of 128
/// inputs): for every token `t` and routed slot `j`,
/// `o[t] += weights[t, j] * swiglu(x[t] @ gate[e], x[t] @ up[e]) @ down[e]`, `e = ids[t * top_k + j]`,
/// on the dequantized weights. Unlike `expert_ffn`'s manual DMA ring, the chunks come through
/// the Pallas pipeline (`grid = (tokens * top_k, ffn / block_ffn)`, blocks indexed by the
/// scalar-prefetched id: the `BlockSpec` form `expert_ffn`'s docs describe), the scales as
/// blocks beside their codes:
/// - `gate`/`up` `[experts, hidden, ffn]` codes, scales `f32[experts, hidden / group, ffn]`;
/// - `down` `[experts, ffn, hidden]` codes, scales chunk-major
///   `f32[experts, ffn / block_ffn, block_ffn / down_group, hidden]` (each chunk's scale rows
///   a whole block: the TPU block rule refuses 2-row slices of a `[ffn / 128, hidden]` grid).
///   Per-channel scales are `down_group = block_ffn` with the channel's scale in every chunk.
///
/// The chunk is computed for all tokens (rows padded to 16, as `expert_ffn`) and kept on
/// row `t` only, times its routing weight; the f32 accumulator is written once as bf16.
#[kernel(
    grid = (tokens * top_k, ffn / block_ffn),
    semantics = (arbitrary, arbitrary),
    requires = [top_k <= experts, ffn % block_ffn == 0, wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, hidden % group == 0, block_ffn % down_group == 0]
)]
pub fn expert_ffn_quantized(
    #[default(8)] tokens: usize,
    #[default(2048)] hidden: usize,
    #[default(128)] experts: usize,
    #[default(8)] top_k: usize,
    #[default(768)] ffn: usize,
    #[default(256)] block_ffn: usize,
    #[default(int4)] wdtype: DType,
    #[default(128)] group: usize,
    #[default(128)] down_group: usize,
    #[prefetch(i32[tokens * top_k], range = 0..=experts - 1)] ids: Ref,
    #[input(f32[tokens, top_k], space = smem, block = [tokens, top_k], map = |_p, _c, _ids| (0, 0))]
    weights: Ref,
    #[input(bf16[tokens, hidden], block = [tokens, hidden], map = |_p, _c, _ids| (0, 0))] x: Ref,
    #[input(wdtype[experts, hidden, ffn], block = [None, hidden, block_ffn], map = |p, c, ids| (ids[p], 0, c))]
    w_gate: Ref,
    #[input(wdtype[experts, hidden, ffn], block = [None, hidden, block_ffn], map = |p, c, ids| (ids[p], 0, c))]
    w_up: Ref,
    #[input(wdtype[experts, ffn, hidden], block = [None, block_ffn, hidden], map = |p, c, ids| (ids[p], c, 0))]
    w_down: Ref,
    #[input(f32[experts, hidden / group, ffn], block = [None, hidden / group, block_ffn], map = |p, c, ids| (ids[p], 0, c))]
    s_gate: Ref,
    #[input(f32[experts, hidden / group, ffn], block = [None, hidden / group, block_ffn], map = |p, c, ids| (ids[p], 0, c))]
    s_up: Ref,
    #[input(f32[experts, ffn / block_ffn, block_ffn / down_group, hidden], block = [None, None, block_ffn / down_group, hidden], map = |p, c, ids| (ids[p], c, 0, 0))]
    s_down: Ref,
    #[output(bf16[tokens, hidden], block = [tokens, hidden], map = |_p, _c, _ids| (0, 0))] o: Ref,
    #[scratch(vmem, f32[tokens.div_ceil(16) * 16, hidden])] x_pad: Ref,
    #[scratch(vmem, f32[tokens.div_ceil(16) * 16, hidden])] acc: Ref,
) {
    let rows = tokens.div_ceil(16) * 16;
    let (pair, chunk) = (program_id(0), program_id(1));
    if pair == 0 {
        if chunk == 0 {
            acc[..] = 0.0;
            x_pad[..] = 0.0;
            x_pad[0..tokens] = x[..].cast(f32);
        }
    }
    // The blocks keep the expert dim (and `s_down`'s chunk dim) as extent 1.
    let block = |codes: Val, scales: Val, group: usize| QuantizedBlock {
        codes,
        scales: GroupScales { values: scales, group: group as u64 },
    };
    let gate = block(w_gate[(0, .., ..)], s_gate[(0, .., ..)], group);
    let up = block(w_up[(0, .., ..)], s_up[(0, .., ..)], group);
    let down = block(w_down[(0, .., ..)], s_down[(0, 0, .., ..)], down_group);
    let chunk_out = swiglu_chunk(x_pad[..].cast(bf16), gate, up, down, WeightLayout::InOut);
    let t = pair / top_k as i32;
    acc[..] +=
        routed(chunk_out, RowSelect::new(rows as u64, 1), t, weights[(t, pair - t * top_k as i32)]);
    if pair == num_programs(0) - 1 {
        if chunk == num_programs(1) - 1 {
            o[..] = acc[0..tokens].cast(bf16);
        }
    }
}
