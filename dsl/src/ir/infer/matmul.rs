//! Type rules of the MXU: dimension numbers and the 32-bit accumulator.

use super::{Types, array_of};
use crate::ir::{DType, Kernel, MatmulOp, Shape, Type};
use smallvec::smallvec;

/// Result types of a matmul op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: MatmulOp<'_>) -> Result<Types, String> {
    Ok(match data {
        MatmulOp::Dot { lhs, rhs, dims, out, .. } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            // bf16 activations against 8/4-bit weights: libtpu takes the mixed `tpu.matmul`
            // directly on v6e and v7x (the weight converted on its way into the MXU).
            let quantized_rhs =
                ld == DType::Bf16 && matches!(rd, DType::I8 | DType::I4 | DType::F8E4M3);
            if ld != rd && !quantized_rhs {
                return Err(format!(
                    "dot operands have different dtypes: {ld} vs {rd} (a bf16 lhs may meet an i8, i4 or f8e4m3fn rhs)"
                ));
            }
            if out.bits() != 32 || out.is_float() != ld.is_float() {
                return Err(format!(
                    "dot of {ld} must accumulate in a 32-bit {} type, not {out}",
                    if ld.is_float() { "float" } else { "integer" }
                ));
            }
            if dims.lhs_contract.len() != dims.rhs_contract.len()
                || dims.lhs_batch.len() != dims.rhs_batch.len()
            {
                return Err("dot dimension numbers pair up unequal lists".into());
            }
            let dim = |s: &Shape, i: u32, side: &str| {
                s.dims()
                    .get(i as usize)
                    .copied()
                    .ok_or_else(|| format!("{side} dim {i} out of range for {s}"))
            };
            for (&a, &b) in dims
                .lhs_contract
                .iter()
                .zip(&dims.rhs_contract)
                .chain(dims.lhs_batch.iter().zip(&dims.rhs_batch))
            {
                let (x, y) = (dim(&ls, a, "lhs")?, dim(&rs, b, "rhs")?);
                if x != y {
                    return Err(format!(
                        "dot contracts lhs dim {a} ({x}) with rhs dim {b} ({y}): sizes differ"
                    ));
                }
            }
            let free = |s: &Shape, used: &[u32]| -> Vec<u64> {
                (0..s.rank() as u32)
                    .filter(|i| !used.contains(i))
                    .map(|i| s.dims()[i as usize])
                    .collect()
            };
            let lhs_used: Vec<u32> =
                dims.lhs_contract.iter().chain(&dims.lhs_batch).copied().collect();
            let rhs_used: Vec<u32> =
                dims.rhs_contract.iter().chain(&dims.rhs_batch).copied().collect();
            let mut shape: Vec<u64> =
                dims.lhs_batch.iter().map(|&b| ls.dims()[b as usize]).collect();
            shape.extend(free(&ls, &lhs_used));
            shape.extend(free(&rs, &rhs_used));
            smallvec![Type::array(Shape(shape), *out)]
        }
    })
}
