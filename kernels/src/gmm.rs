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
//! - Our grid is static (the DSL has no run-time grid extent, gmm's `num_active_tiles`), so
//!   the visit axis has `num_tiles` steps, a compile-time bound on the routing's visits
//!   (default [`ANY_ROUTING`]: the worst case, `m / block_m + groups - 1`); a known routing's
//!   count makes the grid exact, which is what libtpu's static estimate can price. Padded
//!   visits (`v >= num_visits[0]`) skip all compute; they repeat the last real visit's block
//!   indices, so they issue no DMAs and leave the resident output block alone.
//! - The visit and k axes carry state (`arbitrary`); n tiles are independent (`parallel`).
//!
//! Numerics: bf16 x bf16 on the MXU, f32 accumulation over k, one bf16 rounding on the
//! store. See `moe_reference::grouped_matmul`.

use crate::body::{GroupScales, QuantizedBlock, WeightBlock, WeightLayout};
use crate::quantized::{scale_rows, scale_span};
use palladium_dsl::build::{eq, ge, if_else, lt};
use palladium_dsl::prelude::*;

/// `num_tiles` when the routing is unknown: no bound below the worst case (the largest
/// parameter value; the grid takes [`visits`]).
pub const ANY_ROUTING: usize = i32::MAX as usize;

/// The visit axis' extent: `num_tiles`, at most the worst case `m / block_m + groups - 1`
/// (every group non-empty and starting inside a tile). Called with checked parameters
/// (`block_m`, `groups` >= 1), so the arithmetic cannot fail.
pub fn visits(m: usize, block_m: usize, groups: usize, num_tiles: usize) -> usize {
    (m / block_m + groups - 1).min(num_tiles)
}

/// The refs one grid step of a grouped matmul reads and writes, whatever its weight format.
struct GroupedStep {
    group_offsets: Ref,
    group_ids: Ref,
    m_tile_ids: Ref,
    num_visits: Ref,
    lhs: Ref,
    o: Ref,
    acc: Ref,
    block_m: usize,
    block_n: usize,
}

impl GroupedStep {
    /// One (n tile, visit, k tile) step: a real visit adds `lhs @ weight` to the f32
    /// accumulator (the weight block loaded by `weight`, bf16 or quantized codes with their
    /// scales) and, at the last k step, merges the rows of its group into the output block.
    fn run<W: WeightBlock>(&self, weight: impl FnOnce() -> W) {
        let visit = program_id(1);
        let kk = program_id(2);
        if_else(
            lt(visit, self.num_visits.load(0)),
            || {
                if_else(eq(kk, 0), || self.acc.store(.., 0.0), || ());
                let sum = self.acc.load(..);
                let x = self.lhs.load(..);
                self.acc.store(.., sum + weight().project_from(x, WeightLayout::InOut));
                if_else(eq(kk, num_programs(2) - 1), || self.merge(visit), || ());
            },
            || (),
        );
    }

    /// The visit's group's rows of the accumulated tile into the output block (the other
    /// rows keep what earlier visits of the tile wrote).
    fn merge(&self, visit: Val) {
        let group = self.group_ids.load(visit);
        let row = iota([self.block_m as u64, self.block_n as u64], 0)
            + self.m_tile_ids.load(visit) * self.block_m as i32;
        let mine =
            ge(row, self.group_offsets.load(group)) & lt(row, self.group_offsets.load(group + 1));
        self.o.store(.., select(mine, self.acc.load(..), self.o.load(..).cast(f32)).cast(bf16));
    }
}

