//! Lowering rules: one kernel op → Mosaic MLIR ops.
//!
//! [`lower_op`] matches the op's family ([`OpData::family`](palladium_dsl::ir::OpData::family), from the op table in
//! `dsl/src/ir/op.rs`) and hands it to that family's `lower`, one exhaustive `match` over
//! the family's ops (deliberately without a `_ =>` arm: a new op without a rule does not
//! compile):
//!
//! | file | ops |
//! |---|---|
//! | `constant.rs` | `Constant`, `ProgramId`, `NumPrograms`, `Iota` |
//! | `elementwise.rs` | `Unary`, `Binary`, `Compare`, `Select`, `Cast` |
//! | `shape.rs` | `Broadcast`, `Reshape`, `Transpose`, `Reduce`, `ArgReduce`, `Slice`, `Concat`, `Roll` |
//! | `matmul.rs` | `Dot` |
//! | `memory.rs` | `Load`, `Store`, `RefSlice`, `AssumeMultiple`, `Alloc` |
//! | `dma.rs` | `DmaStart`, `DmaWait`, `SemSignal`, `SemWait`, `SemRead`, `SemAlloc`, `DeviceId`, `BarrierSemaphore` |
//! | `debug.rs` | `DebugPrint` |
//! | `control.rs` | `If`, `For`, `While`, `RunScoped`, `Yield` |
//!
//! Rules are pure: they append ops at the cursor of [`LowerCx`] and record the MLIR value of
//! each result; they never run passes and never panic.

mod constant;
mod control;
mod debug;
mod dma;
mod elementwise;
mod matmul;
mod memory;
mod shape;

use crate::build;
use crate::error::{LowerError, OpError, RuleError, RuleResult, bail};
use crate::types;
use cranelift_entity::SecondaryMap;
use melior::{
    Context,
    ir::{
        Attribute, BlockLike, BlockRef, Location, Operation, OperationRef, Type, Value,
        attribute::{DenseElementsAttribute, FloatAttribute, IntegerAttribute},
        r#type::IntegerType,
    },
};
use palladium_dsl::ir::{
    Block, DType, Kernel, Literal, Offset, Op, OpFamily, SrcLoc, Type as KType, Value as KValue,
};

/// The lowering state (Pallas's `LoweringRuleContext`): the kernel, the MLIR value of every
/// kernel value lowered so far, the grid indices of the function being built, and the
/// insertion block.
pub(crate) struct LowerCx<'c, 'a> {
    pub ctx: &'c Context,
    pub k: &'a Kernel,
    values: SecondaryMap<KValue, Option<Value<'c, 'a>>>,
    /// The i32 grid-index arguments of the current function (kernel or `transform_N`).
    pub grid_args: Vec<Value<'c, 'a>>,
    /// Where new ops go.
    pub block: BlockRef<'c, 'a>,
    /// The location of the op being lowered.
    pub loc: Location<'c>,
    /// Every MLIR op created, with the kernel op it came from (to blame verifier failures).
    pub emitted: Vec<(Op, OperationRef<'c, 'a>)>,
    current: Option<Op>,
}

/// `Location::new(file, line, col)` for a kernel source location.
pub(crate) fn location<'c>(ctx: &'c Context, loc: Option<SrcLoc>) -> Location<'c> {
    match loc {
        Some(l) => Location::new(ctx, l.file, l.line as usize, l.col as usize),
        None => Location::unknown(ctx),
    }
}

/// Lower one kernel op (and, through its rule, the blocks it owns).
pub(crate) fn lower_op(cx: &mut LowerCx<'_, '_>, op: Op) -> Result<(), LowerError> {
    let k = cx.k;
    let saved_loc = cx.loc;
    cx.loc = location(cx.ctx, k.ops[op].loc);
    let saved_op = cx.current.replace(op);
    let r = match k.ops[op].data.family() {
        OpFamily::Constant(data) => constant::lower(cx, op, data),
        OpFamily::Elementwise(data) => elementwise::lower(cx, op, data),
        OpFamily::Shape(data) => shape::lower(cx, op, data),
        OpFamily::Matmul(data) => matmul::lower(cx, op, data),
        OpFamily::Memory(data) => memory::lower(cx, op, data),
        OpFamily::Dma(data) => dma::lower(cx, op, data),
        OpFamily::Debug(data) => debug::lower(cx, op, data),
        OpFamily::Control(data) => control::lower(cx, op, data),
    };
    cx.current = saved_op;
    cx.loc = saved_loc;
    match r {
        Ok(()) => Ok(()),
        Err(RuleError::Nested(e)) => Err(e),
        Err(RuleError::Msg(message)) => Err(op_error(k, op, message, Vec::new())),
    }
}

