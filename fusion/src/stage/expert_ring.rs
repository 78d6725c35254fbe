//! The expert ring: the FFN stages' chunk stream ([`super::experts`], [`super::dense_mlp`]).
//! Each item is one chunk (`[gate | up | down]` columns, one DMA; a quantized plan's scales
//! with it) fetched into a ring of `slots` slots, computed as a SwiGLU on the normed
//! post-attention residual and summed into the FFN accumulator; then the residual add.

use super::{Handles, WeightTile, on_token_rows, ring_add};
use crate::layout::{CodeFormat, OperandKind};
use crate::plan::Plan;
use crate::spmd::Spmd;
use palladium_dsl::build::pipeline_lagged;
use palladium_dsl::prelude::*;
use palladium_dsl::trace::IntoIndex;
use palladium_kernels::body::{
    ExpertItem, Glu, GroupScales, WeightLayout, glu_chunk, residual_add,
};

/// An FFN's weights as they stream through the ring: the chunks' codes (bf16 or quantized),
/// and a quantized plan's scales (`[gate | up]` and down), chunked alike.
#[derive(Clone, Copy)]
pub struct RingWeights {
    codes: Ref,
    scales: Option<(Ref, Ref)>,
    /// The chunks' bias blocks (`expert_bias`, gpt-oss's routed experts).
    bias: Option<Ref>,
}

impl RingWeights {
    /// The operand `codes` and, where the plan has them, `scales` and `down_scales`.
    pub fn of(
        hs: &Handles,
        codes: OperandKind,
        scales: OperandKind,
        down_scales: OperandKind,
    ) -> Option<RingWeights> {
        Some(RingWeights {
            codes: hs.operand(codes)?,
            scales: hs.operand(scales).zip(hs.operand(down_scales)),
            bias: None,
        })
    }

    /// These weights with their chunks' bias blocks, the operand `bias` where the plan has
    /// it.
    pub fn with_bias(self, hs: &Handles, bias: OperandKind) -> RingWeights {
        RingWeights { bias: hs.operand(bias), ..self }
    }
}

/// The ring's scale slots (a quantized plan's): `[gate | up]` and down scales, on
/// `sems[0 | 1, slot]`.
#[derive(Clone, Copy)]
struct RingScales {
    gate_up: Ref,
    down: Ref,
    sems: SemRef,
    format: CodeFormat,
}

#[derive(Clone, Copy)]
pub struct ExpertRing {
    buf: Ref,
    sems: SemRef,
    scales: Option<RingScales>,
    /// The bias block slots (`[slots, 8, lanes]`) and their semaphores, where the experts
    /// have biases.
    bias: Option<(Ref, SemRef)>,
    acc: Ref,
    x: Ref,
    spmd: Option<Spmd>,
}

impl ExpertRing {
    pub fn new(hs: &Handles, p: &Plan) -> ExpertRing {
        ExpertRing {
            buf: hs.buffer(hs.keys.expert_buf),
            sems: hs.sems(hs.keys.expert_sems),
            scales: hs.quant().zip(p.layout.quant).map(|(q, f)| RingScales {
                gate_up: hs.buffer(q.expert_scales_buf),
                down: hs.buffer(q.expert_down_scales_buf),
                sems: hs.sems(q.expert_scale_sems),
                format: f.experts,
            }),
            bias: hs.keys.expert_bias.map(|(buf, sem)| (hs.buffer(buf), hs.sems(sem))),
            acc: hs.buffer(hs.keys.expert_acc),
            x: hs.buffer(hs.keys.x),
            spmd: hs.spmd,
        }
    }

    /// The chunk of `w` at `at` (its codes, and a quantized plan's scales with them) into
    /// ring slot `slot`.
    pub fn fetch(self, w: RingWeights, at: impl IntoIndex + Copy, slot: Val) -> Vec<Dma> {
        let mut copies = vec![async_copy(w.codes.at(at), self.buf.at(slot), self.sems.at(slot))];
        if let (Some((scales, down_scales)), Some(ring)) = (w.scales, self.scales) {
            copies.push(async_copy(scales.at(at), ring.gate_up.at(slot), ring.sems.at((0, slot))));
            copies.push(async_copy(
                down_scales.at(at),
                ring.down.at(slot),
                ring.sems.at((1, slot)),
            ));
        }
        if let (Some(bias), Some((buf, sems))) = (w.bias, self.bias) {
            copies.push(async_copy(bias.at(at), buf.at(slot), sems.at(slot)));
        }
        copies
    }

