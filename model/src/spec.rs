//! The typed model description: one [`ModelSpec`] per `config.json`, with every per-layer
//! choice spelled out in [`LayerSpec`] and every family convention spelled out as a field, so
//! the planner reads facts instead of re-deriving them from the family name.

use indexmap::IndexMap;
use serde::Serialize;

/// The model families this crate reads, by Hugging Face `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Family {
    /// `"qwen3_moe"`: Qwen3-30B-A3B, Qwen3-235B-A22B (`modeling_qwen3_moe.py`).
    Qwen3Moe,
    /// `"mixtral"`: Mixtral-8x7B, Mixtral-8x22B (`modeling_mixtral.py`).
    Mixtral,
    /// `"deepseek_v3"`: DeepSeek-V3, R1, Kimi-K2 (`modeling_deepseek_v3.py`): MLA attention.
    DeepseekV3,
    /// `"deepseek_v2"`: DeepSeek-V2, V2-Lite (`modeling_deepseek_v2.py`): MLA attention with
    /// complex-number RoPE.
    DeepseekV2,
    /// `"qwen2_moe"`: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B (`modeling_qwen2_moe.py`): a shared
    /// expert with a sigmoid gate next to the routed ones, q/k/v biases.
    Qwen2Moe,
    /// `"glm4_moe"`: GLM-4.5, GLM-4.5-Air (`modeling_glm4_moe.py`): `DeepSeek`-V3's MoE
    /// block (sigmoid routing with a correction bias and expert groups, ungated shared
    /// experts, dense first layers), partial rotary, attention biases, optional q/k norm.
    Glm4Moe,
    /// `"olmoe"`: `OLMoE-1B-7B` (`modeling_olmoe.py`): q/k RMS norms over the whole q and k
    /// projections, `clip_qkv`.
    Olmoe,
    /// `"gpt_oss"`: gpt-oss-20b, gpt-oss-120b (`modeling_gpt_oss.py`): sliding-window layers
    /// alternating with full ones, attention sinks, biases everywhere, a clamped SwiGLU over
    /// interleaved gate/up columns, experts stored fused (and as MXFP4 codes as shipped).
    GptOss,
    /// `"llama4_text"` (and the multimodal `"llama4"` through its `text_config`): Llama 4
    /// Scout and Maverick (`modeling_llama4.py`): a top-1 sigmoid router scaling the expert's
    /// input, an always-on shared expert, dense layers between MoE ones, `NoPE` layers with
    /// attention temperature tuning, chunked attention and an L2 q/k norm on the RoPE layers.
    Llama4,
    /// `"granitemoe"`: IBM Granite 3.x MoE (`modeling_granitemoe.py`): multipliers on the
    /// embedding, the residual branches, the attention scores and the logits; experts stored
    /// fused `[experts, out, in]`.
    GraniteMoe,
    /// `"ernie4_5_moe"`: Baidu ERNIE-4.5 MoE (`modeling_ernie4_5_moe.py`): a softmax router in
    /// f32 with a correction bias choosing the experts, shared experts, dense layers outside
    /// `moe_layer_start_index..=moe_layer_end_index`, RoPE over interleaved pairs in f32.
    Ernie45Moe,
    /// `"phimoe"`: Phi-3.5-MoE (`modeling_phimoe.py`): `LayerNorms` with bias, attention and
    /// `lm_head` biases, the `sparsemixer` top-2 router, `LongRoPE`.
    Phimoe,
    /// `"hunyuan_v1_moe"`: Tencent Hunyuan-A13B (`modeling_hunyuan_v1_moe.py`): per-head q/k
    /// RMS norms AFTER RoPE, an f32 softmax router, an always-on shared MLP, RoPE's base
    /// raised by the NTK `alpha`.
    HunyuanMoe,
    /// `"dbrx"`: Databricks DBRX (`modeling_dbrx.py`): its own config layout (`d_model`,
    /// `attn_config`, `ffn_config`), `LayerNorms` without bias, one fused `Wqkv` clipped at
    /// `clip_qkv`, experts stacked by rows (`w1`, `v1`, `w2`).
    Dbrx,
}

