//! Row-block gather by scalar-prefetched ids: `out[i] = table[ids[i]] * scale`, with the
//! table in HBM and the blocks streamed by manual, double-buffered DMAs (the pattern of
//! paged attention and of fetching MoE experts by id).
//!
//! One item per grid step, its output block written back by the grid's `BlockSpec`
//! pipeline: the stream's ring runs across grid steps (step `i` prefetches item `i + 1`), so
//! dsl's `pipeline`, a traced loop inside one invocation (what `decode_attention` and
//! `expert_ffn` stream with), does not apply without giving up the grid, and with it the
//! output's block pipeline (the whole output would sit in VMEM, or need a second, write
//! stream). Its first fetch and prefetches are under `if`s, and its slot is `step % 2`:
//! libtpu's v6e estimator aborts on this kernel (`palladium compile` reports why).

use palladium_dsl::prelude::*;

#[kernel(grid = (n,), semantics = (arbitrary,))]
pub fn gather_rows(
    #[default(8)] n: usize,
    #[default(64)] table_rows: usize,
    #[default(16)] r: usize,
    #[default(256)] d: usize,
    #[default(2.0)] scale: f64,
    #[prefetch(i32[n], range = 0..=table_rows - 1)] ids: Ref,
    #[input(bf16[table_rows, r, d], space = any)] table: Ref,
    #[output(bf16[n, r, d], block = [None, r, d], map = |i, _ids| (i, 0, 0))] out: Ref,
    #[scratch(vmem, bf16[2, r, d])] buf: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let step = program_id(0);
    let slot = step % 2;
    let fetch = |i: Val, slot: Val| async_copy(table.at(ids[i]), buf.at(slot), sems.at(slot));
    // Step 0 fetches its own block; every step prefetches the next one before waiting.
    if step == 0 {
        fetch(step, slot).start();
    }
    if step + 1 < num_programs(0) {
        fetch(step + 1, 1 - slot).start();
    }
    fetch(step, slot).wait();
    out[(0, .., ..)] = (buf[slot].cast(f32) * scale).cast(bf16);
}
