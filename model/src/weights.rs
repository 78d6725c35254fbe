//! Model weights keyed by the family's Hugging Face tensor names, with the shapes a
//! [`ModelSpec`] implies, a seeded random initialisation, and safetensors reading and writing.
//!
//! Tensor names and shapes ([`tensor_layout`]) follow the checkpoints on the Hugging Face hub
//! (`nn.Linear` weights are `[out_features, in_features]`):
//!
//! | tensor | shape |
//! |---|---|
//! | `model.embed_tokens.weight` | `[vocab, hidden]` |
//! | `model.layers.{i}.input_layernorm.weight` | `[hidden]` |
//! | `model.layers.{i}.self_attn.q_proj.weight` (`.bias` with `attention_bias`) | `[heads*head_dim, hidden]` |
//! | `model.layers.{i}.self_attn.{k,v}_proj.weight` (`.bias` with `attention_bias`) | `[kv_heads*head_dim, hidden]` |
//! | `model.layers.{i}.self_attn.o_proj.weight` (`.bias`: Qwen3-MoE with `attention_bias`) | `[hidden, heads*head_dim]` |
//! | `model.layers.{i}.self_attn.{q,k}_norm.weight` (Qwen3-MoE; GLM-4.5 with `use_qk_norm`) | `[head_dim]` |
//! | `OLMoE`: `model.layers.{i}.self_attn.q_norm.weight`, `k_norm.weight` | `[heads*head_dim]`, `[kv_heads*head_dim]` |
//! | `model.layers.{i}.post_attention_layernorm.weight` | `[hidden]` |
//! | Qwen3-MoE / Qwen2-MoE MoE layer: `model.layers.{i}.mlp.gate.weight` (router) | `[experts, hidden]` |
//! | Qwen3-MoE: `model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight` | `[moe_intermediate, hidden]` |
//! | Qwen3-MoE: `model.layers.{i}.mlp.experts.{e}.down_proj.weight` | `[hidden, moe_intermediate]` |
//! | Qwen3-MoE dense layer (`mlp_only_layers`): `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | as above with `intermediate_size` |
//! | Qwen2-MoE MoE layer: `model.layers.{i}.mlp.shared_expert.{gate,up}_proj.weight` | `[shared_expert_intermediate, hidden]` |
//! | Qwen2-MoE: `model.layers.{i}.mlp.shared_expert.down_proj.weight` | `[hidden, shared_expert_intermediate]` |
//! | Qwen2-MoE: `model.layers.{i}.mlp.shared_expert_gate.weight` | `[1, hidden]` |
//! | GLM-4.5 MoE layer (`>= first_k_dense_replace`): `model.layers.{i}.mlp.gate.weight`, `.e_score_correction_bias` | `[experts, hidden]`, `[experts]` |
//! | GLM-4.5: `model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight` | as an expert's, intermediate `n_shared_experts * moe_intermediate` |
//! | GLM-4.5 dense layer (`< first_k_dense_replace`): `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | as above with `intermediate_size` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.gate.weight` (router) | `[experts, hidden]` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3}.weight` (gate, up) | `[intermediate, hidden]` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight` (down) | `[hidden, intermediate]` |
//! | DeepSeek MLA, `q_lora_rank` set: `model.layers.{i}.self_attn.q_a_proj.weight` | `[q_lora_rank, hidden]` |
//! | DeepSeek: `model.layers.{i}.self_attn.q_a_layernorm.weight` | `[q_lora_rank]` |
//! | DeepSeek: `model.layers.{i}.self_attn.q_b_proj.weight` (`q_proj.weight` when `q_lora_rank` is null: `[heads*qk_head_dim, hidden]`) | `[heads*qk_head_dim, q_lora_rank]` |
//! | DeepSeek: `model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight` | `[kv_lora_rank + qk_rope_head_dim, hidden]` |
//! | DeepSeek: `model.layers.{i}.self_attn.kv_a_layernorm.weight` | `[kv_lora_rank]` |
//! | DeepSeek: `model.layers.{i}.self_attn.kv_b_proj.weight` (per head `qk_nope_head_dim` key rows, then `v_head_dim` value rows) | `[heads*(qk_nope_head_dim + v_head_dim), kv_lora_rank]` |
//! | DeepSeek: `model.layers.{i}.self_attn.o_proj.weight` | `[hidden, heads*v_head_dim]` |
//! | DeepSeek dense layer: `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | as Qwen3-MoE's dense layer |
//! | gpt-oss: `model.layers.{i}.self_attn.sinks` | `[heads]` |
//! | gpt-oss: `model.layers.{i}.mlp.router.weight`, `.bias` | `[experts, hidden]`, `[experts]` |
//! | gpt-oss: `model.layers.{i}.mlp.experts.gate_up_proj` (`x @ W`; gate, up interleaved by column) | `[experts, hidden, 2*intermediate]` |
//! | gpt-oss: `model.layers.{i}.mlp.experts.gate_up_proj_bias` | `[experts, 2*intermediate]` |
//! | gpt-oss: `model.layers.{i}.mlp.experts.down_proj`, `.down_proj_bias` | `[experts, intermediate, hidden]`, `[experts, hidden]` |
//! | Llama 4: `model.layers.{i}.feed_forward.router.weight` | `[experts, hidden]` |
//! | Llama 4: `model.layers.{i}.feed_forward.experts.gate_up_proj` (`x @ W`; gate then up) | `[experts, hidden, 2*intermediate]` |
//! | Llama 4: `model.layers.{i}.feed_forward.experts.down_proj` | `[experts, intermediate, hidden]` |
//! | Llama 4: `model.layers.{i}.feed_forward.shared_expert.{gate,up,down}_proj.weight` | as an expert's |
//! | Llama 4 dense layer: `model.layers.{i}.feed_forward.{gate,up,down}_proj.weight` | `intermediate_size_mlp` |
//! | ERNIE-4.5 MoE layer: `model.layers.{i}.mlp.gate.weight`, `mlp.moe_statics.e_score_correction_bias` | `[experts, hidden]`, `[1, experts]` |
//! | DeepSeek MoE layer: as GLM-4.5's (router, `experts.{e}`, `shared_experts`); DeepSeek-V2's router has no `e_score_correction_bias` | as GLM-4.5's |
//! | `model.norm.weight` | `[hidden]` |
//! | `lm_head.weight` (absent when `tie_word_embeddings`) | `[vocab, hidden]` |
//! | Phi-3.5-MoE: `input_layernorm.bias`, `post_attention_layernorm.bias`, `model.norm.bias`; `lm_head.bias` with `lm_head_bias`; experts as Mixtral's (`block_sparse_moe.experts.{e}.w1/w2/w3`) | `[hidden]`; `[vocab]` |
//!
//! Values are held as `f32`. Random weights and weights read from a bf16 file are exactly
//! bf16-representable; weights read from an f32 file keep their f32 values (the reference
//! rounds them to bf16 when it runs in bf16, as transformers does when it loads in bf16).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use half::f16;
use indexmap::IndexMap;
use palladium_array::{bf16_to_f32, f32_to_bf16, round_bf16};
use safetensors::{Dtype as StDtype, tensor::TensorView};
use thiserror::Error;

use crate::moe::Layout;
use crate::spec::{
    AttentionForm, Family, FfnKind, LmHead, ModelSpec, NormKind, QkNorm, Quantization,
};

