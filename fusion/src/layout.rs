//! The stream layout: the megakernel's operands and where every weight sits in them, typed.
//! The plan decides it ([`crate::plan::Plan::layout`]); the emitter declares its operands
//! from it and reads its dense stream by [`SegmentKind`], the weight packer fills the arrays
//! it describes, and the report renders its operand prose from it. Nothing is looked up by
//! name.

use crate::rewrite::FusedWeight;
use palladium_dsl::DType;
use palladium_dsl::build::{MemorySpace, OperandRole};
use serde::{Serialize, Serializer};

/// A segment of a layer's dense stream: the columns of one extracted matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SegmentKind {
    /// q, k and v fused, `input_layernorm` folded: every head padded to `head_pad` columns.
    Qkv,
    /// `o_proj`, each head's input rows padded to `head_pad`, not transposed.
    OProj,
    /// The router, `post_attention_layernorm` folded, padded to `experts_pad` columns.
    Router,
}

impl SegmentKind {
    /// The order the emitter's schedule consumes the segments in (the layer's dataflow:
    /// attention between q/k/v and `o_proj`, routing after the attention residual).
    pub const SCHEDULE: [SegmentKind; 3] =
        [SegmentKind::Qkv, SegmentKind::OProj, SegmentKind::Router];

    pub fn name(self) -> &'static str {
        match self {
            SegmentKind::Qkv => "qkv",
            SegmentKind::OProj => "o",
            SegmentKind::Router => "router",
        }
    }
}

/// A layer's FFN stage: what the megakernel runs on the layer's post-attention residual.
/// The attention stages and the dense stream (q/k/v, `o_proj`, router segments) are the
/// same for every kind, so the dense ring's banks and chunk indices stay uniform across
/// layers; the kind picks the FFN stage, both of which stream their chunks through the
/// same expert ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ffn {
    /// The router, top-k and the routed experts (`w_experts`).
    RoutedExperts,
    /// One gated MLP (`w_mlp`), every row at weight 1: Qwen3-MoE's `mlp_only_layers` /
    /// `decoder_sparse_step`. Its router columns in the dense stream are zero, streamed and
    /// projected like any layer's (a uniform stream), and never read.
    DenseMlp,
}

impl Ffn {
    pub fn name(self) -> &'static str {
        match self {
            Ffn::RoutedExperts => "routed experts",
            Ffn::DenseMlp => "dense MLP",
        }
    }
}

/// The FFN kind of every planned layer, and each layer's index among the layers of its
/// kind (its slot in `w_experts` or `w_mlp`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct LayerFfns(pub Vec<Ffn>);

impl LayerFfns {
    /// Whether every layer has the routed experts (the plan, the operands and the emitted
    /// kernel are then exactly those of a model with MoE layers only).
    pub fn all_routed(&self) -> bool {
        self.0.iter().all(|&f| f == Ffn::RoutedExperts)
    }

    /// The layers of kind `kind`, in order.
    pub fn layers_of(&self, kind: Ffn) -> Vec<u64> {
        (0..self.0.len() as u64).filter(|&l| self.0[l as usize] == kind).collect()
    }

    pub fn count(&self, kind: Ffn) -> u64 {
        self.0.iter().filter(|&&f| f == kind).count() as u64
    }

    /// Layer `layer`'s slot among the layers of its kind.
    pub fn slot(&self, layer: usize) -> usize {
        self.0[..layer].iter().filter(|&&f| f == self.0[layer]).count()
    }

