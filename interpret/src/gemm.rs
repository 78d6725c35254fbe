//! The tile matmul kernel: `c += a · b` for row-major f32 `a: m×k`, `c: m×n`, and `b: k×n`
//! row-major or stored transposed (`n×k`, as attention's `q · kᵀ` has it: packed straight
//! from that layout, no transpose of the operand first).
//!
//! Numerics are fixed, whatever the CPU, blocking or thread count ([`Products`]):
//! - Both operands hold bf16 values ([`Products::Bf16Pairs`]: every matmul of a bf16
//!   kernel). Each output element takes its products in pairs of k, `(1, 0), (3, 2), …`:
//!   `c = flush(c + a[1]·b[1])`, then `c = flush(c + a[0]·b[0])`, each step one fused
//!   multiply-add (the product of two bf16 values is exact) rounded to f32 as if the exponent
//!   were unbounded; `flush` turns a result below 2^-126 in magnitude into a zero of its sign,
//!   and denormal inputs (operands and the incoming `c`) count as zeros of their sign. An odd
//!   k pads the last pair with a product of -0, which changes nothing. This is exactly what
//!   AVX-512 BF16's `vdpbf16ps` computes (Intel's pseudocode, checked against the CPU by the
//!   tests), at twice the rate of f32 fused multiply-adds; TPUs flush denormals too.
//! - f16 (or f16 and bf16) values ([`Products::Exact`]): k in order, `c = c + a[0]·b[0]`,
//!   `+ a[1]·b[1]`, …, each step one fused multiply-add (the products are exact unless they
//!   underflow below 2^-126), rounded to f32.
//! - Full f32 operands ([`Products::Rounded`]): k in order, a multiply and an add, each
//!   rounded.
//!
//! Speed: `b` is cut into panels of [`NR`] columns (packed and zero-padded when many rows
//! reuse them, the last one is narrow, `b` is stored transposed (for the AVX2 pair rule: 8×8
//! blocks transposed in registers) or the pair rule needs bf16 pairs), and an `MR×NR`
//! block of `c` is kept in registers while k runs (AVX-512, or AVX-512 BF16 for the pair
//! rule, when the CPU has it, chosen at run time; the pair rule on AVX2 + FMA without
//! AVX-512 BF16: [`fma_pairs`], plain fused multiply-adds on a 6×16 block where the
//! operands' and `c`'s exponents show no step can come near 2^-126 ([`unchecked_exact`]);
//! portable Rust otherwise). Under the pair rule, rows of `a`
//! that are all zeros (a decode step's padding rows) are set apart ([`zero_rows_apart`]).
//! Large products are split by column panels across the rayon pool; each element is still
//! computed by one thread, in the same order.
//!
//! The only `unsafe` in the interpreter lives here: calling the AVX-512 and AVX2 kernels
//! after `is_x86_feature_detected!` said the CPU has them, and their unaligned vector
//! loads/stores inside buffers whose lengths are checked first.
#![allow(unsafe_code)]

use rayon::prelude::*;
use std::cell::{Cell, RefCell};

/// Columns of one packed panel of `b` (two 16-lane vectors).
const NR: usize = 32;
/// Rows of `c` kept in registers at once.
const MR: usize = 8;
/// Up to this many rows of `a`, full panels of f32 `b` are read in place rather than packed.
const PACK_MIN_ROWS: usize = 2 * MR;
/// Rows of `c` the AVX2 kernel without checks ([`avx2::micro_halves`]) keeps in registers
/// (two 8-lane vectors each: 12 accumulators, 2 for `b`, 1 for `a`, of AVX2's 16).
const FR: usize = 6;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 21;

/// How products are taken and rounded (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Products {
    /// Both operands hold bf16 values: k in pairs, as `vdpbf16ps` does.
    Bf16Pairs,
    /// Both operands hold bf16 or f16 values: products are exact, so multiply-add is fused.
    Exact,
    /// Full-precision f32 operands: multiply, round, add, round.
    Rounded,
}

/// How `b` is stored.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum BLayout {
    /// `k×n`, row-major.
    RowMajor,
    /// `n×k`, row-major (`b` transposed).
    Transposed,
}

impl BLayout {
    /// Steps between `b[kk][j]` and `b[kk + 1][j]`, and between `b[kk][j]` and `b[kk][j + 1]`.
    pub fn strides(self, k: usize, n: usize) -> (usize, usize) {
        match self {
            BLayout::RowMajor => (n, 1),
            BLayout::Transposed => (1, k),
        }
    }
}

thread_local! {
    /// Packed f32 panels of `b`, reused from product to product on each thread.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Packed bf16-pair panels of `b`, likewise.
    static PAIR_PANEL: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Packed f32 panels of `b` in the pair rule's order (AVX2 without AVX-512 BF16).
    static HALF_PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// `a` as bf16 pairs for the product this thread is running (taken while in use).
    static LHS_PAIRS: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    /// `a` as [`Halves`] for the product this thread is running (taken while in use).
    static LHS_HALVES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `a` as the micro-kernels read it.
#[derive(Copy, Clone)]
enum Lhs<'a> {
    /// f32 rows of `k`; whether each step is one fused multiply-add (see [`micro`]).
    F32(&'a [f32], bool),
    /// bf16 pairs ([`pair_bits`]), rows of `k.div_ceil(2)`; for the AVX2 kernels, also the
    /// same values as [`Halves`] (then the pairs are empty, except for one or two rows).
    Pairs(&'a [u32], Option<Halves<'a>>),
}

/// `a` for [`avx2::micro_halves`]: rows of `2 * k.div_ceil(2)` f32s in the pair rule's
/// order (`a[1]`, `a[0]`, `a[3]`, `a[2]`, …; an odd k's missing one +0), values as the
/// rule reads them (a denormal is a zero of its sign); zero rows up to a multiple of [`FR`].
#[derive(Copy, Clone)]
struct Halves<'a> {
    a: &'a [f32],
    /// The smallest biased exponent of a non-zero value ([`exponent`]).
    min_exp: u32,
    /// `b`'s smallest [`exponent`], where a scan of all of `b` found it with nothing
    /// denormal, infinite or NaN (the padding rows' scan, [`rows_apart`]): then `b` read in
    /// place is as the rule reads it without a flush, and [`unchecked_exact`] can tell.
    b_exp: Option<u32>,
}

/// `c += a · b` (see the module docs for the order of operations).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32(
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    products: Products,
) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "gemm_f32: buffers shorter than {m}x{k}x{n}"
    );
    if m == 0 || n == 0 {
        return;
    }
    if products == Products::Bf16Pairs
        && zero_rows_apart(a, b, c, m, k, n, |a, c, rows, b_exp| {
            product(a, b, layout, c, rows, k, n, products, b_exp)
        })
    {
        return;
    }
    product(a, b, layout, c, m, k, n, products, None);
}

/// [`gemm_f32`] past the padding rows, with `b`'s smallest exponent where a scan found it
/// ([`Halves::b_exp`]).
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn product(
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    products: Products,
    b_exp: Option<u32>,
) {
    let bs = layout.strides(k, n);
    let (mut pairs, mut halves) = (LHS_PAIRS.take(), LHS_HALVES.take());
    let lhs = match products {
        Products::Bf16Pairs => {
            #[cfg(target_arch = "x86_64")]
            let unchecked = avx2_pairs().then(|| {
                // SAFETY: the CPU has AVX2 (`avx2_pairs`).
                let min_exp = unsafe { pack_lhs_halves(&a[..m * k], m, k, &mut halves) };
                Halves { a: &halves, min_exp, b_exp }
            });
            #[cfg(not(target_arch = "x86_64"))]
            let unchecked = None;
            // With halves, pairs are made from them only for a panel that needs the checks;
            // one or two rows (a decode step's) have both, as their full row-major panels
            // are read in place by the checked kernel ([`fma_pairs`]).
            if unchecked.is_none() || m <= 2 {
                pack_lhs_pairs(&a[..m * k], k, &mut pairs);
            } else {
                // None: not an earlier product's.
                pairs.clear();
            }
            Lhs::Pairs(&pairs, unchecked)
        }
        Products::Exact => Lhs::F32(a, true),
        Products::Rounded => Lhs::F32(a, false),
    };
    let panels = n.div_ceil(NR);
    let work = m * k * n;
    // Inside a task of a parallel grid the pool is already busy: split no further.
    if work < PARALLEL_MIN_WORK
        || panels == 1
        || rayon::current_num_threads() == 1
        || rayon::current_thread_index().is_some()
    {
        panel_range(lhs, b, bs, c, n, m, k, n);
    } else {
        // Split the columns of `c` into disjoint chunks of whole panels. The rows of one
        // chunk are not contiguous in `c`, so each task writes its own buffer, copied in
        // afterwards.
        let chunk = panels.div_ceil(rayon::current_num_threads() * 4).max(1);
        let parts: Vec<(usize, usize, Vec<f32>)> = (0..panels)
            .step_by(chunk)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|p0| {
                let (j0, j1) = (p0 * NR, ((p0 + chunk) * NR).min(n));
                let w = j1 - j0;
                let mut part = Vec::with_capacity(m * w);
                for i in 0..m {
                    part.extend_from_slice(&c[i * n + j0..i * n + j1]);
                }
                panel_range(lhs, &b[j0 * bs.1..], bs, &mut part, w, m, k, w);
                (j0, w, part)
            })
            .collect();
        for (j0, w, part) in parts {
            for i in 0..m {
                c[i * n + j0..i * n + j0 + w].copy_from_slice(&part[i * w..(i + 1) * w]);
            }
        }
    }
    LHS_PAIRS.set(pairs);
    LHS_HALVES.set(halves);
}