/// Why weights could not be built, read or written. Every variant about a tensor names it.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum WeightsError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: String, message: String },
    #[error("{path}: missing tensor \"{name}\" (expected shape {expected:?})")]
    Missing { path: String, name: String, expected: Vec<usize> },
    #[error("{path}: tensor \"{name}\": shape {found:?}, expected {expected:?}")]
    Shape { path: String, name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{path}: tensor \"{name}\": unsupported dtype {dtype} (supported: BF16, F16, F32)")]
    Dtype { path: String, name: String, dtype: String },
    #[error(
        "{path}: unexpected tensor \"{name}\": not part of a {family} model with this config (wrong config.json?)"
    )]
    Unexpected { path: String, name: String, family: &'static str },
    #[error("{path}: tensor \"{name}\": {message}")]
    Header { path: String, name: String, message: String },
    #[error(
        "{path}: tensor \"{name}\": non-finite value {value} at index {index:?}: a checkpoint must hold finite weights"
    )]
    NonFinite { path: String, name: String, index: Vec<usize>, value: f32 },
    #[error("{path}: tensor \"{name}\" appears in more than one file")]
    Duplicate { path: String, name: String },
    /// A sharded checkpoint's `model.safetensors.index.json` disagrees with its shards.
    #[error("{index}: tensor \"{name}\": {message}")]
    Index { index: String, name: String, message: String },
    #[error("unsupported model feature for weights: {what}")]
    Unsupported { what: String },
}

impl WeightsError {
    /// The tensor the error is about, if any.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            Self::Missing { name, .. }
            | Self::Shape { name, .. }
            | Self::Dtype { name, .. }
            | Self::Unexpected { name, .. }
            | Self::Header { name, .. }
            | Self::NonFinite { name, .. }
            | Self::Duplicate { name, .. }
            | Self::Index { name, .. } => Some(name),
            _ => None,
        }
    }
}

fn io_err(path: &Path, e: impl fmt::Display) -> WeightsError {
    WeightsError::Io { path: path.display().to_string(), message: e.to_string() }
}

/// How a tensor is initialised by [`Weights::random`] (and what it is).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorRole {
    /// Embedding rows: standard deviation 1, so the residual stream starts at O(1).
    Embedding,
    /// `[out, in]` linear weight (fused experts: `[experts, in, out]`): standard deviation
    /// `1/sqrt(in)`, so outputs stay O(1).
    Linear,
    /// Fused experts stored `[experts, out, in]` (Granite): as [`Self::Linear`].
    ExpertsOutIn,
    /// Experts' rows stacked `[experts * inputs, out]` in `x @ W` form (DBRX's `w2`): as
    /// [`Self::Linear`] over `inputs`.
    StackedInOut { inputs: usize },
    /// Bias: standard deviation 0.1.
    Bias,
    /// RMSNorm scale: uniform in `[0.8, 1.2]` (never zero, not all equal).
    Norm,
    /// A learned logit (gpt-oss's attention sinks): standard deviation 1, the scale of the
    /// attention scores it competes with.
    Logit,
}

/// One tensor of a model: Hugging Face name, shape, role.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

/// The names of one layer's tensors (what [`tensor_layout`] lists, per layer).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNames {
    /// What every name of the layer starts with (`model.layers.{i}.`,
    /// `transformer.blocks.{i}.`).
    pub prefix: String,
    pub input_norm: String,
    /// The `LayerNorms`' biases (Phi-3.5-MoE): `input_layernorm.bias`.
    pub input_norm_bias: Option<String>,
    /// The projections that make q, k and v.
    pub qkv: QkvNames,
    pub o: String,
    pub o_bias: Option<String>,
    /// gpt-oss's `self_attn.sinks`.
    pub sinks: Option<String>,
    pub post_norm: String,
    /// `post_attention_layernorm.bias` (Phi-3.5-MoE).
    pub post_norm_bias: Option<String>,
    pub ffn: FfnNames,
}

impl LayerNames {
    /// The q/k/v names of a grouped-query attention layer with a matrix each.
    pub fn gqa(&self) -> Option<&GqaNames> {
        match &self.qkv {
            QkvNames::Gqa(g) => Some(g),
            QkvNames::Mla(_) | QkvNames::Fused { .. } => None,
        }
    }
}

/// One layer's q/k/v projections, by [`crate::spec::AttentionForm`].
#[derive(Debug, Clone, PartialEq)]
pub enum QkvNames {
    Gqa(GqaNames),
    Mla(MlaNames),
    /// DBRX's `Wqkv`: q, k and v stacked by rows in one `[(heads + 2 * kv_heads) * head_dim,
    /// hidden]` matrix, in that order, no bias.
    Fused {
        qkv: String,
    },
}

/// `q_proj`, `k_proj`, `v_proj`, their biases and the q/k norms.
#[derive(Debug, Clone, PartialEq)]
pub struct GqaNames {
    pub q: String,
    pub k: String,
    pub v: String,
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub q_norm: Option<String>,
    pub k_norm: Option<String>,
}

/// Multi-head latent attention's tensors, as DeepSeek ships them.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaNames {
    pub query: MlaQueryNames,
    /// `kv_a_proj_with_mqa`: `[kv_lora_rank + qk_rope_head_dim, hidden]`.
    pub kv_a: String,
    /// `kv_a_layernorm`: `[kv_lora_rank]`.
    pub kv_a_norm: String,
    /// `kv_b_proj`: `[heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]`.
    pub kv_b: String,
}

/// How MLA's query is projected.
#[derive(Debug, Clone, PartialEq)]
pub enum MlaQueryNames {
    /// `q_lora_rank: null`: `q_proj`, `[heads * qk_head_dim, hidden]`.
    Direct { q: String },
    /// `q_a_proj` `[q_lora_rank, hidden]`, `q_a_layernorm` `[q_lora_rank]`, `q_b_proj`
    /// `[heads * qk_head_dim, q_lora_rank]`.
    LowRank { q_a: String, q_a_norm: String, q_b: String },
}

impl MlaNames {
    /// The linear weights, in checkpoint order.
    pub fn linears(&self) -> Vec<&String> {
        let mut out = match &self.query {
            MlaQueryNames::Direct { q } => vec![q],
            MlaQueryNames::LowRank { q_a, q_b, .. } => vec![q_a, q_b],
        };
        out.extend([&self.kv_a, &self.kv_b]);
        out
    }
}

/// The names of one layer's FFN tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum FfnNames {
    Dense(MlpNames),
    Moe {
        router: String,
        router_bias: Option<String>,
        /// `DeepSeek`-V3-style routing's `e_score_correction_bias` (`[experts]`).
        correction_bias: Option<String>,
        experts: ExpertNames,
        shared: Option<SharedNames>,
    },
}

/// Where gate and up sit among a fused `gate_up` tensor's `2 * intermediate` columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateUpColumns {
    /// gpt-oss: alternate columns (`gate_up[..., ::2]`, `gate_up[..., 1::2]`).
    Interleaved,
    /// Llama 4, Granite: the first half gate, the second up (`chunk(2, dim=-1)`).
    Halves,
}

/// How a checkpoint stores the routed experts.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpertNames {
    /// A module per expert, three `[out, in]` matrices each (`experts.{e}.gate_proj.weight`).
    PerExpert(Vec<MlpNames>),
    /// Every expert in one tensor per matrix, `x @ W` layout (gpt-oss).
    Fused(FusedExperts),
    /// DBRX (`DbrxExpertGLU`'s `w1`, `v1`, `w2`): every expert's rows stacked in one 2-D
    /// tensor per matrix, `[experts * intermediate, hidden]` each; expert `e`'s gate and up
    /// are rows `e * I .. (e + 1) * I` of `gate` and `up` (`[out, in]`), its down projection
    /// the same rows of `down` in `x @ W` form (`[in, out]`).
    Stacked { gate: String, up: String, down: String },
}

impl ExpertNames {
    /// The per-expert modules; `None` where the experts are stored fused.
    pub fn per_expert(&self) -> Option<&[MlpNames]> {
        match self {
            Self::PerExpert(m) => Some(m),
            Self::Fused(_) | Self::Stacked { .. } => None,
        }
    }
}

