//! Structured control flow that traces when its condition or bounds are traced values and
//! runs as plain Rust when they are known at trace time (like `pl.when` on a Python bool).
//!
//! The `#[kernel]` macro rewrites `if`, `for` and `while` in kernel bodies into these calls;
//! variables assigned in a body and declared outside it are threaded through as carried
//! values ([`Carry`]) and become the op's results.

use super::refs::{Ref, SemRef};
use super::val::{Dims, IntoVal, Val, constant};
use super::{in_block, with};
use crate::ir::{
    BinaryOp, BufOrigin, CmpPred, DType, Literal, MemorySpace, OpData, SemKind, Shape, SrcLoc,
    Type, Value,
};
use cranelift_entity::packed_option::ReservedValue;
use smallvec::SmallVec;

/// A set of values a region hands back to its op: `()`, a [`Val`], or tuples of them.
/// Rust values (trace-time constants) can be carried by static control flow only.
pub trait Carry: Sized {
    /// Append this carry's IR values (`None` for a Rust value that cannot be traced).
    fn values(&self, out: &mut Vec<Option<Value>>);
    /// Rebuild from IR values in the same order (Rust values are taken from `self`).
    fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self;
}

impl Carry for () {
    fn values(&self, _: &mut Vec<Option<Value>>) {}
    fn rebuild(&self, _: &mut dyn Iterator<Item = Value>) -> Self {}
}

impl Carry for Val {
    fn values(&self, out: &mut Vec<Option<Value>>) {
        out.push(Some(self.0));
    }
    fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self {
        it.next().map(Val).unwrap_or(*self)
    }
}

macro_rules! rust_carry {
    ($($t:ty),*) => {$(
        impl Carry for $t {
            fn values(&self, out: &mut Vec<Option<Value>>) { out.push(None); }
            fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self { let _ = it.next(); *self }
        }
    )*};
}
rust_carry!(bool, i32, i64, u32, u64, usize, f32, f64);

macro_rules! tuple_carry {
    ($($n:ident),*) => {
        impl<$($n: Carry),*> Carry for ($($n,)*) {
            #[allow(non_snake_case)]
            fn values(&self, out: &mut Vec<Option<Value>>) {
                let ($($n,)*) = self;
                $($n.values(out);)*
            }
            #[allow(non_snake_case)]
            fn rebuild(&self, it: &mut dyn Iterator<Item = Value>) -> Self {
                let ($($n,)*) = self;
                ($($n.rebuild(it),)*)
            }
        }
    };
}
tuple_carry!(A);
tuple_carry!(A, B);
tuple_carry!(A, B, C);
tuple_carry!(A, B, C, D);
tuple_carry!(A, B, C, D, E);
tuple_carry!(A, B, C, D, E, F);
tuple_carry!(A, B, C, D, E, F, G);
tuple_carry!(A, B, C, D, E, F, G, H);

/// The traced IR values of a carry; a Rust value in a traced region is an error at `loc`.
fn traced_values<C: Carry>(c: &C, loc: SrcLoc, what: &str) -> Vec<Value> {
    let mut raw = Vec::new();
    c.values(&mut raw);
    let mut out = Vec::with_capacity(raw.len());
    for v in raw {
        match v {
            Some(v) => out.push(v),
            None => with(|t| {
                t.error(loc, format!("a Rust value cannot change inside a traced {what}: make it a traced value (e.g. `scalar(..)`) or keep the {what} static"));
            }),
        }
    }
    out
}

fn types_of(vs: &[Value]) -> Vec<Type> {
    with(|t| vs.iter().map(|&v| t.kernel.ty(v).clone()).collect())
}

fn emit_yield(values: Vec<Value>, loc: SrcLoc) {
    with(|t| t.emit(OpData::Yield { values: SmallVec::from_vec(values) }, loc, &[]));
}

/// A condition: a Rust `bool` (decided while tracing) or a traced bool scalar.
pub trait Cond: Copy {
    /// `Some` for a trace-time condition.
    fn known(self) -> Option<bool>;
    fn traced(self) -> Option<Val>;
}

impl Cond for bool {
    fn known(self) -> Option<bool> {
        Some(self)
    }
    fn traced(self) -> Option<Val> {
        None
    }
}

