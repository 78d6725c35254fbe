//! Test cases for the registry: per kernel, random inputs for given parameters and the
//! reference outputs for those inputs ([`crate::reference`] does the math).
//!
//! Each kernel has a module here with
//! - `inputs(&Params, seed) -> Vec<HostData>`: scalar-prefetch arrays then inputs, in the
//!   kernel's operand order, random (never all zero) and within the kernel's constraints;
//! - `reference(&Params, &[HostData]) -> Vec<HostData>`: the outputs, in order.
//!
//! and `entry!(kernel, "...", cases::kernel)` in `lib.rs` hooks it into the registry.

use crate::host::HostData;
use crate::reference::{self as r, Rng};

pub mod matmul {
    use super::*;
    use crate::matmul::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostData> {
        let mut rng = Rng::new(seed);
        vec![HostData::bf16(&[p.m, p.k], rng.bf16s(p.m * p.k)), HostData::bf16(&[p.k, p.n], rng.bf16s(p.k * p.n))]
    }

    pub fn reference(p: &Params, x: &[HostData]) -> Vec<HostData> {
        vec![HostData::bf16(&[p.m, p.n], r::matmul(x[0].f32s(), x[1].f32s(), p.m, p.k, p.n))]
    }
}

pub mod rmsnorm {
    use super::*;
    use crate::rmsnorm::Params;

    pub fn inputs(p: &Params, seed: u64) -> Vec<HostData> {
        let mut rng = Rng::new(seed);
        vec![HostData::bf16(&[p.rows, p.hidden], rng.bf16s(p.rows * p.hidden)), HostData::bf16(&[1, p.hidden], rng.bf16s(p.hidden))]
    }

    pub fn reference(p: &Params, x: &[HostData]) -> Vec<HostData> {
        vec![HostData::bf16(&[p.rows, p.hidden], r::rmsnorm(x[0].f32s(), x[1].f32s(), p.rows, p.hidden, p.eps as f32))]
    }
}

pub mod gather_rows {
    use super::*;
    use crate::gather_rows::Params;

    /// `ids`: distinct while `n <= table_rows` (a prefix of a permutation), then repeating
    /// that permutation; all in range.
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostData> {
        let mut rng = Rng::new(seed);
        let perm = rng.permutation(p.table_rows);
        let ids: Vec<i32> = (0..p.n).map(|i| perm[i % p.table_rows.max(1)]).collect();
        vec![HostData::i32(&[p.n], ids), HostData::bf16(&[p.table_rows, p.r, p.d], rng.bf16s(p.table_rows * p.r * p.d))]
    }

    pub fn reference(p: &Params, x: &[HostData]) -> Vec<HostData> {
        vec![HostData::bf16(&[p.n, p.r, p.d], r::gather_rows(x[0].i32s(), x[1].f32s(), p.r, p.d, p.scale as f32))]
    }
}

pub mod decode_attention {
    use super::*;
    use crate::decode_attention::Params;

    /// `lens` in `1..=max_context`, not all multiples of `block_kv` (a partial last tile is
    /// always exercised when `block_kv > 1`).
    pub fn inputs(p: &Params, seed: u64) -> Vec<HostData> {
        let mut rng = Rng::new(seed);
        let mut lens: Vec<i32> = (0..p.batch).map(|_| rng.range(1, p.max_context as i64) as i32).collect();
        let bkv = p.block_kv as i32;
        if bkv > 1 && lens.iter().all(|l| l % bkv == 0) {
            lens[0] -= 1;
        }
        let q = [p.batch, p.kv_heads, p.group, p.head_dim];
        let kv = [p.batch, p.kv_heads, p.max_context, p.head_dim];
        let (nq, nkv) = (q.iter().product(), kv.iter().product());
        vec![
            HostData::i32(&[p.batch], lens),
            HostData::bf16(&q, rng.bf16s(nq)),
            HostData::bf16(&kv, rng.bf16s(nkv)),
            HostData::bf16(&kv, rng.bf16s(nkv)),
        ]
    }

    pub fn reference(p: &Params, x: &[HostData]) -> Vec<HostData> {
        let s = r::AttentionShape { batch: p.batch, kv_heads: p.kv_heads, group: p.group, head_dim: p.head_dim, max_context: p.max_context };
        let o = r::decode_attention(x[0].i32s(), x[1].f32s(), x[2].f32s(), x[3].f32s(), s);
        vec![HostData::bf16(&[p.batch, p.kv_heads, p.group, p.head_dim], o)]
    }
}
