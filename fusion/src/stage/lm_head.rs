//! Stage (the step's last): the final norm, `lm_head` chunk by chunk and the greedy
//! argmax and maximum of every token row (the f32 logits too where the plan keeps them),
//! gathered over the devices' vocabulary slices on N devices.

use super::stream::DenseStream;
use super::{Handles, LayerCopies, LayerOperand, Norm, WeightTile, ring_add};
use crate::layout::{CodeFormat, OperandKind};
use crate::plan::{Plan, TWO_AHEAD_SLOTS};
use crate::spmd::Spmd;
use palladium_dsl::build::{Carry, Drain, pipeline, range};
use palladium_dsl::prelude::*;
use palladium_kernels::body::{Greedy, GroupScales, WeightLayout};

/// Where `lm_head`'s chunks stream from: the data of its operand.
#[derive(Clone, Copy)]
pub enum LmStream {
    /// The dense stream after the layers' chunks, through the dense ring, the final norm
    /// folded (bf16 plans).
    Dense(DenseStream),
    /// Its own operand (`w_lm_head`: codes, with `lm_scales` where it is quantized) through
    /// its own ring of [`TWO_AHEAD_SLOTS`] banks (`sems[0 | 1, bank]`), the final norm
    /// applied from `norms[layers]` (quantized plans).
    Own {
        codes: Ref,
        scales: Option<(Ref, Ref, CodeFormat)>,
        ring: Ref,
        sems: SemRef,
        copies: LayerCopies,
    },
}

#[derive(Clone, Copy)]
pub struct LmHead {
    stream: LmStream,
    x: Ref,
    logits: Option<Ref>,
    next_ids: Ref,
    max_logits: Ref,
    spmd: Option<Spmd>,
}

impl LmHead {
    pub fn new(hs: &Handles, p: &Plan, dense: DenseStream) -> LmHead {
        let stream = match (hs.quant(), LayerCopies::new(hs)) {
            (Some(q), Some(copies)) => LmStream::Own {
                codes: hs.must(OperandKind::LmHead),
                scales: hs.operand(OperandKind::LmScales).map(|scales| {
                    let format = p.layout.quant.and_then(|f| f.lm_head);
                    (scales, hs.buffer(q.lm_scales_buf), format.expect("lm_scales: quantized"))
                }),
                ring: hs.buffer(q.lm_ring),
                sems: hs.sems(q.lm_sems),
                copies,
            },
            _ => LmStream::Dense(dense),
        };
        LmHead {
            stream,
            x: hs.buffer(hs.keys.x),
            logits: hs.operand(OperandKind::Logits),
            next_ids: hs.must(OperandKind::NextIds),
            max_logits: hs.must(OperandKind::MaxLogits),
            spmd: hs.spmd,
        }
    }

    /// The chunks issued before the loop, the ring's banks and the bank of chunk 0.
    fn ring(self, p: &Plan) -> (u64, u64, u64) {
        match self.stream {
            // The layer loop issued lm chunks 0..depth, after the layers' chunks.
            LmStream::Dense(_) => {
                (p.depth, p.banks, (p.layers as u64 * p.layout.per_layer) % p.banks)
            }
            LmStream::Own { .. } => (TWO_AHEAD_SLOTS - 1, TWO_AHEAD_SLOTS, 0),
        }
    }

    /// `lm_head` chunk `chunk`'s copies into the bank `bank()` gives.
    fn copies(self, p: &Plan, chunk: Val, bank: impl FnOnce() -> Val) -> Vec<Dma> {
        match self.stream {
            LmStream::Dense(stream) => {
                let item = chunk + (p.layers as u64 * p.layout.per_layer) as i32;
                vec![stream.copy(item, bank())]
            }
            LmStream::Own { codes, scales, ring, sems, .. } => {
                let bank = bank();
                let mut copies =
                    vec![async_copy(codes.at(chunk), ring.at(bank), sems.at((0, bank)))];
                if let Some((scales, buf, _)) = scales {
                    copies.push(async_copy(scales.at(chunk), buf.at(bank), sems.at((1, bank))));
                }
                copies
            }
        }
    }

