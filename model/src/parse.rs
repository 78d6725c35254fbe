//! `config.json` → [`ModelSpec`]: reading, the transformers 4.x / 5.x spellings, family rules
//! and consistency checks.
//!
//! Family rules follow the Hugging Face modeling code: `modeling_qwen3_moe.py` /
//! `configuration_qwen3_moe.py` and `modeling_mixtral.py` / `configuration_mixtral.py`
//! (transformers 4.51 as written by the Qwen3 checkpoints, and the 5.x dataclass configs).

use std::path::Path;

use indexmap::IndexMap;
use serde_json::Value;

use crate::error::ConfigError;
use crate::json::{Obj, describe};
use crate::spec::{
    Activation, AttentionForm, AttentionKind, AttentionSpec, Dtype, ExpertGroups, ExpertWeighting,
    Family, FfnKind, GroupScore, LayerSpec, Llama3Scaling, LmHead, LongRope, MlaSpec, MlpSpec,
    ModelSpec, MoeSpec, Multipliers, NormKind, NormSpec, Positions, QkNorm, Quantization,
    RopeScaling, RopeSpec, RopeStyle, RouterPrecision, RouterScoring, Routing, SharedExpert,
    SparseMixer, TemperatureTuning, TopKWeights, yarn_mscale,
};

impl ModelSpec {
    /// Reads and validates a `config.json` file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_json_str(&text).map_err(|e| ConfigError::InFile {
            path: path.display().to_string(),
            error: Box::new(e),
        })
    }

    /// Parses and validates the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Err(ConfigError::Json {
                message: "the file is empty (expected a Hugging Face config.json object)".into(),
            });
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::Json { message: format!("not JSON: {e}") })?;
        Self::from_json(&value)
    }

    /// Validates an already-parsed `config.json`.
    pub fn from_json(value: &Value) -> Result<Self, ConfigError> {
        let map = value.as_object().ok_or_else(|| ConfigError::Json {
            message: format!("not a JSON object: the top level is {}", describe(value)),
        })?;
        let top = Obj::new(map, "");
        if top.opt_str("model_type")? == Some("llama4") {
            return multimodal_llama4(&top);
        }
        Parser { obj: top, defaulted: IndexMap::new() }.model()
    }
}

/// Llama 4 as shipped (`model_type: "llama4"`, `Llama4ForConditionalGeneration`): the text
/// model is its `text_config` (a `llama4_text` config), its tensors under `language_model.`;
/// the vision model is not read (its tensors are skipped on load).
fn multimodal_llama4(top: &Obj<'_>) -> Result<ModelSpec, ConfigError> {
    const CLASS: &str = "Llama4ForConditionalGeneration";
    if let Some(archs) = top.opt_str_list("architectures")?
        && !archs.is_empty()
        && !archs.contains(&CLASS)
    {
        return Err(ConfigError::unsupported(
            "architectures",
            format!("{archs:?}"),
            format!("[\"{CLASS}\"] for model_type \"llama4\""),
        ));
    }
    if let Some(q) = top.get("quantization_config") {
        return Err(ConfigError::unsupported(
            "quantization_config",
            describe(q),
            "absent (a multimodal Llama 4 checkpoint is read in bf16 only so far)",
        ));
    }
    let text = top.opt_obj("text_config")?.ok_or_else(|| ConfigError::Missing {
        field: "text_config".into(),
        hint: " (model_type \"llama4\" describes its text model there)".into(),
    })?;
    let text = Obj::new(text, "text_config.");
    if let Some(t) = text.opt_str("model_type")?
        && t != "llama4_text"
    {
        return Err(ConfigError::unsupported(
            text.path("model_type"),
            format!("{t:?}"),
            "\"llama4_text\"",
        ));
    }
    let mut spec = Parser { obj: text, defaulted: IndexMap::new() }.model_of(Family::Llama4)?;
    // The dtype is the top level's when the text config names none.
    if spec.dtype.is_none() {
        let mut outer = Parser { obj: *top, defaulted: IndexMap::new() };
        spec.dtype = outer.dtype()?;
    }
    spec.checkpoint_prefix = "language_model.";
    Ok(spec)
}

/// Upper bound on `num_hidden_layers`: the spec holds one [`LayerSpec`] per layer, so the
/// general size cap (2^24) would let a config allocate gigabytes; real models have ~100.
const MAX_LAYERS: u64 = 1 << 16;

struct Parser<'a> {
    obj: Obj<'a>,
    defaulted: IndexMap<&'static str, String>,
}

/// Hugging Face defaults of optional fields, per family (the `*Config` class defaults).
struct Defaults {
    rms_norm_eps: f64,
}

impl Family {
    fn defaults(self) -> Defaults {
        match self {
            Self::Qwen3Moe => Defaults { rms_norm_eps: 1e-6 },
            Self::Mixtral => Defaults { rms_norm_eps: 1e-5 },
            Self::DeepseekV3 | Self::DeepseekV2 => Defaults { rms_norm_eps: 1e-6 },
            Self::Qwen2Moe => Defaults { rms_norm_eps: 1e-6 },
            Self::Glm4Moe => Defaults { rms_norm_eps: 1e-5 },
            Self::Olmoe => Defaults { rms_norm_eps: 1e-5 },
            Self::GptOss | Self::Llama4 => Defaults { rms_norm_eps: 1e-5 },
            Self::GraniteMoe => Defaults { rms_norm_eps: 1e-6 },
            Self::Ernie45Moe => Defaults { rms_norm_eps: 1e-5 },
            Self::Phimoe | Self::HunyuanMoe => Defaults { rms_norm_eps: 1e-5 },
            // `nn.LayerNorm`'s default; `DbrxConfig` has no eps field.
            Self::Dbrx => Defaults { rms_norm_eps: 1e-5 },
        }
    }
}

/// The config class defaults of `DeepSeek`-style MoE layers (`DeepseekV3Config`,
/// `Glm4MoeConfig`, `DeepseekV2Config`), for fields a config leaves out. `None`: the class
/// default is `None`, which transformers cannot run, so the field is required.
struct DeepseekMoeDefaults {
    experts: u64,
    top_k: Option<u64>,
    moe_intermediate: u64,
    shared: u64,
    scaling: f64,
    first_dense: u64,
    intermediate: u64,
}

impl DeepseekMoeDefaults {
    fn of(family: Family) -> Self {
        match family {
            Family::Glm4Moe => Self {
                experts: 128,
                top_k: Some(8),
                moe_intermediate: 1408,
                shared: 1,
                scaling: 1.0,
                first_dense: 1,
                intermediate: 10944,
            },
            Family::DeepseekV2 => Self {
                experts: 64,
                top_k: None,
                moe_intermediate: 1407,
                shared: 2,
                scaling: 1.0,
                first_dense: 0,
                intermediate: 11008,
            },
            // DeepSeek-V3 (`DeepseekV3Config`); no other family reads these layers.
            _ => Self {
                experts: 256,
                top_k: Some(8),
                moe_intermediate: 2048,
                shared: 1,
                scaling: 2.5,
                first_dense: 3,
                intermediate: 18432,
            },
        }
    }
}

/// What a `DeepSeek`-style router reads from the config beyond the shared fields.
struct RouterRule {
    scoring: RouterScoring,
    top_k_weights: TopKWeights,
    correction_bias: bool,
    groups: Option<ExpertGroups>,
}

impl<'a> Parser<'a> {
    /// A positive size field, or the class's `default` (recorded) when absent.
    fn positive(&mut self, field: &'static str, default: u64) -> Result<u64, ConfigError> {
        let v = self.obj.opt_size(field)?;
        let v = self.or_default(field, v, default);
        if v == 0 {
            return Err(ConfigError::invalid(field, 0, "must be at least 1"));
        }
        Ok(v)
    }

    /// The number of experts and of experts per token, each `(field, class default)`; the
    /// latter at most the former.
    fn experts_top_k(
        &mut self,
        experts: (&'static str, u64),
        top_k: (&'static str, u64),
    ) -> Result<(u64, u64), ConfigError> {
        let (e, k) = (self.positive(experts.0, experts.1)?, self.positive(top_k.0, top_k.1)?);
        if k > e {
            return Err(ConfigError::invalid(
                top_k.0,
                k,
                format!("more than the {e} experts ({})", experts.0),
            ));
        }
        Ok((e, k))
    }

    /// An optional field's value, or `default` recorded in [`ModelSpec::defaulted`].
    fn or_default<T: ToString>(&mut self, field: &'static str, value: Option<T>, default: T) -> T {
        value.unwrap_or_else(|| {
            self.defaulted.insert(field, default.to_string());
            default
        })
    }

    fn model(self) -> Result<ModelSpec, ConfigError> {
        match self.family()? {
            Family::Dbrx => self.dbrx_model(),
            family => self.model_of(family),
        }
    }

    /// DBRX (`DbrxConfig`, `modeling_dbrx.py`), whose config has a layout of its own:
    /// `d_model`, `n_heads`, `n_layers`, `max_seq_len`, and the `attn_config` / `ffn_config`
    /// objects, whose unknown keys transformers refuses (so do we). Every layer: a
    /// `LayerNorm` without bias, the fused `Wqkv` clamped to `clip_qkv`, RoPE, `out_proj`,
    /// a `LayerNorm`, the softmax top-k router (its top weights divided by their
    /// `moe_normalize_expert_weights`-norm) and the experts.
    fn dbrx_model(mut self) -> Result<ModelSpec, ConfigError> {
        let o = self.obj;
        let hidden = self.positive("d_model", 2048)?;
        let heads = self.positive("n_heads", 16)?;
        let num_layers = self.positive("n_layers", 24)?;
        if num_layers > MAX_LAYERS {
            return Err(ConfigError::invalid(
                "n_layers",
                num_layers,
                format!("larger than {MAX_LAYERS}, the most Palladium accepts for a layer count"),
            ));
        }
        let max_positions = self.positive("max_seq_len", 2048)?;
        let vocab = self.positive("vocab_size", 32000)?;
        if !hidden.is_multiple_of(heads) {
            return Err(ConfigError::invalid(
                "n_heads",
                heads,
                format!("DBRX's head_dim is d_model ({hidden}) / n_heads: it must divide d_model"),
            ));
        }
        let head_dim = hidden / heads;
        if head_dim % 2 != 0 {
            return Err(ConfigError::invalid(
                "n_heads",
                heads,
                format!("RoPE needs an even head_dim (d_model / n_heads = {head_dim})"),
            ));
        }
        // `DbrxAttentionConfig` / `DbrxFFNConfig` drop these keys and raise on any other.
        const DROPPED: &[&str] = &[
            "model_type",
            "attn_implementation",
            "transformers_version",
            "_commit_hash",
            "torch_dtype",
            "dtype",
        ];
        static EMPTY: std::sync::LazyLock<serde_json::Map<String, Value>> =
            std::sync::LazyLock::new(serde_json::Map::new);
        let sub = |field: &'static str, keys: &[&str]| -> Result<Obj<'a>, ConfigError> {
            let map = o.opt_obj(field)?;
            let prefix = if field == "attn_config" { "attn_config." } else { "ffn_config." };
            let sub = Obj::new(map.unwrap_or(&EMPTY), prefix);
            if let Some(k) = sub.keys().find(|k| !keys.contains(k) && !DROPPED.contains(k)) {
                return Err(ConfigError::unsupported(
                    sub.path(k),
                    sub.get(k).map_or_else(|| "null".into(), describe),
                    format!(
                        "absent (transformers' Dbrx config raises on it: {} read)",
                        keys.join(", ")
                    ),
                ));
            }
            Ok(sub)
        };
        let attn = sub("attn_config", &["attn_pdrop", "clip_qkv", "kv_n_heads", "rope_theta"])?;
        let kv_heads = attn.opt_size("kv_n_heads")?;
        let kv_heads = self.or_default("attn_config.kv_n_heads", kv_heads, 1);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(ConfigError::invalid(
                attn.path("kv_n_heads"),
                kv_heads,
                format!("n_heads ({heads}) must be a multiple of it"),
            ));
        }
        let theta = attn.opt_pos_f64("rope_theta")?;
        let theta = self.or_default("attn_config.rope_theta", theta, 10000.0);
        let clip_qkv = attn.opt_pos_f64("clip_qkv")?;
        let ffn = sub(
            "ffn_config",
            &[
                "ffn_act_fn",
                "ffn_hidden_size",
                "moe_num_experts",
                "moe_top_k",
                "moe_jitter_eps",
                "moe_loss_weight",
                "moe_normalize_expert_weights",
            ],
        )?;
        if let Some(act) = ffn.opt_obj("ffn_act_fn")? {
            let act = Obj::new(act, "ffn_config.ffn_act_fn.");
            if let Some(name) = act.opt_str("name")?
                && name != "silu"
            {
                return Err(ConfigError::unsupported(
                    act.path("name"),
                    format!("{name:?}"),
                    "silu",
                ));
            }
        }
        let positive = |parser: &mut Self, field: &'static str, default: u64| {
            let v = ffn.opt_size(field.trim_start_matches("ffn_config."))?;
            match parser.or_default(field, v, default) {
                0 => Err(ConfigError::invalid(field, 0, "must be at least 1")),
                v => Ok(v),
            }
        };
        let intermediate = positive(&mut self, "ffn_config.ffn_hidden_size", 3584)?;
        let experts = positive(&mut self, "ffn_config.moe_num_experts", 4)?;
        let top_k = positive(&mut self, "ffn_config.moe_top_k", 1)?;
        if top_k > experts {
            return Err(ConfigError::invalid(
                ffn.path("moe_top_k"),
                top_k,
                format!("more than the {experts} experts (moe_num_experts)"),
            ));
        }
        // `top_weights / torch.norm(top_weights, p)`: p = 1 is the sum of the (positive)
        // weights; null leaves them raw.
        let norm = "moe_normalize_expert_weights";
        let top_k_weights = match ffn.opt_f64(norm)? {
            _ if ffn.is_null(norm) => TopKWeights::Raw,
            None => {
                self.or_default("ffn_config.moe_normalize_expert_weights", None, 1.0);
                TopKWeights::Renormalized
            }
            Some(1.0) => TopKWeights::Renormalized,
            Some(p) => {
                return Err(ConfigError::unsupported(
                    ffn.path(norm),
                    p,
                    "1.0 (the weights' sum) or null: other norms are not implemented",
                ));
            }
        };
        if o.opt_bool("tie_word_embeddings")? == Some(true) {
            return Err(ConfigError::unsupported(
                "tie_word_embeddings",
                true,
                "false or absent (DbrxConfig raises: DBRX does not tie them)",
            ));
        }
        let dtype = self.dtype()?;
        let quantization = self.quantization()?;
        let moe = MoeSpec {
            num_experts: experts,
            top_k,
            intermediate,
            routing: Routing::top_k(RouterScoring::Softmax, top_k_weights),
            shared: None,
        };
        Ok(ModelSpec {
            family: Family::Dbrx,
            hidden_size: hidden,
            vocab_size: vocab,
            max_position_embeddings: max_positions,
            dtype,
            attention: AttentionSpec {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
                scale: (head_dim as f64).powf(-0.5),
                qkv_bias: false,
                o_bias: false,
                qk_norm: QkNorm::None,
                clip_qkv,
                rope: RopeSpec {
                    theta,
                    scaling: RopeScaling::Default,
                    style: RopeStyle::NeoxRotateHalf,
                    rotary_dim: head_dim,
                },
                sinks: false,
                form: AttentionForm::Gqa,
            },
            norm: NormSpec {
                eps: Family::Dbrx.defaults().rms_norm_eps,
                kind: NormKind::Layer { bias: false },
            },
            mlp: MlpSpec { activation: Activation::Silu, gated: true, bias: false },
            lm_head: LmHead::Untied,
            layers: uniform_moe_layers(num_layers, AttentionKind::Full, &moe),
            quantization,
            defaulted: self.defaulted,
            checkpoint_prefix: "",
            lm_head_bias: false,
            multipliers: Multipliers::IDENTITY,
        })
    }

