//! [`Val`]: a traced scalar or vector, with numpy-style operators.

use super::refs::{IntoIndex, resolve};
use super::with;
use crate::ir::{
    ArgReduceOp, BinaryOp, CmpPred, DType, DotDims, Index, Literal, Offset, OpData, Precision,
    ReduceOp, Shape, SrcLoc, Type, UnaryOp, Value,
};
use std::ops;

/// A static shape argument: `[8, 128]` of any integer type, a slice, a `Vec` or a [`Shape`],
/// so kernel code can pass its `usize` parameters directly.
pub trait Dims {
    fn dims(&self) -> Vec<u64>;
}

impl<T: Copy + TryInto<u64>, const N: usize> Dims for [T; N] {
    fn dims(&self) -> Vec<u64> {
        self.iter().map(|&d| d.try_into().unwrap_or(0)).collect()
    }
}

impl<T: Copy + TryInto<u64>> Dims for [T] {
    fn dims(&self) -> Vec<u64> {
        self.iter().map(|&d| d.try_into().unwrap_or(0)).collect()
    }
}

impl<T: Dims + ?Sized> Dims for &T {
    fn dims(&self) -> Vec<u64> {
        (**self).dims()
    }
}

impl<T: Copy + TryInto<u64>> Dims for Vec<T> {
    fn dims(&self) -> Vec<u64> {
        self.as_slice().dims()
    }
}

impl Dims for Shape {
    fn dims(&self) -> Vec<u64> {
        self.0.clone()
    }
}

/// A traced scalar or vector value.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Val(pub(crate) Value);

impl Val {
    /// The IR value this handle names.
    pub fn value(self) -> Value {
        self.0
    }

    pub fn ty(self) -> Type {
        with(|t| t.kernel.ty(self.0).clone())
    }

    /// The element type (bool for a ref or semaphore handle mistakenly wrapped).
    pub fn dtype(self) -> DType {
        self.ty().dtype().unwrap_or(DType::Bool)
    }

    pub fn shape(self) -> Shape {
        self.ty().value_shape().unwrap_or_default()
    }

    #[track_caller]
    fn unary(self, op: UnaryOp) -> Val {
        let loc = SrcLoc::caller();
        let ty = self.ty();
        Val(with(|t| t.emit1(OpData::Unary { op, x: self.0 }, loc, ty)))
    }

    #[track_caller]
    pub fn exp(self) -> Val {
        self.unary(UnaryOp::Exp)
    }
    #[track_caller]
    pub fn exp2(self) -> Val {
        self.unary(UnaryOp::Exp2)
    }
    #[track_caller]
    pub fn log(self) -> Val {
        self.unary(UnaryOp::Log)
    }
    #[track_caller]
    pub fn log1p(self) -> Val {
        self.unary(UnaryOp::Log1p)
    }
    #[track_caller]
    pub fn sqrt(self) -> Val {
        self.unary(UnaryOp::Sqrt)
    }
    #[track_caller]
    pub fn rsqrt(self) -> Val {
        self.unary(UnaryOp::Rsqrt)
    }
    #[track_caller]
    pub fn tanh(self) -> Val {
        self.unary(UnaryOp::Tanh)
    }
    #[track_caller]
    pub fn sin(self) -> Val {
        self.unary(UnaryOp::Sin)
    }
    #[track_caller]
    pub fn cos(self) -> Val {
        self.unary(UnaryOp::Cos)
    }
    #[track_caller]
    pub fn abs(self) -> Val {
        self.unary(UnaryOp::Abs)
    }
    #[track_caller]
    pub fn floor(self) -> Val {
        self.unary(UnaryOp::Floor)
    }
    #[track_caller]
    pub fn ceil(self) -> Val {
        self.unary(UnaryOp::Ceil)
    }
    #[track_caller]
    pub fn round(self) -> Val {
        self.unary(UnaryOp::Round)
    }
    #[track_caller]
    pub fn erf(self) -> Val {
        self.unary(UnaryOp::Erf)
    }
    /// `1 / (1 + exp(-x))`.
    #[track_caller]
    pub fn sigmoid(self) -> Val {
        self.unary(UnaryOp::Logistic)
    }

