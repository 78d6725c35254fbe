//! Flash attention, forward: the kernel of JAX's Pallas TPU ops
//! (`jax/experimental/pallas/ops/tpu/flash_attention.py`, `_flash_attention_kernel_single_batch`
//! with `block_b = 1`, no bias or segment ids), line for line; its Pallas twin is
//! `scripts/jax_reference.py pallas flash_attention`.
//!
//! Grid (batch, head, q block, kv major block): the kv axis is the reduction (`arbitrary`,
//! last), so the running max `m`, sum `l` and accumulator `acc` live in VMEM scratch across
//! its steps. A step walks its `block_k_major` keys in `block_k` tiles (unrolled, as Pallas's
//! `pl.loop(.., unroll=True)`), each folded in by online softmax. `m` and `l` are kept
//! replicated over 128 lanes (`[block_q, 128]`), so they meet a score tile lane for lane
//! (`tile_lanes`) and the output tile as a lane slice when `head_dim < 128`. Causal: kv
//! blocks above the diagonal are skipped, their index map repeats block 0 (the next block
//! to run) so the pipeline fetches nothing useless, and the diagonal blocks mask by iota.
//! K and V are fetched with `pipeline_mode = Buffered(kv_buffers)` (1: synchronous copies,
//! 2: double-buffered).
//!
//! Causal needs an even `block_q`: Pallas's diagonal test (`below_or_on_diag`, kept as is)
//! skips a block whose first key sits exactly on its last query row, which with
//! `block_k_major` a multiple of 128 happens only for odd `block_q`.

use palladium_dsl::build::gt;
use palladium_dsl::prelude::*;

/// The lanes of the running max and sum (Pallas's `MIN_BLOCK_SIZE`).
const LANES: usize = 128;

/// Pallas's `DEFAULT_MASK_VALUE`: large and negative, but finite, so a fully masked row
/// does not turn into NaNs.
const MASK_VALUE: f64 = -0.7 * f32::MAX as f64;

/// Whether q block `r` reaches kv block `c`: the block's bottom-left corner is on or below
/// the diagonal.
#[track_caller]
fn below_or_on_diag(r: Val, r_blk: usize, c: Val, c_blk: usize) -> Val {
    gt((r + 1) * r_blk as i32 - 1, c * c_blk as i32)
}

/// `pltpu.repeat(x, n / 128, 1)` for `n >= 128`: `n / 128` copies side by side, a
/// `tpu.concatenate` of whole vregs as Pallas emits it (a reshape through `[rows, 1, 128]`
/// and a broadcast costs a relayout: 22% more cycles in libtpu's v6e estimate at
/// `block_k = 256`), else the lane slice `x[:, :n]`.
#[track_caller]
fn tile_lanes(x: Val, n: usize) -> Val {
    if n < LANES {
        return x.slice((.., 0..n as u64));
    }
    concatenate(&vec![x; n / LANES], 1)
}

#[kernel(
    grid = (batch, heads, seq_q / block_q, seq_k / block_k_major),
    semantics = (parallel, parallel, parallel, arbitrary),
    requires = [block_k_major % block_k == 0, block_k % 128 == 0, head_dim < 128 || head_dim % 128 == 0, !causal || block_q % 2 == 0]
)]
pub fn flash_attention(
    #[default(2)] batch: usize,
    #[default(2)] heads: usize,
    #[default(512)] seq_q: usize,
    #[default(512)] seq_k: usize,
    #[default(64)] head_dim: usize,
    #[default(128)] block_q: usize,
    #[default(256)] block_k_major: usize,
    #[default(128)] block_k: usize,
    #[default(true)] causal: bool,
    #[default(2)] kv_buffers: usize,
    #[input(bf16[batch, heads, seq_q, head_dim], block = [1, 1, block_q, head_dim], map = |b, h, i, _j| (b, h, i, 0))]
    q: Ref,
    #[input(bf16[batch, heads, seq_k, head_dim], block = [1, 1, block_k_major, head_dim],
        map = |b, h, i, j| (b, h, if causal { select(below_or_on_diag(i, block_q, j, block_k_major), j, 0) } else { j }, 0),
        pipeline_mode = Buffered(kv_buffers))]
    k: Ref,
    #[input(bf16[batch, heads, seq_k, head_dim], block = [1, 1, block_k_major, head_dim],
        map = |b, h, i, j| (b, h, if causal { select(below_or_on_diag(i, block_q, j, block_k_major), j, 0) } else { j }, 0),
        pipeline_mode = Buffered(kv_buffers))]
    v: Ref,
    #[output(bf16[batch, heads, seq_q, head_dim], block = [1, 1, block_q, head_dim], map = |b, h, i, _j| (b, h, i, 0))]
    o: Ref,
    #[scratch(vmem, f32[1, 1, block_q, 128])] m_ref: Ref,
    #[scratch(vmem, f32[1, 1, block_q, 128])] l_ref: Ref,
    #[scratch(vmem, f32[1, 1, block_q, head_dim])] acc_ref: Ref,
) {
    let sm_scale = 1.0 / (head_dim as f64).sqrt();
    let q_idx = program_id(2);
    let kv_idx = program_id(3);

    if kv_idx == 0 {
        m_ref[(0, 0, .., ..)] = full([block_q, LANES], f64::NEG_INFINITY, f32);
        l_ref[(0, 0, .., ..)] = zeros([block_q, LANES], f32);
        acc_ref[(0, 0, .., ..)] = zeros([block_q, head_dim], f32);
    }

    let run = || {
        for start_k in (0..block_k_major).step_by(block_k) {
            let m_prev = m_ref[(0, 0, .., ..)];
            let l_prev = l_ref[(0, 0, .., ..)];
            let qv = q[(0, 0, .., ..)];
            let kv = k[(0, 0, ds(start_k as i32, block_k as u64), ..)];
            let mut s = dot_general(qv, kv, "qd,kd->qk", f32, Precision::Default);
            s = s * sm_scale;
            if causal {
                let row_ids = iota([block_q, block_k], 0) + q_idx * block_q as i32;
                let col_ids =
                    iota([block_q, block_k], 1) + (kv_idx * block_k_major as i32 + start_k as i32);
                s = s + select(col_ids <= row_ids, zeros([block_q, block_k], f32), MASK_VALUE);
            }
            let m_curr = s.max(1).reshape([block_q, 1]);
            let m_next = m_prev.maximum(m_curr);
            let p = (s - tile_lanes(m_next, block_k)).exp();
            let alpha = (m_prev - m_next).exp();
            let l_corr = alpha * l_prev;
            let l_next = p.sum(1).reshape([block_q, 1]) + l_corr;
            l_ref[(0, 0, .., ..)] = l_next;
            m_ref[(0, 0, .., ..)] = m_next;
            let l_next_inv_safe =
                select(l_next == 0.0, full([block_q, LANES], 1.0, f32), 1.0 / l_next);
            acc_ref[(0, 0, .., ..)] *= tile_lanes(l_corr * l_next_inv_safe, head_dim);
            let vv = v[(0, 0, ds(start_k as i32, block_k as u64), ..)];
            let o_curr = dot(p.cast(bf16), vv);
            acc_ref[(0, 0, .., ..)] += o_curr * tile_lanes(l_next_inv_safe, head_dim);
        }
    };
    if causal {
        if below_or_on_diag(q_idx, block_q, kv_idx, block_k_major) {
            run();
        }
    } else {
        run();
    }

    if kv_idx == (seq_k / block_k_major) as i32 - 1 {
        o[(0, 0, .., ..)] = acc_ref[(0, 0, .., ..)].cast(bf16);
    }
}