    /// The SwiGLU of the chunk in slot `slot` on `xn2`: an expert's, or a dense MLP's, of
    /// `intermediate` columns (the down projection's inputs, which its scale groups count).
    pub fn swiglu(self, p: &Plan, slot: Val, xn2: Val, intermediate: u64) -> Val {
        let eb = p.layout.expert_block;
        let (h, i) = (p.dims.hidden, intermediate);
        // Part `part` of the chunk (gate, up, down), of a weight of `weight_inputs` inputs:
        // its scales (loaded first) and its codes.
        let tile = |part: u64, weight_inputs: u64| {
            let scales = self.scales.map(|s| GroupScales {
                values: match part {
                    2 => s.down.load((slot, 0..s.format.scale_rows(eb, i), ..)),
                    _ => s.gate_up.load((slot, .., part * eb..(part + 1) * eb)),
                },
                group: s.format.group_of(weight_inputs),
            });
            WeightTile::new(self.buf.load((slot, .., part * eb..(part + 1) * eb)), scales)
        };
        // gpt-oss's activation and the chunk's biases (row 0: gate then up; row 1: the
        // down bias, zero past the expert's first chunk).
        let glu = Glu {
            clamped: p.dims.clamped_swiglu,
            gate_up_bias: self.bias.map(|(buf, _)| {
                (buf.load((slot, 0..1, 0..eb)), buf.load((slot, 0..1, eb..2 * eb)))
            }),
            down_bias: self.bias.map(|(buf, _)| buf.load((slot, 1..2, 0..h))),
        };
        on_token_rows(p, self.scales.is_some(), xn2, |x| {
            glu_chunk(x, tile(0, h), tile(1, h), tile(2, i), WeightLayout::OutIn, glu)
        })
    }

    /// An FFN stage's chunk stream: `total` items (item `(e, c)`: chunk `c < chunks` of
    /// entry `e`), the first `ahead` issued before the loop, each computed after the next
    /// one's wait ([`pipeline_lagged`]); `fetch(e, c, slot)` gives an item's copies,
    /// `chunk(slot, e, c)` its output and its per-row weights (`None`: every row at weight
    /// 1), summed into the FFN accumulator; then the all-reduce (N devices) and the
    /// residual add.
    pub fn stream(
        self,
        p: &Plan,
        total: Val,
        ahead: u64,
        chunks: u64,
        fetch: impl Fn(Val, Val, Val) -> Vec<Dma>,
        chunk: impl Fn(Val, Val, Val) -> (Val, Option<Val>),
    ) {
        let slots = p.expert_slots;
        for it in 0..ahead {
            for dma in
                fetch(scalar((it / chunks) as i32), scalar((it % chunks) as i32), scalar(it as i32))
            {
                dma.start();
            }
        }
        self.acc.store(.., 0.0);
        let zero = scalar(0);
        let _ = pipeline_lagged(
            total,
            ahead,
            (zero, zero, zero),
            |_, &(slot, e, c)| {
                let mut item = ExpertItem { pair: e, chunk: c };
                for _ in 0..ahead {
                    item = item.next(chunks);
                }
                for dma in fetch(item.pair, item.chunk, ring_add(slot, ahead, slots)) {
                    dma.start();
                }
            },
            |_, &(slot, e, c)| {
                for dma in fetch(e, c, slot) {
                    dma.wait();
                }
            },
            |_, (slot, e, c): (Val, Val, Val)| {
                let (y, weights) = chunk(slot, e, c);
                let acc = self.acc.load(..);
                self.acc.store(
                    ..,
                    match weights {
                        Some(w) => acc + y * w,
                        None => acc + y,
                    },
                );
                let next = ExpertItem { pair: e, chunk: c }.next(chunks);
                (ring_add(slot, 1, slots), next.pair, next.chunk)
            },
        );
        if let Some(spmd) = self.spmd {
            spmd.all_reduce(self.acc);
        }
        self.x.store(.., residual_add(self.x.load(..), self.acc.load(..)));
    }
}
