//! Ring collectives over remote DMAs, the hop logic of one implementation: the library's
//! `permute`, `all_gather`, `reduce_scatter` and `all_reduce` (`crate::collectives`) are
//! built on it, and the sharded decode megakernel's in-kernel all-reduces are to be (its
//! partial sums staged as `n` row blocks, then [`Hops::reduce`] and [`Hops::gather`]).
//!
//! A 1-D ring of `n` devices: every hop lands in a buffer slot of its own and is waited on
//! before it is read; sums are f32 on the device and bf16 on the wire (each hop's partial is
//! rounded to bf16, as the hand-written megakernel sends it).

use palladium_dsl::prelude::*;

/// `(me + k) mod n` for a traced device position (`k` may be negative).
pub fn ring(me: Val, k: i64, n: usize) -> Val {
    let n = n as i64;
    (me + scalar(k.rem_euclid(n) as i32)) % scalar(n as i32)
}

/// Every device signals both ring neighbours on the barrier semaphore and waits for their
/// two signals: after it, both neighbours run the kernel (their buffers exist).
pub fn ring_barrier(left: Val, right: Val) {
    let barrier = barrier_semaphore();
    barrier.signal_remote(1, left);
    barrier.signal_remote(1, right);
    barrier.wait(2);
}

/// One direction round the ring (`dir` = 1: to the right, -1: to the left) for this
/// device (`me` of `n`), over row blocks of `rows`, with a send and a receive semaphore per
/// hop (`n - 1` each).
#[derive(Copy, Clone)]
pub struct Hops {
    pub me: Val,
    pub n: usize,
    pub rows: u64,
    pub dir: i64,
    pub send: SemRef,
    pub recv: SemRef,
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
    pub fn gather(&self, buf: Ref, cols: (u64, u64)) {
        for s in 0..self.n - 1 {
            let block = ring(self.me, -self.dir * s as i64, self.n);
            let slot = buf.at((ds(self.row_of(block), self.rows), ds(cols.0 as i32, cols.1)));
            self.hop(s, slot, slot);
        }
    }

    /// Reduce-scatter of `x` (`n` row blocks) into `out` (this device's block of the sum),
    /// columns `cols`, through `stage` (one slot per hop): at hop `s` the partial sum of
    /// block `me - dir (s + 1)` moves on (bf16) and the receiver adds its own rows of it.
    pub fn reduce(&self, x: Ref, out: Ref, stage: Ref, cols: (u64, u64)) {
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
pub fn directions(cols: u64, bidirectional: bool) -> Vec<(i64, (u64, u64))> {
    match bidirectional {
        true => vec![(1, (0, cols / 2)), (-1, (cols / 2, cols / 2))],
        false => vec![(1, (0, cols))],
    }
}
