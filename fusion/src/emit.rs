//! The megakernel: ONE grid-less [`Kernel`] traced with the DSL's [`KernelBuilder`] from a
//! [`Plan`]. This file is the step's composition: the operands, aliases and scratch
//! declared, then the [`crate::stage`]s in order: the prologue, the layer loop, the step's
//! end. Each stage (one file of `stage/`) holds its handles and its emit code, calling the
//! bodies of `palladium_kernels::body`, the library kernels' own (norms, projections,
//! RoPE, KV insert, attention tiles, routing, expert chunks). The
//! layer loop, the attention tile loops and the expert loops are traced (`scf.for`), so the
//! module's size does not grow with the number of layers.
//!
//! Step structure (one call = one decode or verify step for `batch` sequences of `K` new
//! tokens each: `batch * K` token rows, row `b * K + k` at position `positions[b] + k`),
//! each step naming the stage (a module of [`crate::stage`]) that emits it:
//! 1. prologue: embedding rows fetched by token id (scalar prefetch; `embed`), the first
//!    `depth` dense chunks issued (`stream`; a quantized plan's first `lm_head` chunks,
//!    `lm_head`), RoPE tables for the rows' positions computed (`attention`);
//! 2. `for l in 0..layers` (traced; the dense-ring bank of the layer's first chunk is
//!    carried): the input norm (`qkv`); for each dense chunk `k` of the layer (static):
//!    issue chunk `l*n + k + depth` (this layer, a later layer, or `lm_head`), wait chunk
//!    `k`, hand each of its pieces to its segment's stage — q/k/v columns (`qkv`), then
//!    (before the first o-proj piece) per-head norm + RoPE and attention over the KV cache
//!    in streamed tiles (`attention`: the K new K/V rows inserted and written in place,
//!    each query row causal at its own position), o-proj pieces (`o_proj`), then the
//!    residual, its norm and the router piece (`router`); after the last chunk: top-k over the
//!    router's scores, the distinct experts to SMEM (`router`), the expert stream
//!    (`experts` through `expert_ring`: each distinct expert fetched once by id right
//!    after routing, applied to every row at its weight), residual; a dense-MLP layer
//!    (layers mixing kinds, `ffn`) runs its MLP's chunks through the same ring instead
//!    (`dense_mlp`), under an `scf.if`;
//! 3. final norm + `lm_head` chunks → the greedy id and maximum of every row (and the f32
//!    logits when the plan keeps them; `lm_head`).
//!
//! Every weight and KV-tile read is issued unconditionally, from a software pipeline
//! ([`pipeline`]) or, across layers and into `lm_head`, from a computed index into the one
//! dense-stream array (guarded only where a ring deeper than `lm_head` could run past its
//! end, on tiny models): libtpu's static estimator barely prices a DMA under an `scf.if`.
//! (The K/V write-back of a tile that may hold new rows, K > 1, is under one: two 16-row
//! groups.)
//!
//! Every index the kernel reads from data (a token id, a sequence's position, a routed
//! expert id) is clamped into its array before it addresses memory: the token ids and
//! positions by the value ranges their scalar-prefetch operands declare (the dsl clamps
//! every scalar read from such an operand), the expert ids by [`crate::stage::clamp_index`]. On
//! a TPU an out-of-bounds DMA faults the chip or reads another buffer, and the host's
//! checks cannot see ids computed in the kernel (the routing of non-finite logits). In
//! range, nothing changes. The router's non-finite logits are recorded per token row and
//! layer in the `router_non_finite` output, so the host names the layer.

use crate::layout::{
    Ffn, OperandKind,
    SegmentKind::{OProj, Qkv, Router},
};
use crate::plan::Plan;
use crate::spmd::{self, Spmd};
use crate::stage::{
    Handles, attention::Attention, dense_mlp::DenseMlp, embed::Embed, expert_ring::ExpertRing,
    experts::RoutedExperts, is_one_of, lm_head::LmHead, o_proj::OProjection, qkv::QkvProjection,
    ring_add, router, stream::DenseStream,
};
use palladium_dsl::build::{KernelBuilder, for_range, ge, if_else, lt, range};
use palladium_dsl::prelude::*;
use palladium_dsl::trace::builder_handles::Slot;
use palladium_dsl::{BuildErrors, Kernel};
use palladium_kernels::body::RowSelect;

