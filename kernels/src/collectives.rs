//! Collectives over a 1-D ring of `n` devices (mesh axis `x`), in-kernel over remote DMAs,
//! as a TPU megakernel does them between layers: `permute` (ring shift), `all_gather`,
//! `reduce_scatter` and `all_reduce` (reduce-scatter then all-gather; one direction round
//! the ring, or both with half the columns each).
//!
//! Operands are each device's own (`jax.shard_map` with `P("x")`): whole arrays in VMEM. The
//! kernels start with the barrier (signal both neighbours, wait for both) so that no device
//! writes into a neighbour that has not started the kernel; every hop lands in a buffer slot
//! of its own (no slot is reused, so no credit signals are needed) and is waited on before
//! it is read. Sums are f32 on the device and bf16 on the wire (each hop's partial is
//! rounded to bf16, as the hand-written megakernel sends it).

use crate::body::collective::{Hops, Way, directions, ring, ring_barrier};
use palladium_dsl::prelude::*;

/// Permute: device `i`'s `x` lands in device `i + shift`'s `o` (`jax.lax.ppermute` round the
/// ring).
#[kernel(mesh = [x = n], collective_id = 0, requires = [n >= 2, shift % n != 0])]
pub fn permute(
    #[default(4)] n: usize,
    #[default(1)] shift: usize,
    #[default(8)] rows: usize,
    #[default(128)] cols: usize,
    #[input(f32[rows, cols])] x: Ref,
    #[output(f32[rows, cols])] o: Ref,
    #[scratch(dma_sem)] send: SemRef,
    #[scratch(dma_sem)] recv: SemRef,
) {
    // Pallas's ring permute, op for op: the neighbours once, the barrier, one remote copy.
    let me = axis_index("x");
    let (right, left) = (ring(me, 1, n), ring(me, -1, n));
    ring_barrier(left, right);
    let target = if shift == 1 { right } else { ring(me, shift as i64, n) };
    let copy = remote_copy(x, o, send, recv, target);
    copy.start();
    copy.wait();
}

/// All-gather: `o` stacks every device's `x` in device order.
#[kernel(mesh = [x = n], collective_id = 0, requires = [n >= 2])]
pub fn all_gather(
    #[default(4)] n: usize,
    #[default(16)] rows: usize,
    #[default(128)] cols: usize,
    #[input(bf16[rows, cols])] x: Ref,
    #[output(bf16[n * rows, cols])] o: Ref,
    #[scratch(dma_sem[n - 1])] send: SemRef,
    #[scratch(dma_sem[n - 1])] recv: SemRef,
) {
    let me = axis_index("x");
    o.at((ds(me * scalar(rows as i32), rows as u64), ..))[..] = x[..];
    ring_barrier(ring(me, -1, n), ring(me, 1, n));
    Hops {
        me,
        n,
        rows: rows as u64,
        ways: vec![Way { dir: 1, cols: (0, cols as u64), send, recv }],
    }
    .gather(o);
}

/// Reduce-scatter: device `i`'s `o` is block `i` (rows `i * rows ..`) of the sum over
/// devices of `x`.
#[kernel(mesh = [x = n], collective_id = 0, requires = [n >= 2])]
pub fn reduce_scatter(
    #[default(4)] n: usize,
    #[default(16)] rows: usize,
    #[default(128)] cols: usize,
    #[input(bf16[n * rows, cols])] x: Ref,
    #[output(bf16[rows, cols])] o: Ref,
    #[scratch(vmem, bf16[n, rows, cols])] stage: Ref,
    #[scratch(dma_sem[n - 1])] send: SemRef,
    #[scratch(dma_sem[n - 1])] recv: SemRef,
) {
    let me = axis_index("x");
    ring_barrier(ring(me, -1, n), ring(me, 1, n));
    Hops {
        me,
        n,
        rows: rows as u64,
        ways: vec![Way { dir: 1, cols: (0, cols as u64), send, recv }],
    }
    .reduce(x, o, stage);
}

/// All-reduce: every device's `o` is the sum over devices of `x`, as a ring reduce-scatter
/// (into this device's block of `o`) then a ring all-gather of the blocks; `bidirectional`
/// sends half the columns each way round the ring (both links of a ring busy).
#[kernel(mesh = [x = n], collective_id = 0, requires = [n >= 2, cols % 256 == 0])]
pub fn all_reduce(
    #[default(4)] n: usize,
    #[default(16)] rows: usize,
    #[default(256)] cols: usize,
    #[default(true)] bidirectional: bool,
    #[input(bf16[n * rows, cols])] x: Ref,
    #[output(bf16[n * rows, cols])] o: Ref,
    #[scratch(vmem, bf16[n, rows, cols])] stage: Ref,
    #[scratch(dma_sem[4, n - 1])] send: SemRef,
    #[scratch(dma_sem[4, n - 1])] recv: SemRef,
) {
    let me = axis_index("x");
    ring_barrier(ring(me, -1, n), ring(me, 1, n));
    let mine = o.at((ds(me * scalar(rows as i32), rows as u64), ..));
    let hops = |first| Hops {
        me,
        n,
        rows: rows as u64,
        ways: directions(cols as u64, bidirectional, send, recv, first),
    };
    hops(0).reduce(x, mine, stage);
    hops(2).gather(o);
}
