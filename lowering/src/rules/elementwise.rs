//! Elementwise math, comparisons, select and casts (pallas-mosaic.md §4.6–§4.8).

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{build, tpu, types};
use melior::ir::{Value, ValueLike};
use palladium_dsl::ir::{
    BinaryOp, CmpPred, DType, ElementwiseOp, Literal, Op, UnaryOp, Value as KValue,
};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: ElementwiseOp<'_>) -> RuleResult<()> {
    match data {
        ElementwiseOp::Unary { op: u, x } => unary(cx, op, *u, *x),
        ElementwiseOp::Binary { op: b, lhs, rhs } => binary(cx, op, *b, *lhs, *rhs),
        ElementwiseOp::Compare { pred, lhs, rhs } => compare(cx, op, *pred, *lhs, *rhs),
        ElementwiseOp::Select { cond, on_true, on_false } => {
            select(cx, op, *cond, *on_true, *on_false)
        }
        ElementwiseOp::Cast { x, to } => cast(cx, op, *x, *to),
    }
}

/// `arith.cmpf` predicates (ordered, as Pallas) and `arith.cmpi` (signed).
fn cmpf_predicate(p: CmpPred) -> i64 {
    match p {
        CmpPred::Eq => 1, // oeq
        CmpPred::Gt => 2, // ogt
        CmpPred::Ge => 3, // oge
        CmpPred::Lt => 4, // olt
        CmpPred::Le => 5, // ole
        CmpPred::Ne => 6, // one
    }
}

fn cmpi_predicate(p: CmpPred) -> i64 {
    match p {
        CmpPred::Eq => 0,
        CmpPred::Ne => 1,
        CmpPred::Lt => 2, // slt
        CmpPred::Le => 3, // sle
        CmpPred::Gt => 4, // sgt
        CmpPred::Ge => 5, // sge
    }
}