/// Fused expert tensors: with [`Layout::InOut`] (`GptOssExperts`, `Llama4TextExperts`)
/// `gate_up` `[experts, hidden, 2 * intermediate]` and `down` `[experts, intermediate,
/// hidden]`; with [`Layout::OutIn`] (`GraniteMoeParallelExperts`: `input_linear`,
/// `output_linear`) `[experts, 2 * intermediate, hidden]` and `[experts, hidden,
/// intermediate]`; biases `[experts, 2 * intermediate]` and `[experts, hidden]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedExperts {
    pub gate_up: String,
    /// How each expert's matrices are laid out.
    pub layout: Layout,
    pub gate_up_columns: GateUpColumns,
    pub gate_up_bias: Option<String>,
    pub down: String,
    pub down_bias: Option<String>,
}

/// A shared expert's tensors: its MLP, and the `[1, hidden]` gate of a sigmoid-gated one.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedNames {
    pub mlp: MlpNames,
    pub gate: Option<String>,
}

/// A gated MLP's three matrices: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpNames {
    pub gate: String,
    pub up: String,
    pub down: String,
}

/// Names of the whole model's tensors, structured.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelNames {
    pub embed: String,
    pub layers: Vec<LayerNames>,
    pub final_norm: String,
    /// `model.norm.bias` (Phi-3.5-MoE).
    pub final_norm_bias: Option<String>,
    /// `lm_head.weight`, or the embedding's name when tied.
    pub lm_head: String,
    /// `lm_head.bias` (Phi-3.5-MoE's `lm_head_bias`).
    pub lm_head_bias: Option<String>,
}

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

impl ModelNames {
    pub fn new(spec: &ModelSpec) -> Result<Self, WeightsError> {
        if spec.family == Family::Dbrx {
            return Ok(Self::dbrx(spec));
        }
        let mut layers = Vec::with_capacity(spec.layers.len());
        for layer in &spec.layers {
            let p = format!("{}model.layers.{}.", spec.checkpoint_prefix, layer.index);
            let a = |s: &str| format!("{p}self_attn.{s}");
            let qkv_bias = spec.attention.qkv_bias;
            // Llama 4's L2 norm has no weights.
            let qk_norm = !matches!(spec.attention.qk_norm, QkNorm::None | QkNorm::L2AfterRope);
            // Llama 4 calls the FFN `feed_forward`, the others `mlp`.
            let ffn_module = match spec.family {
                Family::Llama4 => "feed_forward",
                _ => "mlp",
            };
            let ffn = match (&layer.ffn, spec.family) {
                (
                    FfnKind::Dense { .. },
                    Family::Qwen3Moe
                    | Family::Qwen2Moe
                    | Family::Glm4Moe
                    | Family::DeepseekV3
                    | Family::DeepseekV2
                    | Family::Llama4
                    | Family::Ernie45Moe,
                ) => FfnNames::Dense(MlpNames {
                    gate: format!("{p}{ffn_module}.gate_proj.weight"),
                    up: format!("{p}{ffn_module}.up_proj.weight"),
                    down: format!("{p}{ffn_module}.down_proj.weight"),
                }),
                (
                    FfnKind::Dense { .. },
                    Family::Mixtral
                    | Family::Olmoe
                    | Family::GptOss
                    | Family::GraniteMoe
                    | Family::Phimoe
                    | Family::HunyuanMoe
                    | Family::Dbrx,
                ) => {
                    return Err(WeightsError::Unsupported {
                        what: format!(
                            "dense FFN in {} layer {}",
                            spec.family.model_type(),
                            layer.index
                        ),
                    });
                }
                (FfnKind::Moe(moe), family) => {
                    let block = match family {
                        Family::Qwen3Moe
                        | Family::Qwen2Moe
                        | Family::Glm4Moe
                        | Family::Olmoe
                        | Family::DeepseekV3
                        | Family::DeepseekV2
                        | Family::GptOss
                        | Family::Llama4
                        | Family::Ernie45Moe
                        | Family::HunyuanMoe => format!("{p}{ffn_module}."),
                        Family::Mixtral | Family::GraniteMoe | Family::Phimoe => {
                            format!("{p}block_sparse_moe.")
                        }
                        Family::Dbrx => unreachable!("named by ModelNames::dbrx"),
                    };
                    let per_expert = (0..moe.num_experts).map(|e| {
                        let x = format!("{block}experts.{e}.");
                        match family {
                            Family::Qwen3Moe
                            | Family::Qwen2Moe
                            | Family::Glm4Moe
                            | Family::Olmoe
                            | Family::DeepseekV3
                            | Family::DeepseekV2
                            | Family::Ernie45Moe
                            | Family::HunyuanMoe => MlpNames {
                                gate: format!("{x}gate_proj.weight"),
                                up: format!("{x}up_proj.weight"),
                                down: format!("{x}down_proj.weight"),
                            },
                            Family::Mixtral | Family::Phimoe => MlpNames {
                                gate: format!("{x}w1.weight"),
                                up: format!("{x}w3.weight"),
                                down: format!("{x}w2.weight"),
                            },
                            Family::GptOss | Family::Llama4 | Family::GraniteMoe | Family::Dbrx => {
                                unreachable!("their experts are named fused, below")
                            }
                        }
                    });
                    let bias = spec.mlp.bias;
                    let fused = |gate_up_columns| {
                        ExpertNames::Fused(FusedExperts {
                            gate_up: format!("{block}experts.gate_up_proj"),
                            layout: Layout::InOut,
                            gate_up_columns,
                            gate_up_bias: bias.then(|| format!("{block}experts.gate_up_proj_bias")),
                            down: format!("{block}experts.down_proj"),
                            down_bias: bias.then(|| format!("{block}experts.down_proj_bias")),
                        })
                    };
                    let experts = match family {
                        Family::GptOss => fused(GateUpColumns::Interleaved),
                        Family::Llama4 => fused(GateUpColumns::Halves),
                        Family::GraniteMoe => ExpertNames::Fused(FusedExperts {
                            gate_up: format!("{block}input_linear.weight"),
                            layout: Layout::OutIn,
                            gate_up_columns: GateUpColumns::Halves,
                            gate_up_bias: None,
                            down: format!("{block}output_linear.weight"),
                            down_bias: None,
                        }),
                        _ => {
                            debug_assert!(!family.experts_fused());
                            ExpertNames::PerExpert(per_expert.collect())
                        }
                    };
                    // gpt-oss and Llama 4 call the router `router`, Granite `router.layer`,
                    // Hunyuan `gate.wg`, the others `gate`.
                    let router = match family {
                        Family::GptOss | Family::Llama4 => format!("{block}router."),
                        Family::GraniteMoe => format!("{block}router.layer."),
                        Family::HunyuanMoe => format!("{block}gate.wg."),
                        _ => format!("{block}gate."),
                    };
                    // ERNIE keeps its correction bias in `moe_statics`, the others in the gate.
                    let correction_module = match family {
                        Family::Ernie45Moe => format!("{block}moe_statics."),
                        _ => router.clone(),
                    };
                    // Qwen2-MoE's `shared_expert` (and `shared_expert_gate`); GLM-4.5's (and
                    // `DeepSeek`'s) `shared_experts`, all of them one MLP; Hunyuan's
                    // `shared_mlp`.
                    let shared_module = match family {
                        Family::Qwen2Moe | Family::Llama4 => "shared_expert",
                        Family::HunyuanMoe => "shared_mlp",
                        _ => "shared_experts",
                    };
                    let shared = moe.shared.map(|s| SharedNames {
                        mlp: MlpNames {
                            gate: format!("{block}{shared_module}.gate_proj.weight"),
                            up: format!("{block}{shared_module}.up_proj.weight"),
                            down: format!("{block}{shared_module}.down_proj.weight"),
                        },
                        gate: s.sigmoid_gate.then(|| format!("{block}shared_expert_gate.weight")),
                    });
                    FfnNames::Moe {
                        router: format!("{router}weight"),
                        router_bias: moe.routing.router_bias.then(|| format!("{router}bias")),
                        correction_bias: moe
                            .routing
                            .correction_bias
                            .then(|| format!("{correction_module}e_score_correction_bias")),
                        experts,
                        shared,
                    }
                }
            };
            // Hunyuan names its q/k norms `query_layernorm` / `key_layernorm`.
            let norm_names = match spec.family {
                Family::HunyuanMoe => ("query_layernorm.weight", "key_layernorm.weight"),
                _ => ("q_norm.weight", "k_norm.weight"),
            };
            let qkv = match spec.attention.form {
                AttentionForm::Gqa => QkvNames::Gqa(GqaNames {
                    q: a("q_proj.weight"),
                    k: a("k_proj.weight"),
                    v: a("v_proj.weight"),
                    q_bias: qkv_bias.then(|| a("q_proj.bias")),
                    k_bias: qkv_bias.then(|| a("k_proj.bias")),
                    v_bias: qkv_bias.then(|| a("v_proj.bias")),
                    q_norm: qk_norm.then(|| a(norm_names.0)),
                    k_norm: qk_norm.then(|| a(norm_names.1)),
                }),
                AttentionForm::Mla(m) => QkvNames::Mla(MlaNames {
                    query: match m.q_lora_rank {
                        None => MlaQueryNames::Direct { q: a("q_proj.weight") },
                        Some(_) => MlaQueryNames::LowRank {
                            q_a: a("q_a_proj.weight"),
                            q_a_norm: a("q_a_layernorm.weight"),
                            q_b: a("q_b_proj.weight"),
                        },
                    },
                    kv_a: a("kv_a_proj_with_mqa.weight"),
                    kv_a_norm: a("kv_a_layernorm.weight"),
                    kv_b: a("kv_b_proj.weight"),
                }),
            };
            let norm_bias = matches!(spec.norm.kind, NormKind::Layer { bias: true });
            layers.push(LayerNames {
                prefix: p.clone(),
                input_norm: format!("{p}input_layernorm.weight"),
                input_norm_bias: norm_bias.then(|| format!("{p}input_layernorm.bias")),
                qkv,
                o: a("o_proj.weight"),
                o_bias: spec.attention.o_bias.then(|| a("o_proj.bias")),
                sinks: spec.attention.sinks.then(|| a("sinks")),
                post_norm: format!("{p}post_attention_layernorm.weight"),
                post_norm_bias: norm_bias.then(|| format!("{p}post_attention_layernorm.bias")),
                ffn,
            });
        }
        let prefix = spec.checkpoint_prefix;
        Ok(Self {
            embed: format!("{prefix}{EMBED}"),
            layers,
            final_norm: format!("{prefix}{FINAL_NORM}"),
            final_norm_bias: matches!(spec.norm.kind, NormKind::Layer { bias: true })
                .then(|| format!("{prefix}model.norm.bias")),
            lm_head: match spec.lm_head {
                LmHead::Untied => format!("{prefix}{LM_HEAD}"),
                LmHead::Tied => format!("{prefix}{EMBED}"),
            },
            lm_head_bias: spec.lm_head_bias.then(|| format!("{prefix}lm_head.bias")),
        })
    }
}