impl Family {
    /// Every supported `model_type` value, in the order error messages list them. `kimi_k2`
    /// is Kimi-K2's own spelling of the DeepSeek-V3 architecture (its `architectures` is
    /// `DeepseekV3ForCausalLM`; its model card has engines read it as `deepseek_v3`).
    pub const MODEL_TYPES: &'static [&'static str] = &[
        "qwen3_moe",
        "mixtral",
        "deepseek_v3",
        "kimi_k2",
        "deepseek_v2",
        "qwen2_moe",
        "glm4_moe",
        "olmoe",
        "gpt_oss",
        "llama4_text",
        "llama4",
        "granitemoe",
        "ernie4_5_moe",
        "phimoe",
        "hunyuan_v1_moe",
        "dbrx",
    ];

    /// The `model_type` string Hugging Face uses.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Qwen3Moe => "qwen3_moe",
            Self::Mixtral => "mixtral",
            Self::DeepseekV3 => "deepseek_v3",
            Self::DeepseekV2 => "deepseek_v2",
            Self::Qwen2Moe => "qwen2_moe",
            Self::Glm4Moe => "glm4_moe",
            Self::Olmoe => "olmoe",
            Self::GptOss => "gpt_oss",
            Self::Llama4 => "llama4_text",
            Self::GraniteMoe => "granitemoe",
            Self::Ernie45Moe => "ernie4_5_moe",
            Self::Phimoe => "phimoe",
            Self::HunyuanMoe => "hunyuan_v1_moe",
            Self::Dbrx => "dbrx",
        }
    }

    /// Whether the checkpoint stores the routed experts fused, one tensor per matrix for all
    /// experts (`crate::weights::ExpertNames::Fused`), not a module per expert.
    pub fn experts_fused(self) -> bool {
        matches!(self, Self::GptOss | Self::Llama4 | Self::GraniteMoe | Self::Dbrx)
    }

    /// The causal-LM class named in `architectures`.
    pub fn causal_lm_class(self) -> &'static str {
        match self {
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
            Self::Mixtral => "MixtralForCausalLM",
            Self::DeepseekV3 => "DeepseekV3ForCausalLM",
            Self::DeepseekV2 => "DeepseekV2ForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
            Self::Glm4Moe => "Glm4MoeForCausalLM",
            Self::Olmoe => "OlmoeForCausalLM",
            Self::GptOss => "GptOssForCausalLM",
            Self::Llama4 => "Llama4ForCausalLM",
            Self::GraniteMoe => "GraniteMoeForCausalLM",
            Self::Ernie45Moe => "Ernie4_5_MoeForCausalLM",
            Self::Phimoe => "PhimoeForCausalLM",
            Self::HunyuanMoe => "HunYuanMoEV1ForCausalLM",
            Self::Dbrx => "DbrxForCausalLM",
        }
    }

    /// Another spelling of the causal-LM class that checkpoints ship: Phi-3.5-MoE's
    /// `config.json` names its remote-code class `PhiMoEForCausalLM`, which transformers maps
    /// to `PhimoeForCausalLM`.
    pub fn shipped_class_alias(self) -> Option<&'static str> {
        match self {
            Self::Phimoe => Some("PhiMoEForCausalLM"),
            _ => None,
        }
    }
}

/// Declared weight dtype (`torch_dtype` in transformers 4.x, `dtype` in 5.x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Dtype {
    BFloat16,
    Float16,
    Float32,
}

impl Dtype {
    /// Values accepted in the config, as Hugging Face spells them.
    pub const SUPPORTED: &'static str = "bfloat16, float16, float32";

    pub fn bytes(self) -> u64 {
        match self {
            Self::BFloat16 | Self::Float16 => 2,
            Self::Float32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::BFloat16 => "bfloat16",
            Self::Float16 => "float16",
            Self::Float32 => "float32",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "bfloat16" => Some(Self::BFloat16),
            "float16" => Some(Self::Float16),
            "float32" => Some(Self::Float32),
            _ => None,
        }
    }
}

/// A whole decoder-only MoE model, as the megakernel planner needs it.
///
/// Layout of one decode step (both families, pre-norm residual blocks):
/// `x = embed[token]`; per layer `x += attn(rmsnorm(x))`, `x += ffn(rmsnorm(x))`;
/// then `logits = lm_head(rmsnorm(x))`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub family: Family,
    /// `hidden_size`: width of the residual stream.
    pub hidden_size: u64,
    /// `vocab_size`: rows of the embedding and of `lm_head`.
    pub vocab_size: u64,
    /// `max_position_embeddings`: the longest context the RoPE tables must cover.
    pub max_position_embeddings: u64,
    /// Declared weight dtype; `None` when the config names none (Hugging Face then loads float32).
    pub dtype: Option<Dtype>,
    /// Shapes and conventions shared by the attention of every layer.
    pub attention: AttentionSpec,
    /// The normalisation used for the two per-layer norms and the final norm.
    pub norm: NormSpec,
    /// The expert / dense MLP form (activation and gating).
    pub mlp: MlpSpec,
    /// How `lm_head` relates to the embedding (`tie_word_embeddings`).
    pub lm_head: LmHead,
    /// One entry per decoder layer, in order; `layers[i].index == i`.
    pub layers: Vec<LayerSpec>,
    /// `quantization_config`: how the checkpoint's weights are stored when they are not in
    /// [`ModelSpec::dtype`] (read by [`crate::quant::QuantizedWeights::load`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// Optional fields that were absent from the config and took the family's Hugging Face
    /// default, with the value used: field name → value.
    pub defaulted: IndexMap<&'static str, String>,
    /// What the checkpoint puts before every tensor name of the text model: empty, or
    /// `"language_model."` for a multimodal checkpoint read through its `text_config`
    /// (Llama 4's `Llama4ForConditionalGeneration`), whose vision tensors are skipped.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub checkpoint_prefix: &'static str,
    /// A bias on `lm_head` (Phi-3.5-MoE's `lm_head_bias`); left out of the serialized spec
    /// when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lm_head_bias: bool,
    /// Granite's scalars on the residual stream (1 elsewhere; left out of the serialized spec
    /// then).
    #[serde(skip_serializing_if = "Multipliers::is_identity")]
    pub multipliers: Multipliers,
}

