//! Typing rules: the result types of an op from its operands and attributes.
//!
//! One function serves both sides: the tracing builder calls it to type a new op (and turns
//! an `Err` into a build error at the user's source line), and the verifier calls it to
//! check that a kernel built by any other means (the fusion pass, tests) is well typed.
//!
//! [`result_types`] dispatches on the op's family; each family's rules are one exhaustive
//! `match` in its own file, as the lowering's are:
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
//! The helpers below (operand kinds, ref indexing, semaphores, meshes) are shared by them.

mod constant;
mod control;
mod debug;
mod dma;
mod elementwise;
mod matmul;
mod memory;
mod shape;

use super::{DType, Index, Kernel, Offset, OpData, OpFamily, SemKind, Shape, Type, Value};
use smallvec::SmallVec;

pub type Types = SmallVec<[Type; 1]>;

fn array_of(k: &Kernel, v: Value, what: &str) -> Result<(Shape, DType), String> {
    match k.ty(v) {
        Type::Scalar(d) => Ok((Shape::default(), *d)),
        Type::Vector(s, d) => Ok((s.clone(), *d)),
        t => Err(format!("{what} must be a scalar or vector, got {t}")),
    }
}

fn scalar_i32(k: &Kernel, v: Value, what: &str) -> Result<(), String> {
    match k.ty(v) {
        Type::Scalar(DType::I32) => Ok(()),
        t => Err(format!("{what} must be an i32 scalar, got {t}")),
    }
}

/// The shape that indexing a ref of `shape` with `index` selects: slices keep their size,
/// points drop their dim. Checks static bounds.
pub fn indexed_shape(k: &Kernel, shape: &Shape, index: &[Index]) -> Result<Shape, String> {
    if index.len() != shape.rank() {
        return Err(format!(
            "{} indices for a ref of rank {} ({shape})",
            index.len(),
            shape.rank()
        ));
    }
    let mut out = Vec::new();
    for (d, (i, &extent)) in index.iter().zip(shape.dims()).enumerate() {
        if let Offset::Dynamic(v) = i.offset() {
            scalar_i32(k, v, &format!("index of dim {d}"))?;
        }
        if i.stride() != 1 && d + 1 == shape.rank() {
            return Err(format!(
                "a stride along the last (lane) dim of {shape}: Mosaic strides loads and stores along the leading dims only"
            ));
        }
        let (size, span) = (i.size(), i.span());
        if size == 0 || span > extent {
            return Err(format!(
                "slice of size {size}{} along dim {d} of {shape}",
                if i.stride() == 1 { String::new() } else { format!(" and stride {}", i.stride()) }
            ));
        }
        if let Offset::Static(o) = i.offset()
            && (o < 0 || o as u64 + span > extent)
        {
            return Err(format!("index {i} is out of bounds along dim {d} (extent {extent})"));
        }
        if let Index::Slice { size, .. } = i {
            out.push(*size);
        }
    }
    Ok(Shape(out))
}

/// numpy broadcasting of `from` to `to` (trailing-aligned, size-1 dims stretch).
pub fn broadcastable(from: &Shape, to: &Shape) -> bool {
    from.rank() <= to.rank()
        && from.dims().iter().rev().zip(to.dims().iter().rev()).all(|(&a, &b)| a == b || a == 1)
}

/// Result types of `data` in `kernel`, or why the op is ill typed.
pub fn result_types(k: &Kernel, data: &OpData) -> Result<Types, String> {
    match data.family() {
        OpFamily::Constant(o) => constant::result_types(k, o),
        OpFamily::Elementwise(o) => elementwise::result_types(k, o),
        OpFamily::Shape(o) => shape::result_types(k, o),
        OpFamily::Matmul(o) => matmul::result_types(k, o),
        OpFamily::Memory(o) => memory::result_types(k, o),
        OpFamily::Dma(o) => dma::result_types(k, o),
        OpFamily::Debug(o) => debug::result_types(k, o),
        OpFamily::Control(o) => control::result_types(k, o),
    }
}

fn list(ts: &[Type]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// The types a region yields (its last op must be a `yield`).
pub fn yield_types(k: &Kernel, block: super::Block) -> Result<Types, String> {
    match k.blocks[block].ops.last().map(|&op| &k.ops[op].data) {
        Some(OpData::Yield { values }) => Ok(values.iter().map(|&v| k.ty(v).clone()).collect()),
        _ => Err(format!("region {block} does not end with a yield")),
    }
}

/// Device ids name devices of the call's mesh: without one there is nothing to name.
fn needs_mesh(k: &Kernel, what: &str) -> Result<(), String> {
    if k.call.mesh.is_none() {
        return Err(format!(
            "{what} needs the devices of a mesh: declare it, #[kernel(mesh = [x = 4], ..)] (Pallas: the kernel under jax.shard_map over a Mesh)"
        ));
    }
    Ok(())
}

fn sem_scalar(k: &Kernel, v: Value, kind: Option<SemKind>, what: &str) -> Result<(), String> {
    match k.ty(v) {
        Type::Sem(got, s) if s.rank() == 0 && kind.is_none_or(|want| want == *got) => Ok(()),
        Type::Sem(got, s) if s.rank() != 0 => {
            Err(format!("{what} must be a single semaphore, got an array {got}{s} (index it)"))
        }
        t => Err(format!(
            "{what} must be a {}, got {t}",
            kind.map_or("semaphore".to_string(), |k| k.to_string())
        )),
    }
}

fn dma_operands(k: &Kernel, src: Value, dst: Value, sem: Value) -> Result<(), String> {
    let (Type::Ref(s), Type::Ref(d)) = (k.ty(src), k.ty(dst)) else {
        return Err(format!("DMA copies between refs, got {} -> {}", k.ty(src), k.ty(dst)));
    };
    if s.dtype != d.dtype || s.shape != d.shape {
        return Err(format!(
            "DMA source {}{} and destination {}{} differ (they must have the same dtype and shape)",
            s.dtype, s.shape, d.dtype, d.shape
        ));
    }
    sem_scalar(k, sem, Some(SemKind::Dma), "DMA semaphore")
}
