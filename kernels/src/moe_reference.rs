//! References for the MoE kernels (`moe_router`, `expert_ffn`, `grouped_matmul`), for
//! interpret-mode tests to compare against.
//!
//! The routing and the SwiGLU experts are not written here: they are the model crate's
//! ([`palladium_model::moe`], the math of the reference forward pass `run --check` compares
//! with), called with the kernels' conventions: f32 router logits (the MXU's, not rounded to
//! bf16) and f32 routing weights, and [`FfnRounding::Kernel`] (f32 products and
//! accumulators, the SwiGLU activation rounded to bf16 as the down projection's MXU operand,
//! the output rounded once). Only the layout (`[in, out]` operands, ids and weights as flat
//! `[tokens, top_k]` arrays) and the grouped matmul's metadata are this module's.
//!
//! Conventions: arrays are row-major `f32` slices. Inputs that are bf16 in the kernel are
//! given as their exact f32 values (convert with [`palladium_array::bf16_to_f32`]); outputs the
//! kernel stores as bf16 are rounded with [`round_bf16`] (round to nearest, ties to even).
//! The kernels accumulate in f32 in another order than these references, so compare with a
//! tolerance of a few f32 ulps of the accumulated magnitude (plus one bf16 ulp where the
//! output is bf16).

use crate::reference::matmul_f32;
use palladium_array::round_bf16;
use palladium_model::moe::{self, FfnRounding, Layout, Projection, SwiGlu};
/// The router's scoring and top-k weighting, as the model crate spells them.
pub use palladium_model::{RouterScoring, TopKWeights};

/// `moe_router`: `x[tokens, hidden]`, `w_router[hidden, experts]` → `(ids[tokens * top_k],
/// weights[tokens * top_k])`, row-major `[tokens, top_k]`: each token's f32 logits
/// (`x @ w_router`) routed by [`moe::route`] (highest score first, ties to the lower id; a
/// row with a NaN score gets `top_k` distinct ids and NaN weights).
#[allow(clippy::too_many_arguments)]
pub fn moe_router(
    x: &[f32],
    w_router: &[f32],
    tokens: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    scoring: RouterScoring,
    top_k_weights: TopKWeights,
) -> (Vec<i32>, Vec<f32>) {
    let logits = matmul_f32(x, w_router, tokens, hidden, experts);
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for row in logits.chunks_exact(experts) {
        for (id, w) in moe::route(row, top_k, scoring, top_k_weights).chosen {
            ids.push(id as i32);
            weights.push(w);
        }
    }
    (ids, weights)
}

/// `expert_ffn`: `x[tokens, hidden]`, `ids[tokens * top_k]`, `weights[tokens * top_k]`,
/// `w_gate`/`w_up[experts, hidden, ffn]`, `w_down[experts, ffn, hidden]` →
/// `out[tokens, hidden]` (bf16-rounded): per token, [`moe::moe_ffn`] over its `top_k` slots
/// with [`FfnRounding::Kernel`], `sum_j weights[t, j] * (bf16(silu(x[t] @ gate) *
/// (x[t] @ up)) @ down)`.
#[allow(clippy::too_many_arguments)]
pub fn expert_ffn(
    x: &[f32],
    ids: &[i32],
    weights: &[f32],
    w_gate: &[f32],
    w_up: &[f32],
    w_down: &[f32],
    tokens: usize,
    hidden: usize,
    top_k: usize,
    ffn: usize,
) -> Vec<f32> {
    let size = hidden * ffn;
    let expert = |e: usize| {
        SwiGlu::silu(
            Projection::new(&w_gate[e * size..(e + 1) * size], hidden, ffn, Layout::InOut),
            Projection::new(&w_up[e * size..(e + 1) * size], hidden, ffn, Layout::InOut),
            Projection::new(&w_down[e * size..(e + 1) * size], ffn, hidden, Layout::InOut),
        )
    };
    (0..tokens)
        .flat_map(|t| {
            let slots = t * top_k..(t + 1) * top_k;
            let chosen: Vec<(usize, f32)> = ids[slots.clone()]
                .iter()
                .zip(&weights[slots])
                .map(|(&e, &w)| (usize::try_from(e).expect("expert id is negative"), w))
                .collect();
            let xt = &x[t * hidden..(t + 1) * hidden];
            moe::moe_ffn(xt, hidden, &chosen, expert, FfnRounding::Kernel)
        })
        .collect()
}

/// The `grouped_matmul` metadata for `group_sizes` (rows per group, sorted by group) and
/// `m` rows in tiles of `block_m`: `(group_offsets[groups + 1], group_ids[visits],
/// m_tile_ids[visits], num_visits)`, the visit arrays padded to `m / block_m + groups - 1`
/// by repeating the last real visit. Empty groups get no visit.
pub fn group_metadata(
    group_sizes: &[usize],
    m: usize,
    block_m: usize,
) -> (Vec<i32>, Vec<i32>, Vec<i32>, i32) {
    let mut offsets = vec![0i32];
    for &s in group_sizes {
        offsets.push(offsets.last().copied().unwrap_or(0) + s as i32);
    }
    let (mut gids, mut tids) = (Vec::new(), Vec::new());
    for (g, w) in offsets.windows(2).enumerate() {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        if lo == hi {
            continue;
        }
        for tile in lo / block_m..hi.div_ceil(block_m) {
            gids.push(g as i32);
            tids.push(tile as i32);
        }
    }
    let num = gids.len() as i32;
    let bound = m / block_m + group_sizes.len() - 1;
    let (lg, lt) = (gids.last().copied().unwrap_or(0), tids.last().copied().unwrap_or(0));
    gids.resize(bound, lg);
    tids.resize(bound, lt);
    (offsets, gids, tids, num)
}