    /// `x * sigmoid(x)` (`SiLU` / swish).
    #[track_caller]
    pub fn silu(self) -> Val {
        self * self.sigmoid()
    }

    /// The elementwise maximum (`jnp.maximum`); `x.max(axis)` reduces.
    #[track_caller]
    pub fn maximum(self, other: impl IntoVal) -> Val {
        binary(BinaryOp::Max, self, other.into_val_like(self))
    }
    /// The elementwise minimum (`jnp.minimum`); `x.min(axis)` reduces.
    #[track_caller]
    pub fn minimum(self, other: impl IntoVal) -> Val {
        binary(BinaryOp::Min, self, other.into_val_like(self))
    }
    /// `1 / x` on the EUP (`pl.reciprocal`): `approx = true` is its fast approximation
    /// (as in Pallas's flash attention); f32 vectors only.
    #[track_caller]
    pub fn reciprocal(self, approx: bool) -> Val {
        self.unary(if approx { UnaryOp::ReciprocalApprox } else { UnaryOp::Reciprocal })
    }
    #[track_caller]
    pub fn pow(self, other: impl IntoVal) -> Val {
        binary(BinaryOp::Pow, self, other.into_val_like(self))
    }

    /// Convert the element type (`astype`).
    #[track_caller]
    pub fn cast(self, to: DType) -> Val {
        if self.dtype() == to {
            return self;
        }
        let loc = SrcLoc::caller();
        let fallback = Type::array(self.shape(), to);
        Val(with(|t| t.emit1(OpData::Cast { x: self.0, to }, loc, fallback)))
    }

    #[track_caller]
    pub fn reshape(self, dims: impl Dims) -> Val {
        let shape = Shape::new(dims.dims());
        if shape == self.shape() {
            return self;
        }
        let loc = SrcLoc::caller();
        let fallback = Type::array(shape.clone(), self.dtype());
        Val(with(|t| t.emit1(OpData::Reshape { x: self.0, shape }, loc, fallback)))
    }

    /// numpy broadcasting to `dims`.
    #[track_caller]
    pub fn broadcast_to(self, dims: impl Dims) -> Val {
        let shape = Shape::new(dims.dims());
        if shape == self.shape() {
            return self;
        }
        let loc = SrcLoc::caller();
        // Lower-rank operands first get leading 1-dims (Mosaic's broadcast needs equal rank).
        let mut x = self;
        let rank = self.shape().rank();
        if rank > 0 && rank < shape.rank() {
            let mut dims = vec![1; shape.rank() - rank];
            dims.extend(self.shape().dims());
            x = x.reshape(dims);
        }
        let fallback = Type::array(shape.clone(), self.dtype());
        Val(with(|t| t.emit1(OpData::Broadcast { x: x.0, shape }, loc, fallback)))
    }

    #[track_caller]
    pub fn transpose(self, perm: impl AsRef<[u32]>) -> Val {
        let loc = SrcLoc::caller();
        let perm = perm.as_ref().to_vec();
        let fallback = self.ty();
        Val(with(|t| t.emit1(OpData::Transpose { x: self.0, perm }, loc, fallback)))
    }

    /// Swap the two minor dims.
    #[track_caller]
    pub fn t(self) -> Val {
        let r = self.shape().rank() as u32;
        let mut perm: Vec<u32> = (0..r).collect();
        if r >= 2 {
            perm.swap(r as usize - 1, r as usize - 2);
        }
        self.transpose(perm)
    }

    /// `axis` as a dim of this value (negative counts from the last, as in numpy), or the
    /// error at the caller's line.
    #[track_caller]
    fn dim(self, axis: impl Axis) -> Result<u32, String> {
        let rank = self.shape().rank() as i64;
        let a = axis.index();
        let d = if a < 0 { a + rank } else { a };
        if (0..rank).contains(&d) {
            Ok(d as u32)
        } else {
            Err(format!("axis {a} is out of range for a value of shape {}", self.shape()))
        }
    }

