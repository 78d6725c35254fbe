//! The Mosaic `tpu` dialect, as typed Rust functions.
//!
//! This is the **only** file that spells `tpu.` op names and `#tpu.` / `!tpu.` attributes
//! and types. The dialect is not upstream MLIR, so its ops are built as *unregistered* ops
//! (`OperationBuilder::new("tpu.x", …)`) and its attributes and types are opaque. MLIR
//! therefore checks nothing about them: each function here must attach exactly the inherent
//! attributes the registered op (jaxlib 0.10.2, serde version 15) has in generic form,
//! including defaulted ones (`add = false`, `transpose_lhs = false`, `priority = 0 : i32`,
//! `strict_ordering = false`) and `operandSegmentSizes` for `AttrSizedOperandSegments` ops.
//! They were read off JAX's serialization (`scripts/jax_reference.py serialize`) of its own modules.

use crate::build::{bool_attr, int_attr, op, parse_attr, parse_type};
use crate::error::RuleResult;
use melior::{
    Context,
    ir::{
        Attribute, Location, Operation, Region, Type, Value,
        attribute::{
            ArrayAttribute, DenseI32ArrayAttribute, DenseI64ArrayAttribute, StringAttribute,
        },
    },
};
use palladium_dsl::ir::{ArgReduceOp, DotDims, MemorySpace, Precision, SemKind};
use palladium_dsl::spec::{BlockDim, PipelineMode, Semantics};

/// The discardable attribute that marks the `TensorCore` kernel function.
pub(crate) const CORE_TYPE_ATTR: &str = "tpu.core_type";

// --- attributes and types -------------------------------------------------------------------

/// `#tpu.memory_space<vmem|smem|hbm|any|semaphore_mem>`.
pub(crate) fn memory_space(ctx: &Context, space: MemorySpace) -> RuleResult<Attribute<'_>> {
    parse_attr(ctx, &format!("#tpu.memory_space<{}>", space.name()))
}

/// `!tpu.dma_semaphore` or `!tpu.semaphore`.
pub(crate) fn semaphore_type(ctx: &Context, kind: SemKind) -> RuleResult<Type<'_>> {
    parse_type(
        ctx,
        match kind {
            SemKind::Dma => "!tpu.dma_semaphore",
            SemKind::Regular => "!tpu.semaphore",
        },
    )
}

/// `[#tpu.dimension_semantics<parallel>, …]` (one per grid dim; `[]` without a grid).
pub(crate) fn dimension_semantics<'c>(
    ctx: &'c Context,
    dims: &[Semantics],
) -> RuleResult<Attribute<'c>> {
    let attrs = dims
        .iter()
        .map(|s| parse_attr(ctx, &format!("#tpu.dimension_semantics<{}>", s.name())))
        .collect::<RuleResult<Vec<_>>>()?;
    Ok(ArrayAttribute::new(ctx, &attrs).into())
}

/// `#tpu.element_window<[before..], [after..]>`, the `window_kind` Pallas gives an operand whose
/// block dims are `pl.Element` (one padding per dim; squeezed dims pad by 0).
pub(crate) fn element_window<'c>(
    ctx: &'c Context,
    block: &[BlockDim],
) -> RuleResult<Attribute<'c>> {
    let list = |side: fn((u64, u64)) -> u64| {
        block.iter().map(|b| side(b.padding()).to_string()).collect::<Vec<_>>().join(", ")
    };
    parse_attr(ctx, &format!("#tpu.element_window<[{}], [{}]>", list(|p| p.0), list(|p| p.1)))
}

/// `#tpu.pipeline_mode<synchronous|double_buffered>` for `Buffered(1|2)`, as Pallas lowers
/// `BlockSpec(pipeline_mode=pl.Buffered(n))` (it refuses other counts: Mosaic has no mode).
pub(crate) fn pipeline_mode(ctx: &Context, mode: PipelineMode) -> RuleResult<Attribute<'_>> {
    let name = match mode.buffers() {
        1 => "synchronous",
        2 => "double_buffered",
        n => {
            return Err(format!(
                "pipeline_mode = {mode}: Mosaic has a pipeline mode for 1 or 2 buffers, not {n}"
            )
            .into());
        }
    };
    parse_attr(ctx, &format!("#tpu.pipeline_mode<{name}>"))
}

/// `#tpu.core_type<tc>`.
pub(crate) fn core_type_tc(ctx: &Context) -> RuleResult<Attribute<'_>> {
    parse_attr(ctx, "#tpu.core_type<tc>")
}