/// The pair rule's rows of `a` that are all zeros (a decode step's padding rows: 15 of a
/// megakernel's 16): with every `b` finite each of their steps adds a zero product to `c`,
/// which leaves a flushed `c` as it is, unless it is -0 (then the products' signs decide).
/// So where some zero row's `c` is finite and not -0 once flushed, such rows get the
/// flushed `c` and the other rows are multiplied as a smaller product by `rest(a, c,
/// rows, b_exp)` (each row of `c` depends only on its row of `a`: the same bits; `b_exp`:
/// see [`Halves::b_exp`]). Returns whether it did so (false: nothing done).
fn zero_rows_apart(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    rest: impl FnOnce(&[f32], &mut [f32], usize, Option<u32>),
) -> bool {
    let Some((apart, b_exp)) = rows_apart(a, b, c, m, k, n) else {
        return false;
    };
    let others: Vec<usize> = (0..m).filter(|&i| !apart[i]).collect();
    for i in (0..m).filter(|&i| apart[i]) {
        c[i * n..(i + 1) * n].iter_mut().for_each(|x| *x = flush(*x));
    }
    if !others.is_empty() {
        let a2: Vec<f32> = others.iter().flat_map(|&i| &a[i * k..(i + 1) * k]).copied().collect();
        let mut c2: Vec<f32> =
            others.iter().flat_map(|&i| &c[i * n..(i + 1) * n]).copied().collect();
        rest(&a2, &mut c2, others.len(), b_exp);
        for (&i, row) in others.iter().zip(c2.chunks_exact(n)) {
            c[i * n..(i + 1) * n].copy_from_slice(row);
        }
    }
    true
}

/// What [`rows_apart`] finds: the rows set apart and `b`'s smallest exponent.
type Apart = Option<(Vec<bool>, Option<u32>)>;

/// Which rows [`zero_rows_apart`] sets apart (rows of `a` all zeros as the rule reads them,
/// whose `c` is finite and not -0 once flushed), if any and every `b` is finite, with `b`'s
/// smallest [`exponent`] where nothing in `b` is denormal ([`Halves::b_exp`]); else `None`.
/// A decode step's products each scan all of `b` here, so the scans are branch-free,
/// compiled for AVX2 where the CPU has it (no vector unsigned min, max or compare without
/// it): they took as long as the one-row product itself.
fn rows_apart(a: &[f32], b: &[f32], c: &[f32], m: usize, k: usize, n: usize) -> Apart {
    #[inline(always)]
    fn scan(a: &[f32], b: &[f32], c: &[f32], m: usize, k: usize, n: usize) -> Apart {
        const EXP: u32 = 0x7f80_0000;
        // `f` of every value's bits, or-ed: no early exit inside, so the loop vectorizes.
        let any = |xs: &[f32], f: fn(u32) -> u32| {
            xs.iter().fold(0u32, |acc, x| acc | f(x.to_bits())) != 0
        };
        // Zero as the rule reads it: a zero or a denormal. Not kept: infinite or NaN, or
        // -0 once flushed.
        // (By chunks: a row of values, the usual case outside decode steps, stops at once.)
        let zero = |i: usize| a[i * k..(i + 1) * k].chunks(64).all(|ch| !any(ch, |u| u & EXP));
        let kept = |i: usize| {
            !any(&c[i * n..(i + 1) * n], |u| {
                u32::from(u & EXP == EXP || (u >> 31 == 1 && u & EXP == 0))
            })
        };
        let apart: Vec<bool> = (0..m).map(|i| zero(i) && kept(i)).collect();
        if !apart.contains(&true) {
            return None;
        }
        // By chunks of `b` (4 KiB, read again from the L1 cache by the second fold): the
        // largest magnitude's bits (infinite or NaN from `EXP` up), and the smallest non-zero
        // one's less one (a zero wraps to the largest): below 2^-126's bits it is denormal,
        // else its exponent is the smallest.
        let magnitude = |x: &f32| x.to_bits() & 0x7fff_ffff;
        let mut least = u32::MAX;
        for ch in b[..k * n].chunks(1024) {
            if ch.iter().fold(0, |hi, x| hi.max(magnitude(x))) >= EXP {
                return None;
            }
            least =
                least.min(ch.iter().fold(u32::MAX, |lo, x| lo.min(magnitude(x).wrapping_sub(1))));
        }
        let b_exp = match least {
            u32::MAX => Some(u32::MAX),
            l if l >= f32::MIN_POSITIVE.to_bits() - 1 => Some(((l + 1) >> 23) - 1),
            _ => None,
        };
        Some((apart, b_exp))
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn scan_avx2(a: &[f32], b: &[f32], c: &[f32], m: usize, k: usize, n: usize) -> Apart {
        scan(a, b, c, m, k, n)
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { scan_avx2(a, b, c, m, k, n) };
    }
    scan(a, b, c, m, k, n)
}

/// `c += a · b` on this thread, for `n` columns: `b[kk][j]` is at `kk * bs.0 + j * bs.1`,
/// `c` rows are `ldc` apart.
#[allow(clippy::too_many_arguments)]
fn panel_range(
    lhs: Lhs,
    b: &[f32],
    bs: (usize, usize),
    c: &mut [f32],
    ldc: usize,
    m: usize,
    k: usize,
    n: usize,
) {
    match lhs {
        Lhs::F32(a, fused) => PANEL.with_borrow_mut(|packed| {
            for j0 in (0..n).step_by(NR) {
                let w = NR.min(n - j0);
                // A full row-major panel used by few rows is read in place; otherwise packed
                // (contiguous, and zero-padded to NR columns).
                let (panel, ld): (&[f32], usize) = if w == NR && m <= PACK_MIN_ROWS && bs.1 == 1 {
                    (&b[j0..], bs.0)
                } else {
                    packed.clear();
                    packed.resize(k * NR, 0.0);
                    if bs.1 == 1 {
                        for kk in 0..k {
                            packed[kk * NR..kk * NR + w]
                                .copy_from_slice(&b[kk * bs.0 + j0..kk * bs.0 + j0 + w]);
                        }
                    } else {
                        for jj in 0..w {
                            let col = &b[(j0 + jj) * bs.1..];
                            for kk in 0..k {
                                packed[kk * NR + jj] = col[kk * bs.0];
                            }
                        }
                    }
                    (&packed[..], NR)
                };
                for_each_tile(c, ldc, m, j0, w, |i0, tile, rows| {
                    micro(&a[i0 * k..], k, panel, ld, tile, rows, fused)
                });
            }
        }),
        Lhs::Pairs(a, halves) => PAIR_PANEL.with_borrow_mut(|packed| {
            let kp = k.div_ceil(2);
            for j0 in (0..n).step_by(NR) {
                let w = NR.min(n - j0);
                // A full row-major panel used by few rows (a decode step's matmuls) is read
                // in place, paired in registers: packing it would cost more than the product.
                if w == NR
                    && m <= PACK_MIN_ROWS
                    && bs.1 == 1
                    && in_place_pairs(a, kp, k, &b[j0..], bs.0, c, ldc, m, j0)
                {
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                if fma_pairs(a, halves, kp, b, bs, k, j0, w, c, ldc, m, packed) {
                    continue;
                }
                pack_panel_pairs(b, bs, k, j0, w, packed);
                for_each_tile(c, ldc, m, j0, w, |i0, tile, rows| {
                    micro_pairs(&a[i0 * kp..], kp, packed, tile, rows)
                });
            }
        }),
    }
}

/// Runs `kernel(i0, tile, rows)` on each block of up to [`MR`] rows of `c`'s columns
/// `j0..j0 + w` (rows `ldc` apart), copied into a register-sized tile and back.
fn for_each_tile(
    c: &mut [f32],
    ldc: usize,
    m: usize,
    j0: usize,
    w: usize,
    mut kernel: impl FnMut(usize, &mut [[f32; NR]; MR], usize),
) {
    for i0 in (0..m).step_by(MR) {
        let rows = MR.min(m - i0);
        let mut tile = [[0f32; NR]; MR];
        for (r, t) in tile.iter_mut().enumerate().take(rows) {
            t[..w].copy_from_slice(&c[(i0 + r) * ldc + j0..(i0 + r) * ldc + j0 + w]);
        }
        kernel(i0, &mut tile, rows);
        for (r, t) in tile.iter().enumerate().take(rows) {
            c[(i0 + r) * ldc + j0..(i0 + r) * ldc + j0 + w].copy_from_slice(&t[..w]);
        }
    }
}

/// The bf16 bits of `x` (an f32 holding a bf16 value), a denormal flushed to a zero of its
/// sign (the pair rule's inputs; `vdpbf16ps` flushes them itself, the portable kernel reads
/// them flushed). A NaN stays a NaN whatever its payload. Branch-free, so packing loops
/// vectorize.
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let u = x.to_bits();
    let high = u >> 16;
    let flushed = if u & 0x7f80_0000 == 0 { high & 0x8000 } else { high };
    if u & 0x7fff_ffff > 0x7f80_0000 { high | 0x40 } else { flushed }
}

/// One pair of k as the kernels read it: `k0`'s bf16 bits low, `k1`'s high.
#[inline(always)]
fn pair_bits(k0: f32, k1: u32) -> u32 {
    bf16_bits(k0) | k1 << 16
}

/// bf16 -0: pads `b`'s last pair for an odd k (`a` pads with +0, so the product is -0).
const NEG_ZERO: u32 = 0x8000;

/// `a` (rows of `k`) as rows of `k.div_ceil(2)` bf16 pairs into `out`.
fn pack_lhs_pairs(a: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    if k == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    out.resize(a.len() / k * kp, 0);
    for (row, packed) in a.chunks_exact(k).zip(out.chunks_exact_mut(kp)) {
        for (x, p) in packed.iter_mut().zip(row.chunks_exact(2)) {
            *x = pair_bits(p[0], bf16_bits(p[1]));
        }
        if k % 2 == 1 {
            packed[kp - 1] = pair_bits(row[k - 1], 0);
        }
    }
}

/// Columns `j0..j0 + w` of `b` (strides `bs`) as `k.div_ceil(2)` rows of [`NR`] bf16 pairs
/// into `out` (columns past `w` zero).
fn pack_panel_pairs(
    b: &[f32],
    bs: (usize, usize),
    k: usize,
    j0: usize,
    w: usize,
    out: &mut Vec<u32>,
) {
    let kp = k.div_ceil(2);
    out.clear();
    out.resize(kp * NR, 0);
    if bs.1 == 1 {
        let row = |kk: usize| &b[kk * bs.0 + j0..kk * bs.0 + j0 + w];
        for (p, packed) in out.chunks_exact_mut(NR).enumerate() {
            let even = row(2 * p);
            if 2 * p + 1 < k {
                for ((x, &lo), &hi) in packed.iter_mut().zip(even).zip(row(2 * p + 1)) {
                    *x = pair_bits(lo, bf16_bits(hi));
                }
            } else {
                for (x, &lo) in packed.iter_mut().zip(even) {
                    *x = pair_bits(lo, NEG_ZERO);
                }
            }
        }
    } else {
        for jj in 0..w {
            let col = &b[(j0 + jj) * bs.1..];
            for p in 0..kp {
                let high =
                    if 2 * p + 1 < k { bf16_bits(col[(2 * p + 1) * bs.0]) } else { NEG_ZERO };
                out[p * NR + jj] = pair_bits(col[2 * p * bs.0], high);
            }
        }
    }
}

/// Columns `j0..j0 + NR` of `c += a · b` under the pair rule with `b`'s rows (`k` of at
/// least [`NR`] floats, `ldb` apart) read in place, where the CPU has AVX-512 BF16; false
/// (nothing done) elsewhere. The same bits as packing: `b` holds bf16 values, so its high
/// halves are its bf16 bits, and `vdpbf16ps` flushes denormals itself.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn in_place_pairs(
    a: &[u32],
    kp: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    j0: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16") {
        assert!(
            a.len() >= m * kp && (k == 0 || b.len() >= (k - 1) * ldb + NR) && kp == k.div_ceil(2)
        );
        for_each_tile(c, ldc, m, j0, NR, |i0, tile, rows| {
            // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (checked above); the lengths were
            // checked above.
            unsafe {
                if rows == MR {
                    avx512::micro_pairs_in_place::<MR>(&a[i0 * kp..], kp, k, b, ldb, tile);
                } else {
                    for row in 0..rows {
                        let t: &mut [[f32; NR]; 1] =
                            (&mut tile[row..row + 1]).try_into().expect("one row");
                        avx512::micro_pairs_in_place::<1>(&a[(i0 + row) * kp..], kp, k, b, ldb, t);
                    }
                }
            }
        });
        return true;
    }
    false
}

