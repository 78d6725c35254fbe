//! Structured control flow and scopes (pallas-mosaic.md §4.9, §5.3): `scf.if` (always with
//! an else), `scf.for` with i32 bounds, `scf.while`, and `tpu.region` for `run_scoped`.
//!
//! Each rule first appends its op with empty-bodied regions (blocks that only have
//! arguments), then lowers the kernel's blocks into them; `yield` picks the terminator its
//! enclosing op needs.

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{build, tpu, types};
use melior::ir::{
    Block, BlockRef, OperationRef, Region, RegionLike, Type, operation::OperationLike,
};
use palladium_dsl::ir::{Block as KBlock, CmpPred, ControlOp, DType, Op, OpData, Value as KValue};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: ControlOp<'_>) -> RuleResult<()> {
    match data {
        ControlOp::If { cond, then_block, else_block } => {
            r#if(cx, op, *cond, *then_block, *else_block)
        }
        ControlOp::For { lower, upper, step, init, body } => {
            r#for(cx, op, *lower, *upper, *step, init, *body)
        }
        ControlOp::While { init, cond, body } => r#while(cx, op, init, *cond, *body),
        ControlOp::RunScoped { body } => run_scoped(cx, op, *body),
        ControlOp::Yield { values } => r#yield(cx, op, values),
    }
}

impl<'c, 'a> LowerCx<'c, 'a> {
    /// A region holding one empty block with arguments of `types`.
    fn region_with_block(&self, types: &[Type<'c>]) -> Region<'c> {
        let region = Region::new();
        let args: Vec<_> = types.iter().map(|&t| (t, self.loc)).collect();
        region.append_block(Block::new(&args));
        region
    }

    fn result_types(&self, op: Op) -> RuleResult<Vec<Type<'c>>> {
        self.k.ops[op].results.iter().map(|&r| self.mlir_ty(r)).collect()
    }

    fn types_of(&self, vs: &[KValue]) -> RuleResult<Vec<Type<'c>>> {
        vs.iter().map(|&v| self.mlir_ty(v)).collect()
    }

    fn set_results(&mut self, op: Op, mop: OperationRef<'c, 'a>) -> RuleResult<()> {
        for i in 0..self.k.ops[op].results.len() {
            let v = mop.result(i)?.into();
            self.set_result(op, i, v)?;
        }
        Ok(())
    }
}

fn block_of<'c, 'a>(mop: OperationRef<'c, 'a>, region: usize) -> RuleResult<BlockRef<'c, 'a>> {
    match mop.region(region)?.first_block() {
        Some(b) => Ok(b),
        None => bail!("internal: region {region} has no block"),
    }
}

/// `pl.when` / `lax.cond`: `arith.extui` + `arith.cmpi ne, …, 0` (Pallas's bool → index
/// dance), then `scf.if` with both branches.
fn r#if(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    cond: KValue,
    then_block: KBlock,
    else_block: KBlock,
) -> RuleResult<()> {
    let c = cx.v(cond)?;
    let i = cx.generic1("arith.extui", &[c], types::i32(cx.ctx), &[])?;
    let zero = cx.const_i32(0)?;
    let p = cx.cmp(false, CmpPred::Ne, i, zero, &[])?;
    let results = cx.result_types(op)?;
    let regions = vec![cx.region_with_block(&[]), cx.region_with_block(&[])];
    let mop = cx.emit(build::op(cx.ctx, "scf.if", cx.loc, &[p], &results, &[], regions)?);
    cx.lower_block(then_block, block_of(mop, 0)?)?;
    cx.lower_block(else_block, block_of(mop, 1)?)?;
    cx.set_results(op, mop)
}

/// `fori_loop`: `scf.for %iv = %lo to %hi step %st iter_args(…) : i32`.
fn r#for(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    lower: KValue,
    upper: KValue,
    step: KValue,
    init: &[KValue],
    body: KBlock,
) -> RuleResult<()> {
    let mut operands = vec![cx.v(lower)?, cx.v(upper)?, cx.v(step)?];
    for &v in init {
        operands.push(cx.v(v)?);
    }
    let carried = cx.types_of(init)?;
    let mut args = vec![types::i32(cx.ctx)];
    args.extend(&carried);
    let regions = vec![cx.region_with_block(&args)];
    let mop = cx.emit(build::op(cx.ctx, "scf.for", cx.loc, &operands, &carried, &[], regions)?);
    cx.lower_block(body, block_of(mop, 0)?)?;
    cx.set_results(op, mop)
}

/// `while_loop`: `scf.while` whose "before" region computes the condition
/// (`scf.condition`) and whose "after" region is the body.
fn r#while(
    cx: &mut LowerCx<'_, '_>,
    op: Op,
    init: &[KValue],
    cond: KBlock,
    body: KBlock,
) -> RuleResult<()> {
    let operands = init.iter().map(|&v| cx.v(v)).collect::<RuleResult<Vec<_>>>()?;
    let carried = cx.types_of(init)?;
    let regions = vec![cx.region_with_block(&carried), cx.region_with_block(&carried)];
    let mop = cx.emit(build::op(cx.ctx, "scf.while", cx.loc, &operands, &carried, &[], regions)?);
    cx.lower_block(cond, block_of(mop, 0)?)?;
    cx.lower_block(body, block_of(mop, 1)?)?;
    cx.set_results(op, mop)
}

/// `pl.run_scoped`: `"tpu.region"() ({ allocations…; …; tpu.yield })`.
fn run_scoped(cx: &mut LowerCx<'_, '_>, op: Op, body: KBlock) -> RuleResult<()> {
    let results = cx.result_types(op)?;
    let region = cx.region_with_block(&[]);
    let mop = cx.emit(tpu::region(cx.ctx, cx.loc, &results, region)?);
    cx.lower_block(body, block_of(mop, 0)?)?;
    cx.set_results(op, mop)
}

/// The terminator the enclosing op needs: `scf.yield` (if, for, while body),
/// `scf.condition` (while condition), `tpu.yield` (`run_scoped`), `func.return` (index maps).
fn r#yield(cx: &mut LowerCx<'_, '_>, op: Op, values: &[KValue]) -> RuleResult<()> {
    let k = cx.k;
    let block = k.ops[op].block;
    let vals = values.iter().map(|&v| cx.v(v)).collect::<RuleResult<Vec<_>>>()?;
    let (name, operands) = match k.blocks[block].parent.expand() {
        None if block == k.entry => bail!("the kernel body cannot yield"),
        None => ("func.return", vals),
        Some(p) => match &k.ops[p].data {
            OpData::If { .. } | OpData::For { .. } => ("scf.yield", vals),
            OpData::While { cond, .. } if *cond == block => {
                if vals.len() != 1
                    || *cx.ty(values[0]) != palladium_dsl::ir::Type::Scalar(DType::Bool)
                {
                    bail!("a while condition must yield one bool");
                }
                let mut operands = vals;
                for &param in &k.blocks[block].params {
                    operands.push(cx.v(param)?);
                }
                ("scf.condition", operands)
            }
            OpData::While { .. } => ("scf.yield", vals),
            OpData::RunScoped { .. } => {
                let y = tpu::r#yield(cx.ctx, cx.loc, &vals)?;
                cx.emit(y);
                return Ok(());
            }
            other => bail!("yield inside `{}`, which has no regions", other.mnemonic()),
        },
    };
    let y = build::op(cx.ctx, name, cx.loc, &operands, &[], &[], vec![])?;
    cx.emit(y);
    Ok(())
}