impl Cond for Val {
    fn known(self) -> Option<bool> {
        None
    }
    fn traced(self) -> Option<Val> {
        Some(self)
    }
}

/// `if cond { then } else { else }`: `scf.if` for a traced condition.
#[track_caller]
pub fn if_else<C: Cond, R: Carry>(
    cond: C,
    then_branch: impl FnOnce() -> R,
    else_branch: impl FnOnce() -> R,
) -> R {
    if_else_at(cond, then_branch, else_branch, SrcLoc::caller())
}

/// `lax.switch(index, branches)`: run `branches[index]`, the index clamped into range, and
/// hand back its result (every branch returns the same kind of carry). As Pallas lowers
/// it, a traced index becomes nested `scf.if`s (`index != 0` runs the rest with `index - 1`,
/// else branch 0); a Rust index picks its branch while tracing.
/// `switch(i, [&|| x * 2.0, &|| x * 3.0, &|| x * 4.0])`.
#[track_caller]
pub fn switch<R: Carry, const N: usize>(index: impl IntoVal, branches: [&dyn Fn() -> R; N]) -> R {
    const { assert!(N > 0, "switch needs at least one branch") };
    let loc = SrcLoc::caller();
    let last = N - 1;
    let i32_ty = Type::Scalar(DType::I32);
    let int = |v: i64| constant(Literal::Int(v), i32_ty.clone(), loc).0;
    let Some(index) = index.as_val() else {
        let i = index.into_val_shaped(DType::I32, &Shape::default());
        let known = with(|t| t.kernel.def_op(i.0).map(|op| t.kernel.ops[op].data.clone()));
        let pick = match known {
            Some(OpData::Constant { value: Literal::Int(n), .. }) => {
                n.clamp(0, last as i64) as usize
            }
            _ => 0,
        };
        return branches[pick]();
    };
    let binary = |op: BinaryOp, a: Value, b: Value| {
        with(|t| t.emit1(OpData::Binary { op, lhs: a, rhs: b }, loc, i32_ty.clone()))
    };
    let clamped = binary(BinaryOp::Min, binary(BinaryOp::Max, index.0, int(0)), int(last as i64));
    switch_from(clamped, &branches, loc)
}

/// Branch 0 when `index == 0`, else the remaining branches with `index - 1`.
fn switch_from<R: Carry>(index: Value, branches: &[&dyn Fn() -> R], loc: SrcLoc) -> R {
    let [first, rest @ ..] = branches else { unreachable!("switch has at least one branch") };
    if rest.is_empty() {
        return first();
    }
    let zero = constant(Literal::Int(0), Type::Scalar(DType::I32), loc).0;
    let nonzero = with(|t| {
        t.emit1(
            OpData::Compare { pred: CmpPred::Ne, lhs: index, rhs: zero },
            loc,
            Type::Scalar(DType::Bool),
        )
    });
    let rest_branches = || {
        if let [only] = rest {
            return only();
        }
        let one = constant(Literal::Int(1), Type::Scalar(DType::I32), loc).0;
        let next = with(|t| {
            t.emit1(
                OpData::Binary { op: BinaryOp::Sub, lhs: index, rhs: one },
                loc,
                Type::Scalar(DType::I32),
            )
        });
        switch_from(next, rest, loc)
    };
    if_else_at(Val(nonzero), rest_branches, first, loc)
}

fn if_else_at<C: Cond, R: Carry>(
    cond: C,
    then_branch: impl FnOnce() -> R,
    else_branch: impl FnOnce() -> R,
    loc: SrcLoc,
) -> R {
    if let Some(known) = cond.known() {
        return if known { then_branch() } else { else_branch() };
    }
    let cond = cond
        .traced()
        .map(|v| v.0)
        .unwrap_or_else(|| constant(Literal::Bool(false), Type::Scalar(DType::Bool), loc).0);
    let (then_block, _) = with(|t| t.new_block(&[]));
    let then_result = in_block(then_block, || {
        let r = then_branch();
        let vs = traced_values(&r, loc, "if");
        emit_yield(vs, loc);
        r
    });
    let (else_block, _) = with(|t| t.new_block(&[]));
    in_block(else_block, || {
        let r = else_branch();
        let vs = traced_values(&r, loc, "if");
        emit_yield(vs, loc);
    });
    let mut want = Vec::new();
    then_result.values(&mut want);
    let fallback = types_of(&want.iter().flatten().copied().collect::<Vec<_>>());
    let results = with(|t| t.emit(OpData::If { cond, then_block, else_block }, loc, &fallback));
    then_result.rebuild(&mut results.into_iter())
}