    /// The kinds in runs, `"0-1 routed experts, 2 dense MLP, 3 routed experts"`.
    pub fn describe(&self) -> String {
        let mut runs: Vec<(usize, usize, Ffn)> = Vec::new();
        for (l, &f) in self.0.iter().enumerate() {
            match runs.last_mut() {
                Some((_, end, kind)) if *kind == f => *end = l,
                _ => runs.push((l, l, f)),
            }
        }
        runs.iter()
            .map(
                |&(a, b, f)| {
                    if a == b {
                        format!("{a} {}", f.name())
                    } else {
                        format!("{a}-{b} {}", f.name())
                    }
                },
            )
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One fused weight in a column range of each layer's dense stream.
#[derive(Clone, Debug, Serialize)]
pub struct Segment {
    pub kind: SegmentKind,
    /// First column in the per-layer stream, and width (both multiples of 128).
    pub col: u64,
    pub cols: u64,
    /// The Hugging Face weights (per layer) and the folded norm scale, as extracted.
    pub weight: FusedWeight,
}

/// A piece of a chunk: columns `[chunk_col, chunk_col + cols)` of the chunk are columns
/// `[seg_col, seg_col + cols)` of the segment `segment`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Piece {
    pub segment: SegmentKind,
    pub seg_col: u64,
    pub chunk_col: u64,
    pub cols: u64,
}

/// What an operand of the megakernel holds (the crate docs' operand interface).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OperandKind {
    Tokens,
    Positions,
    Embed,
    WStream,
    WExperts,
    /// The dense-MLP layers' weights (only where layers mix kinds, [`Ffn::DenseMlp`]).
    WMlp,
    HeadNorms,
    /// The q/k/v projections' biases, a row per head (where the model has them).
    QkvBias,
    /// `DeepSeek`-V3's `e_score_correction_bias`, a row per MoE layer (where the router
    /// has one): added to the scores to choose the experts only.
    CorrectionBias,
    /// `o_proj`'s bias, a row per layer (where the model has it): added once to the
    /// attention output after its all-reduce.
    OBias,
    /// gpt-oss's attention sinks, per layer a row per query row of each kv group's
    /// attention (the row's head's sink in every lane).
    Sinks,
    /// The router's bias, a row per MoE layer (gpt-oss).
    RouterBias,
    /// The experts' biases, a block per expert chunk (gpt-oss): row 0 the chunk's gate
    /// and up biases, row 1 the expert's down bias (its first chunk only).
    ExpertBias,
    KCache,
    VCache,
    Logits,
    NextIds,
    MaxLogits,
    /// Which token rows' router logits were not finite, per layer: the step names the
    /// first such layer instead of only finding the logits poisoned.
    RouterNonFinite,
    KCacheOut,
    VCacheOut,
    /// Quantized plans only ([`QuantLayout`]): the scales of the dense stream's q/k/v and
    /// `o_proj` codes, the bf16 router, the RMSNorm weights (applied in the kernel, not
    /// folded), `lm_head` (its own stream) and its scales, the experts' scales.
    QkvScales,
    OScales,
    Router,
    Norms,
    LmHead,
    LmScales,
    ExpertScales,
    ExpertDownScales,
    /// A quantized plan's dense-MLP scales (where layers mix kinds), as the experts'.
    MlpScales,
    MlpDownScales,
}

impl OperandKind {
    /// The operand's name in the kernel's call spec.
    pub fn name(self) -> &'static str {
        match self {
            OperandKind::Tokens => "tokens",
            OperandKind::Positions => "positions",
            OperandKind::Embed => "embed",
            OperandKind::WStream => "w_stream",
            OperandKind::WExperts => "w_experts",
            OperandKind::WMlp => "w_mlp",
            OperandKind::HeadNorms => "head_norms",
            OperandKind::QkvBias => "qkv_bias",
            OperandKind::CorrectionBias => "correction_bias",
            OperandKind::OBias => "o_bias",
            OperandKind::Sinks => "sinks",
            OperandKind::RouterBias => "router_bias",
            OperandKind::ExpertBias => "expert_bias",
            OperandKind::KCache => "k_cache",
            OperandKind::VCache => "v_cache",
            OperandKind::Logits => "logits",
            OperandKind::NextIds => "next_ids",
            OperandKind::MaxLogits => "max_logits",
            OperandKind::RouterNonFinite => "router_non_finite",
            OperandKind::KCacheOut => "k_cache_out",
            OperandKind::VCacheOut => "v_cache_out",
            OperandKind::QkvScales => "qkv_scales",
            OperandKind::OScales => "o_scales",
            OperandKind::Router => "w_router",
            OperandKind::Norms => "norms",
            OperandKind::LmHead => "w_lm_head",
            OperandKind::LmScales => "lm_scales",
            OperandKind::ExpertScales => "expert_scales",
            OperandKind::ExpertDownScales => "expert_down_scales",
            OperandKind::MlpScales => "mlp_scales",
            OperandKind::MlpDownScales => "mlp_down_scales",
        }
    }

    /// The input an output is aliased to (updated in place).
    pub fn aliased_input(self) -> Option<OperandKind> {
        match self {
            OperandKind::KCacheOut => Some(OperandKind::KCache),
            OperandKind::VCacheOut => Some(OperandKind::VCache),
            _ => None,
        }
    }
}

