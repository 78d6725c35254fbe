//! Async copies and semaphores (pallas-mosaic.md §5).

use super::LowerCx;
use crate::error::RuleResult;
use crate::{tpu, types};
use palladium_dsl::ir::{DmaOp, Op, Remote, Sem, SemKind, Shape, Value as KValue, WaitSide};

/// Lower one op of the family (the table in `mod.rs` says which).
pub(super) fn lower(cx: &mut LowerCx<'_, '_>, op: Op, data: DmaOp<'_>) -> RuleResult<()> {
    match data {
        DmaOp::DeviceId => device_id(cx, op),
        DmaOp::DmaStart { src, dst, sem, remote, priority } => {
            start(cx, *src, *dst, *sem, *remote, *priority)
        }
        DmaOp::DmaWait { src, dst, sem, side } => wait(cx, *src, *dst, *sem, *side),
        DmaOp::SemSignal { sem, amount, device_id } => signal(cx, *sem, *amount, *device_id),
        DmaOp::SemWait { sem, amount } => sem_wait(cx, *sem, *amount),
        DmaOp::SemRead { sem } => sem_read(cx, op, *sem),
        DmaOp::BarrierSemaphore => barrier_semaphore(cx, op),
        DmaOp::SemAlloc { sem } => sem_alloc(cx, op, *sem),
    }
}

/// `tpu.enqueue_dma source(..) target(..) target_semaphore(..)`; remote copies add the send
/// semaphore as `source_semaphore` and the `device_id`.
fn start(
    cx: &mut LowerCx<'_, '_>,
    src: KValue,
    dst: KValue,
    sem: KValue,
    remote: Option<Remote>,
    priority: u8,
) -> RuleResult<()> {
    let (s, d, t) = (cx.v(src)?, cx.v(dst)?, cx.v(sem)?);
    let (send, dev) = match remote {
        Some(r) => (Some(cx.v(r.send_sem)?), Some(cx.v(r.device_id)?)),
        None => (None, None),
    };
    let op = tpu::enqueue_dma(cx.ctx, cx.loc, s, d, t, send, dev, priority)?;
    cx.emit(op);
    Ok(())
}

/// `tpu.wait_dma2 semaphore(..) src(..) dst(..)`; a receive adds the copy's `device_id`, a
/// send wait Pallas's placeholder `device_id(0) core_id(0)`.
fn wait(
    cx: &mut LowerCx<'_, '_>,
    src: KValue,
    dst: KValue,
    sem: KValue,
    side: WaitSide,
) -> RuleResult<()> {
    let (s, d, m) = (cx.v(src)?, cx.v(dst)?, cx.v(sem)?);
    let remote = match side {
        WaitSide::Local => None,
        WaitSide::Recv { device_id } => Some((cx.v(device_id)?, None)),
        WaitSide::Send => {
            let zero = cx.const_i32(0)?;
            Some((zero, Some(zero)))
        }
    };
    let op = tpu::wait_dma2(cx.ctx, cx.loc, m, s, d, remote)?;
    cx.emit(op);
    Ok(())
}

fn signal(
    cx: &mut LowerCx<'_, '_>,
    sem: KValue,
    amount: KValue,
    device_id: Option<KValue>,
) -> RuleResult<()> {
    let (s, a) = (cx.v(sem)?, cx.v(amount)?);
    let dev = device_id.map(|v| cx.v(v)).transpose()?;
    let op = tpu::sem_signal(cx.ctx, cx.loc, s, a, dev)?;
    cx.emit(op);
    Ok(())
}

fn sem_wait(cx: &mut LowerCx<'_, '_>, sem: KValue, amount: KValue) -> RuleResult<()> {
    let (s, a) = (cx.v(sem)?, cx.v(amount)?);
    let op = tpu::sem_wait(cx.ctx, cx.loc, s, a)?;
    cx.emit(op);
    Ok(())
}

/// `tpu.device_id : i32`.
fn device_id(cx: &mut LowerCx<'_, '_>, op: Op) -> RuleResult<()> {
    let v = cx.emit1(tpu::device_id(cx.ctx, cx.loc, types::i32(cx.ctx)))?;
    cx.set_result(op, 0, v)
}

/// `tpu.sem_barrier : memref<!tpu.semaphore, #tpu.memory_space<semaphore_mem>>`.
fn barrier_semaphore(cx: &mut LowerCx<'_, '_>, op: Op) -> RuleResult<()> {
    let ty = types::sem_memref(cx.ctx, SemKind::Regular, &Shape::default())?;
    let v = cx.emit1(tpu::sem_barrier(cx.ctx, cx.loc, ty))?;
    cx.set_result(op, 0, v)
}

fn sem_read(cx: &mut LowerCx<'_, '_>, op: Op, sem: KValue) -> RuleResult<()> {
    let s = cx.v(sem)?;
    let v = cx.emit1(tpu::sem_read(cx.ctx, cx.loc, s, types::i32(cx.ctx)))?;
    cx.set_result(op, 0, v)
}

/// `tpu.sem_alloc` inside a `tpu.region`.
fn sem_alloc(cx: &mut LowerCx<'_, '_>, op: Op, sem: Sem) -> RuleResult<()> {
    let s = &cx.k.sems[sem];
    let ty = types::sem_memref(cx.ctx, s.kind, &s.shape)?;
    let v = cx.emit1(tpu::sem_alloc(cx.ctx, cx.loc, ty))?;
    cx.set_result(op, 0, v)
}
