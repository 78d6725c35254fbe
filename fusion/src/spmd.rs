//! The megakernel's part on `N > 1` devices (a sharded [`Plan`]): the mesh, the step's one
//! barrier, and the in-kernel collectives on the shared ring hops
//! ([`palladium_kernels::body::collective`]), bf16 on the wire, DMA semaphores only.
//!
//! - **All-reduce** of a `[rows, hidden]` f32 partial sum (after `o_proj`, after the MoE):
//!   its `N` column blocks are staged as the `N` row blocks of a bf16 `[N * r16, hidden /
//!   N]` buffer (`r16`: rows rounded to a bf16 tile), reduce-scattered into this device's
//!   block of a second such buffer, all-gathered there, and unstaged back into the f32
//!   partial. Both ring directions carry half the columns where a block splits into
//!   128-lane halves, else one direction all of them.
//! - **Greedy gather**: each device's `(max logit, id)` per row (ids offset to the global
//!   vocabulary) all-gathered in `[N * r8, 128]` f32 and i32 buffers, then combined in device
//!   order (higher maximum wins; ties keep the lower device, whose ids are lower), so every
//!   device returns the same `next_ids` and `max_logits`.
//!
//! The buffers and semaphores are reused by the `2L` all-reduces and the gather: a device
//! sends into a neighbour's buffer in collective `c + 1` only after that neighbour's own
//! sends of collective `c + 1` began (the ring runs both ways, or has two devices), which it
//! issues after reading collective `c`'s result.

use crate::options::round_up;
use crate::plan::Plan;
use crate::scratch::{CollectiveKeys, ScratchHandles};
use crate::shard::ExpertSplit;
use palladium_dsl::build::{KernelBuilder, eq, gt};
use palladium_dsl::prelude::*;
use palladium_kernels::body::Greedy;
use palladium_kernels::body::collective::{Hops, Way, directions, ring, ring_barrier};

/// The mesh axis the megakernel's devices lie on.
const AXIS: &str = "x";

/// This device's collective state: its position, the staging buffers and the hop
/// semaphores (the plan's collective scratch, [`CollectiveKeys`]).
#[derive(Clone, Copy)]
pub struct Spmd {
    me: Val,
    n: usize,
    rows: u64,
    hidden: u64,
    /// Rows of a staged bf16 block, and of a gathered f32/i32 block.
    r16: u64,
    r8: u64,
    staged: Ref,
    reduced: Ref,
    stage: Ref,
    maxes: Ref,
    ids: Ref,
    send: SemRef,
    recv: SemRef,
    /// The first vocabulary id of this device's `lm_head` slice, and the number of its
    /// real ids (the last device's slice may run past the vocabulary).
    vocab_first: Val,
    vocab_real: Val,
    /// Under EP, the first global expert id this device holds.
    expert_first: Option<Val>,
}

/// Add the mesh and the collective id to `kb` (nothing on one device); the collectives'
/// scratch is the plan's ([`crate::scratch::MegakernelScratch`]).
pub fn declare(kb: &mut KernelBuilder, plan: &Plan) {
    let Some(sharding) = &plan.sharding else {
        return;
    };
    kb.mesh(&[(AXIS, sharding.devices)]);
    kb.collective_id(0);
}

impl Spmd {
    /// The state over the collective scratch's handles, at the kernel's start: the
    /// device's position, the step's one barrier (both ring neighbours run the kernel
    /// before any hop), the staging buffer zeroed (its padding rows then carry zeros round
    /// the ring).
    pub fn start(plan: &Plan, keys: CollectiveKeys, handles: &ScratchHandles) -> Spmd {
        let [staged, reduced, stage, maxes, ids] =
            [keys.staged, keys.reduced, keys.stage, keys.maxes, keys.ids]
                .map(|k| handles.buffer(k));
        let [send, recv] = [keys.send, keys.recv].map(|k| handles.semaphores(k));
        let sharding = plan.sharding.as_ref().expect("a sharded plan");
        let (n, d) = (sharding.devices as usize, &plan.dims);
        let me = axis_index(AXIS);
        ring_barrier(ring(me, -1, n), ring(me, 1, n));
        staged.store(.., 0.0);
        let vocab_first = me * d.vocab as i32;
        let left = scalar(sharding.vocab as i32) - vocab_first;
        let vocab_real = select(gt(left, d.vocab as i32), d.vocab as i32, left);
        let expert_first =
            (sharding.experts.split == ExpertSplit::Ep).then(|| me * d.experts_per_device as i32);
        Spmd {
            me,
            n,
            rows: d.rows,
            hidden: d.hidden,
            r16: round_up(d.rows, 16),
            r8: round_up(d.rows, 8),
            staged,
            reduced,
            stage,
            maxes,
            ids,
            send,
            recv,
            vocab_first,
            vocab_real,
            expert_first,
        }
    }

