//! RMSNorm fused into the following projection:
//! `o = (rmsnorm(x) * norm_w).astype(bf16) @ w`, where `rmsnorm(x) = x / sqrt(mean(x^2) + eps)`
//! in f32.
//!
//! Fusing saves writing the normalised activations to HBM and reading them back. The grid
//! is `(rows / block_rows, n / block_n)` with the `n` axis innermost and `arbitrary`:
//! - a row block of `x` is `[block_rows, hidden]` (the norm needs whole rows; lane-dense)
//!   and its block index does not change along `n`, so it is fetched once per row block;
//! - it is normalised once, at the first `n` step, into a bf16 VMEM scratch
//!   `[block_rows, hidden]`, the MXU's operand for every `[hidden, block_n]` weight block
//!   of that row block (so the `n` axis must run in order on one core: `arbitrary`; the
//!   row axis stays `parallel`);
//! - each step is then one `[block_rows, hidden] @ [hidden, block_n]` dot with f32
//!   accumulation over the whole `hidden` (no k split: `hidden` is what the norm needs
//!   resident anyway), cast to bf16 at the store.
//!
//! Rounding matches the unfused pair `rmsnorm` then `matmul`: one rounding to bf16 of the
//! normalised, weighted activations, f32 accumulation, one rounding of the output.
//! Defaults (256 x 4096 @ 4096 x 4096, blocks 256 / 256): weight blocks of 2 MiB, about
//! 10.5 MiB of windows and scratch, inside the 16 MiB default scoped VMEM of every chip
//! with room for the f32 intermediates of the norm (4 MiB for a 256 x 4096 block), which
//! the static budget does not count: with `block_n = 512` libtpu asks 18.66 MiB on v5e
//! and refuses. All of `rows` in one row block streams the weight once (`block_rows = 128`
//! streams it twice: 124085 vs 89673 estimated cycles on v5e).

use crate::body::{WeightBlock, WeightLayout, rms_norm};
use palladium_dsl::build::{eq, if_else};
use palladium_dsl::prelude::*;

#[kernel(grid = (rows / block_rows, n / block_n), semantics = (parallel, arbitrary), requires = [eps >= 0.0])]
pub fn rmsnorm_matmul(
    #[default(256)] rows: usize,
    #[default(4096)] hidden: usize,
    #[default(4096)] n: usize,
    #[default(256)] block_rows: usize,
    #[default(256)] block_n: usize,
    #[default(1e-6)] eps: f64,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i, _j| (i, 0))] x: Ref,
    #[input(bf16[1, hidden], block = [1, hidden], map = |_i, _j| (0, 0))] norm_w: Ref,
    #[input(bf16[hidden, n], block = [hidden, block_n], map = |_i, j| (0, j))] w: Ref,
    #[output(bf16[rows, n], block = [block_rows, block_n], map = |i, j| (i, j))] o: Ref,
    #[scratch(vmem, bf16[block_rows, hidden])] normed: Ref,
) {
    rmsnorm_matmul_step(RmsNormed { x, norm_w, normed, hidden, eps }, || w[..], o);
}

/// The row block `rmsnorm_matmul` normalises once and projects at every column step: `x`'s
/// block, the norm weight, the bf16 scratch `normed` it is cached in.
pub(crate) struct RmsNormed {
    pub x: Ref,
    pub norm_w: Ref,
    pub normed: Ref,
    pub hidden: usize,
    pub eps: f64,
}

/// One grid step of `rmsnorm_matmul` whatever the weight format (`rmsnorm_matmul_quantized`
/// is the same kernel over codes and scales): the row block normalised into `normed` at the
/// first column step, then its product with this column block's weight (`weight` loads it)
/// stored as bf16.
pub(crate) fn rmsnorm_matmul_step<W: WeightBlock>(
    rows: RmsNormed,
    weight: impl FnOnce() -> W,
    o: Ref,
) {
    let RmsNormed { x, norm_w, normed, hidden, eps } = rows;
    if_else(
        eq(program_id(1), 0),
        || normed.store(.., rms_norm(x.load(..), Some(norm_w.load(..)), hidden as u64, eps)),
        || (),
    );
    let normed = normed.load(..);
    o.store(.., weight().project_from(normed, WeightLayout::InOut).cast(bf16));
}