/// Bounds of a `for` loop: Rust integers (the loop runs while tracing, unrolled) or traced
/// i32 values (an `scf.for`).
pub trait LoopRange {
    /// The loop variable's type: a Rust integer or a traced [`Val`].
    type Iv;
    fn run<C: Carry>(self, init: C, loc: SrcLoc, body: impl FnMut(Self::Iv, C) -> C) -> C;
}

/// A static range, unrolled at trace time.
#[derive(Clone, Debug)]
pub struct StaticRange<T>(pub std::ops::Range<T>);

/// A traced range `lower..upper` of i32 values.
#[derive(Copy, Clone, Debug)]
pub struct TracedRange {
    lower: Val,
    upper: Val,
}

impl<T> LoopRange for StaticRange<T>
where
    std::ops::Range<T>: Iterator<Item = T>,
{
    type Iv = T;
    fn run<C: Carry>(self, init: C, _: SrcLoc, mut body: impl FnMut(T, C) -> C) -> C {
        let mut c = init;
        for i in self.0 {
            c = body(i, c);
        }
        c
    }
}

impl LoopRange for TracedRange {
    type Iv = Val;
    fn run<C: Carry>(self, init: C, loc: SrcLoc, mut body: impl FnMut(Val, C) -> C) -> C {
        let init_values = traced_values(&init, loc, "loop");
        let mut param_types = vec![Type::Scalar(DType::I32)];
        param_types.extend(types_of(&init_values));
        let (block, params) = with(|t| t.new_block(&param_types));
        let carried_in = init.rebuild(&mut params[1..].iter().copied());
        in_block(block, || {
            let out = body(Val(params[0]), carried_in);
            let vs = traced_values(&out, loc, "loop");
            emit_yield(vs, loc);
        });
        let step = constant(Literal::Int(1), Type::Scalar(DType::I32), loc).0;
        let fallback = types_of(&init_values);
        let data = OpData::For {
            lower: self.lower.0,
            upper: self.upper.0,
            step,
            init: init_values,
            body: block,
        };
        let results = with(|t| t.emit(data, loc, &fallback));
        init.rebuild(&mut results.into_iter())
    }
}

/// Bounds pair → a static or traced range, for the builder API's `for_range(range(a, b), ..)`.
pub trait MakeRange<Upper> {
    type Range: LoopRange;
    fn make(self, upper: Upper, loc: SrcLoc) -> Self::Range;
}

macro_rules! static_range {
    ($($t:ty),*) => {$(
        impl MakeRange<$t> for $t {
            type Range = StaticRange<$t>;
            fn make(self, upper: $t, _: SrcLoc) -> StaticRange<$t> { StaticRange(self..upper) }
        }
        impl MakeRange<Val> for $t {
            type Range = TracedRange;
            fn make(self, upper: Val, loc: SrcLoc) -> TracedRange {
                TracedRange { lower: constant(Literal::Int(self as i64), Type::Scalar(DType::I32), loc), upper }
            }
        }
        impl MakeRange<$t> for Val {
            type Range = TracedRange;
            fn make(self, upper: $t, loc: SrcLoc) -> TracedRange {
                TracedRange { lower: self, upper: constant(Literal::Int(upper as i64), Type::Scalar(DType::I32), loc) }
            }
        }
    )*};
}
static_range!(i32, i64, u32, u64, usize);

impl MakeRange<Val> for Val {
    type Range = TracedRange;
    fn make(self, upper: Val, _: SrcLoc) -> TracedRange {
        TracedRange { lower: self, upper }
    }
}

/// `lower..upper` as a loop range.
#[track_caller]
pub fn range<L: MakeRange<U>, U>(lower: L, upper: U) -> L::Range {
    lower.make(upper, SrcLoc::caller())
}

/// A bound of [`fori`]: a traced i32 scalar, or a Rust integer (an i32 constant).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot bound a traced loop: `fori(lower, upper)` takes traced i32 scalars or Rust integers",
    label = "not a loop bound"
)]
pub trait LoopBound {
    fn into_bound(self, loc: SrcLoc) -> Val;
}