/// Granite's `embedding_multiplier`, `residual_multiplier` and `logits_scaling`: the
/// embedding rows are multiplied by the first, each residual branch's output (attention, FFN)
/// by the second before it is added, and the logits divided by the third.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Multipliers {
    pub embedding: f64,
    pub residual: f64,
    pub logits_divisor: f64,
}

impl Multipliers {
    pub const IDENTITY: Multipliers =
        Multipliers { embedding: 1.0, residual: 1.0, logits_divisor: 1.0 };

    pub fn is_identity(&self) -> bool {
        *self == Self::IDENTITY
    }
}

/// A checkpoint's `quantization_config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Quantization {
    /// `quant_method: "fp8"` (transformers' `FineGrainedFP8Config`, the layout of Qwen3-*-FP8
    /// and DeepSeek-V3): every `nn.Linear` weight no entry of `modules_to_not_convert` names is
    /// stored as `float8_e4m3fn [out, in]` with `weight_scale_inv [ceil(out/b0), ceil(in/b1)]`
    /// (`weight_block_size = [b0, b1]`); `W = Wq * scale` over each tile. Activations are not
    /// quantized here (weight-only, W8A16: `activation_scheme: "dynamic"` quantizes them per
    /// token on GPUs; on TPU they stay bf16).
    Fp8Block {
        /// `weight_block_size`: `[out, in]` extent of the tile one scale covers.
        weight_block_size: [u64; 2],
        /// `modules_to_not_convert` (default `["lm_head"]`, transformers' default): module
        /// names matched as substrings of a weight's module path, as transformers matches them.
        modules_to_not_convert: Vec<String>,
    },
    /// `quant_method: "mxfp4"` (transformers' `Mxfp4Config`, gpt-oss as shipped): the fused
    /// expert matrices `gate_up_proj` / `down_proj` are stored as `<name>_blocks`
    /// (`u8 [experts, out, in / 32, 16]`, two e2m1 codes a byte, low nibble first) and
    /// `<name>_scales` (`u8 [experts, out, in / 32]`, e8m0: `2^(s - 127)` per 32 inputs);
    /// every other weight is plain. [`crate::weights::Weights::load`] decodes them as
    /// transformers' `convert_moe_packed_tensors` does.
    Mxfp4 {
        /// `modules_to_not_convert`, as shipped (`*` patterns; the experts never among them).
        modules_to_not_convert: Vec<String>,
    },
}

impl Quantization {
    /// A one-line description for messages and reports.
    pub fn describe(&self) -> String {
        match self {
            Self::Fp8Block { weight_block_size: [bo, bi], modules_to_not_convert } => format!(
                "quant_method \"fp8\": float8_e4m3fn weights with {bo}x{bi} block scales, {} module name(s) not converted",
                modules_to_not_convert.len()
            ),
            Self::Mxfp4 { .. } => {
                "quant_method \"mxfp4\": the experts as e2m1 codes with an e8m0 scale per 32 inputs"
                    .to_string()
            }
        }
    }

    /// Whether the linear weight `tensor` (`<module>.weight`) is stored quantized.
    pub fn converts(&self, tensor: &str) -> bool {
        match self {
            Self::Mxfp4 { .. } => {
                tensor.ends_with(".experts.gate_up_proj") || tensor.ends_with(".experts.down_proj")
            }
            Self::Fp8Block { modules_to_not_convert, .. } => {
                let module = tensor.strip_suffix(".weight").unwrap_or(tensor);
                !modules_to_not_convert.iter().any(|m| module.contains(m.as_str()))
            }
        }
    }
}

