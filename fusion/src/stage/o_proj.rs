//! Stage: the output projection (`o_proj`, the dense stream's `OProj` segment) of the
//! attention rows, piece by piece into `o_acc`, then its residual add (after the
//! all-reduce on N devices).

use super::{Handles, LayerCopies, LayerOperand, WeightTile};
use crate::layout::CodeFormat;
use crate::plan::Plan;
use crate::spmd::Spmd;
use palladium_dsl::prelude::*;
use palladium_kernels::body::{GroupScales, WeightLayout, residual_add};
use std::ops::Range;

#[derive(Clone, Copy)]
pub struct OProjection {
    attn: Ref,
    o_acc: Ref,
    x: Ref,
    /// A quantized plan's per-layer copies: its scales (`o_scales`, `[n_o/group, H]`).
    copies: Option<LayerCopies>,
    format: Option<CodeFormat>,
    spmd: Option<Spmd>,
}

impl OProjection {
    pub fn new(hs: &Handles, p: &Plan) -> OProjection {
        OProjection {
            attn: hs.buffer(hs.keys.attn),
            o_acc: hs.buffer(hs.keys.o_acc),
            x: hs.buffer(hs.keys.x),
            copies: LayerCopies::new(hs),
            format: p.layout.quant.map(|f| f.dense),
            spmd: hs.spmd,
        }
    }

    /// Before the first piece (after attention): the accumulator cleared, a quantized
    /// plan's scales landed.
    pub fn begin(self, layer: Val) {
        self.o_acc.store(.., 0.0);
        if let Some(copies) = self.copies {
            copies.dma(LayerOperand::OScales, layer).wait();
        }
    }

    /// A piece of the `OProj` segment: the attention columns `seg_cols` (`o_proj`'s padded
    /// inputs) times the weight tile `w`, added to the accumulator.
    pub fn piece(self, p: &Plan, w: Val, seg_cols: Range<u64>) {
        let a = self.attn.load((.., seg_cols.clone())).cast(bf16);
        let acc = self.o_acc.load(..);
        let scales = self.copies.zip(self.format).map(|(copies, f)| {
            // The scale rows of this piece's groups of o_proj's padded inputs.
            let g = f.group_of(p.dims.heads * p.dims.head_pad);
            let rows = seg_cols.start / g..seg_cols.end.div_ceil(g);
            GroupScales { values: copies.buffer(LayerOperand::OScales).load((rows, ..)), group: g }
        });
        let y = WeightTile::new(w, scales).product(p, a, WeightLayout::OutIn);
        self.o_acc.store(.., acc + y);
    }

    /// The attention output added to the residual stream (after its all-reduce on N
    /// devices), stored and returned.
    pub fn residual(self) -> Val {
        if let Some(spmd) = self.spmd {
            spmd.all_reduce(self.o_acc);
        }
        let x = residual_add(self.x.load(..), self.o_acc.load(..));
        self.x.store(.., x);
        x
    }
}
