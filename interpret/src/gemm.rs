//! The tile matmul kernel: `c += a · b` for row-major f32 `a: m×k`, `c: m×n`, and `b: k×n`
//! row-major or stored transposed (`n×k`, as attention's `q · kᵀ` has it: packed straight
//! from that layout, no transpose of the operand first).
//!
//! Numerics are fixed, whatever the CPU, blocking or thread count: every output element is
//! accumulated in k order, `c = c + a[i][0]·b[0][j]`, then `+ a[i][1]·b[1][j]`, …, rounded to
//! f32 after every step. With [`Products::Exact`] (both operands hold bf16 or f16 values, so
//! every product is exact in f32 unless it underflows below 2^-126) the step is one fused
//! multiply-add, which then rounds exactly like multiply-then-add; with [`Products::Rounded`] (full f32 operands) it is a multiply and an
//! add, each rounded.
//!
//! Speed: `b` is cut into panels of [`NR`] columns (packed and zero-padded when many rows
//! reuse them or the last one is narrow), and an `MR×NR` block of
//! `c` is kept in registers while k runs (AVX-512 when the CPU has it, chosen at run time;
//! portable Rust otherwise). Large products are split by column panels across the rayon pool;
//! each element is still computed by one thread, in the same order.
//!
//! The only `unsafe` in the interpreter lives here: calling the AVX-512 kernel after
//! `is_x86_feature_detected!` said the CPU has it, and its unaligned vector loads/stores
//! inside buffers whose lengths are checked first.
#![allow(unsafe_code)]

use rayon::prelude::*;
use std::cell::RefCell;

/// Columns of one packed panel of `b` (two 16-lane vectors).
const NR: usize = 32;
/// Rows of `c` kept in registers at once.
const MR: usize = 8;
/// Up to this many rows of `a`, full panels of `b` are read in place rather than packed.
const PACK_MIN_ROWS: usize = 2 * MR;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 21;

/// How products round (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Products {
    /// Both operands hold bf16 values: products are exact, so multiply-add is fused.
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
    /// Packed panels of `b`, reused from product to product on each thread.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `c += a · b` (see the module docs for the order of operations).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32(a: &[f32], b: &[f32], layout: BLayout, c: &mut [f32], m: usize, k: usize, n: usize, products: Products) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "gemm_f32: buffers shorter than {m}x{k}x{n}");
    let bs = layout.strides(k, n);
    if m == 0 || n == 0 {
        return;
    }
    let panels = n.div_ceil(NR);
    let work = m * k * n;
    // Inside a task of a parallel grid the pool is already busy: split no further.
    if work < PARALLEL_MIN_WORK || panels == 1 || rayon::current_num_threads() == 1 || rayon::current_thread_index().is_some() {
        panel_range(a, b, bs, c, n, m, k, n, products);
        return;
    }
    // Split the columns of `c` into disjoint chunks of whole panels. The rows of one chunk
    // are not contiguous in `c`, so each task writes its own buffer, copied in afterwards.
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
            panel_range(a, &b[j0 * bs.1..], bs, &mut part, w, m, k, w, products);
            (j0, w, part)
        })
        .collect();
    for (j0, w, part) in parts {
        for i in 0..m {
            c[i * n + j0..i * n + j0 + w].copy_from_slice(&part[i * w..(i + 1) * w]);
        }
    }
}

/// `c += a · b` on this thread, for `n` columns: `b[kk][j]` is at `kk * bs.0 + j * bs.1`,
/// `c` rows are `ldc` apart.
#[allow(clippy::too_many_arguments)]
fn panel_range(a: &[f32], b: &[f32], bs: (usize, usize), c: &mut [f32], ldc: usize, m: usize, k: usize, n: usize, products: Products) {
    PANEL.with_borrow_mut(|packed| {
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
                        packed[kk * NR..kk * NR + w].copy_from_slice(&b[kk * bs.0 + j0..kk * bs.0 + j0 + w]);
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
            for i0 in (0..m).step_by(MR) {
                let rows = MR.min(m - i0);
                let mut tile = [[0f32; NR]; MR];
                for (r, t) in tile.iter_mut().enumerate().take(rows) {
                    t[..w].copy_from_slice(&c[(i0 + r) * ldc + j0..(i0 + r) * ldc + j0 + w]);
                }
                micro(&a[i0 * k..], k, panel, ld, &mut tile, rows, products);
                for (r, t) in tile.iter().enumerate().take(rows) {
                    c[(i0 + r) * ldc + j0..(i0 + r) * ldc + j0 + w].copy_from_slice(&t[..w]);
                }
            }
        }
    });
}