impl ModelNames {
    /// DBRX's names (`DbrxForCausalLM`): the model under `transformer.`, each layer a
    /// `blocks.{i}` of `norm_attn_norm` (`norm_1`, `attn.Wqkv`, `attn.out_proj`, `norm_2`:
    /// `LayerNorms` without bias) and `ffn` (`router.layer`, `experts.mlp.{w1,v1,w2}`).
    fn dbrx(spec: &ModelSpec) -> Self {
        let layers = spec
            .layers
            .iter()
            .map(|layer| {
                let p = format!("transformer.blocks.{}.", layer.index);
                let n = |s: &str| format!("{p}norm_attn_norm.{s}");
                let experts = |m: &str| format!("{p}ffn.experts.mlp.{m}");
                LayerNames {
                    prefix: p.clone(),
                    input_norm: n("norm_1.weight"),
                    input_norm_bias: None,
                    qkv: QkvNames::Fused { qkv: n("attn.Wqkv.weight") },
                    o: n("attn.out_proj.weight"),
                    o_bias: None,
                    sinks: None,
                    post_norm: n("norm_2.weight"),
                    post_norm_bias: None,
                    ffn: FfnNames::Moe {
                        router: format!("{p}ffn.router.layer.weight"),
                        router_bias: None,
                        correction_bias: None,
                        experts: ExpertNames::Stacked {
                            gate: experts("w1"),
                            up: experts("v1"),
                            down: experts("w2"),
                        },
                        shared: None,
                    },
                }
            })
            .collect();
        Self {
            embed: "transformer.wte.weight".into(),
            layers,
            final_norm: "transformer.norm_f.weight".into(),
            final_norm_bias: None,
            lm_head: LM_HEAD.into(),
            lm_head_bias: None,
        }
    }
}

