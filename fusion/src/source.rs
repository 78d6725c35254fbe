//! Where every element of every weight operand comes from: one typed source map per
//! operand of [`crate::layout::StreamLayout::operands`], declared once here from the plan. The weight
//! packer (`palladium-decode`'s `pack`) walks these maps to fill the arrays, and the
//! report ([`crate::report::operand_source`]) renders its operand prose from them, so the
//! layout's index math (q/k/v heads, head padding, chunks, device slices, quantized codes
//! and their scales) exists once.
//!
//! A map is a list of [`Block`]s: rectangles of the operand (a run of rows of a run of
//! columns, as the operand is stored row-major), each repeated over [`Stack`] indices
//! (layers, experts, chunks), whose element `(r, s)` is one element of one checkpoint
//! tensor ([`Read`]: the tensor by role, [`Element`] value, code or scale, transposed or
//! not, a norm scale folded), its row and column given by an [`Axis`] each: the padding
//! (heads to `head_pad`, experts, vocabulary chunks, columns past a size) maps to `None`.
//! An element no block covers is zero padding. Indices of a device's share are written in
//! terms of the device's index `me` and evaluated per device, so one map serves every
//! device and the report prints the formulas.

use crate::graph::WeightKind;
use crate::layout::{CodeFormat, Ffn, OperandKind, SegmentKind};
use crate::options::Dims;
use crate::plan::Plan;
use crate::shard::ExpertSplit;
use palladium_model::spec::MlaSpec;

/// A checkpoint tensor by role; per-layer roles take the layer (and expert) from the
/// block's [`Stack`] indices. The packer resolves roles to Hugging Face names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The embedding (`model.embed_tokens.weight`).
    Embed,
    Weight(WeightKind),
}

impl Role {
    /// Whether the tensor is one per layer (its name has the layer's index).
    pub fn per_layer(self) -> bool {
        !matches!(self, Role::Embed | Role::Weight(WeightKind::FinalNorm | WeightKind::LmHead))
    }

    /// Whether the tensor is one per expert.
    pub fn per_expert(self) -> bool {
        matches!(
            self,
            Role::Weight(
                WeightKind::ExpertGate
                    | WeightKind::ExpertUp
                    | WeightKind::ExpertDown
                    | WeightKind::ExpertGateBias
                    | WeightKind::ExpertUpBias
                    | WeightKind::ExpertDownBias
            )
        )
    }

    /// The model's `[out, in]` shape of the tensor (a norm's `[n]`), from the model's sizes.
    pub fn shape(self, m: &Dims) -> Vec<u64> {
        let (h, q, kv) = (m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim);
        let (i, di) = (m.intermediate, m.dense_intermediate.unwrap_or(0));
        let si = m.shared_intermediate.unwrap_or(0);
        match self {
            Role::Embed | Role::Weight(WeightKind::LmHead) => vec![m.vocab, h],
            Role::Weight(w) => match w {
                WeightKind::InputNorm | WeightKind::PostAttentionNorm | WeightKind::FinalNorm => {
                    vec![h]
                }
                WeightKind::QNorm if m.whole_qk_norm => vec![q],
                WeightKind::KNorm if m.whole_qk_norm => vec![kv],
                WeightKind::QNorm | WeightKind::KNorm => vec![m.head_dim],
                WeightKind::QBias => vec![q],
                WeightKind::KBias | WeightKind::VBias => vec![kv],
                WeightKind::QProj if m.mla.is_none() => vec![q, h],
                WeightKind::QProj
                | WeightKind::QAProj
                | WeightKind::QANorm
                | WeightKind::QBProj
                | WeightKind::KvAProj
                | WeightKind::KvANorm
                | WeightKind::KvBProj => match m.mla {
                    Some(mla) => mla_shape(w, mla, m.heads, h),
                    None => unreachable!("{w:?} is read only where the model has MLA"),
                },
                WeightKind::KProj | WeightKind::VProj => vec![kv, h],
                WeightKind::OProj => vec![h, q],
                WeightKind::Router => vec![m.experts, h],
                WeightKind::CorrectionBias | WeightKind::RouterBias => vec![m.experts],
                WeightKind::Sinks => vec![m.heads],
                WeightKind::ExpertGateBias | WeightKind::ExpertUpBias => vec![i],
                WeightKind::ExpertDownBias => vec![h],
                WeightKind::OBias => vec![h],
                WeightKind::ExpertGate | WeightKind::ExpertUp => vec![i, h],
                WeightKind::ExpertDown => vec![h, i],
                WeightKind::MlpGate | WeightKind::MlpUp => vec![di, h],
                WeightKind::SharedGate | WeightKind::SharedUp => vec![si, h],
                WeightKind::SharedDown => vec![h, si],
                WeightKind::SharedExpertGate => vec![1, h],
                WeightKind::MlpDown => vec![h, di],
                WeightKind::LmHead => unreachable!("matched above"),
            },
        }
    }
}

/// The `[out, in]` shape of multi-head latent attention's weight `kind` (a norm's `[n]`),
/// for `heads` query heads on a hidden size `h`.
fn mla_shape(kind: WeightKind, m: MlaSpec, heads: u64, h: u64) -> Vec<u64> {
    let q = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
    let q_lora = m.q_lora_rank.unwrap_or(0);
    match kind {
        WeightKind::QProj => vec![q, h],
        WeightKind::QAProj => vec![q_lora, h],
        WeightKind::QANorm => vec![q_lora],
        WeightKind::QBProj => vec![q, q_lora],
        WeightKind::KvAProj => vec![m.latent_cache_width(), h],
        WeightKind::KvANorm => vec![m.kv_lora_rank],
        WeightKind::KvBProj => {
            vec![heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank]
        }
        other => unreachable!("{other:?} is not a weight of multi-head latent attention"),
    }
}