/// A [`LowerError`] about `op`.
pub(crate) fn op_error(
    k: &Kernel,
    op: Op,
    message: String,
    diagnostics: Vec<String>,
) -> LowerError {
    LowerError::Op(Box::new(OpError {
        op,
        op_text: op_text(k, op),
        loc: k.ops[op].loc,
        message,
        diagnostics,
    }))
}

/// One op as a line of our IR (without nested regions), e.g. `v7 = dot v3 (x), v5 (y)`.
pub(crate) fn op_text(k: &Kernel, op: Op) -> String {
    let node = &k.ops[op];
    let results: Vec<String> = node.results.iter().map(|r| r.to_string()).collect();
    let operands: Vec<String> = node.data.operands().iter().map(|v| k.value_name(*v)).collect();
    let head =
        if results.is_empty() { String::new() } else { format!("{} = ", results.join(", ")) };
    let types: Vec<String> = node.results.iter().map(|&r| k.ty(r).to_string()).collect();
    let tail = if types.is_empty() { String::new() } else { format!(" : {}", types.join(", ")) };
    format!("{head}{} {}{tail}", node.data.mnemonic(), operands.join(", "))
        .replace("  ", " ")
        .trim_end()
        .to_string()
}

impl<'c, 'a> LowerCx<'c, 'a> {
    pub fn new(
        ctx: &'c Context,
        k: &'a Kernel,
        block: BlockRef<'c, 'a>,
        loc: Location<'c>,
    ) -> Self {
        LowerCx {
            ctx,
            k,
            values: SecondaryMap::new(),
            grid_args: Vec::new(),
            block,
            loc,
            emitted: Vec::new(),
            current: None,
        }
    }

    /// Lower the ops of kernel block `kb` into MLIR block `into`, whose arguments stand for
    /// `kb`'s parameters (in order).
    pub fn lower_block(&mut self, kb: Block, into: BlockRef<'c, 'a>) -> Result<(), LowerError> {
        let k = self.k;
        for (i, &p) in k.blocks[kb].params.iter().enumerate() {
            let arg = into.argument(i).map_err(|e| LowerError::Module {
                kernel: k.name.clone(),
                loc: k.loc,
                message: format!("internal: block {kb} has no argument {i} in MLIR: {e}"),
                diagnostics: Vec::new(),
            })?;
            self.values[p] = Some(arg.into());
        }
        let saved = std::mem::replace(&mut self.block, into);
        let r = k.blocks[kb].ops.iter().try_for_each(|&op| lower_op(self, op));
        self.block = saved;
        r
    }

    /// The MLIR value of kernel value `v`.
    pub fn v(&self, v: KValue) -> RuleResult<Value<'c, 'a>> {
        match self.values.get(v).copied().flatten() {
            Some(m) => Ok(m),
            None => {
                bail!("{v} is used before it is lowered (is it defined in an enclosing scope?)")
            }
        }
    }

    pub fn set(&mut self, v: KValue, m: Value<'c, 'a>) {
        self.values[v] = Some(m);
    }

    /// Record the MLIR value of result `i` of `op`.
    pub fn set_result(&mut self, op: Op, i: usize, m: Value<'c, 'a>) -> RuleResult<()> {
        match self.k.ops[op].results.get(i) {
            Some(&r) => {
                self.set(r, m);
                Ok(())
            }
            None => bail!("internal: {op} has no result {i}"),
        }
    }

