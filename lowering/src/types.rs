//! Our types → MLIR types: signless scalars, `vector<…>` for rank ≥ 1, and
//! `memref<… , #tpu.memory_space<…>>` for refs (bools are `i1` in vectors, `i32` in memory).

use crate::error::{RuleResult, bail};
use crate::tpu;
use melior::{
    Context,
    ir::{
        Type,
        r#type::{IntegerType, MemRefType},
    },
};
use palladium_dsl::ir::{DType, MemorySpace, RefType, SemKind, Shape, Type as KType};

/// The MLIR element type of `dtype` in a value (`bool` → `i1`).
pub(crate) fn element<'c>(ctx: &'c Context, dtype: DType) -> Type<'c> {
    match dtype {
        DType::Bf16 => Type::bfloat16(ctx),
        DType::F16 => Type::float16(ctx),
        DType::F32 => Type::float32(ctx),
        DType::F8E4M3 => Type::float8_e4m3fn(ctx),
        DType::F8E5M2 => Type::float8_e5m2(ctx),
        DType::I32 => IntegerType::new(ctx, 32).into(),
        DType::I16 => IntegerType::new(ctx, 16).into(),
        DType::I8 => IntegerType::new(ctx, 8).into(),
        DType::I4 => IntegerType::new(ctx, 4).into(),
        DType::Bool => IntegerType::new(ctx, 1).into(),
    }
}

/// The MLIR element type of `dtype` in memory (`bool` → `i32`, as at Pallas's kernel boundary).
pub(crate) fn memory_element<'c>(ctx: &'c Context, dtype: DType) -> Type<'c> {
    if dtype == DType::Bool { IntegerType::new(ctx, 32).into() } else { element(ctx, dtype) }
}

pub(crate) fn i32<'c>(ctx: &'c Context) -> Type<'c> {
    IntegerType::new(ctx, 32).into()
}

/// A scalar (rank 0) or `vector<shape x dtype>`.
pub(crate) fn array<'c>(ctx: &'c Context, shape: &[u64], dtype: DType) -> Type<'c> {
    let e = element(ctx, dtype);
    if shape.is_empty() { e } else { Type::vector(shape, e) }
}

fn dims(shape: &[u64]) -> RuleResult<Vec<i64>> {
    shape
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| format!("dimension {d} is too large").into()))
        .collect()
}

/// `memref<shape x dtype, #tpu.memory_space<space>>`.
pub(crate) fn memref<'c>(
    ctx: &'c Context,
    space: MemorySpace,
    dtype: DType,
    shape: &[u64],
) -> RuleResult<Type<'c>> {
    if space == MemorySpace::Semaphore {
        bail!("data refs cannot live in semaphore memory");
    }
    Ok(MemRefType::new(
        memory_element(ctx, dtype),
        &dims(shape)?,
        None,
        Some(tpu::memory_space(ctx, space)?),
    )
    .into())
}

pub(crate) fn ref_type<'c>(ctx: &'c Context, r: &RefType) -> RuleResult<Type<'c>> {
    memref(ctx, r.space, r.dtype, r.shape.dims())
}

/// `memref<[shape x] !tpu.(dma_)semaphore, #tpu.memory_space<semaphore_mem>>`.
pub(crate) fn sem_memref<'c>(
    ctx: &'c Context,
    kind: SemKind,
    shape: &Shape,
) -> RuleResult<Type<'c>> {
    let elem = tpu::semaphore_type(ctx, kind)?;
    Ok(MemRefType::new(
        elem,
        &dims(shape.dims())?,
        None,
        Some(tpu::memory_space(ctx, MemorySpace::Semaphore)?),
    )
    .into())
}

/// The MLIR type of any kernel value.
pub(crate) fn of<'c>(ctx: &'c Context, ty: &KType) -> RuleResult<Type<'c>> {
    match ty {
        KType::Scalar(d) => Ok(element(ctx, *d)),
        KType::Vector(s, d) => Ok(array(ctx, s.dims(), *d)),
        KType::Ref(r) => ref_type(ctx, r),
        KType::Sem(kind, shape) => sem_memref(ctx, *kind, shape),
    }
}
