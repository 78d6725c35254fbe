//! Greedy decoding's argmax, in the kernel: a running (maximum, id) per row over the
//! `lm_head` logits chunk by chunk, so only the ids and the maxima leave the chip.

use palladium_dsl::build::{Carry, IntoVal, eq, gt, lt};
use palladium_dsl::ir::Value;
use palladium_dsl::prelude::*;

/// Each row's greedy choice so far: the maximum logit `max` (`[rows, 1]` f32; NaN once any
/// of the row's logits was not finite) and `id` (`[rows, 1]` i32), the lowest vocabulary
/// id holding that maximum (`jnp.argmax`'s tie rule).
#[derive(Clone, Copy)]
pub struct Greedy {
    pub max: Val,
    pub id: Val,
}

/// Carried through traced loops over the chunks as its two values.
impl Carry for Greedy {
    fn values(&self, out: &mut Vec<Option<Value>>) {
        (self.max, self.id).values(out);
    }

    fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self {
        let (max, id) = (self.max, self.id).rebuild(it);
        Greedy { max, id }
    }
}

impl Greedy {
    /// Before the first chunk, for `rows` rows.
    pub fn start(rows: u64) -> Greedy {
        Greedy { max: full([rows, 1], f64::NEG_INFINITY, f32), id: zeros([rows, 1], i32) }
    }

    /// Fold in the logits `chunk` (`[rows, cols]` f32) of vocabulary ids `first..first +
    /// cols` (`first` traced), of which only ids below `vocab` are real (the rest,
    /// padding, never win; `vocab` is traced where it differs between devices). Chunks come in increasing id order: a later chunk wins only
    /// with a strictly larger maximum, so ties keep the lowest id. A non-finite logit
    /// makes the row's maximum NaN (`x * 0` is NaN exactly for NaN and infinities, and
    /// their sum is added), whatever the comparisons do with NaN.
    pub fn fold(self, chunk: Val, first: Val, vocab: impl IntoVal) -> Greedy {
        let (rows, cols) = (chunk.shape().0[0], chunk.shape().0[1]);
        let id = iota([rows, cols], 1) + first;
        let real = lt(id, vocab);
        let logits = select(real, chunk, f64::NEG_INFINITY);
        let best = logits.max_keepdims(1);
        let best_id = select(eq(logits, best) & real, id, i32::MAX).min_keepdims(1);
        let poison = (select(real, chunk, 0.0) * 0.0).sum_keepdims(1);
        let better = gt(best, self.max);
        Greedy { max: self.max.maximum(best) + poison, id: select(better, best_id, self.id) }
    }
}