    pub fn ty(&self, v: KValue) -> &'a KType {
        self.k.ty(v)
    }

    /// The MLIR type of a kernel value.
    pub fn mlir_ty(&self, v: KValue) -> RuleResult<Type<'c>> {
        types::of(self.ctx, self.k.ty(v))
    }

    /// Shape and dtype of a scalar (rank 0) or vector value.
    pub fn array_of(&self, v: KValue) -> RuleResult<(Vec<u64>, DType)> {
        match self.k.ty(v) {
            KType::Scalar(d) => Ok((Vec::new(), *d)),
            KType::Vector(s, d) => Ok((s.dims().to_vec(), *d)),
            t => bail!("{v} must be a scalar or vector, got {t}"),
        }
    }

    /// Append `op` at the cursor.
    pub fn emit(&mut self, op: Operation<'c>) -> OperationRef<'c, 'a> {
        let r = self.block.append_operation(op);
        if let Some(cur) = self.current {
            self.emitted.push((cur, r));
        }
        r
    }

    /// Append a one-result op and return its result.
    pub fn emit1(&mut self, op: RuleResult<Operation<'c>>) -> RuleResult<Value<'c, 'a>> {
        let r = self.emit(op?);
        Ok(r.result(0)?.into())
    }

    /// Append an op built generically (`name`, operands, one result type, attributes).
    pub fn generic1(
        &mut self,
        name: &str,
        operands: &[Value<'c, '_>],
        result: Type<'c>,
        attrs: &[(&str, Attribute<'c>)],
    ) -> RuleResult<Value<'c, 'a>> {
        let op = build::op(self.ctx, name, self.loc, operands, &[result], attrs, vec![]);
        self.emit1(op)
    }

    /// A scalar attribute holding `lit` as `dtype`.
    pub fn literal_attr(&self, lit: Literal, dtype: DType) -> RuleResult<Attribute<'c>> {
        let ctx = self.ctx;
        if dtype == DType::Bool {
            return match lit {
                Literal::Bool(b) => Ok(build::bool_attr(ctx, b)),
                Literal::Int(i @ (0 | 1)) => Ok(build::bool_attr(ctx, i == 1)),
                _ => bail!("literal {lit} is not a bool"),
            };
        }
        if dtype.is_float() {
            let x = match lit {
                Literal::Float(x) => x,
                Literal::Int(i) => i as f64,
                Literal::Bool(b) => f64::from(u8::from(b)),
            };
            return Ok(FloatAttribute::new(ctx, types::element(ctx, dtype), x).into());
        }
        let i = match lit {
            Literal::Int(i) => i,
            Literal::Bool(b) => i64::from(b),
            Literal::Float(x) => bail!("float literal {x:?} for an {dtype} constant"),
        };
        // Signless: accept the signed and the unsigned range, store the two's complement.
        let bits = dtype.bits();
        let (min, umax) = (-(1i64 << (bits - 1)), (1i64 << bits) - 1);
        if i < min || i > umax {
            bail!("literal {i} does not fit in {bits} bits ({dtype})");
        }
        let v = if i > (1i64 << (bits - 1)) - 1 { i - (1i64 << bits) } else { i };
        Ok(IntegerAttribute::new(IntegerType::new(ctx, bits).into(), v).into())
    }

    /// `arith.constant`: a scalar, or a splat `dense<…>` vector when `shape` is non-empty.
    pub fn constant(
        &mut self,
        lit: Literal,
        dtype: DType,
        shape: &[u64],
    ) -> RuleResult<Value<'c, 'a>> {
        let scalar = self.literal_attr(lit, dtype)?;
        let ty = types::array(self.ctx, shape, dtype);
        let value = if shape.is_empty() {
            scalar
        } else {
            DenseElementsAttribute::new(ty, &[scalar])?.into()
        };
        self.generic1("arith.constant", &[], ty, &[("value", value)])
    }

    pub fn const_i32(&mut self, v: i64) -> RuleResult<Value<'c, 'a>> {
        self.constant(Literal::Int(v), DType::I32, &[])
    }

    pub fn const_index(&mut self, v: i64) -> RuleResult<Value<'c, 'a>> {
        let ty = Type::index(self.ctx);
        let attr = IntegerAttribute::new(ty, v).into();
        self.generic1("arith.constant", &[], ty, &[("value", attr)])
    }

    /// An offset as an i32 (a fresh constant per use, as Pallas does).
    pub fn offset_i32(&mut self, o: Offset) -> RuleResult<Value<'c, 'a>> {
        match o {
            Offset::Static(i) => self.const_i32(i),
            Offset::Dynamic(v) => self.v(v),
        }
    }

    /// An offset as an `index` (`arith.index_cast` from i32 for dynamic ones).
    pub fn offset_index(&mut self, o: Offset) -> RuleResult<Value<'c, 'a>> {
        match o {
            Offset::Static(i) => self.const_index(i),
            Offset::Dynamic(v) => {
                let x = self.v(v)?;
                self.generic1("arith.index_cast", &[x], Type::index(self.ctx), &[])
            }
        }
    }

    /// `vector.shape_cast` unless the shapes already agree.
    pub fn shape_cast(
        &mut self,
        x: Value<'c, 'a>,
        from: &[u64],
        to: &[u64],
        dtype: DType,
    ) -> RuleResult<Value<'c, 'a>> {
        if from == to {
            return Ok(x);
        }
        let ty = types::array(self.ctx, to, dtype);
        self.generic1("vector.shape_cast", &[x], ty, &[])
    }
}
