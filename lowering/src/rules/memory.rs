//! Loads, stores, ref slices and scoped buffers (pallas-mosaic.md §4.1–§4.2, §5.3).

use super::LowerCx;
use crate::error::{RuleResult, bail};
use crate::{tpu, types};
use melior::ir::{Value, attribute::DenseI32ArrayAttribute};
use palladium_dsl::ir::{
    Buf, DType, Index, MemoryOp, MemorySpace, Op, Type as KType, Value as KValue, is_strided,
};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: MemoryOp<'_>) -> RuleResult<()> {
    match data {
        MemoryOp::AssumeMultiple { x, multiple } => assume_multiple(cx, op, *x, *multiple),
        MemoryOp::Load { src, index } => load(cx, op, *src, index),
        MemoryOp::Store { dst, index, value, mask } => store(cx, *dst, index, *value, *mask),
        MemoryOp::RefSlice { base, index } => ref_slice(cx, op, *base, index),
        MemoryOp::Alloc { buf } => alloc(cx, op, *buf),
    }
}

/// Sizes of an indexed window with point-indexed dims kept as 1 (what Mosaic loads), and
/// without them (what the kernel sees).
fn window(index: &[Index]) -> (Vec<u64>, Vec<u64>) {
    let full = index.iter().map(|i| i.size()).collect();
    let kept =
        index.iter().filter(|i| matches!(i, Index::Slice { .. })).map(|i| i.size()).collect();
    (full, kept)
}

/// The element dtype in memory (bools are i32 there).
fn memory_dtype(d: DType) -> DType {
    if d == DType::Bool { DType::I32 } else { d }
}

