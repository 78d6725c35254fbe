//! `tpu.matmul` on the MXU: dimension numbers, precision and accumulation.

use super::{At, Slot};
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::gemm::{BLayout, Products, gemm_f32};
use crate::memory::join;
use crate::parse::{Attr, DotDims};
use crate::prepare::Instr;
use crate::value::{self, DType, Data, Shape, Tile, Val, permute, round_slice};
use std::sync::Arc;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// No attribute: f32 operands are rounded to bf16 on the MXU (pallas-mosaic.md §4.3).
    Default,
    Bf16,
    Bf16x3,
    Fp32,
}

/// A prepared matmul instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    Matmul {
        lhs: Slot,
        rhs: Slot,
        acc: Slot,
        dims: DotDims,
        precision: Precision,
        out: DType,
        shape: Shape,
    },
}

/// The instruction for a matmul op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o) = (at.op, &at.o[..]);
    Ok(Some(match at.name() {
        "tpu.matmul" => {
            at.arity(3)?;
            let (shape, out) = at.res_sd()?;
            let (ls, _) = at.opnd_sd(0)?;
            let (rs, _) = at.opnd_sd(1)?;
            let dims = match op.attr("dimension_numbers") {
                Some(Attr::DotDims(d)) => d.clone(),
                Some(a) => bail!(Malformed, "bad dimension_numbers {a}"),
                None => {
                    // Old form: transpose_lhs / transpose_rhs on 2-D operands.
                    if ls.len() != 2 || rs.len() != 2 {
                        bail!(
                            Unsupported,
                            "tpu.matmul without dimension_numbers on rank-{} operands",
                            ls.len()
                        );
                    }
                    let tl = op.attr("transpose_lhs").and_then(Attr::as_bool).unwrap_or(false);
                    let tr = op.attr("transpose_rhs").and_then(Attr::as_bool).unwrap_or(false);
                    DotDims {
                        lhs_contract: vec![if tl { 0 } else { 1 }],
                        rhs_contract: vec![if tr { 1 } else { 0 }],
                        lhs_noncontract: vec![if tl { 1 } else { 0 }],
                        rhs_noncontract: vec![if tr { 0 } else { 1 }],
                        output_dim_order: vec![
                            0,
                            if tl { 1 } else { 0 },
                            1,
                            if tr { 0 } else { 1 },
                        ],
                        lhs_batch: vec![],
                        rhs_batch: vec![],
                    }
                }
            };
            check_dot(&dims, &ls, &rs, &shape)?;
            let precision =
                match op.attr("precision").and_then(|a| a.dialect("tpu.contract_precision")) {
                    None => Precision::Default,
                    Some("fp32") => Precision::Fp32,
                    Some("bf16x3") => Precision::Bf16x3,
                    Some("bf16") => Precision::Bf16,
                    Some(p) => bail!(Unsupported, "contract precision {p}"),
                };
            Op::Matmul { lhs: o[0], rhs: o[1], acc: o[2], dims, precision, out, shape }
        }
        _ => return Ok(None),
    }))
}

/// Run one matmul instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(_mach: &mut Machine<'_>, _ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::Matmul { lhs, rhs, acc, dims, precision, out, shape } => {
            matmul(v(lhs).tile()?, v(rhs).tile()?, v(acc).tile()?, dims, *precision, *out, shape)?
        }
    })
}