    /// A poisoned stand-in of `ty` after an error found before any op was built.
    #[track_caller]
    fn failed(message: String, ty: Type) -> Val {
        let loc = SrcLoc::caller();
        Val(with(|t| t.fail(loc, message, ty)))
    }

    #[track_caller]
    fn reduce(self, op: ReduceOp, axis: Option<impl Axis>, keepdims: bool) -> Val {
        let axes = match axis.map(|a| self.dim(a)).transpose() {
            Ok(Some(a)) => vec![a],
            Ok(None) => self.all_axes(),
            Err(m) => return Val::failed(m, self.ty()),
        };
        let loc = SrcLoc::caller();
        let shape = self.shape();
        let kept: Vec<u64> = shape
            .dims()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(&(*i as u32)))
            .map(|(_, d)| *d)
            .collect();
        let fallback = Type::array(Shape(kept), self.dtype());
        let r = Val(with(|t| {
            t.emit1(OpData::Reduce { op, x: self.0, axes: axes.clone() }, loc, fallback)
        }));
        if keepdims {
            let dims: Vec<u64> = shape
                .dims()
                .iter()
                .enumerate()
                .map(|(i, d)| if axes.contains(&(i as u32)) { 1 } else { *d })
                .collect();
            return r.reshape(dims);
        }
        r
    }

    /// Sum over `axis`, dropping it (`x.sum(axis)`).
    #[track_caller]
    pub fn sum(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Sum, Some(axis), false)
    }
    /// Sum over `axis`, keeping it as size 1 (ready to broadcast back).
    #[track_caller]
    pub fn sum_keepdims(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Sum, Some(axis), true)
    }
    /// Max over `axis`, dropping it (`x.max(axis)`); [`Val::maximum`] is elementwise.
    #[track_caller]
    pub fn max(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Max, Some(axis), false)
    }
    #[track_caller]
    pub fn max_keepdims(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Max, Some(axis), true)
    }
    /// Min over `axis`, dropping it (`x.min(axis)`); [`Val::minimum`] is elementwise.
    #[track_caller]
    pub fn min(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Min, Some(axis), false)
    }
    #[track_caller]
    pub fn min_keepdims(self, axis: impl Axis) -> Val {
        self.reduce(ReduceOp::Min, Some(axis), true)
    }
    /// Sum over every axis to a scalar.
    #[track_caller]
    pub fn sum_all(self) -> Val {
        self.reduce(ReduceOp::Sum, None::<u32>, false)
    }
    /// Max over every axis to a scalar (with [`Val::min_all`], how a kernel pulls one
    /// element out of a vector: `select(mask, x, identity).max_all()`).
    #[track_caller]
    pub fn max_all(self) -> Val {
        self.reduce(ReduceOp::Max, None::<u32>, false)
    }
    /// Min over every axis to a scalar.
    #[track_caller]
    pub fn min_all(self) -> Val {
        self.reduce(ReduceOp::Min, None::<u32>, false)
    }

    /// Mean over `axis`, dropping it (`jnp.mean`: the sum divided by the dim's size).
    #[track_caller]
    pub fn mean(self, axis: impl Axis) -> Val {
        self.mean_impl(axis, false)
    }
    #[track_caller]
    pub fn mean_keepdims(self, axis: impl Axis) -> Val {
        self.mean_impl(axis, true)
    }
    #[track_caller]
    fn mean_impl(self, axis: impl Axis, keepdims: bool) -> Val {
        let n = match self.dim(axis) {
            Ok(d) => self.shape().dims()[d as usize],
            Err(m) => return Val::failed(m, self.ty()),
        };
        // As jnp.mean, an integer operand averages in f32.
        let x = if self.dtype().is_float() { self } else { self.cast(DType::F32) };
        x.reduce(ReduceOp::Sum, Some(axis), keepdims) / n as f64
    }

    /// The i32 index of the max along `axis` (`jnp.argmax`; the first on ties), dropping it.
    #[track_caller]
    pub fn argmax(self, axis: impl Axis) -> Val {
        self.arg_reduce(ArgReduceOp::ArgMax, axis)
    }
    /// The i32 index of the min along `axis` (`jnp.argmin`; the first on ties), dropping it.
    #[track_caller]
    pub fn argmin(self, axis: impl Axis) -> Val {
        self.arg_reduce(ArgReduceOp::ArgMin, axis)
    }
    #[track_caller]
    fn arg_reduce(self, op: ArgReduceOp, axis: impl Axis) -> Val {
        let mut dims = self.shape().dims().to_vec();
        let axis = match self.dim(axis) {
            Ok(a) => a,
            Err(m) => return Val::failed(m, Type::array(self.shape(), DType::I32)),
        };
        dims.remove(axis as usize);
        let loc = SrcLoc::caller();
        let fallback = Type::array(Shape(dims), DType::I32);
        Val(with(|t| t.emit1(OpData::ArgReduce { op, x: self.0, axis }, loc, fallback)))
    }

    fn all_axes(self) -> Vec<u32> {
        (0..self.shape().rank() as u32).collect()
    }

    /// A static window of the value, `x[(.., 0..1)]` in a kernel body (`lax.slice`):
    /// ranges keep their dim, integers drop it, missing trailing dims are taken whole.
    #[track_caller]
    pub fn slice(self, idx: impl IntoIndex) -> Val {
        let shape = self.shape();
        let index = match resolve(idx.items(), &shape) {
            Ok(index) => index,
            Err(m) => return Val::failed(format!("slice: {m}"), self.ty()),
        };
        let mut start = Vec::with_capacity(index.len());
        let mut kept = Vec::new();
        for (d, i) in index.iter().enumerate() {
            if i.stride() != 1 {
                return Val::failed(
                    format!(
                        "slice: a strided slice along dim {d} (Pallas TPU has no lowering for strided value slices; load with a strided `ds` from the ref)"
                    ),
                    self.ty(),
                );
            }
            match i.offset() {
                Offset::Static(o) if o >= 0 => start.push(o as u64),
                _ => {
                    return Val::failed(
                        format!(
                            "slice: the start along dim {d} must be a static non-negative integer (value slices are static, as `lax.slice`: Pallas TPU has no lowering for `lax.dynamic_slice`; load a dynamic window from the ref with `ds(start, size)`)"
                        ),
                        self.ty(),
                    );
                }
            }
            if let Index::Slice { size, .. } = i {
                kept.push(*size);
            }
        }
        let size: Vec<u64> = index.iter().map(Index::size).collect();
        if start.iter().all(|&o| o == 0) && size == shape.dims() && kept.len() == size.len() {
            return self;
        }
        let loc = SrcLoc::caller();
        let fallback = Type::array(Shape(size.clone()), self.dtype());
        let window =
            Val(with(|t| t.emit1(OpData::Slice { x: self.0, start, size }, loc, fallback)));
        window.reshape(kept)
    }

    /// Rotate along `axis` by `shift` (a non-negative integer or a traced i32) toward higher
    /// indices: `pltpu.roll`, the same result as `jnp.roll(x, shift, axis)`.
    #[track_caller]
    pub fn roll(self, shift: impl IntoVal, axis: impl Axis) -> Val {
        let axis = match self.dim(axis) {
            Ok(a) => a,
            Err(m) => return Val::failed(format!("roll: {m}"), self.ty()),
        };
        let is_static = shift.as_val().is_none();
        let shift = shift.into_val_shaped(DType::I32, &Shape::default());
        let loc = SrcLoc::caller();
        let literal = with(|t| t.kernel.def_op(shift.0).map(|op| t.kernel.ops[op].data.clone()));
        if let (true, Some(OpData::Constant { value: Literal::Int(n), .. })) = (is_static, literal)
            && n < 0
        {
            return Val::failed(
                format!("roll: a static shift must be non-negative, got {n} (as pltpu.roll)"),
                self.ty(),
            );
        }
        let fallback = self.ty();
        Val(with(|t| t.emit1(OpData::Roll { x: self.0, shift: shift.0, axis }, loc, fallback)))
    }

    /// `jnp.repeat(x, repeats, axis)`: each element repeated `repeats` times in place along
    /// `axis` (a size-1 axis broadcasts; as JAX, through a new minor dim and a reshape).
    #[track_caller]
    pub fn repeat(self, repeats: u64, axis: impl Axis) -> Val {
        let axis = match self.dim(axis) {
            Ok(a) => a as usize,
            Err(m) => return Val::failed(format!("repeat: {m}"), self.ty()),
        };
        let dims = self.shape().dims().to_vec();
        let mut split = dims.clone();
        split.insert(axis + 1, 1);
        let mut wide = dims.clone();
        wide.insert(axis + 1, repeats);
        let mut out = dims;
        out[axis] *= repeats;
        self.reshape(split).broadcast_to(wide).reshape(out)
    }

    /// Promise the value (an i32 offset) is a multiple of `multiple` (`pl.multiple_of`).
    #[track_caller]
    pub fn multiple_of(self, multiple: u32) -> Val {
        let loc = SrcLoc::caller();
        Val(with(|t| {
            t.emit1(OpData::AssumeMultiple { x: self.0, multiple }, loc, Type::Scalar(DType::I32))
        }))
    }
}