/// Attention settings common to all layers (the per-layer part is [`AttentionKind`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionSpec {
    /// `num_attention_heads`.
    pub num_heads: u64,
    /// `num_key_value_heads` (grouped-query attention: `num_heads / num_kv_heads` query heads
    /// share one K/V head; MLA: `num_heads`, the heads `kv_b_proj` expands the latent to).
    pub num_kv_heads: u64,
    /// `head_dim`, or `hidden_size / num_attention_heads` when absent (MLA: the query/key
    /// head, `qk_nope_head_dim + qk_rope_head_dim`).
    pub head_dim: u64,
    /// Softmax scale `head_dim^-0.5` (`self.scaling`; DeepSeek-V3 with YaRN's `mscale_all_dim`
    /// multiplies it by `yarn_get_mscale(factor, mscale_all_dim)^2`).
    pub scale: f64,
    /// Bias on `q_proj`, `k_proj`, `v_proj` (`attention_bias`; Qwen2-MoE: `qkv_bias`, default
    /// true; Mixtral: never).
    pub qkv_bias: bool,
    /// Bias on `o_proj` (Qwen3-MoE: `attention_bias`; Qwen2-MoE, Mixtral: never).
    pub o_bias: bool,
    /// Normalisation of q and k before RoPE.
    pub qk_norm: QkNorm,
    /// `OLMoE`'s `clip_qkv`: q and k (after their norms) and v clamped to `[-c, c]` before
    /// RoPE; `None` elsewhere.
    pub clip_qkv: Option<f64>,
    pub rope: RopeSpec,
    /// gpt-oss: a learned logit per query head (`self_attn.sinks`, `[num_heads]`) joins the
    /// head's softmax as one more column and is dropped after it, so the probabilities over
    /// the positions sum to less than 1 (left out of the serialized spec when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sinks: bool,
    /// How q, k and v come from the hidden state (left out of the serialized spec for GQA,
    /// so the existing families' reports read as before).
    #[serde(skip_serializing_if = "AttentionForm::is_gqa")]
    pub form: AttentionForm,
}

/// The projections of the attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AttentionForm {
    /// `q_proj`, `k_proj`, `v_proj`: `num_kv_heads` K/V heads of `head_dim` each.
    Gqa,
    /// Multi-head latent attention (DeepSeek-V2/V3).
    Mla(MlaSpec),
}

impl AttentionForm {
    pub fn is_gqa(&self) -> bool {
        matches!(self, Self::Gqa)
    }
}

/// Multi-head latent attention (`DeepseekV3Attention`): the query comes from `q_proj`, or
/// through the low-rank `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`; `kv_a_proj_with_mqa`
/// gives a `kv_lora_rank` latent (normalised by `kv_a_layernorm`) and one rope key of
/// `qk_rope_head_dim` shared by all heads; `kv_b_proj` expands the latent to every head's
/// `qk_nope_head_dim` key part and `v_head_dim` value. A query/key head is
/// `[nope | rope]`; RoPE applies to the rope part only ([`RopeSpec::rotary_dim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MlaSpec {
    /// `q_lora_rank`; `None` (JSON `null`) when the query is one `q_proj`.
    pub q_lora_rank: Option<u64>,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

impl MlaSpec {
    /// Values one position caches per layer in the absorbed form: the latent and the rope
    /// key (576 for DeepSeek-V3).
    pub fn latent_cache_width(&self) -> u64 {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

impl AttentionSpec {
    /// Query heads per K/V head.
    pub fn group_size(&self) -> u64 {
        self.num_heads / self.num_kv_heads
    }
}

/// Whether q and k are normalised before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum QkNorm {
    /// Mixtral, Qwen2-MoE: q and k go straight from the projections to RoPE.
    None,
    /// Qwen3-MoE: `q_norm` / `k_norm` are RMS norms over each head's `head_dim` values (weight
    /// shape `[head_dim]`, shared by all heads, same `eps` as the layer norms), applied after
    /// the projection is viewed as `[.., heads, head_dim]` and before RoPE
    /// (`modeling_qwen3_moe.py`, `Qwen3MoeAttention.forward`).
    PerHeadRms { weight_len: u64 },
    /// Hunyuan (`query_layernorm` / `key_layernorm`): as [`Self::PerHeadRms`], but AFTER RoPE.
    PerHeadRmsAfterRope { weight_len: u64 },
    /// `OLMoE`: `q_norm` / `k_norm` are RMS norms over the whole q projection (`[heads *
    /// head_dim]`) and the whole k projection (`[kv_heads * head_dim]`), before the view as
    /// heads (`OlmoeAttention.forward`).
    WholeRms { q_len: u64, k_len: u64 },
    /// Llama 4 (`Llama4TextL2Norm`, `use_qk_norm`): each head of q and k divided by its RMS
    /// (no weight, `rms_norm_eps`), AFTER RoPE, on the RoPE layers only.
    L2AfterRope,
}

/// Rotary position embedding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RopeSpec {
    /// Base frequency: `rope_theta` (4.x) or `rope_parameters.rope_theta` (5.x).
    pub theta: f64,
    /// `"default"`, or `"yarn"` (the DeepSeek families).
    pub scaling: RopeScaling,
    pub style: RopeStyle,
    /// Number of rotated dimensions per head (`head_dim`; MLA: `qk_rope_head_dim`, the rope
    /// part of each head).
    pub rotary_dim: u64,
}

