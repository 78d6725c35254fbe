//! Rotary position embedding: the tables, the rotation and its application.

use palladium_dsl::build::{eq, ge, lt};
use palladium_dsl::prelude::*;

/// RoPE's `cos`/`sin` tables for a column of positions (`positions`: `[rows, 1]` f32), each
/// `[rows, width]` f32 in neox order (lane `j` of a head turns by `pos * inv_freq[j mod
/// head_dim/2]`, `inv_freq[i] = theta^(-2i / head_dim)`), the layout [`rope_apply`] and the
/// `rope` kernel read. Lanes past `head_dim` (a head's padding) get angles too: the
/// rotation maps them to zero and the padded activations are zero there.
pub fn rope_tables(positions: Val, width: u64, head_dim: u64, theta: f64) -> (Val, Val) {
    let half = (head_dim / 2) as i32;
    let lane = iota([1, width], 1);
    let pair = select(ge(lane, half), lane - half, lane);
    let inv_freq = (pair.cast(f32) * (-2.0 * theta.ln() / head_dim as f64)).exp();
    let angle = positions * inv_freq;
    (angle.cos(), angle.sin())
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

/// [`rope_tables`] from the model's own inverse frequencies (`inv_freq[i]` of lanes `i` and
/// `i + head_dim / 2`, `head_dim = 2 * inv_freq.len()`; YaRN's, computed on the host as
/// the model computes them) and the factor on `cos` and `sin` (YaRN's attention factor).
/// Lanes past `head_dim` get frequency 0.
pub fn rope_tables_of(positions: Val, width: u64, inv_freq: &[f32], factor: f64) -> (Val, Val) {
    let half = inv_freq.len() as i32;
    let lane = iota([1, width], 1);
    let pair = select(ge(lane, half), lane - half, lane);
    let inv = inv_freq
        .iter()
        .enumerate()
        .fold(zeros([1, width], f32), |acc, (i, &f)| select(eq(pair, i as i32), f as f64, acc));
    let angle = positions * inv;
    (angle.cos() * factor, angle.sin() * factor)
}