/// `#tpu.dot_dimension_numbers<[lhs_contract], [rhs_contract], [lhs_noncontract],
/// [rhs_noncontract], [output (operand, dim) pairs], [lhs_batch], [rhs_batch]>`, computed as
/// Pallas's `jax_dot_dims_to_tpu_dot_dot_dims` does (output = batch, lhs free, rhs free).
pub(crate) fn dot_dimension_numbers<'c>(
    ctx: &'c Context,
    dims: &DotDims,
    lhs_rank: usize,
    rhs_rank: usize,
) -> RuleResult<Attribute<'c>> {
    let free = |rank: usize, contract: &[u32], batch: &[u32]| -> Vec<u32> {
        (0..rank as u32).filter(|d| !contract.contains(d) && !batch.contains(d)).collect()
    };
    let lhs_free = free(lhs_rank, &dims.lhs_contract, &dims.lhs_batch);
    let rhs_free = free(rhs_rank, &dims.rhs_contract, &dims.rhs_batch);
    let mut order = Vec::new();
    for &d in dims.lhs_batch.iter().chain(&lhs_free) {
        order.extend([0, d]);
    }
    for &d in &rhs_free {
        order.extend([1, d]);
    }
    let list = |v: &[u32]| v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    parse_attr(
        ctx,
        &format!(
            "#tpu.dot_dimension_numbers<[{}], [{}], [{}], [{}], [{}], [{}], [{}]>",
            list(&dims.lhs_contract),
            list(&dims.rhs_contract),
            list(&lhs_free),
            list(&rhs_free),
            list(&order),
            list(&dims.lhs_batch),
            list(&dims.rhs_batch)
        ),
    )
}

// --- vector ops -----------------------------------------------------------------------------

/// `tpu.vector_store %base[%indices], %value [masked %mask] {strides = array<i32>}`.
pub(crate) fn vector_store<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    value: Value<'c, '_>,
    base: Value<'c, '_>,
    indices: &[Value<'c, '_>],
    mask: Option<Value<'c, '_>>,
) -> RuleResult<Operation<'c>> {
    let mut operands = vec![value, base];
    operands.extend_from_slice(indices);
    operands.extend(mask);
    let segments = [1, 1, indices.len() as i32, i32::from(mask.is_some())];
    op(
        ctx,
        "tpu.vector_store",
        loc,
        &operands,
        &[],
        &[
            ("add", bool_attr(ctx, false)),
            ("operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &segments).into()),
            ("strides", DenseI32ArrayAttribute::new(ctx, &[]).into()),
        ],
        vec![],
    )
}

/// `tpu.strided_load %base[%indices] {strides = array<i32: ..>}` (Pallas's load through a
/// strided `pl.ds`): every `strides[d]`-th element from the indices.
pub(crate) fn strided_load<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    base: Value<'c, '_>,
    indices: &[Value<'c, '_>],
    strides: &[i32],
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    let mut operands = vec![base];
    operands.extend_from_slice(indices);
    op(
        ctx,
        "tpu.strided_load",
        loc,
        &operands,
        &[result],
        &[("strides", DenseI32ArrayAttribute::new(ctx, strides).into())],
        vec![],
    )
}

/// `tpu.strided_store %base[%indices], %value {strides = array<i32: ..>}` (no mask).
pub(crate) fn strided_store<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    value: Value<'c, '_>,
    base: Value<'c, '_>,
    indices: &[Value<'c, '_>],
    strides: &[i32],
) -> RuleResult<Operation<'c>> {
    let mut operands = vec![value, base];
    operands.extend_from_slice(indices);
    op(
        ctx,
        "tpu.strided_store",
        loc,
        &operands,
        &[],
        &[("strides", DenseI32ArrayAttribute::new(ctx, strides).into())],
        vec![],
    )
}

/// `tpu.matmul %lhs, %rhs, %acc {dimension_numbers, [precision], transpose_lhs_hint = false}`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    lhs: Value<'c, '_>,
    rhs: Value<'c, '_>,
    acc: Value<'c, '_>,
    result: Type<'c>,
    dimension_numbers: Attribute<'c>,
    precision: Precision,
) -> RuleResult<Operation<'c>> {
    let mut attrs = vec![("dimension_numbers", dimension_numbers)];
    match precision {
        Precision::Default => {}
        Precision::Bf16x3 => {
            attrs.push(("precision", parse_attr(ctx, "#tpu.contract_precision<bf16x3>")?))
        }
        Precision::Fp32 => {
            attrs.push(("precision", parse_attr(ctx, "#tpu.contract_precision<fp32>")?))
        }
    }
    attrs.push(("transpose_lhs", bool_attr(ctx, false)));
    attrs.push(("transpose_lhs_hint", bool_attr(ctx, false)));
    attrs.push(("transpose_rhs", bool_attr(ctx, false)));
    op(ctx, "tpu.matmul", loc, &[lhs, rhs, acc], &[result], &attrs, vec![])
}