type NoMap = Option<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>;

/// Build the megakernel of `plan`.
pub fn emit(plan: &Plan) -> Result<Kernel, BuildErrors> {
    let d = &plan.dims;
    let tokens = d.tokens;
    let vocab = plan.sharding.as_ref().map_or(d.vocab, |s| s.vocab);
    let mut kb = KernelBuilder::new("megakernel");
    kb.vmem_limit_bytes(plan.vmem_limit);
    kb.cost_estimate(
        2 * (plan.traffic.dense + plan.traffic.lm_head + plan.traffic.experts + plan.traffic.mlp)
            / 2
            * tokens,
        0,
        plan.traffic.total,
    );
    // The operands in call order (Pallas's: scalar prefetch, inputs, outputs), each as the
    // plan's layout gives it: name, role, dtype, full shape, memory space. No block specs:
    // the kernel is grid-less, every operand is whole (those in HBM reached by DMA only).
    let operand_slots: Vec<(OperandKind, Slot)> = plan
        .layout
        .operands
        .iter()
        .map(|o| {
            let (name, shape) = (o.kind.name(), &o.shape);
            let slot = kb.operand(name, o.role, o.dtype, shape, o.space, None, None as NoMap);
            // The scalar prefetch's values (the dsl clamps every read into them): token ids
            // of the whole vocabulary (`dims.vocab` is one device's `lm_head` slice), and
            // positions whose K new rows fit the cache.
            match o.kind {
                OperandKind::Tokens => kb.value_range(slot, 0, vocab.saturating_sub(1)),
                OperandKind::Positions => {
                    kb.value_range(slot, 0, d.positions.saturating_sub(d.tokens_per_seq))
                }
                _ => &mut kb,
            };
            (o.kind, slot)
        })
        .collect();
    // An aliased output (a KV cache) is its input updated in place: the caller passes one
    // buffer for both, and the step writes only the new position's rows. (The emitted
    // module lists the aliases in the layout's order of the outputs.)
    for o in &plan.layout.operands {
        let Some(input) = o.kind.aliased_input() else {
            continue;
        };
        kb.alias(input.name(), o.kind.name());
    }
    // Scratch: the plan's declaration (the rings, the KV tiles, the activations, the expert
    // ids, a quantized plan's scale buffers, the collectives'), each handle taken by its key.
    let scratch = plan.scratch.scratch.declare(&mut kb);
    spmd::declare(&mut kb, plan);
    let sealed = kb.seal()?;
    let handles = scratch.handles(&sealed);
    let k = &plan.scratch.keys;
    let mut hs = Handles {
        operands: operand_slots
            .iter()
            .map(|&(kind, slot)| (kind, sealed.handle(slot).into_ref()))
            .collect(),
        scratch: &handles,
        keys: k,
        spmd: None,
    };
    // Starting the collectives traces the step's barrier: after the handles, before the
    // body.
    hs.spmd = k.collectives.map(|c| Spmd::start(plan, c, &handles));
    body(plan, &Stages::new(&hs, plan));
    sealed.finish()
}

/// The step's stages, each with its handles ([`crate::stage`]).
struct Stages {
    stream: DenseStream,
    embed: Embed,
    qkv: QkvProjection,
    attention: Attention,
    o_proj: OProjection,
    router: router::Router,
    ring: ExpertRing,
    experts: RoutedExperts,
    dense_mlp: DenseMlp,
    lm_head: LmHead,
}

impl Stages {
    fn new(hs: &Handles, p: &Plan) -> Stages {
        let stream = DenseStream::new(hs);
        Stages {
            stream,
            embed: Embed::new(hs),
            qkv: QkvProjection::new(hs, p),
            attention: Attention::new(hs),
            o_proj: OProjection::new(hs, p),
            router: router::Router::new(hs),
            ring: ExpertRing::new(hs, p),
            experts: RoutedExperts::new(hs),
            dense_mlp: DenseMlp::new(hs),
            lm_head: LmHead::new(hs, p, stream),
        }
    }
}

