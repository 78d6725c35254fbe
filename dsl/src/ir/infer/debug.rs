//! Type rules of debugging output.

use super::{Types, scalar_i32};
use crate::ir::{DebugOp, Kernel};
use smallvec::SmallVec;

/// Result types of a debug op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: DebugOp<'_>) -> Result<Types, String> {
    Ok(match data {
        DebugOp::DebugPrint { format, args } => {
            let placeholders = format.matches("{}").count();
            if placeholders != args.len() {
                return Err(format!(
                    "the format {format:?} has {placeholders} `{{}}` placeholders for {} values",
                    args.len()
                ));
            }
            for (i, &a) in args.iter().enumerate() {
                scalar_i32(k, a, &format!("debug_print value {i} (TPU logs print i32 scalars)"))?;
            }
            SmallVec::new()
        }
    })
}
