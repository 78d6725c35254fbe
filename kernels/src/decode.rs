//! Decode GEMV: `o[batch, n] = x[batch, k] @ w[k, n]`, bf16 in, f32 out.
//!
//! At decode time `batch` is tiny (1..64) and the weight is large, so the kernel is bound by
//! streaming `w` from HBM once; the shape is chosen to keep that stream unbroken:
//! - The grid walks `n` in `block_n` columns (and `k` in `block_k` rows, innermost). Each
//!   weight block `[block_k, block_n]` is a contiguous, lane-dense DMA; `x`'s block depends
//!   only on the `k` step, so with `block_k == k` (the default) it is fetched once and stays
//!   resident for the whole grid.
//! - `x`'s block is `[batch, block_k]`: its second-minor dim is the whole `batch` dim,
//!   allowed by the block rule for any `batch` (for bf16 a multiple of 16 avoids padded
//!   sublanes, but the MXU pads `batch` rows either way; the cost is in the weight bytes).
//! - The output is f32, so the `[batch, block_n]` output block itself is the accumulator
//!   when `k` is split: it stays resident across the (last, `arbitrary`) `k` axis and is
//!   written back once, when its column index changes. No scratch is needed.
//! - Large weight blocks amortise the per-step overhead (~0.35 µs) against each block's
//!   DMA. The default problem mirrors `scripts/jax_reference.py pallas gemv` (8x4096 @ 4096x14336, whose
//!   4096 x 1024 blocks take 16 MiB double-buffered under a 100 MiB limit). Library
//!   defaults must verify on every chip, v4's 16 MiB of VMEM included, so the default block
//!   is 4096 x 896 (7 MiB; 14.3 MiB double-buffered): libtpu's v6e estimate is 99109
//!   cycles, against 98598 for JAX's blocks (`--set block_n=1024`, same as JAX's 98630)
//!   and 97660 for the best found, 4096 x 1792 (28 MiB, too big for v4); 85.4% of the
//!   v6e HBM floor for the 117 MB of weights. 14336 = 7 * 2048, hence 896 = 7 * 128.
//! - `vmem_limit` is computed from the blocks ([`vmem_limit_bytes`]): the double-buffered
//!   windows plus 1 MiB of headroom, at least the 16 MiB every chip grants by default, so
//!   bigger blocks raise it instead of failing the default scoped budget.

use crate::body::{WeightBlock, WeightLayout};
use palladium_dsl::build::{eq, if_else};
use palladium_dsl::prelude::*;

/// The VMEM limit for `gemv`'s blocks: the double-buffered `x`, `w` and `o` windows (`x`'s
/// rows padded to bf16's 16-row tile, `o`'s to f32's 8), plus 1 MiB of headroom, rounded up
/// to a MiB, and at least 16 MiB.
pub fn vmem_limit_bytes(batch: usize, block_k: usize, block_n: usize) -> usize {
    const MIB: usize = 1 << 20;
    // Saturating: absurd blocks give a limit the verifier refuses, never a wrapped one.
    let bytes =
        |rows: usize, cols: usize, elem: usize| rows.saturating_mul(cols).saturating_mul(elem);
    let windows = bytes(batch.next_multiple_of(16), block_k, 2)
        .saturating_add(bytes(block_k, block_n, 2))
        .saturating_add(bytes(batch.next_multiple_of(8), block_n, 4));
    let need = windows.saturating_mul(2).saturating_add(MIB);
    need.checked_next_multiple_of(MIB).unwrap_or(need).max(16 * MIB)
}

#[kernel(
    grid = (n / block_n, k / block_k),
    semantics = (parallel, arbitrary),
    vmem_limit = vmem_limit_bytes(batch, block_k, block_n),
    cost = (2 * batch * k * n, 0, 2 * (batch * k + k * n) + 4 * batch * n)
)]
pub fn gemv(
    #[default(8)] batch: usize,
    #[default(4096)] k: usize,
    #[default(14336)] n: usize,
    #[default(896)] block_n: usize,
    #[default(4096)] block_k: usize,
    #[input(bf16[batch, k], block = [batch, block_k], map = |_j, kk| (0, kk))] x: Ref,
    #[input(bf16[k, n], block = [block_k, block_n], map = |j, kk| (kk, j))] w: Ref,
    #[output(f32[batch, n], block = [batch, block_n], map = |j, _kk| (0, j))] o: Ref,
) {
    gemv_step(x, || w[..], o, k / block_k);
}

/// One grid step of `gemv` whatever the weight format (`gemv_quantized` is the same kernel
/// over codes and scales): the column block's product with this k step's weight block
/// (`weight` loads it), stored into the f32 output block at the first of the `k_steps` k
/// steps and added to it after (the output block is the accumulator).
pub(crate) fn gemv_step<W: WeightBlock>(
    x: Ref,
    weight: impl FnOnce() -> W,
    o: Ref,
    k_steps: usize,
) {
    let x = x.load(..);
    let partial = weight().project_from(x, WeightLayout::InOut);
    if k_steps == 1 {
        // One k step: the plain Pallas body.
        o.store(.., partial);
    } else {
        if_else(
            eq(program_id(1), 0),
            || o.store(.., partial),
            || o.store(.., o.load(..) + partial),
        );
    }
}
