//! Small fallible helpers over melior's `OperationBuilder` and attribute constructors, so
//! that rules never `expect()` (melior's own dialect helpers panic when result-type
//! inference fails).

use crate::error::{RuleError, RuleResult};
use melior::{
    Context,
    ir::{
        Attribute, Identifier, Location, Operation, Region, Type, Value,
        attribute::{BoolAttribute, IntegerAttribute},
        operation::OperationBuilder,
        r#type::IntegerType,
    },
};

/// Build `name` with explicit operands, result types, attributes and regions.
pub(crate) fn op<'c>(
    ctx: &'c Context,
    name: &str,
    loc: Location<'c>,
    operands: &[Value<'c, '_>],
    results: &[Type<'c>],
    attrs: &[(&str, Attribute<'c>)],
    regions: Vec<Region<'c>>,
) -> RuleResult<Operation<'c>> {
    let attrs: Vec<(Identifier<'c>, Attribute<'c>)> =
        attrs.iter().map(|(n, a)| (Identifier::new(ctx, n), *a)).collect();
    OperationBuilder::new(name, loc)
        .add_operands(operands)
        .add_results(results)
        .add_attributes(&attrs)
        .add_regions_vec(regions)
        .build()
        .map_err(|e| RuleError::Msg(format!("cannot build `{name}`: {e}")))
}

/// Parse an attribute from its textual form (used for dialect attributes such as `#tpu.…`).
pub(crate) fn parse_attr<'c>(ctx: &'c Context, text: &str) -> RuleResult<Attribute<'c>> {
    Attribute::parse(ctx, text)
        .ok_or_else(|| RuleError::Msg(format!("MLIR cannot parse the attribute `{text}`")))
}

pub(crate) fn parse_type<'c>(ctx: &'c Context, text: &str) -> RuleResult<Type<'c>> {
    Type::parse(ctx, text)
        .ok_or_else(|| RuleError::Msg(format!("MLIR cannot parse the type `{text}`")))
}

pub(crate) fn int_attr<'c>(ctx: &'c Context, bits: u32, v: i64) -> Attribute<'c> {
    IntegerAttribute::new(IntegerType::new(ctx, bits).into(), v).into()
}

pub(crate) fn bool_attr<'c>(ctx: &'c Context, v: bool) -> Attribute<'c> {
    BoolAttribute::new(ctx, v).into()
}
