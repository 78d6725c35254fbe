//! DMAs, semaphores and the devices of a mesh: `tpu.enqueue_dma`, `tpu.wait_dma(2)`,
//! `tpu.sem_signal`/`wait`/`read`, `tpu.device_id`, `tpu.sem_barrier`.

use super::{At, Slot, segments, split};
use crate::devices::Delivery;
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::parse::Attr;
use crate::prepare::Instr;
use crate::value::Val;
use std::sync::Arc;

/// A prepared dma instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    /// `remote`: the send semaphore and the target device of a remote copy.
    Dma {
        src: Slot,
        dst: Slot,
        sem: Slot,
        remote: Option<(Slot, Slot)>,
    },
    DmaWait {
        sem: Slot,
        dst: Slot,
    },
    /// `device`: the device whose semaphore a remote signal increments.
    SemSignal {
        sem: Slot,
        amount: Slot,
        device: Option<Slot>,
    },
    /// `tpu.device_id`: this device's logical id in the mesh.
    DeviceId,
    /// `tpu.sem_barrier`: the collective's barrier semaphore.
    BarrierSemaphore,
    SemWait {
        sem: Slot,
        amount: Slot,
    },
    SemRead {
        sem: Slot,
    },
}

/// The instruction for a dma op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o, name) = (at.op, &at.o[..], at.name());
    Ok(Some(match name {
        "tpu.enqueue_dma" => {
            // The operand groups, in order; a 6-segment form (older Mosaic) has no subcore_id.
            const NAMES: [&str; 7] = [
                "source",
                "source_semaphore",
                "target",
                "target_semaphore",
                "device_id",
                "core_id",
                "subcore_id",
            ];
            let names =
                match op.attr("operandSegmentSizes").and_then(Attr::as_i64_list).map(|v| v.len()) {
                    Some(7) | None => &NAMES[..],
                    Some(6) => &NAMES[..6],
                    Some(n) => bail!(Unsupported, "tpu.enqueue_dma with {n} operand segments"),
                };
            let seg = segments(op, &[1, 0, 1, 1, 0, 0, 0][..names.len()])?;
            let parts = split(o, &seg, name)?;
            let get = |n: &str| {
                names.iter().position(|x| *x == n).and_then(|k| parts[k].first().copied())
            };
            if get("core_id").is_some() || get("subcore_id").is_some() {
                bail!(
                    Unsupported,
                    "DMAs to another core (core_id/subcore_id): the interpreter models devices of a mesh, one core each"
                );
            }
            let (Some(src), Some(dst)) = (get("source"), get("target")) else {
                bail!(Malformed, "DMA without source/target")
            };
            let Some(sem) = get("target_semaphore") else {
                bail!(Malformed, "tpu.enqueue_dma without a target_semaphore")
            };
            let remote = match (get("device_id"), get("source_semaphore")) {
                (Some(device), Some(send)) => Some((send, device)),
                (Some(_), None) => bail!(
                    Malformed,
                    "a remote tpu.enqueue_dma (device_id) without a source_semaphore"
                ),
                (None, _) => None,
            };
            Op::Dma { src, dst, sem, remote }
        }
        "tpu.wait_dma2" => {
            // A remote copy's waits name a device (the receive) or device 0 core 0 (the
            // send, as Pallas writes it); either way the wait is on the semaphore.
            let seg = segments(op, &[1, 1, 1, 0, 0])?;
            let parts = split(o, &seg, name)?;
            Op::DmaWait { sem: parts[0][0], dst: parts[2][0] }
        }
        "tpu.wait_dma" => {
            at.arity(2)?;
            Op::DmaWait { sem: o[0], dst: o[1] }
        }
        "tpu.sem_signal" => {
            let seg = segments(op, &[1, 1, 0, 0, 0])?;
            let parts = split(o, &seg, name)?;
            if parts.len() > 3 && parts[3..].iter().any(|p| !p.is_empty()) {
                bail!(
                    Unsupported,
                    "semaphore signals to another core (core_id/subcore_id): the interpreter models devices of a mesh, one core each"
                );
            }
            Op::SemSignal {
                sem: parts[0][0],
                amount: parts[1][0],
                device: parts.get(2).and_then(|p| p.first().copied()),
            }
        }
        "tpu.sem_wait" => {
            at.arity(2)?;
            Op::SemWait { sem: o[0], amount: o[1] }
        }
        "tpu.sem_read" => {
            at.arity(1)?;
            Op::SemRead { sem: o[0] }
        }
        "tpu.device_id" => Op::DeviceId,
        "tpu.sem_barrier" => Op::BarrierSemaphore,
        _ => return Ok(None),
    }))
}

