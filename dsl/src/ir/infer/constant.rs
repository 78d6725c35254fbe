//! Type rules of constants and grid queries.

use super::Types;
use crate::ir::{ConstantOp, DType, Kernel, Literal, Type};
use smallvec::smallvec;

/// Result types of a constant op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: ConstantOp<'_>) -> Result<Types, String> {
    Ok(match data {
        ConstantOp::Constant { value, ty } => {
            let d = ty.dtype().filter(|_| matches!(ty, Type::Scalar(_) | Type::Vector(..)));
            let Some(d) = d else {
                return Err(format!("constants must be scalars or vectors, not {ty}"));
            };
            let ok = match value {
                Literal::Int(_) => d.is_int() || d.is_float(),
                Literal::Float(_) => d.is_float(),
                Literal::Bool(_) => d == DType::Bool,
            };
            if !ok {
                return Err(format!("literal {value} does not fit dtype {d}"));
            }
            smallvec![ty.clone()]
        }
        ConstantOp::ProgramId { axis } | ConstantOp::NumPrograms { axis } => {
            let rank = k.call.grid.len();
            if *axis as usize >= rank {
                return Err(format!("grid axis {axis} out of range: the grid has {rank} dims"));
            }
            smallvec![Type::Scalar(DType::I32)]
        }
        ConstantOp::Iota { shape, dim } => {
            if *dim as usize >= shape.rank() {
                return Err(format!("iota dim {dim} out of range for shape {shape}"));
            }
            smallvec![Type::Vector(shape.clone(), DType::I32)]
        }
    })
}
