//! A kernel crate as an author outside this repository writes one, depending only on the
//! entry crate `palladium`: a row softmax over a grid of row blocks ([`softmax`]), its
//! plain-Rust reference ([`softmax_reference`]) and seeded inputs ([`softmax_inputs`]). The
//! tests (`tests/softmax.rs`) emit it, interpret it against the reference, snapshot its IR and
//! compile it with libtpu; the book's first chapter (`docs/guide.md`) walks through them.

use palladium::HostArray;
use palladium::prelude::*;

/// Row softmax of a bf16 matrix, computed in f32: `exp(x - max(x)) / sum(exp(x - max(x)))`
/// along each row, rounded to bf16. One grid step per block of `block_rows` rows (whole
/// rows: the reductions need them), the steps independent (`parallel`).
#[kernel(grid = (rows / block_rows,), semantics = (parallel,))]
pub fn softmax(
    #[default(256)] rows: usize,
    #[default(512)] cols: usize,
    #[default(32)] block_rows: usize,
    #[input(bf16[rows, cols], block = [block_rows, cols], map = |i| (i, 0))] x: Ref,
    #[output(bf16[rows, cols], block = [block_rows, cols], map = |i| (i, 0))] o: Ref,
) {
    let v = x[..].cast(f32);
    let e = (v - v.max_keepdims(1)).exp();
    o[..] = (e / e.sum_keepdims(1)).cast(bf16);
}

/// The reference: the same math in plain Rust over `x` (`rows x cols`, any float dtype),
/// f32 throughout, rounded to bf16 at the end as the kernel stores it.
pub fn softmax_reference(p: &softmax::Params, x: &HostArray) -> HostArray {
    let values = x.to_f32();
    let mut out = Vec::with_capacity(values.len());
    for row in values.chunks(p.cols) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        out.extend(e.iter().map(|v| v / sum));
    }
    HostArray::bf16_from_f32(&[p.rows, p.cols], &out)
}

/// The kernel's input for `seed`: `rows x cols` bf16 values in [-4, 4), deterministic
/// (a xorshift stream: no dependency beyond `palladium`).
pub fn softmax_inputs(p: &softmax::Params, seed: u64) -> Vec<HostArray> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f32> = (0..p.rows * p.cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // The top 24 bits as a fraction in [0, 1), scaled to [-4, 4).
            (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect();
    vec![HostArray::bf16_from_f32(&[p.rows, p.cols], &values)]
}