/// `tpu.matmul`: `acc + lhs · rhs` with Mosaic dimension numbers. Operands are brought to
/// `[batch, M, K]` and `[batch, K, N]`, multiplied with f32 (or i32) accumulation, and the
/// result permuted to `output_dim_order`.
fn matmul(
    lhs: &Tile,
    rhs: &Tile,
    acc: &Tile,
    d: &crate::parse::DotDims,
    precision: Precision,
    out: DType,
    shape: &Shape,
) -> Result<Val> {
    let u = |v: &[i64]| -> Vec<usize> { v.iter().map(|&x| x as usize).collect() };
    let (lb, lc, rb, rc) =
        (u(&d.lhs_batch), u(&d.lhs_contract), u(&d.rhs_batch), u(&d.rhs_contract));
    let free = |rank: usize, c: &[usize], b: &[usize]| -> Vec<usize> {
        (0..rank).filter(|x| !c.contains(x) && !b.contains(x)).collect()
    };
    let lf = free(lhs.shape.len(), &lc, &lb);
    let rf = free(rhs.shape.len(), &rc, &rb);
    let lperm: Vec<usize> = lb.iter().chain(&lf).chain(&lc).copied().collect();
    let rperm: Vec<usize> = rb.iter().chain(&rc).chain(&rf).copied().collect();
    let ident = |p: &[usize]| p.iter().enumerate().all(|(i, &x)| i == x);
    let lt = if ident(&lperm) { lhs.clone() } else { permute(lhs, &lperm) };
    // `[batch, N, K]` (free dims before contracted ones) is read as is: the kernel packs it.
    let rhs_nk: Vec<usize> = rb.iter().chain(&rf).chain(&rc).copied().collect();
    let (rt, layout) = if ident(&rperm) {
        (rhs.clone(), BLayout::RowMajor)
    } else if ident(&rhs_nk) {
        (rhs.clone(), BLayout::Transposed)
    } else {
        (permute(rhs, &rperm), BLayout::RowMajor)
    };
    let prod = |t: &Tile, ds: &[usize]| -> usize { ds.iter().map(|&x| t.shape[x]).product() };
    let (nb, m, k, n) = (prod(lhs, &lb), prod(lhs, &lf), prod(lhs, &lc), prod(rhs, &rf));
    let mut canon: Shape = lb.iter().map(|&x| lhs.shape[x]).collect();
    canon.extend(lf.iter().map(|&x| lhs.shape[x]));
    canon.extend(rf.iter().map(|&x| rhs.shape[x]));
    // Position of each output dim in the canonical (batch, lhs free, rhs free) order.
    let mut operm = Vec::new();
    for pair in d.output_dim_order.chunks(2) {
        let (opnd, dim) = (pair[0], pair[1] as usize);
        let p = if opnd == 0 {
            lb.iter()
                .position(|&x| x == dim)
                .or_else(|| lf.iter().position(|&x| x == dim).map(|p| lb.len() + p))
        } else {
            rb.iter()
                .position(|&x| x == dim)
                .or_else(|| rf.iter().position(|&x| x == dim).map(|p| lb.len() + lf.len() + p))
        };
        match p {
            Some(p) => operm.push(p),
            None => bail!(
                Malformed,
                "output_dim_order names operand {opnd} dim {dim}, which is contracted"
            ),
        }
    }
    // A bf16 lhs against quantized integer weights (`bf16 x i8/i4`): the weights enter the
    // MXU as their exact values, so the product is the float one on the widened weights.
    let widened;
    let rt_data = match (&*lt.data, &*rt.data) {
        (Data::F(_), Data::I(b)) => {
            widened = Data::F(b.iter().map(|&x| x as f32).collect());
            &widened
        }
        _ => &*rt.data,
    };
    let prod_data = match (&*lt.data, rt_data) {
        (Data::F(a), Data::F(b)) => {
            let round = precision == Precision::Bf16
                || (precision == Precision::Default
                    && (lhs.dt == DType::F32 || rhs.dt == DType::F32));
            let (a2, b2);
            let (a, b) = if round {
                (a2, b2) = (value::rounded(DType::Bf16, a), value::rounded(DType::Bf16, b));
                (&a2[..], &b2[..])
            } else {
                (&a[..], &b[..])
            };
            // Products of bf16/f16 values are exact in f32 (8 + 8 or up to 11 + 11 significand
            // bits, at most 24); bf16 pairs go through the pair rule (`gemm.rs`);
            // bf16 with i8, i4 or f8e4m3fn weights (exact code values) are exact products too.
            let bf16 = |dt: DType| round || dt == DType::Bf16;
            let short = |dt: DType| {
                bf16(dt) || matches!(dt, DType::F16 | DType::I8 | DType::I4 | DType::F8E4M3FN)
            };
            let products = if bf16(lhs.dt) && bf16(rhs.dt) {
                Products::Bf16Pairs
            } else if short(lhs.dt) && short(rhs.dt) {
                Products::Exact
            } else {
                Products::Rounded
            };
            let mut c = vec![0f32; nb * m * n];
            for bi in 0..nb {
                gemm_f32(
                    &a[bi * m * k..(bi + 1) * m * k],
                    &b[bi * k * n..(bi + 1) * k * n],
                    layout,
                    &mut c[bi * m * n..(bi + 1) * m * n],
                    m,
                    k,
                    n,
                    products,
                );
            }
            Data::F(c)
        }
        (Data::I(a), Data::I(b)) => {
            let mut c = vec![0i32; nb * m * n];
            for bi in 0..nb {
                let (a, b, c) = (&a[bi * m * k..], &b[bi * k * n..], &mut c[bi * m * n..]);
                for i in 0..m {
                    let (a, c) = (&a[i * k..(i + 1) * k], &mut c[i * n..(i + 1) * n]);
                    // Both orders walk `b` contiguously (the quantized megakernel's `x @ w.T`
                    // products are transposed); wrapping sums are order-independent.
                    match layout {
                        BLayout::RowMajor => {
                            for (kk, &x) in a.iter().enumerate() {
                                c.iter_mut()
                                    .zip(&b[kk * n..(kk + 1) * n])
                                    .for_each(|(c, &y)| *c = c.wrapping_add(x.wrapping_mul(y)));
                            }
                        }
                        BLayout::Transposed => {
                            for (j, c) in c.iter_mut().enumerate() {
                                *c = a
                                    .iter()
                                    .zip(&b[j * k..(j + 1) * k])
                                    .fold(0i32, |s, (&x, &y)| s.wrapping_add(x.wrapping_mul(y)));
                            }
                        }
                    }
                }
            }
            Data::I(c)
        }
        _ => bail!(Mismatch, "matmul of a float and an integer operand"),
    };
    let mut r = Tile::new(out, canon, prod_data);
    if !ident(&operm) {
        r = permute(&r, &operm);
    }
    if r.shape != *shape || acc.shape != *shape {
        bail!(
            Mismatch,
            "matmul result [{}] / accumulator [{}] do not match the result type [{}]",
            join(&r.shape),
            join(&acc.shape),
            join(shape)
        );
    }
    let mut data = Arc::try_unwrap(r.data).unwrap_or_else(|d| (*d).clone());
    match (&mut data, &*acc.data) {
        (Data::F(p), Data::F(q)) => {
            p.iter_mut().zip(q).for_each(|(x, y)| *x += y);
            round_slice(out, p);
        }
        (Data::I(p), Data::I(q)) => p.iter_mut().zip(q).for_each(|(x, y)| *x = x.wrapping_add(*y)),
        _ => bail!(Mismatch, "matmul accumulator of a different element kind"),
    }
    Ok(Val::Tile(Tile::new(out, shape.clone(), data)))
}