impl LoopBound for Val {
    fn into_bound(self, _: SrcLoc) -> Val {
        self
    }
}

macro_rules! loop_bound {
    ($($t:ty),*) => {$(
        impl LoopBound for $t {
            fn into_bound(self, loc: SrcLoc) -> Val {
                let value = i32::try_from(self).unwrap_or_else(|_| {
                    with(|t| t.error(loc, format!("loop bound {self} does not fit the loop's i32 induction variable")));
                    0
                });
                constant(Literal::Int(value.into()), Type::Scalar(DType::I32), loc)
            }
        }
    )*};
}
loop_bound!(i32, i64, u32, u64, usize);

/// `for i in fori(lower, upper)` in a kernel body: ONE traced `scf.for` (Pallas's
/// `lax.fori_loop`) whatever its bounds are, `i` a traced i32. Its counterpart is
/// [`unrolled`]; a bare `for i in a..b` is rejected by `#[kernel]` because which of the two
/// it meant would depend on the bounds' types.
#[track_caller]
pub fn fori(lower: impl LoopBound, upper: impl LoopBound) -> TracedRange {
    let loc = SrcLoc::caller();
    TracedRange { lower: lower.into_bound(loc), upper: upper.into_bound(loc) }
}

/// The bounds of [`unrolled`]: two Rust integers of one type. One impl per type, not a
/// generic `(T, T)`: an unsuffixed literal still takes the other bound's type (the one impl
/// that can match), and a traced bound matches none, so the error is this trait's message.
#[diagnostic::on_unimplemented(
    message = "`unrolled(lower, upper)` repeats the body once per value at trace time: its bounds must be Rust integers of one type, not `{Self}`",
    label = "bounds not known at trace time",
    note = "a loop over a traced bound is `fori(lower, upper)`: one scf.for (lax.fori_loop)"
)]
pub trait UnrolledBounds {
    type Index;
    fn range(self) -> std::ops::Range<Self::Index>;
}

macro_rules! unrolled_bounds {
    ($($t:ty),*) => {$(
        impl UnrolledBounds for ($t, $t) {
            type Index = $t;
            fn range(self) -> std::ops::Range<$t> { self.0..self.1 }
        }
    )*};
}
unrolled_bounds!(i32, i64, u32, u64, usize);

/// `for i in unrolled(lower, upper)` in a kernel body: the body traced once per value of
/// the Rust range (a Python `for` in a Pallas kernel), `i` a Rust integer. See [`fori`].
pub fn unrolled<L, U>(lower: L, upper: U) -> std::ops::Range<<(L, U) as UnrolledBounds>::Index>
where
    (L, U): UnrolledBounds,
{
    (lower, upper).range()
}

/// `for iv in range { body }` with carried values.
#[track_caller]
pub fn for_range<R: LoopRange, C: Carry>(range: R, init: C, body: impl FnMut(R::Iv, C) -> C) -> C {
    range.run(init, SrcLoc::caller(), body)
}

/// `while cond(carried) { carried = body(carried) }`: traced when the condition is.
#[track_caller]
pub fn while_loop<C: Carry + Clone, B: Cond>(
    init: C,
    mut cond: impl FnMut(C) -> B,
    mut body: impl FnMut(C) -> C,
) -> C {
    let loc = SrcLoc::caller();
    let init_values = traced_values(&init, loc, "while loop");
    let types = types_of(&init_values);
    // Trace the condition in its own block first: its type says whether the loop is static.
    let (cond_block, cond_params) = with(|t| t.new_block(&types));
    let cond_carry = init.rebuild(&mut cond_params.iter().copied());
    let traced_cond = in_block(cond_block, || {
        let c = cond(cond_carry);
        if let Some(v) = c.traced() {
            emit_yield(vec![v.0], loc);
        }
        c.known().is_none()
    });
    if !traced_cond {
        // A static condition: drop the probe block and run the loop while tracing.
        with(|t| t.kernel.blocks[cond_block].ops.clear());
        let mut c = init;
        while cond(c.clone()).known().unwrap_or(false) {
            c = body(c);
        }
        return c;
    }
    let (body_block, body_params) = with(|t| t.new_block(&types));
    let body_carry = init.rebuild(&mut body_params.iter().copied());
    in_block(body_block, || {
        let out = body(body_carry);
        let vs = traced_values(&out, loc, "while loop");
        emit_yield(vs, loc);
    });
    let results = with(|t| {
        t.emit(OpData::While { init: init_values, cond: cond_block, body: body_block }, loc, &types)
    });
    init.rebuild(&mut results.into_iter())
}