/// `grouped_matmul`: `lhs[m, k]` (rows sorted by group), `rhs[groups, k, n]`,
/// `group_offsets[groups + 1]` → `out[m, n]` (bf16-rounded). Rows at or past the last
/// offset are undefined in the kernel and 0 here.
pub fn grouped_matmul(
    lhs: &[f32],
    rhs: &[f32],
    group_offsets: &[i32],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for (g, w) in group_offsets.windows(2).enumerate() {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        if lo >= hi {
            continue;
        }
        let y = matmul_f32(&lhs[lo * k..hi * k], &rhs[g * k * n..(g + 1) * k * n], hi - lo, k, n);
        for (o, v) in out[lo * n..hi * n].iter_mut().zip(y) {
            *o = round_bf16(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_by_hand() {
        // 1 token, hidden 2 (x = [1, 2]), 4 experts; logits = [1, 2, 3, 2].
        let x = [1.0, 2.0];
        let w = [1.0, 0.0, 1.0, 2.0, /* row 2 */ 0.0, 1.0, 1.0, 0.0];
        let (ids, ws) =
            moe_router(&x, &w, 1, 2, 4, 2, RouterScoring::Softmax, TopKWeights::Renormalized);
        // Top-2: expert 2 (logit 3), then the tie between 1 and 3 goes to 1.
        assert_eq!(ids, vec![2, 1]);
        // Renormalised softmax of logits 3 and 2: e / (e + 1) and 1 / (e + 1).
        let e = std::f32::consts::E;
        assert!((ws[0] - e / (e + 1.0)).abs() < 1e-6 && (ws[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
        // Without renormalisation: plain softmax over all four (e^3, e^2, e^1, e^2).
        let (_, ws) = moe_router(&x, &w, 1, 2, 4, 2, RouterScoring::Softmax, TopKWeights::Raw);
        let z = e.powi(3) + 2.0 * e.powi(2) + e;
        assert!((ws[0] - e.powi(3) / z).abs() < 1e-6 && (ws[1] - e.powi(2) / z).abs() < 1e-6);
        // Sigmoid scoring, not renormalised.
        let (ids, ws) = moe_router(&x, &w, 1, 2, 4, 1, RouterScoring::Sigmoid, TopKWeights::Raw);
        assert_eq!(ids, vec![2]);
        assert!((ws[0] - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-6);
    }

    /// A row whose logits are NaN (the old reference here picked expert 0 `top_k` times):
    /// `top_k` distinct ids, the lowest, and NaN weights, as the kernel gives.
    #[test]
    fn router_nan_row_gets_distinct_ids() {
        let (x, w) = ([f32::NAN, 1.0], [1.0; 8]);
        for scoring in [RouterScoring::Softmax, RouterScoring::Sigmoid] {
            let (ids, ws) = moe_router(&x, &w, 1, 2, 4, 3, scoring, TopKWeights::Renormalized);
            assert_eq!(ids, vec![0, 1, 2], "{scoring:?}");
            assert!(ws.iter().all(|w| w.is_nan()), "{scoring:?}");
        }
    }

    #[test]
    fn expert_ffn_by_hand() {
        // 1 token, hidden 1, ffn 1, 2 experts, top-2; x = 2.
        // Expert 0: gate 1, up 3, down 0.5 → silu(2) * 6 * 0.5; expert 1: gate 0 → 0.
        let out = expert_ffn(
            &[2.0],
            &[0, 1],
            &[0.75, 0.25],
            &[1.0, 0.0],
            &[3.0, 1.0],
            &[0.5, 4.0],
            1,
            1,
            2,
            1,
        );
        let silu2 = 2.0 / (1.0 + (-2.0f32).exp());
        let want = round_bf16(0.75 * round_bf16(silu2 * 6.0) * 0.5);
        assert_eq!(out, vec![want]);
    }

    #[test]
    fn grouped_matmul_by_hand() {
        // 3 rows, k = 1, n = 2; groups of 2 and 1 rows; group 0 doubles, group 1 negates.
        let lhs = [1.0, 2.0, 3.0];
        let rhs = [2.0, 2.0, /* group 1 */ -1.0, -1.0];
        let out = grouped_matmul(&lhs, &rhs, &[0, 2, 3], 3, 1, 2);
        assert_eq!(out, vec![2.0, 2.0, 4.0, 4.0, -3.0, -3.0]);
    }

    #[test]
    fn metadata_by_hand() {
        // m = 8, tiles of 4; sizes 3, 0, 5: group 0 touches tile 0; group 2 tiles 0 and 1.
        let (off, gids, tids, num) = group_metadata(&[3, 0, 5], 8, 4);
        assert_eq!(off, vec![0, 3, 3, 8]);
        assert_eq!(num, 3);
        assert_eq!(gids, vec![0, 2, 2, 2]);
        assert_eq!(tids, vec![0, 0, 1, 1]);
    }
}
