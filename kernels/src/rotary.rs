//! Rotary position embedding (RoPE) applied to q or k:
//! `o = x * cos + rotate(x) * sin`, per head, f32 math, bf16 in/out.
//!
//! `rotate` pairs dimension `j` with its partner and negates one side:
//! - neox (`interleaved = false`, rotate halves): `rotate(x) = concat(-x[d/2:], x[:d/2])`;
//! - interleaved (GPT-J, pairs `(2i, 2i+1)`): `rotate(x)[2i] = -x[2i+1]`,
//!   `rotate(x)[2i+1] = x[2i]`.
//!
//! The `cos`/`sin` tables are f32 `[tokens, head_dim]` inputs, already expanded to the full
//! head dim in the style's order (neox: `cos[t, j] = cos(pos_t * inv_freq[j % (d/2)])`;
//! interleaved: `cos[t, j] = cos(pos_t * inv_freq[j / 2])`), as model code precomputes
//! them once per step for all layers. Computing them in the kernel from scalar-prefetched
//! positions would spend two transcendental polynomials per element per head on the VPU to
//! save a table read that, with the head axis innermost, is fetched once per token block
//! and reused by every head block.
//!
//! Layout: `x` is `[tokens, heads * head_dim]`, the natural layout of a fused qkv
//! projection's output. Tokens go on sublanes and `head_dim` (a multiple of 128) on lanes,
//! so every head is a lane-aligned, tile-aligned column slice of the block. The 3-D
//! `[tokens, heads, head_dim]` layout would put `heads` (often 8) on the sublanes of each
//! token's tile: half-empty bf16 tiles, and blocks over tokens on a leading, untiled dim.
//! A block is `[block_t, heads_per_block * head_dim]`; the heads in it are processed by a
//! static loop over their column slices.
//!
//! Why a matmul: `rotate` moves data across lanes by `d/2` (neox) or by one lane
//! (interleaved). The DSL cannot slice a loaded vector, and ref slices at `d/2 = 64` lanes
//! are not tile-aligned, which Mosaic rejects. But `rotate(x) = x @ R` for a signed
//! permutation matrix `R` (`d x d`, one ±1 per column), built in-kernel from `iota` and
//! `select` (cheap, loop-invariant VPU work). The MXU computes it exactly: each output is one
//! bf16 input times ±1, accumulated in f32 with zeros, so `rotate` is bit-exact and both
//! styles are the same code with a different `R`. The extra `2 d` MXU flops per element are
//! far below what the MXU sustains per HBM byte, so the kernel stays HBM-bound.

use crate::body::{rope_apply, rope_rotation};
use palladium_dsl::prelude::*;

// Heads are lane-aligned column slices (head_dim a multiple of 128); the per-head loop is
// unrolled at trace time.
#[kernel(
    grid = (tokens / block_t, heads / heads_per_block),
    semantics = (parallel, parallel),
    requires = [head_dim % 128 == 0, heads_per_block <= 256]
)]
pub fn rope(
    #[default(1024)] tokens: usize,
    #[default(32)] heads: usize,
    #[default(128)] head_dim: usize,
    #[default(256)] block_t: usize,
    #[default(8)] heads_per_block: usize,
    #[default(false)] interleaved: bool,
    #[input(bf16[tokens, heads * head_dim], block = [block_t, heads_per_block * head_dim], map = |i, h| (i, h))]
    x: Ref,
    #[input(f32[tokens, head_dim], block = [block_t, head_dim], map = |i, _h| (i, 0))] cos: Ref,
    #[input(f32[tokens, head_dim], block = [block_t, head_dim], map = |i, _h| (i, 0))] sin: Ref,
    #[output(bf16[tokens, heads * head_dim], block = [block_t, heads_per_block * head_dim], map = |i, h| (i, h))]
    o: Ref,
) {
    let d = head_dim;
    let rotation = rope_rotation(d as u64, d as u64, interleaved);
    let cos_t = cos[..];
    let sin_t = sin[..];
    for h in unrolled(0, heads_per_block) {
        let cols = h * d..(h + 1) * d;
        o[(.., cols.clone())] = rope_apply(x[(.., cols)], rotation, cos_t, sin_t).cast(bf16);
    }
}
