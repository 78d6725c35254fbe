//! Decode attention over a KV cache in HBM (grouped-query attention).
//!
//! One grid step per (sequence, kv head): the `group` query heads that share the kv head
//! attend to the sequence's first `lens[b]` cached positions (scalar prefetch; `lens[b] >=
//! 1`). K and V tiles of `block_kv` positions are streamed from HBM by manual DMAs into a
//! two-slot VMEM ring by the DSL's `pipeline` (tile t+1 is in flight while tile t is used),
//! each tile attended to by the body [`crate::body::OnlineSoftmax::attend`] (the megakernel's
//! too). Softmax is computed online (running max `m`, normaliser `l`, accumulator `acc`, all
//! f32), so the context length is bounded by HBM, not VMEM.
//!
//! The stream runs across grid steps, as JAX's `paged_attention` does: before a step's last
//! tile is attended to, the next step's first tile is issued into the other slot (SMEM
//! scratch `first_slot` says which slot it is in), so only the grid's very first tile waits
//! unoverlapped. Both grid axes are therefore sequential (`arbitrary`); with one tile per
//! step (`block_kv == max_context`) this is what makes large blocks pay (libtpu's v6e
//! estimate, 8 sequences x 8 KV heads x group 4, d 128, 4096 positions: 213473 cycles
//! without it).
//!
//! Benchmark variants (compile-time, default off): `bench_full_context` ignores `lens` and
//! attends to all `max_context` positions with *static* loop bounds (`tiles` is a
//! constant), so that libtpu's static estimate can price the KV loop (with run-time
//! bounds it counts none of it); `unroll_kv` (with `bench_full_context`) unrolls the loop
//! in Rust, one copy of the tile body per KV tile.

use crate::body::{KvMask, OnlineSoftmax};
use palladium_dsl::build::{Drain, eq, if_else, lt, pipeline, range};
use palladium_dsl::prelude::*;

