//! Elementwise ops: the `arith.*` and `math.*` arithmetic (`value::Bin`, `value::Un`),
//! casts (`value::Cast`), `arith.cmpi`/`cmpf` and `arith.select`.

use super::{At, Slot};
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::prepare::Instr;
use crate::value::{self, Bin, Cast, DType, Un, Val};

/// A prepared elementwise instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    Bin { op: Bin, dt: DType, a: Slot, b: Slot },
    Un { op: Un, dt: DType, a: Slot },
    Cmp { float: bool, pred: i64, dt: DType, a: Slot, b: Slot },
    Select { c: Slot, t: Slot, f: Slot },
    Cast { op: Cast, from: DType, to: DType, a: Slot },
}

/// The instruction for an elementwise op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o, name) = (at.op, &at.o[..], at.name());
    if let Some(b) = Bin::from_name(name) {
        at.arity(2)?;
        let (_, dt) = at.res_sd()?;
        return Ok(Some(Op::Bin { op: b, dt, a: o[0], b: o[1] }));
    }
    if let Some(u) = Un::from_name(name) {
        at.arity(1)?;
        let (_, dt) = at.res_sd()?;
        return Ok(Some(Op::Un { op: u, dt, a: o[0] }));
    }
    if let Some(c) = Cast::from_name(name) {
        at.arity(1)?;
        let (_, from) = at.opnd_sd(0)?;
        let (_, to) = at.res_sd()?;
        return Ok(Some(Op::Cast { op: c, from, to, a: o[0] }));
    }
    Ok(Some(match name {
        "arith.cmpi" | "arith.cmpf" => {
            at.arity(2)?;
            let (_, dt) = at.opnd_sd(0)?;
            let pred = match op.attr("predicate") {
                Some(a) => match a.as_int() {
                    Some(p) => p,
                    None => bail!(Unsupported, "predicate {a}"),
                },
                None => bail!(Malformed, "missing predicate"),
            };
            Op::Cmp { float: name == "arith.cmpf", pred, dt, a: o[0], b: o[1] }
        }
        "arith.select" => {
            at.arity(3)?;
            Op::Select { c: o[0], t: o[1], f: o[2] }
        }
        _ => return Ok(None),
    }))
}

/// Run one elementwise instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(_mach: &mut Machine<'_>, _ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::Bin { op, dt, a, b } => value::binary(*op, *dt, v(a), v(b))?,
        Op::Un { op, dt, a } => value::unary(*op, *dt, v(a))?,
        Op::Cmp { float, pred, dt, a, b } => value::compare(*float, *pred, *dt, v(a), v(b))?,
        Op::Select { c, t, f } => value::select(v(c), v(t), v(f))?,
        Op::Cast { op, from, to, a } => value::cast(*op, *from, *to, v(a))?,
    })
}
