//! Structured control flow: `scf.if`, `scf.for`, `scf.while`, `tpu.region`.

use super::{At, Slot};
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::prepare::{CBlock, Cx, Instr, Term};
use crate::value::Val;

/// Loops that run longer than this are reported instead of hanging.
const MAX_WHILE_ITERATIONS: u64 = 50_000_000;

/// A prepared control instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    If { c: Slot, then: CBlock, els: CBlock },
    For { lb: Slot, ub: Slot, step: Slot, inits: Vec<Slot>, body: CBlock },
    While { inits: Vec<Slot>, before: CBlock, after: CBlock },
    Region { body: CBlock },
}

/// The instruction for a control op, or `None` when `at` is not one.
pub(crate) fn prepare(cx: &mut Cx<'_>, at: &At<'_>) -> Result<Option<Op>> {
    let (op, o) = (at.op, &at.o[..]);
    Ok(Some(match at.name() {
        "scf.if" => {
            at.arity(1)?;
            let then = cx.region_block(op, 0, Some(0))?;
            let els = if op.regions.len() > 1 {
                cx.region_block(op, 1, Some(0))?
            } else {
                CBlock::default()
            };
            Op::If { c: o[0], then, els }
        }
        "scf.for" => {
            at.arity(3)?;
            let inits = o[3..].to_vec();
            let body = cx.region_block(op, 0, Some(1 + inits.len()))?;
            Op::For { lb: o[0], ub: o[1], step: o[2], inits, body }
        }
        "scf.while" => {
            let before = cx.region_block(op, 0, Some(o.len()))?;
            let after = cx.region_block(op, 1, None)?;
            Op::While { inits: o.to_vec(), before, after }
        }
        "tpu.region" => Op::Region { body: cx.region_block(op, 0, Some(0))? },
        "func.func" => bail!(Malformed, "nested func.func"),
        _ => return Ok(None),
    }))
}

/// Run one control instruction (its results set in `fr`).
pub(crate) fn exec(mach: &mut Machine<'_>, ins: &Instr, kind: &Op, fr: &mut [Val]) -> Result<()> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    match kind {
        Op::If { c, then, els } => {
            let b = if v(c).int()? != 0 { then } else { els };
            mach.block(b, fr)?;
            let ys = Machine::yielded(b, fr);
            set_results(ins, fr, ys)
        }
        Op::For { lb, ub, step, inits, body } => {
            let (lo, hi, st) = (v(lb).int()?, v(ub).int()?, v(step).int()?);
            if st <= 0 {
                bail!(Undefined, "scf.for with step {st}");
            }
            let mut carried: Vec<Val> = inits.iter().map(|s| fr[*s as usize].clone()).collect();
            let mut i = lo;
            while i < hi {
                fr[body.args[0] as usize] = Val::Int(i);
                for (a, c) in body.args[1..].iter().zip(carried.drain(..)) {
                    fr[*a as usize] = c;
                }
                mach.block(body, fr)?;
                carried = Machine::yielded(body, fr);
                i += st;
            }
            set_results(ins, fr, carried)
        }
        Op::While { inits, before, after } => {
            let mut carried: Vec<Val> = inits.iter().map(|s| fr[*s as usize].clone()).collect();
            let mut n = 0u64;
            loop {
                for (a, c) in before.args.iter().zip(carried.drain(..)) {
                    fr[*a as usize] = c;
                }
                mach.block(before, fr)?;
                let Term::Condition(c, args) = &before.term else {
                    bail!(Malformed, "scf.while without scf.condition")
                };
                let vals: Vec<Val> = args.iter().map(|s| fr[*s as usize].clone()).collect();
                if fr[*c as usize].int()? == 0 {
                    return set_results(ins, fr, vals);
                }
                for (a, c) in after.args.iter().zip(vals) {
                    fr[*a as usize] = c;
                }
                mach.block(after, fr)?;
                carried = Machine::yielded(after, fr);
                n += 1;
                if n > MAX_WHILE_ITERATIONS {
                    bail!(
                        Deadlock,
                        "scf.while did not terminate after {MAX_WHILE_ITERATIONS} iterations"
                    );
                }
            }
        }
        Op::Region { body } => {
            mach.mem.push_scope();
            let r = mach.block(body, fr);
            let ys = Machine::yielded(body, fr);
            let end = mach.mem.pop_scope();
            r?;
            end?;
            set_results(ins, fr, ys)
        }
    }
}

fn set_results(ins: &Instr, fr: &mut [Val], vals: Vec<Val>) -> Result<()> {
    if vals.len() < ins.res.len() {
        bail!(Malformed, "region yields {} values for {} results", vals.len(), ins.res.len());
    }
    for (r, x) in ins.res.iter().zip(vals) {
        fr[*r as usize] = x;
    }
    Ok(())
}
