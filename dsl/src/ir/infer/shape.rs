//! Type rules of shape ops, reductions and data movement inside vectors.

use super::{Types, array_of, broadcastable, scalar_i32};
use crate::ir::{DType, Kernel, Shape, ShapeOp, Type};
use smallvec::smallvec;

/// Result types of a shape op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: ShapeOp<'_>) -> Result<Types, String> {
    Ok(match data {
        ShapeOp::Broadcast { x, shape } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if !broadcastable(&s, shape) || shape.rank() == 0 {
                return Err(format!("cannot broadcast {s} to {shape}"));
            }
            smallvec![Type::Vector(shape.clone(), d)]
        }
        ShapeOp::Reshape { x, shape } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if s.num_elements() != shape.num_elements() {
                return Err(format!(
                    "cannot reshape {s} ({} elements) to {shape}",
                    s.num_elements()
                ));
            }
            smallvec![Type::array(shape.clone(), d)]
        }
        ShapeOp::Transpose { x, perm } => {
            let (s, d) = array_of(k, *x, "operand")?;
            let mut seen = vec![false; s.rank()];
            for &p in perm {
                match seen.get_mut(p as usize) {
                    Some(slot) if !*slot => *slot = true,
                    _ => return Err(format!("{perm:?} is not a permutation of rank {}", s.rank())),
                }
            }
            if perm.len() != s.rank() {
                return Err(format!("{perm:?} is not a permutation of rank {}", s.rank()));
            }
            smallvec![Type::array(Shape(perm.iter().map(|&p| s.dims()[p as usize]).collect()), d)]
        }
        ShapeOp::Reduce { op, x, axes } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if !(d.is_float() || d == DType::I32) {
                return Err(format!("reduce.{op} supports float and i32 operands, got {d}"));
            }
            let mut keep = vec![true; s.rank()];
            for &a in axes {
                match keep.get_mut(a as usize) {
                    Some(slot) if *slot => *slot = false,
                    _ => return Err(format!("bad reduction axes {axes:?} for shape {s}")),
                }
            }
            let dims: Vec<u64> =
                s.dims().iter().zip(&keep).filter(|(_, k)| **k).map(|(d, _)| *d).collect();
            smallvec![Type::array(Shape(dims), d)]
        }
        ShapeOp::ArgReduce { op, x, axis } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if d != DType::F32 || s.rank() == 0 {
                return Err(format!(
                    "{op} takes an f32 vector (as tpu.reduce_index), got {}",
                    k.ty(*x)
                ));
            }
            if *axis as usize >= s.rank() {
                return Err(format!("axis {axis} is out of range for {s}"));
            }
            let mut dims = s.dims().to_vec();
            dims.remove(*axis as usize);
            smallvec![Type::array(Shape(dims), DType::I32)]
        }
        ShapeOp::Slice { x, start, size } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if s.rank() == 0 || start.len() != s.rank() || size.len() != s.rank() {
                return Err(format!("a slice of {} needs one range per dim", k.ty(*x)));
            }
            for (dim, ((&lo, &n), &extent)) in start.iter().zip(size).zip(s.dims()).enumerate() {
                if n == 0 || lo.checked_add(n).is_none_or(|hi| hi > extent) {
                    return Err(format!(
                        "range {lo}..{} is out of bounds along dim {dim} (extent {extent})",
                        lo.saturating_add(n)
                    ));
                }
            }
            smallvec![Type::Vector(Shape(size.clone()), d)]
        }
        ShapeOp::Concat { xs, axis } => {
            let Some(&first) = xs.first() else {
                return Err("concatenate needs at least one value".into());
            };
            let (s0, d0) = array_of(k, first, "operand")?;
            if *axis as usize >= s0.rank() {
                return Err(format!("axis {axis} is out of range for {s0}"));
            }
            let mut dims = s0.dims().to_vec();
            for &x in &xs[1..] {
                let (s, d) = array_of(k, x, "operand")?;
                let others_agree = s.rank() == s0.rank()
                    && s.dims()
                        .iter()
                        .zip(s0.dims())
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis as usize || a == b);
                if d != d0 || !others_agree {
                    return Err(format!(
                        "cannot concatenate {} and {} along axis {axis}",
                        k.ty(first),
                        k.ty(x)
                    ));
                }
                dims[*axis as usize] += s.dims()[*axis as usize];
            }
            smallvec![Type::Vector(Shape(dims), d0)]
        }
        ShapeOp::Roll { x, shift, axis } => {
            let (s, d) = array_of(k, *x, "operand")?;
            scalar_i32(k, *shift, "roll shift")?;
            if *axis as usize >= s.rank() {
                return Err(format!("axis {axis} is out of range for {}", k.ty(*x)));
            }
            smallvec![Type::Vector(s, d)]
        }
    })
}