#[kernel(
    grid = (n / block_n, visits(m, block_m, groups, num_tiles), k / block_k),
    semantics = (parallel, arbitrary, arbitrary),
    requires = [num_tiles >= m / block_m]
)]
pub fn grouped_matmul(
    #[default(512)] m: usize,
    #[default(2048)] k: usize,
    #[default(1536)] n: usize,
    #[default(128)] groups: usize,
    #[default(128)] block_m: usize,
    #[default(512)] block_k: usize,
    #[default(512)] block_n: usize,
    #[default(ANY_ROUTING)] num_tiles: usize,
    #[prefetch(i32[groups + 1], range = 0..=m)] group_offsets: Ref,
    #[prefetch(i32[m / block_m + groups - 1], range = 0..=groups - 1)] group_ids: Ref,
    #[prefetch(i32[m / block_m + groups - 1], range = 0..=m / block_m - 1)] m_tile_ids: Ref,
    #[prefetch(i32[1], range = 0..=visits(m, block_m, groups, num_tiles))] num_visits: Ref,
    #[input(bf16[m, k], block = [block_m, block_k], map = |_j, v, kk, _off, _gid, tid, _nv| (tid[v], kk))]
    lhs: Ref,
    #[input(bf16[groups, k, n], block = [None, block_k, block_n], map = |j, v, kk, _off, gid, _tid, _nv| (gid[v], kk, j))]
    rhs: Ref,
    #[output(bf16[m, n], block = [block_m, block_n], map = |j, v, _kk, _off, _gid, tid, _nv| (tid[v], j))]
    o: Ref,
    #[scratch(vmem, f32[block_m, block_n])] acc: Ref,
) {
    let step = GroupedStep {
        group_offsets,
        group_ids,
        m_tile_ids,
        num_visits,
        lhs,
        o,
        acc,
        block_m,
        block_n,
    };
    step.run(|| rhs[(0, .., ..)]);
}

/// `grouped_matmul` with quantized expert weights (issue 16): `rhs` as 8- or 4-bit codes
/// (`wdtype`: `i8`, `i4` or `f8e4m3fn`) `[groups, k, n]` plus f32 scales `[groups, k / group,
/// n]`, one per `group` consecutive inputs of each output column of each expert (the
/// `*_quantized` kernels' [`GroupScales`] layout, per expert). The defaults are the issue's
/// int4 experts, groups of 128 along the input; int8 per channel is `wdtype=i8 group=K`, fp8
/// 128 x 128 blocks `wdtype=f8e4m3fn group=128` with each block's scale repeated over its
/// columns. The scales block `[scale_rows(block_k, group), block_n]` rides with its code
/// block (the same group and k step), so with 128-groups a k split needs `block_k` a multiple
/// of 1024 (the TPU block rule on the scales' second-minor dim): the default `block_k` is
/// 1024. Each visit is `grouped_matmul`'s, the product `project_quantized`'s (bf16 x code dots
/// on the MXU, each group's partial times its scales).
#[kernel(
    grid = (n / block_n, visits(m, block_m, groups, num_tiles), k / block_k),
    semantics = (parallel, arbitrary, arbitrary),
    requires = [num_tiles >= m / block_m, wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, k % group == 0, block_k % group == 0 || group % block_k == 0]
)]
pub fn grouped_matmul_quantized(
    #[default(512)] m: usize,
    #[default(2048)] k: usize,
    #[default(1536)] n: usize,
    #[default(128)] groups: usize,
    #[default(128)] block_m: usize,
    #[default(1024)] block_k: usize,
    #[default(512)] block_n: usize,
    #[default(int4)] wdtype: DType,
    #[default(128)] group: usize,
    #[default(ANY_ROUTING)] num_tiles: usize,
    #[prefetch(i32[groups + 1], range = 0..=m)] group_offsets: Ref,
    #[prefetch(i32[m / block_m + groups - 1], range = 0..=groups - 1)] group_ids: Ref,
    #[prefetch(i32[m / block_m + groups - 1], range = 0..=m / block_m - 1)] m_tile_ids: Ref,
    #[prefetch(i32[1], range = 0..=visits(m, block_m, groups, num_tiles))] num_visits: Ref,
    #[input(bf16[m, k], block = [block_m, block_k], map = |_j, v, kk, _off, _gid, tid, _nv| (tid[v], kk))]
    lhs: Ref,
    #[input(wdtype[groups, k, n], block = [None, block_k, block_n], map = |j, v, kk, _off, gid, _tid, _nv| (gid[v], kk, j))]
    rhs: Ref,
    #[input(f32[groups, k / group, n], block = [None, scale_rows(block_k, group), block_n], map = |j, v, kk, _off, gid, _tid, _nv| (gid[v], kk * block_k / scale_span(block_k, group), j))]
    scales: Ref,
    #[output(bf16[m, n], block = [block_m, block_n], map = |j, v, _kk, _off, _gid, tid, _nv| (tid[v], j))]
    o: Ref,
    #[scratch(vmem, f32[block_m, block_n])] acc: Ref,
) {
    let step = GroupedStep {
        group_offsets,
        group_ids,
        m_tile_ids,
        num_visits,
        lhs,
        o,
        acc,
        block_m,
        block_n,
    };
    step.run(|| QuantizedBlock {
        codes: rhs[(0, .., ..)],
        scales: GroupScales { values: scales[(0, .., ..)], group: group as u64 },
    });
}