/// Columns `j0..j0 + w` of `c += a · b` under the pair rule where the CPU has AVX2 and FMA
/// but not AVX-512 BF16 (false, nothing done, elsewhere): `b`'s panel packed as f32 rows in
/// the rule's order (each pair's odd row, then its even row, inputs flushed as
/// [`bf16_bits`] reads them; for one or two rows read in place, flushed in registers), one
/// hardware fused multiply-add per step. A step's fused result is the rule's unless it is
/// non-zero and at most 2^-126 in magnitude (flushed, or the boundary the exact sum
/// decides: [`pair_step`]); the kernel tracks whether any step of a tile came there, and
/// such a tile (rare: sums that small) is computed again by [`portable_pairs`] from its
/// saved contents. So the bits are always the rule's.
///
/// Most panels need no check at all ([`unchecked_exact`]); given `a` as [`Halves`], those
/// run on [`avx2::micro_halves`], plain fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn fma_pairs(
    a: &[u32],
    halves: Option<Halves>,
    kp: usize,
    b: &[f32],
    bs: (usize, usize),
    k: usize,
    j0: usize,
    w: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    pairs: &mut Vec<u32>,
) -> bool {
    if !avx2_pairs() {
        return false;
    }
    assert!(kp == k.div_ceil(2) && (k == 0 || b.len() > (k - 1) * bs.0 + (j0 + w - 1) * bs.1));
    // A full row-major panel used by one or two rows (a decode step's, its padding rows
    // apart) is read in place: packing it would cost more than the product.
    let in_place = w == NR && bs.1 == 1 && m <= 2;
    HALF_PANEL.with_borrow_mut(|panel| {
        if !in_place {
            // SAFETY: the CPU has AVX2 (checked above).
            let b_exp = unsafe { pack_panel_halves(b, bs, k, j0, w, panel) };
            // SAFETY: the CPU has AVX2 (checked above).
            if let Some(h) =
                halves.filter(|h| unsafe { unchecked_exact(h.min_exp, b_exp, c, ldc, m, j0, w) })
            {
                unchecked_panel(h.a, 2 * kp, panel, c, ldc, m, j0, w);
                return;
            }
        }
        // One or two rows reading `b` in place: no per-step check where the padding rows'
        // scan found `b`'s smallest exponent and it allows (`unchecked_exact`).
        // SAFETY: the CPU has AVX2 (checked above).
        let plain = in_place
            && halves.is_some_and(|h| {
                h.b_exp.is_some_and(|b_exp| unsafe {
                    unchecked_exact(h.min_exp, b_exp, c, ldc, m, j0, w)
                })
            });
        let from_halves: Vec<u32>;
        let a = match halves {
            Some(h) if a.is_empty() => {
                from_halves = pairs_of_halves(h.a, m, kp);
                &from_halves[..]
            }
            _ => a,
        };
        assert!(a.len() >= m * kp);
        let mut packed_pairs = false;
        for_each_tile(c, ldc, m, j0, w, |i0, tile, rows| {
            let saved = *tile;
            tile.iter_mut().take(rows).flatten().for_each(|x| *x = flush(*x));
            let mut exact = true;
            for r in (0..rows).step_by(2) {
                let a = &a[(i0 + r) * kp..];
                let panel = if in_place {
                    avx2::Panel::InPlace { b: &b[j0..], ldb: bs.0, k }
                } else {
                    avx2::Panel::Packed(panel)
                };
                // SAFETY: the CPU has AVX2 and FMA (checked above); `a` holds the tile's rows
                // of `kp` pairs and `b` the panel's k rows of NR columns (asserted above), a
                // packed panel `2 * kp` rows of NR floats.
                exact &= unsafe {
                    if r + 1 < rows {
                        let t: &mut [[f32; NR]; 2] =
                            (&mut tile[r..r + 2]).try_into().expect("two rows");
                        match (in_place, plain) {
                            (true, true) => avx2::micro_pairs::<2, true, false>(a, kp, panel, t),
                            (true, false) => avx2::micro_pairs::<2, true, true>(a, kp, panel, t),
                            _ => avx2::micro_pairs::<2, false, true>(a, kp, panel, t),
                        }
                    } else {
                        let t: &mut [[f32; NR]; 1] =
                            (&mut tile[r..r + 1]).try_into().expect("one row");
                        match (in_place, plain) {
                            (true, true) => avx2::micro_pairs::<1, true, false>(a, kp, panel, t),
                            (true, false) => avx2::micro_pairs::<1, true, true>(a, kp, panel, t),
                            _ => avx2::micro_pairs::<1, false, true>(a, kp, panel, t),
                        }
                    }
                };
            }
            if !exact {
                if !packed_pairs {
                    pack_panel_pairs(b, bs, k, j0, w, pairs);
                    packed_pairs = true;
                }
                *tile = saved;
                portable_pairs(&a[i0 * kp..], kp, pairs, tile, rows);
            }
        });
    });
    true
}

/// Columns `j0..j0 + w` of `b` (strides `bs`) as `2 * k.div_ceil(2)` rows of [`NR`] f32s
/// into `out`: for each pair of k its odd row, then its even row (the pair rule's order),
/// each value as the rule reads it (a denormal is a zero of its sign); columns past `w`
/// zero, an odd k's missing row -0.
/// Returns the smallest [`exponent`] of the panel.
/// Compiled for AVX2 (its callers checked the CPU has it), so the row loops vectorize.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_panel_halves(
    b: &[f32],
    bs: (usize, usize),
    k: usize,
    j0: usize,
    w: usize,
    out: &mut Vec<f32>,
) -> u32 {
    let kp = k.div_ceil(2);
    // Every element is written below: no clearing of the buffer first.
    out.resize(2 * kp * NR, 0.0);
    if bs.0 == 1 && bs.1 != 1 {
        transposed_halves(b, bs.1, k, j0, w, out);
        return min_exponent(out);
    }
    for (p, rows) in out.chunks_exact_mut(2 * NR).enumerate() {
        let (odd, even) = rows.split_at_mut(NR);
        for (kk, dst) in [(2 * p + 1, odd), (2 * p, even)] {
            let (dst, past) = dst.split_at_mut(w);
            past.fill(0.0);
            if kk >= k {
                dst.fill(-0.0);
            } else if bs.1 == 1 {
                dst.iter_mut()
                    .zip(&b[kk * bs.0 + j0..kk * bs.0 + j0 + w])
                    .for_each(|(o, &x)| *o = rule_input(x));
            } else {
                dst.iter_mut()
                    .enumerate()
                    .for_each(|(jj, o)| *o = rule_input(b[kk * bs.0 + (j0 + jj) * bs.1]));
            }
        }
    }
    min_exponent(out)
}

