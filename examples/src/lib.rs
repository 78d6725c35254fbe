//! A kernel crate as an author outside this repository writes one, depending only on the
//! entry crate `palladium`. Two kernels, each with its plain-Rust reference and seeded
//! inputs:
//! - [`softmax`]: a row softmax over a grid of row blocks ([`softmax_reference`],
//!   [`softmax_inputs`]);
//! - [`linear_relu`]: `relu(x @ w + b)`, a tiled matmul whose contraction runs along a
//!   grid axis into a VMEM accumulator ([`linear_relu_reference`], [`linear_relu_inputs`]).
//!
//! The tests (`tests/softmax.rs`, `tests/linear_relu.rs`) emit them, interpret them against
//! their references, snapshot their IR and compile them with libtpu; the book's first
//! chapter (`docs/guide.md`) walks through them.

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

/// The kernel's input for `seed`: `rows x cols` bf16 values in [-4, 4).
pub fn softmax_inputs(p: &softmax::Params, seed: u64) -> Vec<HostArray> {
    let mut values = Uniform::new(seed);
    vec![HostArray::bf16_from_f32(&[p.rows, p.cols], &values.take(p.rows * p.cols, 4.0))]
}

/// `relu(x @ w + b)` with bf16 `x` and `w`, an f32 bias row and a bf16 result: the grid's
/// first two axes pick an output block (`parallel`), the third walks the contraction
/// (`arbitrary`: its steps run in order) and sums each step's `dot` into an f32 VMEM
/// accumulator, zeroed at the first step; the last step adds the bias, applies `relu` and
/// stores the block.
#[kernel(grid = (m / bm, n / bn, k / bk), semantics = (parallel, parallel, arbitrary))]
pub fn linear_relu(
    #[default(256)] m: usize,
    #[default(512)] k: usize,
    #[default(256)] n: usize,
    #[default(128)] bm: usize,
    #[default(256)] bk: usize,
    #[default(128)] bn: usize,
    #[input(bf16[m, k], block = [bm, bk], map = |i, _j, kk| (i, kk))] x: Ref,
    #[input(bf16[k, n], block = [bk, bn], map = |_i, j, kk| (kk, j))] w: Ref,
    #[input(f32[1, n], block = [1, bn], map = |_i, j, _kk| (0, j))] b: Ref,
    #[output(bf16[m, n], block = [bm, bn], map = |i, j, _kk| (i, j))] o: Ref,
    #[scratch(vmem, f32[bm, bn])] acc: Ref,
) {
    if program_id(2) == 0 {
        acc[..] = 0.0;
    }
    acc[..] += dot(x[..], w[..]);
    if program_id(2) == num_programs(2) - 1 {
        o[..] = (acc[..] + b[..]).maximum(0.0).cast(bf16);
    }
}

/// The reference: `relu(x @ w + b)` in f32 over the bf16 inputs, rounded to bf16.
pub fn linear_relu_reference(
    p: &linear_relu::Params,
    x: &HostArray,
    w: &HostArray,
    b: &HostArray,
) -> HostArray {
    let (x, w, b) = (x.to_f32(), w.to_f32(), b.to_f32());
    let mut out = vec![0f32; p.m * p.n];
    for (i, row) in out.chunks_mut(p.n).enumerate() {
        for (kk, &xv) in x[i * p.k..(i + 1) * p.k].iter().enumerate() {
            for (o, &wv) in row.iter_mut().zip(&w[kk * p.n..(kk + 1) * p.n]) {
                *o += xv * wv;
            }
        }
        for (o, &bias) in row.iter_mut().zip(&b) {
            *o = (*o + bias).max(0.0);
        }
    }
    HostArray::bf16_from_f32(&[p.m, p.n], &out)
}

/// The kernel's inputs for `seed`: `x` and `w` in [-1, 1) (bf16), the bias in [-4, 4) (f32),
/// so that about half the outputs are clipped by `relu`.
pub fn linear_relu_inputs(p: &linear_relu::Params, seed: u64) -> Vec<HostArray> {
    let mut values = Uniform::new(seed);
    vec![
        HostArray::bf16_from_f32(&[p.m, p.k], &values.take(p.m * p.k, 1.0)),
        HostArray::bf16_from_f32(&[p.k, p.n], &values.take(p.k * p.n, 1.0)),
        HostArray::from_f32(&[1, p.n], &values.take(p.n, 4.0)),
    ]
}

/// Deterministic values for the inputs: a xorshift stream (no dependency beyond
/// `palladium`).
struct Uniform(u64);

impl Uniform {
    fn new(seed: u64) -> Self {
        Uniform(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// `count` values in [-scale, scale).
    fn take(&mut self, count: usize, scale: f32) -> Vec<f32> {
        (0..count)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                // The top 24 bits as a fraction in [0, 1).
                let unit = (self.0 >> 40) as f32 / (1u64 << 24) as f32;
                (unit * 2.0 - 1.0) * scale
            })
            .collect()
    }
}