#[cfg(test)]
mod tests {
    use crate::{build, entry};

    fn settings(s: &[(&str, &str)]) -> Vec<(String, String)> {
        s.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    /// `num_tiles` fixes the visit axis at compile time (capped at the worst case, which is
    /// the default), and the seeded inputs route exactly that many visits (or the most the
    /// rows allow), every row in a group.
    #[test]
    fn num_tiles_fixes_the_visit_axis_and_the_inputs_fill_it() {
        let small = [("k", "256"), ("n", "256"), ("block_k", "256"), ("block_n", "256")];
        /// `m`, `groups`, `block_m`, `num_tiles`, the grid's visits, the routed visits
        /// (`None`: any up to the grid's).
        type Case = (usize, usize, usize, Option<usize>, u64, Option<i32>);
        let cases: [Case; 8] = [
            // The decode routing: 64 rows in one tile, 53 of 128 experts hit.
            (64, 128, 64, Some(53), 53, Some(53)),
            (512, 128, 128, Some(128), 128, Some(128)),
            (512, 16, 128, Some(4), 4, Some(4)),
            (256, 4, 64, Some(6), 6, Some(6)),
            // Above the worst case (4 + 3): the worst case, random routing.
            (256, 4, 64, Some(1000), 7, None),
            (256, 4, 64, None, 7, None),
            // 16 rows in one tile: a 128-visit worst case, but at most 16 real visits.
            (16, 128, 16, Some(143), 128, None),
            (16, 128, 16, Some(100), 100, Some(16)),
        ];
        for (m, groups, block_m, num_tiles, grid, routed) in cases {
            let mut s = settings(&small);
            for (name, value) in [("m", m), ("groups", groups), ("block_m", block_m)] {
                s.push((name.into(), value.to_string()));
            }
            if let Some(t) = num_tiles {
                s.push(("num_tiles".into(), t.to_string()));
            }
            let what = format!("m {m} groups {groups} block_m {block_m} num_tiles {num_tiles:?}");
            for kernel in ["grouped_matmul", "grouped_matmul_quantized"] {
                let k = build(kernel, &s).unwrap_or_else(|e| panic!("{kernel} {what}: {e}"));
                assert_eq!(k.call.grid[1].extent, grid, "{kernel} {what}");
            }
            let x = (entry("grouped_matmul").unwrap().inputs)(&s, 7).unwrap();
            let offsets = x[0].to_i32();
            assert_eq!((offsets[0], offsets[groups]), (0, m as i32), "{what}: every row routed");
            let num = x[3].to_i32()[0];
            match routed {
                Some(r) => assert_eq!(num, r, "{what}"),
                None => assert!(num as u64 <= grid, "{what}: {num} visits"),
            }
        }
    }

    #[test]
    fn fewer_tiles_than_m_tiles_are_refused_by_name() {
        let e = build("grouped_matmul", &settings(&[("num_tiles", "3")])).unwrap_err();
        assert!(
            e.to_string().contains(
                "requires num_tiles >= m / block_m, but num_tiles = 3, m = 512, block_m = 128"
            ),
            "{e}"
        );
    }
}
