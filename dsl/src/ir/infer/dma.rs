//! Type rules of DMAs, semaphores and the devices of a mesh.

use super::{Types, dma_operands, needs_mesh, scalar_i32, sem_scalar};
use crate::ir::{DType, DmaOp, Kernel, SemKind, Shape, Type, WaitSide};
use smallvec::{SmallVec, smallvec};

/// Result types of a dma op, or why it is ill typed.
pub(super) fn result_types(k: &Kernel, data: DmaOp<'_>) -> Result<Types, String> {
    Ok(match data {
        DmaOp::DmaStart { src, dst, sem, remote, priority } => {
            dma_operands(k, *src, *dst, *sem)?;
            if *priority > 1 {
                return Err(format!("DMA priority must be 0 or 1, got {priority}"));
            }
            if let Some(r) = remote {
                needs_mesh(k, "a remote DMA")?;
                scalar_i32(k, r.device_id, "device id")?;
                sem_scalar(k, r.send_sem, Some(SemKind::Dma), "send semaphore")?;
                if *priority != 0 {
                    return Err("remote DMAs must use priority 0".into());
                }
            }
            SmallVec::new()
        }
        DmaOp::DmaWait { src, dst, sem, side } => {
            dma_operands(k, *src, *dst, *sem)?;
            if let WaitSide::Recv { device_id } = side {
                scalar_i32(k, *device_id, "device id")?;
            }
            if *side != WaitSide::Local {
                needs_mesh(k, "a remote DMA wait")?;
            }
            SmallVec::new()
        }
        DmaOp::SemSignal { sem, amount, device_id } => {
            sem_scalar(k, *sem, Some(SemKind::Regular), "semaphore")?;
            scalar_i32(k, *amount, "amount")?;
            if let Some(d) = device_id {
                needs_mesh(k, "a remote semaphore signal")?;
                scalar_i32(k, *d, "device id")?;
            }
            SmallVec::new()
        }
        DmaOp::SemWait { sem, amount } => {
            sem_scalar(k, *sem, Some(SemKind::Regular), "semaphore")?;
            scalar_i32(k, *amount, "amount")?;
            SmallVec::new()
        }
        DmaOp::SemRead { sem } => {
            sem_scalar(k, *sem, None, "semaphore")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        DmaOp::DeviceId => {
            needs_mesh(k, "device_id()")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        DmaOp::BarrierSemaphore => {
            needs_mesh(k, "the barrier semaphore")?;
            if k.call.collective_id.is_none() {
                return Err("the barrier semaphore needs a collective id: #[kernel(collective_id = 0, ..)] (Pallas: CompilerParams(collective_id=0))".into());
            }
            smallvec![Type::Sem(SemKind::Regular, Shape::default())]
        }
        DmaOp::SemAlloc { sem } => {
            let s = &k.sems[*sem];
            smallvec![Type::Sem(s.kind, s.shape.clone())]
        }
    })
}