impl<'c, 'a> LowerCx<'c, 'a> {
    /// A two-operand op whose result has the type of `lhs`.
    fn arith2(
        &mut self,
        name: &str,
        lhs: Value<'c, 'a>,
        rhs: Value<'c, 'a>,
    ) -> RuleResult<Value<'c, 'a>> {
        self.generic1(name, &[lhs, rhs], lhs.r#type(), &[])
    }

    fn arith1(&mut self, name: &str, x: Value<'c, 'a>) -> RuleResult<Value<'c, 'a>> {
        self.generic1(name, &[x], x.r#type(), &[])
    }

    /// `arith.cmpi`/`arith.cmpf` with an i1 result of `shape`.
    pub(super) fn cmp(
        &mut self,
        float: bool,
        pred: CmpPred,
        lhs: Value<'c, 'a>,
        rhs: Value<'c, 'a>,
        shape: &[u64],
    ) -> RuleResult<Value<'c, 'a>> {
        let (name, p) = if float {
            ("arith.cmpf", cmpf_predicate(pred))
        } else {
            ("arith.cmpi", cmpi_predicate(pred))
        };
        let ty = types::array(self.ctx, shape, DType::Bool);
        let attr = build::int_attr(self.ctx, 64, p);
        self.generic1(name, &[lhs, rhs], ty, &[("predicate", attr)])
    }

    /// `x != 0` (as i1 of the same shape).
    pub(super) fn nonzero(
        &mut self,
        x: Value<'c, 'a>,
        shape: &[u64],
        dtype: DType,
    ) -> RuleResult<Value<'c, 'a>> {
        let zero = self.constant(Literal::Int(0), dtype, shape)?;
        self.cmp(dtype.is_float(), CmpPred::Ne, x, zero, shape)
    }

    /// Bitwise not: `xori x, -1` (all ones; `true` for bools).
    fn not(&mut self, x: Value<'c, 'a>, shape: &[u64], dtype: DType) -> RuleResult<Value<'c, 'a>> {
        let ones = if dtype == DType::Bool { Literal::Bool(true) } else { Literal::Int(-1) };
        let m = self.constant(ones, dtype, shape)?;
        self.arith2("arith.xori", x, m)
    }

    /// Convert `x` of `from` to `to` (same shape), per Pallas's `_convert_element_type`.
    pub(super) fn convert(
        &mut self,
        x: Value<'c, 'a>,
        shape: &[u64],
        from: DType,
        to: DType,
    ) -> RuleResult<Value<'c, 'a>> {
        let ctx = self.ctx;
        let ty = |d: DType| types::array(ctx, shape, d);
        if from == to {
            return Ok(x);
        }
        if to == DType::Bool {
            // x != 0, narrow ints widened to i32 first.
            let (x, from) = if from.is_int() && from.bits() < 32 {
                (self.convert(x, shape, from, DType::I32)?, DType::I32)
            } else {
                (x, from)
            };
            return self.nonzero(x, shape, from);
        }
        if from == DType::Bool {
            let i = self.generic1("arith.extui", &[x], ty(DType::I32), &[])?;
            return self.convert(i, shape, DType::I32, to);
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if from.bits() < to.bits() {
                    self.generic1("arith.extf", &[x], ty(to), &[])
                } else if from.bits() > to.bits() {
                    self.generic1("arith.truncf", &[x], ty(to), &[])
                } else {
                    // Same width (bf16 <-> f16): through f32.
                    let w = self.generic1("arith.extf", &[x], ty(DType::F32), &[])?;
                    self.generic1("arith.truncf", &[w], ty(to), &[])
                }
            }
            (false, false) => {
                if from.bits() < to.bits() {
                    self.generic1("arith.extsi", &[x], ty(to), &[])
                } else {
                    self.generic1("arith.trunci", &[x], ty(to), &[])
                }
            }
            (true, false) => {
                // float -> i32, then narrow.
                let i = self.generic1("arith.fptosi", &[x], ty(DType::I32), &[])?;
                self.convert(i, shape, DType::I32, to)
            }
            (false, true) => {
                // Narrow ints widen to i32; narrow floats go through f32.
                let x =
                    if from.bits() < 32 { self.convert(x, shape, from, DType::I32)? } else { x };
                if to == DType::F32 {
                    self.generic1("arith.sitofp", &[x], ty(to), &[])
                } else {
                    let f = self.generic1("arith.sitofp", &[x], ty(DType::F32), &[])?;
                    self.convert(f, shape, DType::F32, to)
                }
            }
        }
    }
}

fn unary(cx: &mut LowerCx<'_, '_>, op: Op, u: UnaryOp, x: KValue) -> RuleResult<()> {
    let (shape, dtype) = cx.array_of(x)?;
    let xv = cx.v(x)?;
    let float = dtype.is_float();
    let math = |name: &'static str| -> RuleResult<&'static str> {
        if float { Ok(name) } else { bail!("{u} needs a float operand, got {dtype}") }
    };
    let v = match u {
        UnaryOp::Neg if float => cx.arith1("arith.negf", xv)?,
        UnaryOp::Neg => {
            let zero = cx.constant(Literal::Int(0), dtype, &shape)?;
            cx.arith2("arith.subi", zero, xv)?
        }
        UnaryOp::Abs if float => cx.arith1("math.absf", xv)?,
        UnaryOp::Abs => cx.arith1("math.absi", xv)?,
        UnaryOp::Not if float => bail!("not needs an integer or bool operand, got {dtype}"),
        UnaryOp::Not => cx.not(xv, &shape, dtype)?,
        UnaryOp::Exp => cx.arith1(math("math.exp")?, xv)?,
        UnaryOp::Exp2 => cx.arith1(math("math.exp2")?, xv)?,
        UnaryOp::Log => cx.arith1(math("math.log")?, xv)?,
        UnaryOp::Log1p => cx.arith1(math("math.log1p")?, xv)?,
        UnaryOp::Sqrt => cx.arith1(math("math.sqrt")?, xv)?,
        UnaryOp::Rsqrt => cx.arith1(math("math.rsqrt")?, xv)?,
        UnaryOp::Tanh => cx.arith1(math("math.tanh")?, xv)?,
        UnaryOp::Sin => cx.arith1(math("math.sin")?, xv)?,
        UnaryOp::Cos => cx.arith1(math("math.cos")?, xv)?,
        UnaryOp::Floor => cx.arith1(math("math.floor")?, xv)?,
        UnaryOp::Ceil => cx.arith1(math("math.ceil")?, xv)?,
        // `jnp.round` rounds half to even (`lax.round_p` with ROUND_TO_NEAREST_EVEN).
        UnaryOp::Round => cx.arith1(math("math.roundeven")?, xv)?,
        UnaryOp::Erf => cx.arith1(math("math.erf")?, xv)?,
        UnaryOp::Reciprocal | UnaryOp::ReciprocalApprox => {
            if dtype != DType::F32 || shape.is_empty() {
                bail!("{u} takes an f32 vector, got {dtype}");
            }
            let approx = u == UnaryOp::ReciprocalApprox;
            cx.emit1(tpu::reciprocal(cx.ctx, cx.loc, xv, approx, xv.r#type()))?
        }
        UnaryOp::Logistic => {
            // 1 / (1 + exp(-x)), as Pallas's `_logistic_lowering_rule`.
            math("logistic")?;
            let neg = cx.arith1("arith.negf", xv)?;
            let e = cx.arith1("math.exp", neg)?;
            let one = cx.constant(Literal::Float(1.0), dtype, &shape)?;
            let den = cx.arith2("arith.addf", one, e)?;
            let one = cx.constant(Literal::Float(1.0), dtype, &shape)?;
            cx.arith2("arith.divf", one, den)?
        }
    };
    cx.set_result(op, 0, v)
}

fn binary(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    b: BinaryOp,
    lhs: KValue,
    rhs: KValue,
) -> RuleResult<()> {
    let (_, dtype) = cx.array_of(lhs)?;
    let (l, r) = (cx.v(lhs)?, cx.v(rhs)?);
    let name = if dtype.is_float() {
        match b {
            BinaryOp::Add => "arith.addf",
            BinaryOp::Sub => "arith.subf",
            BinaryOp::Mul => "arith.mulf",
            BinaryOp::Div => "arith.divf",
            BinaryOp::Rem => "arith.remf",
            BinaryOp::Max => "arith.maximumf",
            BinaryOp::Min => "arith.minimumf",
            BinaryOp::Pow => "math.powf",
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr => {
                bail!("{b} is not defined on {dtype}")
            }
        }
    } else if dtype == DType::Bool {
        match b {
            BinaryOp::And => "arith.andi",
            BinaryOp::Or => "arith.ori",
            BinaryOp::Xor => "arith.xori",
            _ => bail!("{b} is not defined on bool"),
        }
    } else {
        match b {
            BinaryOp::Add => "arith.addi",
            BinaryOp::Sub => "arith.subi",
            BinaryOp::Mul => "arith.muli",
            BinaryOp::Div => "arith.divsi",
            BinaryOp::Rem => "arith.remsi",
            BinaryOp::Max => "arith.maxsi",
            BinaryOp::Min => "arith.minsi",
            BinaryOp::And => "arith.andi",
            BinaryOp::Or => "arith.ori",
            BinaryOp::Xor => "arith.xori",
            BinaryOp::Shl => "arith.shli",
            BinaryOp::Shr => "arith.shrsi",
            BinaryOp::Pow => bail!("pow needs float operands, got {dtype}"),
        }
    };
    let v = cx.arith2(name, l, r)?;
    cx.set_result(op, 0, v)
}

fn compare(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    pred: CmpPred,
    lhs: KValue,
    rhs: KValue,
) -> RuleResult<()> {
    let (shape, dtype) = cx.array_of(lhs)?;
    let (l, r) = (cx.v(lhs)?, cx.v(rhs)?);
    let v = if dtype == DType::Bool {
        // Pallas rewrites bool comparisons into logic ops.
        match pred {
            CmpPred::Ne => cx.arith2("arith.xori", l, r)?,
            CmpPred::Eq => {
                let x = cx.arith2("arith.xori", l, r)?;
                cx.not(x, &shape, dtype)?
            }
            CmpPred::Lt => {
                let nl = cx.not(l, &shape, dtype)?;
                cx.arith2("arith.andi", nl, r)?
            }
            CmpPred::Gt => {
                let nr = cx.not(r, &shape, dtype)?;
                cx.arith2("arith.andi", l, nr)?
            }
            CmpPred::Le => {
                let nl = cx.not(l, &shape, dtype)?;
                cx.arith2("arith.ori", nl, r)?
            }
            CmpPred::Ge => {
                let nr = cx.not(r, &shape, dtype)?;
                cx.arith2("arith.ori", l, nr)?
            }
        }
    } else {
        cx.cmp(dtype.is_float(), pred, l, r, &shape)?
    };
    cx.set_result(op, 0, v)
}

/// `arith.select` (a scalar condition selects whole vectors).
fn select(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    cond: KValue,
    on_true: KValue,
    on_false: KValue,
) -> RuleResult<()> {
    let (c, t, f) = (cx.v(cond)?, cx.v(on_true)?, cx.v(on_false)?);
    let v = cx.generic1("arith.select", &[c, t, f], t.r#type(), &[])?;
    cx.set_result(op, 0, v)
}

fn cast(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, to: DType) -> RuleResult<()> {
    let (shape, from) = cx.array_of(x)?;
    let xv = cx.v(x)?;
    let v = cx.convert(xv, &shape, from, to)?;
    cx.set_result(op, 0, v)
}
