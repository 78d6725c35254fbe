//! Stage (the step's first): each token row's embedding, fetched by token id (scalar
//! prefetch) in its 16-row group of `embed`, to row `r` of the residual stream `x`.

use super::Handles;
use crate::layout::OperandKind;
use crate::plan::Plan;
use palladium_dsl::prelude::*;
use palladium_kernels::body::{RowSelect, embedding_row};

#[derive(Clone, Copy)]
pub struct Embed {
    tokens: Ref,
    embed: Ref,
    rows: Ref,
    sems: SemRef,
    x: Ref,
}

impl Embed {
    pub fn new(hs: &Handles) -> Embed {
        Embed {
            tokens: hs.must(OperandKind::Tokens),
            embed: hs.must(OperandKind::Embed),
            rows: hs.buffer(hs.keys.emb_rows),
            sems: hs.sems(hs.keys.emb_sems),
            x: hs.buffer(hs.keys.x),
        }
    }

    /// Token row `r`'s group of `embed` into its buffer row.
    fn copy(self, r: u64) -> (Val, Dma) {
        let t = self.tokens.load(r);
        (t, async_copy(self.embed.at(t / 16), self.rows.at(r), self.sems.at(r)))
    }

    /// Issue every token row's fetch (first thing in the step).
    pub fn start(self, p: &Plan) {
        for r in 0..p.dims.tokens {
            self.copy(r).1.start();
        }
    }

    /// Wait for the rows and store them to `x` (`row_i`: the prologue's row selector).
    pub fn finish(self, p: &Plan, row_i: RowSelect) {
        let mut x = zeros([p.dims.rows, p.dims.hidden], f32);
        for r in 0..p.dims.tokens {
            let (t, dma) = self.copy(r);
            dma.wait();
            x = row_i.put(x, r as i32, embedding_row(self.rows.load(r), t));
        }
        self.x.store(.., x);
    }
}
