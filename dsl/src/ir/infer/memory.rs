//! Type rules of loads, stores, sub-refs and scoped buffers: what each memory space
//! allows.

use super::{Types, indexed_shape, scalar_i32};
use crate::ir::{DType, Kernel, MemoryOp, MemorySpace, RefType, Type, is_strided};
use smallvec::{SmallVec, smallvec};

/// Result types of a memory op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: MemoryOp<'_>) -> Result<Types, String> {
    Ok(match data {
        MemoryOp::AssumeMultiple { x, .. } => {
            scalar_i32(k, *x, "operand")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        MemoryOp::Load { src, index } => {
            let Type::Ref(r) = k.ty(*src) else {
                return Err(format!("load from a non-ref {}", k.ty(*src)));
            };
            let shape = indexed_shape(k, &r.shape, index)?;
            match r.space {
                MemorySpace::Vmem => {
                    if shape.rank() == 0 {
                        return Err(
                            "a VMEM load must keep at least one dim (index with a slice)".into()
                        );
                    }
                    smallvec![Type::Vector(shape, r.dtype)]
                }
                MemorySpace::Smem => {
                    if shape.rank() != 0 {
                        return Err(format!(
                            "SMEM holds scalars: index every dim with a point, not a slice of {shape}"
                        ));
                    }
                    smallvec![Type::Scalar(r.dtype)]
                }
                s => {
                    return Err(format!(
                        "{s} refs can only be accessed by DMA (load from {})",
                        k.value_name(*src)
                    ));
                }
            }
        }
        MemoryOp::Store { dst, index, value, mask } => {
            let Type::Ref(r) = k.ty(*dst) else {
                return Err(format!("store to a non-ref {}", k.ty(*dst)));
            };
            let shape = indexed_shape(k, &r.shape, index)?;
            let want = match r.space {
                MemorySpace::Vmem if shape.rank() > 0 => Type::Vector(shape.clone(), r.dtype),
                MemorySpace::Smem if shape.rank() == 0 => Type::Scalar(r.dtype),
                MemorySpace::Vmem | MemorySpace::Smem => {
                    return Err(format!(
                        "the indexed window {shape} does not fit {} refs",
                        r.space
                    ));
                }
                s => {
                    return Err(format!(
                        "{s} refs can only be accessed by DMA (store to {})",
                        k.value_name(*dst)
                    ));
                }
            };
            if *k.ty(*value) != want {
                return Err(format!("stored value is {}, the window is {want}", k.ty(*value)));
            }
            if let Some(m) = mask {
                if is_strided(index) {
                    return Err(
                        "a strided store cannot be masked (Mosaic's tpu.strided_store has no mask)"
                            .into(),
                    );
                }
                if r.dtype.bits() != 32 {
                    return Err(format!("masked stores need 32-bit data, got {}", r.dtype));
                }
                if *k.ty(*m) != Type::array(shape.clone(), DType::Bool) {
                    return Err(format!("mask must be bool{shape}, got {}", k.ty(*m)));
                }
            }
            SmallVec::new()
        }
        MemoryOp::RefSlice { index, .. } if is_strided(index) => {
            return Err("a strided ds cannot make a sub-ref (`.at()`, DMAs): only loads and stores take strides, as in Pallas".into());
        }
        MemoryOp::RefSlice { base, index } => match k.ty(*base) {
            Type::Ref(r) => {
                let shape = indexed_shape(k, &r.shape, index)?;
                smallvec![Type::Ref(RefType { space: r.space, dtype: r.dtype, shape })]
            }
            Type::Sem(kind, s) => {
                let shape = indexed_shape(k, s, index)?;
                smallvec![Type::Sem(*kind, shape)]
            }
            t => return Err(format!("cannot slice a {t}")),
        },
        MemoryOp::Alloc { buf } => smallvec![Type::Ref(k.bufs[*buf].ty.clone())],
    })
}
