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
