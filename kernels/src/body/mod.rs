//! The library's math as composable bodies: functions over traced values (loaded from VMEM
//! refs by the caller), with no grid, no block specs and no DMAs. A `#[kernel]` entry of this
//! crate wraps one with its grid and `BlockSpecs` (or its own DMA pipeline); the decode
//! megakernel (`palladium-fusion`'s stages, `fusion/src/stage/`) calls the same functions on its ring slots, so
//! each phase has one implementation and a fix to the math reaches both. One module per
//! phase:
//!
//! | module | phase | library kernels |
//! |---|---|---|
//! | [`embed`] | token embedding rows | (megakernel only) |
//! | [`norm`] | RMSNorm as the next projection's operand; the residual add | `rmsnorm`, `rmsnorm_matmul`, `residual_add(_inplace)` |
//! | [`greedy`] | greedy argmax over `lm_head` chunks (lowest id among equal maxima) | (megakernel only) |
//! | [`gemv`] | a projection through one weight block (q/k/v, o, router, lm_head), bf16 or quantized codes with group scales | `gemv`, `rmsnorm_matmul`, `moe_router`, `expert_ffn`, `*_quantized` |
//! | [`rope`] | RoPE tables, rotation and application | `rope` |
//! | [`kv`] | the KV-cache update inside a VMEM tile | `kv_cache_update` |
//! | [`collective`] | ring hops over remote DMAs: barrier, reduce-scatter and all-gather of row blocks (bf16 wire) | `permute`, `all_gather`, `reduce_scatter`, `all_reduce` |
//! | [`attention`] | one KV tile of attention (scores, mask, online-softmax fold) | `decode_attention` |
//! | [`mla`] | multi-head latent attention's cache row (the new position's: latent norm, RoPE on the rope block) and the query attending to it | `mla_decode_attention` |
//! | [`router`] | router scores, top-k, the routing table's entries | `moe_router` |
//! | [`ffn`] | one SwiGLU expert chunk; the expert stream's cursor | `expert_ffn` |
//! | [`rows`] | row moves on loaded vectors (a batch's rows on the MXU's sublanes) | (megakernel only) |

pub mod attention;
pub mod collective;
pub mod embed;
pub mod ffn;
pub mod gemv;
pub mod greedy;
pub mod kv;
pub mod mla;
pub mod norm;
pub mod rope;
pub mod router;
pub mod rows;

pub use attention::{KvMask, OnlineSoftmax, Window};
pub use embed::embedding_row;
pub use ffn::{ExpertItem, Glu, glu_chunk, routed, swiglu, swiglu_chunk};
pub use gemv::{
    DIGIT_ROWS, GroupScales, QuantizedBlock, WeightBlock, WeightLayout, project, project_quantized,
    widened_code_bytes,
};
pub use greedy::Greedy;
pub use kv::NewRow;
pub use mla::{LatentRow, RopeBlock};
pub use norm::{layer_norm, layer_norm_unit, residual_add, rms_norm, rms_unit};
pub use rope::{rope_apply, rope_rotation, rope_tables, rope_tables_of};
pub use router::{Choice, Routing, router_scores, top_k};
pub use rows::RowSelect;
