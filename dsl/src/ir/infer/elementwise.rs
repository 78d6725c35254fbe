//! Type rules of elementwise ops: operands agree in shape and dtype, and each op
//! names the dtypes it is defined on.

use super::{Types, array_of};
use crate::ir::{BinaryOp, DType, ElementwiseOp, Kernel, Type, UnaryOp};
use smallvec::smallvec;

/// Result types of a elementwise op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: ElementwiseOp<'_>) -> Result<Types, String> {
    Ok(match data {
        ElementwiseOp::Unary { op, x } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if float_only(*op) && !d.is_float() {
                return Err(format!("{op} needs a float operand, got {d}"));
            }
            if *op == UnaryOp::Not && d.is_float() {
                return Err(format!("not needs an integer or bool operand, got {d}"));
            }
            if matches!(op, UnaryOp::Reciprocal | UnaryOp::ReciprocalApprox)
                && (d != DType::F32 || s.rank() == 0)
            {
                return Err(format!(
                    "{op} takes an f32 vector (as tpu.reciprocal), got {}",
                    k.ty(*x)
                ));
            }
            smallvec![Type::array(s, d)]
        }
        ElementwiseOp::Binary { op, lhs, rhs } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            if ls != rs || ld != rd {
                return Err(format!("operand types differ: {} vs {}", k.ty(*lhs), k.ty(*rhs)));
            }
            let bitwise = matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor);
            let shift = matches!(op, BinaryOp::Shl | BinaryOp::Shr);
            if (bitwise && ld.is_float()) || (shift && !ld.is_int()) {
                return Err(format!("{op} is not defined on {ld}"));
            }
            if *op == BinaryOp::Pow && !ld.is_float() {
                return Err(format!("pow needs float operands, got {ld}"));
            }
            if !bitwise && ld == DType::Bool {
                return Err(format!("{op} is not defined on bool"));
            }
            smallvec![Type::array(ls, ld)]
        }
        ElementwiseOp::Compare { lhs, rhs, .. } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            if ls != rs || ld != rd {
                return Err(format!("operand types differ: {} vs {}", k.ty(*lhs), k.ty(*rhs)));
            }
            smallvec![Type::array(ls, DType::Bool)]
        }
        ElementwiseOp::Select { cond, on_true, on_false } => {
            let (cs, cd) = array_of(k, *cond, "condition")?;
            let (ts, td) = array_of(k, *on_true, "true value")?;
            if k.ty(*on_true) != k.ty(*on_false) {
                return Err(format!(
                    "branch types differ: {} vs {}",
                    k.ty(*on_true),
                    k.ty(*on_false)
                ));
            }
            if cd != DType::Bool || (cs != ts && cs.rank() != 0) {
                return Err(format!(
                    "condition must be bool of shape {ts} (or a scalar), got {}",
                    k.ty(*cond)
                ));
            }
            smallvec![Type::array(ts, td)]
        }
        ElementwiseOp::Cast { x, to } => {
            let (s, _) = array_of(k, *x, "operand")?;
            smallvec![Type::array(s, *to)]
        }
    })
}

/// Unary ops defined on floats only (the rest also take integers; `not` takes no floats).
fn float_only(op: UnaryOp) -> bool {
    !matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
}