/// `tile[r] += a[r] · panel` for the first `rows` rows (`a` rows are `k` long; panel rows
/// are `ldb` apart and at least [`NR`] long).
fn micro(a: &[f32], k: usize, panel: &[f32], ldb: usize, tile: &mut [[f32; NR]; MR], rows: usize, products: Products) {
    assert!((1..=MR).contains(&rows) && a.len() >= rows * k && (k == 0 || panel.len() >= (k - 1) * ldb + NR));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above); the lengths were checked above.
        unsafe {
            match (rows, products) {
                (8, Products::Exact) => avx512::micro::<8, true>(a, k, panel, ldb, tile),
                (8, Products::Rounded) => avx512::micro::<8, false>(a, k, panel, ldb, tile),
                (r, p) => {
                    for row in 0..r {
                        let t: &mut [[f32; NR]; 1] = (&mut tile[row..row + 1]).try_into().expect("one row");
                        match p {
                            Products::Exact => avx512::micro::<1, true>(&a[row * k..], k, panel, ldb, t),
                            Products::Rounded => avx512::micro::<1, false>(&a[row * k..], k, panel, ldb, t),
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
            match products {
                Products::Exact => t.iter_mut().zip(br).for_each(|(c, y)| *c = x.mul_add(*y, *c)),
                Products::Rounded => t.iter_mut().zip(br).for_each(|(c, y)| *c += x * y),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// `tile[..R] += a[..R] · panel`, two 16-lane accumulators per row held in registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `a` must hold `R` rows of `k`, `panel` `k` rows of [`NR`]
    /// floats, `ldb` apart.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn micro<const R: usize, const FUSED: bool>(a: &[f32], k: usize, panel: &[f32], ldb: usize, tile: &mut [[f32; NR]; R]) {
        const { assert!(R <= MR) };
        let (ap, bp) = (a.as_ptr(), panel.as_ptr());
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: each tile row holds NR = 32 floats.
            unsafe {
                lo[r] = _mm512_loadu_ps(tile[r].as_ptr());
                hi[r] = _mm512_loadu_ps(tile[r].as_ptr().add(16));
            }
        }
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
        for r in 0..R {
            // SAFETY: as above.
            unsafe {
                _mm512_storeu_ps(tile[r].as_mut_ptr(), lo[r]);
                _mm512_storeu_ps(tile[r].as_mut_ptr().add(16), hi[r]);
            }
        }
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

    #[test]
    fn bit_identical_to_the_sequential_order_at_every_shape_and_thread_count() {
        for &(m, k, n) in &[(1, 1, 1), (3, 7, 5), (8, 64, 32), (9, 33, 65), (17, 300, 100), (64, 512, 256), (1, 1024, 640)] {
            for (exact, bf16) in [(Products::Exact, true), (Products::Rounded, false)] {
                let (a, b) = (values(m * k, 1, bf16), values(k * n, 2, bf16));
                let c0 = values(m * n, 3, false);
                let mut want = c0.clone();
                naive(&a, &b, &mut want, m, k, n);
                for threads in [1, 2, 3] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    let mut got = c0.clone();
                    pool.install(|| gemm_f32(&a, &b, BLayout::RowMajor, &mut got, m, k, n, exact));
                    let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{k}x{n} {exact:?} on {threads} threads differs from the sequential order");
                    // The same b stored transposed.
                    let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                    let mut got = c0.clone();
                    pool.install(|| gemm_f32(&a, &bt, BLayout::Transposed, &mut got, m, k, n, exact));
                    let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{k}x{n} {exact:?}, b transposed, on {threads} threads differs from the sequential order");
                }
            }
        }
    }
}
