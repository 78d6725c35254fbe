//! Palladium's model description: a Hugging Face `config.json` read into a typed, validated
//! [`ModelSpec`], the input of the megakernel planner.
//!
//! ```
//! let spec = palladium_model::ModelSpec::from_json_str(include_str!(
//!     "../../fixtures/models/qwen3-30b-a3b.json"
//! ))?;
//! assert_eq!(spec.layers.len(), 48);
//! # Ok::<(), palladium_model::ConfigError>(())
//! ```
//!
//! - [`spec`]: the types; every family convention (q/k norm, RoPE style, top-k renormalisation,
//!   biases, tied head) is a field, and every layer states its attention span and FFN kind.
//! - `parse`: both transformers 4.x and 5.x spellings, family rules, consistency checks; errors
//!   name the field ([`ConfigError`]).
//! - [`cost`]: parameter counts, weight and KV-cache bytes, HBM bytes per decode step.
//! - [`report`]: a human-readable summary ([`ModelSpec::report`]).
//! - [`weights`]: [`weights::Weights`], the tensors under their Hugging Face names, seeded
//!   random init and safetensors reading/writing.
//! - [`quant`]: int8 / fp8 (128x128 blocks) / int4 weights, their packing, quantization at
//!   load and Hugging Face block-scaled FP8 checkpoints ([`quant::QuantizedWeights`]).
//! - [`tolerance`]: THE logits tolerance (`max |got - ref| <= 2^-6 * max |ref|`) every
//!   comparison of logits cites.
//! - [`mod@reference`]: [`reference::Reference`], THE reference forward pass (plain Rust, f32 or
//!   rounding to bf16 where transformers' bf16 model does) with a KV cache and greedy
//!   [`reference::Reference::generate`]; checked against transformers in
//!   `tests/hf_conformance.rs`. `run --check` compares the megakernel with it.
//! - [`moe`]: the mixture-of-experts math of that forward pass, the only copy: routing
//!   ([`moe::route`], the [`RouterScoring`] as data), the SwiGLU experts and their combine
//!   ([`moe::moe_ffn`], the bf16 rounding points as data, [`moe::FfnRounding`]). The kernel
//!   library's MoE references (`palladium_kernels::moe_reference`) call it with the kernels'
//!   rounding convention.

pub mod cost;
mod error;
mod json;
pub mod mla;
pub mod moe;
mod parse;
pub mod quant;
pub mod reference;
pub mod report;
pub mod spec;
pub use palladium_array::tolerance;
pub mod weights;

pub use cost::{DecodeTraffic, LayerParams, ModelParams, expected_distinct_experts};
pub use error::ConfigError;
pub use spec::{
    Activation, AttentionForm, AttentionKind, AttentionSpec, Dtype, Family, FfnKind, LayerSpec,
    LmHead, MlaSpec, MlpSpec, ModelSpec, MoeSpec, NormKind, NormSpec, QkNorm, Quantization,
    RopeScaling, RopeSpec, RopeStyle, RouterScoring, Routing, SharedExpert, TopKWeights,
};
