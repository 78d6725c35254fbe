//! The streaming plan: everything about the megakernel that is decided before tracing.
//!
//! - **Rewrites**: the per-layer graph and the final norm + `lm_head` are rewritten with
//!   [`crate::rewrite`]; the plan requires (and the report shows) that q/k/v became one
//!   projection, gate/up one, and that every RMS-norm scale feeding a matmul was folded into
//!   its weight rows.
//! - **Stacking and host layout**: per-layer weights are stacked along a leading layer
//!   axis; the q/k/v, `o_proj` and router weights of a layer form the layer's part of one
//!   *dense stream* array of `[hidden, chunk_cols]` chunks, and `lm_head` continues that
//!   array with chunks of the same shape: one array, so every prefetch (across layers and
//!   into `lm_head`) is one unconditional DMA from a computed chunk index. Expert weights
//!   are stacked `[layer, expert, chunk, ..]` so each DMA chunk is contiguous in HBM. The
//!   exact operand interface is documented in the crate docs.
//! - **The dense ring**: `banks` VMEM banks of one chunk each; chunk `g` of the global dense
//!   sequence (layer-major, then `lm_head`) lands in bank `g mod banks`, and is issued
//!   `depth = banks - 1` chunks ahead of its use, across op and layer boundaries (so while
//!   attention and the experts run, the next `depth` chunks — o-proj, router, next layer's
//!   q/k/v, finally `lm_head` — are in flight).
//! - **The expert ring**: `slots` slots of one expert chunk (`[hidden, 3 * block]`: the
//!   chunk's gate and up columns and its down-projection columns, one DMA), issued
//!   `slots - 1` ahead, right after routing.
//! - **KV**: tiles of `block_kv` positions, two slots per K and V.
//! - **Budgets**: the VMEM plan (every scratch buffer, plus headroom for vector temporaries
//!   and compiler spills) must fit the chip's VMEM per core, and every operand the chip's
//!   HBM per device; a model that does not fit is refused with the numbers.

use crate::graph::{LayerGraph, LayerKind};
use crate::rewrite::{Rewritten, rewrite};
use palladium_dsl::spec::Chip;
use palladium_model::{AttentionKind, FfnKind, LmHead, ModelSpec, QkNorm, TopKWeights};
use serde::Serialize;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// HBM left to the megakernel's operands: the device's, less 1 GiB that stays with the
/// runtime and XLA.
pub fn hbm_usable_bytes(chip: Chip) -> u64 {
    chip.target().hbm_bytes_per_device() - GIB
}

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
}

impl PlanOptions {
    /// All layers, HBM checked, KV read up to each position.
    pub fn new(chip: Chip, batch: u64, context: u64) -> PlanOptions {
        PlanOptions { chip, batch, context, layers: None, check_hbm: true, kv_tiles: KvTiles::UpToPosition, prefetch: Prefetch::Deep }
    }
}

/// How far the weight streams run ahead of their use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Prefetch {
    /// A dense ring of ~24 MiB (v5e/v6e; 16 MiB on 64 MiB-VMEM chips) of ~4 MiB banks
    /// (`banks - 1` chunks in flight, across op and layer boundaries) and an expert ring
    /// of 3 slots (2 in flight): what a step runs.
    #[default]
    Deep,
    /// One chunk in flight per stream (2 banks, 2 expert slots), as a double-buffered
    /// Pallas pipeline: a cost variant for libtpu's static estimator, which gives
    /// concurrent DMAs each their own bandwidth (the same bytes estimate 727k cycles with
    /// 2 banks, 517k with 3, 338k with 6: Qwen3-30B-A3B, 1 layer, v6e), where the HBM
    /// floor it is compared with streams one DMA at a time. Same results.
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