/// What a block's element is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// The tensor's value rounded to bf16 (times the folded norm's, in f32).
    Value,
    /// The tensor's value as loaded, unrounded (an f32 operand the kernel adds in f32:
    /// the router's correction bias, which checkpoints ship in f32).
    Exact,
    /// The tensor's quantized code, stored as `format` says.
    Code(CodeFormat),
    /// The f32 scale of the tensor's code at the element's (row, input).
    Scale(CodeFormat),
}

/// One block's tensor and how its elements are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    pub tensor: Role,
    pub element: Element,
    /// Block row `r`, column `s` read tensor element `[col(s), row(r)]` (transposed: the
    /// block's rows are the tensor's inputs) instead of `[row(r), col(s)]`.
    pub transposed: bool,
    /// A norm scale multiplied in, indexed by the tensor's input (column) index.
    pub fold: Option<WeightKind>,
}

/// How a device's local head maps to the model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadMap {
    /// Query heads: `me*per_device + h` (`replicas` 1); with each KV head replicated on
    /// `replicas` devices, the `(me % replicas)`-th slice of KV head `me / replicas`'s
    /// query group, `j = (me % replicas)*per_device + h`, padding where `j >= group`.
    Query { per_device: u64, replicas: u64, group: u64 },
    /// KV heads: `(me / replicas)*per_device + h`.
    Kv { per_device: u64, replicas: u64 },
}

impl HeadMap {
    fn model(self, me: u64, h: u64) -> Option<u64> {
        match self {
            HeadMap::Query { per_device, replicas: 1, .. } => Some(me * per_device + h),
            HeadMap::Query { per_device, replicas, group } => {
                let j = (me % replicas) * per_device + h;
                (j < group).then_some((me / replicas) * group + j)
            }
            HeadMap::Kv { per_device, replicas } => Some((me / replicas) * per_device + h),
        }
    }

    fn describe(self, var: &str) -> String {
        match self {
            HeadMap::Query { per_device, replicas: 1, .. } => affine(per_device, var),
            HeadMap::Query { per_device, replicas: r, group } => {
                format!("(me / {r})*{group} + (me % {r})*{per_device} + {var}")
            }
            HeadMap::Kv { per_device, replicas: 1 } => affine(per_device, var),
            HeadMap::Kv { per_device, replicas: r } => format!("(me / {r})*{per_device} + {var}"),
        }
    }
}

/// `me*k + var`, or `var` where the slice does not move with the device.
fn affine(k: u64, var: &str) -> String {
    match k {
        0 => var.to_string(),
        1 => format!("me + {var}"),
        k => format!("me*{k} + {var}"),
    }
}

/// How a local index maps to the model's (`None`: padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexMap {
    /// A device's slice of `size`: local `i < len` is `me*per_device + i`; padding at and
    /// past `size` (one device, or a replicated index: `per_device` 0).
    Slice { per_device: u64, len: u64, size: u64 },
    /// Heads padded from `head_dim` to `head_pad`: `i` is column `i % head_pad` of local
    /// head `i / head_pad` (padding at and past `head_dim`), the model's index
    /// `head*head_dim + column`.
    Heads { head_dim: u64, head_pad: u64, heads: HeadMap },
}

impl IndexMap {
    /// The whole of a dimension of `size` (padding past it).
    pub fn whole(size: u64) -> IndexMap {
        IndexMap::Slice { per_device: 0, len: size, size }
    }

    pub fn model(self, me: u64, i: u64) -> Option<u64> {
        match self {
            IndexMap::Slice { per_device, len, size } => {
                let g = me * per_device + i;
                (i < len && g < size).then_some(g)
            }
            IndexMap::Heads { head_dim, head_pad, heads } => {
                let (h, c) = (i / head_pad, i % head_pad);
                if c >= head_dim {
                    return None;
                }
                heads.model(me, h).map(|g| g * head_dim + c)
            }
        }
    }
}

/// A block's row or column: local index `x` of chunk `c` is index `start + c*chunk +
/// x*step` of the [`IndexMap`] (`step` > 1 samples a group's first input for a scale).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    pub start: u64,
    pub chunk: u64,
    pub step: u64,
    pub map: IndexMap,
}

impl Axis {
    pub fn new(map: IndexMap) -> Axis {
        Axis { start: 0, chunk: 0, step: 1, map }
    }

    pub fn chunked(self, chunk: u64) -> Axis {
        Axis { chunk, ..self }
    }

    pub fn from(self, start: u64) -> Axis {
        Axis { start, ..self }
    }

    pub fn every(self, step: u64) -> Axis {
        Axis { step, ..self }
    }

    /// The model's index of local `x` in chunk `c` on device `me`.
    pub fn model(&self, me: u64, c: u64, x: u64) -> Option<u64> {
        self.map.model(me, self.start + c * self.chunk + x * self.step)
    }

