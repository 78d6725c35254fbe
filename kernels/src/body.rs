//! The library's math as composable bodies: functions over traced values, with no grid, no
//! block specs and no DMAs. A `#[kernel]` entry of this crate wraps one with its grid and
//! `BlockSpecs` (or its own DMA pipeline); the decode megakernel (`palladium-fusion`) calls the
//! same functions on its ring slots, so each phase has one implementation and a fix to the
//! math reaches both.

use palladium_dsl::build::{eq, ge, lt};
use palladium_dsl::prelude::*;

/// `x * rsqrt(mean(x^2) + eps)` over the last dim, f32, `n` being the true length of that
/// dim (lanes past it must hold zeros). The norm weight is applied by the caller: the
/// megakernel folds it into the next projection's weights.
pub fn rms_unit(x: Val, n: u64, eps: f64) -> Val {
    let mean_square = (x * x).sum_keepdims(1) / n as f64;
    x * (mean_square + eps).rsqrt()
}

/// RoPE's `rotate` as a matrix: the signed permutation `R` (`[width, width]`, bf16, one ±1
/// per column inside the head) with `rotate(x) = x @ R` on the first `head_dim` lanes of
/// `width` (lanes past `head_dim`, a head's padding, map to zero). Neox rotates halves,
/// interleaved (GPT-J) rotates pairs `(2i, 2i+1)`. The MXU computes `x @ R` exactly: each
/// output is one bf16 input times ±1 accumulated in f32 with zeros.
pub fn rope_rotation(width: u64, head_dim: u64, interleaved: bool) -> Val {
    let half = (head_dim / 2) as i32;
    // R[r, c] = the coefficient of x[r] in rotate(x)[c].
    let r = iota([width, width], 0);
    let c = iota([width, width], 1);
    let (negated, kept) = if interleaved {
        let in_head = |m: Val| if width > head_dim { m & lt(c, head_dim as i32) } else { m };
        (in_head(eq(c % 2, 0) & eq(r, c + 1)), in_head(eq(c % 2, 1) & eq(r, c - 1)))
    } else {
        let negated = lt(c, half) & eq(r, c + half);
        let mut kept_cols = ge(c, half);
        if width > head_dim {
            kept_cols = kept_cols & lt(c, 2 * half);
        }
        (negated, kept_cols & eq(r, c - half))
    };
    let one = full([width, width], 1.0, f32);
    select(negated, -one, select(kept, one, 0.0)).cast(bf16)
}

/// RoPE applied to `x` (`[rows, width]`, bf16 or f32): `x * cos + rotate(x) * sin`, f32,
/// with `rotation` from [`rope_rotation`] and `cos`/`sin` broadcastable to `x`.
pub fn rope_apply(x: Val, rotation: Val, cos: Val, sin: Val) -> Val {
    let rotated = dot(x.cast(bf16), rotation);
    x.cast(f32) * cos + rotated * sin
}

/// The running state of attention's online softmax over KV tiles: row max `m`, row sum `l`
/// and the unnormalised output `acc` (all f32; the output is `acc / l`).
#[derive(Clone, Copy)]
pub struct OnlineSoftmax {
    pub m: Val,
    pub l: Val,
    pub acc: Val,
}

impl OnlineSoftmax {
    /// Fold one tile in: `scores` `[rows, tile]` (already scaled and masked with -inf) and
    /// the tile's values `v` `[tile, d]` (bf16). The probabilities go to the MXU in bf16.
    pub fn fold(self, scores: Val, v: Val) -> OnlineSoftmax {
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

/// The router's scores from its f32 logits `[rows, width]`, the first `experts` columns real
/// (columns past them, padding, score zero): softmax over the experts (max-subtracted), or an
/// elementwise sigmoid (DeepSeek-V3 style).
pub fn router_scores(logits: Val, experts: u64, sigmoid: bool) -> Val {
    let dims = logits.shape().0;
    let (rows, width) = (dims[0], dims[1]);
    let logits = if width > experts { select(lt(iota([rows, width], 1), experts as i32), logits, f64::NEG_INFINITY) } else { logits };
    if sigmoid {
        logits.sigmoid()
    } else {
        let e = (logits - logits.max_keepdims(1)).exp();
        e / e.sum_keepdims(1)
    }
}

/// Top-`k` of the router's `scores` (`[rows, width]`, non-negative, the first `experts`
/// columns real) without a sort: `k` rounds of (row max, the lowest column holding it, mask
/// that column), so ties go to the lower id as in `jax.lax.top_k` and the weights come out
/// in descending order; optionally renormalised to sum to one. Returns `(ids, weights)`,
/// `[rows, k]` i32 and f32. A NaN row matches no maximum: its ids are clamped to the last
/// real expert, so a fetch by id stays in bounds whatever the scores (the NaN weights still
/// reach the output).
pub fn top_k(scores: Val, experts: u64, k: u64, renormalize: bool) -> (Val, Val) {
    let dims = scores.shape().0;
    let (rows, width) = (dims[0], dims[1]);
    let col = iota([rows, width], 1);
    let slot = iota([rows, k], 1);
    // Scores are >= 0: -1 marks a padded or already chosen expert.
    let mut remaining = if width > experts { select(lt(col, experts as i32), scores, -1.0) } else { scores };
    let mut ids = zeros([rows, k], i32);
    let mut weights = zeros([rows, k], f32);
    for j in 0..k {
        let best = remaining.max_keepdims(1);
        let best_id = select(eq(remaining, best), col, width as i32).min_keepdims(1);
        let best_id = select(lt(best_id, experts as i32), best_id, experts as i32 - 1);
        ids = select(eq(slot, j as i32), best_id, ids);
        weights = select(eq(slot, j as i32), best, weights);
        remaining = select(eq(col, best_id), -1.0, remaining);
    }
    if renormalize {
        weights = weights / weights.sum_keepdims(1);
    }
    (ids, weights)
}

/// SwiGLU's activation of one expert chunk: `silu(x @ w_gate) * (x @ w_up)` from the two
/// products, rounded to bf16 as the down projection's MXU operand.
pub fn swiglu(gate: Val, up: Val) -> Val {
    (gate.silu() * up).cast(bf16)
}