/// Run one dma instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(mach: &mut Machine<'_>, ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::Dma { src, dst, sem, remote: None } => {
            let (s, d, m) =
                (v(src).view()?.clone(), v(dst).view()?.clone(), v(sem).view()?.clone());
            let started = mach.site_text(ins);
            mach.mem.dma_start(&s, &d, &m, started)?;
            Val::Undef
        }
        Op::Dma { src, dst, sem, remote: Some((send, device)) } => {
            let (s, d, m, send, to) = (
                v(src).view()?.clone(),
                v(dst).view()?.clone(),
                v(sem).view()?.clone(),
                v(send).view()?.clone(),
                v(device).int()?,
            );
            let link = mach.link("a remote DMA")?;
            let started = format!("{} on device {}", mach.source_text(ins), link.me);
            let recv = mach.mem.sem(&m)?;
            let (data, bytes) = mach.mem.remote_send(&s, &d, &send, started.clone())?;
            link.fabric.deliver(
                link.me,
                to,
                Delivery::Dma { dst: (*d).clone(), data, sem: recv, bytes, started },
            )?;
            mach.hand_over(&link, None)?;
            Val::Undef
        }
        Op::DmaWait { sem, dst } => {
            let (m, d) = (v(sem).view()?.clone(), v(dst).view()?.clone());
            while !mach.mem.dma_wait(&m, &d, mach.link.is_some())? {
                let why = format!(
                    "at {} for {} bytes on DMA semaphore {}",
                    mach.source_text(ins),
                    d.elems() * mach.mem.bufs[d.buf].dt.size(),
                    mach.mem.sem_name(mach.mem.sem(&m)?)
                );
                mach.wait_for_others(why)?;
            }
            Val::Undef
        }
        Op::SemSignal { sem, amount, device: None } => {
            let (m, a) = (v(sem).view()?.clone(), v(amount).int()?);
            mach.mem.sem_signal(&m, a)?;
            Val::Undef
        }
        Op::SemSignal { sem, amount, device: Some(device) } => {
            let (m, a, to) = (v(sem).view()?.clone(), v(amount).int()?, v(device).int()?);
            let link = mach.link("a remote semaphore signal")?;
            let s = mach.mem.sem(&m)?;
            let from = format!("{} on device {}", mach.source_text(ins), link.me);
            link.fabric.deliver(link.me, to, Delivery::Signal { sem: s, amount: a, from })?;
            mach.hand_over(&link, None)?;
            Val::Undef
        }
        Op::SemWait { sem, amount } => {
            let (m, a) = (v(sem).view()?.clone(), v(amount).int()?);
            while !mach.mem.sem_wait(&m, a, mach.link.is_some())? {
                let s = mach.mem.sem(&m)?;
                let why = format!(
                    "at {} for {a} on semaphore {} (value {})",
                    mach.source_text(ins),
                    mach.mem.sem_name(s),
                    mach.mem.sem_value(s)
                );
                mach.wait_for_others(why)?;
            }
            Val::Undef
        }
        Op::DeviceId => Val::Int(mach.link("tpu.device_id")?.me as i64),
        Op::BarrierSemaphore => {
            let link = mach.link("the barrier semaphore")?;
            Val::Ref(Arc::new(mach.mem.whole(link.barrier)))
        }
        Op::SemRead { sem } => {
            let m = v(sem).view()?.clone();
            let s = mach.mem.sem(&m)?;
            Val::Int(mach.mem.sem_value(s))
        }
    })
}
