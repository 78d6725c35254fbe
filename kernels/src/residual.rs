//! Residual add: `o = x + residual`, bf16 in/out, the add done in f32 (one rounding, at the
//! store, as `(x.astype(f32) + r.astype(f32)).astype(bf16)` in JAX).
//!
//! Purely HBM-bound (2 reads, 1 write per element), so the blocks are whole rows
//! (`[block_rows, hidden]`: lane-dense, one contiguous DMA each) and as tall as VMEM
//! comfortably allows: the default 256 x 4096 bf16 block is 2 MiB, 12 MiB for the three
//! double-buffered operands, inside every chip's default scoped VMEM. `block_rows` is a
//! multiple of 16, bf16's native sublane tile.
//!
//! Two entries share the body: [`residual_add`] writes a fresh output; [`residual_add_inplace`]
//! aliases `residual` to `o` (`input_output_aliases`), so the residual stream is updated in
//! place and XLA need not allocate (or copy into) a new buffer. Aliasing is sound here
//! because every grid step reads its residual block before writing the same block, and no
//! step touches another's block.

use crate::body::residual_add as add;
use palladium_dsl::prelude::*;

/// `o = x + residual` over one block, f32 math.
fn add_block(x: Ref, residual: Ref, o: Ref) {
    o.store(.., add(x.load(..), residual.load(..)).cast(bf16));
}

#[kernel(grid = (rows / block_rows,), semantics = (parallel,))]
pub fn residual_add(
    #[default(1024)] rows: usize,
    #[default(4096)] hidden: usize,
    #[default(256)] block_rows: usize,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] x: Ref,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] residual: Ref,
    #[output(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] o: Ref,
) {
    add_block(x, residual, o);
}

#[kernel(grid = (rows / block_rows,), semantics = (parallel,), aliases = [(residual, o)])]
pub fn residual_add_inplace(
    #[default(1024)] rows: usize,
    #[default(4096)] hidden: usize,
    #[default(256)] block_rows: usize,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] x: Ref,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] residual: Ref,
    #[output(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] o: Ref,
) {
    add_block(x, residual, o);
}
