//! The module skeleton Pallas emits (pallas-mosaic.md §2): one kernel `func.func` named after
//! the kernel, with the grid indices, operand windows and scratch as arguments and the
//! Mosaic attributes (`dimension_semantics`, `iteration_bounds`, `scalar_prefetch`,
//! `scratch_operands`, `tpu.core_type`, `window_params`), followed by one `@transform_N`
//! function per windowed input/output, lowered from its index-map block.

use crate::build::{self, int_attr};
use crate::error::{LowerError, RuleError};
use crate::rules::{LowerCx, location, op_error};
use crate::{tpu, types};
use melior::{
    Context,
    ir::{
        Attribute, Block, BlockLike, Identifier, Location, Module, OperationRef, Region,
        RegionLike, Type,
        attribute::{
            ArrayAttribute, DenseI64ArrayAttribute, DictionaryAttribute, FlatSymbolRefAttribute,
            StringAttribute, TypeAttribute,
        },
        operation::OperationLike,
        r#type::FunctionType,
    },
};
use palladium_dsl::ir::{Block as KBlock, Kernel, Op};
use palladium_dsl::spec::{OperandRole, OperandSpec};

/// What `build` made: every MLIR op with the kernel op it came from.
pub(crate) type Emitted<'c, 'a> = Vec<(Op, OperationRef<'c, 'a>)>;

fn module_error(k: &Kernel, e: RuleError) -> LowerError {
    match e {
        RuleError::Nested(e) => e,
        RuleError::Msg(message) => LowerError::Module {
            kernel: k.name.clone(),
            loc: k.loc,
            message,
            diagnostics: Vec::new(),
        },
    }
}

/// The windowed inputs/outputs of a gridded kernel: `(N, operand)` where `N` numbers inputs
/// and outputs together (scalar prefetch excluded), as in `transform_N`.
pub(crate) fn block_mappings(k: &Kernel) -> impl Iterator<Item = (usize, &OperandSpec)> {
    k.call.operands.iter().filter(|o| o.role != OperandRole::Prefetch).enumerate()
}

/// Build the kernel function and its transform functions into `module`.
pub(crate) fn build<'c, 'a>(
    ctx: &'c Context,
    k: &'a Kernel,
    module: &'a Module<'c>,
) -> Result<Emitted<'c, 'a>, LowerError> {
    let loc = location(ctx, k.loc);
    let mut cx = LowerCx::new(ctx, k, module.body(), loc);
    kernel_func(&mut cx, module).map_err(|e| module_error(k, e))?;
    if !k.call.grid.is_empty() {
        for (n, o) in block_mappings(k) {
            if !o.is_windowed() {
                continue;
            }
            let Some(map) = o.index_map else {
                return Err(module_error(
                    k,
                    RuleError::Msg(format!("operand {} is windowed but has no index map", o.name)),
                ));
            };
            transform_func(&mut cx, module, n, o, map).map_err(|e| module_error(k, e))?;
        }
    }
    Ok(cx.emitted)
}

/// Arguments of a function whose entry is kernel block `kb`.
fn arg_types<'c>(cx: &LowerCx<'c, '_>, kb: KBlock) -> Result<Vec<Type<'c>>, RuleError> {
    cx.k.blocks[kb].params.iter().map(|&p| cx.mlir_ty(p)).collect()
}

