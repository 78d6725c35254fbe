//! The HBM floor: a plain kernel that streams bf16 weights from HBM through VMEM once, in
//! 4 MiB blocks (2048 x 1024), double-buffered by the grid pipeline, and touches each block
//! as little as a kernel can (8 rows accumulated). libtpu's estimate of it is the bandwidth
//! floor under the same estimator: a weight-bound kernel that moves N bytes is judged by
//! `floor_cycles(N) / its cycles` (1.0 = at the floor).

use palladium_dsl::Kernel;
use palladium_dsl::prelude::*;

/// Rows of one block (with [`COLS`]: 4 MiB of bf16).
pub const BLOCK_ROWS: u64 = 2048;
/// Columns of the streamed array.
pub const COLS: u64 = 1024;

#[kernel(grid = (rows / block_rows,), semantics = (arbitrary,))]
pub fn hbm_stream(
    #[default(2048)] rows: usize,
    #[default(2048)] block_rows: usize,
    #[default(1024)] cols: usize,
    #[input(bf16[rows, cols], block = [block_rows, cols], map = |i| (i, 0))] w: Ref,
    #[output(f32[8, cols], block = [8, cols], map = |_i| (0, 0))] o: Ref,
) {
    if program_id(0) == 0 {
        o[..] = 0.0;
    }
    o[..] += w[0..8].cast(f32);
}

/// The stream kernel for about `bytes` bytes (whole blocks, at least one), and the bytes it
/// streams.
pub fn stream_kernel(bytes: u64) -> Result<(Kernel, u64), String> {
    let rows = (bytes / (2 * COLS) / BLOCK_ROWS * BLOCK_ROWS).max(BLOCK_ROWS);
    let mut params = hbm_stream::Params::default();
    params.set("rows", &rows.to_string()).map_err(|e| e.to_string())?;
    let kernel = hbm_stream::build(&params).map_err(|e| format!("the HBM stream kernel: {e}"))?;
    Ok((kernel, rows * COLS * 2))
}