    /// The index as a formula of `var` (and `c`, `me`), with its padding.
    fn describe(&self, var: &str, count: u64) -> String {
        let mut terms = Vec::new();
        if self.start > 0 {
            terms.push(self.start.to_string());
        }
        if self.chunk > 0 {
            terms.push(format!("c*{}", self.chunk));
        }
        // `var` "0": a block of one row or column.
        match (var, self.step) {
            ("0", _) => {}
            (_, 1) => terms.push(var.to_string()),
            (_, step) => terms.push(format!("{var}*{step}")),
        }
        let local = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
        match self.map {
            IndexMap::Slice { per_device, len, size } => {
                let at = affine(per_device, &local);
                let at = if per_device > 0 || self.start > 0 || self.chunk > 0 || self.step > 1 {
                    at
                } else {
                    var.to_string()
                };
                if per_device > 0 {
                    format!("{at} (zero past local {len} or the model's {size})")
                } else if self.chunk > 0 || self.start + count * self.step > size {
                    format!("{at} (zero past {size})")
                } else {
                    at
                }
            }
            IndexMap::Heads { head_dim, head_pad, heads } => {
                let padded = if head_dim < head_pad {
                    format!(" (each head's {head_dim} padded to {head_pad})")
                } else {
                    String::new()
                };
                // A scale row of one group: the first input of the model's head.
                if local == "0" {
                    let g = heads.describe("0");
                    let g = g.strip_suffix(" + 0").unwrap_or(&g);
                    return if g == "0" { "0".into() } else { format!("({g})*{head_dim}") };
                }
                let local = if local.contains(' ') { format!("({local})") } else { local };
                format!(
                    "g*{head_dim} + {local} % {head_pad} for the model's head g = {}{padded}",
                    heads.describe(&format!("{local} / {head_pad}"))
                )
            }
        }
    }
}

/// The indices a block repeats over, outermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stack {
    /// The planned layers: index `l` is layer `l`; layers not of kind `only` are skipped
    /// (their rows stay zero).
    Layers { only: Option<Ffn> },
    /// The layers of one FFN kind: index `m` is the `m`-th such layer.
    Slots(Ffn),
    /// A device's experts: local `e` is the model's expert `map(e)` (padding: skipped).
    Experts(IndexMap),
    /// Chunks `0..n`: the block's axes move by their `chunk`.
    Chunks(u64),
}

/// A rectangle of an operand, repeated over its stack indices: element `(r, s)` (`r <
/// rows`, `s < cols`) of the instance at stack indices `k` sits at flat index `at +
/// sum(k_i * stride_i) + r*row_stride + s`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub stack: Vec<(Stack, u64)>,
    pub at: u64,
    pub rows: u64,
    pub cols: u64,
    pub row_stride: u64,
    pub row: Axis,
    pub col: Axis,
    pub read: Read,
    /// What the block is, for the prose (`"q heads"`, `"gate^T"`).
    pub what: &'static str,
}

/// One instance of a block: its flat offset and the layer, expert and chunk it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instance {
    pub at: u64,
    pub layer: Option<u64>,
    pub expert: Option<u64>,
    pub chunk: u64,
}

impl Block {
    /// The block's instances on device `me` (padding experts skipped).
    pub fn instances(&self, plan: &Plan, me: u64) -> Vec<Instance> {
        let mut out = vec![Instance { at: self.at, layer: None, expert: None, chunk: 0 }];
        for (stack, stride) in &self.stack {
            let mut next = Vec::new();
            for base in &out {
                let at = |k: u64| base.at + k * stride;
                match stack {
                    Stack::Layers { only } => {
                        for (l, &f) in plan.layer_ffns.0.iter().enumerate() {
                            if only.is_none_or(|k| k == f) {
                                next.push(Instance {
                                    at: at(l as u64),
                                    layer: Some(l as u64),
                                    ..*base
                                });
                            }
                        }
                    }
                    Stack::Slots(kind) => {
                        for (m, l) in plan.layer_ffns.layers_of(*kind).into_iter().enumerate() {
                            next.push(Instance { at: at(m as u64), layer: Some(l), ..*base });
                        }
                    }
                    Stack::Experts(map) => {
                        let Some(count) = local_count(*map) else { continue };
                        for e in 0..count {
                            if let Some(g) = map.model(me, e) {
                                next.push(Instance { at: at(e), expert: Some(g), ..*base });
                            }
                        }
                    }
                    Stack::Chunks(n) => {
                        for c in 0..*n {
                            next.push(Instance { at: at(c), chunk: c, ..*base });
                        }
                    }
                }
            }
            out = next;
        }
        out
    }
}

fn local_count(map: IndexMap) -> Option<u64> {
    match map {
        IndexMap::Slice { len, .. } => Some(len),
        IndexMap::Heads { .. } => None,
    }
}

/// The source map of one operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperandSource {
    pub operand: OperandKind,
    /// The operand's shape (the layout's).
    pub shape: Vec<u64>,
    pub blocks: Vec<Block>,
}

/// The source maps of every weight operand of `plan`, in the layout's operand order.
pub fn source_maps(plan: &Plan) -> Vec<OperandSource> {
    plan.layout.operands.iter().filter_map(|o| source_map(plan, o.kind)).collect()
}

/// The source map of operand `kind` of `plan` (`None`: not a weight operand, or not in
/// the layout).
pub fn source_map(plan: &Plan, kind: OperandKind) -> Option<OperandSource> {
    let shape = plan.layout.operand(kind)?.shape.clone();
    Some(OperandSource { operand: kind, shape, blocks: blocks(plan, kind)? })
}

/// How a device's heads, experts, intermediate columns and vocabulary map to the model's.
struct Share {
    q_heads: HeadMap,
    kv_heads: HeadMap,
    experts: IndexMap,
    columns: IndexMap,
    mlp_columns: IndexMap,
    /// A shared expert's intermediate columns (split like a dense MLP's).
    shared_columns: IndexMap,
    vocab: IndexMap,
}

