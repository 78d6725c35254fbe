//! Megablox-style grouped matmul for batched MoE: `out[r] = lhs[r] @ rhs[g(r)]`, where the
//! rows of `lhs` are sorted by expert and group `g` owns rows
//! `group_offsets[g]..group_offsets[g + 1]`.
//!
//! Contract (the caller builds the metadata, see `moe_reference::group_metadata`):
//! - `group_offsets: i32[groups + 1]`, non-decreasing, `group_offsets[0] = 0`,
//!   `group_offsets[groups] <= m`. Output rows at or past `group_offsets[groups]` are undefined.
//! - Work is a list of *visits* `v`, each one (m tile `m_tile_ids[v]`, group
//!   `group_ids[v]`): every non-empty group visits each m tile its rows touch, in row order,
//!   so a tile that straddles groups is visited once per group. `num_visits[0]` is the
//!   number of real visits; the arrays are padded to the static bound `m / block_m + groups -
//!   1` by repeating the last real visit.
//!
//! Why it is shaped this way (as `jax.experimental.pallas.ops.tpu.megablox.gmm`):
//! - Grid `(n tiles, visits, k tiles)`: the rhs block `[None, block_k, block_n]` is chosen by
//!   the index map from the visit's group (`rhs` has a squeezed group dim), so the Pallas
//!   pipeline streams exactly the experts that have rows; k is innermost so the f32
//!   accumulator and the output block stay resident while a visit reduces.
//! - Tiles may straddle groups: a visit computes the whole tile with its group's weights,
//!   then merges only its own rows into the output block with a `select` (in f32: v5e has
//!   no bf16 VPU)
//!   (`group_offsets[g] <= row < group_offsets[g + 1]`). Consecutive visits of one m tile map
//!   to the same output block, so the pipeline keeps it in VMEM between them and writes it
//!   back once, after the last group touching the tile.
//! - Our grid is static, so instead of gmm's dynamic `num_active_tiles` extent the visit axis
//!   has the worst-case extent and padded visits (`v >= num_visits[0]`) skip all compute;
//!   they repeat the last real visit's block indices, so they issue no DMAs and leave the
//!   resident output block alone.
//! - The visit and k axes carry state (`arbitrary`); n tiles are independent (`parallel`).
//!
//! Numerics: bf16 x bf16 on the MXU, f32 accumulation over k, one bf16 rounding on the
//! store. See `moe_reference::grouped_matmul`.

use palladium_dsl::prelude::*;

#[kernel(
    grid = (n / block_n, m / block_m + groups - 1, k / block_k),
    semantics = (parallel, arbitrary, arbitrary)
)]
pub fn grouped_matmul(
    #[default(512)] m: usize,
    #[default(2048)] k: usize,
    #[default(1536)] n: usize,
    #[default(128)] groups: usize,
    #[default(128)] block_m: usize,
    #[default(512)] block_k: usize,
    #[default(512)] block_n: usize,
    #[prefetch(i32[groups + 1])] group_offsets: Ref,
    #[prefetch(i32[m / block_m + groups - 1])] group_ids: Ref,
    #[prefetch(i32[m / block_m + groups - 1])] m_tile_ids: Ref,
    #[prefetch(i32[1])] num_visits: Ref,
    #[input(bf16[m, k], block = [block_m, block_k], map = |_j, v, kk, _off, _gid, tid, _nv| (tid[v], kk))] lhs: Ref,
    #[input(bf16[groups, k, n], block = [None, block_k, block_n], map = |j, v, kk, _off, gid, _tid, _nv| (gid[v], kk, j))] rhs: Ref,
    #[output(bf16[m, n], block = [block_m, block_n], map = |j, v, _kk, _off, _gid, tid, _nv| (tid[v], j))] o: Ref,
    #[scratch(vmem, f32[block_m, block_n])] acc: Ref,
) {
    let visit = program_id(1);
    let kk = program_id(2);
    if visit < num_visits[0] {
        if kk == 0 {
            acc[..] = 0.0;
        }
        acc[..] += dot(lhs[..], rhs[(0, .., ..)]);
        if kk == num_programs(2) - 1 {
            let group = group_ids[visit];
            let row = iota([block_m, block_n], 0) + m_tile_ids[visit] * block_m as i32;
            let mine = (row >= group_offsets[group]) & (row < group_offsets[group + 1]);
            o[..] = select(mine, acc[..], o[..].cast(f32)).cast(bf16);
        }
    }
}
