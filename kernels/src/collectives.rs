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

use palladium_dsl::prelude::*;

/// `(me + k) mod n` for a traced device position (`k` may be negative).
fn ring(me: Val, k: i64, n: usize) -> Val {
    let n = n as i64;
    (me + scalar(k.rem_euclid(n) as i32)) % scalar(n as i32)
}

/// Every device signals both ring neighbours on the barrier semaphore and waits for their
/// two signals: after it, both neighbours run the kernel (their buffers exist).
fn ring_barrier(left: Val, right: Val) {
    let barrier = barrier_semaphore();
    barrier.signal_remote(1, left);
    barrier.signal_remote(1, right);
    barrier.wait(2);
}

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

/// One direction round the ring (`dir` = 1: to the right, -1: to the left) for this
/// device (`me` of `n`), over row blocks of `rows`, with a send and a receive semaphore per
/// hop (`n - 1` each).
#[derive(Copy, Clone)]
struct Hops {
    me: Val,
    n: usize,
    rows: u64,
    dir: i64,
    send: SemRef,
    recv: SemRef,
}

impl Hops {
    /// The first row of block `block` (traced).
    fn row_of(&self, block: Val) -> Val {
        block * scalar(self.rows as i32)
    }

    /// Hop `s`'s copy of `from` here into `to` on the next device, started and waited on
    /// (sent, and this device's incoming copy of the same hop arrived).
    fn hop(&self, s: usize, from: Ref, to: Ref) {
        let copy = remote_copy(from, to, self.send.at(s as i32), self.recv.at(s as i32), ring(self.me, self.dir, self.n));
        copy.start();
        copy.wait();
    }

    /// All-gather of the `n` row blocks of `buf` (this device's own at `me` already in
    /// place), columns `cols`: at hop `s` the block that arrived last (`me - s`, or `me + s`
    /// the other way) moves on.
    fn gather(&self, buf: Ref, cols: (u64, u64)) {
        for s in 0..self.n - 1 {
            let block = ring(self.me, -self.dir * s as i64, self.n);
            let slot = buf.at((ds(self.row_of(block), self.rows), ds(cols.0 as i32, cols.1)));
            self.hop(s, slot, slot);
        }
    }

    /// Reduce-scatter of `x` (`n` row blocks) into `out` (this device's block of the sum),
    /// columns `cols`, through `stage` (one slot per hop): at hop `s` the partial sum of
    /// block `me - dir (s + 1)` moves on (bf16) and the receiver adds its own rows of it.
    fn reduce(&self, x: Ref, out: Ref, stage: Ref, cols: (u64, u64)) {
        let c = ds(cols.0 as i32, cols.1);
        // The partial this device starts: its own rows of the block `n - 1` hops ahead.
        let first = ring(self.me, -self.dir, self.n);
        stage.at((0, .., c)).store(.., x.at((ds(self.row_of(first), self.rows), c)).load(..));
        for s in 0..self.n - 1 {
            let (from, to) = (stage.at((s as i32, .., c)), stage.at((s as i32 + 1, .., c)));
            self.hop(s, from, to);
            let block = ring(self.me, -self.dir * (s as i64 + 2), self.n);
            let sum = to.load(..).cast(f32) + x.at((ds(self.row_of(block), self.rows), c)).load(..).cast(f32);
            if s + 1 < self.n - 1 {
                to.store(.., sum.cast(bf16));
            } else {
                out.at((.., c)).store(.., sum.cast(bf16));
            }
        }
    }
}

/// The ring directions and the columns (start, size) each carries.
fn directions(cols: u64, bidirectional: bool) -> Vec<(i64, (u64, u64))> {
    match bidirectional {
        true => vec![(1, (0, cols / 2)), (-1, (cols / 2, cols / 2))],
        false => vec![(1, (0, cols))],
    }
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
    Hops { me, n, rows: rows as u64, dir: 1, send, recv }.gather(o, (0, cols as u64));
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
    Hops { me, n, rows: rows as u64, dir: 1, send, recv }.reduce(x, o, stage, (0, cols as u64));
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
    let halves = directions(cols as u64, bidirectional);
    for (k, &(dir, c)) in halves.iter().enumerate() {
        Hops { me, n, rows: rows as u64, dir, send: send.at(k as i32), recv: recv.at(k as i32) }.reduce(x, mine, stage, c);
    }
    for (k, &(dir, c)) in halves.iter().enumerate() {
        let k = k as i32 + 2;
        Hops { me, n, rows: rows as u64, dir, send: send.at(k), recv: recv.at(k) }.gather(o, c);
    }
}