fn body(p: &Plan, s: &Stages) {
    let (l, n, banks) = (p.layers as u64, p.layout.per_layer, p.banks);

    // --- prologue: embeddings, first weight chunks, rope tables --------------------------
    s.embed.start(p);
    s.stream.issue_first(p);
    s.lm_head.issue_first(p);
    let row_i = RowSelect::new(p.dims.rows, 1);
    s.attention.rope_tables(p, row_i);
    s.router.clear();
    s.attention.clear_outputs();
    s.embed.finish(p, row_i);

    // --- the layer loop ---------------------------------------------------------------
    let base_step = (n % banks) as i32;
    let _ = for_range(range(0, scalar(l as i32)), scalar(0), |layer: Val, base: Val| {
        layer_body(p, s, layer, base);
        let nb = base + base_step;
        select(ge(nb, banks as i32), nb - banks as i32, nb)
    });

    // --- final norm + lm_head, greedy argmax ------------------------------------------
    s.lm_head.emit(p);
}

/// One decoder layer (traced `layer`; `base` = bank of its first dense chunk): the dense
/// stream's chunks, each piece to the stage of its segment (q/k/v, then attention before
/// the first `o_proj` piece, `o_proj`, then the router), then the layer's FFN.
fn layer_body(p: &Plan, s: &Stages, layer: Val, base: Val) {
    let n = p.layout.per_layer;
    let banks = p.banks;
    s.attention.issue_head_rows(layer);
    let xn1 = s.qkv.input_norm(p, layer);
    let mut xn2: Option<Val> = None;
    let mut o_started = false;
    for k in 0..n {
        s.stream.issue_ahead(p, layer, k + p.depth, ring_add(base, k + p.depth, banks));
        let bank = ring_add(base, k, banks);
        s.stream.copy(layer * n as i32 + k as i32, bank).wait();
        for piece in &p.layout.pieces(k) {
            let cols = piece.chunk_col..piece.chunk_col + piece.cols;
            let seg_cols = piece.seg_col..piece.seg_col + piece.cols;
            let w = s.stream.columns(bank, cols);
            match piece.segment {
                Qkv => s.qkv.piece(p, xn1, w, seg_cols),
                OProj => {
                    if !o_started {
                        s.attention.emit(p, layer);
                        o_started = true;
                        s.o_proj.begin(layer);
                    }
                    s.o_proj.piece(p, w, seg_cols);
                }
                Router => s.router.piece(p, s.o_proj, layer, &mut xn2, w, seg_cols),
            }
        }
    }
    let xn2 = s.router.finish(p, s.o_proj, layer, xn2);
    ffn(p, s, layer, xn2);
}

/// The layer's FFN stage on the normed post-attention residual `xn2`. Where every layer is
/// MoE, the routed experts, unconditionally (nothing else is traced). Where dense-MLP
/// layers sit among them, the layer's kind comes from a chain of scalar compares against
/// the dense layers' indices (a few per layer, no table operand) and an `scf.if` runs
/// either stage; each kind's weights are indexed by the layer's slot among its kind's
/// layers.
fn ffn(p: &Plan, s: &Stages, layer: Val, xn2: Val) {
    let dense = p.layer_ffns.layers_of(Ffn::DenseMlp);
    let moe = |moe_slot: Val| {
        let (routing, distinct) = s.router.route(p, layer);
        s.experts.emit(p, s.ring, moe_slot, xn2, routing, distinct);
    };
    if dense.is_empty() {
        return moe(layer);
    }
    let is_dense = is_one_of(layer, &dense);
    // The dense layers before this one: its slot in w_mlp, or the count to take off its
    // index for its slot in w_experts.
    let dense_before = dense
        .iter()
        .map(|&l| select(lt(scalar(l as i32), layer), scalar(1), scalar(0)))
        .reduce(|a, b| a + b)
        .expect("not empty");
    if_else(
        is_dense,
        || s.dense_mlp.emit(p, s.ring, dense_before, xn2),
        || moe(layer - dense_before),
    );
}