/// A constant of `dtype` with `shape` (rank 0: a scalar).
#[track_caller]
pub fn full(dims: impl Dims, value: impl Into<f64>, dtype: DType) -> Val {
    let v: f64 = value.into();
    let lit = if dtype.is_float() {
        Literal::Float(v)
    } else if dtype == DType::Bool {
        Literal::Bool(v != 0.0)
    } else {
        Literal::Int(v as i64)
    };
    constant(lit, Type::array(Shape::new(dims.dims()), dtype), SrcLoc::caller())
}

#[track_caller]
pub fn zeros(dims: impl Dims, dtype: DType) -> Val {
    full(dims, 0.0, dtype)
}

/// An i32 scalar constant.
#[track_caller]
pub fn scalar(value: i32) -> Val {
    constant(Literal::Int(value.into()), Type::Scalar(DType::I32), SrcLoc::caller())
}

pub(crate) fn constant(value: Literal, ty: Type, loc: SrcLoc) -> Val {
    let fallback = ty.clone();
    Val(with(|t| t.emit1(OpData::Constant { value, ty }, loc, fallback)))
}

/// `pl.program_id(axis)`.
#[track_caller]
pub fn program_id(axis: u32) -> Val {
    let loc = SrcLoc::caller();
    Val(with(|t| t.emit1(OpData::ProgramId { axis }, loc, Type::Scalar(DType::I32))))
}

