//! Attention over KV tiles: one tile's scores, mask and online-softmax fold.

use palladium_dsl::build::{Carry, le, lt};
use palladium_dsl::ir::Value;
use palladium_dsl::prelude::*;

/// The running state of attention's online softmax over KV tiles: row max `m`, row sum `l`
/// and the unnormalised output `acc` (all f32; the output is `acc / l`).
#[derive(Clone, Copy)]
pub struct OnlineSoftmax {
    pub m: Val,
    pub l: Val,
    pub acc: Val,
}

/// Carried through traced loops over the tiles as its three values.
impl Carry for OnlineSoftmax {
    fn values(&self, out: &mut Vec<Option<Value>>) {
        (self.m, self.l, self.acc).values(out);
    }

    fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self {
        let (m, l, acc) = (self.m, self.l, self.acc).rebuild(it);
        OnlineSoftmax { m, l, acc }
    }
}

/// Which positions of a KV tile the query rows attend to: cache positions `start..start +
/// tile` against each row's causal limit (inclusive) and an optional sliding window.
#[derive(Clone, Copy)]
pub struct KvMask {
    /// The cache position of the tile's first row.
    pub start: Val,
    /// The last position attended to: the (first) query's own.
    pub last: Val,
    /// Rows holding `tokens` consecutive queries at `last..last + tokens` (a verify step):
    /// each row's offset from `last` (`[rows, 1]` i32) and `tokens`. Each row is causal at
    /// its own position, so the queries are causal among themselves. `None`: one query
    /// position for every row.
    pub queries: Option<(Val, u64)>,
    /// Only the `window` positions up to `last` (Mistral's `sliding_window`).
    pub window: Option<Window>,
    /// Also zero the V rows of masked positions. Their probabilities are zero, but a cache
    /// past `last` holds whatever it held (stale or uninitialised data) and `0 * NaN` is
    /// NaN; a caller whose masked rows are known finite skips it.
    pub zero_values: bool,
}

impl KvMask {
    /// `scores` (`[rows, tile]`) with masked positions at -inf, and `v` (`[tile, d]`, bf16)
    /// with their rows zeroed if asked.
    fn apply(self, scores: Val, v: Val) -> (Val, Val) {
        let (rows, tile) = (scores.shape().0[0], scores.shape().0[1]);
        let width = v.shape().0[1];
        // Before the (first) query's window; a query at `last` attends `(before, last]`.
        let first = self.window.map(|w| w.before(self.last));
        let attended = |position: Val, last: Val, before: Option<Val>| {
            let causal = le(position, last);
            match before {
                Some(before) => causal & lt(before, position),
                None => causal,
            }
        };
        // Each row's limits, and the newest position any row attends.
        let (row_last, row_before, newest) = match self.queries {
            Some((offsets, tokens)) => {
                let row_last = self.last + offsets;
                (
                    row_last,
                    self.window.map(|window| window.before(row_last)),
                    self.last + (tokens as i32 - 1),
                )
            }
            None => (self.last, first, self.last),
        };
        let scores = select(
            attended(iota([rows, tile], 1) + self.start, row_last, row_before),
            scores,
            f64::NEG_INFINITY,
        );
        if !self.zero_values {
            return (scores, v);
        }
        // Zeroed: the V rows no query attends (the only ones that may hold stale data).
        let v =
            select(attended(iota([tile, width], 0) + self.start, newest, first), v.cast(f32), 0.0)
                .cast(bf16);
        (scores, v)
    }
}

impl OnlineSoftmax {
    /// The state before the first tile, for `rows` query rows of width `width`. The running
    /// max starts finite: a tile wholly masked before the first attended one (a sliding
    /// window, or every tile read) keeps it, with `exp(m - m_new) = 1`, not NaN.
    pub fn start(rows: u64, width: u64) -> OnlineSoftmax {
        OnlineSoftmax {
            m: full([rows, 1], -1e30, f32),
            l: zeros([rows, 1], f32),
            acc: zeros([rows, width], f32),
        }
    }

    /// Attend to one KV tile: the scores `q @ k.T` (`q` `[rows, d]`, `k` and `v` `[tile, d]`,
    /// bf16), times `scale` unless the caller folded it into `q`, masked by `mask` (none
    /// where every position of the tile is attended), folded in.
    pub fn attend(
        self,
        q: Val,
        k: Val,
        v: Val,
        scale: Option<f64>,
        mask: Option<KvMask>,
    ) -> OnlineSoftmax {
        let scores = dot_t(q, k);
        let scores = match scale {
            Some(c) => scores * c,
            None => scores,
        };
        let (scores, v) = match mask {
            Some(mask) => mask.apply(scores, v),
            None => (scores, v),
        };
        self.fold(scores, v)
    }

    /// Fold one tile in: `scores` `[rows, tile]` (already scaled and masked with -inf) and
    /// the tile's values `v` `[tile, d]` (bf16). The probabilities go to the MXU in bf16.
    fn fold(self, scores: Val, v: Val) -> OnlineSoftmax {
        let m = self.m.maximum(scores.max_keepdims(1));
        let correction = (self.m - m).exp();
        let p = (scores - m).exp();
        let l = self.l * correction + p.sum_keepdims(1);
        let acc = self.acc * correction + dot(p.cast(bf16), v);
        OnlineSoftmax { m, l, acc }
    }

    /// The attention output, `acc / l` (f32).
    pub fn output(self) -> Val {
        self.acc / self.l
    }
}

/// A sliding window's size: static, or a run-time scalar (`i32`; layers of one traced
/// loop that differ in their window, gpt-oss's sliding and full layers, a full one's as
/// large as the cache).
#[derive(Clone, Copy)]
pub enum Window {
    Fixed(u64),
    PerLayer(Val),
}

impl Window {
    /// The last position before the window of a query at `last`.
    fn before(self, last: Val) -> Val {
        match self {
            Window::Fixed(w) => last - w as i32,
            Window::PerLayer(w) => last - w,
        }
    }
}

impl OnlineSoftmax {
    /// [`Self::start`] with a sink per row (`sink` `[rows, 1]` f32; gpt-oss's per-head
    /// learned logit): one more logit in each row's softmax denominator, attending to no
    /// value. As if a first tile held it: running max `sink`, sum `exp(sink - sink)` = 1.
    pub fn with_sink(rows: u64, width: u64, sink: Val) -> OnlineSoftmax {
        OnlineSoftmax { m: sink, l: zeros([rows, 1], f32) + 1.0, acc: zeros([rows, width], f32) }
    }
}