/// Every tensor of the model described by `spec`, in checkpoint order (embedding, layers in
/// order, final norm, `lm_head`), with its Hugging Face name and shape.
pub fn tensor_layout(spec: &ModelSpec) -> Result<Vec<TensorSpec>, WeightsError> {
    let names = ModelNames::new(spec)?;
    let h = spec.hidden_size as usize;
    let vocab = spec.vocab_size as usize;
    let hd = spec.attention.head_dim as usize;
    let heads = spec.attention.num_heads as usize;
    let q_out = heads * hd;
    let kv_out = spec.attention.num_kv_heads as usize * hd;
    // The input width of o_proj: heads times the value head.
    let o_in = match spec.attention.form {
        AttentionForm::Gqa => q_out,
        AttentionForm::Mla(m) => heads * m.v_head_dim as usize,
    };
    let mut out = Vec::new();
    let mut t = |name: &str, shape: Vec<usize>, role| {
        out.push(TensorSpec { name: name.to_string(), shape, role });
    };
    use TensorRole::*;
    t(&names.embed, vec![vocab, h], Embedding);
    for (ln, layer) in names.layers.iter().zip(&spec.layers) {
        t(&ln.input_norm, vec![h], Norm);
        if let Some(b) = &ln.input_norm_bias {
            t(b, vec![h], Bias);
        }
        match (&ln.qkv, spec.attention.form) {
            (QkvNames::Gqa(g), _) => {
                t(&g.q, vec![q_out, h], Linear);
                if let Some(b) = &g.q_bias {
                    t(b, vec![q_out], Bias);
                }
                t(&g.k, vec![kv_out, h], Linear);
                if let Some(b) = &g.k_bias {
                    t(b, vec![kv_out], Bias);
                }
                t(&g.v, vec![kv_out, h], Linear);
                if let Some(b) = &g.v_bias {
                    t(b, vec![kv_out], Bias);
                }
            }
            (QkvNames::Mla(n), AttentionForm::Mla(m)) => {
                // `DeepseekV3Attention.__init__` order.
                match &n.query {
                    MlaQueryNames::Direct { q } => t(q, vec![q_out, h], Linear),
                    MlaQueryNames::LowRank { q_a, q_a_norm, q_b } => {
                        let r =
                            m.q_lora_rank.expect("LowRank names come from a q_lora_rank") as usize;
                        t(q_a, vec![r, h], Linear);
                        t(q_a_norm, vec![r], Norm);
                        t(q_b, vec![q_out, r], Linear);
                    }
                }
                let (lora, rope) = (m.kv_lora_rank as usize, m.qk_rope_head_dim as usize);
                t(&n.kv_a, vec![lora + rope, h], Linear);
                t(&n.kv_a_norm, vec![lora], Norm);
                let per_head = (m.qk_nope_head_dim + m.v_head_dim) as usize;
                t(&n.kv_b, vec![heads * per_head, lora], Linear);
            }
            (QkvNames::Fused { qkv }, AttentionForm::Gqa) => {
                t(qkv, vec![q_out + 2 * kv_out, h], Linear);
            }
            (QkvNames::Mla(_) | QkvNames::Fused { .. }, _) => {
                unreachable!("ModelNames follows the attention form")
            }
        }
        t(&ln.o, vec![h, o_in], Linear);
        if let Some(b) = &ln.o_bias {
            t(b, vec![h], Bias);
        }
        if let Some(s) = &ln.sinks {
            t(s, vec![heads], Logit);
        }
        if let Some(g) = ln.gqa() {
            let (q_norm, k_norm) = match spec.attention.qk_norm {
                QkNorm::WholeRms { q_len, k_len } => (q_len as usize, k_len as usize),
                QkNorm::None
                | QkNorm::PerHeadRms { .. }
                | QkNorm::PerHeadRmsAfterRope { .. }
                | QkNorm::L2AfterRope => (hd, hd),
            };
            if let Some(n) = &g.q_norm {
                t(n, vec![q_norm], Norm);
            }
            if let Some(n) = &g.k_norm {
                t(n, vec![k_norm], Norm);
            }
        }
        t(&ln.post_norm, vec![h], Norm);
        if let Some(b) = &ln.post_norm_bias {
            t(b, vec![h], Bias);
        }
        match (&ln.ffn, &layer.ffn) {
            (FfnNames::Dense(m), FfnKind::Dense { intermediate }) => {
                let inter = *intermediate as usize;
                t(&m.gate, vec![inter, h], Linear);
                t(&m.up, vec![inter, h], Linear);
                t(&m.down, vec![h, inter], Linear);
            }
            (
                FfnNames::Moe { router, router_bias, correction_bias, experts, shared },
                FfnKind::Moe(moe),
            ) => {
                // Router first, as Hugging Face lists `mlp.gate` before `mlp.experts`.
                let e = moe.num_experts as usize;
                let inter = moe.intermediate as usize;
                t(router, vec![e, h], Linear);
                if let Some(b) = router_bias {
                    t(b, vec![e], Bias);
                }
                if let Some(b) = correction_bias {
                    // ERNIE's `Ernie4_5_MoeStatics` holds it as `[1, experts]`.
                    let shape =
                        if spec.family == Family::Ernie45Moe { vec![1, e] } else { vec![e] };
                    t(b, shape, Bias);
                }
                match experts {
                    ExpertNames::PerExpert(experts) => {
                        for m in experts {
                            t(&m.gate, vec![inter, h], Linear);
                            t(&m.up, vec![inter, h], Linear);
                            t(&m.down, vec![h, inter], Linear);
                        }
                    }
                    // `GptOssExperts.__init__` order.
                    ExpertNames::Fused(f) => {
                        let matrix = |inputs, outputs| match f.layout {
                            Layout::InOut => (vec![e, inputs, outputs], Linear),
                            Layout::OutIn => (vec![e, outputs, inputs], ExpertsOutIn),
                        };
                        let (shape, role) = matrix(h, 2 * inter);
                        t(&f.gate_up, shape, role);
                        if let Some(b) = &f.gate_up_bias {
                            t(b, vec![e, 2 * inter], Bias);
                        }
                        let (shape, role) = matrix(inter, h);
                        t(&f.down, shape, role);
                        if let Some(b) = &f.down_bias {
                            t(b, vec![e, h], Bias);
                        }
                    }
                    // `DbrxExpertGLU.__init__` order; `w2`'s inputs are its rows.
                    ExpertNames::Stacked { gate, up, down } => {
                        t(gate, vec![e * inter, h], Linear);
                        t(up, vec![e * inter, h], Linear);
                        t(down, vec![e * inter, h], StackedInOut { inputs: inter });
                    }
                }
                if let (Some(names), Some(s)) = (shared, &moe.shared) {
                    let inter = s.intermediate as usize;
                    t(&names.mlp.gate, vec![inter, h], Linear);
                    t(&names.mlp.up, vec![inter, h], Linear);
                    t(&names.mlp.down, vec![h, inter], Linear);
                    if let Some(g) = &names.gate {
                        t(g, vec![1, h], Linear);
                    }
                }
            }
            _ => unreachable!("ModelNames follows the layer's FFN kind"),
        }
    }
    t(&names.final_norm, vec![h], Norm);
    if let Some(b) = &names.final_norm_bias {
        t(b, vec![h], Bias);
    }
    if spec.lm_head == LmHead::Untied {
        t(&names.lm_head, vec![vocab, h], Linear);
    }
    if let Some(b) = &names.lm_head_bias {
        t(b, vec![vocab], Bias);
    }
    Ok(out)
}

/// A checkpoint tensor outside [`tensor_layout`] that transformers skips on load too: a
/// tied model's `lm_head.weight`, the RoPE tables some checkpoints carry, and the
/// multi-token-prediction layer of GLM-4.5 and DeepSeek-V3, `model.layers.{num_hidden_layers}.*`
/// (`Glm4MoeForCausalLM` ignores `model.layers.46.*` and `.92.*`, the MTP layer of GLM-4.5-Air
/// and GLM-4.5; `DeepseekV3ForCausalLM` `model.layers.61.*`).
pub(crate) fn ignored_tensor(spec: &ModelSpec, name: &str) -> bool {
    let prefix = spec.checkpoint_prefix;
    let tied_head = spec.lm_head == LmHead::Tied && name == format!("{prefix}{LM_HEAD}");
    let mtp_layer = matches!(spec.family, Family::Glm4Moe | Family::DeepseekV3)
        && name.starts_with(&format!("model.layers.{}.", spec.layers.len()));
    // A multimodal checkpoint's other models (Llama 4's vision model and projector).
    let not_text = !prefix.is_empty() && !name.starts_with(prefix);
    tied_head || mtp_layer || not_text || name.ends_with("rotary_emb.inv_freq")
}

/// One MXFP4 tensor's two stored parts: `(file, shape, dtype, bytes)` each.
#[derive(Default)]
struct Mxfp4Parts<'a> {
    blocks: Option<(String, Vec<usize>, String, &'a [u8])>,
    scales: Option<(String, Vec<usize>, String, &'a [u8])>,
}

/// e2m1 code -> value (`FP4_VALUES` of transformers' `integrations/mxfp4.py`).
const E2M1: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `name` as `(<expected tensor>, "blocks" | "scales")` when it is a stored part of an
/// MXFP4-converted tensor.
fn mxfp4_part<'n>(
    name: &'n str,
    spec: &ModelSpec,
    expected: &HashMap<&str, &TensorSpec>,
) -> Option<(&'n str, &'static str)> {
    let q = spec.quantization.as_ref()?;
    [("_blocks", "blocks"), ("_scales", "scales")].into_iter().find_map(|(suffix, part)| {
        let base = name.strip_suffix(suffix)?;
        (expected.contains_key(base) && q.converts(base)).then_some((base, part))
    })
}