impl Share {
    fn of(plan: &Plan) -> Share {
        let (d, m) = (&plan.dims, &plan.model_dims);
        let (replicas, ep) = plan
            .sharding
            .as_ref()
            .map_or((1, true), |sh| (sh.heads.kv_replicas, sh.experts.split == ExpertSplit::Ep));
        let n = plan.sharding.as_ref().map_or(1, |sh| sh.devices);
        let slice = |per_device: u64, size: u64| IndexMap::Slice {
            per_device: if n > 1 { per_device } else { 0 },
            len: per_device,
            size,
        };
        let di = d.dense_intermediate.unwrap_or(0);
        Share {
            q_heads: HeadMap::Query {
                per_device: if n > 1 { d.heads } else { 0 },
                replicas,
                group: m.heads / m.kv_heads,
            },
            kv_heads: HeadMap::Kv { per_device: if n > 1 { d.kv_heads } else { 0 }, replicas },
            experts: if ep {
                slice(d.experts_per_device, m.experts)
            } else {
                IndexMap::whole(m.experts)
            },
            columns: if ep {
                IndexMap::whole(m.intermediate)
            } else {
                slice(d.intermediate, m.intermediate)
            },
            mlp_columns: slice(di, m.dense_intermediate.unwrap_or(0)),
            shared_columns: slice(
                d.shared_intermediate.unwrap_or(0),
                m.shared_intermediate.unwrap_or(0),
            ),
            vocab: slice(d.vocab, m.vocab),
        }
    }
}