/// Why a model cannot be planned.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("not supported yet: {0}")]
    Unsupported(String),
    #[error("invalid option: {0}")]
    Invalid(String),
    #[error("does not fit {chip} HBM: the operands need {need} bytes ({need_gib:.2} GiB: {detail}), {chip} has {have} bytes ({have_gib:.2} GiB) usable per device (at most {max_layers} of the model's layers fit)")]
    Hbm { chip: Chip, need: u64, need_gib: f64, have: u64, have_gib: f64, detail: String, max_layers: u64 },
    #[error("does not fit {chip} VMEM: the plan needs {need} bytes ({need_mib:.2} MiB: {detail}), {chip} has {have} bytes ({have_mib} MiB) per core")]
    Vmem { chip: Chip, need: u64, need_mib: f64, have: u64, have_mib: u64, detail: String },
    #[error("the rewrites did not {0}")]
    Rewrite(String),
    /// A byte count past `u64`: no chip holds it, and nothing is allocated for it.
    #[error("does not fit any chip: {what} would take more than 2^64 bytes")]
    TooLarge { what: String },
}

/// `factors` multiplied, or [`PlanError::TooLarge`] naming `what` when the product passes
/// `u64` (config sizes are at most 2^24 each, so products of several can).
fn product(what: &str, factors: &[u64]) -> Result<u64, PlanError> {
    factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(f)).ok_or_else(|| PlanError::TooLarge { what: what.to_string() })
}

/// A checked sum, as [`product`].
fn total(what: &str, terms: &[u64]) -> Result<u64, PlanError> {
    terms.iter().try_fold(0u64, |acc, &t| acc.checked_add(t)).ok_or_else(|| PlanError::TooLarge { what: what.to_string() })
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
    /// `experts` rounded up to 128 (the router's padded columns are masked to -inf).
    pub experts_pad: u64,
    pub top_k: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub batch: u64,
    /// Rows of every activation matrix: `batch` rounded up to 16 (a bf16 tile).
    pub rows: u64,
    /// Rows of one (kv group, sequence) attention: the group's query heads, rounded up to
    /// 16 so scores and probabilities are bf16 MXU operands, whatever the batch.
    pub attn_rows: u64,
    pub eps: f64,
    pub rope_theta: f64,
    pub scale: f64,
    pub qk_norm: bool,
    pub window: Option<u64>,
    pub renormalize: bool,
    /// KV-cache positions (context rounded up to `block_kv`).
    pub positions: u64,
}

/// A segment of a layer's dense stream: one fused weight in a column range.
#[derive(Clone, Debug, Serialize)]
pub struct Segment {
    pub name: &'static str,
    /// First column in the per-layer stream, and width (both multiples of 128).
    pub col: u64,
    pub cols: u64,
    /// The Hugging Face weights (per layer) and the folded norm scale.
    pub weights: Vec<String>,
    pub folded_scale: Option<String>,
}

/// A piece of a chunk: columns `[chunk_col, chunk_col + cols)` of the chunk are columns
/// `[seg_col, seg_col + cols)` of segment `segment`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Piece {
    pub segment: usize,
    pub seg_col: u64,
    pub chunk_col: u64,
    pub cols: u64,
}

/// One stacked operand of the megakernel.
#[derive(Clone, Debug, Serialize)]
pub struct Operand {
    pub name: &'static str,
    pub role: &'static str,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub space: &'static str,
    pub bytes: u64,
    /// How Hugging Face tensors map into it.
    pub source: String,
}

/// The streaming plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model: String,
    pub chip: String,
    pub layers: usize,
    pub model_layers: usize,
    pub layer_kind: String,
    /// `--context`: positions attended over (the cache holds `dims.positions`).
    pub context: u64,
    pub dims: Dims,
    pub graph: Vec<String>,
    pub layer_rewrite: Rewritten,
    pub head_rewrite: Rewritten,
    /// Columns of one dense chunk (a bank holds `[hidden, chunk_cols]` bf16).
    pub chunk_cols: u64,
    pub segments: Vec<Segment>,
    /// Chunks per layer and the pieces of each.
    pub chunks: Vec<Vec<Piece>>,
    pub lm_chunks: u64,
    pub banks: u64,
    pub bank_bytes: u64,
    pub depth: u64,
    /// Expert chunk width (intermediate columns) and chunks per expert.
    pub expert_block: u64,
    pub expert_chunks: u64,
    pub expert_slots: u64,
    pub expert_slot_bytes: u64,
    pub block_kv: u64,
    pub kv_tiles: KvTiles,
    pub prefetch: Prefetch,
    pub operands: Vec<Operand>,
    pub vmem: Vec<(String, u64)>,
    pub vmem_total: u64,
    pub vmem_limit: u64,
    pub vmem_capacity: u64,
    pub hbm_total: u64,
    pub hbm_capacity: u64,
    pub traffic: Traffic,
}

