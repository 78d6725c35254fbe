//! The interpreter's rules: for each Mosaic op, how it is prepared (its operands and
//! attributes resolved into a typed instruction, once) and how that instruction runs.
//! Both halves of an op's rule live in its family's file, the families of the lowering
//! (`lowering/src/rules/`) that emits these ops:
//!
//! | file | Mosaic ops |
//! |---|---|
//! | `constant.rs` | `arith.constant`, `tpu.iota`, `tpu.iteration_bound`, `tpu.core_id` |
//! | `elementwise.rs` | `arith.*` / `math.*` arithmetic, casts, `arith.cmpi`/`cmpf`, `arith.select` |
//! | `shape.rs` | `vector.broadcast`, `shape_cast`, `multi_reduction`, `extract`, `extract_strided_slice`, `tpu.transpose`, `tpu.concatenate`, `tpu.dynamic_rotate`, `tpu.reduce_index` |
//! | `matmul.rs` | `tpu.matmul` |
//! | `memory.rs` | `vector.load`/`store`, `tpu.load`, `tpu.vector_store`, `tpu.strided_load`/`store`, `memref.load`/`store`, `tpu.memref_slice`/`squeeze`, `memref.alloca`, `tpu.sem_alloc`, `tpu.assume_multiple` |
//! | `dma.rs` | `tpu.enqueue_dma`, `tpu.wait_dma(2)`, `tpu.sem_signal`/`wait`/`read`, `tpu.device_id`, `tpu.sem_barrier` |
//! | `debug.rs` | `tpu.log`, `cf.assert`, trace markers (no-ops) |
//! | `control.rs` | `scf.if`, `scf.for`, `scf.while`, `tpu.region` |
//!
//! [`prepare`] asks each family in turn for the op by name; [`Kind`] holds the family's
//! instruction and the machine's `instr` runs it through that family's `exec` (one
//! exhaustive `match` per family). Terminators (`scf.yield`, `scf.condition`,
//! `func.return`) end blocks and are prepared with them (`prepare.rs`).

pub(crate) mod constant;
pub(crate) mod control;
pub(crate) mod debug;
pub(crate) mod dma;
pub(crate) mod elementwise;
pub(crate) mod matmul;
pub(crate) mod memory;
pub(crate) mod shape;

use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::parse::{Attr, Operation, Type};
use crate::prepare::{Cx, Slot, shape_dt};
use crate::value::{DType, Shape, Val};

/// A prepared instruction: one family's.
#[derive(Debug)]
pub(crate) enum Kind {
    Constant(constant::Op),
    Elementwise(elementwise::Op),
    Shape(shape::Op),
    Matmul(matmul::Op),
    Memory(memory::Op),
    Dma(dma::Op),
    Debug(debug::Op),
    Control(control::Op),
}

/// The instruction for `op`, from the family that knows its name.
pub(crate) fn prepare(cx: &mut Cx<'_>, at: &At<'_>) -> Result<Kind> {
    // Elementwise first: its names come from the `value` tables (`Bin`, `Un`, `Cast`).
    if let Some(k) = elementwise::prepare(at)? {
        return Ok(Kind::Elementwise(k));
    }
    if let Some(k) = constant::prepare(at)? {
        return Ok(Kind::Constant(k));
    }
    if let Some(k) = shape::prepare(at)? {
        return Ok(Kind::Shape(k));
    }
    if let Some(k) = matmul::prepare(at)? {
        return Ok(Kind::Matmul(k));
    }
    if let Some(k) = memory::prepare(at)? {
        return Ok(Kind::Memory(k));
    }
    if let Some(k) = dma::prepare(at)? {
        return Ok(Kind::Dma(k));
    }
    if let Some(k) = debug::prepare(at)? {
        return Ok(Kind::Debug(k));
    }
    if let Some(k) = control::prepare(cx, at)? {
        return Ok(Kind::Control(k));
    }
    let name = at.name();
    bail!(Unsupported, "op `{name}` is not implemented by the interpreter")
}