/// RoPE frequency scaling (`rope_type`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum RopeScaling {
    /// `inv_freq[i] = theta^(-2i/rotary_dim)`, no position scaling, attention factor 1.
    Default,
    /// YaRN (`_compute_yarn_parameters` in `modeling_rope_utils.py`): the inverse frequencies
    /// blend `theta^(-2i/d)` (extrapolation) with `theta^(-2i/d) / factor` (interpolation)
    /// along a linear ramp between the correction dimensions of `beta_fast` and `beta_slow`
    /// rotations over `original_max_position_embeddings`; `cos` and `sin` are multiplied by
    /// `attention_factor`.
    Yarn {
        factor: f64,
        /// `original_max_position_embeddings`, or `max_position_embeddings` when absent.
        original_max_position_embeddings: u64,
        /// Default 32.
        beta_fast: f64,
        /// Default 1.
        beta_slow: f64,
        /// `mscale` (optional in the config; 0 when absent, as transformers' falsy test).
        mscale: f64,
        /// `mscale_all_dim` (0 when absent).
        mscale_all_dim: f64,
        /// The factor on `cos`/`sin`: `attention_factor` if given, else
        /// `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both are
        /// non-zero, else `get_mscale(factor)`.
        attention_factor: f64,
        /// `truncate` (default true): floor/ceil the correction range.
        truncate: bool,
    },
    /// Llama 3's (and Llama 4's) frequency bands.
    Llama3(Llama3Scaling),
    /// `rope_type: "longrope"` as Phi-3.5-MoE runs it (`PhimoeRotaryEmbedding` with
    /// `_compute_longrope_parameters`): `inv_freq[i] = 1 / (ext[i] * theta^(2i/d))`, `ext` the
    /// short factors while the sequence (the last position + 1 of the forward call) is at
    /// most `original_max_position_embeddings`, the long factors past it; `cos`/`sin` times
    /// `short_mscale` / `long_mscale` likewise.
    LongRope(LongRope),
    /// Hunyuan's `rope_scaling: {"type": "dynamic", "alpha": a}`
    /// (`HunYuanMoEV1RotaryEmbedding`): the default frequencies of the base `theta *
    /// alpha^(d / (d - 2))` (`d` = `head_dim`, Python floats), `cos`/`sin` unscaled. Dynamic NTK
    /// would recompute them past `max_position_embeddings`, where no position goes.
    NtkAlpha { alpha: f64 },
}

/// The parameters of [`RopeScaling::LongRope`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LongRope {
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    pub short_mscale: f64,
    pub long_mscale: f64,
    pub original_max_position_embeddings: u64,
}

/// `rope_type: "llama3"` (`_compute_llama3_parameters`): wavelengths longer than
/// `original_max_position_embeddings / low_freq_factor` divided by `factor`, shorter than
/// `.. / high_freq_factor` kept, a linear blend between; `cos`/`sin` unscaled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: u64,
}

impl RopeScaling {
    /// The base the frequencies are powers of: `theta`, raised by Hunyuan's NTK `alpha`
    /// ([`Self::NtkAlpha`]) in Python floats.
    pub fn base(&self, theta: f64, rotary_dim: u64) -> f64 {
        match *self {
            Self::NtkAlpha { alpha } => {
                theta * alpha.powf(rotary_dim as f64 / (rotary_dim as f64 - 2.0))
            }
            _ => theta,
        }
    }

