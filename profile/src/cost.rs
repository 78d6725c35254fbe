//! Compute cost of one op: which unit it occupies and for how many cycles.
//!
//! Each op occupies one unit; the engine lets the units of one stretch of compute overlap
//! (the busiest sets its time), and DMAs run beside it. Vector work is counted in vregs: tiles of
//! `8 x 128` 32-bit elements (`16 x 128` for 16-bit, packed), the last two dims padded to
//! whole tiles.

use crate::calibration::Coefficients;
use palladium_dsl::ir::{Kernel, OpData, Type, UnaryOp};
use palladium_dsl::target::Target;
use serde::Serialize;

/// The units the summary reports busy time for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Mxu,
    Vpu,
    Eup,
    Xlu,
    LoadStore,
    Scalar,
}

impl Unit {
    pub const ALL: [Unit; 6] =
        [Unit::Mxu, Unit::Vpu, Unit::Eup, Unit::Xlu, Unit::LoadStore, Unit::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            Unit::Mxu => "mxu",
            Unit::Vpu => "vpu",
            Unit::Eup => "eup",
            Unit::Xlu => "xlu",
            Unit::LoadStore => "load/store",
            Unit::Scalar => "scalar",
        }
    }
}

/// Vregs a vector of `dims` and `bits`-bit elements occupies.
pub fn vregs(dims: &[u64], bits: u32) -> u64 {
    let sublanes = 8 * u64::from((32 / bits.clamp(1, 32)).max(1));
    match dims {
        [] => 1,
        [n] => n.div_ceil(128).max(1),
        [lead @ .., r, c] => {
            lead.iter().product::<u64>().max(1)
                * r.div_ceil(sublanes).max(1)
                * c.div_ceil(128).max(1)
        }
    }
}

fn vregs_of(ty: &Type) -> Option<u64> {
    match ty {
        Type::Vector(shape, dtype) => Some(vregs(shape.dims(), dtype.bits())),
        _ => None,
    }
}

fn is_transcendental(op: UnaryOp) -> bool {
    !matches!(
        op,
        UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not
    )
}

/// The unit and cycles of `op` (a scalar or vector compute or memory op); `None` for ops
/// that take no core time of their own (control flow, DMAs and semaphores, which the
/// engine models, constants folded into their users, reshapes and ref slices).
pub fn op_cost(
    k: &Kernel,
    op: palladium_dsl::ir::Op,
    c: &Coefficients,
    target: &Target,
) -> Option<(Unit, f64)> {
    let node = &k.ops[op];
    let result = node.results.first().map(|&v| k.ty(v));
    let result_vregs = result.and_then(vregs_of);
    let operand_vregs = |v| vregs_of(k.ty(v));
    let per_vreg = |unit: Unit, n: Option<u64>, rate: f64| -> Option<(Unit, f64)> {
        match n {
            Some(n) => Some((unit, n as f64 * rate)),
            None => Some((Unit::Scalar, c.scalar_cycles)),
        }
    };
    use palladium_dsl::ir::BinaryOp;
    match &node.data {
        OpData::Constant { .. }
        | OpData::Reshape { .. }
        | OpData::RefSlice { .. }
        | OpData::AssumeMultiple { .. }
        | OpData::Yield { .. } => None,
        OpData::ProgramId { .. }
        | OpData::NumPrograms { .. }
        | OpData::DeviceId
        | OpData::BarrierSemaphore
        | OpData::SemRead { .. }
        | OpData::DebugPrint { .. } => Some((Unit::Scalar, c.scalar_cycles)),
        OpData::If { .. }
        | OpData::For { .. }
        | OpData::While { .. }
        | OpData::RunScoped { .. }
        | OpData::Alloc { .. }
        | OpData::SemAlloc { .. } => None,
        OpData::DmaStart { .. }
        | OpData::DmaWait { .. }
        | OpData::SemSignal { .. }
        | OpData::SemWait { .. } => Some((Unit::Scalar, c.scalar_cycles)),
        OpData::Unary { op, .. } if is_transcendental(*op) => {
            per_vreg(Unit::Eup, result_vregs, c.eup_cycles_per_vreg)
        }
        OpData::Binary { op: BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow, .. } => {
            per_vreg(Unit::Eup, result_vregs, c.eup_cycles_per_vreg)
        }
        OpData::Unary { .. }
        | OpData::Binary { .. }
        | OpData::Compare { .. }
        | OpData::Select { .. }
        | OpData::Cast { .. }
        | OpData::Broadcast { .. }
        | OpData::Iota { .. }
        | OpData::Slice { .. }
        | OpData::Concat { .. } => per_vreg(Unit::Vpu, result_vregs, c.vpu_cycles_per_vreg),
        OpData::Transpose { x, .. }
        | OpData::Reduce { x, .. }
        | OpData::ArgReduce { x, .. }
        | OpData::Roll { x, .. } => per_vreg(Unit::Xlu, operand_vregs(*x), c.xlu_cycles_per_vreg),
        OpData::Load { .. } => per_vreg(Unit::LoadStore, result_vregs, c.ldst_cycles_per_vreg),
        OpData::Store { value, .. } => {
            per_vreg(Unit::LoadStore, operand_vregs(*value), c.ldst_cycles_per_vreg)
        }
        OpData::Dot { lhs, rhs, dims, .. } => {
            let (l, r) = (k.ty(*lhs).value_shape()?, k.ty(*rhs).value_shape()?);
            let prod = |s: &[u64], axes: &[u32]| -> u64 {
                axes.iter().map(|&a| s[a as usize]).product::<u64>().max(1)
            };
            let free = |s: &[u64], contract: &[u32], batch: &[u32]| -> u64 {
                s.iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        !contract.contains(&(*i as u32)) && !batch.contains(&(*i as u32))
                    })
                    .map(|(_, d)| *d)
                    .product::<u64>()
                    .max(1)
            };
            let batch = prod(l.dims(), &dims.lhs_batch);
            let kk = prod(l.dims(), &dims.lhs_contract);
            let m = free(l.dims(), &dims.lhs_contract, &dims.lhs_batch);
            let n = free(r.dims(), &dims.rhs_contract, &dims.rhs_batch);
            // Tiles count in 128-wide steps: a 256-wide MXU takes a 128-wide half tile at half
            // the cost (a 896-column block is 3.5 passes, not 4).
            let s = f64::from(target.mxu.size);
            let tiles = |d: u64| (d.div_ceil(128) * 128) as f64 / s;
            let passes = batch as f64 * tiles(kk).max(1.0) * tiles(n).max(1.0);
            // The next weight tile loads while the current one's rows stream (the MXU double-buffers
            // its weights): a pass takes the longer of the two.
            let cycles = passes
                * c.mxu_weight_cycles.max((m.div_ceil(8) * 8) as f64 * c.mxu_row_cycles)
                / f64::from(target.mxu.count);
            Some((Unit::Mxu, cycles))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::vregs;

    #[test]
    fn vregs_pad_to_tiles() {
        assert_eq!(vregs(&[8, 128], 32), 1);
        assert_eq!(vregs(&[16, 128], 16), 1);
        assert_eq!(vregs(&[8, 1024], 16), 8);
        assert_eq!(vregs(&[2, 9, 130], 32), 2 * 2 * 2);
        assert_eq!(vregs(&[300], 32), 3);
        assert_eq!(vregs(&[], 32), 1);
    }
}