    /// The model of `family` (read from `model_type`, or implied by an outer config).
    fn model_of(mut self, family: Family) -> Result<ModelSpec, ConfigError> {
        let o = self.obj;

        let act = o.opt_str("hidden_act")?;
        let act = self.or_default("hidden_act", act, "silu");
        if act != "silu" {
            return Err(ConfigError::unsupported("hidden_act", format!("{act:?}"), "silu"));
        }

        let hidden_size = o.req_pos("hidden_size")?;
        let num_layers = o.req_pos("num_hidden_layers")?;
        if num_layers > MAX_LAYERS {
            return Err(ConfigError::invalid(
                "num_hidden_layers",
                num_layers,
                format!(
                    "larger than {MAX_LAYERS}, the most Palladium accepts for a layer count (every layer is described separately)"
                ),
            ));
        }
        let vocab_size = o.req_pos("vocab_size")?;
        let max_position_embeddings = o.req_pos("max_position_embeddings")?;
        let attention = match family {
            Family::DeepseekV3 | Family::DeepseekV2 => self.mla_attention(family)?,
            Family::Qwen3Moe
            | Family::Mixtral
            | Family::Qwen2Moe
            | Family::Glm4Moe
            | Family::Olmoe
            | Family::GptOss
            | Family::Llama4
            | Family::GraniteMoe
            | Family::Ernie45Moe
            | Family::Phimoe
            | Family::HunyuanMoe => self.attention(family, hidden_size)?,
            Family::Dbrx => unreachable!("read by dbrx_model"),
        };

        let eps = o.opt_pos_f64("rms_norm_eps")?;
        let eps = self.or_default("rms_norm_eps", eps, family.defaults().rms_norm_eps);

        let tied = o.opt_bool("tie_word_embeddings")?;
        // `Ernie4_5_MoeConfig` ties by default, the others do not.
        let tied = self.or_default("tie_word_embeddings", tied, family == Family::Ernie45Moe);

        let dtype = self.dtype()?;
        let quantization = self.quantization()?;
        self.reject_foreign_fields(family)?;
        let layers = match family {
            Family::Qwen3Moe | Family::Qwen2Moe => self.qwen_moe_layers(family, num_layers)?,
            Family::Mixtral => self.mixtral_layers(num_layers)?,
            Family::GraniteMoe => self.granite_layers(num_layers)?,
            Family::Ernie45Moe => self.ernie_layers(num_layers)?,
            Family::DeepseekV3 | Family::Glm4Moe | Family::DeepseekV2 => {
                self.deepseek_moe_layers(family, num_layers)?
            }
            Family::Olmoe => self.olmoe_layers(num_layers)?,
            Family::GptOss => self.gpt_oss_layers(num_layers)?,
            Family::Llama4 => self.llama4_layers(num_layers)?,
            Family::Phimoe => self.phimoe_layers(num_layers)?,
            Family::HunyuanMoe => self.hunyuan_layers(num_layers)?,
            Family::Dbrx => unreachable!("read by dbrx_model"),
        };
        // PhimoeForCausalLM: `nn.Linear(hidden, vocab, bias=config.lm_head_bias)`; no other
        // family has the field.
        let lm_head_bias = o.opt_bool("lm_head_bias")?;
        let lm_head_bias = match family {
            Family::Phimoe => self.or_default("lm_head_bias", lm_head_bias, false),
            _ if lm_head_bias == Some(true) => {
                return Err(ConfigError::unsupported(
                    "lm_head_bias",
                    true,
                    format!(
                        "false or absent (not part of the {} architecture)",
                        family.model_type()
                    ),
                ));
            }
            _ => false,
        };
        let (norm, mlp) = match family {
            Family::GptOss => (NormKind::RmsF32Weight, self.gpt_oss_mlp()?),
            // PhimoeDecoderLayer / PhimoeModel: `nn.LayerNorm(hidden, eps=rms_norm_eps)`.
            Family::Phimoe => (
                NormKind::Layer { bias: true },
                MlpSpec { activation: Activation::Silu, gated: true, bias: false },
            ),
            _ => {
                (NormKind::Rms, MlpSpec { activation: Activation::Silu, gated: true, bias: false })
            }
        };

        Ok(ModelSpec {
            family,
            hidden_size,
            vocab_size,
            max_position_embeddings,
            dtype,
            attention,
            norm: NormSpec { eps, kind: norm },
            mlp,
            lm_head: if tied { LmHead::Tied } else { LmHead::Untied },
            layers,
            quantization,
            multipliers: self.multipliers(family)?,
            lm_head_bias,
            defaulted: self.defaulted,
            checkpoint_prefix: "",
        })
    }

    fn family(&self) -> Result<Family, ConfigError> {
        let o = self.obj;
        let supported = Family::MODEL_TYPES.join(", ");
        let model_type = o.opt_str("model_type")?.ok_or_else(|| ConfigError::Missing {
            field: "model_type".into(),
            hint: format!(" (supported: {supported})"),
        })?;
        let family = match model_type {
            "qwen3_moe" => Family::Qwen3Moe,
            "mixtral" => Family::Mixtral,
            "deepseek_v3" | "kimi_k2" => Family::DeepseekV3,
            "deepseek_v2" => Family::DeepseekV2,
            "qwen2_moe" => Family::Qwen2Moe,
            "glm4_moe" => Family::Glm4Moe,
            "olmoe" => Family::Olmoe,
            "gpt_oss" => Family::GptOss,
            "llama4_text" => Family::Llama4,
            "granitemoe" => Family::GraniteMoe,
            "ernie4_5_moe" => Family::Ernie45Moe,
            "phimoe" => Family::Phimoe,
            "hunyuan_v1_moe" => Family::HunyuanMoe,
            "dbrx" => Family::Dbrx,
            other => {
                return Err(ConfigError::unsupported(
                    "model_type",
                    format!("{other:?}"),
                    supported,
                ));
            }
        };
        if let Some(archs) = o.opt_str_list("architectures")?
            && !archs.is_empty()
            && !archs.contains(&family.causal_lm_class())
            && !family.shipped_class_alias().is_some_and(|a| archs.contains(&a))
        {
            return Err(ConfigError::unsupported(
                "architectures",
                format!("{archs:?}"),
                format!("[\"{}\"] for model_type {model_type:?}", family.causal_lm_class()),
            ));
        }
        Ok(family)
    }

    fn attention(&mut self, family: Family, hidden: u64) -> Result<AttentionSpec, ConfigError> {
        let o = self.obj;
        let num_heads = o.req_pos("num_attention_heads")?;
        let num_kv_heads = o.req_pos("num_key_value_heads")?;
        if num_kv_heads > num_heads || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(ConfigError::invalid(
                "num_key_value_heads",
                num_kv_heads,
                format!("num_attention_heads ({num_heads}) must be a multiple of it"),
            ));
        }
        let head_dim = match o.opt_size("head_dim")? {
            Some(0) => return Err(ConfigError::invalid("head_dim", 0, "must be at least 1")),
            Some(d) => d,
            // `GptOssConfig(head_dim=64)`, `Llama4TextConfig(head_dim=128)`: their class
            // defaults, not hidden / heads.
            None if family == Family::GptOss && !o.is_null("head_dim") => {
                self.or_default("head_dim", None, 64)
            }
            None if family == Family::Llama4 && !o.is_null("head_dim") => {
                self.or_default("head_dim", None, 128)
            }
            // HunYuanMoEV1Config's `head_dim` defaults to None, which its attention cannot run.
            None if family == Family::HunyuanMoe => {
                return Err(ConfigError::Missing {
                    field: "head_dim".into(),
                    hint: " (Hunyuan's attention reads it; transformers has no default)".into(),
                });
            }
            None => {
                if !hidden.is_multiple_of(num_heads) {
                    return Err(ConfigError::invalid(
                        "num_attention_heads",
                        num_heads,
                        format!(
                            "\"head_dim\" is absent, so hidden_size ({hidden}) must be divisible by num_attention_heads"
                        ),
                    ));
                }
                self.or_default("head_dim", None, hidden / num_heads)
            }
        };
        if head_dim % 2 != 0 {
            return Err(ConfigError::invalid(
                "head_dim",
                head_dim,
                "RoPE (rotate_half) needs an even head_dim",
            ));
        }

