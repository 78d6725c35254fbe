//! The tracing builder: what a `#[kernel]` function runs to produce IR.
//!
//! Kernel code manipulates handles ([`Val`], [`Ref`], [`SemRef`]) that stand for IR
//! values. Every operation on a handle appends an op to the block being traced. The tracer
//! lives in a thread-local slot for the duration of one kernel build, so that operator
//! overloading (`a + b`) needs no explicit context, the way JAX traces Python.
//!
//! Ops take their source location from `#[track_caller]`, so IR and errors point at the
//! user's kernel code. A typing error does not stop the trace: it is recorded with its
//! location and the result is *poisoned*, so that one mistake is reported once and every
//! independent mistake is reported too.

mod builder;
mod control;
pub mod params;
mod pipeline;
mod refs;
mod val;

pub use builder::{IndexMapOut, KernelBuilder, ParamError};
pub mod builder_handles {
    //! Handles handed out by a sealed [`super::KernelBuilder`].
    pub use super::builder::{Handle, Sealed, Slot};
}
pub use control::{
    Carry, Cond, LoopBound, LoopRange, Scope, StaticRange, TracedRange, UnrolledBounds, for_range,
    fori, if_else, range, run_scoped, switch, unrolled, while_loop,
};
pub use pipeline::{Drain, pipeline, pipeline_lagged};
pub use refs::{
    Dma, Ds, IndexElem, IntoIndex, IntoOffset, Ref, SemRef, async_copy, axis_index,
    barrier_semaphore, device_id, ds, remote_copy,
};
pub use val::{
    Axis, Compare, Dims, DotSpec, IntoVal, Val, concatenate, debug_print, dot, dot_general, dot_t,
    full, iota, num_programs, program_id, scalar, select, zeros,
};

use crate::ir::{Block, Kernel, OpData, SrcLoc, Type, Value};
use cranelift_entity::SecondaryMap;
use std::cell::RefCell;
use std::fmt;

/// One problem found while tracing a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    pub loc: Option<SrcLoc>,
    pub message: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.loc {
            Some(loc) => write!(f, "{loc}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Every problem found while tracing (and then verifying) one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildErrors(pub Vec<BuildError>);

impl fmt::Display for BuildErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BuildErrors {}

pub(crate) struct Tracer {
    pub(crate) kernel: Kernel,
    /// Insertion points: the innermost block being traced is last.
    pub(crate) blocks: Vec<Block>,
    pub(crate) errors: Vec<BuildError>,
    pub(crate) poisoned: SecondaryMap<Value, bool>,
    /// Ops whose typing error was reported while tracing (the verifier's would repeat it,
    /// also for ops without results, which poison nothing).
    pub(crate) ill_typed: SecondaryMap<crate::ir::Op, bool>,
    /// The declared value range of each scalar-prefetch ref that has one (the body's operand
    /// and every index map's parameter for it): a scalar read from it is clamped into the
    /// range in the kernel, so data outside it cannot address memory outside an array.
    pub(crate) value_ranges: SecondaryMap<Value, Option<crate::spec::ValueRange>>,
}

thread_local! {
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
}

/// Run `f` on the active tracer. Kernel code only runs inside `KernelBuilder`, so the slot
/// is filled; calling a DSL function outside a kernel is a bug in the calling program.
pub(crate) fn with<R>(f: impl FnOnce(&mut Tracer) -> R) -> R {
    TRACER.with(|slot| {
        let mut slot = slot.borrow_mut();
        let t = slot
            .as_mut()
            .expect("palladium DSL functions can only be called while a #[kernel] is being traced");
        f(t)
    })
}

/// Make `t` the active tracer; `false` if another kernel is being traced on this thread.
pub(crate) fn install(t: Tracer) -> bool {
    TRACER.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_some() {
            return false;
        }
        *slot = Some(t);
        true
    })
}

pub(crate) fn uninstall() -> Option<Tracer> {
    TRACER.with(|slot| slot.borrow_mut().take())
}

impl Tracer {
    pub(crate) fn current_block(&self) -> Block {
        *self.blocks.last().expect("a block is always being traced")
    }