/// `pl.num_programs(axis)`.
#[track_caller]
pub fn num_programs(axis: u32) -> Val {
    let loc = SrcLoc::caller();
    Val(with(|t| t.emit1(OpData::NumPrograms { axis }, loc, Type::Scalar(DType::I32))))
}

/// An i32 vector counting along `dim` (`broadcasted_iota`).
#[track_caller]
pub fn iota(dims: impl Dims, dim: u32) -> Val {
    let loc = SrcLoc::caller();
    let shape = Shape::new(dims.dims());
    let fallback = Type::array(shape.clone(), DType::I32);
    Val(with(|t| t.emit1(OpData::Iota { shape, dim }, loc, fallback)))
}

/// `jnp.concatenate(xs, axis)`: vectors joined along `axis` (`tpu.concatenate`).
#[track_caller]
pub fn concatenate(xs: &[Val], axis: impl Axis) -> Val {
    let loc = SrcLoc::caller();
    let Some(&first) = xs.first() else {
        return Val(with(|t| {
            t.fail(loc, "concatenate needs at least one value", Type::Scalar(DType::F32))
        }));
    };
    let axis = match first.dim(axis) {
        Ok(a) => a,
        Err(m) => return Val(with(|t| t.fail(loc, format!("concatenate: {m}"), first.ty()))),
    };
    if xs.len() == 1 {
        return first;
    }
    let fallback = first.ty();
    Val(with(|t| {
        t.emit1(OpData::Concat { xs: xs.iter().map(|x| x.0).collect(), axis }, loc, fallback)
    }))
}