/// [`pack_panel_halves`] for `b` stored transposed (`b[kk][j]` at `kk + j * ldb`: each
/// column's k values contiguous, as attention's `kᵀ` and `x @ w.T` weights have them): blocks
/// of 8 columns by 8 k read as 8 vectors and transposed in registers, where a gather of one
/// value per column (`ldb` apart) would cost several times the product of a decode step's
/// one row. `out` holds `2 * k.div_ceil(2) * NR` floats. Pair `p`'s odd row `2p + 1` goes
/// first, so `b`'s row `kk` lands in row `kk ^ 1` of the panel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transposed_halves(b: &[f32], ldb: usize, k: usize, j0: usize, w: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let kp = k.div_ceil(2);
    assert!(
        out.len() == 2 * kp * NR
            && w <= NR
            && (w == 0 || k == 0 || b.len() >= (j0 + w - 1) * ldb + k)
    );
    // Columns past `w` are zero; an odd k's missing row is -0 (within `w`).
    for row in out.chunks_exact_mut(NR) {
        row[w..].fill(0.0);
    }
    if k % 2 == 1 {
        out[(k ^ 1) * NR..(k ^ 1) * NR + w].fill(-0.0);
    }
    let (k8, w8) = (k / 8 * 8, w / 8 * 8);
    for g in (0..w8).step_by(8) {
        let col = |jj: usize| (j0 + g + jj) * ldb;
        for kk0 in (0..k8).step_by(8) {
            // SAFETY: columns `j0 + g .. j0 + g + 8` (within `w`) hold k values each from
            // `col(jj)`, and `kk0 + 8 <= k` (asserted above); rows `(kk0 + c) ^ 1 < 2 * kp` of
            // `out` hold NR floats and `g + 8 <= NR`.
            unsafe {
                let r: [__m256; 8] =
                    std::array::from_fn(|jj| _mm256_loadu_ps(b.as_ptr().add(col(jj) + kk0)));
                for (c, v) in transpose8(r).into_iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(((kk0 + c) ^ 1) * NR + g), v);
                }
            }
        }
        for kk in k8..k {
            for jj in 0..8 {
                out[(kk ^ 1) * NR + g + jj] = b[col(jj) + kk];
            }
        }
    }
    for jj in w8..w {
        for kk in 0..k {
            out[(kk ^ 1) * NR + jj] = b[(j0 + jj) * ldb + kk];
        }
    }
    // As the rule reads them (the padding is zeros already, and reads as itself).
    out.iter_mut().for_each(|x| *x = rule_input(*x));
}

/// The 8x8 transpose of `r` (row `i`, lane `j` becomes row `j`, lane `i`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves swapped.
    let t: [__m256; 8] = std::array::from_fn(|i| {
        if i % 2 == 0 {
            _mm256_unpacklo_ps(r[i], r[i + 1])
        } else {
            _mm256_unpackhi_ps(r[i - 1], r[i])
        }
    });
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xee>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xee>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xee>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xee>(t[5], t[7]),
    ];
    std::array::from_fn(|i| {
        if i < 4 {
            _mm256_permute2f128_ps::<0x20>(s[i], s[i + 4])
        } else {
            _mm256_permute2f128_ps::<0x31>(s[i - 4], s[i])
        }
    })
}

/// `x` (a bf16 value) as the pair rule reads it: a denormal is a zero of its sign.
#[inline(always)]
fn rule_input(x: f32) -> f32 {
    f32::from_bits(bf16_bits(x) << 16)
}

/// The biased exponent of `x` less one; for a zero or a denormal (nothing the pair rule
/// reads as non-zero), `u32::MAX`. Branch-free, so [`min_exponent`] vectorizes.
#[inline(always)]
fn exponent(x: f32) -> u32 {
    ((x.to_bits() >> 23) & 0xff).wrapping_sub(1)
}

/// The smallest [`exponent`] of `xs`.
#[inline(always)]
fn min_exponent(xs: &[f32]) -> u32 {
    xs.iter().fold(u32::MAX, |m, &x| m.min(exponent(x)))
}

/// Whether AVX2 + FMA run the pair rule here: the CPU has them and not AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
fn avx2_pairs() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && !std::is_x86_feature_detected!("avx512bf16")
}

/// `a` (`m` rows of `k`) as [`Halves`] into `out`; returns the smallest [`exponent`].
/// Compiled for AVX2 (its caller checked the CPU has it), so the loops vectorize.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_lhs_halves(a: &[f32], m: usize, k: usize, out: &mut Vec<f32>) -> u32 {
    let k2 = 2 * k.div_ceil(2);
    // Every element is written below: no clearing of the buffer first.
    out.resize(m.div_ceil(FR) * FR * k2, 0.0);
    let (rows, padding) = out.split_at_mut(m * k2);
    padding.fill(0.0);
    for (row, steps) in a.chunks_exact(k).zip(rows.chunks_exact_mut(k2)) {
        // Each pair's odd element first; an odd k's missing one is +0.
        for (pair, step) in row.chunks_exact(2).zip(steps.chunks_exact_mut(2)) {
            step[0] = rule_input(pair[1]);
            step[1] = rule_input(pair[0]);
        }
        if k % 2 == 1 {
            steps[k - 1] = 0.0;
            steps[k] = rule_input(row[k - 1]);
        }
    }
    // The exponents `rule_input` keeps (a denormal's zero is `u32::MAX` either way).
    min_exponent(&a[..m * k])
}

/// The first `m` rows of [`Halves`] (`kp` pairs each) as bf16 pairs ([`pack_lhs_pairs`]'s:
/// the halves hold `rule_input` values, whose high halves are [`bf16_bits`]).
fn pairs_of_halves(halves: &[f32], m: usize, kp: usize) -> Vec<u32> {
    halves[..m * 2 * kp]
        .chunks_exact(2)
        .map(|h| h[0].to_bits() & 0xffff_0000 | h[1].to_bits() >> 16)
        .collect()
}

/// Whether plain fused multiply-adds give the pair rule's bits for columns `j0..j0 + w` of
/// `c` (`m` rows, `ldc` apart), with `a_exp` and `b_exp` the smallest [`exponent`]s of `a`
/// and of the panel: no step can then come non-zero and below 2^-126 (where the rule
/// flushes, or rounds otherwise than the hardware).
///
/// Why: a normal bf16 value of biased exponent `e` is a multiple of 2^(e-134), so every
/// product is a multiple of `Gp = 2^(ea + eb - 268)` (`ea`, `eb`: the smallest biased
/// exponents); a normal f32 `c` of biased exponent `ec` (a denormal one the rule reads as
/// zero) is a multiple of `Gc = 2^(ec - 150)`. Let `G` be the smaller power of two; if
/// `G ≥ 2^-126`, every partial sum is a multiple of `G`: an exact sum of multiples of `G`
/// is one, and rounding it to f32 either keeps it (representable) or rounds to a grid whose
/// spacing is a power of two above `G`. So every non-zero partial sum is at least 2^-126 in
/// magnitude: normal, where the hardware rounds as the rule does (infinities and NaN are
/// the same either way).
/// Compiled for AVX2 (its caller checked the CPU has it), so the scan of `c` vectorizes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn unchecked_exact(
    a_exp: u32,
    b_exp: u32,
    c: &[f32],
    ldc: usize,
    m: usize,
    j0: usize,
    w: usize,
) -> bool {
    // `Gp ≥ 2^-126`: biased exponents summing to 142 at least ([`exponent`] is one less;
    // `u32::MAX`: nothing non-zero, no product to fear). `Gc ≥ 2^-126`: 24 at least.
    a_exp.saturating_add(b_exp) >= 140
        && (0..m).all(|i| min_exponent(&c[i * ldc + j0..i * ldc + j0 + w]) >= 23)
}

/// Columns `j0..j0 + w` of `c += a · b` (`m` rows, `ldc` apart) by [`avx2::micro_halves`]:
/// `a` as [`Halves`] of `k2` steps, `panel` `k2` rows of [`NR`] f32s as
/// [`pack_panel_halves`] packs them; only where [`unchecked_exact`] said yes.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn unchecked_panel(
    a: &[f32],
    k2: usize,
    panel: &[f32],
    c: &mut [f32],
    ldc: usize,
    m: usize,
    j0: usize,
    w: usize,
) {
    const HALF: usize = NR / 2;
    assert!(
        a.len() >= m.div_ceil(FR) * FR * k2
            && panel.len() >= k2 * NR
            && w <= NR
            && c.len() >= (m - 1) * ldc + j0 + w
    );
    for h0 in (0..w).step_by(HALF) {
        let cw = HALF.min(w - h0);
        for i0 in (0..m).step_by(FR) {
            let rows = FR.min(m - i0);
            let a = &a[i0 * k2..(i0 + FR) * k2];
            // SAFETY (both calls): the CPU has AVX2 and FMA (the caller checked); `a` holds FR
            // rows of k2 and `panel` k2 rows of NR, the half from `h0` at least HALF wide
            // (asserted above); `c` FR rows of HALF, `ldc` apart.
            if rows == FR && cw == HALF {
                unsafe {
                    avx2::micro_halves(a, k2, &panel[h0..], &mut c[i0 * ldc + j0 + h0..], ldc)
                };
                continue;
            }
            // A block past `c`'s last rows or columns goes through a tile of its own.
            let mut tile = [0f32; FR * HALF];
            for r in 0..rows {
                tile[r * HALF..r * HALF + cw]
                    .copy_from_slice(&c[(i0 + r) * ldc + j0 + h0..(i0 + r) * ldc + j0 + h0 + cw]);
            }
            unsafe { avx2::micro_halves(a, k2, &panel[h0..], &mut tile, HALF) };
            for r in 0..rows {
                c[(i0 + r) * ldc + j0 + h0..(i0 + r) * ldc + j0 + h0 + cw]
                    .copy_from_slice(&tile[r * HALF..r * HALF + cw]);
            }
        }
    }
}