    /// Record an error; the same message at the same location is reported once (both
    /// branches of a traced `if`, every iteration of an unrolled loop).
    pub(crate) fn error(&mut self, loc: SrcLoc, message: impl Into<String>) {
        let error = BuildError { loc: Some(loc), message: message.into() };
        if !self.errors.contains(&error) {
            self.errors.push(error);
        }
    }

    /// Append `data` to the current block with results typed by the typing rules. If an
    /// operand is poisoned, or the op is ill typed (reported here), the results are
    /// poisoned and typed `fallback`.
    pub(crate) fn emit(
        &mut self,
        data: OpData,
        loc: SrcLoc,
        fallback: &[Type],
    ) -> smallvec::SmallVec<[Value; 1]> {
        let poisoned_in = data.operands().iter().any(|&v| self.poisoned[v]);
        let (types, poison, ill_typed) = if poisoned_in {
            (fallback.to_vec(), true, false)
        } else {
            match crate::ir::infer::result_types(&self.kernel, &data) {
                Ok(t) => (t.into_vec(), false, false),
                Err(m) => {
                    self.error(loc, format!("{}: {m}", data.mnemonic()));
                    (fallback.to_vec(), true, true)
                }
            }
        };
        let block = self.current_block();
        let op = self.kernel.append_op(block, data, types, Some(loc));
        self.ill_typed[op] = ill_typed;
        let results = self.kernel.ops[op].results.clone();
        for &r in &results {
            self.poisoned[r] = poison;
        }
        results
    }

    /// Record an error found before any op could be built (a bad axis, a bad slice) and
    /// return a poisoned stand-in of type `ty`, so later uses report nothing more.
    pub(crate) fn fail(&mut self, loc: SrcLoc, message: impl Into<String>, ty: Type) -> Value {
        self.error(loc, message);
        let value = match ty.dtype() {
            Some(crate::ir::DType::Bool) => crate::ir::Literal::Bool(false),
            _ => crate::ir::Literal::Int(0),
        };
        let block = self.current_block();
        let op = self.kernel.append_op(
            block,
            OpData::Constant { value, ty: ty.clone() },
            vec![ty],
            Some(loc),
        );
        let r = self.kernel.ops[op].results[0];
        self.poisoned[r] = true;
        r
    }

    /// Like [`Tracer::emit`] for single-result ops.
    pub(crate) fn emit1(&mut self, data: OpData, loc: SrcLoc, fallback: Type) -> Value {
        self.emit(data, loc, &[fallback])[0]
    }

    /// Drop `ref_slice` ops whose results nothing uses (until none is left: a chain of
    /// `.at(..)` goes whole): the slices a DMA descriptor was built from, which `start` and
    /// `wait` slice again where Pallas does (`refs.rs`, `sliced_here`).
    pub(crate) fn drop_unused_slices(&mut self) {
        use crate::ir::OpData;
        loop {
            let mut used: SecondaryMap<crate::ir::Value, bool> = SecondaryMap::new();
            for block in self.kernel.blocks.values() {
                for &op in &block.ops {
                    for &v in self.kernel.ops[op].data.operands().iter() {
                        used[v] = true;
                    }
                }
            }
            let ops = &self.kernel.ops;
            let mut dropped = false;
            for block in self.kernel.blocks.values_mut() {
                block.ops.retain(|&op| {
                    let dead = matches!(ops[op].data, OpData::RefSlice { .. })
                        && ops[op].results.iter().all(|&r| !used[r]);
                    dropped |= dead;
                    !dead
                });
            }
            if !dropped {
                return;
            }
        }
    }

    /// Trace `f` into a fresh block with parameters of `param_types`.
    pub(crate) fn new_block(&mut self, param_types: &[Type]) -> (Block, Vec<Value>) {
        let b = self.kernel.new_block();
        let params =
            param_types.iter().map(|t| self.kernel.add_block_param(b, t.clone())).collect();
        (b, params)
    }
}

/// Run `f` with `block` as the insertion point. The tracer is released while `f` runs (user
/// code calls back into it).
pub(crate) fn in_block<R>(block: Block, f: impl FnOnce() -> R) -> R {
    with(|t| t.blocks.push(block));
    let r = f();
    with(|t| t.blocks.pop());
    r
}
