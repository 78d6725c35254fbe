//! Broadcasts, reshapes, transposes, reductions, slices, concatenation and rotation
//! (pallas-mosaic.md §4.4–§4.5).

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{build, tpu, types};
use melior::ir::{
    Attribute,
    attribute::{ArrayAttribute, DenseI64ArrayAttribute},
};
use palladium_dsl::ir::{
    ArgReduceOp, DType, Literal, Op, ReduceOp, Shape, ShapeOp, Value as KValue,
};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: ShapeOp<'_>) -> RuleResult<()> {
    match data {
        ShapeOp::Broadcast { x, shape } => broadcast(cx, op, *x, shape),
        ShapeOp::Reshape { x, shape } => reshape(cx, op, *x, shape),
        ShapeOp::Transpose { x, perm } => transpose(cx, op, *x, perm),
        ShapeOp::Reduce { op: r, x, axes } => reduce(cx, op, *r, *x, axes),
        ShapeOp::ArgReduce { op: r, x, axis } => arg_reduce(cx, op, *r, *x, *axis),
        ShapeOp::Slice { x, start, size } => slice(cx, op, *x, start, size),
        ShapeOp::Concat { xs, axis } => concat(cx, op, xs, *axis),
        ShapeOp::Roll { x, shift, axis } => roll(cx, op, *x, *shift, *axis),
    }
}

/// Scalar → `vector.broadcast`; vector → `vector.shape_cast` adding leading 1s (numpy's
/// trailing alignment), then `vector.broadcast` if any dim stretches.
fn broadcast(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, shape: &Shape) -> RuleResult<()> {
    let (from, dtype) = cx.array_of(x)?;
    let to = shape.dims();
    let xv = cx.v(x)?;
    let ty = types::array(cx.ctx, to, dtype);
    let v = if from.is_empty() {
        cx.generic1("vector.broadcast", &[xv], ty, &[])?
    } else {
        let mut padded = vec![1; to.len().saturating_sub(from.len())];
        padded.extend(&from);
        let y = cx.shape_cast(xv, &from, &padded, dtype)?;
        if padded == to { y } else { cx.generic1("vector.broadcast", &[y], ty, &[])? }
    };
    cx.set_result(op, 0, v)
}

/// `vector.shape_cast`; to rank 0 it is `vector.extract` of element `[0, …]`; from rank 0 a
/// `vector.broadcast`.
fn reshape(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, shape: &Shape) -> RuleResult<()> {
    let (from, dtype) = cx.array_of(x)?;
    let to = shape.dims();
    let xv = cx.v(x)?;
    let v = match (from.is_empty(), to.is_empty()) {
        (true, true) => xv,
        (true, false) => {
            cx.generic1("vector.broadcast", &[xv], types::array(cx.ctx, to, dtype), &[])?
        }
        (false, true) => extract_scalar(cx, xv, from.len(), dtype)?,
        (false, false) => cx.shape_cast(xv, &from, to, dtype)?,
    };
    cx.set_result(op, 0, v)
}

/// `vector.extract %v[0, …, 0] : T from vector<1x…x1xT>`.
fn extract_scalar<'c, 'a>(
    cx: &mut LowerCx<'c, 'a>,
    v: melior::ir::Value<'c, 'a>,
    rank: usize,
    dtype: DType,
) -> RuleResult<melior::ir::Value<'c, 'a>> {
    let pos = DenseI64ArrayAttribute::new(cx.ctx, &vec![0; rank]).into();
    let ty = types::element(cx.ctx, dtype);
    cx.generic1("vector.extract", &[v], ty, &[("static_position", pos)])
}

fn transpose(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, perm: &[u32]) -> RuleResult<()> {
    let xv = cx.v(x)?;
    let ty = cx.mlir_ty(cx.k.ops[op].results[0])?;
    let v = cx.emit1(tpu::transpose(cx.ctx, cx.loc, xv, perm, ty))?;
    cx.set_result(op, 0, v)
}

/// The `#vector.kind` and identity of a reduction.
fn kind_and_identity(r: ReduceOp, dtype: DType) -> RuleResult<(&'static str, Literal)> {
    let float = dtype.is_float();
    if !float && dtype != DType::I32 {
        bail!("reduce.{r} supports float and i32 operands, got {dtype}");
    }
    Ok(match (r, float) {
        (ReduceOp::Sum, true) => ("add", Literal::Float(0.0)),
        (ReduceOp::Sum, false) => ("add", Literal::Int(0)),
        (ReduceOp::Max, true) => ("maximumf", Literal::Float(f64::NEG_INFINITY)),
        (ReduceOp::Max, false) => ("maxsi", Literal::Int(i64::from(i32::MIN))),
        (ReduceOp::Min, true) => ("minimumf", Literal::Float(f64::INFINITY)),
        (ReduceOp::Min, false) => ("minsi", Literal::Int(i64::from(i32::MAX))),
    })
}

