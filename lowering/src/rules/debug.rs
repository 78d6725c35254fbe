//! `pl.debug_print` → `tpu.log` (Pallas's `_debug_print_rule`, scalar case).

use super::LowerCx;
use crate::error::RuleResult;
use crate::tpu;
use palladium_dsl::ir::{DebugOp, Op, Value as KValue};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, _op: Op, data: DebugOp<'_>) -> RuleResult<()> {
    match data {
        DebugOp::DebugPrint { format, args } => debug_print(cx, format, args),
    }
}

/// `tpu.log` with the format's `{}` placeholders numbered `$0, $1, ...` (what the TPU
/// expects), `formatted` when there are any.
fn debug_print(cx: &mut LowerCx<'_, '_>, format: &str, args: &[KValue]) -> RuleResult<()> {
    let values = args.iter().map(|&a| cx.v(a)).collect::<RuleResult<Vec<_>>>()?;
    let mut tag = String::new();
    for (i, text) in format.split("{}").enumerate() {
        if i > 0 {
            tag.push_str(&format!("${}", i - 1));
        }
        tag.push_str(text);
    }
    let op = tpu::log(cx.ctx, cx.loc, &values, &tag, !args.is_empty())?;
    cx.emit(op);
    Ok(())
}
