//! The `tpu_custom_call` body: the module in Mosaic's serialized (`stable_mosaic`) form.
//!
//! What `mosaic-serde{serialize=true}` does (pallas-mosaic.md §8.1), done by cloning: the
//! module gets `stable_mosaic.version = VERSION : i64`, and every op except `builtin.module`
//! is re-created as the unregistered op `stable_mosaic.<dialect>.<op>` with the same
//! operands, result types, regions and attributes. Registered upstream ops keep their
//! inherent attributes in properties; `mlirOperationGetAttribute` returns them merged with the
//! discardable ones, so they come out as plain attributes (`predicate`, `fastmath`,
//! `operandSegmentSizes`, `sym_name`, `function_type`, …), exactly as in JAX's bodies.
//! Types and attributes (`#tpu.*`, `!tpu.*`) are not renamed.
//!
//! ## Why version 15
//!
//! [`VERSION`] is 15, the current (`kVersion`) serde version of the toolchain this project
//! pins: jaxlib 0.10.2 serializes at 15 whenever it is not in forward-compatible export
//! mode, and libtpu 0.0.42.1 (the matching runtime, used by the oracle) reads up to 15.
//! At the current version serialization is a pure rename: the op forms this crate emits are
//! the current ones (`tpu.matmul` with the required `transpose_lhs_hint`, `enqueue_dma` /
//! `sem_signal` / `wait_dma2` with the `subcore_id`/`core_id` operand segments of the current
//! dialect), so no downgrade rule has to be re-implemented (and possibly got wrong). JAX's
//! forward-compatible export uses 11 (jax 0.10.2) or 13 (HEAD) to serve *older* runtimes;
//! supporting those would need the v14→13 downgrade (dropping the `subcore_id` segment) and,
//! for 11, the v13→12 one (dropping `transpose_lhs_hint`). `lowering/tests/libtpu.rs` compares this
//! output with `scripts/jax_reference.py serialize` (which also writes 15) on the same module.

use crate::context::MlirContext;
use crate::error::LowerError;
use melior::ir::{
    Block, BlockLike, BlockRef, Identifier, Location, Module, Region, RegionLike, Type, Value,
    ValueLike,
    attribute::IntegerAttribute,
    operation::{OperationBuilder, OperationLike, OperationMutLike},
    r#type::IntegerType,
};
use std::collections::HashMap;

/// The `stable_mosaic.version` this crate writes (see the module docs for why).
pub const VERSION: i64 = 15;

/// Map key of an MLIR value (its pointer; never iterated, so order cannot leak).
fn key<'c>(v: &impl ValueLike<'c>) -> usize {
    v.to_raw().ptr as usize
}

struct Cloner<'c, 'o> {
    map: HashMap<usize, Value<'c, 'o>>,
}

fn err(kernel: &str, message: String) -> LowerError {
    LowerError::Module { kernel: kernel.to_string(), loc: None, message, diagnostics: Vec::new() }
}

impl<'c, 'o> Cloner<'c, 'o> {
    fn value(&self, kernel: &str, v: Value<'c, '_>) -> Result<Value<'c, 'o>, LowerError> {
        self.map
            .get(&key(&v))
            .copied()
            .ok_or_else(|| err(kernel, "serialize: operand used before its definition".into()))
    }

    /// Clone the ops of `src` into `dst` (whose arguments mirror `src`'s), renaming them.
    fn block(
        &mut self,
        kernel: &str,
        src: BlockRef<'c, '_>,
        dst: BlockRef<'c, 'o>,
    ) -> Result<(), LowerError> {
        for i in 0..src.argument_count() {
            let (a, b) = (src.argument(i), dst.argument(i));
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    self.map.insert(key(&a), b.into());
                }
                _ => return Err(err(kernel, "serialize: block arguments differ".into())),
            }
        }
        let mut next = src.first_operation();
        while let Some(op) = next {
            let name = op.name();
            let name = name
                .as_string_ref()
                .as_str()
                .map_err(|e| err(kernel, format!("serialize: op name: {e}")))?;
            let operands =
                op.operands().map(|v| self.value(kernel, v)).collect::<Result<Vec<_>, _>>()?;
            let results: Vec<Type<'c>> = op.results().map(|r| r.r#type()).collect();
            let attrs: Vec<(Identifier<'c>, melior::ir::Attribute<'c>)> = op.attributes().collect();
            let mut regions = Vec::new();
            for r in op.regions() {
                let region = Region::new();
                let mut b = r.first_block();
                while let Some(sb) = b {
                    let args: Vec<(Type<'c>, Location<'c>)> = (0..sb.argument_count())
                        .filter_map(|i| sb.argument(i).ok())
                        .map(|a| (a.r#type(), a.location()))
                        .collect();
                    region.append_block(Block::new(&args));
                    b = sb.next_in_region();
                }
                regions.push(region);
            }
            let new = OperationBuilder::new(&format!("stable_mosaic.{name}"), op.location())
                .add_operands(&operands)
                .add_results(&results)
                .add_attributes(&attrs)
                .add_regions_vec(regions)
                .build()
                .map_err(|e| {
                    err(kernel, format!("serialize: cannot build stable_mosaic.{name}: {e}"))
                })?;
            let new = dst.append_operation(new);
            for (i, r) in op.results().enumerate() {
                let n = new.result(i).map_err(|e| err(kernel, format!("serialize: {e}")))?;
                self.map.insert(key(&r), n.into());
            }
            for (sr, dr) in op.regions().zip(new.regions()) {
                let (mut s, mut d) = (sr.first_block(), dr.first_block());
                while let (Some(sb), Some(db)) = (s, d) {
                    self.block(kernel, sb, db)?;
                    s = sb.next_in_region();
                    d = db.next_in_region();
                }
            }
            next = op.next_in_block();
        }
        Ok(())
    }
}

/// The serialized text of `module` (already verified).
pub(crate) fn serialize(
    mc: &MlirContext,
    kernel: &str,
    module: &Module<'_>,
) -> Result<String, LowerError> {
    let ctx = &mc.ctx;
    let mut out = Module::new(module.as_operation().location());
    out.as_operation_mut().set_attribute(
        "stable_mosaic.version",
        IntegerAttribute::new(IntegerType::new(ctx, 64).into(), VERSION).into(),
    );
    {
        let mut cloner = Cloner { map: HashMap::new() };
        cloner.block(kernel, module.body(), out.body())?;
    }
    if let Err(diagnostics) = mc.verify(&out.as_operation()) {
        return Err(LowerError::Module {
            kernel: kernel.to_string(),
            loc: None,
            message: "the serialized module does not verify".into(),
            diagnostics,
        });
    }
    crate::with_locations(kernel, &out.as_operation())
}