/// `prefetch`, `input` or `output`, as the report and the JSON write it.
pub fn role_name(role: OperandRole) -> &'static str {
    match role {
        OperandRole::Prefetch => "prefetch",
        OperandRole::Input => "input",
        OperandRole::Output => "output",
    }
}

fn serialize_role<S: Serializer>(role: &OperandRole, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(role_name(*role))
}

/// Serializes a value as its `Display` text (`bf16`, `any`, `v6e`), as the report writes it.
pub(crate) fn display<S: Serializer, T: std::fmt::Display>(
    value: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One stacked operand of the megakernel.
#[derive(Clone, Debug, Serialize)]
pub struct Operand {
    #[serde(rename = "name")]
    pub kind: OperandKind,
    #[serde(serialize_with = "serialize_role")]
    pub role: OperandRole,
    #[serde(serialize_with = "display")]
    pub dtype: DType,
    pub shape: Vec<u64>,
    #[serde(serialize_with = "display")]
    pub space: MemorySpace,
    pub bytes: u64,
}

impl Operand {
    /// Whether the call holds an array of its own for it in HBM: the inputs in HBM and the
    /// outputs not aliased to an input (the scalar-prefetch arrays are a few bytes of SMEM).
    pub fn own_hbm_array(&self) -> bool {
        match self.role {
            OperandRole::Prefetch => false,
            OperandRole::Input => self.space.is_hbm_like(),
            OperandRole::Output => self.kind.aliased_input().is_none(),
        }
    }
}

/// How one group of quantized weights is stored in the kernel: its codes' dtype (`i8`,
/// `f8E4M3FN`, `i4`) and the inputs one f32 scale covers ([`crate::plan`] docs: per output
/// channel, or 128 consecutive inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CodeFormat {
    #[serde(serialize_with = "display")]
    pub codes: DType,
    /// `None`: one scale per output channel (the group is all of the weight's inputs).
    pub group: Option<u64>,
}

impl CodeFormat {
    /// Inputs per scale for a weight of `inputs` inputs.
    pub fn group_of(self, inputs: u64) -> u64 {
        self.group.map_or(inputs, |g| g.min(inputs))
    }

    /// Scale rows of a block of `inputs` inputs, of a weight of `weight_inputs` inputs.
    pub fn scale_rows(self, inputs: u64, weight_inputs: u64) -> u64 {
        inputs.div_ceil(self.group_of(weight_inputs))
    }

    /// Rows a block of `scale_rows` f32 scale rows takes in an operand copied by an explicit
    /// DMA: libtpu's v6e static profiler aborts ("Unsupported DMA direction: 0 on GL/GLP") on
    /// a copy of 3, 6 or 12 f32 rows and prices 1, 2, 4, 8 and 16, so the rows are padded to a
    /// power of two below 8, else to a multiple of 8 (the padding rows are never read).
    pub fn dma_scale_rows(scale_rows: u64) -> u64 {
        if scale_rows < 8 { scale_rows.next_power_of_two() } else { scale_rows.next_multiple_of(8) }
    }

    /// Bytes of `elements` codes (i4: two a byte).
    pub fn code_bytes(self, elements: u64) -> u64 {
        (elements * u64::from(self.codes.bits())).div_ceil(8)
    }
}

/// The quantized weights of a plan ([`crate::plan::PlanOptions::weights`] not bf16). Every
/// RMSNorm weight is applied in the kernel (the `norms` operand) instead of being folded,
/// so the codes are the checkpoint's own weights (an FP8 checkpoint's as they ship) and the
/// reference on the dequantized weights computes what the kernel does. The dense stream
/// holds the layers' q/k/v and `o_proj` codes only; the router (bf16 in every scheme) is
/// its own operand fetched once per layer, `lm_head` its own stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QuantLayout {
    /// `int8`, `fp8` or `int4`.
    pub scheme: &'static str,
    pub dense: CodeFormat,
    pub experts: CodeFormat,
    /// `None`: `lm_head` stays bf16 (fp8, as Hugging Face's FP8 checkpoints keep it).
    pub lm_head: Option<CodeFormat>,
}