/// `tpu.iota {dimensions = array<i32: dim>} : vector<…xi32>`.
pub(crate) fn iota<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    result: Type<'c>,
    dim: u32,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.iota",
        loc,
        &[],
        &[result],
        &[("dimensions", DenseI32ArrayAttribute::new(ctx, &[dim as i32]).into())],
        vec![],
    )
}

/// `tpu.transpose %x, [perm]`.
pub(crate) fn transpose<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    perm: &[u32],
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    let perm: Vec<i64> = perm.iter().map(|&p| i64::from(p)).collect();
    op(
        ctx,
        "tpu.transpose",
        loc,
        &[x],
        &[result],
        &[("permutation", DenseI64ArrayAttribute::new(ctx, &perm).into())],
        vec![],
    )
}

/// `tpu.concatenate %xs in dim` (`jnp.concatenate`).
pub(crate) fn concatenate<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    xs: &[Value<'c, '_>],
    dimension: u32,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.concatenate",
        loc,
        xs,
        &[result],
        &[("dimension", int_attr(ctx, 32, i64::from(dimension)))],
        vec![],
    )
}

/// `tpu.dynamic_rotate %x by %shift dim d` (`pltpu.roll`; `dimension : si32`, no stride).
pub(crate) fn dynamic_rotate<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    shift: Value<'c, '_>,
    dimension: u32,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.dynamic_rotate",
        loc,
        &[x, shift],
        &[result],
        &[("dimension", parse_attr(ctx, &format!("{dimension} : si32"))?)],
        vec![],
    )
}

/// `tpu.reciprocal %x {approx, full_range = true}` (`pl.reciprocal`).
pub(crate) fn reciprocal<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    approx: bool,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.reciprocal",
        loc,
        &[x],
        &[result],
        &[("approx", bool_attr(ctx, approx)), ("full_range", bool_attr(ctx, true))],
        vec![],
    )
}

/// `tpu.reduce_index %x {axis, kind = #tpu.reduction_kind<arg_max|arg_min>}` (`jnp.argmax`).
pub(crate) fn reduce_index<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    axis: u32,
    kind: ArgReduceOp,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    let kind = match kind {
        ArgReduceOp::ArgMax => "arg_max",
        ArgReduceOp::ArgMin => "arg_min",
    };
    op(
        ctx,
        "tpu.reduce_index",
        loc,
        &[x],
        &[result],
        &[
            ("axis", int_attr(ctx, 32, i64::from(axis))),
            ("kind", parse_attr(ctx, &format!("#tpu.reduction_kind<{kind}>"))?),
        ],
        vec![],
    )
}

/// `tpu.assume_multiple %x, multiple : i32`.
pub(crate) fn assume_multiple<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    multiple: u32,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.assume_multiple",
        loc,
        &[x],
        &[result],
        &[("multiple", int_attr(ctx, 32, i64::from(multiple)))],
        vec![],
    )
}

// --- refs -----------------------------------------------------------------------------------

/// `tpu.memref_slice %base[%i32 offsets] : memref<A> -> memref<B>` (static sizes only).
pub(crate) fn memref_slice<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    base: Value<'c, '_>,
    offsets: &[Value<'c, '_>],
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    let mut operands = vec![base];
    operands.extend_from_slice(offsets);
    let segments = [1, offsets.len() as i32, 0];
    op(
        ctx,
        "tpu.memref_slice",
        loc,
        &operands,
        &[result],
        &[("operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &segments).into())],
        vec![],
    )
}

/// `tpu.memref_squeeze %x : memref<1x…> -> memref<…>`.
pub(crate) fn memref_squeeze<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    x: Value<'c, '_>,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.memref_squeeze", loc, &[x], &[result], &[], vec![])
}

// --- DMAs and semaphores ----------------------------------------------------------------------

/// `tpu.enqueue_dma source(%src) target(%dst) [source_semaphore(%s)] target_semaphore(%t)
/// [device_id(%d)] {priority, strict_ordering = false}`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn enqueue_dma<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    source: Value<'c, '_>,
    target: Value<'c, '_>,
    target_semaphore: Value<'c, '_>,
    source_semaphore: Option<Value<'c, '_>>,
    device_id: Option<Value<'c, '_>>,
    priority: u8,
) -> RuleResult<Operation<'c>> {
    // Segments: source, source_semaphore, target, target_semaphore, device_id, core_id, subcore_id.
    let mut operands = vec![source];
    operands.extend(source_semaphore);
    operands.push(target);
    operands.push(target_semaphore);
    operands.extend(device_id);
    let segments =
        [1, i32::from(source_semaphore.is_some()), 1, 1, i32::from(device_id.is_some()), 0, 0];
    op(
        ctx,
        "tpu.enqueue_dma",
        loc,
        &operands,
        &[],
        &[
            ("operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &segments).into()),
            ("priority", int_attr(ctx, 32, i64::from(priority))),
            ("strict_ordering", bool_attr(ctx, false)),
        ],
        vec![],
    )
}