/// `pl.debug_print(format, *args)`: at run time, `format` with each `{}` replaced by the
/// next i32 scalar of `args` (`tpu.log`; the interpreter prints it to stdout).
#[track_caller]
pub fn debug_print(format: &str, args: &[Val]) {
    let loc = SrcLoc::caller();
    let args = args.iter().map(|a| a.0).collect();
    with(|t| t.emit(OpData::DebugPrint { format: format.to_string(), args }, loc, &[]));
}

/// `jnp.where(cond, a, b)`.
#[track_caller]
pub fn select(cond: Val, on_true: impl IntoVal, on_false: impl IntoVal) -> Val {
    let loc = SrcLoc::caller();
    let (a, b) = match (on_true.as_val(), on_false.as_val()) {
        (Some(a), _) => (a, on_false.into_val_like(a)),
        (None, Some(b)) => (on_true.into_val_like(b), b),
        (None, None) => (on_true.into_val_like(cond), on_false.into_val_like(cond)),
    };
    let shape = broadcast_shape(&[cond.shape(), a.shape(), b.shape()]).unwrap_or_else(|| a.shape());
    let (a, b) = (a.broadcast_to(shape.dims()), b.broadcast_to(shape.dims()));
    let cond = if cond.shape().rank() == 0 { cond } else { cond.broadcast_to(shape.dims()) };
    let fallback = a.ty();
    Val(with(|t| {
        t.emit1(OpData::Select { cond: cond.0, on_true: a.0, on_false: b.0 }, loc, fallback)
    }))
}

/// `jnp.dot(a, b, preferred_element_type=f32)` for 2-D operands (i32 accumulation for
/// integer operands).
#[track_caller]
pub fn dot(a: Val, b: Val) -> Val {
    let out = if a.dtype().is_float() { DType::F32 } else { DType::I32 };
    dot_general(a, b, DotDims::matmul(), out, Precision::Default)
}

/// `a @ b.T` for 2-D operands: contracts both minor dims (the MXU reads `b` transposed).
#[track_caller]
pub fn dot_t(a: Val, b: Val) -> Val {
    let out = if a.dtype().is_float() { DType::F32 } else { DType::I32 };
    dot_general(a, b, DotDims::matmul_transposed_rhs(), out, Precision::Default)
}

/// `lax.dot_general` with an accumulator type and dimension numbers: a readable spec,
/// `"bqd,bkd->bqk"` (letters in both operands and the result are batch dims, in both
/// operands only contracted; the result lists batch, then lhs free, then rhs free dims, the
/// order `tpu.matmul` produces), or explicit [`DotDims`].
#[track_caller]
pub fn dot_general(a: Val, b: Val, dims: impl DotSpec, out: DType, precision: Precision) -> Val {
    let loc = SrcLoc::caller();
    let dims = match dims.dot_dims(a.shape().rank(), b.shape().rank()) {
        Ok(d) => d,
        Err(m) => {
            return Val(with(|t| t.fail(loc, format!("dot_general: {m}"), Type::Scalar(out))));
        }
    };
    let fallback = Type::Scalar(out);
    Val(with(|t| t.emit1(OpData::Dot { lhs: a.0, rhs: b.0, dims, precision, out }, loc, fallback)))
}

/// How [`dot_general`] takes its dimension numbers: a spec string or [`DotDims`].
pub trait DotSpec {
    fn dot_dims(self, lhs_rank: usize, rhs_rank: usize) -> Result<DotDims, String>;
}

impl DotSpec for DotDims {
    fn dot_dims(self, _: usize, _: usize) -> Result<DotDims, String> {
        Ok(self)
    }
}