/// Allocation handle inside [`run_scoped`].
#[derive(Debug)]
pub struct Scope {
    loc: SrcLoc,
}

impl Scope {
    fn alloc_buf(&self, space: MemorySpace, dims: &[u64], dtype: DType) -> Ref {
        let loc = self.loc;
        Ref(with(|t| {
            let n =
                t.kernel.bufs.values().filter(|b| matches!(b.origin, BufOrigin::Scoped(_))).count();
            let ty = crate::ir::RefType { space, dtype, shape: Shape::new(dims.to_vec()) };
            // The buffer is declared first so the Alloc op can name it; its value and origin
            // are the op's, filled in right after.
            let buf = t.kernel.declare_buf(
                format!("scoped{n}"),
                BufOrigin::Scratch(usize::MAX),
                space,
                dtype,
                ty.shape.clone(),
                Value::reserved_value(),
            );
            let v = t.emit1(OpData::Alloc { buf }, loc, Type::Ref(ty));
            let op = t.kernel.def_op(v).expect("alloc result");
            t.kernel.bufs[buf].value = v;
            t.kernel.bufs[buf].origin = BufOrigin::Scoped(op);
            v
        }))
    }

    /// A VMEM buffer live until the scope ends.
    pub fn vmem(&self, dims: impl Dims, dtype: DType) -> Ref {
        self.alloc_buf(MemorySpace::Vmem, &dims.dims(), dtype)
    }

    /// An SMEM buffer live until the scope ends.
    pub fn smem(&self, dims: impl Dims, dtype: DType) -> Ref {
        self.alloc_buf(MemorySpace::Smem, &dims.dims(), dtype)
    }

    fn alloc_sem(&self, kind: SemKind, dims: &[u64]) -> SemRef {
        let loc = self.loc;
        SemRef(with(|t| {
            let n =
                t.kernel.sems.values().filter(|s| matches!(s.origin, BufOrigin::Scoped(_))).count();
            let shape = Shape::new(dims.to_vec());
            let sem = t.kernel.declare_sem(
                format!("scoped_sem{n}"),
                BufOrigin::Scratch(usize::MAX),
                kind,
                shape.clone(),
                Value::reserved_value(),
            );
            let v = t.emit1(OpData::SemAlloc { sem }, loc, Type::Sem(kind, shape));
            let op = t.kernel.def_op(v).expect("sem_alloc result");
            t.kernel.sems[sem].value = v;
            t.kernel.sems[sem].origin = BufOrigin::Scoped(op);
            v
        }))
    }

    /// A DMA semaphore (or an array of them, with `dims`) live until the scope ends.
    pub fn dma_sems(&self, dims: impl Dims) -> SemRef {
        self.alloc_sem(SemKind::Dma, &dims.dims())
    }

    pub fn dma_sem(&self) -> SemRef {
        self.alloc_sem(SemKind::Dma, &[])
    }

    pub fn sem(&self) -> SemRef {
        self.alloc_sem(SemKind::Regular, &[])
    }
}

/// `pl.run_scoped`: allocations made through the [`Scope`] live until `body` returns.
#[track_caller]
pub fn run_scoped<R: Carry>(body: impl FnOnce(&Scope) -> R) -> R {
    let loc = SrcLoc::caller();
    let (block, _) = with(|t| t.new_block(&[]));
    let r = in_block(block, || {
        let r = body(&Scope { loc });
        let vs = traced_values(&r, loc, "run_scoped");
        emit_yield(vs, loc);
        r
    });
    let mut want = Vec::new();
    r.values(&mut want);
    let fallback = types_of(&want.iter().flatten().copied().collect::<Vec<_>>());
    let results = with(|t| t.emit(OpData::RunScoped { body: block }, loc, &fallback));
    r.rebuild(&mut results.into_iter())
}
