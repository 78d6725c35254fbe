//! What a plan is asked for and the terms the planners share: the options
//! ([`PlanOptions`]), the model's dimensions as the kernel uses them ([`Dims`]), why a plan
//! fails ([`PlanError`]), and checked byte arithmetic. The streaming planner
//! ([`crate::plan`]) and the sharding planner ([`crate::shard`]) both build on this module,
//! and the plan calls the sharding planner: the dependency goes one way.

use palladium_dsl::spec::Chip;
use palladium_model::quant::WeightsDtype;
use palladium_model::spec::{ExpertGroups, MlaSpec, RouterScoring};
use serde::Serialize;

const GIB: u64 = 1 << 30;

/// What to plan for.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub chip: Chip,
    pub batch: u64,
    /// KV-cache capacity in positions (the step attends over up to this many).
    pub context: u64,
    /// Use only the first N layers (`--layers`).
    pub layers: Option<usize>,
    /// Refuse models whose operands exceed the chip's HBM (off only to time emission of
    /// models that need more than one chip).
    pub check_hbm: bool,
    pub kv_tiles: KvTiles,
    pub prefetch: Prefetch,
    /// New tokens per sequence in one step (`--tokens-per-seq`, 1..=16): consecutive
    /// positions `p..p+K-1`, causal among themselves (a speculative verify step).
    pub tokens_per_seq: u64,
    /// Also return the full f32 logits (`--logits`); the greedy ids and each row's
    /// maximum logit are always returned.
    pub logits: bool,
    pub expert_fetch: ExpertFetch,
    /// Devices the step is split over (`--devices`, one of [`crate::shard::DEVICE_COUNTS`]):
    /// the plan is then each device's ([`crate::shard`]).
    pub devices: u64,
    /// The weights' dtype (`--weights-dtype`; [`crate::plan::weights_dtype`] resolves it
    /// against the config): bf16, or one of issue 16's quantization schemes
    /// ([`crate::layout::QuantLayout`]).
    pub weights: WeightsDtype,
}

impl PlanOptions {
    /// All layers, HBM checked, KV read up to each position, one token per sequence, the
    /// full logits returned.
    pub fn new(chip: Chip, batch: u64, context: u64) -> PlanOptions {
        PlanOptions {
            chip,
            batch,
            context,
            layers: None,
            check_hbm: true,
            kv_tiles: KvTiles::UpToPosition,
            prefetch: Prefetch::Deep,
            tokens_per_seq: 1,
            logits: true,
            expert_fetch: ExpertFetch::Distinct,
            devices: 1,
            weights: WeightsDtype::Bf16,
        }
    }
}

/// How far the weight streams run ahead of their use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Prefetch {
    /// A dense ring of ~24 MiB (v5e/v6e; 16 MiB on 64 MiB-VMEM chips) of ~4 MiB banks
    /// (`banks - 1` chunks in flight, across op and layer boundaries) and the expert ring
    /// (2 chunks in flight): what a step runs.
    #[default]
    Deep,
    /// At most two chunks of a stream in flight at once, as in a double-buffered Pallas
    /// pipeline (the HBM floor's stream kernel, which issues the next block before waiting
    /// for the current one): 3 dense banks (two chunks ahead) and the expert ring (two chunks
    /// in flight through each chunk's compute). A cost variant for libtpu's static
    /// estimator, which gives concurrent DMAs each their own bandwidth (the same bytes
    /// estimate 727k cycles with 2 banks, 517k with 3, 338k with 6: Qwen3-30B-A3B, 1 layer,
    /// v6e). Same results.
    Single,
}

/// Which KV-cache tiles a step reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum KvTiles {
    /// The tiles up to each sequence's position (a run-time trip count): what a step needs.
    #[default]
    UpToPosition,
    /// Every tile of the cache, masked past the position (a static trip count): the same
    /// results at the cost of a full-context step, for libtpu's static estimator, which
    /// prices no loop with a run-time trip count (as `decode_attention`'s
    /// `bench_full_context`).
    All,
}

