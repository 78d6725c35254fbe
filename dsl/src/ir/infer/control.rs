//! Type rules of structured control flow and scopes: regions yield what the op
//! returns.

use super::{Types, list, scalar_i32, yield_types};
use crate::ir::{ControlOp, DType, Kernel, Type};
use smallvec::SmallVec;

/// Result types of a control op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: ControlOp<'_>) -> Result<Types, String> {
    Ok(match data {
        ControlOp::If { cond, then_block, else_block } => {
            if *k.ty(*cond) != Type::Scalar(DType::Bool) {
                return Err(format!("if condition must be a bool scalar, got {}", k.ty(*cond)));
            }
            let t = yield_types(k, *then_block)?;
            let e = yield_types(k, *else_block)?;
            if t != e {
                return Err(format!(
                    "if branches yield different types: ({}) vs ({})",
                    list(&t),
                    list(&e)
                ));
            }
            t
        }
        ControlOp::For { lower, upper, step, init, body } => {
            scalar_i32(k, *lower, "loop lower bound")?;
            scalar_i32(k, *upper, "loop upper bound")?;
            scalar_i32(k, *step, "loop step")?;
            let carried: Types = init.iter().map(|&v| k.ty(v).clone()).collect();
            let params: Types = k.blocks[*body].params.iter().map(|&v| k.ty(v).clone()).collect();
            if params.first() != Some(&Type::Scalar(DType::I32)) || params[1..] != carried[..] {
                return Err(format!(
                    "loop body takes ({}), expected (i32, {})",
                    list(&params),
                    list(&carried)
                ));
            }
            let y = yield_types(k, *body)?;
            if y != carried {
                return Err(format!(
                    "loop body yields ({}), the carried values are ({})",
                    list(&y),
                    list(&carried)
                ));
            }
            carried
        }
        ControlOp::While { init, cond, body } => {
            let carried: Types = init.iter().map(|&v| k.ty(v).clone()).collect();
            for (b, what) in [(*cond, "condition"), (*body, "body")] {
                let params: Types = k.blocks[b].params.iter().map(|&v| k.ty(v).clone()).collect();
                if params != carried {
                    return Err(format!(
                        "while {what} takes ({}), the carried values are ({})",
                        list(&params),
                        list(&carried)
                    ));
                }
            }
            let c = yield_types(k, *cond)?;
            if c[..] != [Type::Scalar(DType::Bool)] {
                return Err(format!("while condition must yield one bool, yields ({})", list(&c)));
            }
            let y = yield_types(k, *body)?;
            if y != carried {
                return Err(format!(
                    "while body yields ({}), the carried values are ({})",
                    list(&y),
                    list(&carried)
                ));
            }
            carried
        }
        ControlOp::RunScoped { body } => yield_types(k, *body)?,
        ControlOp::Yield { .. } => SmallVec::new(),
    })
}