fn check_dot(d: &DotDims, ls: &[usize], rs: &[usize], out: &[usize]) -> Result<()> {
    let ok = |xs: &[i64], r: usize| xs.iter().all(|&x| (x as usize) < r);
    if !ok(&d.lhs_contract, ls.len())
        || !ok(&d.lhs_noncontract, ls.len())
        || !ok(&d.lhs_batch, ls.len())
        || !ok(&d.rhs_contract, rs.len())
        || !ok(&d.rhs_noncontract, rs.len())
        || !ok(&d.rhs_batch, rs.len())
    {
        bail!(
            Malformed,
            "dimension numbers {d:?} out of range for operands [{}] and [{}]",
            crate::memory::join(ls),
            crate::memory::join(rs)
        );
    }
    if d.lhs_contract.len() != d.rhs_contract.len() || d.lhs_batch.len() != d.rhs_batch.len() {
        bail!(Malformed, "dimension numbers {d:?}: contracting/batch lists differ in length");
    }
    for (a, b) in
        d.lhs_contract.iter().zip(&d.rhs_contract).chain(d.lhs_batch.iter().zip(&d.rhs_batch))
    {
        if ls[*a as usize] != rs[*b as usize] {
            bail!(
                Mismatch,
                "contracted/batch dims differ: lhs dim {a} is {}, rhs dim {b} is {}",
                ls[*a as usize],
                rs[*b as usize]
            );
        }
    }
    if d.output_dim_order.len() != 2 * out.len() {
        bail!(
            Malformed,
            "output_dim_order {:?} does not match a rank-{} result",
            d.output_dim_order,
            out.len()
        );
    }
    for (k, pair) in d.output_dim_order.chunks(2).enumerate() {
        let n = if pair[0] == 0 { ls.get(pair[1] as usize) } else { rs.get(pair[1] as usize) };
        if n != Some(&out[k]) {
            bail!(
                Mismatch,
                "result dim {k} is {} but output_dim_order names operand {} dim {} ({:?})",
                out[k],
                pair[0],
                pair[1],
                n
            );
        }
    }
    Ok(())
}