/// The megakernel's operands and the layout of its weight streams.
#[derive(Clone, Debug, Serialize)]
pub struct StreamLayout {
    /// Columns of one dense chunk (a ring bank holds `[hidden, chunk_cols]` bf16).
    pub chunk_cols: u64,
    /// Dense chunks per layer (the segments' columns, rounded up to chunks).
    pub per_layer: u64,
    /// The segments of each layer's dense stream, in [`SegmentKind::SCHEDULE`] order.
    pub segments: Vec<Segment>,
    /// `lm_head` (final norm folded): the dense stream's last `lm_chunks` chunks (its own
    /// stream of as many chunks, norm not folded, in a quantized plan).
    pub lm_head: FusedWeight,
    pub lm_chunks: u64,
    /// The experts' weights as extracted: `[gate | up (norm folded), down]`.
    pub experts: [FusedWeight; 2],
    /// Expert chunk width (intermediate columns) and chunks per expert.
    pub expert_block: u64,
    pub expert_chunks: u64,
    /// Chunks of `expert_block` intermediate columns of one dense MLP (`w_mlp`), 0 when
    /// every layer is MoE.
    #[serde(skip_serializing_if = "is_zero")]
    pub mlp_chunks: u64,
    /// A shared expert's entries in `w_experts`, after the device's routed experts: its
    /// chunks as whole experts' (`expert_chunks` each), 0 without one.
    #[serde(skip_serializing_if = "is_zero")]
    pub shared_entries: u64,
    /// In call order (Pallas's: scalar prefetch, inputs, outputs).
    pub operands: Vec<Operand>,
    /// The quantized weights' formats; `None` for bf16 weights (norms folded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantLayout>,
}

impl StreamLayout {
    /// The operand of kind `kind`, if the model has it (`head_norms` is Qwen3's only).
    pub fn operand(&self, kind: OperandKind) -> Option<&Operand> {
        self.operands.iter().find(|o| o.kind == kind)
    }

    /// Its position in the call (the kernel's operands: prefetch, inputs, outputs).
    pub fn index(&self, kind: OperandKind) -> Option<usize> {
        self.operands.iter().position(|o| o.kind == kind)
    }

    /// The call's input arrays (scalar prefetch, then inputs), in order.
    pub fn inputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role != OperandRole::Output)
    }

    /// The call's results, in order.
    pub fn outputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role == OperandRole::Output)
    }

    /// Chunks of `lm_head` that continue the dense stream array: all of them with bf16
    /// weights, none in a quantized plan (`lm_head` is then its own stream).
    pub fn stream_lm_chunks(&self) -> u64 {
        if self.quant.is_some() { 0 } else { self.lm_chunks }
    }

    /// Bytes of `elements` dense-stream weights (bf16, or the quantized codes).
    pub fn dense_code_bytes(&self, elements: u64) -> u64 {
        self.quant.map_or(2 * elements, |q| q.dense.code_bytes(elements))
    }

    /// Bytes of `elements` expert weights (bf16, or the quantized codes).
    pub fn expert_code_bytes(&self, elements: u64) -> u64 {
        self.quant.map_or(2 * elements, |q| q.experts.code_bytes(elements))
    }

    /// The segment of kind `kind`.
    pub fn segment(&self, kind: SegmentKind) -> Option<&Segment> {
        self.segments.iter().find(|s| s.kind == kind)
    }

    /// The pieces of dense chunk `chunk` (`< per_layer`) of every layer, in column order.
    pub fn pieces(&self, chunk: u64) -> Vec<Piece> {
        let (start, end) = (chunk * self.chunk_cols, (chunk + 1) * self.chunk_cols);
        self.segments
            .iter()
            .filter(|s| s.col < end && start < s.col + s.cols)
            .map(|s| {
                let from = s.col.max(start);
                let to = (s.col + s.cols).min(end);
                Piece {
                    segment: s.kind,
                    seg_col: from - s.col,
                    chunk_col: from - start,
                    cols: to - from,
                }
            })
            .collect()
    }
}