        let bias = o.opt_bool("attention_bias")?;
        // The families whose attention takes head_dim as hidden_size / num_attention_heads
        // whatever the config says (or raises otherwise).
        let whole_heads = |who: &str| {
            if head_dim * num_heads == hidden {
                return Ok(());
            }
            Err(ConfigError::invalid(
                "head_dim",
                head_dim,
                format!(
                    "{who}'s head_dim is hidden_size ({hidden}) / num_attention_heads ({num_heads})"
                ),
            ))
        };
        let (qkv_bias, o_bias, qk_norm) = match family {
            // Qwen3MoeAttention: q/k/v/o_proj all take `bias=config.attention_bias`; q_norm and
            // k_norm are `Qwen3MoeRMSNorm(head_dim)`.
            Family::Qwen3Moe => {
                let bias = self.or_default("attention_bias", bias, false);
                (bias, bias, QkNorm::PerHeadRms { weight_len: head_dim })
            }
            Family::DeepseekV3 | Family::DeepseekV2 => {
                unreachable!("the MLA families are read by mla_attention")
            }
            Family::Dbrx => unreachable!("read by dbrx_model"),
            // MixtralAttention: all projections `bias=False`; there is no config field for it.
            Family::Mixtral => {
                if bias == Some(true) {
                    return Err(ConfigError::unsupported(
                        "attention_bias",
                        true,
                        "false or absent (Mixtral's attention projections have no bias)",
                    ));
                }
                (false, false, QkNorm::None)
            }
            // OlmoeAttention: every projection takes `bias=config.attention_bias`; q_norm and
            // k_norm are `OlmoeRMSNorm` over the whole projections; head_dim is
            // hidden_size / num_attention_heads whatever the config says.
            Family::Olmoe => {
                whole_heads("OLMoE")?;
                let bias = self.or_default("attention_bias", bias, false);
                let qk_norm = QkNorm::WholeRms {
                    q_len: num_heads * head_dim,
                    k_len: num_kv_heads * head_dim,
                };
                (bias, bias, qk_norm)
            }
            // Qwen2MoeAttention: q/k/v_proj take `bias=config.qkv_bias`, o_proj never; no q/k
            // norm; it raises unless `head_dim * num_attention_heads == hidden_size`.
            Family::Qwen2Moe => {
                whole_heads("Qwen2-MoE")?;
                let qkv_bias = o.opt_bool("qkv_bias")?;
                (self.or_default("qkv_bias", qkv_bias, true), false, QkNorm::None)
            }
            // Glm4MoeAttention: q/k/v_proj take `bias=config.attention_bias`, o_proj never;
            // with `use_qk_norm`, `Glm4MoeRMSNorm(head_dim)` q/k norms per head before RoPE.
            Family::Glm4Moe => {
                let bias = self.or_default("attention_bias", bias, false);
                let qk_norm = o.opt_bool("use_qk_norm")?;
                let qk_norm = match self.or_default("use_qk_norm", qk_norm, false) {
                    true => QkNorm::PerHeadRms { weight_len: head_dim },
                    false => QkNorm::None,
                };
                (bias, false, qk_norm)
            }
            // GptOssConfig sets `attention_bias = True` whatever the config says: a config
            // saying false describes another model than transformers builds.
            Family::GptOss => {
                if bias == Some(false) {
                    return Err(ConfigError::unsupported(
                        "attention_bias",
                        false,
                        "true or absent (gpt-oss's q/k/v/o projections always have biases: GptOssConfig sets attention_bias = True)",
                    ));
                }
                (true, true, QkNorm::None)
            }
            // GraniteMoeAttention, PhimoeAttention: every projection takes
            // `bias=config.attention_bias`; head_dim is hidden_size / num_attention_heads.
            Family::GraniteMoe | Family::Phimoe => {
                whole_heads(if family == Family::Phimoe { "Phi-3.5-MoE" } else { "Granite" })?;
                let bias = self.or_default("attention_bias", bias, false);
                (bias, bias, QkNorm::None)
            }
            // Ernie4_5_MoeAttention / MLP: every linear takes `bias=config.use_bias` (false in
            // the released models): biases inside `nn.Linear` on the MLPs are not modelled.
            Family::Ernie45Moe => {
                if o.opt_bool("use_bias")? == Some(true) {
                    return Err(ConfigError::unsupported(
                        "use_bias",
                        true,
                        "false or absent (biases on ERNIE's attention and MLP projections are not implemented)",
                    ));
                }
                (false, false, QkNorm::None)
            }
            // Llama4TextConfig sets `attention_bias = False`; `use_qk_norm` (default true) is
            // the weightless L2 norm after RoPE on the RoPE layers.
            Family::Llama4 => {
                if bias == Some(true) {
                    return Err(ConfigError::unsupported(
                        "attention_bias",
                        true,
                        "false or absent (Llama4TextConfig sets attention_bias = False)",
                    ));
                }
                let qk_norm = o.opt_bool("use_qk_norm")?;
                let qk_norm = match self.or_default("use_qk_norm", qk_norm, true) {
                    true => QkNorm::L2AfterRope,
                    false => QkNorm::None,
                };
                (false, false, qk_norm)
            }
            // HunYuanMoEV1Attention: every projection takes `bias=config.attention_bias`;
            // `query_layernorm` / `key_layernorm` (RMS over each head) always follow RoPE.
            Family::HunyuanMoe => {
                if o.opt_bool("use_qk_norm")? == Some(false) {
                    return Err(ConfigError::unsupported(
                        "use_qk_norm",
                        false,
                        "true or absent (transformers 4.57's Hunyuan always norms q and k after RoPE)",
                    ));
                }
                let bias = self.or_default("attention_bias", bias, false);
                (bias, bias, QkNorm::PerHeadRmsAfterRope { weight_len: head_dim })
            }
        };

