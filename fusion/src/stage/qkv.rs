//! Stage: the layer's input norm (`input_layernorm`: folded into the q/k/v columns, or
//! applied from a quantized plan's norm rows, whose copies it starts) and the q/k/v
//! projection, the dense stream's `Qkv` segment, piece by piece into `qkv`.

use super::{Handles, LayerCopies, LayerOperand, Norm, WeightTile};
use crate::layout::CodeFormat;
use crate::plan::Plan;
use palladium_dsl::prelude::*;
use palladium_kernels::body::{GroupScales, WeightLayout};
use std::ops::Range;

#[derive(Clone, Copy)]
pub struct QkvProjection {
    x: Ref,
    qkv: Ref,
    norm: Norm,
    /// A quantized plan's per-layer copies: its scales (`qkv_scales`, `[H/group, n_qkv]`
    /// per layer, in their buffer) and its norm rows.
    copies: Option<LayerCopies>,
    format: Option<CodeFormat>,
}

impl QkvProjection {
    pub fn new(hs: &Handles, p: &Plan) -> QkvProjection {
        let copies = LayerCopies::new(hs);
        QkvProjection {
            x: hs.buffer(hs.keys.x),
            qkv: hs.buffer(hs.keys.qkv),
            norm: Norm::of(copies.map(|c| c.buffer(LayerOperand::Norms)), 0),
            copies,
            format: p.layout.quant.map(|f| f.dense),
        }
    }

    /// The residual stream normed for attention (a quantized plan starts the layer's
    /// copies here and waits for its norm rows and q/k/v scales).
    pub fn input_norm(self, p: &Plan, layer: Val) -> Val {
        let x = self.x.load(..);
        if let Some(copies) = self.copies {
            copies.start(layer);
            copies.dma(LayerOperand::Norms, layer).wait();
            copies.dma(LayerOperand::QkvScales, layer).wait();
        }
        self.norm.apply(p, x)
    }

    /// A piece of the `Qkv` segment: its columns `seg_cols` of the projection, the weight
    /// tile `w` from the dense ring, on the normed `xn1`.
    pub fn piece(self, p: &Plan, xn1: Val, w: Val, seg_cols: Range<u64>) {
        let scales = self.copies.zip(self.format).map(|(copies, f)| GroupScales {
            values: copies.buffer(LayerOperand::QkvScales).load((.., seg_cols.clone())),
            group: f.group_of(p.dims.hidden),
        });
        let y = WeightTile::new(w, scales).product(p, xn1, WeightLayout::InOut);
        self.qkv.store((.., seg_cols), y)
    }
}