/// `vector.multi_reduction <kind>, %x, %identity [axes]`. A reduction to a scalar reshapes to
/// a leading 1 first and extracts the element at the end (as Pallas does).
fn reduce(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    r: ReduceOp,
    x: KValue,
    axes: &[u32],
) -> RuleResult<()> {
    let (shape, dtype) = cx.array_of(x)?;
    if shape.is_empty() {
        bail!("cannot reduce a scalar");
    }
    let (kind, identity) = kind_and_identity(r, dtype)?;
    let mut xv = cx.v(x)?;
    let mut in_shape = shape.clone();
    let mut dims: Vec<i64> = axes.iter().map(|&a| i64::from(a)).collect();
    dims.sort_unstable();
    let to_scalar = axes.len() == shape.len();
    if to_scalar {
        in_shape.insert(0, 1);
        xv = cx.shape_cast(xv, &shape, &in_shape, dtype)?;
        dims = (1..in_shape.len() as i64).collect();
    }
    let out: Vec<u64> = in_shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !dims.contains(&(*i as i64)))
        .map(|(_, d)| *d)
        .collect();
    let acc = cx.constant(identity, dtype, &out)?;
    let ty = types::array(cx.ctx, &out, dtype);
    let kind_attr = build::parse_attr(cx.ctx, &format!("#vector.kind<{kind}>"))?;
    let dims_attr = DenseI64ArrayAttribute::new(cx.ctx, &dims).into();
    let mut v = cx.generic1(
        "vector.multi_reduction",
        &[xv, acc],
        ty,
        &[("kind", kind_attr), ("reduction_dims", dims_attr)],
    )?;
    if to_scalar {
        let ones = vec![1; shape.len() + 1];
        v = cx.shape_cast(v, &out, &ones, dtype)?;
        v = extract_scalar(cx, v, ones.len(), dtype)?;
    }
    cx.set_result(op, 0, v)
}

/// `tpu.reduce_index` (Pallas's argmax/argmin rule; its result drops `axis`).
fn arg_reduce(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    r: ArgReduceOp,
    x: KValue,
    axis: u32,
) -> RuleResult<()> {
    let xv = cx.v(x)?;
    let ty = cx.mlir_ty(cx.k.ops[op].results[0])?;
    let v = cx.emit1(tpu::reduce_index(cx.ctx, cx.loc, xv, axis, r, ty))?;
    cx.set_result(op, 0, v)
}

/// `vector.extract_strided_slice {offsets, sizes, strides = 1}` (Pallas's `lax.slice` rule).
fn slice(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    x: KValue,
    start: &[u64],
    size: &[u64],
) -> RuleResult<()> {
    let xv = cx.v(x)?;
    let ty = cx.mlir_ty(cx.k.ops[op].results[0])?;
    let list = |v: &[i64]| -> Attribute<'_> {
        let items: Vec<Attribute<'_>> = v.iter().map(|&n| build::int_attr(cx.ctx, 64, n)).collect();
        ArrayAttribute::new(cx.ctx, &items).into()
    };
    let to_i64 = |v: &[u64]| v.iter().map(|&n| n as i64).collect::<Vec<_>>();
    let attrs = [
        ("offsets", list(&to_i64(start))),
        ("sizes", list(&to_i64(size))),
        ("strides", list(&vec![1; size.len()])),
    ];
    let v = cx.generic1("vector.extract_strided_slice", &[xv], ty, &attrs)?;
    cx.set_result(op, 0, v)
}

/// `tpu.concatenate` (Pallas's `lax.concatenate` rule).
fn concat(cx: &mut LowerCx<'_, '_>, op: Op, xs: &[KValue], axis: u32) -> RuleResult<()> {
    let vs = xs.iter().map(|&x| cx.v(x)).collect::<RuleResult<Vec<_>>>()?;
    let ty = cx.mlir_ty(cx.k.ops[op].results[0])?;
    let v = cx.emit1(tpu::concatenate(cx.ctx, cx.loc, &vs, axis, ty))?;
    cx.set_result(op, 0, v)
}

/// `tpu.dynamic_rotate` by an i32 value, static shifts included (Pallas's `roll` rule).
fn roll(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, shift: KValue, axis: u32) -> RuleResult<()> {
    let (xv, sv) = (cx.v(x)?, cx.v(shift)?);
    let ty = cx.mlir_ty(cx.k.ops[op].results[0])?;
    let v = cx.emit1(tpu::dynamic_rotate(cx.ctx, cx.loc, xv, sv, axis, ty))?;
    cx.set_result(op, 0, v)
}
