//! The Pallas tiled matmul: bf16 in, f32 accumulator in VMEM scratch, the reduction (k)
//! axis last so each output block stays resident while it accumulates; bf16 or f32 out
//! (`out_dtype`).

use palladium_dsl::prelude::*;

#[kernel(grid = (m / bm, n / bn, k / bk), semantics = (parallel, parallel, arbitrary), requires = [out_dtype == bf16 || out_dtype == f32])]
pub fn matmul(
    #[default(1024)] m: usize,
    #[default(2048)] k: usize,
    #[default(1024)] n: usize,
    #[default(256)] bm: usize,
    #[default(512)] bk: usize,
    #[default(256)] bn: usize,
    #[default(bf16)] out_dtype: DType,
    #[input(bf16[m, k], block = [bm, bk], map = |i, _j, kk| (i, kk))] x: Ref,
    #[input(bf16[k, n], block = [bk, bn], map = |_i, j, kk| (kk, j))] y: Ref,
    #[output(out_dtype[m, n], block = [bm, bn], map = |i, j, _kk| (i, j))] o: Ref,
    #[scratch(vmem, f32[bm, bn])] acc: Ref,
) {
    if program_id(2) == 0 {
        acc[..] = 0.0;
    }
    acc[..] += dot(x[..], y[..]);
    if program_id(2) == num_programs(2) - 1 {
        o[..] = acc[..].cast(out_dtype);
    }
}