/// `tile[r] += a[r] · panel` under the pair rule for the first `rows` rows (`a` rows are `kp`
/// pairs long, `panel` holds `kp` rows of [`NR`] pairs).
fn micro_pairs(a: &[u32], kp: usize, panel: &[u32], tile: &mut [[f32; NR]; MR], rows: usize) {
    assert!((1..=MR).contains(&rows) && a.len() >= rows * kp && panel.len() >= kp * NR);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16") {
        // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (checked above); the lengths were
        // checked above.
        unsafe {
            if rows == MR {
                avx512::micro_pairs::<MR>(a, kp, panel, tile);
            } else {
                for row in 0..rows {
                    let t: &mut [[f32; NR]; 1] =
                        (&mut tile[row..row + 1]).try_into().expect("one row");
                    avx512::micro_pairs::<1>(&a[row * kp..], kp, panel, t);
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { portable_pairs_fma(a, kp, panel, tile, rows) };
        return;
    }
    portable_pairs(a, kp, panel, tile, rows);
}

/// [`portable_pairs`] compiled for AVX2 + FMA (vectorized, hardware fused multiply-add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn portable_pairs_fma(
    a: &[u32],
    kp: usize,
    panel: &[u32],
    tile: &mut [[f32; NR]; MR],
    rows: usize,
) {
    portable_pairs(a, kp, panel, tile, rows);
}

/// The pair rule in plain Rust, step by step ([`pair_step`]); the same bits as `vdpbf16ps`.
#[inline(always)]
fn portable_pairs(a: &[u32], kp: usize, panel: &[u32], tile: &mut [[f32; NR]; MR], rows: usize) {
    for (r, t) in tile.iter_mut().enumerate().take(rows) {
        t.iter_mut().for_each(|c| *c = flush(*c));
        for (p, &x) in a[r * kp..(r + 1) * kp].iter().enumerate() {
            let (x0, x1) = halves(x);
            for (c, &y) in t.iter_mut().zip(&panel[p * NR..(p + 1) * NR]) {
                let (y0, y1) = halves(y);
                *c = pair_step(pair_step(*c, x1, y1), x0, y0);
            }
        }
    }
}

/// The low and high bf16 of a pair, as f32.
#[inline(always)]
fn halves(x: u32) -> (f32, f32) {
    (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
}

/// `x` below 2^-126 in magnitude becomes a zero of its sign.
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0f32.copysign(x) } else { x }
}

/// One step of the pair rule: `c + x·y` (`x`, `y` bf16 values, nothing denormal), rounded
/// as if the exponent were unbounded, results below 2^-126 flushed. The fused multiply-add
/// rounds the same way except just below 2^-126, where it may round up to 2^-126 while the
/// unbounded rounding gives the largest number below it (flushed): there the exact sum
/// decides (in f64 it is exact or, when one term is negligible, on the right side of the
/// boundary: the product has at most 16 significant bits and `c` is normal or zero).
#[inline(always)]
fn pair_step(c: f32, x: f32, y: f32) -> f32 {
    let r = x.mul_add(y, c);
    /// Unbounded rounding gives 2^-126 from here up: half an ulp (2^-151) below it.
    const ROUNDS_UP_FROM: f64 = f32::MIN_POSITIVE as f64 * (1.0 - 1.0 / (1u64 << 25) as f64);
    if r.abs() > f32::MIN_POSITIVE
        || r.is_nan()
        || (r.abs() == f32::MIN_POSITIVE
            && (f64::from(c) + f64::from(x) * f64::from(y)).abs() >= ROUNDS_UP_FROM)
    {
        r
    } else {
        0f32.copysign(r)
    }
}