impl Mxfp4Parts<'_> {
    /// The `[experts, in, out]` tensor (`expected`) the parts encode, decoded as transformers'
    /// `convert_moe_packed_tensors`: value `[e, o, 32 g + 2 k (+ 1)]` is the low (high)
    /// nibble of `blocks[e, o, g, k]` times `2^(scales[e, o, g] - 127)`, then transposed.
    fn decode(
        self,
        base: &str,
        expected: &[usize],
        checkpoint: &str,
    ) -> Result<Tensor, WeightsError> {
        let missing = |part: &str, shape: Vec<usize>| WeightsError::Missing {
            path: checkpoint.to_string(),
            name: format!("{base}_{part}"),
            expected: shape,
        };
        let (e, inputs, outputs) = (expected[0], expected[1], expected[2]);
        let groups = inputs / 32;
        let blocks_shape = vec![e, outputs, groups, 16];
        let scales_shape = vec![e, outputs, groups];
        let (bf, bshape, bdtype, blocks) =
            self.blocks.ok_or_else(|| missing("blocks", blocks_shape.clone()))?;
        let (sf, sshape, sdtype, scales) =
            self.scales.ok_or_else(|| missing("scales", scales_shape.clone()))?;
        for (file, part, shape, dtype, want) in [
            (&bf, "blocks", &bshape, &bdtype, &blocks_shape),
            (&sf, "scales", &sshape, &sdtype, &scales_shape),
        ] {
            let name = format!("{base}_{part}");
            if !inputs.is_multiple_of(32) {
                return Err(WeightsError::Header {
                    path: file.clone(),
                    name,
                    message: format!("MXFP4 groups of 32 inputs do not divide {inputs} inputs"),
                });
            }
            if dtype != "U8" {
                return Err(WeightsError::Header {
                    path: file.clone(),
                    name,
                    message: format!("stored as {dtype}; MXFP4 {part} are U8"),
                });
            }
            if shape != want {
                return Err(WeightsError::Shape {
                    path: file.clone(),
                    name,
                    expected: want.clone(),
                    found: shape.clone(),
                });
            }
        }
        // e8m0's 0xFF is NaN.
        if let Some(i) = scales.iter().position(|&s| s == 0xFF) {
            return Err(WeightsError::NonFinite {
                path: sf,
                name: format!("{base}_scales"),
                index: unravel(i, &scales_shape),
                value: f32::NAN,
            });
        }
        let mut data = vec![0f32; e * inputs * outputs];
        for (row, (codes, &scale)) in blocks.chunks_exact(16).zip(scales).enumerate() {
            let (expert, o, g) = (row / (outputs * groups), row / groups % outputs, row % groups);
            // 2^(scale - 127) exactly: the f32 with that biased exponent (2^-127 subnormal).
            let factor = match scale {
                0 => f32::from_bits(1 << 22),
                s => f32::from_bits(u32::from(s) << 23),
            };
            for (k, &byte) in codes.iter().enumerate() {
                for (nibble, code) in [byte & 0x0F, byte >> 4].into_iter().enumerate() {
                    let i = 32 * g + 2 * k + nibble;
                    data[(expert * inputs + i) * outputs + o] = E2M1[code as usize] * factor;
                }
            }
        }
        Ok(Tensor { shape: expected.to_vec(), data })
    }
}

/// One tensor's values, row-major, as `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Rows `rows` of a 2-D tensor.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Tensor {
        let cols = self.shape[1];
        let data = self.data[rows.start * cols..rows.end * cols].to_vec();
        Tensor { shape: vec![rows.len(), cols], data }
    }

    /// A 2-D tensor transposed.
    pub fn transposed(&self) -> Tensor {
        let (r, c) = (self.shape[0], self.shape[1]);
        let data = (0..c).flat_map(|j| (0..r).map(move |i| self.data[i * c + j])).collect();
        Tensor { shape: vec![c, r], data }
    }

    /// Whether every value is exactly representable in bf16.
    pub fn is_bf16_valued(&self) -> bool {
        self.data.iter().all(|&x| round_bf16(x).to_bits() == x.to_bits() || x.is_nan())
    }

    /// A copy with every value rounded to the nearest bf16 (ties to even).
    pub fn to_bf16_valued(&self) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| round_bf16(x)).collect(),
        }
    }
}

/// Element type of a written safetensors file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveDtype {
    /// bf16 (round to nearest even); how the real checkpoints are stored.
    BFloat16,
    Float32,
}

/// All of a model's weights, keyed by Hugging Face tensor name, in checkpoint order; every
/// tensor of [`tensor_layout`] is present with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    family: Family,
    tensors: IndexMap<String, Tensor>,
}

/// `SplitMix64`: a small, fast, well-mixed generator, enough for test weights.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    fn uniform_pm1(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// FNV-1a, to give each tensor its own stream independent of the others' order and sizes.
fn fnv1a(s: &str) -> u64 {
    s.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3))
}

impl Weights {
    /// Seeded random weights, bf16-valued, scaled so activations stay O(1) (see
    /// [`TensorRole`]): uniform distributions with the role's standard deviation. Each tensor
    /// draws from its own stream (seed and name), so the same seed gives the same tensor for
    /// the same name and shape whatever else the model holds.
    pub fn random(spec: &ModelSpec, seed: u64) -> Result<Self, WeightsError> {
        let layout = tensor_layout(spec)?;
        let sqrt3 = 3f32.sqrt();
        let tensors = layout
            .into_iter()
            .map(|ts| {
                let mut rng = SplitMix64(seed ^ fnv1a(&ts.name).rotate_left(17));
                let n: usize = ts.shape.iter().product();
                let data = (0..n)
                    .map(|_| {
                        let u = rng.uniform_pm1();
                        let x = match ts.role {
                            TensorRole::Embedding => u * sqrt3,
                            // `[out, in]`, or fused experts' `[experts, in, out]`.
                            TensorRole::Linear => u * sqrt3 / (ts.shape[1] as f32).sqrt(),
                            TensorRole::ExpertsOutIn => u * sqrt3 / (ts.shape[2] as f32).sqrt(),
                            TensorRole::StackedInOut { inputs } => {
                                u * sqrt3 / (inputs as f32).sqrt()
                            }
                            TensorRole::Bias => u * sqrt3 * 0.1,
                            TensorRole::Norm => 1.0 + 0.2 * u,
                            TensorRole::Logit => u * sqrt3,
                        };
                        round_bf16(x)
                    })
                    .collect();
                (ts.name, Tensor { shape: ts.shape, data })
            })
            .collect();
        Ok(Self { family: spec.family, tensors })
    }

    /// Weights from tensors already checked against the model's layout (dequantized ones).
    pub(crate) fn from_tensors(family: Family, tensors: IndexMap<String, Tensor>) -> Self {
        Self { family, tensors }
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Mutable access (tests perturb single tensors); the shape must not change.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        self.tensors.get_mut(name).map(|t| t.data.as_mut_slice())
    }