impl DotSpec for &str {
    fn dot_dims(self, lhs_rank: usize, rhs_rank: usize) -> Result<DotDims, String> {
        DotDims::parse(self, lhs_rank, rhs_rank)
    }
}

/// The numpy broadcast of several shapes, if they are compatible.
pub(crate) fn broadcast_shape(shapes: &[Shape]) -> Option<Shape> {
    let rank = shapes.iter().map(|s| s.rank()).max().unwrap_or(0);
    let mut out = vec![1u64; rank];
    for s in shapes {
        for (o, &d) in out.iter_mut().rev().zip(s.dims().iter().rev()) {
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(Shape(out))
}

/// A dim of a value: an integer, negative counting from the last (numpy's `axis=-1`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an axis: `max`, `min`, `sum`, `mean` and `argmax` reduce along an axis (jnp's `x.max(axis=1)`)",
    label = "expected an integer axis",
    note = "for the elementwise maximum or minimum of two values, use `x.maximum(y)` / `x.minimum(y)` (jnp.maximum / jnp.minimum)"
)]
pub trait Axis: Copy {
    fn index(self) -> i64;
}

macro_rules! int_axis {
    ($($t:ty),*) => {$(
        impl Axis for $t {
            fn index(self) -> i64 { self as i64 }
        }
    )*};
}
int_axis!(i32, i64, u32, u64, usize);

/// Anything usable where a value is expected: a [`Val`] or a Rust number, which becomes a
/// constant of the other operand's dtype (JAX's weak typing).
pub trait IntoVal: Copy {
    fn as_val(self) -> Option<Val>;
    /// A Rust number as a constant of `dtype` and `shape` (a splat); a [`Val`] as itself.
    #[track_caller]
    fn into_val_shaped(self, dtype: DType, shape: &Shape) -> Val;
    /// A Rust number as a scalar constant of `like`'s dtype; a [`Val`] as itself.
    #[track_caller]
    fn into_val_like(self, like: Val) -> Val {
        self.into_val_shaped(like.dtype(), &Shape::default())
    }
}

impl IntoVal for Val {
    fn as_val(self) -> Option<Val> {
        Some(self)
    }
    fn into_val_shaped(self, _: DType, _: &Shape) -> Val {
        self
    }
}

/// A Rust number as a literal of `dtype` (floats truncate toward zero for int dtypes).
fn literal_of(x: f64, int: Option<i64>, dtype: DType) -> Literal {
    if dtype.is_float() {
        Literal::Float(x)
    } else if dtype == DType::Bool {
        Literal::Bool(x != 0.0)
    } else {
        Literal::Int(int.unwrap_or(x as i64))
    }
}

macro_rules! number_into_val {
    ($($t:ty => $int:expr),*) => {$(
        impl IntoVal for $t {
            fn as_val(self) -> Option<Val> { None }
            #[track_caller]
            fn into_val_shaped(self, dtype: DType, shape: &Shape) -> Val {
                #[allow(clippy::redundant_closure_call)]
                let lit = literal_of(self as f64, ($int)(self), dtype);
                constant(lit, Type::array(shape.clone(), dtype), SrcLoc::caller())
            }
        }
    )*};
}
number_into_val!(
    f64 => |_| None, f32 => |_| None,
    i32 => |x| Some(x as i64), i64 => Some, u32 => |x| Some(x as i64),
    usize => |x| Some(x as i64), u64 => |x| Some(x as i64)
);

impl IntoVal for bool {
    fn as_val(self) -> Option<Val> {
        None
    }
    #[track_caller]
    fn into_val_shaped(self, _: DType, shape: &Shape) -> Val {
        constant(Literal::Bool(self), Type::array(shape.clone(), DType::Bool), SrcLoc::caller())
    }
}

#[track_caller]
pub(crate) fn binary(op: BinaryOp, a: Val, b: Val) -> Val {
    let loc = SrcLoc::caller();
    let (a, b) = broadcast_pair(a, b);
    let fallback = a.ty();
    Val(with(|t| t.emit1(OpData::Binary { op, lhs: a.0, rhs: b.0 }, loc, fallback)))
}

