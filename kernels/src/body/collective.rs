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

/// One direction's share of a ring collective: `dir` = 1 to the right, -1 to the left; the
/// columns (start, size) it carries; a send and a receive semaphore per hop (`n - 1` each).
#[derive(Copy, Clone)]
pub struct Way {
    pub dir: i64,
    pub cols: (u64, u64),
    pub send: SemRef,
    pub recv: SemRef,
}

/// The hops of a ring collective for this device (`me` of `n`), over row blocks of `rows`,
/// in one or more [`Way`]s. Every hop starts all the ways' copies before waiting on any, so
/// the two directions of a bidirectional ring keep both links busy at once.
#[derive(Clone)]
pub struct Hops {
    pub me: Val,
    pub n: usize,
    pub rows: u64,
    pub ways: Vec<Way>,
}

impl Hops {
    /// The first row of block `block` (traced).
    fn row_of(&self, block: Val) -> Val {
        block * scalar(self.rows as i32)
    }

    /// Hop `s`: each way's copy of its `(from, to)` slot (here into its next device), all
    /// made (their targets computed), then all started back to back, then all waited on
    /// (sent, and this device's incoming copies of the same hop arrived).
    fn hop(&self, s: usize, slots: &[(Ref, Ref)]) {
        let copies: Vec<_> = self
            .ways
            .iter()
            .zip(slots)
            .map(|(w, &(from, to))| {
                remote_copy(
                    from,
                    to,
                    w.send.at(s as i32),
                    w.recv.at(s as i32),
                    ring(self.me, w.dir, self.n),
                )
            })
            .collect();
        for &copy in &copies {
            copy.start();
        }
        for copy in copies {
            copy.wait();
        }
    }

    /// All-gather of the `n` row blocks of `buf` (this device's own at `me` already in
    /// place): at hop `s` each way moves on the block that arrived last (`me - s`, or
    /// `me + s` the other way), in its columns.
    pub fn gather(&self, buf: Ref) {
        for s in 0..self.n - 1 {
            let slots: Vec<_> = self
                .ways
                .iter()
                .map(|w| {
                    let block = ring(self.me, -w.dir * s as i64, self.n);
                    let slot =
                        buf.at((ds(self.row_of(block), self.rows), ds(w.cols.0 as i32, w.cols.1)));
                    (slot, slot)
                })
                .collect();
            self.hop(s, &slots);
        }
    }

    /// Reduce-scatter of `x` (`n` row blocks) into `out` (this device's block of the sum)
    /// through `stage` (one slot per hop): at hop `s` each way's partial sum of block
    /// `me - dir (s + 1)` moves on (bf16), in its columns, and the receiver adds its own
    /// rows of it.
    pub fn reduce(&self, x: Ref, out: Ref, stage: Ref) {
        let cols = |w: &Way| ds(w.cols.0 as i32, w.cols.1);
        for w in &self.ways {
            // The partial this device starts: its own rows of the block `n - 1` hops ahead.
            let first = ring(self.me, -w.dir, self.n);
            stage
                .at((0, .., cols(w)))
                .store(.., x.at((ds(self.row_of(first), self.rows), cols(w))).load(..));
        }
        for s in 0..self.n - 1 {
            let slots: Vec<_> = self
                .ways
                .iter()
                .map(|w| (stage.at((s as i32, .., cols(w))), stage.at((s as i32 + 1, .., cols(w)))))
                .collect();
            self.hop(s, &slots);
            for (w, &(_, to)) in self.ways.iter().zip(&slots) {
                let block = ring(self.me, -w.dir * (s as i64 + 2), self.n);
                let sum = to.load(..).cast(f32)
                    + x.at((ds(self.row_of(block), self.rows), cols(w))).load(..).cast(f32);
                if s + 1 < self.n - 1 {
                    to.store(.., sum.cast(bf16));
                } else {
                    out.at((.., cols(w))).store(.., sum.cast(bf16));
                }
            }
        }
    }
}

/// The ways of a ring collective over `cols` columns: one to the right with all of them, or
/// (`bidirectional`) both, half the columns each; way `k` takes semaphore rows `first + k`
/// of `send` and `recv`.
pub fn directions(
    cols: u64,
    bidirectional: bool,
    send: SemRef,
    recv: SemRef,
    first: i32,
) -> Vec<Way> {
    let split = match bidirectional {
        true => vec![(1, (0, cols / 2)), (-1, (cols / 2, cols / 2))],
        false => vec![(1, (0, cols))],
    };
    split
        .into_iter()
        .zip(first..)
        .map(|((dir, cols), k)| Way { dir, cols, send: send.at(k), recv: recv.at(k) })
        .collect()
}