    /// The weight tile of the chunk in bank `bank`.
    fn tile(self, p: &Plan, bank: Val) -> WeightTile {
        match self.stream {
            LmStream::Dense(stream) => WeightTile::Bf16(stream.chunk(bank)),
            LmStream::Own { scales, ring, .. } => {
                let w = ring.load(bank);
                WeightTile::new(
                    w,
                    scales.map(|(_, buf, f)| GroupScales {
                        values: buf.load(bank),
                        group: f.group_of(p.dims.hidden),
                    }),
                )
            }
        }
    }

    /// The prologue's: the first chunks of its own stream, landing during the layers (the
    /// dense stream's are the dense ring's).
    pub fn issue_first(self, p: &Plan) {
        if let LmStream::Own { .. } = self.stream {
            for c in 0..(TWO_AHEAD_SLOTS - 1).min(p.layout.lm_chunks) {
                for dma in self.copies(p, scalar(c as i32), || scalar(c as i32)) {
                    dma.start();
                }
            }
        }
    }

    /// The final norm and `lm_head`, the greedy id and maximum of every row to the outputs.
    pub fn emit(self, p: &Plan) {
        let rows = p.dims.rows;
        let norm = match self.stream {
            LmStream::Dense(_) => Norm::Folded,
            LmStream::Own { copies, .. } => {
                let final_norm = copies.dma(LayerOperand::Norms, scalar(p.layers as i32));
                final_norm.start();
                final_norm.wait();
                Norm::Row(copies.buffer(LayerOperand::Norms), 0)
            }
        };
        let xf = norm.apply(p, self.x.load(..));
        let (ahead, banks, first_bank) = self.ring(p);
        let (_, greedy) = lm_head_chunks(
            p.layout.lm_chunks,
            ahead,
            (scalar(first_bank as i32), Greedy::start(rows)),
            |c: Val, &(bank, _): &(Val, Greedy)| {
                for dma in self.copies(p, c, || ring_add(bank, ahead, banks)) {
                    dma.start();
                }
            },
            |c: Val, (bank, greedy): (Val, Greedy)| {
                for dma in self.copies(p, c, || bank) {
                    dma.wait();
                }
                let logits = self.tile(p, bank).product(p, xf, WeightLayout::InOut);
                if let Some(out) = self.logits {
                    out.store(c, logits);
                }
                (ring_add(bank, 1, banks), self.fold_greedy(p, greedy, logits, c))
            },
        );
        // On N devices each holds its vocabulary slice's best: gather them.
        let greedy = match self.spmd {
            Some(spmd) => spmd.gather_greedy(greedy),
            None => greedy,
        };
        self.next_ids.store(.., greedy.id.broadcast_to([rows, 128]));
        self.max_logits.store(.., greedy.max.broadcast_to([rows, 128]));
    }

    /// `greedy` folded over chunk `c`'s `logits`. On N devices the ids are local to the
    /// device's vocabulary slice (until gathered), its padding past the model's vocabulary
    /// masked.
    fn fold_greedy(self, p: &Plan, greedy: Greedy, logits: Val, c: Val) -> Greedy {
        let first = c * p.layout.chunk_cols as i32;
        match self.spmd {
            Some(spmd) => greedy.fold(logits, first, spmd.vocab_real()),
            None => greedy.fold(logits, first, p.dims.vocab as i32),
        }
    }
}

/// An `lm_head` stream of `chunks` chunks whose first `min(ahead, chunks)` the caller has
/// issued, each chunk issued `ahead` before its use ([`pipeline`]; `issue(i, &carry)`
/// issues chunk `i` from the carry of chunk `i - ahead`, `consume` waits for a chunk and
/// uses it). Not [`pipeline_lagged`](palladium_dsl::build::pipeline_lagged): with compute this light against its DMAs, libtpu's
/// v6e estimate of the lagged form was higher (bf16 Qwen3-30B-A3B, 8 layers, two ahead:
/// 1318266 cycles against 1253779).
fn lm_head_chunks<C: Carry>(
    chunks: u64,
    ahead: u64,
    init: C,
    issue: impl Fn(Val, &C),
    consume: impl Fn(Val, C) -> C,
) -> C {
    let split = chunks.saturating_sub(ahead) as i32;
    pipeline(
        range(0, scalar(split)),
        Drain::Loop(range(scalar(split), scalar(chunks as i32))),
        ahead,
        init,
        issue,
        |c: Val, carry: C, _| consume(c, carry),
    )
}