    /// The RoPE inverse frequencies of `rotary_dim` rotated dimensions, in f32 as
    /// transformers computes them, and the factor on `cos`/`sin`, for a forward call over a
    /// sequence of `seq_len` positions (only `LongRoPE` depends on it).
    pub fn inv_freq(&self, theta: f64, rotary_dim: u64, seq_len: u64) -> (Vec<f32>, f32) {
        let d = rotary_dim as usize;
        let theta = self.base(theta, rotary_dim);
        // `base ** (torch.arange(0, dim, 2).float() / dim)`, all f32.
        let pos_freqs: Vec<f32> =
            (0..d / 2).map(|i| (theta as f32).powf((2 * i) as f32 / d as f32)).collect();
        match self {
            Self::Default | Self::NtkAlpha { .. } => {
                (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0)
            }
            Self::LongRope(l) => {
                let long = seq_len > l.original_max_position_embeddings;
                let (ext, mscale) = match long {
                    true => (&l.long_factor, l.long_mscale),
                    false => (&l.short_factor, l.short_mscale),
                };
                let inv = ext.iter().zip(&pos_freqs).map(|(&e, &p)| 1.0 / (e as f32 * p)).collect();
                (inv, mscale as f32)
            }
            &Self::Llama3(l) => {
                // f32 tensor ops with Python-float scalars (cast to f32), as transformers.
                let (factor, low, high) =
                    (l.factor as f32, l.low_freq_factor as f32, l.high_freq_factor as f32);
                let old = l.original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let inv = pos_freqs
                    .iter()
                    .map(|p| {
                        let inv = 1.0 / p;
                        let wavelen = (2.0 * std::f32::consts::PI) / inv;
                        let scaled = if wavelen > low_wavelen { inv / factor } else { inv };
                        let smooth = (old / wavelen - low) / (high - low);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // `~(wavelen < high) * ~(wavelen > low)`: NaN-free here, so between.
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium { smoothed } else { scaled }
                    })
                    .collect();
                (inv, 1.0)
            }
            &Self::Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
                ..
            } => {
                // find_correction_dim / find_correction_range, in Python floats (f64).
                let dim = d as f64;
                let correction = |rot: f64| {
                    dim * (orig as f64 / (rot * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                let (low, high) = (low as f32, high as f32);
                let inv = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let interp = 1.0 / (factor as f32 * p);
                        interp * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                    })
                    .collect();
                (inv, attention_factor as f32)
            }
        }
    }
}

/// transformers' `yarn_get_mscale` / `get_mscale`: `0.1 * mscale * ln(scale) + 1`, 1 for
/// `scale <= 1`.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 }
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RopeStyle {
    /// GPT-NeoX style: dimension `i` rotates with `i + rotary_dim/2`
    /// (`rotate_half(x) = cat(-x2, x1)`, `x*cos + rotate_half(x)*sin`, with
    /// `cos = cat(cos(f), cos(f))`); both families, `apply_rotary_pos_emb`.
    NeoxRotateHalf,
    /// DeepSeek-V3 with `rope_interleave: true` (`apply_rotary_pos_emb_interleave`): the
    /// rotated dimensions are first de-interleaved (`view(d/2, 2).transpose`: evens, then
    /// odds) and then rotated as [`Self::NeoxRotateHalf`], so dimensions `2i`, `2i+1` rotate
    /// together and the result holds them at `i`, `i + d/2`.
    DeinterleaveRotateHalf,
    /// DeepSeek-V2 (`apply_rotary_emb`): dimensions `2i`, `2i+1` are one complex number
    /// multiplied by `e^(i pos f_i)` in float32 (cos and sin never rounded), the product
    /// rounded once and left in place.
    ComplexPairs,
}

/// The normalisation layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NormSpec {
    /// `rms_norm_eps`.
    pub eps: f64,
    pub kind: NormKind,
}

/// Form of a normalisation layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NormKind {
    /// `w * (x / sqrt(mean(x^2) + eps))`, computed in float32 and cast back before the weight
    /// multiply; the weight has no `+1` offset (`Qwen3MoeRMSNorm`, `MixtralRMSNorm`).
    Rms,
    /// `w * (x / sqrt(mean(x^2) + eps))` all in float32, cast back once after the weight
    /// multiply (`GptOssRMSNorm`, whose weights transformers keeps in float32 in a bf16 model:
    /// `_keep_in_fp32_modules`).
    RmsF32Weight,
    /// `nn.LayerNorm`: `(x - mean(x)) / sqrt(var(x) + eps) * w (+ b)`, the biased variance;
    /// torch computes a bf16 `LayerNorm` in float32 and rounds once, after the bias.
    /// Phi-3.5-MoE: with bias (`input_layernorm.bias`, ..., `model.norm.bias`).
    Layer { bias: bool },
}

/// The MLP form used by experts, shared experts and dense layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MlpSpec {
    pub activation: Activation,
    /// Gated MLP: `down(act(gate(x)) * up(x))`. Qwen3-MoE names the matrices
    /// `gate_proj` / `up_proj` / `down_proj`; Mixtral checkpoints `w1` / `w3` / `w2`.
    pub gated: bool,
    /// Biases on gate, up and down (gpt-oss's experts: `gate_up_proj_bias`,
    /// `down_proj_bias`); left out of the serialized spec when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bias: bool,
}