    /// Tensors in checkpoint order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of parameters.
    pub fn num_params(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// Whether every value is exactly representable in bf16.
    pub fn is_bf16_valued(&self) -> bool {
        self.tensors.values().all(Tensor::is_bf16_valued)
    }

    /// Reads a checkpoint: a `.safetensors` file, or a directory holding
    /// `model.safetensors.index.json` (sharded, Hugging Face layout) or `*.safetensors` files.
    /// Every tensor of [`tensor_layout`] must be present with its shape, in BF16, F16 or F32;
    /// a tensor the model does not have is an error (it usually means the wrong config),
    /// except `lm_head.weight` of a tied model and `rotary_emb.inv_freq` buffers, which are
    /// ignored.
    pub fn load(spec: &ModelSpec, path: impl AsRef<Path>) -> Result<Self, WeightsError> {
        let buffers = read_checkpoint(path.as_ref())?;
        Self::from_safetensors(spec, &file_refs(&buffers))
    }

    /// [`Weights::load`] on bytes already in memory: one `(label, bytes)` pair per file.
    /// Every size in a header is checked against the file (errors name the tensor), and
    /// every value must be finite ([`WeightsError::NonFinite`] names the tensor and the first
    /// bad index).
    pub fn from_safetensors(
        spec: &ModelSpec,
        files: &[(&Path, &[u8])],
    ) -> Result<Self, WeightsError> {
        let mxfp4 = matches!(spec.quantization, Some(Quantization::Mxfp4 { .. }));
        if let Some(q) = spec.quantization.as_ref().filter(|_| !mxfp4) {
            return Err(WeightsError::Unsupported {
                what: format!(
                    "a quantized checkpoint (config.json's quantization_config: {}): not yet \
                     supported by the kernels (palladium_model::quant::QuantizedWeights reads it)",
                    q.describe()
                ),
            });
        }
        let layout = tensor_layout(spec)?;
        let expected: HashMap<&str, &TensorSpec> =
            layout.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut found: HashMap<String, (PathBuf, Tensor)> = HashMap::new();
        // MXFP4 experts: `<name>_blocks` / `<name>_scales` of an expected tensor, paired below.
        let mut mx_parts: HashMap<String, Mxfp4Parts<'_>> = HashMap::new();
        for (path, bytes) in files {
            let disp = path.display().to_string();
            for entry in read_header(&disp, bytes)? {
                if mxfp4 && let Some((base, part)) = mxfp4_part(&entry.name, spec, &expected) {
                    let parts = mx_parts.entry(base.to_string()).or_default();
                    let slot = if part == "blocks" { &mut parts.blocks } else { &mut parts.scales };
                    if slot.replace((disp.clone(), entry.shape, entry.dtype, entry.data)).is_some()
                    {
                        return Err(WeightsError::Duplicate { path: disp, name: entry.name });
                    }
                    continue;
                }
                let name = entry.name;
                let Some(ts) = expected.get(name.as_str()) else {
                    if ignored_tensor(spec, &name) {
                        continue;
                    }
                    return Err(WeightsError::Unexpected {
                        path: disp,
                        name,
                        family: spec.family.model_type(),
                    });
                };
                if entry.shape != ts.shape {
                    return Err(WeightsError::Shape {
                        path: disp,
                        name,
                        expected: ts.shape.clone(),
                        found: entry.shape,
                    });
                }
                let data = decode(&entry.dtype, entry.data).ok_or_else(|| WeightsError::Dtype {
                    path: disp.clone(),
                    name: name.clone(),
                    dtype: entry.dtype.to_string(),
                })?;
                if let Some(i) = data.iter().position(|x| !x.is_finite()) {
                    return Err(WeightsError::NonFinite {
                        path: disp,
                        name,
                        index: unravel(i, &ts.shape),
                        value: data[i],
                    });
                }
                let t = Tensor { shape: ts.shape.clone(), data };
                if found.insert(name.clone(), (path.to_path_buf(), t)).is_some() {
                    return Err(WeightsError::Duplicate { path: disp, name });
                }
            }
        }
        let where_ = match files {
            [(p, _)] => p.display().to_string(),
            _ => files
                .first()
                .and_then(|(p, _)| p.parent())
                .map_or_else(|| "checkpoint".into(), |d| d.display().to_string()),
        };
        for (base, parts) in mx_parts {
            let ts = expected[base.as_str()];
            let t = parts.decode(&base, &ts.shape, &where_)?;
            if found.insert(base.clone(), (PathBuf::from(&where_), t)).is_some() {
                return Err(WeightsError::Duplicate { path: where_, name: base });
            }
        }
        let mut tensors = IndexMap::with_capacity(layout.len());
        for ts in layout {
            let Some((_, t)) = found.remove(&ts.name) else {
                return Err(WeightsError::Missing {
                    path: where_,
                    name: ts.name,
                    expected: ts.shape,
                });
            };
            tensors.insert(ts.name, t);
        }
        Ok(Self { family: spec.family, tensors })
    }

    /// The safetensors bytes of these weights (metadata `format: pt`, as transformers needs).
    pub fn to_safetensors_bytes(&self, dtype: SaveDtype) -> Result<Vec<u8>, WeightsError> {
        let encoded: Vec<(&str, &Tensor, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(n, t)| {
                let bytes = match dtype {
                    SaveDtype::BFloat16 => {
                        t.data.iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect()
                    }
                    SaveDtype::Float32 => t.data.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                };
                (n.as_str(), t, bytes)
            })
            .collect();
        let st_dtype = match dtype {
            SaveDtype::BFloat16 => StDtype::BF16,
            SaveDtype::Float32 => StDtype::F32,
        };
        let fmt_err = |e: safetensors::SafeTensorError| WeightsError::Format {
            path: "<serialize>".into(),
            message: e.to_string(),
        };
        let mut views = BTreeMap::new();
        for (n, t, bytes) in &encoded {
            views.insert(
                n.to_string(),
                TensorView::new(st_dtype, t.shape.clone(), bytes).map_err(fmt_err)?,
            );
        }
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize(views, Some(meta)).map_err(fmt_err)
    }

    /// Writes one safetensors file. The bytes go to a temporary file next to `path` that is
    /// renamed over it once complete, so a failed save never leaves a half-written file.
    pub fn save(&self, path: impl AsRef<Path>, dtype: SaveDtype) -> Result<(), WeightsError> {
        let path = path.as_ref();
        let bytes = self.to_safetensors_bytes(dtype)?;
        let file_name =
            path.file_name().ok_or_else(|| io_err(path, "not a file path"))?.to_string_lossy();
        let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(path, e)
        })
    }
}

/// One tensor of a safetensors file: its header entry, with its data checked to lie in the
/// file and to hold exactly `shape` elements of `dtype`.
pub(crate) struct Entry<'a> {
    pub(crate) name: String,
    pub(crate) dtype: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: &'a [u8],
}

/// Bytes per element of a safetensors dtype (`None`: not one the format defines).
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// The header of a safetensors file (`u64` little-endian header length, a JSON object of
/// `name: {dtype, shape, data_offsets}`, then the data), every entry checked against the
/// bytes: a size that does not add up names its tensor.
pub(crate) fn read_header<'a>(path: &str, bytes: &'a [u8]) -> Result<Vec<Entry<'a>>, WeightsError> {
    let format = |message: String| WeightsError::Format { path: path.to_string(), message };
    if bytes.is_empty() {
        return Err(format("the file is empty".into()));
    }
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(format(format!(
            "{} bytes: too short for the 8-byte header length",
            bytes.len()
        )));
    };
    let header_len = u64::from_le_bytes(*len);
    if header_len > rest.len() as u64 {
        return Err(format(format!(
            "the header length {header_len} is past the end of the file ({} bytes after the length): truncated or not safetensors",
            rest.len()
        )));
    }
    let (text, data) = rest.split_at(header_len as usize);
    let header: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format(format!("the header is not JSON: {e}")))?;
    let map = header.as_object().ok_or_else(|| format("the header is not a JSON object".into()))?;
    if let Some(name) = repeated_key(text) {
        return Err(WeightsError::Header {
            path: path.to_string(),
            name,
            message: "a duplicate tensor name: the header lists it twice (a reader keeps one \
                      of the two silently)"
                .into(),
        });
    }
    let mut entries = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let bad = |message: String| WeightsError::Header {
            path: path.to_string(),
            name: name.clone(),
            message,
        };
        let dtype = v
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no \"dtype\" string".into()))?;
        let shape = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no \"shape\" array".into()))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad("\"shape\" is not a list of non-negative integers".into()))?;
        let offsets = v
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .and_then(|o| match o.as_slice() {
                [a, b] => Some((a.as_u64()?, b.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| bad("\"data_offsets\" is not [begin, end]".into()))?;
        let (begin, end) = offsets;
        if begin > end || end > data.len() as u64 {
            return Err(bad(format!(
                "data_offsets [{begin}, {end}] are outside the file's {} data bytes (truncated?)",
                data.len()
            )));
        }
        let elements = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("shape {shape:?} has more than 2^64 elements")))?;
        if let Some(size) = dtype_size(dtype) {
            let need = elements.checked_mul(size);
            if need != Some(end - begin) {
                return Err(bad(format!(
                    "shape {shape:?} of {dtype} needs {} bytes, data_offsets [{begin}, {end}] hold {}",
                    need.map_or_else(|| "more than 2^64".into(), |n| n.to_string()),
                    end - begin
                )));
            }
        }
        entries.push(Entry {
            name: name.clone(),
            dtype: dtype.to_string(),
            shape,
            data: &data[begin as usize..end as usize],
        });
    }
    // Tensors may not share bytes.
    let mut spans: Vec<(usize, usize, &str)> = entries
        .iter()
        .map(|e| {
            let begin = e.data.as_ptr() as usize - data.as_ptr() as usize;
            (begin, begin + e.data.len(), e.name.as_str())
        })
        .collect();
    spans.sort();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(WeightsError::Header {
            path: path.to_string(),
            name: w[1].2.to_string(),
            message: format!("its data overlaps tensor \"{}\"'s", w[0].2),
        });
    }
    Ok(entries)
}

