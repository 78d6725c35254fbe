//! The streaming plan: everything about the megakernel that is decided before tracing.
//!
//! - **Rewrites**: the per-layer graph and the final norm + `lm_head` are rewritten with
//!   [`crate::rewrite`], and the extraction is read, typed ([`crate::graph::WeightKind`]):
//!   each matmul it keeps is one segment of the dense stream (the q/k/v projection fused
//!   with `input_layernorm` folded, `o_proj`, the router with `post_attention_layernorm`
//!   folded), the experts' gate/up fused with the norm folded, `lm_head` with the final norm
//!   folded; any other form is refused (the report shows the extraction).
//! - **Stacking and host layout**: per-layer weights are stacked along a leading layer
//!   axis; the q/k/v, `o_proj` and router weights of a layer form the layer's part of one
//!   *dense stream* array of `[hidden, chunk_cols]` chunks, and `lm_head` continues that
//!   array with chunks of the same shape: one array, so every prefetch (across layers and
//!   into `lm_head`) is one unconditional DMA from a computed chunk index. Expert weights
//!   are stacked `[layer, expert, chunk, ..]` so each DMA chunk is contiguous in HBM. The
//!   exact operand interface is documented in the crate docs; the plan's
//!   [`crate::layout::StreamLayout`] holds it, typed.
//! - **The dense ring**: `banks` VMEM banks of one chunk each; chunk `g` of the global dense
//!   sequence (layer-major, then `lm_head`) lands in bank `g mod banks`, and is issued
//!   `depth = banks - 1` chunks ahead of its use, across op and layer boundaries (so while
//!   attention and the experts run, the next `depth` chunks — o-proj, router, next layer's
//!   q/k/v, finally `lm_head` — are in flight).
//! - **The expert ring**: `slots` slots of one expert chunk (`[hidden, 3 * block]`: the
//!   chunk's gate and up columns and its down-projection columns, one DMA), issued
//!   `slots - 1` ahead, right after routing, each chunk computed after the next one's wait
//!   (so `slots - 1` stay in flight through the compute).
//! - **Quantized weights** ([`PlanOptions::weights`], [`QuantLayout`]): the rings carry
//!   codes (half or a quarter of the bytes per chunk, so twice the banks in the same ring
//!   bytes), every scale is f32 in the bodies' `GroupScales` layout and travels with its
//!   weights (an expert chunk's with the chunk, a layer's q/k/v and o scales, its bf16
//!   router and norm rows once per layer), `lm_head` is its own stream, two chunks ahead
//!   (fp8 keeps it bf16, so it cannot continue a code array), and no norm is folded.
//! - **KV**: tiles of `block_kv` positions, two slots per K and V.
//! - **Budgets**: the VMEM plan (the kernel's scratch as declared once,
//!   [`crate::scratch`], and its outputs in VMEM, each padded as the dsl pads VMEM, plus
//!   estimates of the vector temporaries, widened codes and compiler spills) must fit the
//!   chip's VMEM per core, and every operand the chip's HBM per device; a model that does
//!   not fit is refused with the numbers.

use crate::graph::{LayerGraph, LayerKind, TensorNames, Weight, WeightKind};
use crate::layout::{
    CodeFormat, Ffn, LayerFfns, Operand, OperandKind, QuantLayout, Segment, SegmentKind,
    StreamLayout,
};
use crate::options::{product, round_up, total};
use crate::rewrite::{FusedWeight, Rewritten, rewrite};
use crate::scratch::{MegakernelScratch, ScratchSizes};
use crate::shard::{self, Sharding};
use palladium_dsl::DType;
use palladium_dsl::build::{MemorySpace, OperandRole};
use palladium_dsl::ir::{Shape, padded_vmem_bytes};
use palladium_dsl::spec::Chip;
use palladium_kernels::body::{DIGIT_ROWS, widened_code_bytes};
use palladium_model::quant::WeightsDtype;
use palladium_model::spec::{
    Activation, ExpertWeighting, NormKind, Quantization, RopeScaling, RopeStyle,
};
use palladium_model::{
    AttentionForm, AttentionKind, Family, FfnKind, LmHead, ModelSpec, MoeSpec, QkNorm, TopKWeights,
};
use serde::Serialize;

// The plan's vocabulary lives in `crate::options` (shared with `crate::shard`); re-exported
// here, where callers of the plan look for it.
pub use crate::options::{
    Dims, ExpertFetch, KvTiles, PlanError, PlanOptions, Prefetch, hbm_usable_bytes,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The weights dtype of a plan: `requested` (`--weights-dtype`), else what the config's
/// checkpoint stores (an FP8 `quantization_config` selects fp8 by itself). An FP8 checkpoint
/// planned as another dtype is refused: its weights are fp8 as they ship.
pub fn weights_dtype(
    spec: &ModelSpec,
    requested: Option<WeightsDtype>,
) -> Result<WeightsDtype, PlanError> {
    let stored = WeightsDtype::of_checkpoint(spec);
    match requested {
        None => Ok(stored),
        Some(w) if stored == WeightsDtype::Bf16 || w == stored => Ok(w),
        Some(w) => Err(PlanError::Invalid(format!(
            "--weights-dtype {}: the config's quantization_config stores the weights as {} (use --weights-dtype {} or leave it out)",
            w.name(),
            stored.name(),
            stored.name()
        ))),
    }
}

/// The kernel formats of issue 16's schemes (`None` for bf16): int8 per output channel on
/// every linear weight of the layers and `lm_head`; fp8 e4m3fn 128x128 tiles on q/k/v/o and
/// the experts (`lm_head` bf16); int4 groups of 128 inputs on the experts, the rest int8.
/// Routers stay bf16 in all three.
fn quant_layout(
    spec: &ModelSpec,
    dims: &Dims,
    weights: WeightsDtype,
) -> Result<Option<QuantLayout>, PlanError> {
    let int8 = CodeFormat { codes: DType::I8, group: None };
    let fp8 = CodeFormat { codes: DType::F8E4M3, group: Some(128) };
    let int4 = CodeFormat { codes: DType::I4, group: Some(128) };
    let (dense, experts, lm_head) = match weights {
        WeightsDtype::Bf16 => return Ok(None),
        WeightsDtype::Int8 => (int8, int8, Some(int8)),
        WeightsDtype::Fp8 => (fp8, fp8, None),
        WeightsDtype::Int4 => (int8, int4, Some(int8)),
    };
    if weights == WeightsDtype::Fp8 {
        if let Some(Quantization::Fp8Block { weight_block_size, .. }) = &spec.quantization
            && *weight_block_size != [128, 128]
        {
            return Err(PlanError::Unsupported(format!(
                "quantization_config.weight_block_size {weight_block_size:?} (the kernel's fp8 tiles are [128, 128])"
            )));
        }
        // o_proj's inputs are padded per head to 128 lanes: a group of 128 padded inputs
        // must lie in one 128-input tile of the checkpoint's.
        if !(dims.head_dim.is_multiple_of(128) || 128 % dims.head_dim == 0) {
            return Err(PlanError::Unsupported(format!(
                "fp8 weights with head_dim {} (a multiple or divisor of 128 keeps o_proj's 128x128 tiles whole in the padded head layout)",
                dims.head_dim
            )));
        }
    }
    // A tied head is the embedding, which every scheme keeps bf16.
    let lm_head = if spec.lm_head == LmHead::Tied { None } else { lm_head };
    Ok(Some(QuantLayout { scheme: weights.name(), dense, experts, lm_head }))
}

/// Most new tokens per sequence in one step: the K new K/V rows of a sequence then span at
/// most two 16-row groups of at most two KV tiles (tiles hold at least 16 positions).
pub const MAX_TOKENS_PER_SEQ: u64 = 16;

/// The streaming plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model: String,
    #[serde(serialize_with = "crate::layout::display")]
    pub chip: Chip,
    pub layers: usize,
    pub model_layers: usize,
    pub layer_kind: String,
    /// Each planned layer's FFN stage (listed where the layers mix kinds; the attention
    /// kind is `layer_kind`'s for every layer).
    #[serde(skip_serializing_if = "LayerFfns::all_routed")]
    pub layer_ffns: LayerFfns,
    /// `--context`: positions attended over (the cache holds `dims.positions`).
    pub context: u64,
    pub dims: Dims,
    /// The model's sizes (the one-device dims, before the split): what the source maps
    /// ([`crate::source`]) index the checkpoint's tensors by.
    #[serde(skip)]
    pub model_dims: Dims,
    /// The checkpoint's tensor names, as the packer reads them (the report's prose).
    #[serde(skip)]
    pub names: TensorNames,
    pub graph: Vec<String>,
    pub layer_rewrite: Rewritten,
    pub head_rewrite: Rewritten,
    /// The operands and where every weight sits in them.
    #[serde(flatten)]
    pub layout: StreamLayout,
    /// Dense ring banks (`bank_bytes` each) and prefetch depth in chunks.
    pub banks: u64,
    pub bank_bytes: u64,
    pub depth: u64,
    /// Expert ring slots (`expert_slot_bytes` each; `expert_slots - 1` chunks in flight).
    pub expert_slots: u64,
    pub expert_slot_bytes: u64,
    pub block_kv: u64,
    pub kv_tiles: KvTiles,
    pub prefetch: Prefetch,
    pub expert_fetch: ExpertFetch,
    /// The kernel's scratch, declared once: emitted as declared, and summed (padded as the
    /// dsl pads VMEM) into the VMEM plan.
    #[serde(skip)]
    pub scratch: MegakernelScratch,
    /// The VMEM plan by part (the scratch by group, the outputs in VMEM, the estimates).
    pub vmem: Vec<(String, u64)>,
    pub vmem_total: u64,
    pub vmem_limit: u64,
    pub vmem_capacity: u64,
    pub hbm_total: u64,
    pub hbm_capacity: u64,
    pub traffic: Traffic,
    /// The split over several devices (`--devices N > 1`); the fields above are then one
    /// device's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharding: Option<Sharding>,
}