/// The gated MLP's activation (`hidden_act`, or the family's own).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Activation {
    /// `silu(gate) * up`, `silu(x) = x * sigmoid(x)`.
    Silu,
    /// gpt-oss (`GptOssExperts`): `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)`; transformers 4.57 fixes `alpha` 1.702 and
    /// `limit` 7.0 (`swiglu_limit`).
    ClampedSwiGlu { alpha: f64, limit: f64 },
}

/// `tie_word_embeddings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LmHead {
    /// `lm_head.weight` is its own `[vocab, hidden]` matrix (both real Qwen3-MoE configs, Mixtral).
    Untied,
    /// `lm_head` reuses `embed_tokens.weight`.
    Tied,
}

/// One decoder layer: which attention and which FFN.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerSpec {
    pub index: usize,
    pub attention: AttentionKind,
    pub ffn: FfnKind,
    /// How the layer knows positions: RoPE, or not at all (Llama 4's `NoPE` layers); left out
    /// of the serialized spec for RoPE.
    #[serde(skip_serializing_if = "Positions::is_rope")]
    pub positions: Positions,
}

/// A layer's position encoding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Positions {
    /// RoPE on q and k (the model's [`RopeSpec`]).
    Rope,
    /// No position encoding (Llama 4's `no_rope_layers` entries 0); with attention temperature
    /// tuning, q is multiplied by `log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1`.
    NoPe { temperature: Option<TemperatureTuning> },
}

impl Positions {
    pub fn is_rope(&self) -> bool {
        matches!(self, Self::Rope)
    }
}

/// Llama 4's `attn_temperature_tuning` (`floor_scale`, `attn_scale`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TemperatureTuning {
    pub floor_scale: f64,
    pub attn_scale: f64,
}

/// Attention span of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AttentionKind {
    /// Causal attention over the whole context.
    Full,
    /// Causal attention over the last `window` positions (the current one included).
    Sliding { window: u64 },
    /// Causal attention within the position's chunk of `chunk` positions (Llama 4's
    /// `attention_chunk_size`): position `p` sees `chunk * floor(p / chunk) ..= p`.
    Chunked { chunk: u64 },
}

impl AttentionKind {
    /// How many cached positions this layer reads at context length `context`.
    pub fn span(self, context: u64) -> u64 {
        match self {
            Self::Full => context,
            Self::Sliding { window } => context.min(window),
            Self::Chunked { chunk } => context.min(chunk),
        }
    }
}

/// Feed-forward part of one layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum FfnKind {
    /// A single gated MLP with this intermediate size (`mlp_only_layers`, `decoder_sparse_step`,
    /// and later DeepSeek-style `first_k_dense_replace`).
    Dense { intermediate: u64 },
    /// A routed mixture of experts.
    Moe(MoeSpec),
}

/// A mixture-of-experts FFN.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSpec {
    /// Routed experts (`num_experts` / `num_local_experts`).
    pub num_experts: u64,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: u64,
    /// Intermediate size of each routed expert (Qwen3-MoE: `moe_intermediate_size`;
    /// Mixtral: `intermediate_size`).
    pub intermediate: u64,
    pub routing: Routing,
    /// An always-on expert added to the routed output (Qwen2-MoE's `shared_expert`).
    pub shared: Option<SharedExpert>,
}

/// How router logits become expert weights ([`crate::moe::route`] computes it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Routing {
    /// `gate`: a `[hidden] -> [num_experts]` linear layer without bias (every family so far).
    pub router_bias: bool,
    pub scoring: RouterScoring,
    pub top_k_weights: TopKWeights,
    /// `DeepSeek`-V3 style (`topk_method: "noaux_tc"`; GLM-4.5): the checkpoint tensor
    /// `mlp.gate.e_score_correction_bias` (`[num_experts]`) is added to the scores to
    /// *choose* the experts (and the groups); the weights are the unbiased scores.
    pub correction_bias: bool,
    /// Group-limited choice (`n_group`, `topk_group`); `None` for one group.
    pub groups: Option<ExpertGroups>,
    /// `routed_scaling_factor`: the top-k weights (after any renormalisation) are multiplied
    /// by it; 1 where the family has none.
    pub scaling: f64,
    /// How precisely the router module computes, beyond the activations' dtype.
    pub precision: RouterPrecision,
    /// Where a chosen expert's weight applies (left out of the serialized spec for the
    /// output, every family but Llama 4).
    #[serde(skip_serializing_if = "ExpertWeighting::is_output")]
    pub weighting: ExpertWeighting,
    /// Phi-3.5-MoE's `sparsemixer` (`router_jitter_noise`, its `jitter_eps`), replacing the
    /// plain softmax top-k ([`crate::moe::sparse_mixer`]); left out of the serialized spec
    /// when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_mixer: Option<SparseMixer>,
}