        // GLM-4.5 rotates the first `int(head_dim * partial_rotary_factor)` dimensions of each
        // head (default 0.5); the other families rotate all of them.
        let factor = o.opt_f64("partial_rotary_factor")?;
        let factor = match family {
            Family::Glm4Moe => self.or_default("partial_rotary_factor", factor, 0.5),
            _ => match factor {
                Some(f) if f != 1.0 => {
                    return Err(ConfigError::unsupported("partial_rotary_factor", f, "1.0"));
                }
                _ => 1.0,
            },
        };
        let rotary_dim = (head_dim as f64 * factor) as u64;
        if !(factor > 0.0 && factor <= 1.0) || rotary_dim < 2 || !rotary_dim.is_multiple_of(2) {
            return Err(ConfigError::invalid(
                "partial_rotary_factor",
                factor,
                format!(
                    "must be in (0, 1] and rotate an even number of head_dim ({head_dim}) dimensions (int(head_dim * factor) = {rotary_dim})"
                ),
            ));
        }
        // gpt-oss configures YaRN (and defaults to it: see `gpt_oss_default_rope`); Llama 4
        // rotates complex pairs, any `rope_scaling` being Llama 3's bands.
        let gpt_oss = family == Family::GptOss;
        let (style, rule) = match family {
            Family::GptOss => (RopeStyle::NeoxRotateHalf, ScalingRule::Yarn),
            Family::Llama4 => (RopeStyle::ComplexPairs, ScalingRule::Llama3),
            // `apply_rotary_pos_emb` rotates pairs (2i, 2i+1) in f32 and rounds once.
            Family::Ernie45Moe => (RopeStyle::ComplexPairs, ScalingRule::DefaultOnly),
            Family::Phimoe => (RopeStyle::NeoxRotateHalf, ScalingRule::LongRope),
            Family::HunyuanMoe => (RopeStyle::NeoxRotateHalf, ScalingRule::NtkAlpha),
            _ => (RopeStyle::NeoxRotateHalf, ScalingRule::DefaultOnly),
        };
        let mut rope = self.rope(factor, rotary_dim, style, rule)?;
        if gpt_oss && !self.obj.has("rope_scaling") {
            rope.scaling = self.gpt_oss_default_rope();
        }
        // OLMoE's `clip_qkv` (null: none); the other families have no such field.
        let clip_qkv = match family {
            Family::Olmoe => o.opt_pos_f64("clip_qkv")?,
            _ => None,
        };
        Ok(AttentionSpec {
            clip_qkv,
            num_heads,
            num_kv_heads,
            head_dim,
            scale: match family {
                // GraniteMoeAttention: `self.scaling = config.attention_multiplier`.
                Family::GraniteMoe => {
                    let m = o.opt_pos_f64("attention_multiplier")?;
                    self.or_default("attention_multiplier", m, 1.0)
                }
                _ => (head_dim as f64).powf(-0.5),
            },
            qkv_bias,
            o_bias,
            qk_norm,
            rope,
            sinks: gpt_oss,
            form: AttentionForm::Gqa,
        })
    }

    /// DeepSeek's multi-head latent attention (`DeepseekV3Attention` /
    /// `DeepseekV2Attention`), with the class defaults of `configuration_deepseek_v3.py` /
    /// `configuration_deepseek_v2.py` for absent fields.
    fn mla_attention(&mut self, family: Family) -> Result<AttentionSpec, ConfigError> {
        let o = self.obj;
        let num_heads = o.req_pos("num_attention_heads")?;
        // `q_lora_rank: null` is the q_proj variant; absent is the class default 1536.
        let q_lora_rank =
            if o.is_null("q_lora_rank") { None } else { Some(self.positive("q_lora_rank", 1536)?) };
        let kv_lora_rank = self.positive("kv_lora_rank", 512)?;
        let qk_nope_head_dim = self.positive("qk_nope_head_dim", 128)?;
        let qk_rope_head_dim = self.positive("qk_rope_head_dim", 64)?;
        let v_head_dim = self.positive("v_head_dim", 128)?;
        if qk_rope_head_dim % 2 != 0 {
            return Err(ConfigError::invalid(
                "qk_rope_head_dim",
                qk_rope_head_dim,
                "RoPE rotates pairs of dimensions: it must be even",
            ));
        }
        // kv_b_proj expands the latent to `num_attention_heads` K/V heads; eager attention
        // repeats them `num_attention_heads / num_key_value_heads` times, so any other value
        // fails in transformers. DeepseekV3Config's default is 128, DeepseekV2Config's the
        // head count.
        let kv_heads = o.opt_size("num_key_value_heads")?;
        let kv_default = if family == Family::DeepseekV3 { 128 } else { num_heads };
        let kv_heads = self.or_default("num_key_value_heads", kv_heads, kv_default);
        if kv_heads != num_heads {
            return Err(ConfigError::invalid(
                "num_key_value_heads",
                kv_heads,
                format!(
                    "MLA expands its latent to every query head: it must equal num_attention_heads ({num_heads})"
                ),
            ));
        }
        // The configs set `head_dim = qk_rope_head_dim` (RoPE's dimension); a different
        // `head_dim` would change the rotary frequencies in DeepseekV3Config.
        if let Some(h) = o.opt_size("head_dim")?
            && h != qk_rope_head_dim
        {
            return Err(ConfigError::invalid(
                "head_dim",
                h,
                format!("must equal qk_rope_head_dim ({qk_rope_head_dim}) or be absent"),
            ));
        }
        if o.opt_bool("attention_bias")? == Some(true) {
            return Err(ConfigError::unsupported(
                "attention_bias",
                true,
                "false or absent (biases on q_a_proj, kv_a_proj_with_mqa and o_proj are not implemented)",
            ));
        }
        if let Some(f) = o.opt_f64("partial_rotary_factor")?
            && f != 1.0
        {
            return Err(ConfigError::unsupported("partial_rotary_factor", f, "1.0"));
        }
        let style = match family {
            Family::DeepseekV2 => RopeStyle::ComplexPairs,
            _ => {
                let interleave = o.opt_bool("rope_interleave")?;
                if self.or_default("rope_interleave", interleave, true) {
                    RopeStyle::DeinterleaveRotateHalf
                } else {
                    RopeStyle::NeoxRotateHalf
                }
            }
        };
        let rope = self.rope(1.0, qk_rope_head_dim, style, ScalingRule::Yarn)?;
        let head_dim = qk_nope_head_dim + qk_rope_head_dim;
        let mut scale = (head_dim as f64).powf(-0.5);
        // DeepseekV3Attention.__init__: `scaling *= yarn_get_mscale(factor, mscale_all_dim)^2`
        // when `mscale_all_dim` is set (V2's attention has no such correction).
        if let (Family::DeepseekV3, &RopeScaling::Yarn { factor, mscale_all_dim, .. }) =
            (family, &rope.scaling)
            && mscale_all_dim != 0.0
        {
            let m = yarn_mscale(factor, mscale_all_dim);
            scale *= m * m;
        }
        Ok(AttentionSpec {
            num_heads,
            num_kv_heads: num_heads,
            head_dim,
            scale,
            qkv_bias: false,
            o_bias: false,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            rope,
            sinks: false,
            form: AttentionForm::Mla(MlaSpec {
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            }),
        })
    }

    /// RoPE from either spelling: 4.x `rope_theta` + `rope_scaling` (null or a dict), or 5.x
    /// `rope_parameters: {"rope_theta", "rope_type"}`. Both may be present (5.x keeps reading
    /// 4.x files); they must then agree. `rule`: what a 4.x `rope_scaling` may be.
    fn rope(
        &mut self,
        factor: f64,
        rotary_dim: u64,
        style: RopeStyle,
        rule: ScalingRule,
    ) -> Result<RopeSpec, ConfigError> {
        let yarn = rule == ScalingRule::Yarn;
        let o = self.obj;
        let old_theta = o.opt_pos_f64("rope_theta")?;
        let mut new_theta = None;
        if let Some(params) = o.opt_obj("rope_parameters")? {
            let p = Obj::new(params, "rope_parameters.");
            if p.keys().any(|k| k.ends_with("_attention")) {
                return Err(ConfigError::unsupported(
                    "rope_parameters",
                    "per-layer-type RoPE parameters",
                    "a single {\"rope_theta\", \"rope_type\"} object",
                ));
            }
            check_rope_type(&p)?;
            if let Some(f) = p.opt_f64("partial_rotary_factor")?
                && f != factor
            {
                return Err(ConfigError::unsupported(
                    p.path("partial_rotary_factor"),
                    f,
                    format!("{factor} (the model's partial_rotary_factor)"),
                ));
            }
            new_theta = p.opt_pos_f64("rope_theta")?;
        }
        let mut scaling = RopeScaling::Default;
        if let Some(params) = o.opt_obj("rope_scaling")? {
            let p = Obj::new(params, "rope_scaling.");
            let key = if p.has("rope_type") { "rope_type" } else { "type" };
            if yarn && p.opt_str(key)? == Some("yarn") {
                scaling = self.yarn(&p)?;
            } else if rule == ScalingRule::Llama3 {
                scaling = RopeScaling::Llama3(llama3(&p)?);
            } else if rule == ScalingRule::LongRope && p.opt_str(key)? == Some("longrope") {
                scaling = RopeScaling::LongRope(long_rope(&p, rotary_dim)?);
            } else if rule == ScalingRule::NtkAlpha && p.opt_str(key)? == Some("dynamic") {
                scaling = ntk_alpha(&p, rotary_dim)?;
            } else {
                check_rope_type(&p)?;
                // DeepseekV3Attention reads `factor` and `mscale_all_dim` from any
                // `rope_scaling`: with the default type they would still change the scale.
                if yarn && let Some(k) = p.keys().find(|k| !["type", "rope_type"].contains(k)) {
                    return Err(ConfigError::unsupported(
                        p.path(k),
                        p.get(k).map_or_else(|| "null".into(), describe),
                        "absent with the default rope_type (only yarn takes parameters)",
                    ));
                }
            }
        }
        let theta = match (old_theta, new_theta) {
            (Some(a), Some(b)) if a != b => {
                return Err(ConfigError::Conflict {
                    field: "rope_theta".into(),
                    value: a.to_string(),
                    other: "rope_parameters.rope_theta".into(),
                    other_value: b.to_string(),
                });
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return Err(ConfigError::Missing {
                    field: "rope_theta".into(),
                    hint: " (or \"rope_parameters.rope_theta\")".into(),
                });
            }
        };
        Ok(RopeSpec { theta, scaling, style, rotary_dim })
    }

    /// A `rope_scaling` of type `"yarn"`, with transformers' defaults
    /// (`_compute_yarn_parameters`); a key it does not read is refused by name.
    fn yarn(&mut self, p: &Obj<'_>) -> Result<RopeScaling, ConfigError> {
        const KEYS: &[&str] = &[
            "type",
            "rope_type",
            "factor",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "original_max_position_embeddings",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ];
        if let Some(key) = p.keys().find(|k| !KEYS.contains(k)) {
            return Err(ConfigError::unsupported(
                p.path(key),
                p.get(key).map_or_else(|| "null".into(), describe),
                format!("absent (the yarn rope_scaling keys are {})", KEYS.join(", ")),
            ));
        }
        let factor = p.opt_f64("factor")?.ok_or_else(|| p.missing("factor"))?;
        if !(factor.is_finite() && factor >= 1.0) {
            return Err(ConfigError::invalid(p.path("factor"), factor, "must be a number >= 1"));
        }
        let non_negative = |key: &str| -> Result<Option<f64>, ConfigError> {
            let v = p.opt_f64(key)?;
            if let Some(x) = v
                && !(x.is_finite() && x >= 0.0)
            {
                return Err(ConfigError::invalid(p.path(key), x, "must be a finite number >= 0"));
            }
            Ok(v)
        };
        let mscale = non_negative("mscale")?.unwrap_or(0.0);
        let mscale_all_dim = non_negative("mscale_all_dim")?.unwrap_or(0.0);
        // `x or default`: transformers reads 0 (falsy) as absent too.
        let beta_fast = non_negative("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0);
        let beta_slow = non_negative("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0);
        let original = p.opt_size("original_max_position_embeddings")?.filter(|&n| n != 0);
        let original = match original {
            Some(n) => n,
            None => self.obj.req_pos("max_position_embeddings")?,
        };
        let attention_factor = match non_negative("attention_factor")? {
            Some(a) => a,
            None if mscale != 0.0 && mscale_all_dim != 0.0 => {
                yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
            }
            None => yarn_mscale(factor, 1.0),
        };
        Ok(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate: p.opt_bool("truncate")?.unwrap_or(true),
        })
    }

    /// `torch_dtype` (4.x) or `dtype` (5.x).
    fn dtype(&mut self) -> Result<Option<Dtype>, ConfigError> {
        let o = self.obj;
        let parse = |field: &str| -> Result<Option<Dtype>, ConfigError> {
            o.opt_str(field)?
                .map(|s| {
                    Dtype::parse(s).ok_or_else(|| {
                        ConfigError::unsupported(field, format!("{s:?}"), Dtype::SUPPORTED)
                    })
                })
                .transpose()
        };
        match (parse("torch_dtype")?, parse("dtype")?) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Conflict {
                field: "torch_dtype".into(),
                value: a.name().into(),
                other: "dtype".into(),
                other_value: b.name().into(),
            }),
            (Some(d), _) | (None, Some(d)) => Ok(Some(d)),
            (None, None) => Ok(None),
        }
    }

    /// `quantization_config`: only transformers' block-scaled FP8 (`quant_method: "fp8"`,
    /// e4m3, dynamic activations, 128x128 blocks); any other method, value or key is refused
    /// by name rather than read as unquantized weights.
    fn quantization(&mut self) -> Result<Option<Quantization>, ConfigError> {
        let Some(q) = self.obj.opt_obj("quantization_config")? else {
            return Ok(None);
        };
        let q = Obj::new(q, "quantization_config.");
        if q.opt_str("quant_method")? == Some("mxfp4") {
            return self.mxfp4(&q).map(Some);
        }
        const KEYS: &[&str] = &[
            "quant_method",
            "weight_block_size",
            "modules_to_not_convert",
            "activation_scheme",
            "fmt",
        ];
        if let Some(key) = q.keys().find(|k| !KEYS.contains(k)) {
            return Err(ConfigError::unsupported(
                q.path(key),
                q.get(key).map_or_else(|| "null".into(), describe),
                format!("absent (the fp8 quantization_config keys are {})", KEYS.join(", ")),
            ));
        }
        // transformers' FineGrainedFP8Config (4.57) takes `len()` of weight_block_size and
        // lowercases activation_scheme: `null` (Python's None) fails there, so it is not
        // read as the default here either.
        for (key, supported) in [
            ("weight_block_size", "[128, 128], or the field left out for that default"),
            ("activation_scheme", "\"dynamic\", or the field left out for that default"),
        ] {
            if q.is_null(key) {
                return Err(ConfigError::unsupported(
                    q.path(key),
                    "null (transformers' FineGrainedFP8Config refuses it)",
                    supported,
                ));
            }
        }
        let method = q.opt_str("quant_method")?.ok_or_else(|| ConfigError::Missing {
            field: q.path("quant_method"),
            hint: " (supported: \"fp8\")".into(),
        })?;
        if method != "fp8" {
            return Err(ConfigError::unsupported(
                q.path("quant_method"),
                format!("{method:?}"),
                "\"fp8\" (block-scaled float8_e4m3fn, transformers' FineGrainedFP8Config)",
            ));
        }
        if let Some(fmt) = q.opt_str("fmt")?
            && fmt != "e4m3"
        {
            return Err(ConfigError::unsupported(q.path("fmt"), format!("{fmt:?}"), "\"e4m3\""));
        }
        let scheme = q.opt_str("activation_scheme")?;
        let scheme = self.or_default("quantization_config.activation_scheme", scheme, "dynamic");
        if !scheme.eq_ignore_ascii_case("dynamic") {
            return Err(ConfigError::unsupported(
                q.path("activation_scheme"),
                format!("{scheme:?}"),
                "\"dynamic\" (no activation scales in the checkpoint)",
            ));
        }
        let block = match q.opt_u64_list("weight_block_size")? {
            Some(b) => b,
            None => {
                self.defaulted.insert("quantization_config.weight_block_size", "[128, 128]".into());
                vec![128, 128]
            }
        };
        if block != [128, 128] {
            return Err(ConfigError::unsupported(
                q.path("weight_block_size"),
                format!("{block:?}"),
                "[128, 128] (the block of every Hugging Face FP8 checkpoint)",
            ));
        }
        let not_converted = match q.opt_str_list("modules_to_not_convert")? {
            Some(list) => list,
            None => {
                self.defaulted
                    .insert("quantization_config.modules_to_not_convert", "[\"lm_head\"]".into());
                vec!["lm_head"]
            }
        };
        if let Some(i) = not_converted.iter().position(|m| m.is_empty()) {
            return Err(ConfigError::invalid(
                format!("{}[{i}]", q.path("modules_to_not_convert")),
                "\"\"",
                "an empty module name would match every module",
            ));
        }
        Ok(Some(Quantization::Fp8Block {
            weight_block_size: [128, 128],
            modules_to_not_convert: not_converted.into_iter().map(String::from).collect(),
        }))
    }

    /// `quant_method: "mxfp4"` (`Mxfp4Config`): gpt-oss's experts as shipped. Its
    /// `modules_to_not_convert` may not name the experts (they are what it converts).
    fn mxfp4(&mut self, q: &Obj<'_>) -> Result<Quantization, ConfigError> {
        const KEYS: &[&str] = &["quant_method", "modules_to_not_convert", "dequantize"];
        if let Some(key) = q.keys().find(|k| !KEYS.contains(k)) {
            return Err(ConfigError::unsupported(
                q.path(key),
                q.get(key).map_or_else(|| "null".into(), describe),
                format!("absent (the mxfp4 quantization_config keys are {})", KEYS.join(", ")),
            ));
        }
        if self.family()? != Family::GptOss {
            return Err(ConfigError::unsupported(
                q.path("quant_method"),
                "\"mxfp4\"",
                "\"fp8\" (mxfp4 is read for gpt_oss's fused experts only)",
            ));
        }
        // `dequantize` is how transformers loads it (bf16 or the codes), not what it computes.
        q.opt_bool("dequantize")?;
        let not_converted = q.opt_str_list("modules_to_not_convert")?.unwrap_or_default();
        if let Some(i) = not_converted.iter().position(|m| m.contains("experts")) {
            return Err(ConfigError::unsupported(
                format!("{}[{i}]", q.path("modules_to_not_convert")),
                format!("{:?}", not_converted[i]),
                "a module other than the experts (mxfp4 converts exactly the experts)",
            ));
        }
        Ok(Quantization::Mxfp4 {
            modules_to_not_convert: not_converted.into_iter().map(String::from).collect(),
        })
    }

    /// `num_experts` (Qwen3 4.x) or `num_local_experts` (Mixtral, and the 5.x attribute map
    /// of both families).
    fn num_experts(&self) -> Result<u64, ConfigError> {
        let o = self.obj;
        match (o.opt_size("num_experts")?, o.opt_size("num_local_experts")?) {
            (Some(a), Some(b)) if a != b => Err(ConfigError::Conflict {
                field: "num_experts".into(),
                value: a.to_string(),
                other: "num_local_experts".into(),
                other_value: b.to_string(),
            }),
            (Some(n), _) | (None, Some(n)) => Ok(n),
            (None, None) => Err(ConfigError::Missing {
                field: "num_experts".into(),
                hint: " (or \"num_local_experts\")".into(),
            }),
        }
    }

    fn moe(
        &self,
        num_experts: u64,
        intermediate_field: &str,
        top_k_weights: TopKWeights,
    ) -> Result<MoeSpec, ConfigError> {
        let o = self.obj;
        let top_k = o.req_pos("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(ConfigError::invalid(
                "num_experts_per_tok",
                top_k,
                format!("more than the {num_experts} experts"),
            ));
        }
        Ok(MoeSpec {
            num_experts,
            top_k,
            intermediate: o.req_pos(intermediate_field)?,
            routing: Routing::top_k(RouterScoring::Softmax, top_k_weights),
            shared: None,
        })
    }

    /// Qwen3-MoE / Qwen2-MoE layer `i` is MoE iff `i ∉ mlp_only_layers` and
    /// `num_experts > 0` and `(i + 1) % decoder_sparse_step == 0`; otherwise a dense
    /// `Qwen3MoeMLP(intermediate_size)` (`Qwen3MoeDecoderLayer.__init__`, and Qwen2-MoE's the
    /// same). A Qwen2-MoE MoE layer also has the sigmoid-gated shared expert
    /// (`Qwen2MoeSparseMoeBlock`: `shared_expert`, `shared_expert_gate`).
    fn qwen_moe_layers(
        &mut self,
        family: Family,
        num_layers: u64,
    ) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let num_experts = self.num_experts()?;
        let step = o.opt_size("decoder_sparse_step")?;
        let step = self.or_default("decoder_sparse_step", step, 1);
        if step == 0 {
            return Err(ConfigError::invalid("decoder_sparse_step", 0, "must be at least 1"));
        }
        let mlp_only = o.opt_u64_list("mlp_only_layers")?;
        let mlp_only = match mlp_only {
            Some(v) => v,
            None => {
                self.defaulted.insert("mlp_only_layers", "[]".into());
                Vec::new()
            }
        };
        if let Some((i, &l)) = mlp_only.iter().enumerate().find(|&(_, &l)| l >= num_layers) {
            return Err(ConfigError::invalid(
                format!("mlp_only_layers[{i}]"),
                l,
                format!("not a layer index (num_hidden_layers is {num_layers})"),
            ));
        }
        let is_moe =
            |i: u64| !mlp_only.contains(&i) && num_experts > 0 && (i + 1).is_multiple_of(step);

        let norm_topk = o.opt_bool("norm_topk_prob")?;
        let norm_topk = self.or_default("norm_topk_prob", norm_topk, false);
        let weights = if norm_topk { TopKWeights::Renormalized } else { TopKWeights::Raw };
        let shared = match family {
            Family::Qwen2Moe if (0..num_layers).any(is_moe) => {
                let i = o.opt_size("shared_expert_intermediate_size")?;
                let i = self.or_default("shared_expert_intermediate_size", i, 5632);
                if i == 0 {
                    return Err(ConfigError::invalid(
                        "shared_expert_intermediate_size",
                        0,
                        "must be at least 1",
                    ));
                }
                Some(SharedExpert { intermediate: i, sigmoid_gate: true })
            }
            _ => None,
        };
        let attention = match family {
            Family::Qwen2Moe => self.qwen2_moe_attention_kinds(num_layers)?,
            _ => self.qwen3_moe_attention_kinds(num_layers)?,
        };
        // The fields are re-read per layer (cheap) so that a field is required only when some
        // layer needs it: `intermediate_size` only with dense layers, the MoE ones only with MoE.
        attention
            .into_iter()
            .enumerate()
            .map(|(index, attention)| {
                let ffn = if is_moe(index as u64) {
                    let moe = self.moe(num_experts, "moe_intermediate_size", weights)?;
                    FfnKind::Moe(MoeSpec { shared, ..moe })
                } else {
                    FfnKind::Dense { intermediate: o.req_pos("intermediate_size")? }
                };
                Ok(LayerSpec { index, attention, ffn, positions: Positions::Rope })
            })
            .collect()
    }

    /// Qwen3-MoE sliding windows. `use_sliding_window: false` (the default and both real
    /// configs) means full attention everywhere (`configuration_qwen3_moe.py` sets
    /// `sliding_window = None` then). When it is true: `layer_types` if present, else the
    /// transformers 4.x rule of `Qwen3MoeAttention`: layers `>= max_window_layers` slide, the
    /// ones before attend fully (transformers 5.x dropped `max_window_layers` and slides every
    /// layer, so a 5.x-written sliding config should carry `layer_types`).
    fn qwen3_moe_attention_kinds(
        &mut self,
        num_layers: u64,
    ) -> Result<Vec<AttentionKind>, ConfigError> {
        let o = self.obj;
        let use_sw = o.opt_bool("use_sliding_window")?;
        let use_sw = self.or_default("use_sliding_window", use_sw, false);
        let layer_types = self.layer_types(num_layers)?;
        if !use_sw {
            if let Some(types) = &layer_types
                && let Some(i) = types.iter().position(|&sliding| sliding)
            {
                return Err(ConfigError::invalid(
                    format!("layer_types[{i}]"),
                    "\"sliding_attention\"",
                    "use_sliding_window is false, so Qwen3-MoE attends fully in every layer",
                ));
            }
            return Ok(vec![AttentionKind::Full; num_layers as usize]);
        }
        let window = self.window("use_sliding_window is true")?;
        let sliding = match layer_types {
            Some(types) => types,
            None => {
                let first =
                    o.opt_size("max_window_layers")?.ok_or_else(|| ConfigError::Missing {
                        field: "max_window_layers".into(),
                        hint: " (use_sliding_window is true and there is no \"layer_types\")"
                            .into(),
                    })?;
                (0..num_layers).map(|i| i >= first).collect()
            }
        };
        Ok(sliding
            .into_iter()
            .map(|s| if s { AttentionKind::Sliding { window } } else { AttentionKind::Full })
            .collect())
    }

    /// Qwen2-MoE: full attention in every layer. Its sliding window (`use_sliding_window:
    /// true`, layers `>= max_window_layers`) is not implemented: refused by name, as is a
    /// `layer_types` entry that slides (transformers 4.57's Qwen2-MoE has no `layer_types`).
    fn qwen2_moe_attention_kinds(
        &mut self,
        num_layers: u64,
    ) -> Result<Vec<AttentionKind>, ConfigError> {
        let use_sw = self.obj.opt_bool("use_sliding_window")?;
        if self.or_default("use_sliding_window", use_sw, false) {
            return Err(ConfigError::unsupported(
                "use_sliding_window",
                true,
                "false or absent (Qwen2-MoE's sliding window is not implemented)",
            ));
        }
        if let Some(types) = self.layer_types(num_layers)?
            && let Some(i) = types.iter().position(|&sliding| sliding)
        {
            return Err(ConfigError::invalid(
                format!("layer_types[{i}]"),
                "\"sliding_attention\"",
                "use_sliding_window is false, so Qwen2-MoE attends fully in every layer",
            ));
        }
        Ok(vec![AttentionKind::Full; num_layers as usize])
    }

    /// `DeepSeek`-V3's decoder layers, which GLM-4.5 (`Glm4MoeDecoderLayer`) copies and
    /// `DeepSeek`-V2's share: layers `< first_k_dense_replace` are a dense MLP of
    /// `intermediate_size`, the others the MoE block (`DeepseekV3MoE` / `Glm4MoeMoE` /
    /// `DeepseekV2MoE`): the family's router ([`Self::deepseek_v3_router`],
    /// [`Self::deepseek_v2_router`]), `routed_scaling_factor`, f32 logits and routed sum, and
    /// `n_shared_experts * moe_intermediate_size` of ungated shared MLP. Absent fields take
    /// the family's config class defaults ([`DeepseekMoeDefaults`]).
    fn deepseek_moe_layers(
        &mut self,
        family: Family,
        num_layers: u64,
    ) -> Result<Vec<LayerSpec>, ConfigError> {
        let d = DeepseekMoeDefaults::of(family);
        let o = self.obj;
        if family == Family::DeepseekV2 && o.opt_bool("mlp_bias")? == Some(true) {
            return Err(ConfigError::unsupported(
                "mlp_bias",
                true,
                "false or absent (biases on the MLP projections are not implemented)",
            ));
        }
        if family != Family::DeepseekV2 {
            self.deepseek_router_methods()?;
        }
        // DeepSeek's own modeling code makes every `moe_layer_freq`-th layer past the dense
        // ones MoE; transformers 4.57 (the specification) makes all of them MoE: they agree
        // only at 1, the value every published config has.
        if let Some(freq) = o.opt_u64("moe_layer_freq")?
            && freq != 1
        {
            return Err(ConfigError::unsupported(
                "moe_layer_freq",
                freq,
                "1 or absent (transformers makes every layer from first_k_dense_replace on MoE, DeepSeek's own code only every moe_layer_freq-th: the two disagree)",
            ));
        }
        let first_dense = o.opt_size("first_k_dense_replace")?;
        let first_dense = self.or_default("first_k_dense_replace", first_dense, d.first_dense);
        let moe = if first_dense < num_layers {
            let experts = self.positive("n_routed_experts", d.experts)?;
            let top_k = match d.top_k {
                Some(default) => self.positive("num_experts_per_tok", default)?,
                None => o
                    .opt_size("num_experts_per_tok")?
                    .ok_or_else(|| o.missing("num_experts_per_tok"))?,
            };
            if top_k == 0 {
                return Err(ConfigError::invalid("num_experts_per_tok", 0, "must be at least 1"));
            }
            if top_k > experts {
                return Err(ConfigError::invalid(
                    "num_experts_per_tok",
                    top_k,
                    format!("more than the {experts} experts (n_routed_experts)"),
                ));
            }
            let intermediate = self.positive("moe_intermediate_size", d.moe_intermediate)?;
            let shared = self.positive("n_shared_experts", d.shared)?;
            let rule = match family {
                Family::DeepseekV2 => self.deepseek_v2_router(experts)?,
                _ => self.deepseek_v3_router(family, experts)?,
            };
            let scaling = o.opt_pos_f64("routed_scaling_factor")?;
            let scaling = self.or_default("routed_scaling_factor", scaling, d.scaling);
            Some(MoeSpec {
                num_experts: experts,
                top_k,
                intermediate,
                routing: Routing {
                    router_bias: false,
                    scoring: rule.scoring,
                    top_k_weights: rule.top_k_weights,
                    correction_bias: rule.correction_bias,
                    groups: rule.groups,
                    scaling,
                    precision: RouterPrecision::F32,
                    weighting: ExpertWeighting::Output,
                    sparse_mixer: None,
                },
                shared: Some(SharedExpert {
                    intermediate: shared.checked_mul(intermediate).ok_or_else(|| {
                        ConfigError::invalid("n_shared_experts", shared, "too large")
                    })?,
                    sigmoid_gate: false,
                }),
            })
        } else {
            None
        };
        let dense = if first_dense > 0 {
            Some(self.positive("intermediate_size", d.intermediate)?)
        } else {
            None
        };
        Ok((0..num_layers as usize)
            .map(|index| LayerSpec {
                index,
                attention: AttentionKind::Full,
                ffn: match (&moe, dense) {
                    (Some(m), _) if index as u64 >= first_dense => FfnKind::Moe(m.clone()),
                    (_, Some(intermediate)) => FfnKind::Dense { intermediate },
                    _ => unreachable!("a layer is dense or MoE by first_k_dense_replace"),
                },
                positions: Positions::Rope,
            })
            .collect())
    }

    /// `n_group` and `topk_group` of `experts`, checked: `n_group` equal groups of at least
    /// `least` experts, `topk_group` of them kept. `None` where the config names neither
    /// and `defaults` is `None` (one group).
    fn expert_groups(
        &mut self,
        experts: u64,
        defaults: Option<(u64, u64)>,
        score: GroupScore,
    ) -> Result<Option<ExpertGroups>, ConfigError> {
        let o = self.obj;
        let (groups, chosen_groups) =
            match (defaults, o.opt_size("n_group")?, o.opt_size("topk_group")?) {
                (Some((g, k)), groups, chosen) => (
                    self.or_default("n_group", groups, g),
                    self.or_default("topk_group", chosen, k),
                ),
                (None, Some(g), Some(k)) => (g, k),
                (None, None, _) => return Err(o.missing("n_group")),
                (None, Some(_), None) => return Err(o.missing("topk_group")),
            };
        for (field, v) in [("n_group", groups), ("topk_group", chosen_groups)] {
            if v == 0 {
                return Err(ConfigError::invalid(field, 0, "must be at least 1"));
            }
        }
        // `scores.view(-1, n_group, experts / n_group)`: equal groups (V3's `topk(2)`: of two
        // or more).
        let least = if score == GroupScore::TopTwoSum { 2 } else { 1 };
        if !experts.is_multiple_of(groups) || experts / groups < least && groups > 1 {
            return Err(ConfigError::invalid(
                "n_group",
                groups,
                format!(
                    "must divide n_routed_experts ({experts}) into groups of at least {least} experts"
                ),
            ));
        }
        if chosen_groups > groups {
            return Err(ConfigError::invalid(
                "topk_group",
                chosen_groups,
                format!("more than the {groups} groups (n_group)"),
            ));
        }
        Ok((groups > 1).then_some(ExpertGroups { groups, chosen_groups, score }))
    }

    /// `DeepseekV3TopkRouter` (GLM-4.5's too): sigmoid scores, `e_score_correction_bias` to
    /// choose, groups scored by their best two, `norm_topk_prob` (default true).
    fn deepseek_v3_router(
        &mut self,
        family: Family,
        experts: u64,
    ) -> Result<RouterRule, ConfigError> {
        self.deepseek_router_methods()?;
        let defaults = if family == Family::Glm4Moe { (1, 1) } else { (8, 4) };
        let groups = self.expert_groups(experts, Some(defaults), GroupScore::TopTwoSum)?;
        let norm_topk = self.obj.opt_bool("norm_topk_prob")?;
        let norm_topk = self.or_default("norm_topk_prob", norm_topk, true);
        Ok(RouterRule {
            scoring: RouterScoring::Sigmoid,
            top_k_weights: if norm_topk { TopKWeights::Renormalized } else { TopKWeights::Raw },
            correction_bias: true,
            groups,
        })
    }

    /// `DeepseekV2MoEGate` as transformers 4.57 computes it: softmax scores over all experts
    /// (f32), `topk_method` `"greedy"` (plain top-k) or `"group_limited_greedy"` (`n_group`
    /// groups scored by their best expert, the `topk_group` best kept), the chosen scores as
    /// weights (not renormalised), times `routed_scaling_factor`.
    fn deepseek_v2_router(&mut self, experts: u64) -> Result<RouterRule, ConfigError> {
        let o = self.obj;
        if let Some(v) = o.opt_str("scoring_func")?
            && v != "softmax"
        {
            return Err(ConfigError::unsupported(
                "scoring_func",
                format!("{v:?}"),
                "\"softmax\" or absent (DeepseekV2MoEGate's softmax)",
            ));
        }
        // transformers 4.57's gate reads `norm_topk_prob` and never applies it, while
        // DeepSeek's own modeling code renormalises: the two disagree, so only false is read.
        if self.obj.opt_bool("norm_topk_prob")? == Some(true) {
            return Err(ConfigError::unsupported(
                "norm_topk_prob",
                true,
                "false or absent (transformers' DeepseekV2MoEGate ignores it, DeepSeek's own code renormalises: the two disagree)",
            ));
        }
        let method = o.opt_str("topk_method")?;
        let groups = match self.or_default("topk_method", method, "greedy") {
            "greedy" => {
                o.opt_size("n_group")?;
                o.opt_size("topk_group")?;
                None
            }
            "group_limited_greedy" => self.expert_groups(experts, None, GroupScore::Max)?,
            other => {
                return Err(ConfigError::unsupported(
                    "topk_method",
                    format!("{other:?}"),
                    "\"greedy\", \"group_limited_greedy\" or absent",
                ));
            }
        };
        Ok(RouterRule {
            scoring: RouterScoring::Softmax,
            top_k_weights: TopKWeights::Raw,
            correction_bias: false,
            groups,
        })
    }

    /// `DeepSeek`-V3's `topk_method` and `scoring_func`, where a config names them: only the
    /// router implemented (`"noaux_tc"`: correction-biased, group-limited top-k; `"sigmoid"`).
    fn deepseek_router_methods(&self) -> Result<(), ConfigError> {
        for (field, implemented) in [("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")] {
            if let Some(v) = self.obj.opt_str(field)?
                && v != implemented
            {
                return Err(ConfigError::unsupported(
                    field,
                    format!("{v:?}"),
                    format!("\"{implemented}\" or absent"),
                ));
            }
        }
        Ok(())
    }

    /// `OLMoE`: every layer `OlmoeSparseMoeBlock` (softmax top-k, `norm_topk_prob` default
    /// false, experts of `intermediate_size`), full attention.
    fn olmoe_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let num_experts = self.num_experts()?;
        if num_experts == 0 {
            return Err(ConfigError::invalid("num_experts", 0, "must be at least 1"));
        }
        let norm_topk = self.obj.opt_bool("norm_topk_prob")?;
        let norm_topk = self.or_default("norm_topk_prob", norm_topk, false);
        let weights = if norm_topk { TopKWeights::Renormalized } else { TopKWeights::Raw };
        let moe = self.moe(num_experts, "intermediate_size", weights)?;
        if let Some(types) = self.layer_types(num_layers)?
            && let Some(i) = types.iter().position(|&sliding| sliding)
        {
            return Err(ConfigError::unsupported(
                format!("layer_types[{i}]"),
                "\"sliding_attention\"",
                "\"full_attention\" (OLMoE attends fully in every layer)",
            ));
        }
        Ok(uniform_moe_layers(num_layers, AttentionKind::Full, &moe))
    }

    /// gpt-oss (`GptOssDecoderLayer`): every layer MoE (`num_local_experts` experts of
    /// `intermediate_size`, `GptOssTopKRouter`: a router with bias, top-k of its logits, then
    /// a softmax over those k: the renormalised top-k of the softmax), attention sliding
    /// (`sliding_window`) where `layer_types` says so, by default the even layers.
    fn gpt_oss_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let num_experts = match (o.opt_size("num_local_experts")?, o.opt_size("num_experts")?) {
            (Some(n), _) => n,
            (None, Some(_)) => {
                return Err(ConfigError::Missing {
                    field: "num_local_experts".into(),
                    hint: " (gpt-oss reads num_local_experts, not num_experts)".into(),
                });
            }
            (None, None) => self.or_default("num_local_experts", None, 128),
        };
        if num_experts == 0 {
            return Err(ConfigError::invalid("num_local_experts", 0, "must be at least 1"));
        }
        // The model card's `experts_per_token` duplicates num_experts_per_tok (which
        // transformers reads); they must agree.
        let top_k = o.opt_size("num_experts_per_tok")?;
        let top_k = self.or_default("num_experts_per_tok", top_k, 4);
        if let Some(k) = o.opt_size("experts_per_token")?
            && k != top_k
        {
            return Err(ConfigError::Conflict {
                field: "num_experts_per_tok".into(),
                value: top_k.to_string(),
                other: "experts_per_token".into(),
                other_value: k.to_string(),
            });
        }
        if top_k == 0 || top_k > num_experts {
            return Err(ConfigError::invalid(
                "num_experts_per_tok",
                top_k,
                format!("must be 1..={num_experts} (the experts)"),
            ));
        }
        let intermediate = o.opt_size("intermediate_size")?;
        let intermediate = self.or_default("intermediate_size", intermediate, 2880);
        if intermediate == 0 {
            return Err(ConfigError::invalid("intermediate_size", 0, "must be at least 1"));
        }
        let mut routing = Routing::top_k(RouterScoring::Softmax, TopKWeights::Renormalized);
        routing.router_bias = true;
        let moe = MoeSpec { num_experts, top_k, intermediate, routing, shared: None };
        let sliding = match self.layer_types(num_layers)? {
            Some(types) => types,
            None => {
                self.defaulted.insert("layer_types", "sliding on even layers, full on odd".into());
                (0..num_layers).map(|i| i % 2 == 0).collect()
            }
        };
        let window = if sliding.iter().any(|&s| s) {
            let w = o.opt_size("sliding_window")?;
            let w = self.or_default("sliding_window", w, 128);
            if w == 0 {
                return Err(ConfigError::invalid("sliding_window", 0, "must be at least 1"));
            }
            w
        } else {
            0
        };
        Ok(sliding
            .into_iter()
            .enumerate()
            .map(|(index, s)| LayerSpec {
                index,
                attention: if s { AttentionKind::Sliding { window } } else { AttentionKind::Full },
                ffn: FfnKind::Moe(moe.clone()),
                positions: Positions::Rope,
            })
            .collect())
    }

    /// Llama 4 (`Llama4TextDecoderLayer`): layer `i` is MoE iff `i` is in `moe_layers`
    /// (default every `interleave_moe_layer_step`-th, from `step - 1`), else a dense MLP of
    /// `intermediate_size_mlp`; a MoE layer routes top-k (`Llama4Router`: sigmoid of the
    /// chosen logits, scaling the expert's input) and adds the always-on shared expert of
    /// `intermediate_size`. Layer `i` uses RoPE iff `no_rope_layers[i]` is 1 (default: all
    /// but every `no_rope_layer_interval`-th); `layer_types` (default: chunked where RoPE,
    /// else full) picks chunked attention of `attention_chunk_size`; `NoPE` layers tune the
    /// attention temperature with `attn_temperature_tuning`.
    fn llama4_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let (experts, top_k) =
            self.experts_top_k(("num_local_experts", 16), ("num_experts_per_tok", 1))?;
        let intermediate = self.positive("intermediate_size", 8192)?;
        let mlp_intermediate = self.positive("intermediate_size_mlp", 16384)?;
        let n = num_layers as usize;
        let moe_layers: Vec<bool> = match o.opt_u64_list("moe_layers")? {
            Some(list) => {
                if let Some(&bad) = list.iter().find(|&&i| i >= num_layers) {
                    return Err(ConfigError::invalid(
                        "moe_layers",
                        bad,
                        format!("names a layer past num_hidden_layers ({num_layers})"),
                    ));
                }
                (0..num_layers).map(|i| list.contains(&i)).collect()
            }
            None => {
                let step = self.positive("interleave_moe_layer_step", 1)?;
                (0..num_layers).map(|i| (i + 1) % step == 0).collect()
            }
        };
        // `no_rope_layers`: 1 = RoPE (`use_rope = config.no_rope_layers[layer_idx]`).
        let rope: Vec<bool> = match o.opt_u64_list("no_rope_layers")?.filter(|l| !l.is_empty()) {
            Some(list) => {
                if list.len() != n {
                    return Err(ConfigError::invalid(
                        "no_rope_layers",
                        format!("an array of {} elements", list.len()),
                        format!("needs one 0/1 entry per layer ({num_layers})"),
                    ));
                }
                if let Some(i) = list.iter().position(|&v| v > 1) {
                    return Err(ConfigError::invalid(
                        format!("no_rope_layers[{i}]"),
                        list[i],
                        "must be 0 (no RoPE) or 1 (RoPE)",
                    ));
                }
                list.iter().map(|&v| v == 1).collect()
            }
            None => {
                let interval = self.positive("no_rope_layer_interval", 4)?;
                (0..num_layers).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let chunked: Vec<bool> = match o.opt_str_list("layer_types")? {
            Some(types) => {
                if types.len() != n {
                    return Err(ConfigError::invalid(
                        "layer_types",
                        format!("an array of {} elements", types.len()),
                        format!("needs one entry per layer ({num_layers})"),
                    ));
                }
                types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match *t {
                        "full_attention" => Ok(false),
                        "chunked_attention" => Ok(true),
                        other => Err(ConfigError::unsupported(
                            format!("layer_types[{i}]"),
                            format!("{other:?}"),
                            "full_attention, chunked_attention",
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            None => rope.clone(),
        };
        let chunk = if chunked.iter().any(|&c| c) {
            self.positive("attention_chunk_size", 8192)?
        } else {
            0
        };
        // Read as Python does (`if self.attn_temperature_tuning`): Scout ships it as 4.
        let tuning = match o.get("attn_temperature_tuning") {
            None => self.or_default("attn_temperature_tuning", None, true),
            Some(v) => match (v.as_bool(), v.as_f64()) {
                (Some(b), _) => b,
                (None, Some(x)) => x != 0.0,
                _ => {
                    return Err(ConfigError::invalid(
                        "attn_temperature_tuning",
                        describe(v),
                        "must be a boolean (or a number, read as Python's truth value)",
                    ));
                }
            },
        };
        let temperature = if tuning && rope.iter().any(|&r| !r) {
            let floor = o.opt_pos_f64("floor_scale")?;
            let attn = o.opt_f64("attn_scale")?;
            Some(TemperatureTuning {
                floor_scale: self.or_default("floor_scale", floor, 8192.0),
                attn_scale: self.or_default("attn_scale", attn, 0.1),
            })
        } else {
            None
        };
        let mut routing = Routing::top_k(RouterScoring::Sigmoid, TopKWeights::Raw);
        routing.weighting = ExpertWeighting::Input;
        let moe = MoeSpec {
            num_experts: experts,
            top_k,
            intermediate,
            routing,
            shared: Some(SharedExpert { intermediate, sigmoid_gate: false }),
        };
        Ok((0..n)
            .map(|index| LayerSpec {
                index,
                attention: if chunked[index] {
                    AttentionKind::Chunked { chunk }
                } else {
                    AttentionKind::Full
                },
                ffn: if moe_layers[index] {
                    FfnKind::Moe(moe.clone())
                } else {
                    FfnKind::Dense { intermediate: mlp_intermediate }
                },
                positions: if rope[index] {
                    Positions::Rope
                } else {
                    Positions::NoPe { temperature }
                },
            })
            .collect())
    }

    /// gpt-oss's experts (`GptOssExperts`): biases, and the clamped SwiGLU with transformers
    /// 4.57's fixed `alpha` 1.702 and `limit` 7.0; a `swiglu_limit` other than 7 (which
    /// transformers would ignore) is refused.
    fn gpt_oss_mlp(&mut self) -> Result<MlpSpec, ConfigError> {
        const LIMIT: f64 = 7.0;
        if let Some(l) = self.obj.opt_f64("swiglu_limit")?
            && l != LIMIT
        {
            return Err(ConfigError::unsupported(
                "swiglu_limit",
                l,
                "7.0 or absent (transformers 4.57's GptOssExperts clamps at 7.0 whatever the config says)",
            ));
        }
        Ok(MlpSpec {
            activation: Activation::ClampedSwiGlu { alpha: 1.702, limit: LIMIT },
            gated: true,
            bias: true,
        })
    }

    /// `GptOssConfig`'s default `rope_scaling` (a config without the key): YaRN, factor 32
    /// over 4096 original positions, `beta_fast` 32, `beta_slow` 1, not truncated.
    fn gpt_oss_default_rope(&mut self) -> RopeScaling {
        self.defaulted.insert(
            "rope_scaling",
            "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false, \"original_max_position_embeddings\": 4096}".into(),
        );
        RopeScaling::Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 0.0,
            mscale_all_dim: 0.0,
            attention_factor: yarn_mscale(32.0, 1.0),
            truncate: false,
        }
    }

    /// Phi-3.5-MoE (`PhimoeDecoderLayer`): every layer MoE of `num_local_experts` (default
    /// 16) experts of `intermediate_size` (default 6400), routed by the `sparsemixer`, which
    /// raises unless `num_experts_per_tok` is 2; `sliding_window` (default none) on every
    /// layer, as Mixtral's.
    fn phimoe_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let experts = o.opt_size("num_local_experts")?;
        let experts = self.or_default("num_local_experts", experts, 16);
        let top_k = o.opt_size("num_experts_per_tok")?;
        let top_k = self.or_default("num_experts_per_tok", top_k, 2);
        if top_k != 2 || experts < 2 {
            return Err(ConfigError::unsupported(
                "num_experts_per_tok",
                top_k,
                format!(
                    "2 of at least 2 experts (num_local_experts {experts}): Phi-3.5-MoE's sparsemixer router chooses exactly two"
                ),
            ));
        }
        let intermediate = o.opt_size("intermediate_size")?;
        let intermediate = self.or_default("intermediate_size", intermediate, 6400);
        if intermediate == 0 {
            return Err(ConfigError::invalid("intermediate_size", 0, "must be at least 1"));
        }
        let jitter = o.opt_f64("router_jitter_noise")?;
        let jitter_eps = self.or_default("router_jitter_noise", jitter, 0.01);
        if !(jitter_eps.is_finite() && jitter_eps >= 0.0) {
            return Err(ConfigError::invalid(
                "router_jitter_noise",
                jitter_eps,
                "must be a finite number >= 0",
            ));
        }
        let mut routing = Routing::top_k(RouterScoring::Softmax, TopKWeights::Raw);
        routing.sparse_mixer = Some(SparseMixer { jitter_eps });
        let moe = MoeSpec { num_experts: experts, top_k, intermediate, routing, shared: None };
        // Phi-3.5-MoE ships `sliding_window` = `max_position_embeddings` (131072): no position
        // ever sees past it, full attention. A shorter window is refused: transformers 4.57
        // masks it by absolute position over its sliding cache's last `window - 1` entries,
        // so a decode past the window drops more than the window (not a model to match).
        if o.opt_size("sliding_window")?.is_some() {
            let window = self.window("")?;
            let max = o.req_pos("max_position_embeddings")?;
            if window < max {
                return Err(ConfigError::unsupported(
                    "sliding_window",
                    window,
                    format!(
                        "null or at least max_position_embeddings ({max}): transformers 4.57's phimoe decode masks a shorter window by absolute position over its sliding cache"
                    ),
                ));
            }
        }
        Ok(uniform_moe_layers(num_layers, AttentionKind::Full, &moe))
    }

    /// Hunyuan (`HunYuanMoEV1DecoderLayer`): every layer MoE, `num_experts` experts (one
    /// integer, or one per layer) of `intermediate_size`, the top-`moe_topk` of the f32
    /// softmax renormalised (`HunYuanMoEV1Gate` keeps `wg` in f32; the weights are cast to the
    /// activations' dtype), and the shared MLP of `intermediate_size`, ungated. The shipped
    /// config's `moe_intermediate_size` and `num_shared_expert` lists are not read by
    /// transformers: values that would describe another model are refused.
    fn hunyuan_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let intermediate = self.positive("intermediate_size", 11008)?;
        let per_layer = |parser: &mut Self, field: &'static str| -> Result<Vec<u64>, ConfigError> {
            let values = o.opt_per_layer(field, num_layers)?;
            if values.is_none() {
                parser.or_default(field, None, 1);
            }
            Ok(values.unwrap_or_else(|| vec![1; num_layers as usize]))
        };
        let experts = per_layer(self, "num_experts")?;
        let top_k = per_layer(self, "moe_topk")?;
        for (field, want) in [("moe_intermediate_size", intermediate), ("num_shared_expert", 1)] {
            if let Some(values) = o.opt_per_layer(field, num_layers)?
                && let Some((i, v)) = values.iter().enumerate().find(|(_, v)| **v != want)
            {
                return Err(ConfigError::unsupported(
                    format!("{field}[{i}]"),
                    v,
                    format!(
                        "{want} or absent (transformers 4.57's Hunyuan builds every expert and its one shared MLP of intermediate_size)"
                    ),
                ));
            }
        }
        for (field, want) in [("use_cla", false), ("use_mixed_mlp_moe", true)] {
            if let Some(v) = o.opt_bool(field)?
                && v != want
            {
                return Err(ConfigError::unsupported(
                    field,
                    v,
                    format!("{want} or absent (transformers 4.57's Hunyuan does not read it)"),
                ));
            }
        }
        let mut routing = Routing::top_k(RouterScoring::Softmax, TopKWeights::Renormalized);
        routing.precision = RouterPrecision::F32Logits;
        let shared = Some(SharedExpert { intermediate, sigmoid_gate: false });
        (0..num_layers as usize)
            .map(|index| {
                let (e, k) = (experts[index], top_k[index]);
                if e == 0 {
                    return Err(ConfigError::invalid(
                        format!("num_experts[{index}]"),
                        0,
                        "must be at least 1",
                    ));
                }
                if k == 0 || k > e {
                    return Err(ConfigError::invalid(
                        format!("moe_topk[{index}]"),
                        k,
                        format!("must be 1..=num_experts ({e}) for layer {index}"),
                    ));
                }
                let moe = MoeSpec { num_experts: e, top_k: k, intermediate, routing, shared };
                Ok(LayerSpec {
                    index,
                    attention: AttentionKind::Full,
                    ffn: FfnKind::Moe(moe),
                    positions: Positions::Rope,
                })
            })
            .collect()
    }

    /// Granite MoE (`GraniteMoeDecoderLayer`): every layer MoE (`GraniteMoeTopKGating`:
    /// top-k of the router logits, a softmax over those k), full attention.
    fn granite_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let (experts, top_k) =
            self.experts_top_k(("num_local_experts", 8), ("num_experts_per_tok", 2))?;
        let intermediate = o.req_pos("intermediate_size")?;
        let moe = MoeSpec {
            num_experts: experts,
            top_k,
            intermediate,
            routing: Routing::top_k(RouterScoring::Softmax, TopKWeights::Renormalized),
            shared: None,
        };
        Ok(uniform_moe_layers(num_layers, AttentionKind::Full, &moe))
    }

    /// ERNIE-4.5 MoE (`Ernie4_5_MoeDecoderLayer`): layer `i` is MoE iff `(i + 1) %
    /// moe_layer_interval == 0` and `moe_layer_start_index <= i <= moe_layer_end_index` (-1:
    /// the last layer), else a dense MLP of `intermediate_size`. A MoE layer
    /// (`Ernie4_5_MoeSparseMoeBlock`): `moe_num_experts` experts of `moe_intermediate_size`,
    /// top-`moe_k` of the f32 softmax plus `e_score_correction_bias`, the unbiased scores
    /// renormalised (`moe_norm_min` floors the sum), and `moe_num_shared_experts` shared
    /// experts as one MLP.
    fn ernie_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let (experts, top_k) = self.experts_top_k(("moe_num_experts", 64), ("moe_k", 6))?;
        let moe_intermediate = self.positive("moe_intermediate_size", 1536)?;
        let intermediate = self.positive("intermediate_size", 12288)?;
        let shared = o.opt_u64("moe_num_shared_experts")?;
        let shared = self.or_default("moe_num_shared_experts", shared, 2);
        let start = o.opt_u64("moe_layer_start_index")?;
        let start = self.or_default("moe_layer_start_index", start, 1);
        let end = match o.get("moe_layer_end_index").and_then(|v| v.as_i64()) {
            Some(-1) | None => {
                if !o.has("moe_layer_end_index") {
                    self.or_default("moe_layer_end_index", None, -1);
                }
                num_layers - 1
            }
            Some(e) if e >= 0 => e as u64,
            Some(e) => {
                return Err(ConfigError::invalid(
                    "moe_layer_end_index",
                    e,
                    "must be a layer index, or -1 for the last layer",
                ));
            }
        };
        let interval = self.positive("moe_layer_interval", 1)?;
        if let Some(m) = o.opt_f64("moe_norm_min")?
            && !(m.is_finite() && (0.0..1e-6).contains(&m))
        {
            return Err(ConfigError::unsupported(
                "moe_norm_min",
                m,
                "a floor below 1e-6 (the renormalising sum of k softmax scores is never that small here)",
            ));
        }
        let mut routing = Routing::top_k(RouterScoring::Softmax, TopKWeights::Renormalized);
        routing.correction_bias = true;
        routing.precision = RouterPrecision::F32Logits;
        let moe = MoeSpec {
            num_experts: experts,
            top_k,
            intermediate: moe_intermediate,
            routing,
            shared: (shared > 0).then_some(SharedExpert {
                intermediate: shared * moe_intermediate,
                sigmoid_gate: false,
            }),
        };
        Ok((0..num_layers)
            .map(|i| LayerSpec {
                index: i as usize,
                attention: AttentionKind::Full,
                ffn: if (i + 1) % interval == 0 && (start..=end).contains(&i) {
                    FfnKind::Moe(moe.clone())
                } else {
                    FfnKind::Dense { intermediate }
                },
                positions: Positions::Rope,
            })
            .collect())
    }

    /// Granite's `embedding_multiplier`, `residual_multiplier`, `logits_scaling` (class
    /// defaults 1); the other families have none and would ignore them, so they are refused.
    fn multipliers(&mut self, family: Family) -> Result<Multipliers, ConfigError> {
        const FIELDS: [&str; 3] = ["embedding_multiplier", "residual_multiplier", "logits_scaling"];
        if family != Family::GraniteMoe {
            for field in FIELDS {
                if let Some(v) = self.obj.get(field) {
                    return Err(ConfigError::unsupported(
                        field,
                        describe(v),
                        format!("absent (not part of the {} architecture)", family.model_type()),
                    ));
                }
            }
            return Ok(Multipliers::IDENTITY);
        }
        let mut read = |field: &'static str| -> Result<f64, ConfigError> {
            let v = self.obj.opt_pos_f64(field)?;
            Ok(self.or_default(field, v, 1.0))
        };
        Ok(Multipliers {
            embedding: read(FIELDS[0])?,
            residual: read(FIELDS[1])?,
            logits_divisor: read(FIELDS[2])?,
        })
    }

    /// Mixtral: `MixtralAttention` passes `config.sliding_window` to every layer; `null` (as in
    /// Mixtral-8x7B) means full attention.
    fn mixtral_layers(&mut self, num_layers: u64) -> Result<Vec<LayerSpec>, ConfigError> {
        let o = self.obj;
        let num_experts = self.num_experts()?;
        if num_experts == 0 {
            return Err(ConfigError::invalid("num_local_experts", 0, "must be at least 1"));
        }
        if o.opt_bool("norm_topk_prob")? == Some(false) {
            return Err(ConfigError::unsupported(
                "norm_topk_prob",
                false,
                "true or absent (Mixtral always renormalises the top-k weights)",
            ));
        }
        let moe = self.moe(num_experts, "intermediate_size", TopKWeights::Renormalized)?;
        let attention = match o.opt_size("sliding_window")? {
            None => AttentionKind::Full,
            Some(_) => AttentionKind::Sliding { window: self.window("")? },
        };
        if let Some(types) = self.layer_types(num_layers)? {
            let want = matches!(attention, AttentionKind::Sliding { .. });
            if let Some(i) = types.iter().position(|&s| s != want) {
                return Err(ConfigError::invalid(
                    format!("layer_types[{i}]"),
                    if types[i] { "\"sliding_attention\"" } else { "\"full_attention\"" },
                    "Mixtral uses sliding_window in every layer or in none",
                ));
            }
        }
        Ok(uniform_moe_layers(num_layers, attention, &moe))
    }

    fn window(&self, why: &str) -> Result<u64, ConfigError> {
        let o = self.obj;
        let w = o.opt_size("sliding_window")?.ok_or_else(|| ConfigError::Missing {
            field: "sliding_window".into(),
            hint: if why.is_empty() { String::new() } else { format!(" ({why})") },
        })?;
        if w == 0 {
            return Err(ConfigError::invalid("sliding_window", 0, "must be at least 1"));
        }
        Ok(w)
    }

    /// `layer_types`: one `"full_attention"` / `"sliding_attention"` per layer; `true` = sliding.
    fn layer_types(&self, num_layers: u64) -> Result<Option<Vec<bool>>, ConfigError> {
        let Some(types) = self.obj.opt_str_list("layer_types")? else {
            return Ok(None);
        };
        if types.len() as u64 != num_layers {
            return Err(ConfigError::invalid(
                "layer_types",
                format!("an array of {} elements", types.len()),
                format!("needs one entry per layer ({num_layers})"),
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match *t {
                "full_attention" => Ok(false),
                "sliding_attention" => Ok(true),
                other => Err(ConfigError::unsupported(
                    format!("layer_types[{i}]"),
                    format!("{other:?}"),
                    "full_attention, sliding_attention",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// Fields that other MoE families use for shared experts or dense prefixes. The modeling
    /// code of these families ignores them, so a config carrying them is probably not the model
    /// it claims to be; refuse instead of silently building the wrong network.
    fn reject_foreign_fields(&self, family: Family) -> Result<(), ConfigError> {
        if matches!(family, Family::DeepseekV3 | Family::DeepseekV2) {
            // These are the DeepSeek families' own fields (read in `deepseek_moe_layers`).
            return Ok(());
        }
        let mut fields = vec![];
        if family != Family::Glm4Moe {
            fields.extend(["first_k_dense_replace", "n_shared_experts"]);
        }
        if family != Family::Qwen2Moe {
            fields.push("shared_expert_intermediate_size");
        }
        if matches!(family, Family::Glm4Moe | Family::Ernie45Moe | Family::HunyuanMoe) {
            fields.extend(["mlp_only_layers", "use_sliding_window"]);
        }
        if matches!(
            family,
            Family::Mixtral
                | Family::Olmoe
                | Family::GptOss
                | Family::Llama4
                | Family::GraniteMoe
                | Family::Phimoe
        ) {
            fields.extend(["mlp_only_layers", "moe_intermediate_size", "use_sliding_window"]);
        }
        for field in fields {
            let Some(v) = self.obj.get(field) else {
                continue;
            };
            let harmless = v.as_u64() == Some(0)
                || v.as_array().is_some_and(Vec::is_empty)
                || (field == "use_sliding_window" && v.as_bool() == Some(false));
            if !harmless {
                return Err(ConfigError::unsupported(
                    field,
                    describe(v),
                    format!("absent (not part of the {} architecture)", family.model_type()),
                ));
            }
        }
        Ok(())
    }
}

/// `num_layers` layers alike: `attention`, the MoE `moe`, RoPE (`OLMoE`, Mixtral, Granite,
/// Phi-3.5-MoE).
fn uniform_moe_layers(num_layers: u64, attention: AttentionKind, moe: &MoeSpec) -> Vec<LayerSpec> {
    (0..num_layers as usize)
        .map(|index| LayerSpec {
            index,
            attention,
            ffn: FfnKind::Moe(moe.clone()),
            positions: Positions::Rope,
        })
        .collect()
}

/// What a family's `rope_scaling` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScalingRule {
    /// Only the default type (`null`, or `rope_type: "default"`).
    DefaultOnly,
    /// The default, or YaRN.
    Yarn,
    /// Any dict is Llama 3's bands (`Llama4TextRotaryEmbedding` reads it so whatever its
    /// `rope_type`: another type named is refused).
    Llama3,
    /// The default, or `LongRoPE` (Phi-3.5-MoE).
    LongRope,
    /// The default, or `"dynamic"` with an `alpha` (Hunyuan).
    NtkAlpha,
}

/// Hunyuan's `rope_scaling` of type `"dynamic"`: its `alpha` raises the base
/// ([`RopeScaling::NtkAlpha`]); the other keys it ships (`factor`, `beta_*`, `mscale*`) only
/// matter past `max_position_embeddings`, where no position goes.
fn ntk_alpha(p: &Obj<'_>, rotary_dim: u64) -> Result<RopeScaling, ConfigError> {
    // `config.rope_scaling["alpha"]`: transformers raises without one.
    let alpha = p.opt_f64("alpha")?.ok_or_else(|| p.missing("alpha"))?;
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(ConfigError::invalid(p.path("alpha"), alpha, "must be a number > 0"));
    }
    if rotary_dim <= 2 {
        return Err(ConfigError::invalid(
            "head_dim",
            rotary_dim,
            "the NTK alpha raises the base to d / (d - 2): head_dim must be more than 2",
        ));
    }
    Ok(RopeScaling::NtkAlpha { alpha })
}

/// A `rope_scaling` of type `"longrope"` as `PhimoeConfig` / `PhimoeRotaryEmbedding` read it:
/// both factor lists (`rotary_dim / 2` each), both mscales (`PhimoeConfig` requires them) and
/// `original_max_position_embeddings` (the forward pass indexes it). `factor` and
/// `attention_factor` only feed a scale the mscales replace.
fn long_rope(p: &Obj<'_>, rotary_dim: u64) -> Result<LongRope, ConfigError> {
    const KEYS: &[&str] = &[
        "type",
        "rope_type",
        "short_factor",
        "long_factor",
        "short_mscale",
        "long_mscale",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    ];
    if let Some(key) = p.keys().find(|k| !KEYS.contains(k)) {
        return Err(ConfigError::unsupported(
            p.path(key),
            p.get(key).map_or_else(|| "null".into(), describe),
            format!("absent (the longrope rope_scaling keys are {})", KEYS.join(", ")),
        ));
    }
    let factors = |key: &str| -> Result<Vec<f64>, ConfigError> {
        let list = p.get(key).and_then(Value::as_array).ok_or_else(|| p.missing(key))?;
        let values: Option<Vec<f64>> =
            list.iter().map(|v| v.as_f64().filter(|f| f.is_finite() && *f > 0.0)).collect();
        match values {
            Some(v) if v.len() as u64 == rotary_dim / 2 => Ok(v),
            _ => Err(ConfigError::invalid(
                p.path(key),
                format!("an array of {} elements", list.len()),
                format!("needs {} finite numbers > 0 (head_dim / 2)", rotary_dim / 2),
            )),
        }
    };
    let mscale = |key: &str| -> Result<f64, ConfigError> {
        let v = p.opt_f64(key)?.ok_or_else(|| p.missing(key))?;
        if !v.is_finite() {
            return Err(ConfigError::invalid(p.path(key), v, "must be a finite number"));
        }
        Ok(v)
    };
    let original = p
        .opt_size("original_max_position_embeddings")?
        .filter(|&n| n != 0)
        .ok_or_else(|| p.missing("original_max_position_embeddings"))?;
    Ok(LongRope {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        short_mscale: mscale("short_mscale")?,
        long_mscale: mscale("long_mscale")?,
        original_max_position_embeddings: original,
    })
}

/// A Llama 3 `rope_scaling` (`_compute_llama3_parameters` reads all four keys).
fn llama3(p: &Obj<'_>) -> Result<Llama3Scaling, ConfigError> {
    const KEYS: &[&str] = &[
        "type",
        "rope_type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ];
    if let Some(key) = p.keys().find(|k| !KEYS.contains(k)) {
        return Err(ConfigError::unsupported(
            p.path(key),
            p.get(key).map_or_else(|| "null".into(), describe),
            format!("absent (the llama3 rope_scaling keys are {})", KEYS.join(", ")),
        ));
    }
    let key = if p.has("rope_type") { "rope_type" } else { "type" };
    if let Some(t) = p.opt_str(key)?
        && t != "llama3"
    {
        return Err(ConfigError::unsupported(
            p.path(key),
            format!("{t:?}"),
            "\"llama3\" (Llama 4 reads any rope_scaling as llama3)",
        ));
    }
    let positive = |key: &str| -> Result<f64, ConfigError> {
        let v = p.opt_f64(key)?.ok_or_else(|| p.missing(key))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(ConfigError::invalid(p.path(key), v, "must be a finite number > 0"));
        }
        Ok(v)
    };
    let (factor, low, high) =
        (positive("factor")?, positive("low_freq_factor")?, positive("high_freq_factor")?);
    if high <= low {
        return Err(ConfigError::invalid(
            p.path("high_freq_factor"),
            high,
            format!("must be more than low_freq_factor ({low})"),
        ));
    }
    let original = p
        .opt_size("original_max_position_embeddings")?
        .filter(|&n| n != 0)
        .ok_or_else(|| p.missing("original_max_position_embeddings"))?;
    Ok(Llama3Scaling {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original,
    })
}

/// `rope_type` (or the legacy `type` key) must be `"default"`, or absent.
fn check_rope_type(o: &Obj<'_>) -> Result<(), ConfigError> {
    let key = if o.has("rope_type") { "rope_type" } else { "type" };
    match o.opt_str(key)? {
        None | Some("default") => Ok(()),
        Some(other) => Err(ConfigError::unsupported(o.path(key), format!("{other:?}"), "default")),
    }
}