/// How many experts a step's expert stream fetches (each distinct expert once either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum ExpertFetch {
    /// The distinct experts the step's rows chose (a run-time count): what a step needs.
    #[default]
    Distinct,
    /// The static worst case, `min(experts, batch * K * top_k)` (`--worst-case-experts`):
    /// the same results at the cost of the worst routing, for libtpu's static estimator,
    /// which prices no loop with a run-time trip count.
    WorstCase,
}

/// Model dimensions as the kernel uses them (padded where the TPU tiling needs it).
#[derive(Clone, Debug, Serialize)]
pub struct Dims {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// `head_dim` rounded up to 128 lanes: every head is a lane-aligned column block.
    pub head_pad: u64,
    pub group: u64,
    pub experts: u64,
    /// The experts whose weights this device holds: all of them on one device and under
    /// tensor-parallel experts, `experts / devices` (padded) under expert parallelism.
    pub experts_per_device: u64,
    /// `experts` rounded up to 128 (the router's padded columns are masked to -inf); with a
    /// sigmoid-gated shared expert, `experts + 1`: column `experts` is its gate's logit.
    pub experts_pad: u64,
    pub top_k: u64,
    pub intermediate: u64,
    /// The dense-MLP layers' intermediate size (this device's columns: split like TP
    /// experts', padded to 128 lanes per device), where the planned layers mix dense-MLP
    /// layers among MoE layers; `None` when every layer is MoE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_intermediate: Option<u64>,
    /// The MoE layers' shared expert's intermediate size (this device's columns, split
    /// like a dense MLP's), where the model has one; `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_intermediate: Option<u64>,
    /// The shared expert's output is scaled by `sigmoid(x @ shared_expert_gate)` (Qwen2-MoE).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shared_gate: bool,
    pub vocab: u64,
    pub batch: u64,
    /// New tokens per sequence in one step (`K`).
    pub tokens_per_seq: u64,
    /// Token rows of the step, `batch * tokens_per_seq`: row `b * K + k` is sequence `b`'s
    /// `k`-th new token.
    pub tokens: u64,
    /// Rows of every activation matrix: `tokens` rounded up to 16 (a bf16 tile).
    pub rows: u64,
    /// Rows of one (kv group, sequence) attention: the group's query heads for each of the
    /// sequence's K tokens (token-major: row `k * group + j`), rounded up to 16 so scores
    /// and probabilities are bf16 MXU operands, whatever the batch.
    pub attn_rows: u64,
    pub eps: f64,
    /// The norms (input, post-attention, final) are `nn.LayerNorm`s without bias (DBRX):
    /// the mean subtracted, the biased variance; their weights fold as RMS norms' do.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub layer_norm: bool,
    pub rope_theta: f64,
    pub scale: f64,
    pub qk_norm: bool,
    /// Hunyuan: the per-head q/k norms follow RoPE (`QkNorm::PerHeadRmsAfterRope`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_after_rope: bool,
    /// `OLMoE`'s q/k RMS norms over the whole q and k projections (`QkNorm::WholeRms`):
    /// `head_norms` then holds a row per q and k head (each head's slice of the weight).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub whole_qk_norm: bool,
    /// `OLMoE`'s `clip_qkv`: q and k (after their norms) and v clamped to `[-c, c]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_qkv: Option<f64>,
    /// Biases on the q/k/v projections (the `qkv_bias` operand), added to each head as
    /// the attention stage reads it.
    pub qkv_bias: bool,
    /// A bias on `o_proj` (the `o_bias` operand), added once after the all-reduce.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub o_bias: bool,
    /// The sliding layers' window (every layer's where `sliding_layers` is `None`).
    pub window: Option<u64>,
    /// Where the planned layers mix sliding and full attention (gpt-oss's `layer_types`):
    /// the sliding ones; the others attend to the whole cache. `None`: every layer has
    /// `window`'s attention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_layers: Option<Vec<u64>>,
    /// gpt-oss's attention sinks: a learned logit per head in its softmax denominator
    /// (the `sinks` operand, a row per query row of each kv group's attention).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sinks: bool,
    /// RoPE's inverse frequencies and the factor on `cos`/`sin` where the model scales
    /// them (YaRN: computed on the host as the model does); `None`: `theta^(-2i/d)`, 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_table: Option<(Vec<f32>, f64)>,
    /// A bias on the router's logits (gpt-oss; the `router_bias` operand, a row per MoE
    /// layer), added before the scoring and the choice.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub router_bias: bool,
    /// Biases on the experts' gate, up and down projections (gpt-oss; the `expert_bias`
    /// operand, fetched with each expert chunk).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub expert_bias: bool,
    /// gpt-oss's clamped SwiGLU `(alpha, limit)` ([`palladium_kernels::body::Glu`]);
    /// `None`: `silu(gate) * up`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clamped_swiglu: Option<(f64, f64)>,
    /// How the router scores its logits before the top-k (the config's, as data).
    pub scoring: RouterScoring,
    pub renormalize: bool,
    /// `DeepSeek`-V3's router (GLM-4.5): `e_score_correction_bias` added to the scores to
    /// choose the experts (the `router_bias` operand, a row per layer), never to weigh them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub correction_bias: bool,
    /// Group-limited choice `(n_group, topk_group)`; `None` for one group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_groups: Option<ExpertGroups>,
    /// `routed_scaling_factor` on the chosen experts' weights (1 where the model has none).
    #[serde(skip_serializing_if = "is_one")]
    pub routed_scaling: f64,
    /// Partial rotary: the first `rotary_dim` lanes of each q/k head rotated, the rest
    /// passed through (GLM-4.5's `partial_rotary_factor`); `None` when the whole head is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<u64>,
    /// KV-cache positions (context rounded up to `block_kv`).
    pub positions: u64,
    /// Multi-head latent attention's sizes (`DeepSeek`), where the model has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSpec>,
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl Dims {
    /// Rows of one layer's `qkv_bias`: a row per q, k and v head (the q/k/v projection's
    /// heads in order, each padded to `head_pad`), rounded up to 8 sublanes.
    pub fn qkv_bias_rows(&self) -> u64 {
        (self.heads + 2 * self.kv_heads).next_multiple_of(8)
    }

    /// Rows of one layer's `head_norms`: `q_norm` and `k_norm` in rows 0 and 1 of 8
    /// (per-head norms), or a row per q head then per k head, rounded up to 8 sublanes
    /// (norms over the whole projections).
    pub fn head_norm_rows(&self) -> u64 {
        if self.whole_qk_norm { (self.heads + self.kv_heads).next_multiple_of(8) } else { 8 }
    }

    /// Whether the plan has the `head_norms` operand.
    pub fn head_norms(&self) -> bool {
        self.qk_norm || self.whole_qk_norm
    }

    /// Bytes of one layer's `o_bias` row block (`f32[8, hidden]`, row 0), 0 without it.
    pub fn o_bias_bytes(&self) -> u64 {
        if self.o_bias { 4 * 8 * self.hidden } else { 0 }
    }

    /// Bytes of one layer's `sinks` block (`f32[kv_heads, attn_rows, 128]`: each kv
    /// group's query rows, the sink of the row's head in every lane), 0 without sinks.
    pub fn sinks_bytes(&self) -> u64 {
        if self.sinks { 4 * self.kv_heads * self.attn_rows * 128 } else { 0 }
    }

    /// Bytes of one MoE layer's `router_bias` row block (`f32[8, experts_pad]`, row 0), 0
    /// without the bias.
    pub fn router_bias_bytes(&self) -> u64 {
        if self.router_bias { 4 * 8 * self.experts_pad } else { 0 }
    }

    /// Lanes of an `expert_bias` chunk block: the chunk's gate and up biases (`2 * block`)
    /// in row 0, the expert's down bias (`hidden`) in row 1.
    pub fn expert_bias_lanes(&self, block: u64) -> u64 {
        (2 * block).max(self.hidden)
    }

    /// Whether layer `l`'s attention slides.
    pub fn slides(&self, l: u64) -> bool {
        self.window.is_some() && self.sliding_layers.as_ref().is_none_or(|s| s.contains(&l))
    }

    /// Bytes of one layer's `correction_bias` row block (`f32[8, experts_pad]`, row 0),
    /// 0 without the bias.
    pub fn correction_bias_bytes(&self) -> u64 {
        if self.correction_bias { 4 * 8 * self.experts_pad } else { 0 }
    }

    /// The kernel's sizes of these (per-device) dims: the hidden size and every
    /// intermediate size rounded up to whole 128-lane tiles, a shared expert's to whole
    /// experts' (its chunks stream as entries of `w_experts`). The padding is zero in
    /// every weight (the source maps map it to no checkpoint element): padded hidden lanes
    /// of the residual stream stay zero (the embedding, `o_proj` and the down projections
    /// write none there; the RMS norms divide by the model's size), and padded
    /// intermediate columns add `silu(0) * 0 = 0`. The plan's `model_dims` keep the
    /// model's sizes.
    pub fn tiled(self) -> Dims {
        let intermediate = round_up(self.intermediate, 128);
        Dims {
            hidden: round_up(self.hidden, 128),
            intermediate,
            dense_intermediate: self.dense_intermediate.map(|i| round_up(i, 128)),
            shared_intermediate: self.shared_intermediate.map(|s| round_up(s, intermediate)),
            ..self
        }
    }

    /// The most distinct experts a step's rows choose, `min(experts, batch * K * top_k)`
    /// (of this device's): the expert stream's static worst case.
    pub fn distinct_experts(&self) -> u64 {
        self.experts_per_device.min(self.tokens * self.top_k)
    }
}

/// Why a model cannot be planned.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("invalid option: {0}")]
    Invalid(String),
    #[error(
        "does not fit {chip} HBM: the operands need {need} bytes ({need_gib:.2} GiB: {detail}), {chip} has {have} bytes ({have_gib:.2} GiB) usable per device (at most {max_layers} of the model's layers fit{split})"
    )]
    Hbm {
        chip: Chip,
        need: u64,
        need_gib: f64,
        have: u64,
        have_gib: f64,
        detail: String,
        max_layers: u64,
        split: String,
    },
    #[error(
        "does not fit {chip} VMEM: the plan needs {need} bytes ({need_mib:.2} MiB: {detail}), {chip} has {have} bytes ({have_mib} MiB) per core"
    )]
    Vmem { chip: Chip, need: u64, need_mib: f64, have: u64, have_mib: u64, detail: String },
    #[error("cannot split the model over {devices} devices (--devices {devices}): {reason}")]
    Split { devices: u64, reason: String },
    #[error(
        "does not fit {devices} {chip} devices: the operands need {need} bytes ({need_gib:.2} GiB) per device, {chip} has {have} bytes ({have_gib:.2} GiB) usable per device; {needed}"
    )]
    Devices {
        devices: u64,
        chip: Chip,
        need: u64,
        need_gib: f64,
        have: u64,
        have_gib: f64,
        needed: String,
    },
    #[error("the rewrites did not {0}")]
    Rewrite(String),
    /// A byte count past `u64`: no chip holds it, and nothing is allocated for it.
    #[error("does not fit any chip: {what} would take more than 2^64 bytes")]
    TooLarge { what: String },
}

/// `factors` multiplied, or [`PlanError::TooLarge`] naming `what` when the product passes
/// `u64` (config sizes are at most 2^24 each, so products of several can).
pub(crate) fn product(what: &str, factors: &[u64]) -> Result<u64, PlanError> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| PlanError::TooLarge { what: what.to_string() })
}

/// A checked sum, as [`product`].
pub(crate) fn total(what: &str, terms: &[u64]) -> Result<u64, PlanError> {
    terms
        .iter()
        .try_fold(0u64, |acc, &t| acc.checked_add(t))
        .ok_or_else(|| PlanError::TooLarge { what: what.to_string() })
}

/// HBM left to the megakernel's operands: the device's, less 1 GiB that stays with the
/// runtime and XLA.
pub fn hbm_usable_bytes(chip: Chip) -> u64 {
    chip.target().hbm_bytes_per_device() - GIB
}

/// `x` rounded up to a multiple of `m`.
pub(crate) fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}