/// A part of a dense-stream segment: its first column and columns in the segment, how
/// it reads, its columns' map, what it is, and the only layers that hold it.
type SegmentPart = (u64, u64, Read, IndexMap, &'static str, Option<Ffn>);

/// Operand `kind`'s blocks.
fn blocks(plan: &Plan, kind: OperandKind) -> Option<Vec<Block>> {
    let layout = &plan.layout;
    let (d, m) = (&plan.dims, &plan.model_dims);
    let shape = &layout.operand(kind)?.shape;
    let share = Share::of(plan);
    let quant = layout.quant;
    // bf16 plans fold the norms; quantized ones ship the checkpoint's weights as codes.
    let (dense, experts) = match quant {
        Some(q) => (Element::Code(q.dense), Element::Code(q.experts)),
        None => (Element::Value, Element::Value),
    };
    let fold = |w: WeightKind| if quant.is_none() { Some(w) } else { None };
    let read = |tensor: WeightKind, element: Element, transposed: bool, fold| Read {
        tensor: Role::Weight(tensor),
        element,
        transposed,
        fold,
    };
    let whole = |n: u64| Axis::new(IndexMap::whole(n));
    let (h, hd, hp) = (d.hidden, d.head_dim, d.head_pad);
    // The hidden axis: the kernel's `h` lanes, zero past the model's (`Dims::tiled`), so
    // the residual stream's padding lanes stay zero.
    let hidden = Axis::new(IndexMap::Slice { per_device: 0, len: h, size: m.hidden });
    let heads = |map| IndexMap::Heads { head_dim: hd, head_pad: hp, heads: map };
    // The q/k/v segment's parts: its columns' tensor and head map.
    let qkv = [
        (WeightKind::QProj, heads(share.q_heads), d.heads * hp, "q heads"),
        (WeightKind::KProj, heads(share.kv_heads), d.kv_heads * hp, "k heads"),
        (WeightKind::VProj, heads(share.kv_heads), d.kv_heads * hp, "v heads"),
    ];
    // A row of `hp` per head of the q/k/v segment's parts, `weights[i]` read at part `i`'s
    // head columns: row t is the t-th head of `[q heads | k heads | v heads]`, as the
    // attention stage reads the projection (q/k/v biases, OLMoE's whole-projection norms).
    let head_rows = |weights: &[WeightKind]| -> Vec<Block> {
        let mut col = 0;
        weights
            .iter()
            .zip(qkv)
            .map(|(&w, (_, map, cols, what))| {
                col += cols;
                Block {
                    stack: vec![(Stack::Layers { only: None }, shape[1] * hp)],
                    at: col - cols,
                    rows: 1,
                    cols,
                    row_stride: cols,
                    row: whole(1),
                    col: Axis::new(map),
                    read: read(w, Element::Value, false, None),
                    what,
                }
            })
            .collect()
    };
    let vocab = Axis::new(share.vocab).chunked(layout.chunk_cols);
    Some(match kind {
        OperandKind::Embed => vec![Block {
            stack: vec![],
            at: 0,
            rows: shape[0] * shape[1],
            cols: h,
            row_stride: h,
            row: whole(m.vocab),
            col: hidden,
            read: Read {
                tensor: Role::Embed,
                element: Element::Value,
                transposed: false,
                fold: None,
            },
            what: "the embedding",
        }],
        OperandKind::WStream => {
            let (n, cw) = (layout.per_layer, layout.chunk_cols);
            let mut out = Vec::new();
            for c in 0..n {
                for p in layout.pieces(c) {
                    // The segment's parts: (first column, columns, tensor, map, transposed,
                    // fold, only these layers).
                    let parts: Vec<SegmentPart> = match p.segment {
                        SegmentKind::Qkv => {
                            let mut col = 0;
                            qkv.iter()
                                .map(|&(w, map, cols, what)| {
                                    col += cols;
                                    let r = read(w, dense, true, fold(WeightKind::InputNorm));
                                    (col - cols, cols, r, map, what, None)
                                })
                                .collect()
                        }
                        SegmentKind::OProj => vec![(
                            0,
                            d.heads * hp,
                            read(WeightKind::OProj, dense, false, None),
                            heads(share.q_heads),
                            "o_proj",
                            None,
                        )],
                        SegmentKind::Router => {
                            let post = fold(WeightKind::PostAttentionNorm);
                            let router = (
                                0,
                                if d.shared_gate { m.experts } else { d.experts_pad },
                                read(WeightKind::Router, Element::Value, true, post),
                                IndexMap::whole(m.experts),
                                "the router",
                                Some(Ffn::RoutedExperts),
                            );
                            // A sigmoid-gated shared expert's gate: the logit column after
                            // the experts'.
                            let gate = (
                                m.experts,
                                1,
                                read(WeightKind::SharedExpertGate, Element::Value, true, post),
                                IndexMap::whole(1),
                                "the shared expert's gate",
                                Some(Ffn::RoutedExperts),
                            );
                            if d.shared_gate { vec![router, gate] } else { vec![router] }
                        }
                    };
                    for (first, cols, r, map, what, only) in parts {
                        let from = first.max(p.seg_col);
                        let to = (first + cols).min(p.seg_col + p.cols);
                        if from >= to {
                            continue;
                        }
                        out.push(Block {
                            stack: vec![(Stack::Layers { only }, n * h * cw)],
                            at: c * h * cw + p.chunk_col + (from - p.seg_col),
                            rows: h,
                            cols: to - from,
                            row_stride: cw,
                            row: hidden,
                            col: Axis::new(map).from(from - first),
                            read: r,
                            what,
                        });
                    }
                }
            }
            if layout.stream_lm_chunks() > 0 {
                out.push(Block {
                    stack: vec![(Stack::Chunks(layout.lm_chunks), h * cw)],
                    at: plan.layers as u64 * n * h * cw,
                    rows: h,
                    cols: cw,
                    row_stride: cw,
                    row: hidden,
                    col: vocab,
                    read: read(
                        WeightKind::LmHead,
                        Element::Value,
                        true,
                        fold(WeightKind::FinalNorm),
                    ),
                    what: "lm_head",
                });
            }
            out
        }
        OperandKind::LmHead | OperandKind::LmScales => {
            let f = quant.and_then(|q| q.lm_head);
            let (element, rows, what) = match (kind, f) {
                (OperandKind::LmScales, Some(f)) => {
                    (Element::Scale(f), shape[1], "lm_head's scales")
                }
                (_, Some(f)) => (Element::Code(f), h, "lm_head"),
                (_, None) => (Element::Value, h, "lm_head"),
            };
            let cw = layout.chunk_cols;
            let row = match element {
                Element::Scale(f) => hidden.every(f.group_of(h)),
                _ => hidden,
            };
            vec![Block {
                stack: vec![(Stack::Chunks(layout.lm_chunks), shape[1] * cw)],
                at: 0,
                rows,
                cols: cw,
                row_stride: cw,
                row,
                col: vocab,
                read: read(WeightKind::LmHead, element, true, None),
                what,
            }]
        }
        OperandKind::WExperts | OperandKind::WMlp => {
            let (stack, cols, [g, u, dn]) = ffn(plan, &share, kind)?;
            let eb = layout.expert_block;
            let col = Axis::new(cols).chunked(eb);
            let post = fold(WeightKind::PostAttentionNorm);
            let at = shape[shape.len() - 2] * shape[shape.len() - 1];
            let parts = |[g, u, dn]: [WeightKind; 3], [wg, wu, wd]: [&'static str; 3]| {
                [(g, true, post, wg), (u, true, post, wu), (dn, false, None, wd)]
            };
            let mut out: Vec<Block> = parts([g, u, dn], ["gate^T", "up^T", "down"])
                .into_iter()
                .enumerate()
                .map(|(i, (w, transposed, fold, what))| Block {
                    stack: strided(&stack, shape, at),
                    at: i as u64 * eb,
                    rows: h,
                    cols: eb,
                    row_stride: 3 * eb,
                    row: hidden,
                    col,
                    read: read(w, experts, transposed, fold),
                    what,
                })
                .collect();
            if kind == OperandKind::WExperts {
                out.extend(shared_entries(plan, &share, shape, at, &out, Intermediate::Cols));
            }
            out
        }
        OperandKind::ExpertScales | OperandKind::MlpScales => {
            let q = quant?;
            let ffn_kind = if kind == OperandKind::ExpertScales {
                OperandKind::WExperts
            } else {
                OperandKind::WMlp
            };
            let (stack, cols, [g, u, _]) = ffn(plan, &share, ffn_kind)?;
            let eb = layout.expert_block;
            let rows = shape[shape.len() - 2];
            let at = rows * 2 * eb;
            let mut out: Vec<Block> = [(g, "gate^T's scales"), (u, "up^T's scales")]
                .into_iter()
                .enumerate()
                .map(|(i, (w, what))| Block {
                    stack: strided(&stack, shape, at),
                    at: i as u64 * eb,
                    rows,
                    cols: eb,
                    row_stride: 2 * eb,
                    row: hidden.every(q.experts.group_of(h)),
                    col: Axis::new(cols).chunked(eb),
                    read: read(w, Element::Scale(q.experts), true, None),
                    what,
                })
                .collect();
            if kind == OperandKind::ExpertScales {
                out.extend(shared_entries(plan, &share, shape, at, &out, Intermediate::Cols));
            }
            out
        }
        OperandKind::ExpertDownScales | OperandKind::MlpDownScales => {
            let q = quant?;
            let (ffn_kind, inter) = if kind == OperandKind::ExpertDownScales {
                (OperandKind::WExperts, d.intermediate)
            } else {
                (OperandKind::WMlp, d.dense_intermediate.unwrap_or(0))
            };
            let (stack, cols, [_, _, dn]) = ffn(plan, &share, ffn_kind)?;
            let eb = layout.expert_block;
            let stride = shape[shape.len() - 2];
            let routed = vec![Block {
                stack: strided(&stack, shape, stride * h),
                at: 0,
                rows: q.experts.scale_rows(eb, inter),
                cols: h,
                row_stride: h,
                row: Axis::new(cols).chunked(eb).every(q.experts.group_of(inter)),
                col: hidden,
                read: read(dn, Element::Scale(q.experts), true, None),
                what: "down's scales",
            }];
            let shared = match kind {
                OperandKind::ExpertDownScales => {
                    shared_entries(plan, &share, shape, stride * h, &routed, Intermediate::Rows)
                }
                _ => Vec::new(),
            };
            routed.into_iter().chain(shared).collect()
        }
        OperandKind::QkvScales => {
            let q = quant?;
            let (rows, nqkv) = (shape[1], shape[2]);
            let mut col = 0;
            qkv.iter()
                .map(|&(w, map, cols, what)| {
                    col += cols;
                    Block {
                        stack: vec![(Stack::Layers { only: None }, rows * nqkv)],
                        at: col - cols,
                        rows,
                        cols,
                        row_stride: nqkv,
                        row: hidden.every(q.dense.group_of(h)),
                        col: Axis::new(map),
                        read: read(w, Element::Scale(q.dense), true, None),
                        what,
                    }
                })
                .collect()
        }
        OperandKind::OScales => {
            let q = quant?;
            let rows = shape[1];
            vec![Block {
                stack: vec![(Stack::Layers { only: None }, rows * h)],
                at: 0,
                rows,
                cols: h,
                row_stride: h,
                row: Axis::new(heads(share.q_heads)).every(q.dense.group_of(d.heads * hp)),
                col: hidden,
                read: read(WeightKind::OProj, Element::Scale(q.dense), true, None),
                what: "o_proj's scales",
            }]
        }
        OperandKind::Router => {
            let block = |at: u64, cols: u64, col: u64, w: WeightKind, what| Block {
                stack: vec![(Stack::Layers { only: Some(Ffn::RoutedExperts) }, h * shape[2])],
                at,
                rows: h,
                cols,
                row_stride: shape[2],
                row: hidden,
                col: whole(col),
                read: read(w, Element::Value, true, None),
                what,
            };
            let router = block(0, shape[2], m.experts, WeightKind::Router, "the router");
            // A sigmoid-gated shared expert's gate: the logit column after the experts', as
            // in the bf16 plans' router segment.
            match d.shared_gate {
                true => vec![
                    Block { cols: m.experts, ..router },
                    block(
                        m.experts,
                        1,
                        1,
                        WeightKind::SharedExpertGate,
                        "the shared expert's gate",
                    ),
                ],
                false => vec![router],
            }
        }
        OperandKind::Norms => {
            let norm = |w, at, stack| Block {
                stack,
                at,
                rows: 1,
                cols: h,
                row_stride: h,
                row: whole(1),
                col: hidden,
                read: read(w, Element::Value, false, None),
                what: "",
            };
            let layers = || vec![(Stack::Layers { only: None }, 8 * h)];
            vec![
                norm(WeightKind::InputNorm, 0, layers()),
                norm(WeightKind::PostAttentionNorm, h, layers()),
                norm(WeightKind::FinalNorm, plan.layers as u64 * 8 * h, vec![]),
            ]
        }
        // Norms over the whole projections: a row per q head, then per k head, each the
        // head's slice of the weight (as the q/k/v bias rows).
        OperandKind::HeadNorms if d.whole_qk_norm => {
            head_rows(&[WeightKind::QNorm, WeightKind::KNorm])
        }
        OperandKind::HeadNorms => [WeightKind::QNorm, WeightKind::KNorm]
            .into_iter()
            .enumerate()
            .map(|(row, w)| Block {
                stack: vec![(Stack::Layers { only: None }, 8 * hp)],
                at: row as u64 * hp,
                rows: 1,
                cols: hd,
                row_stride: hp,
                row: whole(1),
                col: whole(hd),
                read: read(w, Element::Value, false, None),
                what: "",
            })
            .collect(),
        OperandKind::QkvBias => {
            head_rows(&[WeightKind::QBias, WeightKind::KBias, WeightKind::VBias])
        }
        // Whole on every device: added once, after the attention output's all-reduce.
        OperandKind::OBias => vec![Block {
            stack: vec![(Stack::Layers { only: None }, shape[1] * shape[2])],
            at: 0,
            rows: 1,
            cols: h,
            row_stride: h,
            row: whole(1),
            col: hidden,
            read: read(WeightKind::OBias, Element::Value, false, None),
            what: "",
        }],
        // Each kv group's query rows (`k * group + j`: head j of the group, token k), the
        // sink of the row's head in every lane.
        OperandKind::Sinks => (0..d.tokens_per_seq)
            .map(|k| Block {
                stack: vec![
                    (Stack::Layers { only: None }, shape[1] * shape[2] * 128),
                    (Stack::Chunks(d.kv_heads), shape[2] * 128),
                ],
                at: k * d.group * 128,
                rows: d.group,
                cols: 128,
                row_stride: 128,
                row: Axis::new(IndexMap::Heads { head_dim: 1, head_pad: 1, heads: share.q_heads })
                    .chunked(d.group),
                col: whole(128),
                read: read(WeightKind::Sinks, Element::Value, true, None),
                what: "",
            })
            .collect(),
        OperandKind::RouterBias => vec![Block {
            stack: vec![(Stack::Layers { only: Some(Ffn::RoutedExperts) }, shape[1] * shape[2])],
            at: 0,
            rows: 1,
            cols: m.experts,
            row_stride: shape[2],
            row: whole(1),
            col: whole(m.experts),
            read: read(WeightKind::RouterBias, Element::Value, false, None),
            what: "",
        }],
        // Per expert chunk: row 0 its gate then up biases, row 1 the expert's down bias in
        // its first chunk (on one device of a split by columns: the partial sums are
        // all-reduced, the bias added once).
        OperandKind::ExpertBias => {
            let (ec, eb, lanes) = (layout.expert_chunks, layout.expert_block, shape[4]);
            let experts = || {
                vec![
                    (Stack::Slots(Ffn::RoutedExperts), shape[1] * shape[2] * 8 * lanes),
                    (Stack::Experts(share.experts), shape[2] * 8 * lanes),
                ]
            };
            let gate_up = |at: u64, w: WeightKind, what| Block {
                stack: [experts(), vec![(Stack::Chunks(ec), 8 * lanes)]].concat(),
                at,
                rows: 1,
                cols: eb,
                row_stride: lanes,
                row: whole(1),
                col: Axis::new(share.columns).chunked(eb),
                read: read(w, Element::Value, false, None),
                what,
            };
            let once = match share.columns {
                IndexMap::Slice { per_device, .. } if per_device > 0 => {
                    IndexMap::Slice { per_device: h, len: h, size: h }
                }
                _ => IndexMap::whole(h),
            };
            vec![
                gate_up(0, WeightKind::ExpertGateBias, "gate bias"),
                gate_up(eb, WeightKind::ExpertUpBias, "up bias"),
                Block {
                    stack: experts(),
                    at: lanes,
                    rows: 1,
                    cols: h,
                    row_stride: lanes,
                    row: whole(1),
                    col: Axis::new(once),
                    read: read(WeightKind::ExpertDownBias, Element::Value, false, None),
                    what: "down bias",
                },
            ]
        }
        OperandKind::CorrectionBias => vec![Block {
            stack: vec![(Stack::Layers { only: Some(Ffn::RoutedExperts) }, shape[1] * shape[2])],
            at: 0,
            rows: 1,
            cols: shape[2],
            row_stride: shape[2],
            row: whole(1),
            col: whole(m.experts),
            read: read(WeightKind::CorrectionBias, Element::Exact, false, None),
            what: "",
        }],
        _ => return None,
    })
}

/// Which axis of an expert operand's block runs over the expert's intermediate columns.
#[derive(Clone, Copy)]
enum Intermediate {
    Cols,
    Rows,
}

/// A shared expert's blocks of an expert operand (`w_experts`, `expert_scales`,
/// `expert_down_scales`), from the routed experts' `routed` blocks: entries
/// `experts_per_device + j` of each MoE layer (`shape[1]` entries of `shape[2]` chunks of
/// `item` elements), entry `j` the shared expert's intermediate columns from `j *
/// expert_chunks * expert_block`, chunked as an expert's, its tensors the shared expert's.
fn shared_entries(
    plan: &Plan,
    share: &Share,
    shape: &[u64],
    item: u64,
    routed: &[Block],
    intermediate: Intermediate,
) -> Vec<Block> {
    let layout = &plan.layout;
    let (ec, eb) = (layout.expert_chunks, layout.expert_block);
    let mut out = Vec::new();
    for j in 0..layout.shared_entries {
        for b in routed {
            let tensor = match b.read.tensor {
                Role::Weight(WeightKind::ExpertGate) => WeightKind::SharedGate,
                Role::Weight(WeightKind::ExpertUp) => WeightKind::SharedUp,
                _ => WeightKind::SharedDown,
            };
            let columns = |a: Axis| Axis { map: share.shared_columns, ..a.from(j * ec * eb) };
            let (row, col) = match intermediate {
                Intermediate::Cols => (b.row, columns(b.col)),
                Intermediate::Rows => (columns(b.row), b.col),
            };
            out.push(Block {
                stack: vec![
                    (Stack::Slots(Ffn::RoutedExperts), shape[1] * shape[2] * item),
                    (Stack::Chunks(ec), item),
                ],
                at: (plan.dims.experts_per_device + j) * shape[2] * item + b.at,
                row,
                col,
                read: Read { tensor: Role::Weight(tensor), ..b.read },
                what: match b.what {
                    "gate^T" => "shared gate^T",
                    "up^T" => "shared up^T",
                    "down" => "shared down",
                    "gate^T's scales" => "shared gate^T's scales",
                    "up^T's scales" => "shared up^T's scales",
                    _ => "shared down's scales",
                },
                ..b.clone()
            });
        }
    }
    out
}

/// An FFN operand's stack (layers of its kind, then experts for the routed ones, then
/// chunks), its intermediate columns' map and its gate, up and down tensors.
fn ffn(
    plan: &Plan,
    share: &Share,
    kind: OperandKind,
) -> Option<(Vec<Stack>, IndexMap, [WeightKind; 3])> {
    let layout = &plan.layout;
    Some(match kind {
        OperandKind::WExperts => (
            vec![
                Stack::Slots(Ffn::RoutedExperts),
                Stack::Experts(share.experts),
                Stack::Chunks(layout.expert_chunks),
            ],
            share.columns,
            [WeightKind::ExpertGate, WeightKind::ExpertUp, WeightKind::ExpertDown],
        ),
        OperandKind::WMlp => (
            vec![Stack::Slots(Ffn::DenseMlp), Stack::Chunks(layout.mlp_chunks)],
            share.mlp_columns,
            [WeightKind::MlpGate, WeightKind::MlpUp, WeightKind::MlpDown],
        ),
        _ => return None,
    })
}

/// `stack` with each index's flat stride in an operand of `shape` whose innermost
/// item (below the stack's indices) has `item` elements.
fn strided(stack: &[Stack], shape: &[u64], item: u64) -> Vec<(Stack, u64)> {
    let k = stack.len();
    (0..k).map(|i| (stack[i].clone(), shape[i + 1..k].iter().product::<u64>() * item)).collect()
}

/// The checkpoint's name of role `role` (a per-layer one relative to the layer, `{e}` for
/// the expert): the plan's [`crate::graph::TensorNames`].
pub fn tensor_name(plan: &Plan, role: Role) -> String {
    let Role::Weight(kind) = role else { return plan.names.embed.clone() };
    plan.names.get(kind).map_or_else(|| format!("{kind:?}"), str::to_string)
}

impl OperandSource {
    /// The map as prose: each block's elements as the tensor elements they hold (the
    /// report's operand `source`).
    pub fn describe(&self, plan: &Plan) -> String {
        let mut parts: Vec<String> =
            self.blocks.iter().map(|b| self.describe_block(plan, b)).collect();
        parts.push("the rest zero".into());
        parts.join("; ")
    }

    fn describe_block(&self, plan: &Plan, b: &Block) -> String {
        let rank = self.shape.len();
        let inner: Vec<u64> = (0..rank).map(|i| self.shape[i + 1..].iter().product()).collect();
        // Each leading dimension's index: the stack indices that advance it, then the
        // block's own offset.
        let mut dims: Vec<Vec<String>> = vec![Vec::new(); rank];
        let mut notes = Vec::new();
        let kinds = |f: Ffn| plan.layer_ffns.0.iter().all(|&k| k == f);
        let mut next_dim = 0;
        for (s, stride) in &b.stack {
            let var = match s {
                Stack::Layers { only } => {
                    if let Some(f) = only.filter(|&f| !kinds(f)) {
                        notes.push(format!(
                            "layers {:?} only, zero in the others",
                            plan.layer_ffns.layers_of(f)
                        ));
                    }
                    "l"
                }
                Stack::Slots(f) if kinds(*f) => "l",
                Stack::Slots(f) => {
                    {
                        notes.push(format!(
                            "m: the m-th {} layer l of layers {:?}",
                            f.name(),
                            plan.layer_ffns.layers_of(*f)
                        ));
                    }
                    "m"
                }
                Stack::Experts(map) => {
                    if let IndexMap::Slice { per_device, len, size } = *map
                        && per_device > 0
                    {
                        notes.push(format!(
                            "e local, the name's {{e}} = {} (padding past local {len} or the model's {size})",
                            affine(per_device, "e")
                        ));
                    }
                    "e"
                }
                Stack::Chunks(_) => "c",
            };
            let d = (next_dim..rank).find(|&d| stride % inner[d] == 0).unwrap_or(rank - 1);
            next_dim = d + 1;
            let k = stride / inner[d];
            dims[d].push(if k == 1 { var.to_string() } else { format!("{var}*{k}") });
        }
        let mut rest = b.at;
        for (d, dim) in dims.iter_mut().enumerate() {
            let k = rest / inner[d];
            rest %= inner[d];
            let var = match d {
                _ if d + 2 == rank && b.rows == 1 => "",
                _ if d + 2 == rank => "i",
                _ if d + 1 == rank => "j",
                _ => "",
            };
            if !var.is_empty() {
                dim.push(var.to_string());
            }
            if k > 0 || dim.is_empty() {
                dim.push(k.to_string());
            }
        }
        let mut idx: Vec<String> = dims.iter().map(|d| d.join(" + ")).collect();
        // A block whose rows run over several leading dimensions (the embedding's).
        if rank >= 3 && b.rows > self.shape[rank - 2] {
            let n = self.shape[rank - 2];
            idx[rank - 3] = format!("i / {n}");
            idx[rank - 2] = format!("i % {n}");
        }
        let name = |role: Role| {
            let n = tensor_name(plan, role);
            if role.per_layer() { format!("{}{n}", plan.names.layer_prefix) } else { n }
        };
        let one_d = Role::shape(b.read.tensor, &plan.model_dims).len() == 1;
        let var = |v: &'static str, n: u64| if n == 1 { "0" } else { v };
        let (ri, ci) =
            (b.row.describe(var("i", b.rows), b.rows), b.col.describe(var("j", b.cols), b.cols));
        let (at, input) = if one_d && b.read.transposed {
            (format!("[{ri}]"), ri)
        } else if one_d {
            (format!("[{ci}]"), ci)
        } else if b.read.transposed {
            (format!("[{ci}, {ri}]"), ri)
        } else {
            (format!("[{ri}, {ci}]"), ci)
        };
        let element = match b.read.element {
            Element::Value | Element::Exact => String::new(),
            Element::Code(f) => format!("{} codes of ", f.codes),
            Element::Scale(f) => format!(
                "the f32 scale ({}) of ",
                f.group.map_or("per output channel".to_string(), |g| format!("per {g} inputs"))
            ),
        };
        let fold = b.read.fold.map_or(String::new(), |n| {
            let input = input.split(" (").next().unwrap_or(&input).to_string();
            format!(" * {}[{input}]", name(Role::Weight(n)))
        });
        let what = if b.what.is_empty() { String::new() } else { format!("{}: ", b.what) };
        let ranges = if one_d || b.rows == 1 {
            format!("j < {}", b.cols)
        } else {
            format!("i < {}, j < {}", b.rows, b.cols)
        };
        let notes =
            if notes.is_empty() { String::new() } else { format!("; {}", notes.join("; ")) };
        format!(
            "{what}[{}] ({ranges}{notes}) = {element}{}{at}{fold}",
            idx.join(", "),
            name(b.read.tensor)
        )
    }
}
