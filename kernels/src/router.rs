//! MoE router for decode: `logits = x @ w_router` (bf16 in, f32 on the MXU), scores by
//! softmax over the experts (Qwen3-MoE, Mixtral) or by an elementwise sigmoid
//! (DeepSeek-V3 style; `sigmoid = true`), then top-k with optional renormalisation of the
//! selected weights (Qwen3's `norm_topk_prob`).
//!
//! Why it is shaped this way:
//! - No grid: at decode a whole batch is 1-8 tokens, `x` is a few KiB and `w_router` is
//!   `hidden * experts * 2` bytes (512 KiB for Qwen3-30B-A3B), so everything fits VMEM at
//!   once and one invocation does the work; there is nothing to pipeline.
//! - All tokens are processed together as `[tokens, experts]` vectors (one f32 vreg row per
//!   token for 128 experts), so each top-k round is a handful of vector ops for the batch.
//! - Top-k without a sort: `k` rounds of (row max → argmax as the *lowest* index holding the
//!   max, via `select(s == max, iota, experts)` and a min-reduction → mask that expert with
//!   -1, below any score). Ties therefore go to the lower expert id, as `jax.lax.top_k` does; weights come
//!   out in descending order.
//! - The selected ids/weights are accumulated as small `[tokens, k]` vectors (a column per
//!   round), then written to SMEM outputs element by element: SMEM stores are scalar-only,
//!   so each element is pulled out of the vector with a masked `max_all` (a
//!   `vector.multi_reduction` to a scalar) in a traced loop over (token, slot). SMEM is
//!   where the next stage wants them: `expert_ffn` reads them as scalar prefetch (ids) and
//!   SMEM scalars (weights), and in a fused megakernel they would stay in SMEM scratch.
//!   (SMEM windows are whole arrays; a 2-D `[tokens, k]` SMEM array pads its minor dim, which
//!   costs at most a few KiB of SMEM here.)
//!
//! Numerics: the f32 logits are the exact products of the bf16 inputs accumulated in f32
//! (an f32 matmul at default precision, see the note in the body); the softmax is the max-subtracted one, in f32. See `moe_reference::moe_router` (which calls `palladium_model::moe::route`).

use crate::body::{Routing, WeightLayout, project};
use palladium_dsl::prelude::*;

// The top-k rounds are unrolled at trace time, hence the bound on `top_k`.
#[kernel(requires = [top_k <= experts, top_k <= 256])]
pub fn moe_router(
    #[default(8)] tokens: usize,
    #[default(2048)] hidden: usize,
    #[default(128)] experts: usize,
    #[default(8)] top_k: usize,
    #[default(false)] sigmoid: bool,
    #[default(true)] renormalize: bool,
    #[input(bf16[tokens, hidden])] x: Ref,
    #[input(bf16[hidden, experts])] w_router: Ref,
    #[output(i32[tokens, top_k], space = smem)] ids: Ref,
    #[output(f32[tokens, top_k], space = smem)] weights: Ref,
) {
    // f32 operands at default precision: the MXU rounds them back to bf16, so this is the
    // bf16 x bf16 -> f32 product, but libtpu 0.0.42.1 crashes on v5e for a bf16 matmul whose
    // lhs has 8 rows ("Expected vector-bf16packed" in vmatmul; JAX Pallas's own
    // `jnp.dot(x_ref[...], w_ref[...])` on bf16[8, 256] x bf16[256, 128] aborts the same way).
    let logits = project(x[..].cast(f32), w_router[..].cast(f32), WeightLayout::InOut);
    let routing = Routing::new(logits, experts as u64, top_k as u64, sigmoid, renormalize);
    // SMEM stores are scalar: one entry at a time, in a traced loop over the (token, slot)
    // pairs so the IR stays small.
    for t in fori(0, scalar(tokens as i32)) {
        for j in fori(0, scalar(top_k as i32)) {
            let (id, weight) = routing.entry(t, j);
            ids[(t, j)] = id;
            weights[(t, j)] = weight;
        }
    }
}
