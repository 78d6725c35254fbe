//! The dense weight stream: `w_stream`'s chunks (each layer's `n` chunks, then a bf16
//! plan's `lm_head` chunks) through the dense ring of `banks` banks, `depth` chunks ahead.
//! The projections' stages consume its segments' pieces ([`crate::layout::StreamLayout::pieces`]).

use super::Handles;
use crate::layout::OperandKind;
use crate::plan::Plan;
use palladium_dsl::build::{if_else, lt};
use palladium_dsl::prelude::*;
use std::ops::Range;

#[derive(Clone, Copy)]
pub struct DenseStream {
    stream: Ref,
    ring: Ref,
    sems: SemRef,
}

impl DenseStream {
    pub fn new(hs: &Handles) -> DenseStream {
        DenseStream {
            stream: hs.must(OperandKind::WStream),
            ring: hs.buffer(hs.keys.ring),
            sems: hs.sems(hs.keys.ring_sems),
        }
    }

    /// Dense-stream chunk `item` (layer-major, then `lm_head`) into ring bank `bank`.
    pub fn copy(self, item: Val, bank: Val) -> Dma {
        async_copy(self.stream.at(item), self.ring.at(bank), self.sems.at(bank))
    }

    /// The prologue's: the stream's first `depth` chunks.
    pub fn issue_first(self, p: &Plan) {
        let total = p.layers as u64 * p.layout.per_layer + p.layout.stream_lm_chunks();
        for g in 0..p.depth.min(total) {
            self.copy(scalar(g as i32), scalar((g % p.banks) as i32)).start();
        }
    }

    /// Issue dense chunk `layer * n + k_ahead` (static `k_ahead`, traced `layer`) into bank
    /// `bank`. Unconditional unless a ring deeper than `lm_head` could run past the
    /// stream's end from this chunk (only tiny models): then guarded.
    pub fn issue_ahead(self, p: &Plan, layer: Val, k_ahead: u64, bank: Val) {
        let n = p.layout.per_layer;
        let total = p.layers as u64 * n + p.layout.stream_lm_chunks();
        let item = layer * n as i32 + k_ahead as i32;
        if k_ahead < n + p.layout.stream_lm_chunks() {
            self.copy(item, bank).start();
        } else {
            if_else(lt(item, total as i32), || self.copy(item, bank).start(), || ());
        }
    }

    /// Columns `cols` of the chunk in bank `bank`.
    pub fn columns(self, bank: Val, cols: Range<u64>) -> Val {
        self.ring.load((bank, .., cols))
    }

    /// The whole chunk in bank `bank`.
    pub fn chunk(self, bank: Val) -> Val {
        self.ring.load(bank)
    }
}