/// Broadcast two operands to a common shape (scalars splat, size-1 dims stretch).
#[track_caller]
fn broadcast_pair(a: Val, b: Val) -> (Val, Val) {
    let (sa, sb) = (a.shape(), b.shape());
    if sa == sb {
        return (a, b);
    }
    match broadcast_shape(&[sa, sb]) {
        Some(s) => (a.broadcast_to(s.dims()), b.broadcast_to(s.dims())),
        // Leave them be: the typing rule reports the mismatch at the user's line.
        None => (a, b),
    }
}

#[track_caller]
pub(crate) fn compare(pred: CmpPred, a: Val, b: Val) -> Val {
    let loc = SrcLoc::caller();
    let (a, b) = broadcast_pair(a, b);
    let fallback = Type::array(a.shape(), DType::Bool);
    Val(with(|t| t.emit1(OpData::Compare { pred, lhs: a.0, rhs: b.0 }, loc, fallback)))
}

macro_rules! binary_ops {
    ($($tr:ident $m:ident => $op:ident),*) => {$(
        impl<R: IntoVal> ops::$tr<R> for Val {
            type Output = Val;
            #[track_caller]
            fn $m(self, rhs: R) -> Val { binary(BinaryOp::$op, self, rhs.into_val_like(self)) }
        }
        binary_ops!(@rev $tr $m $op: f64, f32, i32, i64, u32, usize, u64);
    )*};
    (@rev $tr:ident $m:ident $op:ident: $($t:ty),*) => {$(
        impl ops::$tr<Val> for $t {
            type Output = Val;
            #[track_caller]
            fn $m(self, rhs: Val) -> Val { binary(BinaryOp::$op, self.into_val_like(rhs), rhs) }
        }
    )*};
}
binary_ops!(Add add => Add, Sub sub => Sub, Mul mul => Mul, Div div => Div, Rem rem => Rem,
            BitAnd bitand => And, BitOr bitor => Or, BitXor bitxor => Xor, Shl shl => Shl, Shr shr => Shr);

impl ops::Neg for Val {
    type Output = Val;
    #[track_caller]
    fn neg(self) -> Val {
        self.unary(UnaryOp::Neg)
    }
}

impl ops::Not for Val {
    type Output = Val;
    #[track_caller]
    fn not(self) -> Val {
        self.unary(UnaryOp::Not)
    }
}

/// Comparison that traces when either side is a [`Val`] and is plain Rust otherwise. The
/// `#[kernel]` macro rewrites `a < b` (and `==`, `!=`, ...) into calls of this trait,
/// because Rust's comparison traits must return `bool`.
pub trait Compare<Rhs> {
    type Output;
    fn compare(self, pred: CmpPred, rhs: Rhs) -> Self::Output;
}

impl<R: IntoVal> Compare<R> for Val {
    type Output = Val;
    #[track_caller]
    fn compare(self, pred: CmpPred, rhs: R) -> Val {
        compare(pred, self, rhs.into_val_like(self))
    }
}

macro_rules! plain_compare {
    ($($t:ty),*) => {$(
        impl Compare<$t> for $t {
            type Output = bool;
            fn compare(self, pred: CmpPred, rhs: $t) -> bool {
                match pred {
                    CmpPred::Eq => self == rhs, CmpPred::Ne => self != rhs, CmpPred::Lt => self < rhs,
                    CmpPred::Le => self <= rhs, CmpPred::Gt => self > rhs, CmpPred::Ge => self >= rhs,
                }
            }
        }
        impl Compare<Val> for $t {
            type Output = Val;
            #[track_caller]
            fn compare(self, pred: CmpPred, rhs: Val) -> Val { compare(pred, self.into_val_like(rhs), rhs) }
        }
    )*};
}
plain_compare!(f64, f32, i32, i64, u32, usize, u64);
