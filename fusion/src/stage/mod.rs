//! The megakernel's stages, one file each. A stage is one step of the decode step's
//! dataflow: its handle struct names, in its `new`, the operands (by [`OperandKind`]) and
//! the scratch (by [`crate::scratch::ScratchKeys`]) it reads and writes, taken from the
//! sealed builder by typed key; its methods are its emit code, calling the kernel bodies
//! of `palladium_kernels::body`. [`crate::emit`] composes them: the prologue, the layer
//! loop, the step's end.
//!
//! Per layer, in order: [`qkv`] (input norm, the q/k/v projection: the dense stream's
//! `Qkv` segment), [`attention`] (per-head norms, RoPE, attention over the KV cache), [`o_proj`]
//! (the output projection: the `OProj` segment, then the residual), [`router`] (the
//! post-attention norm, the router's logits: the `Router` segment or a quantized plan's
//! own operand, the routing), then the layer's FFN: [`experts`] (the routed experts) or
//! [`dense_mlp`], both streaming through [`expert_ring`]. The step's own: [`embed`] (the
//! embedding rows), [`lm_head`] (final norm, `lm_head`, greedy). [`stream`] is the dense
//! weight stream the projections' segments (and a bf16 `lm_head`) arrive on.
//!
//! Quantization is a property of an operand's source, not a branch of a stage: a tile of a
//! weight operand is a [`WeightTile`], bf16 or codes with their group scales as the
//! operand holds it, and every product is [`WeightTile::product`] (or
//! [`expert_ring::ExpertRing::swiglu`] for the three tiles of an FFN chunk). Where a
//! quantized plan's operands arrive differently (unfolded norms, per-layer scale copies,
//! its own `lm_head` ring), the stage's handles say so as data ([`Norm`],
//! [`LayerCopies`], [`lm_head::LmStream`]).

pub mod attention;
pub mod dense_mlp;
pub mod embed;
pub mod expert_ring;
pub mod experts;
pub mod lm_head;
pub mod mla;
pub mod o_proj;
pub mod qkv;
pub mod router;
pub mod stream;

use crate::layout::OperandKind;
use crate::plan::Plan;
use crate::scratch::{BufferKey, QuantKeys, ScratchHandles, ScratchKeys, SemaphoresKey};
use crate::spmd::Spmd;
use palladium_dsl::build::{eq, ge, lt};
use palladium_dsl::prelude::*;
use palladium_kernels::body::{
    DIGIT_ROWS, GroupScales, QuantizedBlock, WeightBlock, WeightLayout, project, rms_norm,
};

/// What the stages take their handles from: the kernel's operands by kind, its scratch by
/// key, and the collectives (started) on `N > 1` devices.
pub struct Handles<'a> {
    pub operands: Vec<(OperandKind, Ref)>,
    pub scratch: &'a ScratchHandles,
    pub keys: &'a ScratchKeys,
    pub spmd: Option<Spmd>,
}

impl Handles<'_> {
    /// The operand of `kind`, where the plan's layout has one.
    pub fn operand(&self, kind: OperandKind) -> Option<Ref> {
        self.operands.iter().find(|(k, _)| *k == kind).map(|&(_, r)| r)
    }

    /// The operand of `kind`, which every plan that reaches the stage has.
    pub fn must(&self, kind: OperandKind) -> Ref {
        self.operand(kind)
            .unwrap_or_else(|| panic!("the plan's layout has no {} operand", kind.name()))
    }

    pub fn buffer(&self, key: BufferKey) -> Ref {
        self.scratch.buffer(key)
    }

    pub fn sems(&self, key: SemaphoresKey) -> SemRef {
        self.scratch.semaphores(key)
    }

    /// A quantized plan's scratch keys.
    pub fn quant(&self) -> Option<QuantKeys> {
        self.keys.quant
    }
}

/// `(base + k) mod n` for `0 <= base < n`, `k` static, without a division.
pub fn ring_add(base: Val, k: u64, n: u64) -> Val {
    let t = base + (k % n) as i32;
    select(ge(t, n as i32), t - n as i32, t)
}

/// Whether the traced `layer` is one of `layers` (a chain of scalar compares; no table
/// operand): a per-layer choice under the one traced layer loop.
pub fn is_one_of(layer: Val, layers: &[u64]) -> Val {
    layers.iter().map(|&l| eq(layer, l as i32)).reduce(|a, b| a | b).expect("some layers")
}

/// `i` clamped into `0..n`: an index read from data addresses nothing outside its array
/// (two scalar selects; an index in range passes unchanged).
pub fn clamp_index(i: Val, n: u64) -> Val {
    let below = select(lt(i, n as i32), i, n as i32 - 1);
    select(lt(below, 0), 0, below)
}

/// A tile of a weight operand as its source holds it: bf16 values, or codes with the group
/// scales of its inputs (a quantized operand).
#[derive(Clone, Copy)]
pub enum WeightTile {
    Bf16(Val),
    Quantized(QuantizedBlock),
}

impl WeightTile {
    /// The tile `values`, with the `scales` its operand has (none: bf16).
    pub fn new(values: Val, scales: Option<GroupScales>) -> WeightTile {
        match scales {
            Some(scales) => WeightTile::Quantized(QuantizedBlock { codes: values, scales }),
            None => WeightTile::Bf16(values),
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, WeightTile::Quantized(_))
    }