/// `tile[r] += a[r] · panel` in k order for the first `rows` rows (`a` rows are `k` long;
/// panel rows are `ldb` apart and at least [`NR`] long); `fused`: one rounding per step
/// ([`Products::Exact`]), else two ([`Products::Rounded`]).
fn micro(
    a: &[f32],
    k: usize,
    panel: &[f32],
    ldb: usize,
    tile: &mut [[f32; NR]; MR],
    rows: usize,
    fused: bool,
) {
    assert!(
        (1..=MR).contains(&rows)
            && a.len() >= rows * k
            && (k == 0 || panel.len() >= (k - 1) * ldb + NR)
    );
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above); the lengths were checked above.
        unsafe {
            match (rows, fused) {
                (MR, true) => avx512::micro::<MR, true>(a, k, panel, ldb, tile),
                (MR, false) => avx512::micro::<MR, false>(a, k, panel, ldb, tile),
                (r, fused) => {
                    for row in 0..r {
                        let t: &mut [[f32; NR]; 1] =
                            (&mut tile[row..row + 1]).try_into().expect("one row");
                        if fused {
                            avx512::micro::<1, true>(&a[row * k..], k, panel, ldb, t);
                        } else {
                            avx512::micro::<1, false>(&a[row * k..], k, panel, ldb, t);
                        }
                    }
                }
            }
        }
        return;
    }
    for (r, t) in tile.iter_mut().enumerate().take(rows) {
        let ar = &a[r * k..(r + 1) * k];
        for (kk, &x) in ar.iter().enumerate() {
            let br = &panel[kk * ldb..kk * ldb + NR];
            if fused {
                t.iter_mut().zip(br).for_each(|(c, y)| *c = x.mul_add(*y, *c));
            } else {
                t.iter_mut().zip(br).for_each(|(c, y)| *c += x * y);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// The accumulator registers of `R` tile rows: each row's two 16-lane halves.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_tile<const R: usize>(tile: &[[f32; NR]; R]) -> ([__m512; R], [__m512; R]) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: each tile row holds NR = 32 floats.
            unsafe {
                lo[r] = _mm512_loadu_ps(tile[r].as_ptr());
                hi[r] = _mm512_loadu_ps(tile[r].as_ptr().add(16));
            }
        }
        (lo, hi)
    }

    /// Back to the tile: the inverse of [`load_tile`].
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn store_tile<const R: usize>(tile: &mut [[f32; NR]; R], lo: &[__m512; R], hi: &[__m512; R]) {
        for r in 0..R {
            // SAFETY: each tile row holds NR = 32 floats.
            unsafe {
                _mm512_storeu_ps(tile[r].as_mut_ptr(), lo[r]);
                _mm512_storeu_ps(tile[r].as_mut_ptr().add(16), hi[r]);
            }
        }
    }

    /// `tile[..R] += a[..R] · panel`, two 16-lane accumulators per row held in registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `a` must hold `R` rows of `k`, `panel` `k` rows of [`NR`]
    /// floats, `ldb` apart.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn micro<const R: usize, const FUSED: bool>(
        a: &[f32],
        k: usize,
        panel: &[f32],
        ldb: usize,
        tile: &mut [[f32; NR]; R],
    ) {
        const { assert!(R <= MR) };
        let (ap, bp) = (a.as_ptr(), panel.as_ptr());
        let (mut lo, mut hi) = load_tile(tile);
        for kk in 0..k {
            // SAFETY: the caller guarantees k rows of NR floats, ldb apart, in `panel` and R
            // rows of k in `a`.
            unsafe {
                let b0 = _mm512_loadu_ps(bp.add(kk * ldb));
                let b1 = _mm512_loadu_ps(bp.add(kk * ldb + 16));
                for r in 0..R {
                    let x = _mm512_set1_ps(*ap.add(r * k + kk));
                    if FUSED {
                        lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
                        hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
                    } else {
                        lo[r] = _mm512_add_ps(lo[r], _mm512_mul_ps(x, b0));
                        hi[r] = _mm512_add_ps(hi[r], _mm512_mul_ps(x, b1));
                    }
                }
            }
        }
        store_tile(tile, &lo, &hi);
    }

    /// [`micro_pairs`] reading `b`'s f32 rows in place (`k` rows of at least [`NR`] floats,
    /// `ldb` apart, holding bf16 values), paired in registers: each pair lane is the odd
    /// row's high half over the even row's high half; an odd k's missing row is -0.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 BF16; `a` must hold `R` rows of `kp =
    /// k.div_ceil(2)` pairs, `b` `k` rows as above.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn micro_pairs_in_place<const R: usize>(
        a: &[u32],
        kp: usize,
        k: usize,
        b: &[f32],
        ldb: usize,
        tile: &mut [[f32; NR]; R],
    ) {
        const { assert!(R <= MR) };
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        let (mut lo, mut hi) = load_tile(tile);
        let high_half = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        let pair = |even: __m512, odd: __m512| -> __m512bh {
            let v = _mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(odd), high_half),
                _mm512_srli_epi32::<16>(_mm512_castps_si512(even)),
            );
            // SAFETY: both are 512 bits of plain data.
            unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
        };
        let neg_zero = _mm512_set1_ps(-0.0);
        for p in 0..kp {
            // SAFETY: the caller guarantees k rows of NR floats, ldb apart, in `b` and R rows
            // of kp in `a`.
            unsafe {
                let even = bp.add(2 * p * ldb);
                let (odd0, odd1) = if 2 * p + 1 < k {
                    let odd = bp.add((2 * p + 1) * ldb);
                    (_mm512_loadu_ps(odd), _mm512_loadu_ps(odd.add(16)))
                } else {
                    (neg_zero, neg_zero)
                };
                let b0 = pair(_mm512_loadu_ps(even), odd0);
                let b1 = pair(_mm512_loadu_ps(even.add(16)), odd1);
                for r in 0..R {
                    let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *ap.add(r * kp + p) as i32,
                    ));
                    lo[r] = _mm512_dpbf16_ps(lo[r], x, b0);
                    hi[r] = _mm512_dpbf16_ps(hi[r], x, b1);
                }
            }
        }
        store_tile(tile, &lo, &hi);
    }

    /// `tile[..R] += a[..R] · panel` under the pair rule: one `vdpbf16ps` per pair of k and
    /// 16 columns, two accumulators per row held in registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 BF16; `a` must hold `R` rows of `kp` pairs,
    /// `panel` `kp` rows of [`NR`] pairs.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn micro_pairs<const R: usize>(
        a: &[u32],
        kp: usize,
        panel: &[u32],
        tile: &mut [[f32; NR]; R],
    ) {
        const { assert!(R <= MR) };
        let (ap, bp) = (a.as_ptr(), panel.as_ptr());
        let (mut lo, mut hi) = load_tile(tile);
        let bf16 = |v: __m512i| -> __m512bh {
            // SAFETY: both are 512 bits of plain data.
            unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
        };
        for p in 0..kp {
            // SAFETY: the caller guarantees kp rows of NR pairs in `panel` and R rows of kp
            // in `a`.
            unsafe {
                let b0 = bf16(_mm512_loadu_si512(bp.add(p * NR).cast()));
                let b1 = bf16(_mm512_loadu_si512(bp.add(p * NR + 16).cast()));
                for r in 0..R {
                    let x = bf16(_mm512_set1_epi32(*ap.add(r * kp + p) as i32));
                    lo[r] = _mm512_dpbf16_ps(lo[r], x, b0);
                    hi[r] = _mm512_dpbf16_ps(hi[r], x, b1);
                }
            }
        }
        store_tile(tile, &lo, &hi);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{FR, NR};
    use std::arch::x86_64::*;

    /// `c += a · panel` for [`FR`] rows of 16 columns of `c` (rows `ldc` apart, flushed
    /// first as the rule reads them), plain fused multiply-adds in step order (where
    /// [`super::unchecked_exact`] says they give the pair rule's bits): `a` [`FR`] rows of
    /// [`super::Halves`] (`k2` steps each), `panel` `k2` rows of 16 f32s, [`NR`] apart.
    /// Every accumulator stays in a register; `b` is loaded once per step and
    /// `a` broadcast from memory.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `a` must hold `k2 * FR` floats, `panel`
    /// `(k2 - 1) * NR + 16` and `c` `(FR - 1) * ldc + 16`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn micro_halves(
        a: &[f32],
        k2: usize,
        panel: &[f32],
        c: &mut [f32],
        ldc: usize,
    ) {
        debug_assert!(
            a.len() >= k2 * FR
                && (k2 == 0 || panel.len() >= (k2 - 1) * NR + 16)
                && c.len() >= (FR - 1) * ldc + 16
        );
        let (ap, bp, cp) = (a.as_ptr(), panel.as_ptr(), c.as_mut_ptr());
        // Below 2^-126 in magnitude: a zero of its sign (NaN compares false and stays).
        let flush = |x: __m256| {
            let sign = _mm256_set1_ps(-0.0);
            let small = _mm256_cmp_ps::<_CMP_LT_OQ>(
                _mm256_andnot_ps(sign, x),
                _mm256_set1_ps(f32::MIN_POSITIVE),
            );
            _mm256_blendv_ps(x, _mm256_and_ps(x, sign), small)
        };
        let mut acc = [[_mm256_setzero_ps(); 2]; FR];
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: the caller guarantees FR rows of 16 floats, ldc apart, in `c`.
            unsafe {
                *row = [
                    flush(_mm256_loadu_ps(cp.add(r * ldc))),
                    flush(_mm256_loadu_ps(cp.add(r * ldc + 8))),
                ]
            };
        }
        for kk in 0..k2 {
            // SAFETY: the caller guarantees k2 rows of the panel, NR apart, and k2 steps of FR
            // in `a`.
            unsafe {
                let b0 = _mm256_loadu_ps(bp.add(kk * NR));
                let b1 = _mm256_loadu_ps(bp.add(kk * NR + 8));
                for (r, row) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*ap.add(r * k2 + kk));
                    row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(x, b1, row[1]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(cp.add(r * ldc), row[0]);
                _mm256_storeu_ps(cp.add(r * ldc + 8), row[1]);
            }
        }
    }

    /// Where [`micro_pairs`] reads `b`.
    #[derive(Copy, Clone)]
    pub(super) enum Panel<'a> {
        /// `2 * kp` rows of [`NR`] f32s: each pair's odd row, then its even row, inputs
        /// flushed (`pack_panel_halves`).
        Packed(&'a [f32]),
        /// `b`'s own `k` rows (at least [`NR`] floats, `ldb` apart, holding bf16 values),
        /// flushed in registers as the rule reads them; an odd k's missing row is -0.
        InPlace { b: &'a [f32], ldb: usize, k: usize },
    }

    /// `tile[..R] += a[..R] · panel` under the pair rule, one fused multiply-add per step
    /// (`a`: `R` rows of `kp` pairs; the tile is flushed already). Returns whether every
    /// step's result is the rule's: false when one came non-zero and at most 2^-126 in
    /// magnitude (the tile is then to be computed again).
    ///
    /// Without `CHECKED` (in place only, where [`super::unchecked_exact`] said so for a `b`
    /// with nothing denormal, infinite or NaN): no check and no flush of `b`, true.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `a` must hold `R` rows of `kp` pairs, the panel what
    /// [`Panel`] says for `kp` pairs; `IN_PLACE` says which panel it is.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn micro_pairs<const R: usize, const IN_PLACE: bool, const CHECKED: bool>(
        a: &[u32],
        kp: usize,
        panel: Panel,
        tile: &mut [[f32; NR]; R],
    ) -> bool {
        debug_assert_eq!(IN_PLACE, matches!(panel, Panel::InPlace { .. }));
        let ap = a.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for (row, t) in acc.iter_mut().zip(tile.iter()) {
            for (j, v) in row.iter_mut().enumerate() {
                // SAFETY: each tile row holds NR = 32 floats.
                *v = unsafe { _mm256_loadu_ps(t.as_ptr().add(8 * j)) };
            }
        }
        // The smallest `2 |bits| - 1` (unsigned; the doubling drops the sign) of every step's
        // result: below 2^24 exactly when one was non-zero and at most 2^-126 (a zero wraps
        // to the largest). No constant held in a register: the accumulators need them all.
        let mut low = [_mm256_set1_epi32(-1); 2];
        // In place: a value's bf16 bits (the high half), a denormal a zero of its sign.
        let exponent = _mm256_set1_epi32(0x7f80_0000);
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        let drop_if_denormal = _mm256_set1_epi32(0x7fff_0000);
        let input = |y: __m256| -> __m256 {
            let y = _mm256_castps_si256(y);
            let denormal =
                _mm256_cmpeq_epi32(_mm256_and_si256(y, exponent), _mm256_setzero_si256());
            _mm256_castsi256_ps(_mm256_and_si256(
                y,
                _mm256_andnot_si256(_mm256_and_si256(denormal, drop_if_denormal), high),
            ))
        };
        for p in 0..kp {
            for half in 0..2 {
                // SAFETY: the caller guarantees what `Panel` says for kp pairs and R rows of
                // kp pairs in `a`.
                unsafe {
                    // Each instance reads one kind of panel (`IN_PLACE`), so the packed one
                    // holds no constants of the other in registers.
                    let b = match panel {
                        Panel::Packed(_) | Panel::InPlace { .. }
                            if IN_PLACE != matches!(panel, Panel::InPlace { .. }) =>
                        {
                            [_mm256_setzero_ps(); 4]
                        }
                        Panel::Packed(panel) => {
                            let row = panel.as_ptr().add((2 * p + half) * NR);
                            [
                                _mm256_loadu_ps(row),
                                _mm256_loadu_ps(row.add(8)),
                                _mm256_loadu_ps(row.add(16)),
                                _mm256_loadu_ps(row.add(24)),
                            ]
                        }
                        Panel::InPlace { b, ldb, k } => {
                            let kk = 2 * p + 1 - half;
                            if kk < k {
                                let row = b.as_ptr().add(kk * ldb);
                                let input = |y: __m256| {
                                    if CHECKED {
                                        input(y)
                                    } else {
                                        _mm256_and_ps(y, _mm256_castsi256_ps(high))
                                    }
                                };
                                [
                                    input(_mm256_loadu_ps(row)),
                                    input(_mm256_loadu_ps(row.add(8))),
                                    input(_mm256_loadu_ps(row.add(16))),
                                    input(_mm256_loadu_ps(row.add(24))),
                                ]
                            } else {
                                [_mm256_set1_ps(-0.0); 4]
                            }
                        }
                    };
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = *ap.add(r * kp + p);
                        let x = _mm256_set1_ps(f32::from_bits(if half == 0 {
                            x & 0xffff_0000
                        } else {
                            x << 16
                        }));
                        for (j, (v, y)) in row.iter_mut().zip(b).enumerate() {
                            *v = _mm256_fmadd_ps(x, y, *v);
                            if CHECKED {
                                let bits = _mm256_add_epi32(
                                    _mm256_slli_epi32::<1>(_mm256_castps_si256(*v)),
                                    _mm256_set1_epi32(-1),
                                );
                                low[j / 2] = _mm256_min_epu32(low[j / 2], bits);
                            }
                        }
                    }
                }
            }
        }
        for (row, t) in acc.iter().zip(tile.iter_mut()) {
            for (j, v) in row.iter().enumerate() {
                // SAFETY: each tile row holds NR = 32 floats.
                unsafe { _mm256_storeu_ps(t.as_mut_ptr().add(8 * j), *v) };
            }
        }
        if !CHECKED {
            return true;
        }
        let low = _mm256_min_epu32(low[0], low[1]);
        let below = _mm256_cmpeq_epi32(_mm256_min_epu32(low, _mm256_set1_epi32(0xff_ffff)), low);
        _mm256_movemask_epi8(below) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference order: per element, k ascending, one rounding per multiply and add
    /// (exact products make the fused form identical).
    fn naive(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
        for i in 0..m {
            for j in 0..n {
                let mut s = c[i * n + j];
                for kk in 0..k {
                    s += a[i * k + kk] * b[kk * n + j];
                }
                c[i * n + j] = s;
            }
        }
    }

    /// The pair rule, element by element ([`pair_step`], inputs and `c` flushed first).
    fn naive_pairs(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
        steps_in_pair_order(a, b, c, m, k, n, pair_step);
    }

    /// The pair rule's order with plain fused multiply-adds: no flush of a step's result
    /// (inputs and the incoming `c` flushed as the rule reads them).
    fn plain_fused_pairs(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
        steps_in_pair_order(a, b, c, m, k, n, |s, x, y| x.mul_add(y, s));
    }

    /// Each element's `step(c, a, b)` over k in the rule's pairs, inputs and `c` flushed.
    fn steps_in_pair_order(
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        m: usize,
        k: usize,
        n: usize,
        step: impl Fn(f32, f32, f32) -> f32,
    ) {
        let input = |x: f32| halves(bf16_bits(x)).0;
        for i in 0..m {
            for j in 0..n {
                let mut s = flush(c[i * n + j]);
                for p in (0..k).step_by(2) {
                    if p + 1 < k {
                        s = step(s, input(a[i * k + p + 1]), input(b[(p + 1) * n + j]));
                    }
                    s = step(s, input(a[i * k + p]), input(b[p * n + j]));
                }
                c[i * n + j] = s;
            }
        }
    }

    fn values(n: usize, seed: u32, bf16: bool) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let v = (x as f32 / u32::MAX as f32) * 4.0 - 2.0;
                if bf16 { half::bf16::from_f32(v).to_f32() } else { v }
            })
            .collect()
    }

    fn same_bits(x: &[f32], y: &[f32]) -> bool {
        x.len() == y.len()
            && x.iter()
                .zip(y)
                .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
    }

    #[test]
    fn bit_identical_to_the_sequential_order_at_every_shape_and_thread_count() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 7, 5),
            (8, 64, 32),
            (9, 33, 65),
            (17, 300, 100),
            (64, 512, 256),
            (1, 1024, 640),
        ] {
            for (exact, bf16) in
                [(Products::Bf16Pairs, true), (Products::Exact, true), (Products::Rounded, false)]
            {
                let (a, b) = (values(m * k, 1, bf16), values(k * n, 2, bf16));
                let c0 = values(m * n, 3, false);
                let mut want = c0.clone();
                if exact == Products::Bf16Pairs {
                    naive_pairs(&a, &b, &mut want, m, k, n);
                } else {
                    naive(&a, &b, &mut want, m, k, n);
                }
                for threads in [1, 2, 3] {
                    let pool =
                        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    let mut got = c0.clone();
                    pool.install(|| gemm_f32(&a, &b, BLayout::RowMajor, &mut got, m, k, n, exact));
                    assert!(
                        same_bits(&got, &want),
                        "{m}x{k}x{n} {exact:?} on {threads} threads differs from the sequential order"
                    );
                    // The same b stored transposed.
                    let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                    let mut got = c0.clone();
                    pool.install(|| {
                        gemm_f32(&a, &bt, BLayout::Transposed, &mut got, m, k, n, exact)
                    });
                    assert!(
                        same_bits(&got, &want),
                        "{m}x{k}x{n} {exact:?}, b transposed, on {threads} threads differs from the sequential order"
                    );
                }
            }
        }
    }

    /// One pair step through the dispatching kernel (the CPU's `vdpbf16ps` where it has it)
    /// and through the portable one (also compiled for AVX2 + FMA where the CPU has them):
    /// `c + a1·b1 + a0·b0`, as the pair rule orders it.
    fn pair_both_ways(c: f32, a0: f32, a1: f32, b0: f32, b1: f32) -> (f32, f32) {
        let a = [pair_bits(a0, bf16_bits(a1))];
        let mut panel = vec![0u32; NR];
        panel[0] = pair_bits(b0, bf16_bits(b1));
        let run = |portable: bool| {
            let mut tile = [[0f32; NR]; MR];
            tile[0][0] = c;
            if portable {
                portable_pairs(&a, 1, &panel, &mut tile, 1);
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    let mut fma = [[0f32; NR]; MR];
                    fma[0][0] = c;
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { portable_pairs_fma(&a, 1, &panel, &mut fma, 1) };
                    assert_eq!(
                        fma[0][0].to_bits(),
                        tile[0][0].to_bits(),
                        "the portable kernel compiled for FMA differs"
                    );
                }
            } else {
                micro_pairs(&a, 1, &panel, &mut tile, 1);
            }
            tile[0][0]
        };
        let (got, portable) = (run(false), run(true));
        // And through `gemm_f32` (the AVX2 kernel where the CPU has AVX2 but not AVX-512 BF16).
        let mut c1 = [c];
        gemm_f32(&[a0, a1], &[b0, b1], BLayout::RowMajor, &mut c1, 1, 2, 1, Products::Bf16Pairs);
        assert!(
            c1[0].to_bits() == got.to_bits() || c1[0].is_nan() && got.is_nan(),
            "gemm_f32 gives {:e}, the kernel {got:e}",
            c1[0]
        );
        (got, portable)
    }

    #[test]
    fn the_pair_rule_at_its_edges() {
        let p = |e: i32| 2f32.powi(e);
        #[rustfmt::skip]
        let cases: [(&str, [f32; 5], f32); 12] = [
            // (what, [c, a0, a1, b0, b1], c + a1·b1 + a0·b0 under the rule)
            ("the odd product first", [1.0, -p(24), p(24), 1.0, 1.0], 0.0),
            ("the odd product first (swapped)", [1.0, p(24), -p(24), 1.0, 1.0], 1.0),
            ("each step rounded", [1.0, p(-24), p(-24), 1.0, 1.0], 1.0),
            ("ties to even", [1.0, 0.0, 1.5 * p(-24), 0.0, 1.0], 1.0 + p(-23)),
            ("a denormal input is zero", [0.0, 0.0, f32::from_bits(0x0008_0000), 0.0, 1024.0], 0.0),
            ("a denormal c is zero of its sign", [-p(-130), -0.0, -0.0, 1.0, 1.0], -0.0),
            ("a denormal result is zero of its sign", [-p(-125), -0.0, 1.5 * p(-126), 1.0, 1.0], -0.0),
            ("the product is exact (fused)", [p(-125), 0.0, p(-63), 0.0, p(-64)], 1.25 * p(-125)),
            ("an overflowing product is exact (fused)", [-3e38, 0.0, p(64), 0.0, p(64)], (2f64.powi(128) - 3e38f64) as f32),
            ("unbounded rounding, below 2^-126 by more than half an ulp: flushed", [p(-126), -0.0, -1.5 * p(-76), 1.0, p(-75)], 0.0),
            ("unbounded rounding, below 2^-126 by a quarter ulp: 2^-126", [p(-126), -0.0, -p(-76), 1.0, p(-75)], p(-126)),
            ("the largest float below 2^-126 with an unbounded exponent: flushed", [p(-126), -0.0, -p(-76), 1.0, p(-74)], 0.0),
        ];
        for (what, [c, a0, a1, b0, b1], want) in cases {
            let (got, portable) = pair_both_ways(c, a0, a1, b0, b1);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{what}: kernel gives {got:e}, the rule {want:e}"
            );
            assert_eq!(
                portable.to_bits(),
                want.to_bits(),
                "{what}: portable kernel gives {portable:e}, the rule {want:e}"
            );
        }
        let (got, portable) = pair_both_ways(1.0, f32::INFINITY, 0.0, 0.0, 1.0);
        assert!(got.is_nan() && portable.is_nan(), "inf · 0 is NaN: {got}, {portable}");
    }

    /// bf16 values of every kind: normal, denormal, tiny (products near 2^-126), huge
    /// (products overflow), signed zeros, infinities, NaN, and ties.
    fn awkward_bf16(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        (0..n)
            .map(|_| {
                let r = next();
                let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
                let mant = 1.0 + ((r >> 1) & 0x7f) as f32 / 128.0;
                let v = match (r >> 8) % 16 {
                    0 => f32::from_bits((r >> 12) & 0x007f_0000) * sign,
                    1..=3 => mant * 2f32.powi(-50 - ((r >> 12) % 30) as i32) * sign,
                    4 => mant * 2f32.powi(60 + ((r >> 12) % 8) as i32) * sign,
                    5 => 0.0 * sign,
                    6 if (r >> 12) % 8 == 0 => f32::INFINITY * sign,
                    7 if (r >> 12) % 8 == 0 => f32::NAN,
                    _ => mant * 2f32.powi(((r >> 12) % 9) as i32 - 4) * sign,
                };
                half::bf16::from_f32(v).to_f32()
            })
            .collect()
    }

    /// Rows of zeros (a decode step's padding rows, taken apart): signed zeros and
    /// denormals in `a`, `c` of every sign and kind, `b` with and without infinities and
    /// NaN, odd and even k.
    #[test]
    fn zero_rows_give_the_pair_rule_bits() {
        let tiny = f32::from_bits(0x0001_0000);
        for &(m, k, n) in &[(16, 64, 40), (5, 33, 9), (3, 1, 3)] {
            for seed in 0..4u32 {
                let mut a = values(m * k, 40 + seed, true);
                for i in (0..m).filter(|i| i % 4 != 1) {
                    for (kk, x) in a[i * k..(i + 1) * k].iter_mut().enumerate() {
                        *x = [0.0, -0.0, tiny, -tiny][(kk + i) % if i % 4 == 0 { 1 } else { 4 }];
                    }
                }
                let mut b = values(k * n, 50 + seed, true);
                if seed >= 2 {
                    b[(seed as usize * 7) % (k * n)] =
                        if seed == 2 { f32::INFINITY } else { f32::NAN };
                }
                if seed == 1 {
                    b.iter_mut().for_each(|x| *x = -x.abs());
                }
                let specials =
                    [0.0, -0.0, tiny, -tiny, 1.5, -2.0, f32::MIN_POSITIVE, f32::INFINITY];
                let c0: Vec<f32> = (0..m * n)
                    .map(|e| match e / n % 3 {
                        2 => specials[e % specials.len()],
                        1 => [0.0, tiny, 1.5, -f32::MIN_POSITIVE][e % 4],
                        _ => [0.0, -0.0, 3.0][(e / n + seed as usize) % 3],
                    })
                    .collect();
                let mut want = c0.clone();
                naive_pairs(&a, &b, &mut want, m, k, n);
                let mut got = c0.clone();
                gemm_f32(&a, &b, BLayout::RowMajor, &mut got, m, k, n, Products::Bf16Pairs);
                let differ = got
                    .iter()
                    .zip(&want)
                    .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()));
                assert!(
                    differ.is_none(),
                    "{m}x{k}x{n} seed {seed}: element {differ:?} is {:e}, the pair rule gives {:e}",
                    got[differ.unwrap()],
                    want[differ.unwrap()]
                );
            }
        }
    }

    #[test]
    fn the_kernel_and_the_portable_pair_rule_agree_on_awkward_values() {
        // One and two rows read `b` in place where the CPU has AVX2 without AVX-512 BF16.
        for &(m, k, n) in &[
            (8, 64, 32),
            (9, 33, 65),
            (17, 300, 100),
            (1, 33, 96),
            (2, 64, 64),
            (1, 517, 40),
            (7, 16, 8),
        ] {
            for seed in 0..4 {
                let (a, b) = (awkward_bf16(m * k, 10 + seed), awkward_bf16(k * n, 20 + seed));
                let c0: Vec<f32> = awkward_bf16(m * n, 30 + seed);
                let mut want = c0.clone();
                naive_pairs(&a, &b, &mut want, m, k, n);
                // And `b` stored transposed (packed by 8x8 blocks transposed in registers).
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                for (layout, b) in [(BLayout::RowMajor, &b), (BLayout::Transposed, &bt)] {
                    let mut got = c0.clone();
                    gemm_f32(&a, b, layout, &mut got, m, k, n, Products::Bf16Pairs);
                    let differ = got.iter().zip(&want).position(|(x, y)| {
                        x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())
                    });
                    assert!(
                        differ.is_none(),
                        "{m}x{k}x{n} {layout:?} seed {seed}: element {differ:?} is {:e}, the portable rule gives {:e}",
                        got[differ.unwrap()],
                        want[differ.unwrap()]
                    );
                }
            }
        }
    }

    /// The padding rows' scan of `b` ([`rows_apart`]): `b`'s smallest exponent where nothing
    /// in it is denormal (f32 denormals too, at both ends of their range), nothing at all
    /// with an infinity or NaN, across chunks.
    #[test]
    fn the_scan_of_b_finds_its_smallest_exponent_and_denormals() {
        let bits = f32::from_bits;
        // (what, b, what the scan finds: None when it stops, else `b`'s exponent if any)
        type Found = Option<Option<u32>>;
        let cases: [(&str, Vec<f32>, Found); 7] = [
            ("zeros", vec![0.0, -0.0, 0.0], Some(Some(u32::MAX))),
            ("normal values", vec![1.0, -0.5, 0.0, 3.0, -0.25], Some(Some(exponent(0.25)))),
            ("2^-126", vec![1.0, -f32::MIN_POSITIVE], Some(Some(0))),
            ("the largest denormal", vec![1.0, bits(0x007f_ffff)], Some(None)),
            ("the smallest denormal", vec![1.0, -bits(1)], Some(None)),
            ("an infinity", vec![1.0, f32::NEG_INFINITY], None),
            (
                "a NaN past the first chunk",
                (0..3000).map(|i| if i == 2500 { f32::NAN } else { 1.0 }).collect(),
                None,
            ),
        ];
        for (what, b, want) in cases {
            let k = b.len();
            let got = rows_apart(&vec![0.0; k], &b, &[0.0], 1, k, 1).map(|(apart, b_exp)| {
                assert_eq!(apart, [true], "{what}");
                b_exp
            });
            assert_eq!(got, want, "{what}");
        }
    }

    /// The AVX2 kernel without per-step checks runs only where [`unchecked_exact`] says no
    /// step can come non-zero and below 2^-126. Both sides of that condition against the
    /// portable rule: typical values; products whose cancelling pairs leave small multiples
    /// of 2^-126 (a and b at biased exponent 71: exactly at the bound, passes) or of 2^-128
    /// (exponent 70: fails, and sums below 2^-126 that the rule flushes); `c` holding values
    /// that fail (2^-110) or denormals (read as zeros: passes); b with infinities and NaN, or
    /// a column of denormals (read as zeros: a result of zero, where the hardware's steps
    /// would leave a denormal).
    /// Decode shapes too: one or two rows, whose transposed `b` and narrow last panels are
    /// packed (and run unchecked where the condition holds), full row-major panels read in
    /// place (checked, or not where the padding rows' scan of `b` lets the condition
    /// decide).
    #[test]
    fn products_with_and_without_the_per_step_check_give_the_rule_bits() {
        // (what, a's and b's exponent, or none: typical values; c's kind; whether it passes)
        let cases: [(&str, Option<i32>, u8, bool); 7] = [
            ("typical values", None, 0, true),
            ("cancelling products at the bound", Some(-56), 0, true),
            ("cancelling products below the bound", Some(-57), 0, false),
            ("a tiny c", None, 1, false),
            ("a denormal c", None, 2, true),
            ("infinities and NaN in b", None, 3, true),
            ("a column of denormals in b (read as zeros)", None, 4, true),
        ];
        for &(m, k, n) in &[(6, 64, 32), (13, 33, 40), (32, 128, 64), (1, 64, 40), (2, 33, 64)] {
            for (seed, &(what, exp, c_kind, passes)) in cases.iter().enumerate() {
                let seed = seed as u32;
                let (mut a, mut b) =
                    (values(m * k, 60 + seed, true), values(k * n, 70 + seed, true));
                if let Some(e) = exp {
                    // a1·b1 + a0·b0 = 2^(2e-14) · ((128+u)(128+v) - (128+s)(128+t)): small
                    // integers u, v, s, t make small multiples of 2^(2e-14), zero among them.
                    let small = |i: usize, salt: usize| {
                        ((i * 7 + salt * 13 + seed as usize) % 5 % 3) as f32
                    };
                    let x = |q: f32| (1.0 + q / 128.0) * 2f32.powi(e);
                    for i in 0..m {
                        for kk in 0..k {
                            a[i * k + kk] = x(small(i + kk, kk % 2));
                        }
                    }
                    for kk in 0..k {
                        for j in 0..n {
                            b[kk * n + j] = if kk % 2 == 1 {
                                x(small(j + kk, 2))
                            } else {
                                -x(small(j * 3 + kk, 3))
                            };
                        }
                    }
                }
                let c0: Vec<f32> = match c_kind {
                    0 => vec![0.0; m * n],
                    1 => values(m * n, 90 + seed, false)
                        .iter()
                        .map(|x| x * 2f32.powi(-110))
                        .collect(),
                    2 => values(m * n, 90 + seed, false)
                        .iter()
                        .enumerate()
                        .map(|(e, x)| if e % 3 == 0 { f32::from_bits(0x0000_0101) } else { *x })
                        .collect(),
                    3 => {
                        b[5] = f32::INFINITY;
                        b[k * n / 2] = f32::NAN;
                        values(m * n, 90 + seed, false)
                    }
                    _ => {
                        for kk in 0..k {
                            b[kk * n] = f32::from_bits(0x0001_0000 | (kk as u32 % 2) << 31);
                        }
                        vec![0.0; m * n]
                    }
                };
                #[cfg(target_arch = "x86_64")]
                if avx2_pairs() {
                    // SAFETY: the CPU has AVX2 (`avx2_pairs`).
                    let fast = unsafe {
                        unchecked_exact(min_exponent(&a), min_exponent(&b), &c0, n, m, 0, n)
                    };
                    assert_eq!(fast, passes, "{what}: the condition");
                }
                let mut want = c0.clone();
                naive_pairs(&a, &b, &mut want, m, k, n);
                // The argument itself: where the condition holds, plain fused steps give the
                // rule's bits; below the bound they may not (here they do not: sums below
                // 2^-126 the rule flushes), so the check is needed there.
                let mut plain = c0.clone();
                plain_fused_pairs(&a, &b, &mut plain, m, k, n);
                if passes || exp.is_some() {
                    assert_eq!(
                        same_bits(&plain, &want),
                        passes,
                        "{what}, {m}x{k}x{n}: plain fused steps against the rule"
                    );
                }
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                // And, for one or two rows, as a decode step has them: under 14 padding rows
                // of zeros whose `c` is +0, whose scan of `b` lets full row-major panels read in
                // place skip the checks where the condition holds.
                let pad = if m <= 2 { 14 } else { 0 };
                let (a, c0) = (
                    [&a[..], &vec![0.0; pad * k]].concat(),
                    [&c0[..], &vec![0.0; pad * n]].concat(),
                );
                let mut want = c0.clone();
                naive_pairs(&a, &b, &mut want, m + pad, k, n);
                for (layout, b) in [(BLayout::RowMajor, &b), (BLayout::Transposed, &bt)] {
                    let mut got = c0.clone();
                    gemm_f32(&a, b, layout, &mut got, m + pad, k, n, Products::Bf16Pairs);
                    let differ = got.iter().zip(&want).position(|(x, y)| {
                        x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())
                    });
                    assert!(
                        differ.is_none(),
                        "{what}, {m}x{k}x{n} (+{pad} zero rows) {layout:?}: element {differ:?} is {:e}, the pair rule gives {:e}",
                        got[differ.unwrap()],
                        want[differ.unwrap()]
                    );
                }
            }
        }
    }
}
