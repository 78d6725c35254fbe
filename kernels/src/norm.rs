//! RMSNorm over the hidden dim: `x / sqrt(mean(x^2) + eps) * w`, computed in f32.

use crate::body::rms_norm;
use palladium_dsl::prelude::*;

#[kernel(grid = (rows / block_rows,), semantics = (parallel,), requires = [eps >= 0.0])]
pub fn rmsnorm(
    #[default(256)] rows: usize,
    #[default(2048)] hidden: usize,
    #[default(64)] block_rows: usize,
    #[default(1e-6)] eps: f64,
    #[input(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] x: Ref,
    #[input(bf16[1, hidden], block = [1, hidden], map = |_i| (0, 0))] weight: Ref,
    #[output(bf16[rows, hidden], block = [block_rows, hidden], map = |i| (i, 0))] o: Ref,
) {
    o[..] = rms_norm(x[..], Some(weight[..]), hidden as u64, eps);
}