/// Append a `func.func` with an entry block of `inputs` to the module; return that block.
fn func<'c, 'a>(
    cx: &LowerCx<'c, 'a>,
    module: &'a Module<'c>,
    name: &str,
    inputs: &[Type<'c>],
    results: &[Type<'c>],
    attrs: &[(&str, Attribute<'c>)],
    loc: Location<'c>,
) -> Result<melior::ir::BlockRef<'c, 'a>, RuleError> {
    let ctx = cx.ctx;
    let region = Region::new();
    let args: Vec<_> = inputs.iter().map(|&t| (t, loc)).collect();
    region.append_block(Block::new(&args));
    let mut all = vec![
        ("sym_name", StringAttribute::new(ctx, name).into()),
        (
            "function_type",
            TypeAttribute::new(FunctionType::new(ctx, inputs, results).into()).into(),
        ),
    ];
    all.extend_from_slice(attrs);
    let f = module.body().append_operation(build::op(
        ctx,
        "func.func",
        loc,
        &[],
        &[],
        &all,
        vec![region],
    )?);
    match f.region(0)?.first_block() {
        Some(b) => Ok(b),
        None => Err(RuleError::Msg("internal: func without a body".into())),
    }
}

fn kernel_func<'c, 'a>(cx: &mut LowerCx<'c, 'a>, module: &'a Module<'c>) -> Result<(), RuleError> {
    let (ctx, k) = (cx.ctx, cx.k);
    let call = &k.call;
    let gridded = !call.grid.is_empty();
    let semantics: Vec<_> = call.grid.iter().map(|g| g.semantics).collect();
    let mut attrs: Vec<(&str, Attribute<'c>)> =
        vec![("dimension_semantics", tpu::dimension_semantics(ctx, &semantics)?)];
    if gridded {
        let bounds = call
            .grid
            .iter()
            .map(|g| i64::try_from(g.extent))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("grid extent: {e}"))?;
        attrs.push(("iteration_bounds", DenseI64ArrayAttribute::new(ctx, &bounds).into()));
    }
    let prefetch = call.operands_of(OperandRole::Prefetch).count();
    attrs.push(("scalar_prefetch", int_attr(ctx, 64, prefetch as i64)));
    attrs.push(("scratch_operands", int_attr(ctx, 64, call.scratch.len() as i64)));
    attrs.push((tpu::CORE_TYPE_ATTR, tpu::core_type_tc(ctx)?));
    if gridded {
        let mut params = Vec::new();
        for (n, o) in block_mappings(k) {
            let entry: Vec<(Identifier<'c>, Attribute<'c>)> = if o.is_windowed() {
                let bounds = o.window_shape().dims().iter().map(|&d| d as i64).collect::<Vec<_>>();
                // Pallas's key order (the dictionary sorts them anyway).
                let mut entry = Vec::new();
                if let Some(mode) = o.pipeline_mode {
                    entry.push((
                        Identifier::new(ctx, "pipeline_mode"),
                        tpu::pipeline_mode(ctx, mode)?,
                    ));
                }
                entry.push((
                    Identifier::new(ctx, "transform_indices"),
                    FlatSymbolRefAttribute::new(ctx, &format!("transform_{n}")).into(),
                ));
                entry.push((
                    Identifier::new(ctx, "window_bounds"),
                    DenseI64ArrayAttribute::new(ctx, &bounds).into(),
                ));
                if let Some(block) = o.block.as_deref().filter(|_| o.has_element_window()) {
                    entry.push((
                        Identifier::new(ctx, "window_kind"),
                        tpu::element_window(ctx, block)?,
                    ));
                }
                entry
            } else {
                Vec::new() // HBM/ANY: not windowed, `{}`
            };
            params.push(DictionaryAttribute::new(ctx, &entry).into());
        }
        attrs.push(("window_params", ArrayAttribute::new(ctx, &params).into()));
    }
    let inputs = arg_types(cx, k.entry)?;
    let loc = cx.loc;
    let entry = func(cx, module, &k.name, &inputs, &[], &attrs, loc)?;
    cx.grid_args = (0..call.grid.len())
        .map(|i| entry.argument(i).map(Into::into))
        .collect::<Result<_, _>>()?;
    cx.lower_block(k.entry, entry)?;
    let ret = build::op(ctx, "func.return", loc, &[], &[], &[], vec![])?;
    entry.append_operation(ret);
    Ok(())
}

fn transform_func<'c, 'a>(
    cx: &mut LowerCx<'c, 'a>,
    module: &'a Module<'c>,
    n: usize,
    o: &OperandSpec,
    map: KBlock,
) -> Result<(), RuleError> {
    let (ctx, k) = (cx.ctx, cx.k);
    let inputs = arg_types(cx, map)?;
    let results = vec![types::i32(ctx); o.shape.rank()];
    let loc = cx.loc;
    let entry = func(cx, module, &format!("transform_{n}"), &inputs, &results, &[], loc)?;
    cx.grid_args = (0..k.call.grid.len())
        .map(|i| entry.argument(i).map(Into::into))
        .collect::<Result<_, _>>()?;
    cx.lower_block(map, entry)?;
    // The block's `yield` became `func.return`; make sure the map did end with one.
    if entry.terminator().is_none() {
        let last = k.blocks[map].ops.last().copied();
        let message = format!("the index map of {} does not end with a yield", o.name);
        return Err(match last {
            Some(op) => RuleError::Nested(op_error(k, op, message, Vec::new())),
            None => RuleError::Msg(message),
        });
    }
    Ok(())
}