/// One Mosaic op being prepared: the op and its operands' slots.
pub(crate) struct At<'a> {
    pub op: &'a Operation,
    pub o: Vec<Slot>,
}

impl<'a> At<'a> {
    pub fn name(&self) -> &'a str {
        self.op.name.as_str()
    }

    /// The type of the first result.
    pub fn rt(&self) -> Option<&'a Type> {
        self.op.result_types.first()
    }

    /// Shape and dtype of the first result (a scalar or vector).
    pub fn res_sd(&self) -> Result<(Shape, DType)> {
        let rt = self.rt();
        rt.and_then(shape_dt).ok_or_else(|| {
            InterpError::new(
                ErrorKind::Unsupported,
                format!(
                    "unsupported result type {}",
                    rt.map(|t| t.to_string()).unwrap_or_default()
                ),
            )
        })
    }

    /// Shape and dtype of operand `k` (a scalar or vector).
    pub fn opnd_sd(&self, k: usize) -> Result<(Shape, DType)> {
        let t = self.op.operand_types.get(k);
        t.and_then(shape_dt).ok_or_else(|| {
            InterpError::new(
                ErrorKind::Unsupported,
                format!(
                    "unsupported operand type {}",
                    t.map(|t| t.to_string()).unwrap_or_default()
                ),
            )
        })
    }

    /// At least `n` operands.
    pub fn arity(&self, n: usize) -> Result<()> {
        if self.o.len() < n {
            bail!(Malformed, "`{}` needs {n} operands, has {}", self.name(), self.o.len());
        }
        Ok(())
    }
}

/// The i32 values of the scalar slots `xs`.
pub(crate) fn ints(xs: &[Slot], fr: &[Val]) -> Result<Vec<i64>> {
    xs.iter().map(|s| fr[*s as usize].int()).collect()
}

/// The `strides` of a strided load or store: one positive stride per index.
pub(crate) fn positive_strides(op: &Operation, rank: usize, name: &str) -> Result<Vec<usize>> {
    let Some(st) = op.attr("strides").and_then(Attr::as_i64_list) else {
        bail!(Malformed, "{name} without strides")
    };
    if st.len() != rank || st.iter().any(|&s| s < 1) {
        bail!(
            Malformed,
            "{name} strides {st:?} for {rank} indices (one positive stride per index)"
        );
    }
    Ok(st.into_iter().map(|s| s as usize).collect())
}

/// `operandSegmentSizes`, or `default` with the last variable segment absorbing the rest.
pub(crate) fn segments(op: &Operation, default: &[i64]) -> Result<Vec<i64>> {
    if let Some(s) = op.attr("operandSegmentSizes").and_then(Attr::as_i64_list) {
        let total = s.iter().try_fold(0usize, |t, &n| t.checked_add(usize::try_from(n).ok()?));
        if total != Some(op.operands.len()) {
            bail!(
                Malformed,
                "operandSegmentSizes {s:?} does not add up to {} operands",
                op.operands.len()
            );
        }
        return Ok(s);
    }
    let mut d = default.to_vec();
    let fixed: i64 = d.iter().sum();
    if let Some(k) = d.iter().position(|&x| x == 0) {
        d[k] = op.operands.len() as i64 - fixed;
    }
    Ok(d)
}

pub(crate) fn split<'s>(o: &'s [Slot], seg: &[i64], name: &str) -> Result<Vec<&'s [Slot]>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for &n in seg {
        let n = n.max(0) as usize;
        if at + n > o.len() {
            bail!(Malformed, "`{name}`: operand segments {seg:?} exceed its {} operands", o.len());
        }
        out.push(&o[at..at + n]);
        at += n;
    }
    if out.first().is_some_and(|s| s.is_empty()) || out.len() < 2 {
        bail!(Malformed, "`{name}`: bad operand segments {seg:?}");
    }
    Ok(out)
}
