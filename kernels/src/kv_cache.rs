//! In-place KV cache update for the new decode token.
//!
//! Each sequence `b` appends its new token's K and V (`bf16[batch, kv_heads, head_dim]`,
//! e.g. straight from the projection) at its own position `positions[b]` (scalar
//! prefetch) of the caches `bf16[batch, kv_heads, max_context, head_dim]`, the layout
//! [`crate::decode_attention`] reads. The caches are aliased input → output
//! (`input_output_aliases`) and stay in HBM (`space = any`): the kernel moves only the
//! touched rows, `2 * batch * kv_heads * head_dim` bf16 values, by HBM → HBM DMAs, never
//! the (GB-sized) caches, and XLA neither allocates nor copies a new cache.
//!
//! One grid step per sequence issues two DMAs (K and V), each a `[kv_heads, head_dim]`
//! slab: `k_new[b]` (contiguous) → `k_out[b, :, pos, :]` (`kv_heads` rows of `head_dim`,
//! `max_context * head_dim` apart). The destination row `pos` is arbitrary, so on the
//! cache's second-minor (sublane-tiled) dim the DMA is neither tile-aligned nor
//! tile-sized; see docs/benchmarks.md for what libtpu accepts and the layout trade-off.
//!
//! Aliasing is sound: every step writes rows no other step touches (positions of
//! different sequences are in different `b` slices), and nothing is read from the caches.

use crate::body::NewRow;
use palladium_dsl::prelude::*;

// Whole aligned blocks (the block holding the last position must not reach past
// `max_context`); the per-head merge is unrolled at trace time.
#[kernel(
    grid = (batch,),
    semantics = (parallel,),
    aliases = [(k_cache, k_out), (v_cache, v_out)],
    requires = [max_context % block_rows == 0, kv_heads <= 256]
)]
pub fn kv_cache_update(
    #[default(2)] batch: usize,
    #[default(4)] kv_heads: usize,
    #[default(128)] head_dim: usize,
    #[default(4096)] max_context: usize,
    #[default(16)] block_rows: usize,
    #[prefetch(i32[batch], range = 0..=max_context - 1)] positions: Ref,
    #[input(bf16[batch, kv_heads, head_dim], block = [None, kv_heads, head_dim], map = |b, _pos| (b, 0, 0))]
    k_new: Ref,
    #[input(bf16[batch, kv_heads, head_dim], block = [None, kv_heads, head_dim], map = |b, _pos| (b, 0, 0))]
    v_new: Ref,
    #[input(bf16[batch, kv_heads, max_context, head_dim], space = any)] k_cache: Ref,
    #[input(bf16[batch, kv_heads, max_context, head_dim], space = any)] v_cache: Ref,
    #[output(bf16[batch, kv_heads, max_context, head_dim], space = any)] k_out: Ref,
    #[output(bf16[batch, kv_heads, max_context, head_dim], space = any)] v_out: Ref,
    #[scratch(vmem, bf16[kv_heads, block_rows, head_dim])] k_buf: Ref,
    #[scratch(vmem, bf16[kv_heads, block_rows, head_dim])] v_buf: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let b = program_id(0);
    let pos = positions[b];
    // The aligned block of `block_rows` cache rows holding `pos`, for every kv head.
    let start = (pos / block_rows as i32 * block_rows as i32).multiple_of(block_rows as u32);
    let rows = (b, .., ds(start, block_rows as u64), ..);
    let k_read = async_copy(k_cache.at(rows), k_buf.at(..), sems.at(0));
    let v_read = async_copy(v_cache.at(rows), v_buf.at(..), sems.at(1));
    k_read.start();
    v_read.start();
    k_read.wait();
    v_read.wait();
    // Row `pos - start` of each head's block becomes the new token's row.
    let new_row = NewRow::at(block_rows as u64, head_dim as u64, pos - start);
    for h in unrolled(0, kv_heads) {
        k_buf[(h, .., ..)] = new_row.insert(k_buf[(h, .., ..)], k_new[(0, h..h + 1, ..)]);
        v_buf[(h, .., ..)] = new_row.insert(v_buf[(h, .., ..)], v_new[(0, h..h + 1, ..)]);
    }
    let k_write = async_copy(k_buf.at(..), k_out.at(rows), sems.at(0));
    let v_write = async_copy(v_buf.at(..), v_out.at(rows), sems.at(1));
    k_write.start();
    v_write.start();
    k_write.wait();
    v_write.wait();
}