/// The first key a JSON object's text repeats (`None` if none, or if the text is not an
/// object): `serde_json` keeps only the last of a repeated key.
fn repeated_key(object: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    struct FirstRepeat;
    impl<'de> Visitor<'de> for FirstRepeat {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            // Read to the end: serde_json fails a map left half-read.
            let (mut seen, mut first) = (std::collections::HashSet::new(), None);
            while let Some((key, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                if let Some(key) = seen.replace(key) {
                    first.get_or_insert(key);
                }
            }
            Ok(first)
        }
    }
    serde_json::Deserializer::from_slice(object).deserialize_map(FirstRepeat).ok().flatten()
}

/// The values of a tensor's bytes (`None` for a dtype other than BF16, F16, F32).
pub(crate) fn decode(dtype: &str, d: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        "BF16" => {
            d.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
        }
        "F16" => d.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        "F32" => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => return None,
    })
}

/// The multi-index of row-major element `i` of `shape`.
pub(crate) fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (slot, &d) in index.iter_mut().zip(shape).rev() {
        if d > 0 {
            *slot = i % d;
            i /= d;
        }
    }
    index
}

/// [`read_checkpoint`]'s files as the `(label, bytes)` pairs the `from_safetensors` readers take.
pub(crate) fn file_refs(buffers: &[(PathBuf, Vec<u8>)]) -> Vec<(&Path, &[u8])> {
    buffers.iter().map(|(p, b)| (p.as_path(), b.as_slice())).collect()
}

/// The bytes of every safetensors file of a checkpoint path ([`checkpoint_files`]); a
/// sharded checkpoint's index checked against its shards ([`ShardIndex::check`]).
pub(crate) fn read_checkpoint(path: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, WeightsError> {
    let (files, index) = checkpoint_files(path)?;
    let buffers = files
        .into_iter()
        .map(|f| match std::fs::read(&f) {
            Ok(bytes) => Ok((f, bytes)),
            Err(e) => Err(match &index {
                Some(index) => index.unreadable(&f, e),
                None => io_err(&f, e),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(index) = &index {
        index.check(&buffers)?;
    }
    Ok(buffers)
}

/// A sharded checkpoint's `model.safetensors.index.json`: the shard each tensor is said to
/// be in (`weight_map`, names as written, relative to `folder`).
struct ShardIndex {
    path: PathBuf,
    folder: PathBuf,
    weight_map: Vec<(String, String)>,
}

impl ShardIndex {
    fn error(&self, name: &str, message: String) -> WeightsError {
        WeightsError::Index { index: self.path.display().to_string(), name: name.into(), message }
    }

    /// The shard `file` (named by the index) cannot be read: named with a tensor mapped to it.
    fn unreadable(&self, file: &Path, e: std::io::Error) -> WeightsError {
        let mapped = self.weight_map.iter().filter(|(_, s)| self.folder.join(s) == file);
        let (name, shard) = mapped.clone().next().map_or(("", ""), |(n, s)| (n, s));
        let others = match mapped.count() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more tensors)"),
        };
        self.error(
            name,
            format!("weight_map puts it{others} in the shard {shard}, which cannot be read: {e}"),
        )
    }

    /// Every tensor of `weight_map` is in the shard it names, and every tensor of a shard
    /// is in `weight_map`, mapped to that shard: a disagreement is an error naming the
    /// tensor, the index and the shards (a reader trusting either side would load other
    /// weights than the index says, or miss some).
    fn check(&self, shards: &[(PathBuf, Vec<u8>)]) -> Result<(), WeightsError> {
        let shard_name =
            |file: &Path| file.strip_prefix(&self.folder).unwrap_or(file).display().to_string();
        let mut held: Vec<(String, String)> = Vec::new();
        let mut holder: HashMap<String, String> = HashMap::new();
        for (file, bytes) in shards {
            let (path, shard) = (file.display().to_string(), shard_name(file));
            for entry in read_header(&path, bytes)? {
                if holder.insert(entry.name.clone(), shard.clone()).is_some() {
                    return Err(WeightsError::Duplicate { path, name: entry.name });
                }
                held.push((entry.name, shard.clone()));
            }
        }
        let mapped: HashMap<&str, &str> =
            self.weight_map.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
        for (name, shard) in &self.weight_map {
            let shard = shard_name(&self.folder.join(shard));
            match holder.get(name) {
                Some(holder) if *holder == shard => {}
                Some(holder) => {
                    return Err(self.error(
                        name,
                        format!("weight_map puts it in the shard {shard}, but it is in {holder}"),
                    ));
                }
                None => {
                    return Err(self.error(
                        name,
                        format!(
                            "weight_map puts it in the shard {shard}, which does not hold it (nor does any other shard)"
                        ),
                    ));
                }
            }
        }
        if let Some((name, shard)) = held.iter().find(|(n, _)| !mapped.contains_key(n.as_str())) {
            return Err(self.error(
                name,
                format!("it is in the shard {shard}, but weight_map does not list it"),
            ));
        }
        Ok(())
    }
}

/// The safetensors files a checkpoint path names (see [`Weights::load`]): what a command
/// reads from it, so that no output of it lands on one of them.
pub fn checkpoint_paths(path: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    checkpoint_files(path).map(|(files, _)| files)
}

/// The safetensors files of a checkpoint path (see [`Weights::load`]), and the index of a
/// sharded one.
fn checkpoint_files(path: &Path) -> Result<(Vec<PathBuf>, Option<ShardIndex>), WeightsError> {
    if !path.is_dir() {
        if !path.exists() {
            return Err(io_err(path, "no such file or directory"));
        }
        return Ok((vec![path.to_path_buf()], None));
    }
    let index = path.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| io_err(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            WeightsError::Format { path: index.display().to_string(), message: e.to_string() }
        })?;
        let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
            WeightsError::Format {
                path: index.display().to_string(),
                message: "no \"weight_map\" object".into(),
            }
        })?;
        let mut files = Vec::with_capacity(map.len());
        let mut weight_map = Vec::with_capacity(map.len());
        for (tensor, f) in map {
            let bad = |why: &str| WeightsError::Format {
                path: index.display().to_string(),
                message: format!("weight_map[\"{tensor}\"] = {f}: {why}"),
            };
            let f = f.as_str().ok_or_else(|| bad("not a file name"))?;
            // A shard is a file inside the checkpoint folder: no absolute path, no `..`
            // (checked before anything is opened).
            let relative = Path::new(f);
            if f.is_empty()
                || !relative.components().all(|c| matches!(c, std::path::Component::Normal(_)))
            {
                return Err(bad("a shard must be a file inside the checkpoint folder"));
            }
            files.push(path.join(relative));
            weight_map.push((tensor.clone(), f.to_string()));
        }
        files.sort();
        files.dedup();
        let index = ShardIndex { path: index, folder: path.to_path_buf(), weight_map };
        return Ok((files, Some(index)));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| io_err(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(io_err(path, "no *.safetensors file in this directory"));
    }
    Ok((files, None))
}