    /// Under EP, the first global expert id this device holds.
    pub fn expert_first(&self) -> Option<Val> {
        self.expert_first
    }

    /// The number of real vocabulary ids in this device's `lm_head` slice (for
    /// [`Greedy::fold`], which takes local ids).
    pub fn vocab_real(&self) -> Val {
        self.vocab_real
    }

    /// Sum the `[rows, hidden]` f32 `partial` over the devices, in place (bf16 on the wire).
    pub fn all_reduce(&self, partial: Ref) {
        let (n, rows, r16) = (self.n as u64, self.rows, self.r16);
        let cb = self.hidden / n;
        for j in 0..n {
            self.staged.store(
                (j * r16..j * r16 + rows, ..),
                partial.load((.., j * cb..(j + 1) * cb)).cast(bf16),
            );
        }
        let mine = self.reduced.at((ds(self.me * r16 as i32, r16), ..));
        let hops = |first| Hops {
            me: self.me,
            n: self.n,
            rows: r16,
            ways: directions(cb, cb.is_multiple_of(256), self.send, self.recv, first),
        };
        hops(0).reduce(self.staged, mine, self.stage);
        hops(2).gather(self.reduced);
        for j in 0..n {
            partial.store(
                (.., j * cb..(j + 1) * cb),
                self.reduced.load((j * r16..j * r16 + rows, ..)).cast(f32),
            );
        }
    }

    /// Sum the `[rows, 128]` f32 `partial` over the devices, exactly (f32 on the wire: each
    /// device's block gathered into the greedy pairs' `maxes` buffer, then added in device
    /// order, so every device gets the same sum). For a few per-row values (`OLMoE`'s q/k
    /// sums of squares).
    pub fn sum_rows(&self, partial: Val) -> Val {
        let (rows, r8) = (self.rows, self.r8);
        self.maxes.at((ds(self.me * r8 as i32, r8), ..)).store((0..rows, ..), partial);
        let way = Way { dir: 1, cols: (0, 128), send: self.send.at(0), recv: self.recv.at(0) };
        Hops { me: self.me, n: self.n, rows: r8, ways: vec![way] }.gather(self.maxes);
        (1..self.n as u64)
            .map(|j| self.maxes.load((j * r8..j * r8 + rows, ..)))
            .fold(self.maxes.load((0..rows, ..)), |a, b| a + b)
    }

    /// Every device's greedy choice (local ids) combined into the global one, the same on
    /// every device.
    pub fn gather_greedy(&self, local: Greedy) -> Greedy {
        let (rows, r8) = (self.rows, self.r8);
        let block = |buf: Ref| buf.at((ds(self.me * r8 as i32, r8), ..));
        block(self.maxes).store((0..rows, ..), local.max.broadcast_to([rows, 128]));
        block(self.ids)
            .store((0..rows, ..), (local.id + self.vocab_first).broadcast_to([rows, 128]));
        for (k, buf) in [self.maxes, self.ids].into_iter().enumerate() {
            let way = Way {
                dir: 1,
                cols: (0, 128),
                send: self.send.at(k as i32),
                recv: self.recv.at(k as i32),
            };
            Hops { me: self.me, n: self.n, rows: r8, ways: vec![way] }.gather(buf);
        }
        let column = |buf: Ref, j: u64| buf.load((j * r8..j * r8 + rows, 0..1));
        let mut best = Greedy { max: column(self.maxes, 0), id: column(self.ids, 0) };
        for j in 1..self.n as u64 {
            let (max, id) = (column(self.maxes, j), column(self.ids, j));
            // A NaN maximum (a non-finite logit on that device) poisons the row, as in
            // `Greedy::fold`; a device with no real ids (maximum -inf) adds nothing.
            let poison = select(eq(max, f64::NEG_INFINITY), 0.0, max * 0.0);
            best = Greedy {
                max: best.max.maximum(max) + poison,
                id: select(gt(max, best.max), id, best.id),
            };
        }
        best
    }
}