/// HBM bytes one decode step moves, by stream.
#[derive(Clone, Debug, Serialize)]
pub struct Traffic {
    /// A quantized plan's weight bytes per step by dtype (codes, the bf16 router and
    /// `lm_head`, the f32 scales and norms), the experts at the static worst case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_dtype: Option<Vec<(String, u64)>>,
    /// Dense chunks of all layers (q/k/v, o, router, including chunk padding).
    pub dense: u64,
    pub lm_head: u64,
    /// The experts fetched per step at the static worst case, `min(E, batch * K * top_k)`
    /// distinct experts per layer, each once: what the step is priced at (a shared
    /// expert's entries included, here and in the two below).
    pub experts: u64,
    /// The dense-MLP layers' weights, each read once per step (0 when every layer is MoE).
    #[serde(skip_serializing_if = "is_zero")]
    pub mlp: u64,
    /// Without deduplication: one fetch per (row, slot), `batch * K * top_k` per layer.
    pub experts_without_dedupe: u64,
    /// Under uniform routing (each row's `top_k` experts drawn uniformly, independently of
    /// the other rows'): the expected distinct experts, `E * (1 - (1 - top_k / E)^rows)`
    /// per layer, each once.
    pub experts_uniform_routing: f64,
    pub kv_read: u64,
    pub kv_write: u64,
    pub embedding: u64,
    pub head_norms: u64,
    /// The q/k/v biases' rows, one copy per layer (0 without biases).
    #[serde(skip_serializing_if = "is_zero")]
    pub qkv_bias: u64,
    /// The MoE layers' correction-bias rows, one copy per layer (0 without them).
    #[serde(skip_serializing_if = "is_zero")]
    pub correction_bias: u64,
    /// Of the weight bytes above, the zero padding of the sizes that do not fill native
    /// tiles (`Dims::tiled`): each stream's padded share (0 where every size fills them).
    #[serde(skip_serializing_if = "is_zero")]
    pub padding: u64,
    /// The attention sinks' and the router biases' rows, one copy per layer (0 without).
    #[serde(skip_serializing_if = "is_zero")]
    pub sinks: u64,
    pub total: u64,
    /// The model's own count for the same step (`ModelSpec::decode_traffic`, unpadded).
    pub model_total: f64,
    /// Seconds at one TensorCore's HBM bandwidth: the megakernel is grid-less, so it runs
    /// on one TensorCore even where a device has two (v4, v5p megacore).
    pub floor_seconds: f64,
    /// DMAs issued per step.
    pub dmas: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The layer whose graph the rewrites read: the first MoE layer (the dense stream's
/// segments and the experts' fused form come from it; a dense-MLP layer's chunks take the
/// experts' form), layer 0 where there is none.
pub fn rewritten_layer(spec: &ModelSpec) -> usize {
    spec.layers.iter().position(|l| matches!(l.ffn, FfnKind::Moe(_))).unwrap_or(0)
}

/// Every weight of the [`rewritten_layer`] with its bytes, in graph order (the input of
/// [`rewrite`]).
pub fn layer_weight_bytes(spec: &ModelSpec) -> Vec<(Weight, u64)> {
    let index = rewritten_layer(spec);
    let g = LayerGraph::build(spec, index);
    let h = spec.hidden_size;
    let a = &spec.attention;
    let (q, kv) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
    let ffn = match &spec.layers[index].ffn {
        FfnKind::Moe(m) => m.intermediate,
        FfnKind::Dense { intermediate } => *intermediate,
    };
    // Multi-head latent attention's sizes (`[out, in]` products; zero without it).
    let mla = match a.form {
        AttentionForm::Mla(m) => {
            let (nope, rope) = (m.qk_nope_head_dim, m.qk_rope_head_dim);
            let q_in = m.q_lora_rank.unwrap_or(h);
            let heads = a.num_heads;
            [
                (WeightKind::QProj, q_in * heads * (nope + rope)),
                (WeightKind::QAProj, h * q_in),
                (WeightKind::QANorm, q_in),
                (WeightKind::QBProj, q_in * heads * (nope + rope)),
                (WeightKind::KvAProj, h * m.latent_cache_width()),
                (WeightKind::KvANorm, m.kv_lora_rank),
                (WeightKind::KvBProj, m.kv_lora_rank * heads * (nope + m.v_head_dim)),
                (WeightKind::OProj, h * heads * m.v_head_dim),
            ]
            .to_vec()
        }
        AttentionForm::Gqa => Vec::new(),
    };
    let mla_bytes = |kind| mla.iter().find(|&&(k, _)| k == kind).map(|&(_, n)| 2 * n);
    let mut out = Vec::new();
    // Graph insertion order: q, k, v, ... (the fused column order).
    for n in g.graph.node_indices() {
        use crate::graph::OpKind::*;
        match &g.graph[n].kind {
            RmsNorm { weight } => {
                out.push((weight.clone(), mla_bytes(weight.kind).unwrap_or(2 * h)))
            }
            HeadNorm { weight } => out.push((weight.clone(), 2 * a.head_dim)),
            LatentAttention { kv_norm, kv_b } => {
                for w in [kv_norm, kv_b] {
                    out.push((w.clone(), mla_bytes(w.kind).unwrap_or(0)));
                }
            }
            Linear { weight } if mla_bytes(weight.kind).is_some() => {
                out.push((weight.clone(), mla_bytes(weight.kind).unwrap_or(0)))
            }
            Linear { weight } => {
                let b = match weight.kind {
                    WeightKind::QProj | WeightKind::OProj => 2 * h * q,
                    WeightKind::KProj | WeightKind::VProj => 2 * h * kv,
                    WeightKind::Router => match &spec.layers[index].ffn {
                        FfnKind::Moe(m) => 2 * h * m.num_experts,
                        FfnKind::Dense { .. } => 0,
                    },
                    _ => 2 * h * ffn,
                };
                out.push((weight.clone(), b))
            }
            Experts { gate, up, down } => {
                if let FfnKind::Moe(m) = &spec.layers[index].ffn {
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

/// Slots of a stream issued two chunks ahead of its use: the expert ring and a quantized
/// plan's `lm_head` ring (with either prefetch), the dense ring with [`Prefetch::Single`].
/// At most two chunks are in flight at once, as in a double-buffered pipeline (the HBM
/// floor's stream kernel). The expert stream also lags its compute by a chunk
/// (`pipeline_lagged`) so that both stay in flight through it; the dense and `lm_head`
/// streams do not need to: libtpu's v6e estimate of the dense ring with the start written
/// after the wait and held before the compute (a semaphore signal and wait after it) was
/// no lower (bf16 Qwen3-30B-A3B, 8 layers: 1253779 cycles; 1253411 without the fence,
/// 1245462 with the start before the wait, as here), and of a lagged `lm_head` 5% higher.
pub const TWO_AHEAD_SLOTS: u64 = 3;

/// What the plan reads from the egg extractions ([`rewrites`]).
struct Extracted {
    graph: LayerGraph,
    layer: Rewritten,
    head: Rewritten,
    segments: Vec<Segment>,
    lm_head: FusedWeight,
    experts: [FusedWeight; 2],
}

/// The VMEM plan ([`vmem_budget`]): the parts, their total, the limit the kernel is
/// compiled with.
struct VmemBudget {
    parts: Vec<(String, u64)>,
    total: u64,
    limit: u64,
}

/// The dense-ring and expert-ring schedule ([`prefetch_schedule`]).
struct Rings {
    banks: u64,
    bank_bytes: u64,
    depth: u64,
    expert_slots: u64,
    expert_slot_bytes: u64,
}

impl Plan {
    /// The most distinct experts a step's rows choose, `min(experts, batch * K * top_k)`:
    /// the expert stream's static worst case.
    pub fn distinct_experts(&self) -> u64 {
        self.dims.distinct_experts()
    }

    /// Plan the megakernel of `spec` for `options`, in stages: the options and the model
    /// checked, dims, the rewrites (their extraction gives the dense stream's segments),
    /// the weights' layout, the prefetch schedule, the VMEM budget, the HBM fit, the traffic.
    pub fn new(spec: &ModelSpec, options: &PlanOptions) -> Result<Plan, PlanError> {
        if !shard::DEVICE_COUNTS.contains(&options.devices) {
            return Err(PlanError::Invalid(format!(
                "--devices {} (supported: {})",
                options.devices,
                shard::DEVICE_COUNTS.map(|n| n.to_string()).join(", ")
            )));
        }
        let plan = match Plan::for_devices(spec, options) {
            // One device: say how many would hold the whole model.
            Err(PlanError::Hbm {
                chip,
                need,
                need_gib,
                have,
                have_gib,
                detail,
                max_layers,
                ..
            }) => {
                let split =
                    fewest_devices(spec, options).map_or_else(String::new, |n| format!("; {n}"));
                return Err(PlanError::Hbm {
                    chip,
                    need,
                    need_gib,
                    have,
                    have_gib,
                    detail,
                    max_layers,
                    split,
                });
            }
            plan => plan?,
        };
        if options.devices > 1 && options.check_hbm && plan.hbm_total > plan.hbm_capacity {
            return Err(PlanError::Devices {
                devices: options.devices,
                chip: options.chip,
                need: plan.hbm_total,
                need_gib: plan.hbm_total as f64 / GIB as f64,
                have: plan.hbm_capacity,
                have_gib: plan.hbm_capacity as f64 / GIB as f64,
                needed: fewest_devices(spec, options).unwrap_or_else(|| {
                    format!("no split over up to {} devices fits", options.devices << 6)
                }),
            });
        }
        Ok(plan)
    }

    /// [`Plan::new`] for any power-of-two device count, HBM per device unchecked where
    /// there are several (the caller refuses or searches).
    fn for_devices(spec: &ModelSpec, options: &PlanOptions) -> Result<Plan, PlanError> {
        let (layers, kind, moe, layer_ffns) = supported(spec, options)?;
        let names = TensorNames::new(spec).map_err(|e| PlanError::Unsupported(e.to_string()))?;
        let (dims, block_kv) = dims(spec, moe, &layer_ffns, options);
        let vocab = dims.vocab;
        let moe_layers = layer_ffns.count(Ffn::RoutedExperts) as usize;
        let model_dims = dims.clone();
        let (dims, split) = shard::split(dims, options, moe_layers)?;
        let dims = dims.tiled();
        let extracted = rewrites(spec, &names, &dims)?;
        let layout = stream_layout(spec, options, &layer_ffns, &dims, &extracted)?;
        let rings = prefetch_schedule(options, layers, &dims, &layout);
        let scratch = MegakernelScratch::declare(
            &dims,
            &layout,
            ScratchSizes {
                dense_banks: rings.banks,
                expert_slots: rings.expert_slots,
                lm_banks: TWO_AHEAD_SLOTS,
                block_kv,
                kv_write_groups: written_groups(dims.tokens_per_seq, block_kv),
                devices: options.devices,
            },
        );
        let vmem = vmem_budget(options, &dims, &layout, &scratch, block_kv)?;
        let (hbm_total, hbm_capacity) = hbm_fit(
            &PlanOptions {
                check_hbm: options.check_hbm && options.devices == 1,
                ..options.clone()
            },
            layers,
            &dims,
            &layout,
        )?;
        let mut traffic = traffic(spec, options, &layer_ffns, &dims, &layout, block_kv)?;
        // TP experts split each expert's columns over the devices; EP keeps them whole.
        let expert_ways = match &split {
            Some((_, e)) if e.split == shard::ExpertSplit::Tp => options.devices,
            _ => 1,
        };
        traffic.padding = padding_bytes(&traffic, &model_dims, &dims, options.devices, expert_ways);
        let sharding =
            split.map(|split| shard::sharding(options, layers, &dims, vocab, split)).transpose()?;
        // Layers mixing sliding and full attention (gpt-oss) say which slide.
        let kind_text = match (&model_dims.sliding_layers, model_dims.window) {
            (Some(sliding), Some(w)) => {
                LayerKind { attention: AttentionKind::Full, ..kind.clone() }.describe().replacen(
                    "full attention",
                    &format!("full attention (sliding, window {w}, on layers {sliding:?})"),
                    1,
                )
            }
            _ => kind.describe(),
        };
        let model = if layer_ffns.all_routed() {
            format!("{} ({} layers of {kind_text})", spec.family.model_type(), spec.layers.len())
        } else {
            format!(
                "{} ({} layers: MoE layers of {}, dense-MLP layers of intermediate {})",
                spec.family.model_type(),
                spec.layers.len(),
                kind_text,
                dense_intermediate(spec).unwrap_or(0)
            )
        };
        Ok(Plan {
            model,
            chip: options.chip,
            layers,
            model_layers: spec.layers.len(),
            layer_kind: kind_text,
            layer_ffns,
            context: options.context,
            dims,
            model_dims,
            names,
            graph: extracted.graph.describe(),
            layer_rewrite: extracted.layer,
            head_rewrite: extracted.head,
            layout,
            banks: rings.banks,
            bank_bytes: rings.bank_bytes,
            depth: rings.depth,
            expert_slots: rings.expert_slots,
            expert_slot_bytes: rings.expert_slot_bytes,
            block_kv,
            kv_tiles: options.kv_tiles,
            prefetch: options.prefetch,
            expert_fetch: options.expert_fetch,
            scratch,
            vmem: vmem.parts,
            vmem_total: vmem.total,
            vmem_limit: vmem.limit,
            vmem_capacity: options.chip.target().vmem_bytes,
            hbm_total,
            hbm_capacity,
            traffic,
            sharding,
        })
    }
}

/// The fewest devices (more than `options.devices`, searched up to 64 times as many) whose
/// split holds the planned layers, in words for a refusal; `None` where no split does (or
/// none can be planned on the chip).
fn fewest_devices(spec: &ModelSpec, options: &PlanOptions) -> Option<String> {
    let fits = |n: u64| {
        Plan::for_devices(spec, &PlanOptions { devices: n, check_hbm: false, ..options.clone() })
            .is_ok_and(|p| p.hbm_total <= p.hbm_capacity)
    };
    let max = *shard::DEVICE_COUNTS.last().unwrap_or(&1);
    let n = (1..=6).map(|k| options.devices << k).find(|&n| fits(n))?;
    Some(if n <= max {
        format!("it needs at least {n} devices (--devices {n})")
    } else {
        format!("it needs at least {n} devices, more than the {max} supported (try --layers)")
    })
}

/// The dense-MLP layers' intermediate size (`intermediate_size`), if the model has such
/// layers.
fn dense_intermediate(spec: &ModelSpec) -> Option<u64> {
    spec.layers.iter().find_map(|l| match l.ffn {
        FfnKind::Dense { intermediate } => Some(intermediate),
        FfnKind::Moe(_) => None,
    })
}

/// The options in range and a model the megakernel supports: the layers planned, the kind
/// of their MoE layers, their MoE FFN, and every layer's FFN stage (dense-MLP layers may
/// sit among the MoE layers; every layer has the same attention).
fn supported<'s>(
    spec: &'s ModelSpec,
    options: &PlanOptions,
) -> Result<(usize, LayerKind, &'s MoeSpec, LayerFfns), PlanError> {
    if options.batch == 0 || options.batch > 16 {
        return Err(PlanError::Invalid(format!("--batch {} (supported: 1..=16)", options.batch)));
    }
    if options.tokens_per_seq == 0 || options.tokens_per_seq > MAX_TOKENS_PER_SEQ {
        return Err(PlanError::Invalid(format!(
            "--tokens-per-seq {} (supported: 1..={MAX_TOKENS_PER_SEQ})",
            options.tokens_per_seq
        )));
    }
    if options.context == 0 {
        return Err(PlanError::Invalid("--context 0".into()));
    }
    if options.tokens_per_seq > options.context {
        return Err(PlanError::Invalid(format!(
            "--tokens-per-seq {} is more than --context {}: a step writes K consecutive cache positions",
            options.tokens_per_seq, options.context
        )));
    }
    // Also keeps positions within the kernel's i32 position operand (the config caps
    // max_position_embeddings at 2^24).
    if options.context > spec.max_position_embeddings {
        return Err(PlanError::Invalid(format!(
            "--context {} is past the model's max_position_embeddings {}: RoPE and the model are defined up to that many positions",
            options.context, spec.max_position_embeddings
        )));
    }
    // gpt-oss's and Llama 4's forms: the reference forward pass computes them, no stage
    // emits them yet.
    let moe_layer = |f: fn(&MoeSpec) -> bool| {
        spec.layers.iter().any(|l| matches!(&l.ffn, FfnKind::Moe(m) if f(m)))
    };
    let unemitted = [
        (matches!(spec.norm.kind, NormKind::Layer { bias: true }), "LayerNorm with bias"),
        (spec.lm_head_bias, "an lm_head bias"),
        (moe_layer(|m| m.routing.sparse_mixer.is_some()), "the sparsemixer router"),
        (matches!(spec.attention.rope.scaling, RopeScaling::LongRope(_)), "LongRoPE"),
        (
            spec.layers.iter().any(|l| matches!(l.attention, AttentionKind::Chunked { .. })),
            "chunked attention",
        ),
        (spec.layers.iter().any(|l| !l.positions.is_rope()), "NoPE layers"),
        (spec.attention.qk_norm == QkNorm::L2AfterRope, "the L2 q/k norm after RoPE"),
        (
            moe_layer(|m| m.routing.weighting == ExpertWeighting::Input),
            "routing weights scaling the experts' input",
        ),
        (
            matches!(spec.attention.rope.scaling, RopeScaling::Llama3(_))
                || spec.attention.rope.style == RopeStyle::ComplexPairs
                    && spec.attention.form.is_gqa(),
            "Llama 3 RoPE scaling or complex-pair RoPE",
        ),
        (!spec.multipliers.is_identity(), "Granite's embedding, residual and logits multipliers"),
    ];
    let lacking: Vec<&str> = unemitted.iter().filter(|f| f.0).map(|f| f.1).collect();
    if !lacking.is_empty() {
        return Err(PlanError::Unsupported(format!(
            "{} of {}: the reference forward pass computes them, the megakernel does not emit them yet",
            lacking.join(", "),
            spec.family.model_type()
        )));
    }
    let layers = options.layers.unwrap_or(spec.layers.len());
    if layers == 0 || layers > spec.layers.len() {
        return Err(PlanError::Invalid(format!(
            "--layers {layers} (the model has {})",
            spec.layers.len()
        )));
    }
    let planned = &spec.layers[..layers];
    if let AttentionForm::Mla(_) = spec.attention.form {
        return Err(PlanError::Unsupported(format!(
            "multi-head latent attention (model_type {:?}): the megakernel has no MLA stage yet (the config, the checkpoint and the model reference read it)",
            spec.family.model_type()
        )));
    }
    // The dense-MLP layers' config fields, for the refusals that name them.
    let dense_fields = match spec.family {
        Family::Glm4Moe | Family::DeepseekV3 | Family::DeepseekV2 => "first_k_dense_replace",
        _ => "mlp_only_layers / decoder_sparse_step",
    };
    let Some(first_moe) = planned.iter().find(|l| matches!(l.ffn, FfnKind::Moe(_))) else {
        return Err(PlanError::Unsupported(format!(
            "no MoE layer among the {layers} planned layers (every one is a dense MLP by the config's {dense_fields}): the megakernel plans MoE models, dense-MLP layers only among MoE layers"
        )));
    };
    let kind = LayerKind::of(first_moe);
    // Layers may differ in attention only by a sliding window (gpt-oss's `layer_types`),
    // all sliding layers by the same one.
    let window = planned.iter().find_map(|l| match l.attention {
        AttentionKind::Sliding { window } => Some(window),
        _ => None,
    });
    let same_attention = |a: AttentionKind| match a {
        AttentionKind::Full => true,
        AttentionKind::Sliding { window: w } => Some(w) == window,
        AttentionKind::Chunked { .. } => a == first_moe.attention,
    };
    // A dense-MLP layer is the MoE layers' kind but for its FFN: same attention.
    let same_kind = |l: &palladium_model::LayerSpec| {
        same_attention(l.attention)
            && match l.ffn {
                FfnKind::Moe(_) => {
                    LayerKind { attention: first_moe.attention, ..LayerKind::of(l) } == kind
                }
                FfnKind::Dense { .. } => true,
            }
    };
    if let Some(l) = planned.iter().find(|l| !same_kind(l)) {
        return Err(PlanError::Unsupported(format!(
            "layers of different kinds (layer {}: {}; layer {}: {}): one attention kind and one MoE shape for all layers (dense-MLP layers may sit among them), not emitted yet",
            first_moe.index,
            kind.describe(),
            l.index,
            LayerKind::of(l).describe()
        )));
    }
    let FfnKind::Moe(moe) = &first_moe.ffn else {
        unreachable!("found as an MoE layer");
    };
    let layer_ffns = LayerFfns(
        planned
            .iter()
            .map(|l| match l.ffn {
                FfnKind::Moe(_) => Ffn::RoutedExperts,
                FfnKind::Dense { .. } => Ffn::DenseMlp,
            })
            .collect(),
    );
    let a = &spec.attention;
    // The expert ring's bias slots hold a routed expert's chunk biases; a dense MLP or a
    // shared expert streaming through it has none (no family has both).
    if spec.mlp.bias && (!layer_ffns.all_routed() || moe.shared.is_some()) {
        return Err(PlanError::Unsupported(format!(
            "expert biases with dense-MLP layers or a shared expert ({}): the expert ring carries biases for routed experts only",
            spec.family.model_type()
        )));
    }
    if !layer_ffns.all_routed() {
        // The dense MLP's chunks go through the expert ring, so its codes must be the
        // experts': int4's scheme keeps a dense MLP int8 (the dense weights' format).
        if options.weights == WeightsDtype::Int4 {
            return Err(PlanError::Unsupported(format!(
                "--weights-dtype int4 with dense-MLP layers (layers {:?} by the config's {dense_fields}): the int4 scheme stores a dense MLP as int8 per channel, and the expert ring its chunks stream through holds int4 codes (int8 and fp8 are planned)",
                layer_ffns.layers_of(Ffn::DenseMlp)
            )));
        }
    }
    if !a.head_dim.is_multiple_of(2) || a.head_dim > 256 {
        return Err(PlanError::Unsupported(format!("head_dim {}", a.head_dim)));
    }
    Ok((layers, kind, moe, layer_ffns))
}

/// The model's dimensions as the kernel uses them, and the KV tile size.
fn dims(
    spec: &ModelSpec,
    moe: &MoeSpec,
    layer_ffns: &LayerFfns,
    options: &PlanOptions,
) -> (Dims, u64) {
    let a = &spec.attention;
    let batch = options.batch;
    let planned = &spec.layers[..layer_ffns.0.len()];
    // Tiles of up to 1024 positions: libtpu's v6e estimate of Qwen3-30B-A3B at batch 8
    // (4 layers, 4096 positions): 256-position tiles 3.33M cycles, 512 2.66M, 1024 2.40M;
    // larger tiles read more past the position at run time.
    let block_kv = options.context.next_power_of_two().clamp(16, 1024);
    let dims = Dims {
        hidden: spec.hidden_size,
        heads: a.num_heads,
        kv_heads: a.num_kv_heads,
        head_dim: a.head_dim,
        head_pad: round_up(a.head_dim, 128),
        group: a.group_size(),
        experts: moe.num_experts,
        experts_per_device: moe.num_experts,
        experts_pad: round_up(
            moe.num_experts + u64::from(moe.shared.is_some_and(|s| s.sigmoid_gate)),
            128,
        ),
        top_k: moe.top_k,
        intermediate: moe.intermediate,
        dense_intermediate: if layer_ffns.all_routed() { None } else { dense_intermediate(spec) },
        shared_intermediate: moe.shared.map(|s| s.intermediate),
        shared_gate: moe.shared.is_some_and(|s| s.sigmoid_gate),
        vocab: spec.vocab_size,
        batch,
        tokens_per_seq: options.tokens_per_seq,
        tokens: batch * options.tokens_per_seq,
        rows: round_up(batch * options.tokens_per_seq, 16),
        attn_rows: round_up(a.group_size() * options.tokens_per_seq, 16),
        eps: spec.norm.eps,
        layer_norm: matches!(spec.norm.kind, NormKind::Layer { bias: false }),
        // Hunyuan's NTK alpha raises the base; the kernel's frequencies are its powers.
        rope_theta: a.rope.scaling.base(a.rope.theta, a.rope.rotary_dim),
        scale: a.scale,
        qk_norm: matches!(
            a.qk_norm,
            QkNorm::PerHeadRms { .. } | QkNorm::PerHeadRmsAfterRope { .. }
        ),
        qk_norm_after_rope: matches!(a.qk_norm, QkNorm::PerHeadRmsAfterRope { .. }),
        whole_qk_norm: matches!(a.qk_norm, QkNorm::WholeRms { .. }),
        clip_qkv: a.clip_qkv,
        qkv_bias: a.qkv_bias,
        o_bias: a.o_bias,
        window: planned.iter().find_map(|l| match l.attention {
            AttentionKind::Sliding { window } => Some(window),
            _ => None,
        }),
        sliding_layers: {
            let sliding: Vec<u64> = planned
                .iter()
                .filter(|l| matches!(l.attention, AttentionKind::Sliding { .. }))
                .map(|l| l.index as u64)
                .collect();
            (!sliding.is_empty() && sliding.len() < planned.len()).then_some(sliding)
        },
        sinks: a.sinks,
        rope_table: (a.rope.scaling != RopeScaling::Default).then(|| {
            let rotary = a.rope.rotary_dim.min(a.head_dim);
            let (inv_freq, factor) = a.rope.scaling.inv_freq(a.rope.theta, rotary, options.context);
            (inv_freq, f64::from(factor))
        }),
        router_bias: moe.routing.router_bias,
        expert_bias: spec.mlp.bias,
        clamped_swiglu: match spec.mlp.activation {
            Activation::Silu => None,
            Activation::ClampedSwiGlu { alpha, limit } => Some((alpha, limit)),
        },
        scoring: moe.routing.scoring,
        renormalize: moe.routing.top_k_weights == TopKWeights::Renormalized,
        correction_bias: moe.routing.correction_bias,
        expert_groups: moe.routing.groups,
        routed_scaling: moe.routing.scaling,
        rotary_dim: (a.rope.rotary_dim < a.head_dim).then_some(a.rope.rotary_dim),
        positions: round_up(options.context, block_kv),
        mla: match a.form {
            AttentionForm::Mla(m) => Some(m),
            AttentionForm::Gqa => None,
        },
    };
    (dims, block_kv)
}

/// The egg rewrites of the layer graph and of the final norm + `lm_head`, saturated, and
/// their extractions read, typed: the extraction decides the dense stream's segments (each
/// extracted matmul of the layer is one segment, in the extraction's dataflow order; its
/// weight kinds say which), the experts' fused weights and `lm_head`'s. A form the
/// emitter has no schedule for (q/k/v left apart, a norm not folded) is refused.
fn rewrites(spec: &ModelSpec, names: &TensorNames, dims: &Dims) -> Result<Extracted, PlanError> {
    let h = spec.hidden_size;
    let graph = LayerGraph::build(spec, rewritten_layer(spec));
    let layer = rewrite(&graph.to_expr(), &layer_weight_bytes(spec));
    let (norm, lm_head) = (
        Weight::new(WeightKind::FinalNorm, names.final_norm.as_str()),
        Weight::new(WeightKind::LmHead, names.lm_head.as_str()),
    );
    let head = rewrite(
        &format!("(layer (matmul (rmsnorm x w:{}) w:{}))", norm.name, lm_head.name),
        &[(norm, 2 * h), (lm_head, 2 * h * spec.vocab_size)],
    );
    for r in [&layer, &head] {
        if !r.saturated() {
            return Err(PlanError::Rewrite(format!("saturate (stopped: {})", r.stop)));
        }
    }
    let mut col = 0;
    let mut segments = Vec::new();
    for m in &layer.matmuls {
        let (kind, cols) = match (m.kinds().as_slice(), m.folded_kind()) {
            (
                [WeightKind::QProj, WeightKind::KProj, WeightKind::VProj],
                Some(WeightKind::InputNorm),
            ) => (SegmentKind::Qkv, (dims.heads + 2 * dims.kv_heads) * dims.head_pad),
            ([WeightKind::OProj], None) => (SegmentKind::OProj, dims.heads * dims.head_pad),
            ([WeightKind::Router], Some(WeightKind::PostAttentionNorm)) => {
                (SegmentKind::Router, dims.experts_pad)
            }
            _ => {
                return Err(PlanError::Rewrite(format!(
                    "give the dense stream's matmuls (q/k/v fused with input_layernorm folded, o_proj, the router with post_attention_layernorm folded): the extraction chose matmul {}",
                    m.describe()
                )));
            }
        };
        segments.push(Segment { kind, col, cols, weight: m.clone() });
        col += cols;
    }
    if segments.iter().map(|s| s.kind).ne(SegmentKind::SCHEDULE) {
        let got: Vec<String> = layer.matmuls.iter().map(FusedWeight::describe).collect();
        return Err(PlanError::Rewrite(format!(
            "give the dense stream's matmuls once each in the layer's order q/k/v, o_proj, router (extracted: {})",
            got.join(", ")
        )));
    }
    let experts: [FusedWeight; 2] = match layer.experts.as_slice() {
        [gate_up, down]
            if gate_up.kinds() == [WeightKind::ExpertGate, WeightKind::ExpertUp]
                && gate_up.folded_kind() == Some(WeightKind::PostAttentionNorm)
                && down.kinds() == [WeightKind::ExpertDown]
                && down.folded_scale.is_none() =>
        {
            [gate_up.clone(), down.clone()]
        }
        _ => {
            return Err(PlanError::Rewrite(
                "fuse the experts' gate/up with post_attention_layernorm folded".into(),
            ));
        }
    };
    let lm_head = match head.matmuls.as_slice() {
        [m] if m.kinds() == [WeightKind::LmHead]
            && m.folded_kind() == Some(WeightKind::FinalNorm) =>
        {
            m.clone()
        }
        _ => return Err(PlanError::Rewrite("fold the final norm into lm_head".into())),
    };
    Ok(Extracted { graph, layer, head, segments, lm_head, experts })
}

/// The weights' host layout and the operands: the dense stream cut into `~4 MiB` chunks,
/// `lm_head` continuing it, the experts cut into chunks as large as a quarter of VMEM
/// allows for the expert ring (a dense MLP's in chunks of the same shape, through the same
/// ring), the caches.
fn stream_layout(
    spec: &ModelSpec,
    options: &PlanOptions,
    layer_ffns: &LayerFfns,
    dims: &Dims,
    extracted: &Extracted,
) -> Result<StreamLayout, PlanError> {
    let (h, hp, batch, positions, tokens) =
        (dims.hidden, dims.head_pad, dims.batch, dims.positions, dims.tokens);
    let quant = quant_layout(spec, dims, options.weights)?;
    // A quantized plan's router is its own bf16 operand: the dense stream is q/k/v and o.
    let segments: Vec<Segment> = extracted
        .segments
        .iter()
        .filter(|s| quant.is_none() || s.kind != SegmentKind::Router)
        .cloned()
        .collect();
    let width: u64 = segments.iter().map(|s| s.cols).sum();
    // ~4 MiB chunks: a DMA's fixed cost is amortised (libtpu's v6e estimate, Qwen3-30B-A3B,
    // one chunk in flight: 2 MiB 0.71 of the floor, 4 MiB 0.78). bf16: 128..=1024 columns.
    // Codes: chunks of up to 4.5 MiB, the most columns (at most 2304) that divide the layer's
    // columns, so no chunk is padding. Qwen3-30B-A3B int8 (v6e, 8 layers, the bench's
    // setting): 9 chunks of 1024 columns (2 MiB) 1026236 cycles, 6 of 1536 988590, 4 of 2304
    // 934993, 2 of 4608 (9 MiB) 941365. `lm_head`'s own stream takes the same columns, so
    // its banks are held within a sixth of VMEM (fp8's bf16 `lm_head` on v7x, two banks of
    // 2304 columns, left its VMEM plan 6 MiB over; on v6e its three banks give 1536
    // columns, estimated within 0.4% of 2304: fp8, 8 layers, 918969 cycles against 915689).
    let chunk_cols = match quant {
        None => ((4 * MIB / (2 * h)) / 128 * 128).clamp(128, 1024),
        Some(q) => {
            let lm_column = q.lm_head.map_or(2 * h, |f| f.code_bytes(h));
            let lm_most = options.chip.target().vmem_bytes / 6 / (TWO_AHEAD_SLOTS * lm_column);
            let most = (9 * MIB / 2 / q.dense.code_bytes(h)).min(lm_most).clamp(128, 2304) / 128;
            (1..=most).rev().map(|u| u * 128).find(|c| width.is_multiple_of(*c)).unwrap_or(128)
        }
    };
    let per_layer = width.div_ceil(chunk_cols);
    let lm_chunks = round_up(dims.vocab, chunk_cols) / chunk_cols;
    // Expert chunks as large as an expert ring of a quarter of VMEM allows (the largest
    // multiple of 128 dividing the intermediate size): per-chunk cost is amortised
    // (libtpu's v6e estimate, Qwen3-30B-A3B at batch 8: 3 MiB chunks 2.40M cycles for 4
    // layers, whole 9 MiB experts 2.27M). A dense MLP's chunks go through the same ring
    // slots, so the block also divides its intermediate size (both are multiples of 128
    // per device, so 128 always does).
    let i = dims.intermediate;
    let expert_slots = TWO_AHEAD_SLOTS;
    let vmem_capacity = options.chip.target().vmem_bytes;
    let mut expert_block = 128;
    for b in (128..=i).step_by(128) {
        if i.is_multiple_of(b)
            && dims.dense_intermediate.is_none_or(|di| di.is_multiple_of(b))
            && dims.shared_intermediate.is_none_or(|s| s.is_multiple_of(b))
            && expert_slots * 3 * h * b * 2 <= vmem_capacity / 4
        {
            expert_block = b;
        }
    }
    let expert_chunks = i / expert_block;
    let mlp_chunks = dims.dense_intermediate.map_or(0, |di| di / expert_block);
    // A shared expert's chunks are `shared_entries` more entries of `w_experts`, after the
    // device's experts, each of `expert_chunks` chunks.
    let shared_chunks = dims.shared_intermediate.map_or(0, |s| s / expert_block);
    if !shared_chunks.is_multiple_of(expert_chunks) {
        return Err(PlanError::Unsupported(format!(
            "a shared expert of {} intermediate columns per device against the experts' {i}: its chunks stream as whole experts' ({expert_chunks} chunks of {expert_block})",
            dims.shared_intermediate.unwrap_or(0)
        )));
    }
    let shared_entries = shared_chunks / expert_chunks;
    let stream_lm_chunks = if quant.is_some() { 0 } else { lm_chunks };
    let dense_dtype = quant.map_or(DType::Bf16, |q| q.dense.codes);
    let expert_dtype = quant.map_or(DType::Bf16, |q| q.experts.codes);
    let bits = |dtype: DType| u64::from(dtype.bits());

    let l = layer_ffns.0.len() as u64;
    let (l_moe, l_mlp) = (layer_ffns.count(Ffn::RoutedExperts), layer_ffns.count(Ffn::DenseMlp));
    let (e, kvh) = (dims.experts_per_device, dims.kv_heads);
    let vp16 = round_up(spec.vocab_size, 16);
    let operand = |kind, role, dtype, shape: Vec<u64>, space, bytes| Operand {
        kind,
        role,
        dtype,
        shape,
        space,
        bytes,
    };
    use OperandKind::*;
    use OperandRole::{Input, Output, Prefetch};
    let mut operands = vec![
        operand(Tokens, Prefetch, DType::I32, vec![tokens], MemorySpace::Smem, 4 * tokens),
        operand(Positions, Prefetch, DType::I32, vec![batch], MemorySpace::Smem, 4 * batch),
        operand(Embed, Input, DType::Bf16, vec![vp16 / 16, 16, h], MemorySpace::Any, 2 * vp16 * h),
        operand(
            WStream,
            Input,
            dense_dtype,
            vec![l * per_layer + stream_lm_chunks, h, chunk_cols],
            MemorySpace::Any,
            product(
                "the dense weight stream (w_stream)",
                &[bits(dense_dtype), l * per_layer + stream_lm_chunks, h, chunk_cols],
            )? / 8,
        ),
        operand(
            WExperts,
            Input,
            expert_dtype,
            vec![l_moe, e + shared_entries, expert_chunks, h, 3 * expert_block],
            MemorySpace::Any,
            product(
                "the expert weights (w_experts)",
                &[bits(expert_dtype), l_moe, e + shared_entries, i, h, 3],
            )? / 8,
        ),
    ];
    // The dense MLP's codes are the experts' dtype: its chunks go through their ring.
    if let Some(di) = dims.dense_intermediate {
        operands.push(operand(
            WMlp,
            Input,
            expert_dtype,
            vec![l_mlp, mlp_chunks, h, 3 * expert_block],
            MemorySpace::Any,
            product("the dense-MLP weights (w_mlp)", &[bits(expert_dtype), l_mlp, di, h, 3])? / 8,
        ));
    }
    // The f32 operands of rows beside the weights: each the model's if it has them.
    let f32_operand = |kind, shape: Vec<u64>| {
        let bytes = product(&format!("the {}", OperandKind::name(kind)), &shape).map(|n| 4 * n)?;
        Ok::<_, PlanError>(operand(kind, Input, DType::F32, shape, MemorySpace::Any, bytes))
    };
    let (rows, lanes) = (dims.head_norm_rows(), dims.expert_bias_lanes(expert_block));
    let entries = e + shared_entries;
    for (has, kind, shape) in [
        (dims.head_norms(), HeadNorms, vec![l, rows, hp]),
        (dims.qkv_bias, QkvBias, vec![l, dims.qkv_bias_rows(), hp]),
        (dims.o_bias, OBias, vec![l, 8, h]),
        (dims.correction_bias, CorrectionBias, vec![l, 8, dims.experts_pad]),
        (dims.sinks, Sinks, vec![l, kvh, dims.attn_rows, 128]),
        (dims.router_bias, RouterBias, vec![l, 8, dims.experts_pad]),
        (dims.expert_bias, ExpertBias, vec![l_moe, entries, expert_chunks, 8, lanes]),
    ] {
        if has {
            operands.push(f32_operand(kind, shape)?);
        }
    }
    if let Some(q) = quant {
        let (nqkv, nq) = (segments[0].cols, segments[1].cols);
        operands.push(f32_operand(QkvScales, vec![l, q.dense.scale_rows(h, h), nqkv])?);
        operands.push(f32_operand(OScales, vec![l, q.dense.scale_rows(nq, nq), h])?);
        operands.push(operand(
            Router,
            Input,
            DType::Bf16,
            vec![l, h, dims.experts_pad],
            MemorySpace::Any,
            2 * l * h * dims.experts_pad,
        ));
        operands.push(f32_operand(Norms, vec![l + 1, 8, h])?);
        let lm_dtype = q.lm_head.map_or(DType::Bf16, |f| f.codes);
        operands.push(operand(
            LmHead,
            Input,
            lm_dtype,
            vec![lm_chunks, h, chunk_cols],
            MemorySpace::Any,
            lm_chunks * h * chunk_cols * bits(lm_dtype) / 8,
        ));
        if let Some(f) = q.lm_head {
            operands.push(f32_operand(LmScales, vec![lm_chunks, f.scale_rows(h, h), chunk_cols])?);
        }
        // A shared expert's entries have their scales, as its codes (after the experts').
        operands.push(f32_operand(
            ExpertScales,
            vec![
                l_moe,
                e + shared_entries,
                expert_chunks,
                q.experts.scale_rows(h, h),
                2 * expert_block,
            ],
        )?);
        operands.push(f32_operand(
            ExpertDownScales,
            vec![
                l_moe,
                e + shared_entries,
                expert_chunks,
                CodeFormat::dma_scale_rows(q.experts.scale_rows(expert_block, i)),
                h,
            ],
        )?);
        // A dense MLP's scales, laid out as an expert's (its chunks share the ring slots).
        if let Some(di) = dims.dense_intermediate {
            operands.push(f32_operand(
                MlpScales,
                vec![l_mlp, mlp_chunks, q.experts.scale_rows(h, h), 2 * expert_block],
            )?);
            operands.push(f32_operand(
                MlpDownScales,
                vec![
                    l_mlp,
                    mlp_chunks,
                    CodeFormat::dma_scale_rows(q.experts.scale_rows(expert_block, di)),
                    h,
                ],
            )?);
        }
    }
    let kv_shape = vec![l, batch, kvh, positions, hp];
    let kv_bytes = product(
        &format!("each KV cache ([{l}, {batch}, {kvh}, {positions}, {hp}] bf16)"),
        &[2, l, batch, kvh, positions, hp],
    )?;
    for kind in [KCache, VCache] {
        operands.push(operand(
            kind,
            Input,
            DType::Bf16,
            kv_shape.clone(),
            MemorySpace::Any,
            kv_bytes,
        ));
    }
    if options.logits {
        operands.push(operand(
            Logits,
            Output,
            DType::F32,
            vec![lm_chunks, dims.rows, chunk_cols],
            MemorySpace::Vmem,
            4 * lm_chunks * dims.rows * chunk_cols,
        ));
    }
    for kind in [NextIds, MaxLogits] {
        let dtype = if kind == NextIds { DType::I32 } else { DType::F32 };
        operands.push(operand(
            kind,
            Output,
            dtype,
            vec![dims.rows, 128],
            MemorySpace::Vmem,
            4 * dims.rows * 128,
        ));
    }
    let status_lanes = round_up(l, 128);
    operands.push(operand(
        RouterNonFinite,
        Output,
        DType::F32,
        vec![dims.rows, status_lanes],
        MemorySpace::Vmem,
        4 * dims.rows * status_lanes,
    ));
    for kind in [KCacheOut, VCacheOut] {
        operands.push(operand(
            kind,
            Output,
            DType::Bf16,
            kv_shape.clone(),
            MemorySpace::Any,
            kv_bytes,
        ));
    }
    Ok(StreamLayout {
        chunk_cols,
        per_layer,
        segments,
        lm_head: extracted.lm_head.clone(),
        lm_chunks,
        experts: extracted.experts.clone(),
        expert_block,
        expert_chunks,
        mlp_chunks,
        shared_entries,
        operands,
        quant,
    })
}

/// The dense ring (deep: ~24 MiB of banks on 128 MiB-VMEM chips, 16 MiB else, 2..=12
/// banks; single: 3, two chunks ahead as in the expert ring) and the expert ring.
fn prefetch_schedule(
    options: &PlanOptions,
    layers: usize,
    dims: &Dims,
    layout: &StreamLayout,
) -> Rings {
    let bank_bytes = layout.dense_code_bytes(dims.hidden * layout.chunk_cols);
    let ring_target =
        if options.chip.target().vmem_bytes >= 128 * MIB { 24 * MIB } else { 16 * MIB };
    let total_items = layers as u64 * layout.per_layer + layout.stream_lm_chunks();
    let banks = match options.prefetch {
        Prefetch::Deep => (ring_target / bank_bytes).clamp(2, 12).min(total_items.max(2)),
        Prefetch::Single => TWO_AHEAD_SLOTS,
    };
    Rings {
        banks,
        bank_bytes,
        depth: banks - 1,
        expert_slots: TWO_AHEAD_SLOTS,
        expert_slot_bytes: layout.expert_code_bytes(3 * dims.hidden * layout.expert_block),
    }
}

/// The VMEM plan, refused past the chip's VMEM per core: the parts, their total and the
/// limit the kernel is compiled with. The scratch is the kernel's own declaration
/// ([`MegakernelScratch`]), each buffer at the dsl's padded size as the verifier's VMEM
/// check counts it, by group; so are the outputs in VMEM. The rest are estimates: the
/// vector temporaries, a quantized plan's codes widened on their way into the MXU, and
/// headroom for compiler spills.
fn vmem_budget(
    options: &PlanOptions,
    dims: &Dims,
    layout: &StreamLayout,
    scratch: &MegakernelScratch,
    block_kv: u64,
) -> Result<VmemBudget, PlanError> {
    let chip = options.chip;
    let (h, rows) = (dims.hidden, dims.rows);
    let chunk_cols = layout.chunk_cols;
    let f32_bytes = |r: u64, c: u64| padded_vmem_bytes(DType::F32, &Shape::new(vec![r, c]));
    let mut vmem: Vec<(String, u64)> =
        scratch.scratch.vmem_groups().iter().map(|g| (g.label(), g.bytes)).collect();
    let outputs: Vec<&Operand> =
        layout.outputs().filter(|o| o.space == MemorySpace::Vmem).collect();
    if !outputs.is_empty() {
        let names: Vec<&str> = outputs.iter().map(|o| o.kind.name()).collect();
        let bytes = outputs
            .iter()
            .map(|o| padded_vmem_bytes(o.dtype, &Shape::new(o.shape.clone())))
            .fold(0u64, u64::saturating_add);
        vmem.push((format!("outputs ({})", names.join(", ")), bytes));
    }
    if let Some(q) = layout.quant {
        // The codes widened on their way into the MXU, one expert chunk and one dense chunk
        // (`widened_code_bytes`: i8 against the activations' digits needs no copy, i4 an i8
        // one, the mixed product a bf16 one): libtpu's scoped VMEM refused an int4
        // Qwen3-30B-A3B plan (v6e, 8 layers, mixed product) without room for them. The
        // products take the token rows alone when they fit the digits (emit's `token_rows`).
        let product_rows = if dims.tokens <= DIGIT_ROWS { rows.min(DIGIT_ROWS) } else { rows };
        let widened =
            widened_code_bytes(q.experts.codes, product_rows) * 3 * h * layout.expert_block
                + widened_code_bytes(q.dense.codes, product_rows) * h * chunk_cols;
        if widened > 0 {
            vmem.push(("code widening (estimate)".into(), widened));
        }
    }
    let hp = dims.head_pad;
    let scores = f32_bytes(dims.attn_rows, block_kv);
    // K > 1: the K new K/V rows are inserted into both tiles at once, a row mask at a time.
    let inserts = if dims.tokens_per_seq > 1 { 4 * f32_bytes(block_kv, hp) } else { 0 };
    let temporaries = 4 * scores
        + 4 * f32_bytes(rows, 3 * layout.expert_block)
        + 4 * f32_bytes(rows, h.max(chunk_cols))
        + inserts;
    vmem.push(("vector temporaries (estimate)".into(), temporaries));
    vmem.push(("compiler spill headroom".into(), 4 * MIB));
    let vmem_total = vmem.iter().map(|v| v.1).fold(0u64, u64::saturating_add);
    let vmem_capacity = chip.target().vmem_bytes;
    if vmem_total > vmem_capacity {
        let detail = vmem.iter().map(|(n, b)| format!("{n} {b}")).collect::<Vec<_>>().join(" + ");
        return Err(PlanError::Vmem {
            chip,
            need: vmem_total,
            need_mib: vmem_total as f64 / MIB as f64,
            have: vmem_capacity,
            have_mib: vmem_capacity / MIB,
            detail,
        });
    }
    Ok(VmemBudget {
        limit: round_up(vmem_total, MIB).min(vmem_capacity),
        parts: vmem,
        total: vmem_total,
    })
}

/// The operands' HBM arrays together, and the chip's usable HBM per device; refused past
/// it (unless `check_hbm` is off) with the number of layers that would fit.
fn hbm_fit(
    options: &PlanOptions,
    layers: usize,
    dims: &Dims,
    layout: &StreamLayout,
) -> Result<(u64, u64), PlanError> {
    let chip = options.chip;
    let in_hbm: Vec<u64> =
        layout.operands.iter().filter(|o| o.own_hbm_array()).map(|o| o.bytes).collect();
    let hbm_total = total("the operands together", &in_hbm)?;
    let hbm_capacity = hbm_usable_bytes(chip);
    if options.check_hbm && hbm_total > hbm_capacity {
        let (l, h, hp) = (layers as u64, dims.hidden, dims.head_pad);
        let kv_bytes = layout.operand(OperandKind::KCache).map_or(0, |o| o.bytes);
        // Saturating: only the suggestion is computed here, and a saturated layer size
        // suggests 0 layers.
        let per_layer_bytes = match layout.quant {
            // The FFN weights (experts, and a dense MLP where layers mix kinds) averaged
            // over the layers.
            None => (2 * layout.per_layer * h * layout.chunk_cols)
                .saturating_add(
                    [OperandKind::WExperts, OperandKind::WMlp, OperandKind::ExpertBias]
                        .iter()
                        .map(|&kind| layout.operand(kind).map_or(0, |o| o.bytes))
                        .fold(0u64, u64::saturating_add)
                        / l,
                )
                .saturating_add(2 * (kv_bytes / l))
                .saturating_add(if dims.head_norms() { 4 * dims.head_norm_rows() * hp } else { 0 })
                .saturating_add(if dims.qkv_bias { 4 * dims.qkv_bias_rows() * hp } else { 0 })
                .saturating_add(dims.correction_bias_bytes())
                .saturating_add(dims.o_bias_bytes())
                .saturating_add(dims.sinks_bytes())
                .saturating_add(dims.router_bias_bytes()),
            // Every operand with a leading layer axis (a quantized w_stream has no lm_head
            // chunks; `norms` has one more entry, the final norm).
            Some(_) => {
                use OperandKind::*;
                let per_layer = [
                    WStream,
                    WExperts,
                    HeadNorms,
                    QkvBias,
                    CorrectionBias,
                    OBias,
                    Sinks,
                    RouterBias,
                    ExpertBias,
                    KCache,
                    VCache,
                    QkvScales,
                    OScales,
                    Router,
                    ExpertScales,
                    ExpertDownScales,
                    WMlp,
                    MlpScales,
                    MlpDownScales,
                ];
                layout
                    .operands
                    .iter()
                    .filter(|o| per_layer.contains(&o.kind))
                    .map(|o| o.bytes / l)
                    .fold(0u64, u64::saturating_add)
                    .saturating_add(layout.operand(Norms).map_or(0, |o| o.bytes / (l + 1)))
            }
        };
        let fixed = hbm_total.saturating_sub(l.saturating_mul(per_layer_bytes));
        let max_layers = hbm_capacity.saturating_sub(fixed) / per_layer_bytes;
        let big: Vec<String> = layout
            .operands
            .iter()
            .filter(|o| o.bytes > GIB / 16 && o.kind.aliased_input().is_none())
            .map(|o| format!("{} {}", o.kind.name(), o.bytes))
            .collect();
        return Err(PlanError::Hbm {
            chip,
            need: hbm_total,
            need_gib: hbm_total as f64 / GIB as f64,
            have: hbm_capacity,
            have_gib: hbm_capacity as f64 / GIB as f64,
            detail: big.join(" + "),
            max_layers,
            split: String::new(),
        });
    }
    Ok((hbm_total, hbm_capacity))
}

/// Per-dtype weight bytes before the experts' count is known: `(dtype, bytes per expert
/// fetched, bytes besides the experts)`.
type DtypeParts = Vec<(String, u64, u64)>;

/// The weight bytes of one step: the dense stream of all layers, `lm_head`, one expert
/// (each with its scales; a quantized plan's dense part also holds the router and the norm
/// weights, its `lm_head` part the final norm), and for a quantized plan the same bytes by
/// dtype ([`DtypeParts`]).
fn weight_traffic(
    layer_ffns: &LayerFfns,
    dims: &Dims,
    layout: &StreamLayout,
) -> Result<(u64, u64, u64, Option<DtypeParts>), PlanError> {
    let (l, h, chunk_cols) = (layer_ffns.0.len() as u64, dims.hidden, layout.chunk_cols);
    let Some(q) = layout.quant else {
        let dense = product("the dense stream per step", &[2, l, layout.per_layer, h, chunk_cols])?;
        let expert_bytes = product("one expert's weights", &[2, 3, h, dims.intermediate])?
            + expert_bias_bytes(dims, layout);
        return Ok((dense, 2 * layout.lm_chunks * h * chunk_cols, expert_bytes, None));
    };
    let bytes_of = |kind| layout.operand(kind).map_or(0, |o: &Operand| o.bytes);
    let dense_codes = bytes_of(OperandKind::WStream);
    let layer_f32 = bytes_of(OperandKind::QkvScales)
        + bytes_of(OperandKind::OScales)
        + bytes_of(OperandKind::Norms);
    let router = bytes_of(OperandKind::Router);
    let lm_codes = bytes_of(OperandKind::LmHead);
    let lm_f32 = bytes_of(OperandKind::LmScales);
    let per_expert = |kind| bytes_of(kind) / (layer_ffns.count(Ffn::RoutedExperts) * dims.experts);
    // The dense-MLP layers' codes and scales (where layers mix kinds), read whole.
    let mlp_codes = bytes_of(OperandKind::WMlp);
    let mlp_f32 = bytes_of(OperandKind::MlpScales) + bytes_of(OperandKind::MlpDownScales);
    let expert_codes = per_expert(OperandKind::WExperts);
    let expert_f32 = per_expert(OperandKind::ExpertScales)
        + per_expert(OperandKind::ExpertDownScales)
        + expert_bias_bytes(dims, layout);
    let lm_dtype = q.lm_head.map_or(DType::Bf16, |f| f.codes);
    let mut parts: DtypeParts = Vec::new();
    for (dtype, per, fixed) in [
        (q.dense.codes, 0, dense_codes),
        (DType::Bf16, 0, router),
        (lm_dtype, 0, lm_codes),
        (q.experts.codes, expert_codes, mlp_codes),
        (DType::F32, expert_f32, layer_f32 + lm_f32 + mlp_f32),
    ] {
        let name =
            if dtype == DType::F32 { "f32 (scales, norms)".to_string() } else { dtype.to_string() };
        match parts.iter_mut().find(|p| p.0 == name) {
            Some(p) => (p.1, p.2) = (p.1 + per, p.2 + fixed),
            None => parts.push((name, per, fixed)),
        }
    }
    // The final norm's row travels with lm_head; every other entry of `norms` with its layer.
    let final_norm = bytes_of(OperandKind::Norms) / (l + 1);
    Ok((
        dense_codes + layer_f32 - final_norm + router,
        lm_codes + lm_f32 + final_norm,
        expert_codes + expert_f32,
        Some(parts),
    ))
}

/// The zero padding among `t`'s weight bytes per step ([`Dims::tiled`]): each stream's
/// share of padded hidden lanes and intermediate columns, the model's sizes (`model`)
/// against all devices' (`dims`, per device, times the devices the stream's columns are
/// split over: `expert_ways` for the routed experts, every device for a shared expert and a
/// dense MLP), at the same worst case of routing as the stream.
fn padding_bytes(t: &Traffic, model: &Dims, dims: &Dims, devices: u64, expert_ways: u64) -> u64 {
    let padded = |bytes: u64, model_area: u64, area: u64| {
        (bytes as u128 * (area - model_area.min(area)) as u128 / area.max(1) as u128) as u64
    };
    let (h, mh) = (dims.hidden, model.hidden);
    // The shared expert's entries are read whole in every MoE layer.
    let shared_entries = dims.shared_intermediate.map_or(0, |s| s / dims.intermediate);
    let fetched = dims.distinct_experts() + shared_entries;
    let shared = t.experts / fetched.max(1) * shared_entries;
    let ffn = |bytes: u64, model_cols: Option<u64>, cols: Option<u64>, ways: u64| {
        padded(bytes, mh * model_cols.unwrap_or(0), h * ways * cols.unwrap_or(0))
    };
    padded(t.dense + t.lm_head + t.embedding, mh, h)
        + ffn(t.experts - shared, Some(model.intermediate), Some(dims.intermediate), expert_ways)
        + ffn(shared, model.shared_intermediate, dims.shared_intermediate, devices)
        + ffn(t.mlp, model.dense_intermediate, dims.dense_intermediate, devices)
}

/// One expert's `expert_bias` blocks (every chunk's), 0 without expert biases.
fn expert_bias_bytes(dims: &Dims, layout: &StreamLayout) -> u64 {
    if dims.expert_bias {
        4 * layout.expert_chunks * 8 * dims.expert_bias_lanes(layout.expert_block)
    } else {
        0
    }
}

/// The 16-row groups written back from a KV tile holding new rows: one for one token; for
/// K > 1, two (K <= 16 rows span at most two groups), one where the tile is one group.
pub fn written_groups(tokens_per_seq: u64, block_kv: u64) -> u64 {
    if tokens_per_seq == 1 || block_kv == 16 { 1 } else { 2 }
}

/// The 16-row groups of new K/V rows a step writes back per (layer, sequence, kv head,
/// cache), at most: [`written_groups`] for each tile holding new rows (one for one token;
/// at most two for K > 1).
pub fn kv_write_groups(tokens_per_seq: u64, block_kv: u64) -> u64 {
    written_groups(tokens_per_seq, block_kv) * if tokens_per_seq == 1 { 1 } else { 2 }
}

/// The HBM bytes and DMAs of one decode step, by stream, and the time at the chip's HBM
/// bandwidth.
fn traffic(
    spec: &ModelSpec,
    options: &PlanOptions,
    layer_ffns: &LayerFfns,
    dims: &Dims,
    layout: &StreamLayout,
    block_kv: u64,
) -> Result<Traffic, PlanError> {
    let layers = layer_ffns.0.len();
    let (l, h, hp, batch, kvh) =
        (layers as u64, dims.hidden, dims.head_pad, dims.batch, dims.kv_heads);
    let (l_moe, l_mlp) = (layer_ffns.count(Ffn::RoutedExperts), layer_ffns.count(Ffn::DenseMlp));
    let (per_layer, lm_chunks) = (layout.per_layer, layout.lm_chunks);
    let (dense, lm_head, expert_bytes, by_dtype) = weight_traffic(layer_ffns, dims, layout)?;
    let mlp = [OperandKind::WMlp, OperandKind::MlpScales, OperandKind::MlpDownScales]
        .iter()
        .map(|&kind| layout.operand(kind).map_or(0, |o| o.bytes))
        .sum();
    let tokens = dims.tokens;
    // A shared expert's entries are read whole in every MoE layer, whatever the routing.
    let shared = layout.shared_entries;
    let experts_without_dedupe = product(
        "the expert weights read per step",
        &[l_moe, tokens * dims.top_k + shared, expert_bytes],
    )?;
    let distinct = dims.distinct_experts();
    let experts =
        product("the expert weights read per step", &[l_moe, distinct + shared, expert_bytes])?;
    // The experts' share of the per-dtype weight bytes, at the same worst case.
    let by_dtype = by_dtype.map(|parts| {
        parts
            .into_iter()
            .map(|(dtype, per_expert, fixed)| (dtype, fixed + l_moe * distinct * per_expert))
            .collect()
    });
    let e = dims.experts as f64;
    // Each of this device's experts is chosen by some row with probability
    // 1 - (1 - top_k / E)^rows.
    let experts_uniform_routing = l_moe as f64
        * dims.experts_per_device as f64
        * (1.0 - (1.0 - dims.top_k as f64 / e).powf(tokens as f64))
        * expert_bytes as f64
        + (l_moe * shared * expert_bytes) as f64;
    // KV tiles read per (layer, sequence, kv head): a sliding layer's its window's (one
    // more where the window straddles a tile boundary), a full one's the context's.
    let tiles_of = |window: Option<u64>| {
        let span = window.map_or(options.context, |w| w.min(options.context));
        let tiles = span.div_ceil(block_kv) + u64::from(window.is_some());
        match options.kv_tiles {
            KvTiles::UpToPosition => tiles.min(dims.positions / block_kv),
            KvTiles::All => dims.positions / block_kv,
        }
    };
    let sliding = (0..l).filter(|&i| dims.slides(i)).count() as u64;
    let tiles = sliding * tiles_of(dims.window) + (l - sliding) * tiles_of(None);
    let kv_read = product("the KV cache read per step", &[batch, kvh, 2, tiles, block_kv, hp, 2])?;
    let kv_write = product(
        "the KV cache written per step",
        &[l, batch, kvh, 2, 16 * kv_write_groups(dims.tokens_per_seq, block_kv), hp, 2],
    )?;
    let embedding = tokens * 16 * h * 2;
    let head_norms = if dims.head_norms() { l * dims.head_norm_rows() * hp * 4 } else { 0 };
    // The q/k/v and o biases' rows.
    let qkv_bias =
        if dims.qkv_bias { l * dims.qkv_bias_rows() * hp * 4 } else { 0 } + l * dims.o_bias_bytes();
    let correction_bias = l_moe * dims.correction_bias_bytes();
    // The sinks' and router biases' rows, one copy per layer.
    let sinks = l * dims.sinks_bytes() + l_moe * dims.router_bias_bytes();
    let step_total = total(
        "the bytes moved per step",
        &[
            dense,
            lm_head,
            experts,
            mlp,
            kv_read,
            kv_write,
            embedding,
            head_norms,
            qkv_bias,
            correction_bias,
            sinks,
        ],
    )?;
    let mut truncated = spec.clone();
    truncated.layers.truncate(layers);
    let model_total = truncated.decode_traffic(batch, options.context, 2).total();
    // Every layer's dense chunks and KV tiles; the FFN's chunks by kind (an MoE layer's
    // distinct experts', a dense-MLP layer's MLP's).
    let dmas_per_layer = total(
        "the DMAs per step",
        &[
            per_layer,
            1 + u64::from(dims.qkv_bias) + u64::from(dims.o_bias) + u64::from(dims.sinks),
            product(
                "the DMAs per step",
                &[batch, kvh, 2, kv_write_groups(dims.tokens_per_seq, block_kv)],
            )?,
        ],
    )?;
    let kv_read_dmas = product("the DMAs per step", &[batch, kvh, 2, tiles])?;
    // An expert chunk's DMAs, one more with its bias block.
    let per_chunk = 2 + u64::from(dims.expert_bias);
    let ffn_dmas = total(
        "the DMAs per step",
        &[
            product(
                "the DMAs per step",
                &[l_moe, distinct + shared, layout.expert_chunks, per_chunk],
            )?,
            product("the DMAs per step", &[l_mlp, layout.mlp_chunks, 2])?,
            l_moe * (u64::from(dims.correction_bias) + u64::from(dims.router_bias)),
        ],
    )?;
    // A quantized plan adds per layer its scales, router and norm rows (4) and two scale
    // DMAs per expert (or dense-MLP) chunk; per step the final norm row and lm_head's
    // scales.
    let (quant_per_layer, quant_per_step) = match layout.quant {
        Some(q) => (4, 1 + if q.lm_head.is_some() { lm_chunks } else { 0 } + ffn_dmas),
        None => (0, 0),
    };
    let dmas = total(
        "the DMAs per step",
        &[
            product("the DMAs per step", &[l, dmas_per_layer + quant_per_layer])?,
            kv_read_dmas,
            ffn_dmas,
            lm_chunks,
            tokens,
            quant_per_step,
        ],
    )?;
    Ok(Traffic {
        by_dtype,
        dense,
        lm_head,
        experts,
        mlp,
        experts_without_dedupe,
        experts_uniform_routing,
        kv_read,
        kv_write,
        embedding,
        head_norms,
        qkv_bias,
        correction_bias,
        padding: 0,
        sinks,
        total: step_total,
        model_total,
        floor_seconds: step_total as f64 / options.chip.target().hbm_bandwidth_per_tensorcore(),
        dmas,
    })
}
