//! Constants and grid queries.

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{tpu, types};
use palladium_dsl::ir::{ConstantOp, DType, Literal, Op, Shape, Type as KType};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: ConstantOp<'_>) -> RuleResult<()> {
    match data {
        ConstantOp::Constant { value, ty } => constant(cx, op, *value, ty),
        ConstantOp::ProgramId { axis } => program_id(cx, op, *axis),
        ConstantOp::NumPrograms { axis } => num_programs(cx, op, *axis),
        ConstantOp::Iota { shape, dim } => iota(cx, op, shape, *dim),
    }
}

/// `arith.constant` (a splat `dense<…>` for vectors).
fn constant(cx: &mut LowerCx<'_, '_>, op: Op, value: Literal, ty: &KType) -> RuleResult<()> {
    let (shape, dtype) = match ty {
        KType::Scalar(d) => (Vec::new(), *d),
        KType::Vector(s, d) => (s.dims().to_vec(), *d),
        t => bail!("constants must be scalars or vectors, not {t}"),
    };
    let v = cx.constant(value, dtype, &shape)?;
    cx.set_result(op, 0, v)
}

/// `pl.program_id(axis)`: the i32 grid argument of the current function.
fn program_id(cx: &mut LowerCx<'_, '_>, op: Op, axis: u32) -> RuleResult<()> {
    let Some(&v) = cx.grid_args.get(axis as usize) else {
        bail!("program_id({axis}) but the grid has {} dims", cx.grid_args.len());
    };
    cx.set_result(op, 0, v)
}

/// `pl.num_programs(axis)`: the grid is static, so this is a constant.
fn num_programs(cx: &mut LowerCx<'_, '_>, op: Op, axis: u32) -> RuleResult<()> {
    let Some(g) = cx.k.call.grid.get(axis as usize) else {
        bail!("num_programs({axis}) but the grid has {} dims", cx.k.call.grid.len());
    };
    let Ok(n) = i32::try_from(g.extent) else {
        bail!("grid extent {} does not fit in i32", g.extent)
    };
    let v = cx.const_i32(i64::from(n))?;
    cx.set_result(op, 0, v)
}

/// `tpu.iota {dimensions = array<i32: d>}`; a 1-D iota is a `(1, n)` iota plus a shape cast,
/// as in Pallas.
fn iota(cx: &mut LowerCx<'_, '_>, op: Op, shape: &Shape, dim: u32) -> RuleResult<()> {
    let dims = shape.dims();
    let v = if dims.len() == 1 {
        let wide = [1, dims[0]];
        let ty = types::array(cx.ctx, &wide, DType::I32);
        let x = cx.emit1(tpu::iota(cx.ctx, cx.loc, ty, 1))?;
        cx.shape_cast(x, &wide, dims, DType::I32)?
    } else {
        let ty = types::array(cx.ctx, dims, DType::I32);
        cx.emit1(tpu::iota(cx.ctx, cx.loc, ty, dim))?
    };
    cx.set_result(op, 0, v)
}
