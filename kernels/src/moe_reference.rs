//! Plain-Rust references for the MoE kernels (`moe_router`, `expert_ffn`,
//! `grouped_matmul`), for interpret-mode tests to compare against.
//!
//! Conventions: arrays are row-major `f32` slices. Inputs that are bf16 in the kernel are
//! given as their exact f32 values (convert with [`palladium_array::bf16_to_f32`]); outputs the
//! kernel stores as bf16 are rounded with [`round_bf16`] (round to nearest, ties to even), and
//! intermediates the kernel rounds to bf16 (the SwiGLU activation before the down
//! projection) are rounded at the same place. Matmuls accumulate in f32 in index order;
//! the MXU accumulates in f32 in another order, so compare with a tolerance of a few f32
//! ulps of the accumulated magnitude (plus one bf16 ulp where the output is bf16).

use crate::reference::matmul_f32;
use palladium_array::round_bf16;

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `moe_router`: `x[tokens, hidden]`, `w_router[hidden, experts]` → `(ids[tokens * top_k],
/// weights[tokens * top_k])`, row-major `[tokens, top_k]`. Scores are the softmax of the
/// f32 logits over the experts (max-subtracted), or their sigmoid; the `top_k` largest are
/// taken in descending order, ties to the lower expert id; with `renormalize` the selected
/// weights are divided by their sum.
#[allow(clippy::too_many_arguments)]
pub fn moe_router(
    x: &[f32],
    w_router: &[f32],
    tokens: usize,
    hidden: usize,
    experts: usize,
    top_k: usize,
    sigmoid: bool,
    renormalize: bool,
) -> (Vec<i32>, Vec<f32>) {
    let logits = matmul_f32(x, w_router, tokens, hidden, experts);
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for t in 0..tokens {
        let row = &logits[t * experts..(t + 1) * experts];
        let mut scores: Vec<f32> = if sigmoid {
            row.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect()
        } else {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = row.iter().map(|&l| (l - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            e.iter().map(|&v| v / sum).collect()
        };
        let mut picked = Vec::with_capacity(top_k);
        for _ in 0..top_k {
            let mut best = 0;
            for e in 1..experts {
                if scores[e] > scores[best] {
                    best = e;
                }
            }
            picked.push((best as i32, scores[best]));
            scores[best] = f32::NEG_INFINITY;
        }
        let total: f32 = picked.iter().map(|p| p.1).sum();
        for (id, w) in picked {
            ids.push(id);
            weights.push(if renormalize { w / total } else { w });
        }
    }
    (ids, weights)
}

/// `expert_ffn`: `x[tokens, hidden]`, `ids[tokens * top_k]`, `weights[tokens * top_k]`,
/// `w_gate`/`w_up[experts, hidden, ffn]`, `w_down[experts, ffn, hidden]` →
/// `out[tokens, hidden]` (bf16-rounded): `sum_j weights[t, j] * (bf16(silu(x[t] @ gate) *
/// (x[t] @ up)) @ down)`, accumulated in f32 over the slots in order.
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
    let mut out = vec![0.0f32; tokens * hidden];
    for t in 0..tokens {
        let xt = &x[t * hidden..(t + 1) * hidden];
        for j in 0..top_k {
            let e = ids[t * top_k + j] as usize;
            let gate =
                matmul_f32(xt, &w_gate[e * hidden * ffn..(e + 1) * hidden * ffn], 1, hidden, ffn);
            let up =
                matmul_f32(xt, &w_up[e * hidden * ffn..(e + 1) * hidden * ffn], 1, hidden, ffn);
            let h: Vec<f32> =
                gate.iter().zip(&up).map(|(&g, &u)| round_bf16(silu(g) * u)).collect();
            let y =
                matmul_f32(&h, &w_down[e * ffn * hidden..(e + 1) * ffn * hidden], 1, ffn, hidden);
            let w = weights[t * top_k + j];
            for (o, v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(y) {
                *o += w * v;
            }
        }
    }
    out.into_iter().map(round_bf16).collect()
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
        let (ids, ws) = moe_router(&x, &w, 1, 2, 4, 2, false, true);
        // Top-2: expert 2 (logit 3), then the tie between 1 and 3 goes to 1.
        assert_eq!(ids, vec![2, 1]);
        // Renormalised softmax of logits 3 and 2: e / (e + 1) and 1 / (e + 1).
        let e = std::f32::consts::E;
        assert!((ws[0] - e / (e + 1.0)).abs() < 1e-6 && (ws[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
        // Without renormalisation: plain softmax over all four (e^3, e^2, e^1, e^2).
        let (_, ws) = moe_router(&x, &w, 1, 2, 4, 2, false, false);
        let z = e.powi(3) + 2.0 * e.powi(2) + e;
        assert!((ws[0] - e.powi(3) / z).abs() < 1e-6 && (ws[1] - e.powi(2) / z).abs() < 1e-6);
        // Sigmoid scoring, not renormalised.
        let (ids, ws) = moe_router(&x, &w, 1, 2, 4, 1, true, false);
        assert_eq!(ids, vec![2]);
        assert!((ws[0] - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-6);
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
