//! Loads, stores, sub-refs and scoped allocations (buffers and semaphores):
//! `vector.load`/`store`, `tpu.load`, `tpu.vector_store`, strided loads and stores,
//! `memref.load`/`store`, `tpu.memref_slice`/`squeeze`, `memref.alloca`, `tpu.sem_alloc`,
//! `tpu.assume_multiple`.

use super::{At, Slot, ints, positive_strides, segments, split};
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::memory::{Space, join};
use crate::parse::Attr;
use crate::prepare::{Instr, memref_info};
use crate::value::{DType, Shape, Val};
use std::sync::Arc;

/// A prepared memory instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    /// `steps`: the element stride per dim of `tpu.strided_load` (empty: contiguous).
    VLoad {
        base: Slot,
        idx: Vec<Slot>,
        shape: Shape,
        dt: DType,
        steps: Vec<usize>,
    },
    /// `steps` as in `VLoad` (`tpu.strided_store`).
    VStore {
        val: Slot,
        base: Slot,
        idx: Vec<Slot>,
        mask: Option<Slot>,
        add: bool,
        steps: Vec<usize>,
    },
    MLoad {
        base: Slot,
        idx: Vec<Slot>,
    },
    MStore {
        val: Slot,
        base: Slot,
        idx: Vec<Slot>,
    },
    Slice {
        base: Slot,
        offs: Vec<Slot>,
        sizes: Shape,
    },
    Squeeze {
        base: Slot,
        shape: Shape,
    },
    Alloca {
        dt: DType,
        shape: Shape,
        space: Space,
    },
    AssumeMultiple {
        a: Slot,
        m: i64,
    },
}

/// The instruction for a memory op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o, name) = (at.op, &at.o[..], at.name());
    Ok(Some(match name {
        "vector.load" | "tpu.load" => {
            at.arity(1)?;
            let (shape, dt) = at.res_sd()?;
            Op::VLoad { base: o[0], idx: o[1..].to_vec(), shape, dt, steps: Vec::new() }
        }
        "tpu.strided_load" => {
            at.arity(1)?;
            let (shape, dt) = at.res_sd()?;
            let steps = positive_strides(op, o.len() - 1, name)?;
            Op::VLoad { base: o[0], idx: o[1..].to_vec(), shape, dt, steps }
        }
        "tpu.strided_store" | "vector.store" => {
            at.arity(2)?;
            // A plain store is a strided one with unit steps (no `steps`).
            let steps = match name {
                "tpu.strided_store" => positive_strides(op, o.len() - 2, name)?,
                _ => Vec::new(),
            };
            Op::VStore {
                val: o[0],
                base: o[1],
                idx: o[2..].to_vec(),
                mask: None,
                add: false,
                steps,
            }
        }
        "tpu.vector_store" => {
            let seg = segments(op, &[1, 1, 0, 0])?;
            let parts = split(o, &seg, name)?;
            if let Some(st) = op.attr("strides").and_then(Attr::as_i64_list)
                && !st.is_empty()
                && st.iter().any(|&s| s != 1)
            {
                bail!(Unsupported, "tpu.vector_store with strides {st:?}");
            }
            let add = op.attr("add").and_then(Attr::as_bool).unwrap_or(false);
            Op::VStore {
                val: parts[0][0],
                base: parts[1][0],
                idx: parts[2].to_vec(),
                mask: parts[3].first().copied(),
                add,
                steps: Vec::new(),
            }
        }
        "memref.load" => {
            at.arity(1)?;
            Op::MLoad { base: o[0], idx: o[1..].to_vec() }
        }
        "memref.store" => {
            at.arity(2)?;
            Op::MStore { val: o[0], base: o[1], idx: o[2..].to_vec() }
        }
        "tpu.memref_slice" => {
            let seg = segments(op, &[1, (o.len() as i64 - 1).max(0), 0])?;
            let parts = split(o, &seg, name)?;
            if !parts[2].is_empty() {
                bail!(Unsupported, "tpu.memref_slice with dynamic sizes");
            }
            let Some((sizes, _, _)) = at.rt().and_then(memref_info) else {
                bail!(Unsupported, "memref_slice result type")
            };
            Op::Slice { base: parts[0][0], offs: parts[1].to_vec(), sizes }
        }
        "tpu.memref_squeeze" => {
            at.arity(1)?;
            let Some((shape, _, _)) = at.rt().and_then(memref_info) else {
                bail!(Unsupported, "memref_squeeze result type")
            };
            Op::Squeeze { base: o[0], shape }
        }
        "tpu.sem_alloc" | "memref.alloca" | "memref.alloc" => {
            let Some((shape, dt, space)) = at.rt().and_then(memref_info) else {
                bail!(
                    Unsupported,
                    "allocation of {}",
                    at.rt().map(|t| t.to_string()).unwrap_or_default()
                )
            };
            Op::Alloca { dt, shape, space }
        }
        "tpu.assume_multiple" => {
            at.arity(1)?;
            let m = op.attr("multiple").and_then(Attr::as_int).unwrap_or(1);
            Op::AssumeMultiple { a: o[0], m }
        }
        _ => return Ok(None),
    }))
}

/// Run one memory instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(mach: &mut Machine<'_>, ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::VLoad { base, idx, shape, dt, steps } => {
            let view = v(base).view()?.clone();
            let idx = ints(idx, fr)?;
            Val::Tile(mach.mem.load(&view, &idx, shape, *dt, steps)?)
        }
        Op::VStore { val, base, idx, mask, add, steps } => {
            let view = v(base).view()?.clone();
            let t = v(val).tile()?.clone();
            let m = match mask {
                Some(m) => Some(v(m).tile()?.clone()),
                None => None,
            };
            if let Some(m) = &m
                && m.shape != t.shape
            {
                bail!(
                    Mismatch,
                    "mask shape [{}] differs from value shape [{}]",
                    join(&m.shape),
                    join(&t.shape)
                );
            }
            let idx = ints(idx, fr)?;
            mach.mem.store(&view, &idx, &t, m.as_ref(), *add, steps)?;
            Val::Undef
        }
        Op::MLoad { base, idx } => {
            let view = v(base).view()?.clone();
            let idx = ints(idx, fr)?;
            mach.mem.load_scalar(&view, &idx)?
        }
        Op::MStore { val, base, idx } => {
            let view = v(base).view()?.clone();
            let x = v(val).clone();
            let idx = ints(idx, fr)?;
            mach.mem.store_scalar(&view, &idx, &x)?;
            Val::Undef
        }
        Op::Slice { base, offs, sizes } => {
            let view = v(base).view()?.clone();
            let offs = ints(offs, fr)?;
            Val::Ref(Arc::new(mach.mem.slice(&view, &offs, sizes)?))
        }
        Op::Squeeze { base, shape } => {
            let view = v(base).view()?.clone();
            Val::Ref(Arc::new(mach.mem.squeeze(&view, shape)?))
        }
        Op::Alloca { dt, shape, space } => {
            let s = &mach.prog.sites[ins.site as usize];
            let name = format!("{}@{}", if dt.is_sem() { "sem_alloc" } else { "alloca" }, s.pos);
            let id = mach.mem.alloc(*dt, shape, *space, name);
            Val::Ref(Arc::new(mach.mem.whole(id)))
        }
        Op::AssumeMultiple { a, m } => {
            let x = v(a).int()?;
            if *m != 0 && x % m != 0 {
                bail!(
                    Misaligned,
                    "tpu.assume_multiple claims {x} is a multiple of {m}; on hardware the alignment would be wrong"
                );
            }
            Val::Int(x)
        }
    })
}