/// Phi-3.5-MoE's top-2 router at inference (`sparsemixer` with `training=False`): the best
/// expert, weighted by its softmax among the logits within `2 * jitter_eps` of it
/// (relative: `(max - s) / max(|s|, max) <= 2 * jitter_eps`); then the best other expert,
/// weighted likewise among the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SparseMixer {
    /// `router_jitter_noise`.
    pub jitter_eps: f64,
}

/// Where the routing weight multiplies a chosen expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ExpertWeighting {
    /// `w * expert(x)`, the weighted outputs summed.
    Output,
    /// Llama 4 (`Llama4TextMoe`): `expert(w * x)`, the outputs summed in f32 and rounded
    /// once (`sum(dim=0)` over every expert's, zero for the unchosen).
    Input,
}

impl ExpertWeighting {
    pub fn is_output(&self) -> bool {
        matches!(self, Self::Output)
    }
}

impl Routing {
    /// Plain top-k routing (Qwen, Mixtral): no correction bias, one group, no scaling.
    pub fn top_k(scoring: RouterScoring, top_k_weights: TopKWeights) -> Routing {
        Routing {
            router_bias: false,
            scoring,
            top_k_weights,
            correction_bias: false,
            groups: None,
            scaling: 1.0,
            precision: RouterPrecision::Activations,
            weighting: ExpertWeighting::Output,
            sparse_mixer: None,
        }
    }
}

/// Group-limited top-k (`DeepSeek`-V3's `noaux_tc`, `DeepSeek`-V2's `group_limited_greedy`):
/// the experts fall into `groups` consecutive groups of equal size, each group scored by
/// `score`; the `chosen_groups` best groups are kept, every other expert's choice score set
/// to 0 (not minus infinity, as transformers' `masked_fill(..., 0.0)` does); then the top-k.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExpertGroups {
    /// `n_group`.
    pub groups: u64,
    /// `topk_group`.
    pub chosen_groups: u64,
    pub score: GroupScore,
}

/// How a group of experts is scored for the group-limited choice ([`ExpertGroups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GroupScore {
    /// The sum of its two best (biased) choice scores: `DeepSeek`-V3 (`topk(2).sum`), GLM-4.5;
    /// groups of at least two experts.
    TopTwoSum,
    /// Its best score: `DeepSeek`-V2's `group_limited_greedy` (`max(dim=-1)`).
    Max,
}

/// Where the MoE block of the bf16 model computes in f32 beyond the activations' dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RouterPrecision {
    /// The router's logits in the activations' dtype (`nn.Linear`), the weighted expert
    /// outputs summed in it (Qwen, Mixtral: `index_add_` into a bf16 buffer).
    Activations,
    /// `DeepSeek`-V3 / GLM-4.5: the router casts its input and weight to f32 (`F.linear`
    /// in f32, logits never rounded), the weights stay f32 and the weighted expert outputs
    /// are summed in an f32 buffer, rounded to the activations' dtype once.
    F32,
    /// ERNIE-4.5: the router in f32 as [`Self::F32`] (its gate kept in f32), but the weights
    /// cast to the activations' dtype and the weighted outputs summed in it (`index_add_`
    /// into a bf16 buffer), as [`Self::Activations`].
    F32Logits,
}

/// Scoring of router logits, before the top-k choice ([`crate::moe::route`] computes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RouterScoring {
    /// Softmax over all experts in float32, then top-k of the probabilities (both families).
    Softmax,
    /// An elementwise sigmoid of each logit, then top-k of those (`DeepSeek`-V3 style:
    /// GLM-4.5; the kernels' `moe_router` offers it).
    Sigmoid,
}

/// What happens to the top-k probabilities before they weight the expert outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TopKWeights {
    /// Divided by their sum. Equivalent to a softmax over the k selected logits. Mixtral always;
    /// Qwen3-MoE when `norm_topk_prob` is true (both real Qwen3 configs).
    Renormalized,
    /// Used as they are (they sum to less than 1): Qwen3-MoE with `norm_topk_prob: false`.
    Raw,
}

/// An always-active expert next to the routed ones (Qwen2-MoE / `DeepSeek` style): a gated
/// MLP of its own on the same normed input, its output added to the routed experts' sum
/// ([`crate::moe::add_shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SharedExpert {
    /// Total intermediate size of the shared expert(s).
    pub intermediate: u64,
    /// Qwen2-MoE scales the shared output by `sigmoid(shared_expert_gate(x))`, a `[hidden] -> 1`
    /// linear layer; `DeepSeek` and GLM-4.5 add it ungated (`n_shared_experts` experts of
    /// `moe_intermediate_size` as one MLP).
    pub sigmoid_gate: bool,
}