// Whole KV tiles (a partial last tile would DMA past `max_context`); `unroll_kv` is a variant
// of `bench_full_context` and unrolls one tile body per tile at trace time.
#[kernel(
    grid = (batch, kv_heads),
    semantics = (arbitrary, arbitrary),
    requires = [max_context % block_kv == 0, !unroll_kv || bench_full_context, !unroll_kv || max_context / block_kv <= 256]
)]
pub fn decode_attention(
    #[default(2)] batch: usize,
    #[default(4)] kv_heads: usize,
    #[default(8)] group: usize,
    #[default(128)] head_dim: usize,
    #[default(4096)] max_context: usize,
    #[default(512)] block_kv: usize,
    #[default(false)] bench_full_context: bool,
    #[default(false)] unroll_kv: bool,
    #[prefetch(i32[batch], range = 1..=max_context)] lens: Ref,
    #[input(bf16[batch, kv_heads, group, head_dim], block = [None, None, group, head_dim], map = |b, h, _lens| (b, h, 0, 0))]
    q: Ref,
    #[input(bf16[batch, kv_heads, max_context, head_dim], space = any)] k_cache: Ref,
    #[input(bf16[batch, kv_heads, max_context, head_dim], space = any)] v_cache: Ref,
    #[output(bf16[batch, kv_heads, group, head_dim], block = [None, None, group, head_dim], map = |b, h, _lens| (b, h, 0, 0))]
    o: Ref,
    #[scratch(vmem, bf16[2, block_kv, head_dim])] k_buf: Ref,
    #[scratch(vmem, bf16[2, block_kv, head_dim])] v_buf: Ref,
    #[scratch(dma_sem[2, 2])] sems: SemRef,
    #[scratch(smem, i32[1])] first_slot: Ref,
) {
    let b = program_id(0);
    let h = program_id(1);
    let n_tiles = max_context.div_ceil(block_kv);
    let (len, tiles) = if bench_full_context {
        (scalar(max_context as i32), scalar(n_tiles as i32))
    } else {
        let len = lens[b];
        (len, (len + (block_kv as i32 - 1)) / block_kv as i32)
    };
    // Tile `tile` of grid step (`b`, `h`)'s K and V into ring slot `slot`.
    let fetch_at = |b: Val, h: Val, tile: Val, slot: Val| {
        let start = (tile * block_kv as i32).multiple_of(block_kv as u32);
        let k = async_copy(
            k_cache.at((b, h, ds(start, block_kv as u64), ..)),
            k_buf.at(slot),
            sems.at((0, slot)),
        );
        let v = async_copy(
            v_cache.at((b, h, ds(start, block_kv as u64), ..)),
            v_buf.at(slot),
            sems.at((1, slot)),
        );
        (k, v)
    };
    let fetch = |tile: Val, slot: Val| fetch_at(b, h, tile, slot);
    // The next grid step (row-major), the last one standing in for itself at the end.
    let (last_b, last_h) = (batch as i32 - 1, kv_heads as i32 - 1);
    let head_end = eq(h, last_h);
    let grid_end = head_end & eq(b, last_b);
    let next_b = select(head_end & lt(b, last_b), b + 1, b);
    let next_h = select(head_end, select(grid_end, h, scalar(0)), h + 1);
    // Only the grid's first tile is issued by its own step.
    if_else(
        eq(b, 0) & eq(h, 0),
        || {
            first_slot.store(0, scalar(0));
            let (k0, v0) = fetch(scalar(0), scalar(0));
            k0.start();
            v0.start();
        },
        || (),
    );
    let slot0 = first_slot.load(0);
    let scale = 1.0 / (head_dim as f64).sqrt();
    let qv = q[(0, 0, .., ..)];
    // Positions from `len` on are masked out of the scores; their V rows are not zeroed (the
    // caller's cache holds finite data there, stale or zero: a NaN would reach the output).
    let last_position = len - 1;
    // Tile t + 1 into the other slot (unconditionally: libtpu's v6e profiler cannot price,
    // and aborts on, a DMA issued under an `if`).
    let prefetch = |next: Val, slot: Val| {
        let (k_next, v_next) = fetch(next, 1 - slot);
        k_next.start();
        v_next.start();
    };
    // Before the step's last tile: the next step's first tile, into the other slot
    // (unconditionally too; the grid's last step fetches its own first tile again and waits
    // for it below).
    let prefetch_next_step = |slot: Val| {
        let (k_next, v_next) = fetch_at(next_b, next_h, scalar(0), 1 - slot);
        k_next.start();
        v_next.start();
    };
    // One KV tile in ring slot `slot`: wait for it, attend to it.
    let tile = |t: Val, slot: Val, state: OnlineSoftmax| -> OnlineSoftmax {
        let (k_now, v_now) = fetch(t, slot);
        k_now.wait();
        v_now.wait();
        let mask = KvMask {
            start: t * block_kv as i32,
            last: last_position,
            queries: None,
            window: None,
            zero_values: false,
        };
        state.attend(qv, k_buf[slot], v_buf[slot], Some(scale), Some(mask))
    };
    let init = OnlineSoftmax::start(group as u64, head_dim as u64);
    let (state, next_slot) = if bench_full_context && unroll_kv {
        let mut state = init;
        let mut slot = slot0;
        for t in unrolled(0, n_tiles) {
            if t + 1 < n_tiles {
                prefetch(scalar(t as i32 + 1), slot);
            } else {
                prefetch_next_step(slot);
            }
            state = tile(scalar(t as i32), slot, state);
            slot = 1 - slot;
        }
        (state, slot)
    } else {
        // The slot is carried, not `t % 2`: with a slot computed from the induction
        // variable, libtpu 0.0.42.1's v6e profiler aborts ("Unsupported DMA direction: 0 on
        // GL/GLP") on loops of 3+ tiles.
        let last = tiles - 1;
        pipeline(
            range(scalar(0), last),
            Drain::Peeled { start: last, count: 1 },
            1,
            (init, slot0),
            |next: Val, &(_, slot): &(OnlineSoftmax, Val)| prefetch(next, slot),
            |t: Val, (state, slot): (OnlineSoftmax, Val), draining: bool| {
                if draining {
                    prefetch_next_step(slot);
                }
                (tile(t, slot, state), 1 - slot)
            },
        )
    };
    first_slot.store(0, next_slot);
    if_else(
        grid_end,
        || {
            let (k_extra, v_extra) = fetch(scalar(0), next_slot);
            k_extra.wait();
            v_extra.wait();
        },
        || (),
    );
    o[(0, 0, .., ..)] = state.output().cast(bf16);
}
