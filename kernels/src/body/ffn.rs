//! The SwiGLU expert FFN: one chunk of an expert's intermediate dim, and the cursor of the
//! expert stream that feeds the chunks.

use super::gemv::{WeightBlock, WeightLayout};
use super::rows::RowSelect;
use palladium_dsl::build::eq;
use palladium_dsl::prelude::*;

/// SwiGLU's activation of one expert chunk: `silu(x @ w_gate) * (x @ w_up)` from the two
/// products, rounded to bf16 as the down projection's MXU operand.
pub fn swiglu(gate: Val, up: Val) -> Val {
    (gate.silu() * up).cast(bf16)
}

/// One chunk of a SwiGLU expert: `swiglu(x @ gate, x @ up) @ down`, f32 `[rows, hidden]`,
/// for `x` `[rows, hidden]` bf16, `gate` and `up` `[hidden, chunk]` and `down` in `layout`
/// (`[chunk, hidden]` in-out, `[hidden, chunk]` out-in), bf16 or quantized ([`WeightBlock`]).
/// SwiGLU is separable along the intermediate dim, so the chunks of an expert just add up.
pub fn swiglu_chunk<W: WeightBlock>(x: Val, gate: W, up: W, down: W, layout: WeightLayout) -> Val {
    // `glu_chunk` without a clamp or biases: the same ops.
    let glu = Glu::SWIGLU;
    glu_chunk(x, gate, up, down, layout, glu)
}

/// A chunk's share of the combine: the chunk was computed for every row of the batch (the
/// MXU streams at least 8 rows anyway, and single bf16 rows are not tile-aligned slices), but
/// only the item's `row` keeps it, times its routing `weight` (an f32 scalar from SMEM).
pub fn routed(chunk: Val, rows: RowSelect, row: Val, weight: Val) -> Val {
    chunk * rows.only(row, weight)
}

/// A work item of the expert stream: one (row, top-k slot) `pair` (`row * top_k + slot`,
/// the index of the routed id) and one `chunk` of that expert's intermediate dim. The
/// stream walks items pair-major, advancing by compares: no scalar division of a flat item
/// index by the chunk count (libtpu's static estimator cannot model the multiply-high of a
/// division by a count that is not a power of two).
#[derive(Clone, Copy)]
pub struct ExpertItem {
    pub pair: Val,
    pub chunk: Val,
}

impl ExpertItem {
    /// The item after this one, for experts of `chunks` chunks.
    pub fn next(self, chunks: u64) -> ExpertItem {
        let chunk = self.chunk + 1;
        let wrap = eq(chunk, chunks as i32);
        ExpertItem { pair: select(wrap, self.pair + 1, self.pair), chunk: select(wrap, 0, chunk) }
    }

    /// The row this item belongs to, given `row`, the previous item's (rows advance when
    /// the pair reaches the next row's first slot).
    pub fn row_from(self, row: Val, top_k: u64) -> Val {
        select(eq(self.pair, (row + 1) * top_k as i32), row + 1, row)
    }
}

/// A gated MLP's activation and biases, as data ([`glu_chunk`]).
#[derive(Clone, Copy)]
pub struct Glu {
    /// gpt-oss's clamped SwiGLU `(alpha, limit)`: `g = min(gate, limit)`, `u = clamp(up,
    /// -limit, limit)`, `(u + 1) * g * sigmoid(alpha * g)`; `None`: `silu(gate) * up`.
    pub clamped: Option<(f64, f64)>,
    /// The chunk's gate and up biases (`[1, chunk]` f32), added to the products.
    pub gate_up_bias: Option<(Val, Val)>,
    /// The down projection's bias (`[1, hidden]` f32), added to the chunk's output (the
    /// caller passes it with one chunk of the expert only).
    pub down_bias: Option<Val>,
}

impl Glu {
    pub const SWIGLU: Glu = Glu { clamped: None, gate_up_bias: None, down_bias: None };
}

/// [`swiglu_chunk`] with `glu`'s activation and biases (the plain SwiGLU traces the same
/// ops as it).
pub fn glu_chunk<W: WeightBlock>(
    x: Val,
    gate: W,
    up: W,
    down: W,
    layout: WeightLayout,
    glu: Glu,
) -> Val {
    let (g, u) =
        (gate.project_from(x, WeightLayout::InOut), up.project_from(x, WeightLayout::InOut));
    let (g, u) = match glu.gate_up_bias {
        Some((gb, ub)) => (g + gb, u + ub),
        None => (g, u),
    };
    let act = match glu.clamped {
        None => swiglu(g, u),
        Some((alpha, limit)) => {
            let g = g.minimum(limit);
            let u = u.maximum(-limit).minimum(limit);
            ((u + 1.0) * (g * (g * alpha).sigmoid())).cast(bf16)
        }
    };
    let y = down.project_from(act, layout);
    match glu.down_bias {
        Some(b) => y + b,
        None => y,
    }
}