/// The per-dim strides of a strided access (`None`: a contiguous one).
fn strides(index: &[Index]) -> RuleResult<Option<Vec<i32>>> {
    if !is_strided(index) {
        return Ok(None);
    }
    let strides = index
        .iter()
        .map(|i| {
            i32::try_from(i.stride()).map_err(|_| format!("stride {} does not fit i32", i.stride()))
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(strides))
}

impl<'c, 'a> LowerCx<'c, 'a> {
    fn indices(&mut self, index: &[Index]) -> RuleResult<Vec<Value<'c, 'a>>> {
        index.iter().map(|i| self.offset_index(i.offset())).collect()
    }
}

/// VMEM: `vector.load`, or `tpu.strided_load` through a strided `ds` (+ `vector.shape_cast`
/// dropping point dims); SMEM: `memref.load`.
/// Bools are loaded as i32 and compared `!= 0`.
fn load(cx: &mut LowerCx<'_, '_>, op: Op, src: KValue, index: &[Index]) -> RuleResult<()> {
    let KType::Ref(r) = cx.ty(src) else { bail!("load from a non-ref {}", cx.ty(src)) };
    let base = cx.v(src)?;
    let idx = cx.indices(index)?;
    let mut operands = vec![base];
    operands.extend(idx);
    let md = memory_dtype(r.dtype);
    let (full, kept) = window(index);
    let mut v = match r.space {
        MemorySpace::Vmem => {
            let ty = types::array(cx.ctx, &full, md);
            let v = match strides(index)? {
                Some(strides) => {
                    cx.emit1(tpu::strided_load(cx.ctx, cx.loc, base, &operands[1..], &strides, ty))?
                }
                None => cx.generic1("vector.load", &operands, ty, &[])?,
            };
            cx.shape_cast(v, &full, &kept, md)?
        }
        MemorySpace::Smem => {
            cx.generic1("memref.load", &operands, types::element(cx.ctx, md), &[])?
        }
        s => bail!("{s} refs can only be accessed by DMA"),
    };
    if r.dtype == DType::Bool {
        v = cx.nonzero(v, &kept, DType::I32)?;
    }
    cx.set_result(op, 0, v)
}

/// VMEM: `tpu.vector_store {strides = array<i32>}` (optionally masked), or
/// `tpu.strided_store` through a strided `ds`; SMEM: `memref.store`.
fn store(
    cx: &mut LowerCx<'_, '_>,
    dst: KValue,
    index: &[Index],
    value: KValue,
    mask: Option<KValue>,
) -> RuleResult<()> {
    let KType::Ref(r) = cx.ty(dst) else { bail!("store to a non-ref {}", cx.ty(dst)) };
    let base = cx.v(dst)?;
    let mut v = cx.v(value)?;
    let (full, kept) = window(index);
    let md = memory_dtype(r.dtype);
    if r.dtype == DType::Bool {
        v = cx.generic1("arith.extui", &[v], types::array(cx.ctx, &kept, DType::I32), &[])?;
    }
    let idx = cx.indices(index)?;
    match r.space {
        MemorySpace::Vmem => {
            let v = cx.shape_cast(v, &kept, &full, md)?;
            let m = match mask {
                Some(m) => {
                    let mv = cx.v(m)?;
                    Some(cx.shape_cast(mv, &kept, &full, DType::Bool)?)
                }
                None => None,
            };
            let op = match (strides(index)?, m) {
                (Some(strides), None) => {
                    tpu::strided_store(cx.ctx, cx.loc, v, base, &idx, &strides)?
                }
                (Some(_), Some(_)) => bail!("a strided store cannot be masked"),
                (None, m) => tpu::vector_store(cx.ctx, cx.loc, v, base, &idx, m)?,
            };
            cx.emit(op);
        }
        MemorySpace::Smem => {
            if mask.is_some() {
                bail!("masked stores are only supported into VMEM");
            }
            let mut operands = vec![v, base];
            operands.extend(idx);
            let op = crate::build::op(cx.ctx, "memref.store", cx.loc, &operands, &[], &[], vec![])?;
            cx.emit(op);
        }
        s => bail!("{s} refs can only be accessed by DMA"),
    }
    Ok(())
}

/// `tpu.memref_slice` with i32 offsets (point dims kept as 1), then `tpu.memref_squeeze`
/// if any dim is point-indexed. Works for data refs and semaphore arrays alike.
fn ref_slice(cx: &mut LowerCx<'_, '_>, op: Op, base: KValue, index: &[Index]) -> RuleResult<()> {
    let b = cx.v(base)?;
    let (full, kept) = window(index);
    let full_shape = palladium_dsl::ir::Shape(full);
    let (sliced_ty, result_ty) = match cx.ty(base) {
        KType::Ref(r) => (
            types::memref(cx.ctx, r.space, r.dtype, full_shape.dims())?,
            types::memref(cx.ctx, r.space, r.dtype, &kept)?,
        ),
        KType::Sem(kind, _) => (
            types::sem_memref(cx.ctx, *kind, &full_shape)?,
            types::sem_memref(cx.ctx, *kind, &palladium_dsl::ir::Shape(kept.clone()))?,
        ),
        t => bail!("cannot slice a {t}"),
    };
    let offsets =
        index.iter().map(|i| cx.offset_i32(i.offset())).collect::<RuleResult<Vec<_>>>()?;
    let mut v = cx.emit1(tpu::memref_slice(cx.ctx, cx.loc, b, &offsets, sliced_ty))?;
    if kept.len() != full_shape.rank() {
        v = cx.emit1(tpu::memref_squeeze(cx.ctx, cx.loc, v, result_ty))?;
    }
    cx.set_result(op, 0, v)
}

/// `tpu.assume_multiple %x, n : i32`.
fn assume_multiple(cx: &mut LowerCx<'_, '_>, op: Op, x: KValue, multiple: u32) -> RuleResult<()> {
    let xv = cx.v(x)?;
    let v = cx.emit1(tpu::assume_multiple(cx.ctx, cx.loc, xv, multiple, types::i32(cx.ctx)))?;
    cx.set_result(op, 0, v)
}

/// `memref.alloca() : memref<…, #tpu.memory_space<vmem|smem>>` inside a `tpu.region`.
fn alloc(cx: &mut LowerCx<'_, '_>, op: Op, buf: Buf) -> RuleResult<()> {
    let ty = types::ref_type(cx.ctx, &cx.k.bufs[buf].ty)?;
    let segments = DenseI32ArrayAttribute::new(cx.ctx, &[0, 0]).into();
    let v = cx.generic1("memref.alloca", &[], ty, &[("operandSegmentSizes", segments)])?;
    cx.set_result(op, 0, v)
}
