//! A projection through one weight block: the decode step's GEMVs (q/k/v, o, router,
//! `lm_head`, the experts' gate/up/down) are all this one product.

use palladium_dsl::prelude::*;

/// How a weight block is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[in, out]`: `x @ w` (Hugging Face's `weight.T`, the library kernels' layout).
    InOut,
    /// `[out, in]`: `x @ w.T`, the MXU reading `w` transposed. The megakernel packs its
    /// o-projection and down-projection columns this way, so that one dense-stream chunk or
    /// expert chunk is `[hidden, columns]` whatever the projection.
    OutIn,
}

/// `x @ w` (or `x @ w.T`) on the MXU, f32 accumulation: the bf16 x bf16 -> f32 product of the
/// activations `x` `[rows, in]` with one weight block. The one place a projection's
/// operands meet, where a different weight format would be decoded.
pub fn project(x: Val, w: Val, layout: WeightLayout) -> Val {
    match layout {
        WeightLayout::InOut => dot(x, w),
        WeightLayout::OutIn => dot_t(x, w),
    }
}

/// The scales of a quantized weight block: f32 `[in / group, out]` (one row when `group` is
/// at least the block's inputs), one per `group` consecutive inputs of each output column,
/// whatever the block's [`WeightLayout`]. The three
/// formats are this one layout: int8 per output channel is `group == in` (one row); int4
/// groups of 128 along the input are `group == 128`; fp8's 128 x 128 tiles are `group == 128`
/// with each tile's scale repeated over its 128 output columns (the packer expands them), so
/// one scale multiplies each (group, column) partial sum.
#[derive(Clone, Copy, Debug)]
pub struct GroupScales {
    pub values: Val,
    pub group: u64,
}

/// `x @ w` (or `x @ w.T`) for a weight block of 8- or 4-bit codes (i8, i4 or f8e4m3fn) and
/// its [`GroupScales`]: per group of inputs, the bf16 x code product on the MXU in f32
/// (`tpu.matmul` with the codes as its right operand, which libtpu converts on the way into
/// the MXU at the bf16 rate: no separate `.astype` pass over the tile), times that group's
/// scales, summed over the groups in order. The dequantized weight is `code * scale`, so
/// this is [`project`] on it up to f32 rounding. A group as wide as the block or wider
/// (int8 per channel; a K-split block inside one group) is one product times one scale row.
pub fn project_quantized(x: Val, codes: Val, scales: GroupScales, layout: WeightLayout) -> Val {
    let inputs = x.shape().dims()[1];
    let group = scales.group.min(inputs);
    let groups = inputs / group;
    (0..groups)
        .map(|g| {
            let (lo, hi) = (g * group, (g + 1) * group);
            let xg = x.slice((.., lo..hi));
            let wg = match layout {
                WeightLayout::InOut => codes.slice((lo..hi, ..)),
                WeightLayout::OutIn => codes.slice((.., lo..hi)),
            };
            project(xg, wg, layout) * scales.values.slice((g..g + 1, ..))
        })
        .reduce(|sum, part| sum + part)
        .expect("a weight block has at least one group of inputs")
}

/// A weight block as a projection's operand: bf16 values ([`project`]) or 8/4-bit codes with
/// their scales ([`QuantizedBlock`], [`project_quantized`]). Bodies that take weight blocks
/// (`swiglu_chunk`) are generic over it, so one body serves both.
pub trait WeightBlock: Copy {
    /// `x @ self` (or `x @ self.T`) in f32.
    fn project_from(self, x: Val, layout: WeightLayout) -> Val;
}

impl WeightBlock for Val {
    fn project_from(self, x: Val, layout: WeightLayout) -> Val {
        project(x, self, layout)
    }
}

/// A quantized weight block: its codes (i8, i4 or f8e4m3fn) and [`GroupScales`].
#[derive(Clone, Copy, Debug)]
pub struct QuantizedBlock {
    pub codes: Val,
    pub scales: GroupScales,
}

impl WeightBlock for QuantizedBlock {
    fn project_from(self, x: Val, layout: WeightLayout) -> Val {
        project_quantized(x, self.codes, self.scales, layout)
    }
}
