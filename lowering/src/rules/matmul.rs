//! `dot_general` → `tpu.matmul` (pallas-mosaic.md §4.3).

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{tpu, types};
use palladium_dsl::ir::{DType, DotDims, Literal, MatmulOp, Op, Precision, Value as KValue};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: MatmulOp<'_>) -> RuleResult<()> {
    match data {
        MatmulOp::Dot { lhs, rhs, dims, precision, out } => {
            dot(cx, op, *lhs, *rhs, dims, *precision, *out)
        }
    }
}

/// `tpu.matmul %lhs, %rhs, %zeros` with explicit `#tpu.dot_dimension_numbers` and a zero
/// accumulator of the result type (an `acc += dot` in the kernel becomes `arith.addf` after
/// it, as in Pallas; libtpu folds the add into the matmul).
fn dot(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    lhs: KValue,
    rhs: KValue,
    dims: &DotDims,
    precision: Precision,
    out: DType,
) -> RuleResult<()> {
    let (ls, ld) = cx.array_of(lhs)?;
    let (rs, _) = cx.array_of(rhs)?;
    if ls.len() < 2 || rs.len() < 2 {
        bail!(
            "tpu.matmul needs operands of rank >= 2, got {} and {} (reshape vectors to 1xN first)",
            ls.len(),
            rs.len()
        );
    }
    if out.bits() != 32 || out.is_float() != ld.is_float() {
        bail!("dot of {ld} must accumulate in a 32-bit type, not {out}");
    }
    let result = cx.k.ops[op].results[0];
    let (shape, _) = cx.array_of(result)?;
    let (l, r) = (cx.v(lhs)?, cx.v(rhs)?);
    let zero = if out.is_float() { Literal::Float(0.0) } else { Literal::Int(0) };
    let acc = cx.constant(zero, out, &shape)?;
    let dn = tpu::dot_dimension_numbers(cx.ctx, dims, ls.len(), rs.len())?;
    let ty = types::array(cx.ctx, &shape, out);
    let v = cx.emit1(tpu::matmul(cx.ctx, cx.loc, l, r, acc, ty, dn, precision))?;
    cx.set_result(op, 0, v)
}