/// HBM bytes one decode step moves, by stream.
#[derive(Clone, Debug, Serialize)]
pub struct Traffic {
    /// Dense chunks of all layers (q/k/v, o, router, including chunk padding).
    pub dense: u64,
    pub lm_head: u64,
    /// `batch * top_k` expert fetches per layer (no deduplication across tokens).
    pub experts: u64,
    pub kv_read: u64,
    pub kv_write: u64,
    pub embedding: u64,
    pub head_norms: u64,
    pub total: u64,
    /// The model's own count for the same step (`ModelSpec::decode_traffic`, unpadded).
    pub model_total: f64,
    /// Seconds at one TensorCore's HBM bandwidth: the megakernel is grid-less, so it runs
    /// on one TensorCore even where a device has two (v4, v5p megacore).
    pub floor_seconds: f64,
    /// DMAs issued per step.
    pub dmas: u64,
}

/// `(name, bytes)` of every per-layer weight, in graph order (the input of [`rewrite`]).
pub fn layer_weight_bytes(spec: &ModelSpec) -> Vec<(String, u64)> {
    let g = LayerGraph::build(spec, 0);
    let h = spec.hidden_size;
    let a = &spec.attention;
    let (q, kv) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
    let mut out = Vec::new();
    // Graph insertion order: q, k, v, ... (the fused column order).
    for n in g.graph.node_indices() {
        use crate::graph::OpKind::*;
        match &g.graph[n].kind {
            RmsNorm { weight } => out.push((weight.clone(), 2 * h)),
            HeadNorm { weight } => out.push((weight.clone(), 2 * a.head_dim)),
            Linear { weight } => {
                let b = if weight.contains("q_proj") || weight.contains("o_proj") {
                    2 * h * q
                } else if weight.contains("k_proj") || weight.contains("v_proj") {
                    2 * h * kv
                } else {
                    match &spec.layers[0].ffn {
                        FfnKind::Moe(m) => 2 * h * m.num_experts,
                        FfnKind::Dense { intermediate } => 2 * h * intermediate,
                    }
                };
                out.push((weight.clone(), b))
            }
            Experts { gate, up, down } => {
                if let FfnKind::Moe(m) = &spec.layers[0].ffn {
                    for w in [gate, up, down] {
                        // Saturating: a cost for the rewrites, where any huge value ranks the same.
                        out.push((w.clone(), (2 * h * m.intermediate).saturating_mul(m.top_k)));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

impl Plan {
    /// Plan the megakernel of `spec` for `options`.
    pub fn new(spec: &ModelSpec, options: &PlanOptions) -> Result<Plan, PlanError> {
        let chip = options.chip;
        if options.batch == 0 || options.batch > 16 {
            return Err(PlanError::Invalid(format!("--batch {} (supported: 1..=16)", options.batch)));
        }
        if options.context == 0 {
            return Err(PlanError::Invalid("--context 0".into()));
        }
        // Also keeps positions within the kernel's i32 position operand (the config caps
        // max_position_embeddings at 2^24).
        if options.context > spec.max_position_embeddings {
            return Err(PlanError::Invalid(format!(
                "--context {} is past the model's max_position_embeddings {}: RoPE and the model are defined up to that many positions",
                options.context, spec.max_position_embeddings
            )));
        }
        let layers = options.layers.unwrap_or(spec.layers.len());
        if layers == 0 || layers > spec.layers.len() {
            return Err(PlanError::Invalid(format!("--layers {layers} (the model has {})", spec.layers.len())));
        }
        let kind = LayerKind::of(&spec.layers[0]);
        if let Some(l) = spec.layers[..layers].iter().find(|l| LayerKind::of(l) != kind) {
            return Err(PlanError::Unsupported(format!(
                "layers of different kinds (layer 0: {}; layer {}: {}): one stack per kind is planned, not emitted yet",
                kind.describe(),
                l.index,
                LayerKind::of(l).describe()
            )));
        }
        let FfnKind::Moe(moe) = &spec.layers[0].ffn else {
            return Err(PlanError::Unsupported("dense-MLP layers (only MoE layers are emitted so far)".into()));
        };
        if moe.shared.is_some() {
            return Err(PlanError::Unsupported("shared experts".into()));
        }
        if spec.attention.qkv_bias || spec.attention.o_bias || moe.routing.router_bias {
            return Err(PlanError::Unsupported("attention or router biases".into()));
        }
        let a = &spec.attention;
        if !a.head_dim.is_multiple_of(2) || a.head_dim > 256 {
            return Err(PlanError::Unsupported(format!("head_dim {}", a.head_dim)));
        }
        let h = spec.hidden_size;
        if !h.is_multiple_of(128) {
            return Err(PlanError::Unsupported(format!("hidden_size {h} (must be a multiple of 128)")));
        }
        if moe.intermediate % 128 != 0 {
            return Err(PlanError::Unsupported(format!("expert intermediate size {} (must be a multiple of 128)", moe.intermediate)));
        }

        // --- rewrites -------------------------------------------------------------------
        let graph = LayerGraph::build(spec, 0);
        let layer_rewrite = rewrite(&graph.to_expr(), &layer_weight_bytes(spec));
        let head_weight = match spec.lm_head {
            LmHead::Untied => "lm_head.weight",
            LmHead::Tied => "model.embed_tokens.weight",
        };
        let head_rewrite = rewrite(
            &format!("(layer (matmul (rmsnorm x w:model.norm.weight) w:{head_weight}))"),
            &[("model.norm.weight".to_string(), 2 * h), (head_weight.to_string(), 2 * h * spec.vocab_size)],
        );
        for r in [&layer_rewrite, &head_rewrite] {
            if !r.saturated() {
                return Err(PlanError::Rewrite(format!("saturate (stopped: {})", r.stop)));
            }
        }
        let qkv = layer_rewrite.matmuls.iter().find(|m| m.weights.iter().any(|w| w.contains("q_proj"))).cloned();
        let Some(qkv) = qkv.filter(|m| m.weights.len() == 3 && m.folded_scale.is_some()) else {
            return Err(PlanError::Rewrite("fuse q/k/v into one projection with input_layernorm folded".into()));
        };
        let router = layer_rewrite.matmuls.iter().find(|m| m.weights.iter().any(|w| w.ends_with("gate.weight"))).cloned();
        let Some(router) = router.filter(|m| m.folded_scale.is_some()) else {
            return Err(PlanError::Rewrite("fold post_attention_layernorm into the router".into()));
        };
        if layer_rewrite.experts.len() != 2 || layer_rewrite.experts[0].weights.len() != 2 || layer_rewrite.experts[0].folded_scale.is_none() {
            return Err(PlanError::Rewrite("fuse the experts' gate/up with post_attention_layernorm folded".into()));
        }
        if head_rewrite.matmuls.first().is_none_or(|m| m.folded_scale.is_none()) {
            return Err(PlanError::Rewrite("fold the final norm into lm_head".into()));
        }
        let o_proj = layer_rewrite.matmuls.iter().find(|m| m.weights.iter().any(|w| w.contains("o_proj"))).cloned().ok_or_else(|| PlanError::Rewrite("keep o_proj".into()))?;

        // --- dims -----------------------------------------------------------------------
        let hp = round_up(a.head_dim, 128);
        let batch = options.batch;
        let rows = round_up(batch, 16);
        let attn_rows = round_up(a.group_size(), 16);
        // Tiles of up to 1024 positions: libtpu's v6e estimate of Qwen3-30B-A3B at batch 8
        // (4 layers, 4096 positions): 256-position tiles 3.33M cycles, 512 2.66M, 1024 2.40M;
        // larger tiles read more past the position at run time.
        let block_kv = options.context.next_power_of_two().clamp(16, 1024);
        let positions = round_up(options.context, block_kv);
        let window = match spec.layers[0].attention {
            AttentionKind::Full => None,
            AttentionKind::Sliding { window } => Some(window),
        };
        let dims = Dims {
            hidden: h,
            heads: a.num_heads,
            kv_heads: a.num_kv_heads,
            head_dim: a.head_dim,
            head_pad: hp,
            group: a.group_size(),
            experts: moe.num_experts,
            experts_pad: round_up(moe.num_experts, 128),
            top_k: moe.top_k,
            intermediate: moe.intermediate,
            vocab: spec.vocab_size,
            batch,
            rows,
            attn_rows,
            eps: spec.norm.eps,
            rope_theta: a.rope.theta,
            scale: a.scale,
            qk_norm: matches!(a.qk_norm, QkNorm::PerHeadRms { .. }),
            window,
            renormalize: moe.routing.top_k_weights == TopKWeights::Renormalized,
            positions,
        };

        // --- the dense stream -----------------------------------------------------------
        let nqkv = (a.num_heads + 2 * a.num_kv_heads) * hp;
        let nq = a.num_heads * hp;
        let segments = vec![
            Segment { name: "qkv", col: 0, cols: nqkv, weights: qkv.weights.clone(), folded_scale: qkv.folded_scale.clone() },
            Segment { name: "o", col: nqkv, cols: nq, weights: o_proj.weights.clone(), folded_scale: None },
            Segment { name: "router", col: nqkv + nq, cols: dims.experts_pad, weights: router.weights.clone(), folded_scale: router.folded_scale.clone() },
        ];
        let width = nqkv + nq + dims.experts_pad;
        // ~4 MiB chunks, 128..=1024 columns: a DMA's fixed cost is amortised (libtpu's v6e
        // estimate, Qwen3-30B-A3B, one chunk in flight: 2 MiB 0.71 of the floor, 4 MiB 0.78).
        let chunk_cols = ((4 * MIB / (2 * h)) / 128 * 128).clamp(128, 1024);
        let per_layer = width.div_ceil(chunk_cols);
        let lm_chunks = round_up(spec.vocab_size, chunk_cols) / chunk_cols;
        let bank_bytes = 2 * h * chunk_cols;
        let vmem_capacity = chip.target().vmem_bytes;
        let ring_target = if vmem_capacity >= 128 * MIB { 24 * MIB } else { 16 * MIB };
        let total_items = layers as u64 * per_layer + lm_chunks;
        let banks = match options.prefetch {
            Prefetch::Deep => (ring_target / bank_bytes).clamp(2, 12).min(total_items.max(2)),
            Prefetch::Single => 2,
        };
        let depth = banks - 1;

        // --- experts --------------------------------------------------------------------
        // Chunks as large as an expert ring of a quarter of VMEM allows (the largest
        // multiple of 128 dividing the intermediate size): per-chunk cost is amortised
        // (libtpu's v6e estimate, Qwen3-30B-A3B at batch 8: 3 MiB chunks 2.40M cycles for 4
        // layers, whole 9 MiB experts 2.27M).
        let i = moe.intermediate;
        let expert_slots = match options.prefetch {
            Prefetch::Deep => 3,
            Prefetch::Single => 2,
        };
        let mut expert_block = 128;
        for b in (128..=i).step_by(128) {
            if i % b == 0 && expert_slots * 3 * h * b * 2 <= vmem_capacity / 4 {
                expert_block = b;
            }
        }
        let expert_chunks = i / expert_block;
        let expert_slot_bytes = 3 * h * expert_block * 2;

        // --- operands -------------------------------------------------------------------
        let l = layers as u64;
        let e = moe.num_experts;
        let (kvh, hd) = (a.num_kv_heads, a.head_dim);
        let mixtral = spec.family == palladium_model::Family::Mixtral;
        let p = if mixtral { "model.layers.{l}.block_sparse_moe" } else { "model.layers.{l}.mlp" };
        let (gn, un, dn) = if mixtral { ("w1", "w3", "w2") } else { ("gate_proj", "up_proj", "down_proj") };
        let vp16 = round_up(spec.vocab_size, 16);
        let mut operands = vec![
            Operand { name: "tokens", role: "prefetch", dtype: "i32", shape: vec![batch], space: "smem", bytes: 4 * batch, source: "token id of each sequence".into() },
            Operand { name: "positions", role: "prefetch", dtype: "i32", shape: vec![batch], space: "smem", bytes: 4 * batch, source: format!("position of each sequence's new token (0-based, < {positions}); K/V are written there and attention covers positions 0..=pos") },
            Operand {
                name: "embed",
                role: "input",
                dtype: "bf16",
                shape: vec![vp16 / 16, 16, h],
                space: "any",
                bytes: 2 * vp16 * h,
                source: format!("model.embed_tokens.weight [{}, {h}] reshaped to [V/16, 16, H] (rows padded with zeros to {vp16})", spec.vocab_size),
            },
            Operand {
                name: "w_stream",
                role: "input",
                dtype: "bf16",
                shape: vec![l * per_layer + lm_chunks, h, chunk_cols],
                space: "any",
                bytes: product("the dense weight stream (w_stream)", &[2, l * per_layer + lm_chunks, h, chunk_cols])?,
                source: format!(
                    "the dense stream, {per_layer} chunks per layer then {lm_chunks} lm_head chunks. Layer l: the [H={h}, {}] matrix D_l split into column chunks of {chunk_cols} (w_stream[l*{per_layer} + c] = D_l[:, c*{chunk_cols}..]): \
                     cols [0, {nqkv}) = q|k|v heads, head j of q at cols j*{hp}.. = (q_proj.weight[j*{hd}..(j+1)*{hd}, :])^T * input_layernorm.weight[:, None] (k heads from col {}, v heads from col {}, same form; cols {hd}..{hp} of each head zero); \
                     cols [{nqkv}, {}) = o_proj.weight [H, heads*{hd}] with each head's {hd} columns padded to {hp} (not transposed); \
                     cols [{}, {}) = (gate.weight [E={e}, H])^T * post_attention_layernorm.weight[:, None], zero-padded to {} columns; the rest zero. \
                     lm_head: w_stream[{} + c, i, j] = {head_weight}[c*{chunk_cols} + j, i] * model.norm.weight[i] (zero for vocab >= {})",
                    per_layer * chunk_cols,
                    a.num_heads * hp,
                    (a.num_heads + kvh) * hp,
                    nqkv + nq,
                    nqkv + nq,
                    nqkv + nq + e,
                    dims.experts_pad,
                    l * per_layer,
                    spec.vocab_size
                ),
            },
            Operand {
                name: "w_experts",
                role: "input",
                dtype: "bf16",
                shape: vec![l, e, expert_chunks, h, 3 * expert_block],
                space: "any",
                bytes: product("the expert weights (w_experts)", &[2, l, e, i, h, 3])?,
                source: format!(
                    "chunk c of expert e of layer l, one DMA: w_experts[l, e, c, i, j] = {p}.experts.{{e}}.{gn}.weight[c*{expert_block} + j, i] * post_attention_layernorm.weight[i] for j < {expert_block}, \
                     {un}.weight[c*{expert_block} + j - {expert_block}, i] * post_attention_layernorm.weight[i] for j < {}, {dn}.weight[i, c*{expert_block} + j - {}] above",
                    2 * expert_block,
                    2 * expert_block
                ),
            },
        ];
        if dims.qk_norm {
            operands.push(Operand {
                name: "head_norms",
                role: "input",
                dtype: "f32",
                shape: vec![l, 8, hp],
                space: "any",
                bytes: 4 * l * 8 * hp,
                source: format!("head_norms[l, 0, :{hd}] = self_attn.q_norm.weight, [l, 1, :{hd}] = self_attn.k_norm.weight; the rest zero"),
            });
        }
        let kv_shape = vec![l, batch, kvh, positions, hp];
        let kv_bytes = product(&format!("each KV cache ([{l}, {batch}, {kvh}, {positions}, {hp}] bf16)"), &[2, l, batch, kvh, positions, hp])?;
        for (n, what) in [("k_cache", "K"), ("v_cache", "V")] {
            operands.push(Operand {
                name: n,
                role: "input",
                dtype: "bf16",
                shape: kv_shape.clone(),
                space: "any",
                bytes: kv_bytes,
                source: format!("{what} of layer l, sequence b, kv head g at position t: [l, b, g, t, :{hd}] (after k_norm and RoPE for K; cols {hd}.. zero); aliased to the output {n}_out (updated in place)"),
            });
        }
        operands.push(Operand {
            name: "logits",
            role: "output",
            dtype: "f32",
            shape: vec![lm_chunks, rows, chunk_cols],
            space: "vmem",
            bytes: 4 * lm_chunks * rows * chunk_cols,
            source: format!("logits of sequence b for token v at [v / {chunk_cols}, b, v % {chunk_cols}] (rows >= batch and v >= vocab are padding)"),
        });
        for n in ["k_cache_out", "v_cache_out"] {
            operands.push(Operand { name: n, role: "output", dtype: "bf16", shape: kv_shape.clone(), space: "any", bytes: kv_bytes, source: "aliases the input of the same name (KV written in place)".into() });
        }

        // --- VMEM -----------------------------------------------------------------------
        let pad = |r: u64, c: u64, bytes: u64| {
            let sub = if bytes == 2 { 16 } else { 8 };
            round_up(r, sub) * round_up(c, 128) * bytes
        };
        let mut vmem: Vec<(String, u64)> = vec![
            ("dense ring".into(), banks * bank_bytes),
            ("expert ring".into(), expert_slots * expert_slot_bytes),
            ("kv tiles".into(), 4 * pad(block_kv, hp, 2)),
            ("embedding rows".into(), batch * pad(16, h, 2)),
            ("residual + expert acc + o acc".into(), 3 * pad(rows, h, 4)),
            ("qkv".into(), pad(rows, nqkv, 4)),
            ("q / attention out / k / v heads".into(), 2 * kvh * pad(a.group_size() * rows, hp, 4) + 2 * kvh * pad(rows, hp, 4)),
            ("attention rows".into(), pad(rows, nq, 4)),
            ("router logits".into(), pad(rows, dims.experts_pad, 4)),
            ("rope tables".into(), 2 * pad(rows, hp, 4) + pad(hp, hp, 2) + pad(8, hp, 4)),
            ("logits (output)".into(), lm_chunks * pad(rows, chunk_cols, 4)),
        ];
        let scores = pad(attn_rows, block_kv, 4);
        let temporaries = 4 * scores + 4 * pad(rows, 3 * expert_block, 4) + 4 * pad(rows, h.max(chunk_cols), 4);
        vmem.push(("vector temporaries (estimate)".into(), temporaries));
        vmem.push(("compiler spill headroom".into(), 4 * MIB));
        let vmem_total: u64 = vmem.iter().map(|v| v.1).sum();
        let detail = |v: &[(String, u64)]| v.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(" + ");
        if vmem_total > vmem_capacity {
            return Err(PlanError::Vmem { chip, need: vmem_total, need_mib: vmem_total as f64 / MIB as f64, have: vmem_capacity, have_mib: vmem_capacity / MIB, detail: detail(&vmem) });
        }
        let vmem_limit = round_up(vmem_total, MIB).min(vmem_capacity);

        // --- HBM ------------------------------------------------------------------------
        let in_hbm: Vec<u64> = operands.iter().filter(|o| (o.space == "any" && !o.name.ends_with("_out")) || o.name == "logits").map(|o| o.bytes).collect();
        let hbm_total = total("the operands together", &in_hbm)?;
        let hbm_capacity = hbm_usable_bytes(chip);
        if options.check_hbm && hbm_total > hbm_capacity {
            // Saturating: only the suggestion is computed here, and a saturated layer size
            // suggests 0 layers.
            let per_layer_bytes = (2 * per_layer * h * chunk_cols)
                .saturating_add(2u64.saturating_mul(e).saturating_mul(i).saturating_mul(h).saturating_mul(3))
                .saturating_add(2 * (kv_bytes / l))
                .saturating_add(if dims.qk_norm { 4 * 8 * hp } else { 0 });
            let fixed = hbm_total.saturating_sub(l.saturating_mul(per_layer_bytes));
            let max_layers = hbm_capacity.saturating_sub(fixed) / per_layer_bytes;
            let big: Vec<String> = operands.iter().filter(|o| o.bytes > GIB / 16 && !o.name.ends_with("_out")).map(|o| format!("{} {}", o.name, o.bytes)).collect();
            return Err(PlanError::Hbm {
                chip,
                need: hbm_total,
                need_gib: hbm_total as f64 / GIB as f64,
                have: hbm_capacity,
                have_gib: hbm_capacity as f64 / GIB as f64,
                detail: big.join(" + "),
                max_layers,
            });
        }

        // --- chunk pieces (after the HBM check: `per_layer` is bounded by then) ----------
        let mut chunks: Vec<Vec<Piece>> = vec![Vec::new(); per_layer as usize];
        for (si, s) in segments.iter().enumerate() {
            let mut c = s.col;
            while c < s.col + s.cols {
                let chunk = c / chunk_cols;
                let end = ((chunk + 1) * chunk_cols).min(s.col + s.cols);
                chunks[chunk as usize].push(Piece { segment: si, seg_col: c - s.col, chunk_col: c - chunk * chunk_cols, cols: end - c });
                c = end;
            }
        }

        // --- traffic --------------------------------------------------------------------
        let dense = product("the dense stream per step", &[2, l, per_layer, h, chunk_cols])?;
        let lm_head = 2 * lm_chunks * h * chunk_cols;
        let experts = product("the expert weights read per step", &[l, batch, moe.top_k, 2, 3, h, i])?;
        let span = window.map_or(options.context, |w| w.min(options.context));
        let tiles = span.div_ceil(block_kv) + u64::from(window.is_some());
        let tiles = match options.kv_tiles {
            KvTiles::UpToPosition => tiles.min(positions / block_kv),
            KvTiles::All => positions / block_kv,
        };
        let kv_read = product("the KV cache read per step", &[l, batch, kvh, 2, tiles, block_kv, hp, 2])?;
        let kv_write = product("the KV cache written per step", &[l, batch, kvh, 2, 16, hp, 2])?;
        let embedding = batch * 16 * h * 2;
        let head_norms = if dims.qk_norm { l * 8 * hp * 4 } else { 0 };
        let step_total = total("the bytes moved per step", &[dense, lm_head, experts, kv_read, kv_write, embedding, head_norms])?;
        let mut truncated = spec.clone();
        truncated.layers.truncate(layers);
        let model_total = truncated.decode_traffic(batch, options.context, 2).total();
        let dmas_per_layer = total("the DMAs per step", &[per_layer, 1, product("the DMAs per step", &[batch, moe.top_k, expert_chunks, 2])?, product("the DMAs per step", &[batch, kvh, 2, tiles + 1])?])?;
        let dmas = total("the DMAs per step", &[product("the DMAs per step", &[l, dmas_per_layer])?, lm_chunks, batch])?;
        let traffic = Traffic { dense, lm_head, experts, kv_read, kv_write, embedding, head_norms, total: step_total, model_total, floor_seconds: step_total as f64 / chip.target().hbm_bandwidth_per_tensorcore(), dmas };

        Ok(Plan {
            model: format!("{} ({} layers of {})", spec.family.model_type(), spec.layers.len(), kind.describe()),
            chip: chip.name().to_string(),
            layers,
            model_layers: spec.layers.len(),
            layer_kind: kind.describe(),
            context: options.context,
            dims,
            graph: graph.describe(),
            layer_rewrite,
            head_rewrite,
            chunk_cols,
            segments,
            chunks,
            lm_chunks,
            banks,
            bank_bytes,
            depth,
            expert_block,
            expert_chunks,
            expert_slots,
            expert_slot_bytes,
            block_kv,
            kv_tiles: options.kv_tiles,
            prefetch: options.prefetch,
            operands,
            vmem,
            vmem_total,
            vmem_limit,
            vmem_capacity,
            hbm_total,
            hbm_capacity,
            traffic,
        })
    }

    /// Dense chunks per layer.
    pub fn per_layer(&self) -> u64 {
        self.chunks.len() as u64
    }
}