/// `tpu.wait_dma2 semaphore(%sem) src(%src) dst(%dst) [device_id(%d) [core_id(%c)]]`.
pub(crate) fn wait_dma2<'c, 'a>(
    ctx: &'c Context,
    loc: Location<'c>,
    semaphore: Value<'c, 'a>,
    src: Value<'c, 'a>,
    dst: Value<'c, 'a>,
    remote: Option<(Value<'c, 'a>, Option<Value<'c, 'a>>)>,
) -> RuleResult<Operation<'c>> {
    // Segments: semaphore, src, dst, device_id, core_id.
    let mut operands = vec![semaphore, src, dst];
    let (device_id, core_id) = remote.map_or((None, None), |(d, c)| (Some(d), c));
    operands.extend(device_id);
    operands.extend(core_id);
    let segments = [1, 1, 1, i32::from(device_id.is_some()), i32::from(core_id.is_some())];
    op(
        ctx,
        "tpu.wait_dma2",
        loc,
        &operands,
        &[],
        &[
            ("operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &segments).into()),
            ("strict_ordering", bool_attr(ctx, false)),
        ],
        vec![],
    )
}

/// `tpu.sem_signal %sem, %amount [device_id %d]`.
pub(crate) fn sem_signal<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    sem: Value<'c, '_>,
    amount: Value<'c, '_>,
    device_id: Option<Value<'c, '_>>,
) -> RuleResult<Operation<'c>> {
    // Segments: semaphore, amount, device_id, core_id, subcore_id.
    let mut operands = vec![sem, amount];
    operands.extend(device_id);
    let segments = [1, 1, i32::from(device_id.is_some()), 0, 0];
    op(
        ctx,
        "tpu.sem_signal",
        loc,
        &operands,
        &[],
        &[("operandSegmentSizes", DenseI32ArrayAttribute::new(ctx, &segments).into())],
        vec![],
    )
}

/// `tpu.sem_wait %sem, %amount`.
pub(crate) fn sem_wait<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    sem: Value<'c, '_>,
    amount: Value<'c, '_>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.sem_wait", loc, &[sem, amount], &[], &[], vec![])
}

/// `tpu.device_id : i32` (this device's logical id in the mesh).
pub(crate) fn device_id<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    i32_type: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.device_id", loc, &[], &[i32_type], &[], vec![])
}

/// `tpu.sem_barrier : memref<!tpu.semaphore, …>` (the collective's barrier semaphore).
pub(crate) fn sem_barrier<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.sem_barrier", loc, &[], &[result], &[], vec![])
}

/// `tpu.sem_read %sem -> i32`.
pub(crate) fn sem_read<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    sem: Value<'c, '_>,
    i32_type: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.sem_read", loc, &[sem], &[i32_type], &[], vec![])
}

/// `tpu.sem_alloc : memref<…!tpu.(dma_)semaphore, #tpu.memory_space<semaphore_mem>>`.
pub(crate) fn sem_alloc<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    result: Type<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.sem_alloc", loc, &[], &[result], &[], vec![])
}

// --- debugging ------------------------------------------------------------------------------

/// `tpu.log %args {formatted, tag}` (`pl.debug_print`; `$k` placeholders when formatted).
pub(crate) fn log<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    args: &[Value<'c, '_>],
    tag: &str,
    formatted: bool,
) -> RuleResult<Operation<'c>> {
    op(
        ctx,
        "tpu.log",
        loc,
        args,
        &[],
        &[("formatted", bool_attr(ctx, formatted)), ("tag", StringAttribute::new(ctx, tag).into())],
        vec![],
    )
}

// --- scopes ---------------------------------------------------------------------------------

/// `"tpu.region"() ({ … tpu.yield }) : () -> (results)`.
pub(crate) fn region<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    results: &[Type<'c>],
    body: Region<'c>,
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.region", loc, &[], results, &[], vec![body])
}

/// `tpu.yield %values` (terminates a `tpu.region`).
pub(crate) fn r#yield<'c>(
    ctx: &'c Context,
    loc: Location<'c>,
    values: &[Value<'c, '_>],
) -> RuleResult<Operation<'c>> {
    op(ctx, "tpu.yield", loc, values, &[], &[], vec![])
}
