//! Stage: the output projection (`o_proj`, the dense stream's `OProj` segment) of the
//! attention rows, piece by piece into `o_acc`, then its residual add (after the
//! all-reduce on N devices).

use super::{Handles, LayerCopies, LayerOperand, WeightTile};
use crate::layout::{CodeFormat, OperandKind};
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
    /// `o_proj`'s bias rows (`o_bias`): the operand, its buffer, the copy's semaphore.
    bias: Option<(Ref, Ref, SemRef)>,
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
            bias: hs
                .keys
                .o_bias
                .map(|(buf, sem)| (hs.must(OperandKind::OBias), hs.buffer(buf), hs.sems(sem))),
            spmd: hs.spmd,
        }
    }

    /// The copy of layer `layer`'s bias rows.
    fn bias_copy(self, layer: Val) -> Option<(Dma, Ref)> {
        self.bias.map(|(operand, buf, sem)| (async_copy(operand.at(layer), buf, sem.at(0)), buf))
    }

    /// Before the first piece (after attention): the accumulator cleared, a quantized
    /// plan's scales landed, the layer's bias copy started.
    pub fn begin(self, layer: Val) {
        self.o_acc.store(.., 0.0);
        if let Some((copy, _)) = self.bias_copy(layer) {
            copy.start();
        }
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
    /// devices, then `o_proj`'s bias, once), stored and returned.
    pub fn residual(self, layer: Val) -> Val {
        if let Some(spmd) = self.spmd {
            spmd.all_reduce(self.o_acc);
        }
        let residual = self.x.load(..);
        let out = match self.bias_copy(layer) {
            Some((copy, buf)) => {
                copy.wait();
                self.o_acc.load(..) + buf.load((0..1, ..))
            }
            None => self.o_acc.load(..),
        };
        let x = residual_add(residual, out);
        self.x.store(.., x);
        x
    }
}