    /// `x @ tile` (or `x @ tile.T`), the one weight product of the stages: [`project`], or
    /// the quantized product on the token rows ([`on_token_rows`]).
    pub fn product(self, p: &Plan, x: Val, layout: WeightLayout) -> Val {
        on_token_rows(p, self.is_quantized(), x, |x| self.project_from(x, layout))
    }
}

impl WeightBlock for WeightTile {
    fn project_from(self, x: Val, layout: WeightLayout) -> Val {
        match self {
            WeightTile::Bf16(w) => project(x, w, layout),
            WeightTile::Quantized(block) => block.project_from(x, layout),
        }
    }
}

/// `product(x)` for a product of the activations `x` (`[rows, ..]`): for a quantized one
/// when the step's token rows fit [`DIGIT_ROWS`] (the rest of the 16 are padding), on those
/// rows only, the padding rows' products zero. So the integer codes meet the activations'
/// int8 digits (`project_quantized` takes them for at most that many rows) instead of the
/// mixed bf16 x code product (libtpu's v6e estimate, Qwen3-30B-A3B int8, 2 layers: 505730
/// cycles with the mixed product on 16 rows, 452575 with the digits on 8; see
/// docs/quantization.md). A bf16 product takes every row.
pub fn on_token_rows(p: &Plan, quantized: bool, x: Val, product: impl FnOnce(Val) -> Val) -> Val {
    let rows = p.dims.rows;
    if !quantized || p.dims.tokens > DIGIT_ROWS || rows <= DIGIT_ROWS {
        return product(x);
    }
    let y = product(x.slice((0..DIGIT_ROWS, ..)));
    let cols = y.shape().0[1];
    concatenate(&[y, zeros([rows - DIGIT_ROWS, cols], f32)], 0)
}

/// A norm's weight (RMSNorm, or a `LayerNorm` without bias) as the stage's operands hold
/// it: folded into the weights that follow (bf16 plans), or applied from row `r` of a
/// quantized plan's norm rows (`norms`, copied per layer into its buffer).
#[derive(Clone, Copy)]
pub enum Norm {
    Folded,
    Row(Ref, u64),
}

impl Norm {
    /// The norm on `hidden` columns: folded, or row `row` of `norm_buf` where the plan is
    /// quantized (`norm_buf` is its norm rows' buffer then).
    pub fn of(norm_buf: Option<Ref>, row: u64) -> Norm {
        norm_buf.map_or(Norm::Folded, |buf| Norm::Row(buf, row))
    }

    /// The model's norm of `x` over the hidden columns (RMSNorm, or the plan's
    /// [`crate::options::Dims::layer_norm`]), times the weight where it is applied here:
    /// the statistics over the model's hidden size (the lanes padded past it are zero).
    pub fn apply(self, p: &Plan, x: Val) -> Val {
        let weight = match self {
            Norm::Folded => None,
            Norm::Row(buf, r) => Some(buf.load((r..r + 1, ..))),
        };
        let norm = match p.dims.layer_norm {
            true => palladium_kernels::body::layer_norm,
            false => rms_norm,
        };
        norm(x, weight, p.model_dims.hidden, p.dims.eps)
    }
}

/// A quantized plan's per-layer operands (q/k/v scales, o scales, the router, the norm
/// rows), each copied whole into its VMEM buffer at the layer's start, one DMA each on
/// `layer_sems[i]` in that order; each stage waits for its own.
#[derive(Clone, Copy)]
pub struct LayerCopies {
    /// `(operand, buffer)` per [`LayerOperand`].
    copies: [(Ref, Ref); 4],
    sems: SemRef,
}

/// One of [`LayerCopies`], by its index in the layer's copies.
#[derive(Clone, Copy)]
pub enum LayerOperand {
    QkvScales = 0,
    OScales = 1,
    Router = 2,
    Norms = 3,
}

impl LayerCopies {
    pub fn new(hs: &Handles) -> Option<LayerCopies> {
        let q = hs.quant()?;
        Some(LayerCopies {
            copies: [
                (hs.must(OperandKind::QkvScales), hs.buffer(q.qkv_scales_buf)),
                (hs.must(OperandKind::OScales), hs.buffer(q.o_scales_buf)),
                (hs.must(OperandKind::Router), hs.buffer(q.router_buf)),
                (hs.must(OperandKind::Norms), hs.buffer(q.norm_buf)),
            ],
            sems: hs.sems(q.layer_sems),
        })
    }

    /// The copy of `which` for layer `layer` (the final norm's: `layer` = the layer count).
    pub fn dma(self, which: LayerOperand, layer: Val) -> Dma {
        let i = which as usize;
        let (operand, buffer) = self.copies[i];
        async_copy(operand.at(layer), buffer, self.sems.at(i as u64))
    }

    /// The buffer `which` lands in.
    pub fn buffer(self, which: LayerOperand) -> Ref {
        self.copies[which as usize].1
    }

    /// Start all of layer `layer`'s copies.
    pub fn start(self, layer: Val) {
        for which in [
            LayerOperand::QkvScales,
            LayerOperand::OScales,
            LayerOperand::Router,
            LayerOperand::Norms,
        ] {
            self.dma(which, layer).start();
        }
    }
}
