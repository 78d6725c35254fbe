//! The megakernel: ONE grid-less [`Kernel`] traced with the DSL's [`KernelBuilder`] from a
//! [`Plan`]. This file is the schedule: operands, ring slots, streams and the order of the
//! phases; each phase's math is a body of `palladium_kernels::body`, the library kernels'
//! own (norms, projections, RoPE, KV insert, attention tiles, routing, expert chunks). The
//! layer loop, the attention tile loops and the expert loops are traced (`scf.for`), so the
//! module's size does not grow with the number of layers.
//!
//! Step structure (one call = one decode or verify step for `batch` sequences of `K` new
//! tokens each: `batch * K` token rows, row `b * K + k` at position `positions[b] + k`):
//! 1. prologue: embedding rows fetched by token id (scalar prefetch), the first `depth`
//!    dense chunks issued, RoPE tables for the rows' positions computed;
//! 2. `for l in 0..layers` (traced; the dense-ring bank of the layer's first chunk is
//!    carried): for each dense chunk `k` of the layer (static): issue chunk `l*n + k +
//!    depth` (this layer, a later layer, or `lm_head`), wait chunk `k`, consume its pieces —
//!    q/k/v columns, then (after the q/k/v pieces) per-head norm + RoPE and attention over
//!    the KV cache in streamed tiles (the K new K/V rows inserted and written in place,
//!    each query row causal at its own position), o-proj pieces, then residual + norm and
//!    the router piece; after the last chunk: softmax top-k, the distinct experts to SMEM,
//!    the expert stream (each distinct expert fetched once by id right after routing,
//!    applied to every row at its weight), residual; a dense-MLP layer (layers mixing
//!    kinds, `ffn`) runs its MLP's chunks through the same ring instead, under an
//!    `scf.if`;
//! 3. final norm (folded) + `lm_head` chunks → the greedy id and maximum of every row
//!    (and the f32 logits when the plan keeps them).
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
//! every scalar read from such an operand), the expert ids by `clamp_index`. On
//! a TPU an out-of-bounds DMA faults the chip or reads another buffer, and the host's
//! checks cannot see ids computed in the kernel (the routing of non-finite logits). In
//! range, nothing changes. The router's non-finite logits are recorded per token row and
//! layer in the `router_non_finite` output, so the host names the layer.

use crate::spmd::{self, Spmd};
use crate::{
    layout::{
        CodeFormat, Ffn, OperandKind,
        SegmentKind::{OProj, Qkv, Router},
    },
    plan::{ExpertFetch, KvTiles, Plan, TWO_AHEAD_SLOTS, written_groups},
};
use palladium_dsl::build::{
    Carry, Drain, KernelBuilder, eq, for_range, ge, if_else, le, lt, pipeline, pipeline_lagged,
    range,
};
use palladium_dsl::prelude::*;
use palladium_dsl::trace::builder_handles::Slot;
use palladium_dsl::{BuildErrors, Kernel};
use palladium_kernels::body::{
    DIGIT_ROWS, ExpertItem, Greedy, GroupScales, KvMask, NewRow, OnlineSoftmax, QuantizedBlock,
    Routing, RowSelect, WeightLayout, embedding_row, project, project_quantized, residual_add,
    rms_norm, rope_apply, rope_rotation, rope_tables, swiglu_chunk,
};
use palladium_model::spec::RouterScoring;

type NoMap = Option<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>;

/// `(base + k) mod n` for `0 <= base < n`, `k` static, without a division.
fn ring_add(base: Val, k: u64, n: u64) -> Val {
    let t = base + (k % n) as i32;
    select(ge(t, n as i32), t - n as i32, t)
}

/// `i` clamped into `0..n`: an index read from data addresses nothing outside its array
/// (two scalar selects; an index in range passes unchanged).
fn clamp_index(i: Val, n: u64) -> Val {
    let below = select(lt(i, n as i32), i, n as i32 - 1);
    select(lt(below, 0), 0, below)
}

/// All the handles of the kernel.
#[derive(Clone, Copy)]
struct H {
    tokens: Ref,
    positions: Ref,
    embed: Ref,
    stream: Ref,
    w_experts: Ref,
    /// The dense-MLP layers' weights (and a quantized plan's scales, `[gate | up]` and
    /// down), where layers mix kinds.
    w_mlp: Option<Ref>,
    mlp_scales: Option<(Ref, Ref)>,
    head_norms: Option<Ref>,
    logits: Option<Ref>,
    next_ids: Ref,
    max_logits: Ref,
    router_non_finite: Ref,
    k_cache: Ref,
    v_cache: Ref,
    ring: Ref,
    ring_sems: SemRef,
    ex_buf: Ref,
    ex_sems: SemRef,
    kbuf: Ref,
    vbuf: Ref,
    kv_sems: SemRef,
    kv_wsems: SemRef,
    emb: Ref,
    emb_sems: SemRef,
    hn: Ref,
    hn_sem: SemRef,
    x: Ref,
    acc: Ref,
    oacc: Ref,
    qkv: Ref,
    qs: Ref,
    os: Ref,
    ks: Ref,
    vs: Ref,
    attn: Ref,
    rl: Ref,
    rot: Ref,
    cos: Ref,
    sin: Ref,
    ids: Ref,
    quant: Option<Q>,
    /// The collectives, on `N > 1` devices.
    spmd: Option<Spmd>,
}

/// The handles of a quantized plan's own operands and scratch ([`crate::layout::QuantLayout`]).
#[derive(Clone, Copy)]
struct Q {
    qkv_scales: Ref,
    o_scales: Ref,
    router: Ref,
    norms: Ref,
    lm_head: Ref,
    lm_scales: Option<Ref>,
    expert_scales: Ref,
    expert_down_scales: Ref,
    /// One layer's q/k/v and o scales, router and norm rows (`layer_sems`: 0..4 in that order).
    qkv_sc: Ref,
    o_sc: Ref,
    router_buf: Ref,
    norm_buf: Ref,
    layer_sems: SemRef,
    /// `lm_head`'s ring of [`TWO_AHEAD_SLOTS`] banks and its scales (`lm_sems[0 | 1, bank]`).
    lm_ring: Ref,
    lm_sc: Ref,
    lm_sems: SemRef,
    /// The expert ring's scales (`ex_sc_sems[0 | 1, slot]`).
    ex_sc: Ref,
    ex_dsc: Ref,
    ex_sc_sems: SemRef,
}

/// Build the megakernel of `plan`.
pub fn emit(plan: &Plan) -> Result<Kernel, BuildErrors> {
    let d = &plan.dims;
    let l = plan.layers as u64;
    let tokens = d.tokens;
    let n = plan.layout.per_layer;
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
    let operand = |kind: OperandKind| {
        let slot = operand_slots.iter().find(|(k, _)| *k == kind).map(|&(_, slot)| slot);
        slot.map(|slot| sealed.handle(slot).into_ref())
    };
    let must = |kind: OperandKind| {
        operand(kind).unwrap_or_else(|| panic!("the plan's layout has no {} operand", kind.name()))
    };
    let handles = scratch.handles(&sealed);
    let (buffer, sems) = (|k| handles.buffer(k), |k| handles.semaphores(k));
    let k = &plan.scratch.keys;
    let hd = H {
        tokens: must(OperandKind::Tokens),
        positions: must(OperandKind::Positions),
        embed: must(OperandKind::Embed),
        stream: must(OperandKind::WStream),
        w_experts: must(OperandKind::WExperts),
        w_mlp: operand(OperandKind::WMlp),
        mlp_scales: operand(OperandKind::MlpScales).zip(operand(OperandKind::MlpDownScales)),
        head_norms: operand(OperandKind::HeadNorms),
        logits: operand(OperandKind::Logits),
        next_ids: must(OperandKind::NextIds),
        max_logits: must(OperandKind::MaxLogits),
        router_non_finite: must(OperandKind::RouterNonFinite),
        k_cache: must(OperandKind::KCacheOut),
        v_cache: must(OperandKind::VCacheOut),
        ring: buffer(k.ring),
        ring_sems: sems(k.ring_sems),
        ex_buf: buffer(k.expert_buf),
        ex_sems: sems(k.expert_sems),
        kbuf: buffer(k.k_tiles),
        vbuf: buffer(k.v_tiles),
        kv_sems: sems(k.kv_sems),
        kv_wsems: sems(k.kv_write_sems),
        emb: buffer(k.emb_rows),
        emb_sems: sems(k.emb_sems),
        hn: buffer(k.head_norm_buf),
        hn_sem: sems(k.head_norm_sem),
        x: buffer(k.x),
        acc: buffer(k.expert_acc),
        oacc: buffer(k.o_acc),
        qkv: buffer(k.qkv),
        qs: buffer(k.q_heads),
        os: buffer(k.attn_heads),
        ks: buffer(k.k_new),
        vs: buffer(k.v_new),
        attn: buffer(k.attn),
        rl: buffer(k.router_logits),
        rot: buffer(k.rope_rot),
        cos: buffer(k.rope_cos),
        sin: buffer(k.rope_sin),
        ids: buffer(k.expert_ids),
        quant: k.quant.map(|q| Q {
            qkv_scales: must(OperandKind::QkvScales),
            o_scales: must(OperandKind::OScales),
            router: must(OperandKind::Router),
            norms: must(OperandKind::Norms),
            lm_head: must(OperandKind::LmHead),
            lm_scales: operand(OperandKind::LmScales),
            expert_scales: must(OperandKind::ExpertScales),
            expert_down_scales: must(OperandKind::ExpertDownScales),
            qkv_sc: buffer(q.qkv_scales_buf),
            o_sc: buffer(q.o_scales_buf),
            router_buf: buffer(q.router_buf),
            norm_buf: buffer(q.norm_buf),
            layer_sems: sems(q.layer_sems),
            lm_ring: buffer(q.lm_ring),
            lm_sc: buffer(q.lm_scales_buf),
            lm_sems: sems(q.lm_sems),
            ex_sc: buffer(q.expert_scales_buf),
            ex_dsc: buffer(q.expert_down_scales_buf),
            ex_sc_sems: sems(q.expert_scale_sems),
        }),
        // Starting the collectives traces the step's barrier: after the handles, before
        // the body.
        spmd: k.collectives.map(|c| Spmd::start(plan, c, &handles)),
    };
    body(plan, hd, n, l);
    sealed.finish()
}

/// Dense-stream chunk `item` (layer-major, then `lm_head`) into ring bank `bank`.
fn dense_copy(hd: H, item: Val, bank: Val) -> Dma {
    async_copy(hd.stream.at(item), hd.ring.at(bank), hd.ring_sems.at(bank))
}

/// Issue dense chunk `layer * n + k_ahead` (static `k_ahead`, traced `layer`) into bank
/// `bank`. Unconditional unless a ring deeper than `lm_head` could run past the stream's
/// end from this chunk (only tiny models): then guarded.
fn issue_ahead(p: &Plan, hd: H, layer: Val, k_ahead: u64, bank: Val) {
    let n = p.layout.per_layer;
    let total = p.layers as u64 * n + p.layout.stream_lm_chunks();
    let item = layer * n as i32 + k_ahead as i32;
    if k_ahead < n + p.layout.stream_lm_chunks() {
        dense_copy(hd, item, bank).start();
    } else {
        if_else(lt(item, total as i32), || dense_copy(hd, item, bank).start(), || ());
    }
}

fn body(p: &Plan, hd: H, n: u64, l: u64) {
    let d = &p.dims;
    let (h, hp, rows, tokens, kt) = (d.hidden, d.head_pad, d.rows, d.tokens, d.tokens_per_seq);
    let banks = p.banks;
    let depth = p.depth;

    // --- prologue: embeddings, first dense chunks, rope tables -------------------------
    // Token row r is sequence r / K's (r % K)-th new token, at its position + r % K.
    for r in 0..tokens {
        let t = hd.tokens.load(r);
        async_copy(hd.embed.at(t / 16), hd.emb.at(r), hd.emb_sems.at(r)).start();
    }
    for g in 0..depth.min(l * n + p.layout.stream_lm_chunks()) {
        dense_copy(hd, scalar(g as i32), scalar((g % banks) as i32)).start();
    }
    // A quantized plan's lm_head stream: its first chunks land during the layers.
    if let Some(q) = hd.quant {
        for c in 0..(TWO_AHEAD_SLOTS - 1).min(p.layout.lm_chunks) {
            for dma in lm_copies(q, scalar(c as i32), scalar(c as i32)) {
                dma.start();
            }
        }
    }
    // RoPE tables (neox, rotate halves) for the token rows' positions, one row each, and
    // the rotation restricted to the first head_dim lanes of a padded head.
    let row_i = RowSelect::new(rows, 1);
    let mut pos = zeros([rows, 1], f32);
    for r in 0..tokens {
        let at = hd.positions.load(r / kt);
        let at = if r % kt == 0 { at } else { at + (r % kt) as i32 };
        pos = row_i.put(pos, r as i32, at.cast(f32));
    }
    let (cos, sin) = rope_tables(pos, hp, d.head_dim, d.rope_theta);
    hd.cos.store(.., cos);
    hd.sin.store(.., sin);
    hd.rot.store(.., rope_rotation(hp, d.head_dim, false));
    hd.qs.store(.., 0.0);
    hd.router_non_finite.store(.., 0.0);
    hd.os.store(.., 0.0);
    // Embedding rows, each from its fetched 16-row group, to row `bi` of the residual stream.
    let mut x = zeros([rows, h], f32);
    for r in 0..tokens {
        let t = hd.tokens.load(r);
        async_copy(hd.embed.at(t / 16), hd.emb.at(r), hd.emb_sems.at(r)).wait();
        x = row_i.put(x, r as i32, embedding_row(hd.emb.load(r), t));
    }
    hd.x.store(.., x);

    // --- the layer loop ---------------------------------------------------------------
    let base_step = (n % banks) as i32;
    let _ = for_range(range(0, scalar(l as i32)), scalar(0), |layer: Val, base: Val| {
        layer_body(p, hd, layer, base);
        let nb = base + base_step;
        select(ge(nb, banks as i32), nb - banks as i32, nb)
    });

    // --- final norm (folded) + lm_head, greedy argmax ----------------------------------
    let greedy = match hd.quant {
        Some(q) => lm_head_quantized(p, hd, q),
        None => lm_head_stream(p, hd, n, l),
    };
    // On N devices each holds its vocabulary slice's best: gather them.
    let greedy = match hd.spmd {
        Some(spmd) => spmd.gather_greedy(greedy),
        None => greedy,
    };
    hd.next_ids.store(.., greedy.id.broadcast_to([rows, 128]));
    hd.max_logits.store(.., greedy.max.broadcast_to([rows, 128]));
}

/// `lm_head` from the dense stream (bf16 plans): its chunks continue the layers' in the
/// dense ring, the final norm folded into them.
fn lm_head_stream(p: &Plan, hd: H, n: u64, l: u64) -> Greedy {
    let d = &p.dims;
    let (h, rows, banks, depth) = (d.hidden, d.rows, p.banks, p.depth);
    let xf = rms_norm(hd.x.load(..), None, h, d.eps);
    let first_bank = ((l * n) % banks) as i32;
    let lm_item = |c: Val| c + (l * n) as i32;
    // The layer loop issued lm chunks 0..depth.
    let (_, greedy) = lm_head_chunks(
        p.layout.lm_chunks,
        depth,
        (scalar(first_bank), Greedy::start(rows)),
        |c: Val, &(bank, _): &(Val, Greedy)| {
            dense_copy(hd, lm_item(c), ring_add(bank, depth, banks)).start()
        },
        |c: Val, (bank, greedy): (Val, Greedy)| {
            dense_copy(hd, lm_item(c), bank).wait();
            let logits = project(xf, hd.ring.load(bank), WeightLayout::InOut);
            if let Some(out) = hd.logits {
                out.store(c, logits);
            }
            (ring_add(bank, 1, banks), fold_greedy(p, hd, greedy, logits, c))
        },
    );
    greedy
}

/// An `lm_head` stream of `chunks` chunks whose first `min(ahead, chunks)` the caller has
/// issued, each chunk issued `ahead` before its use ([`pipeline`]; `issue(i, &carry)`
/// issues chunk `i` from the carry of chunk `i - ahead`, `consume` waits for a chunk and
/// uses it). Not [`pipeline_lagged`]: with compute this light against its DMAs, libtpu's
/// v6e estimate of the lagged form was higher (bf16 Qwen3-30B-A3B, 8 layers, two ahead:
/// 1318266 cycles against 1253779).
fn lm_head_chunks<C: Carry>(
    chunks: u64,
    ahead: u64,
    init: C,
    issue: impl Fn(Val, &C),
    consume: impl Fn(Val, C) -> C,
) -> C {
    let split = chunks.saturating_sub(ahead) as i32;
    pipeline(
        range(0, scalar(split)),
        Drain::Loop(range(scalar(split), scalar(chunks as i32))),
        ahead,
        init,
        issue,
        |c: Val, carry: C, _| consume(c, carry),
    )
}

/// `greedy` folded over `lm_head` chunk `c`'s `logits` (either stream's). On N devices the
/// ids are local to the device's vocabulary slice (until gathered), its padding past the
/// model's vocabulary masked.
fn fold_greedy(p: &Plan, hd: H, greedy: Greedy, logits: Val, c: Val) -> Greedy {
    let first = c * p.layout.chunk_cols as i32;
    match hd.spmd {
        Some(spmd) => greedy.fold(logits, first, spmd.vocab_real()),
        None => greedy.fold(logits, first, p.dims.vocab as i32),
    }
}

/// The attention output added to the residual stream (after its all-reduce on N devices),
/// stored and returned.
fn attention_residual(hd: H) -> Val {
    if let Some(spmd) = hd.spmd {
        spmd.all_reduce(hd.oacc);
    }
    let x = residual_add(hd.x.load(..), hd.oacc.load(..));
    hd.x.store(.., x);
    x
}

/// A quantized plan's `lm_head` chunk `chunk` (codes, and scales where it is quantized)
/// into bank `bank` of its own ring.
fn lm_copies(q: Q, chunk: Val, bank: Val) -> Vec<Dma> {
    let mut copies =
        vec![async_copy(q.lm_head.at(chunk), q.lm_ring.at(bank), q.lm_sems.at((0, bank)))];
    if let Some(scales) = q.lm_scales {
        copies.push(async_copy(scales.at(chunk), q.lm_sc.at(bank), q.lm_sems.at((1, bank))));
    }
    copies
}

/// Layer `layer`'s q/k/v scales, o scales, router and norm rows (a quantized plan's), in
/// that order.
fn layer_copies(q: Q, layer: Val) -> [Dma; 4] {
    [
        async_copy(q.qkv_scales.at(layer), q.qkv_sc, q.layer_sems.at(0)),
        async_copy(q.o_scales.at(layer), q.o_sc, q.layer_sems.at(1)),
        async_copy(q.router.at(layer), q.router_buf, q.layer_sems.at(2)),
        async_copy(q.norms.at(layer), q.norm_buf, q.layer_sems.at(3)),
    ]
}

/// `x @ w` for a block of `inputs` inputs of a weight of `weight_inputs`, in the dense
/// format `f` with `scales` (rows for the block's groups), on the bodies' quantized product
/// ([`token_rows`]).
fn quantized(
    p: &Plan,
    x: Val,
    codes: Val,
    scales: Val,
    f: CodeFormat,
    weight_inputs: u64,
    layout: WeightLayout,
) -> Val {
    token_rows(p, x, |x| {
        project_quantized(
            x,
            codes,
            GroupScales { values: scales, group: f.group_of(weight_inputs) },
            layout,
        )
    })
}

/// `product(x)` for a quantized product of the activations `x` (`[rows, ..]`): when the
/// step's token rows fit [`DIGIT_ROWS`] (the rest of the 16 are padding), on those rows
/// only, the padding rows' products zero. So the integer codes meet the activations'
/// int8 digits (`project_quantized` takes them for at most that many rows) instead of the
/// mixed bf16 x code product (libtpu's v6e estimate, Qwen3-30B-A3B int8, 2 layers: 505730
/// cycles with the mixed product on 16 rows, 452575 with the digits on 8; see docs/quantization.md).
fn token_rows(p: &Plan, x: Val, product: impl FnOnce(Val) -> Val) -> Val {
    let rows = p.dims.rows;
    if p.dims.tokens > DIGIT_ROWS || rows <= DIGIT_ROWS {
        return product(x);
    }
    let y = product(x.slice((0..DIGIT_ROWS, ..)));
    let cols = y.shape().0[1];
    concatenate(&[y, zeros([rows - DIGIT_ROWS, cols], f32)], 0)
}

/// The final norm (applied, from `norms[layers]`) and `lm_head` from its own stream
/// (quantized plans): [`TWO_AHEAD_SLOTS`] banks, the first chunks issued in the prologue.
fn lm_head_quantized(p: &Plan, hd: H, q: Q) -> Greedy {
    let d = &p.dims;
    let (h, rows) = (d.hidden, d.rows);
    let final_norm =
        async_copy(q.norms.at(scalar(p.layers as i32)), q.norm_buf, q.layer_sems.at(3));
    final_norm.start();
    final_norm.wait();
    let xf = rms_norm(hd.x.load(..), Some(q.norm_buf.load((0..1, ..))), h, d.eps);
    let format = p.layout.quant.and_then(|f| f.lm_head);
    let ahead = TWO_AHEAD_SLOTS - 1;
    let (_, greedy) = lm_head_chunks(
        p.layout.lm_chunks,
        ahead,
        (scalar(0), Greedy::start(rows)),
        |c: Val, &(bank, _): &(Val, Greedy)| {
            for dma in lm_copies(q, c, ring_add(bank, ahead, TWO_AHEAD_SLOTS)) {
                dma.start();
            }
        },
        |c: Val, (bank, greedy): (Val, Greedy)| {
            for dma in lm_copies(q, c, bank) {
                dma.wait();
            }
            let w = q.lm_ring.load(bank);
            let logits = match format {
                Some(f) => quantized(p, xf, w, q.lm_sc.load(bank), f, h, WeightLayout::InOut),
                None => project(xf, w, WeightLayout::InOut),
            };
            if let Some(out) = hd.logits {
                out.store(c, logits);
            }
            (ring_add(bank, 1, TWO_AHEAD_SLOTS), fold_greedy(p, hd, greedy, logits, c))
        },
    );
    greedy
}

/// One decoder layer (traced `layer`; `base` = bank of its first dense chunk).
fn layer_body(p: &Plan, hd: H, layer: Val, base: Val) {
    let d = &p.dims;
    let h = d.hidden;
    let n = p.layout.per_layer;
    let banks = p.banks;
    if let Some(norms) = hd.head_norms {
        async_copy(norms.at(layer), hd.hn, hd.hn_sem.at(0)).start();
    }
    // A quantized plan applies input_layernorm (not folded) with the layer's norm rows.
    let dense = p.layout.quant.map(|f| f.dense);
    let norm_row = |row: u64| {
        hd.quant.map(|q| {
            if row == 0 {
                for dma in layer_copies(q, layer) {
                    dma.start();
                }
                let [qkv_scales, _, _, norms] = layer_copies(q, layer);
                norms.wait();
                qkv_scales.wait();
            }
            q.norm_buf.load((row..row + 1, ..))
        })
    };
    let xn1 = rms_norm(hd.x.load(..), norm_row(0), h, d.eps);
    let mut xn2: Option<Val> = None;
    let mut o_started = false;
    for k in 0..n {
        issue_ahead(p, hd, layer, k + p.depth, ring_add(base, k + p.depth, banks));
        let bank = ring_add(base, k, banks);
        dense_copy(hd, layer * n as i32 + k as i32, bank).wait();
        for piece in &p.layout.pieces(k) {
            let cols = piece.chunk_col..piece.chunk_col + piece.cols;
            let seg_cols = piece.seg_col..piece.seg_col + piece.cols;
            let w = hd.ring.load((bank, .., cols));
            match piece.segment {
                Qkv => {
                    let y = match (hd.quant, dense) {
                        (Some(q), Some(f)) => quantized(
                            p,
                            xn1,
                            w,
                            q.qkv_sc.load((.., seg_cols.clone())),
                            f,
                            h,
                            WeightLayout::InOut,
                        ),
                        _ => project(xn1, w, WeightLayout::InOut),
                    };
                    hd.qkv.store((.., seg_cols), y)
                }
                OProj => {
                    if !o_started {
                        attention(p, hd, layer);
                        o_started = true;
                        hd.oacc.store(.., 0.0);
                        if let Some(q) = hd.quant {
                            layer_copies(q, layer)[1].wait();
                        }
                    }
                    let a = hd.attn.load((.., seg_cols.clone())).cast(bf16);
                    let acc = hd.oacc.load(..);
                    let y = match (hd.quant, dense) {
                        (Some(q), Some(f)) => {
                            // The scale rows of this piece's groups of o_proj's padded inputs.
                            let nq = d.heads * d.head_pad;
                            let g = f.group_of(nq);
                            let rows = seg_cols.start / g..seg_cols.end.div_ceil(g);
                            quantized(p, a, w, q.o_sc.load((rows, ..)), f, nq, WeightLayout::OutIn)
                        }
                        _ => project(a, w, WeightLayout::OutIn),
                    };
                    hd.oacc.store(.., acc + y);
                }
                Router => {
                    let xn = *xn2
                        .get_or_insert_with(|| rms_norm(attention_residual(hd), None, h, d.eps));
                    hd.rl.store((.., seg_cols), project(xn, w, WeightLayout::InOut));
                }
            }
        }
    }
    // A quantized plan's router is its own bf16 operand, after post_attention_layernorm.
    let xn2 = xn2.or_else(|| {
        let q = hd.quant?;
        let xn = rms_norm(attention_residual(hd), norm_row(1), h, d.eps);
        layer_copies(q, layer)[2].wait();
        hd.rl.store(.., project(xn, q.router_buf.load(..), WeightLayout::InOut));
        Some(xn)
    });
    let xn2 = xn2
        .expect("the router segment is last (bf16) or the router is its own operand (quantized)");
    ffn(p, hd, layer, xn2);
}

/// The layer's FFN stage on the normed post-attention residual `xn2`. Where every layer is
/// MoE, the routed experts, unconditionally (nothing else is traced). Where dense-MLP
/// layers sit among them, the layer's kind comes from a chain of scalar compares against
/// the dense layers' indices (a few per layer, no table operand) and an `scf.if` runs
/// either stage; each kind's weights are indexed by the layer's slot among its kind's
/// layers.
fn ffn(p: &Plan, hd: H, layer: Val, xn2: Val) {
    let dense = p.layer_ffns.layers_of(Ffn::DenseMlp);
    let moe = |moe_slot: Val| {
        let (routing, distinct) = route(p, hd, layer);
        experts(p, hd, moe_slot, xn2, routing, distinct);
    };
    if dense.is_empty() {
        return moe(layer);
    }
    let is_dense =
        dense.iter().map(|&l| eq(layer, l as i32)).reduce(|a, b| a | b).expect("not empty");
    // The dense layers before this one: its slot in w_mlp, or the count to take off its
    // index for its slot in w_experts.
    let dense_before = dense
        .iter()
        .map(|&l| select(lt(scalar(l as i32), layer), scalar(1), scalar(0)))
        .reduce(|a, b| a + b)
        .expect("not empty");
    if_else(is_dense, || dense_mlp(p, hd, dense_before, xn2), || moe(layer - dense_before));
}

/// Per-head q/k norm + RoPE into the head buffers, then attention for every (kv head,
/// sequence) over the cache in streamed tiles, writing the new K/V in place; the outputs
/// are reassembled into `attn` `[rows, heads * head_pad]`.
fn attention(p: &Plan, hd: H, layer: Val) {
    let d = &p.dims;
    let (hp, rows, group, kvh) = (d.head_pad, d.rows, d.group, d.kv_heads);
    if let Some(norms) = hd.head_norms {
        async_copy(norms.at(layer), hd.hn, hd.hn_sem.at(0)).wait();
    }
    let cos = hd.cos.load(..);
    let sin = hd.sin.load(..);
    let rot = hd.rot.load(..);
    // A head's q or k columns: per-head RMSNorm (Qwen3's q_norm/k_norm, rounded to bf16 as
    // Hugging Face does), RoPE, and for q the softmax scale folded in.
    let prep = |col: u64, norm_row: Option<u64>, scale: f64| {
        let v = hd.qkv.load((.., col..col + hp));
        let v = match norm_row {
            Some(rw) => rms_norm(v, Some(hd.hn.load((rw..rw + 1, ..))), d.head_dim, d.eps),
            None => v,
        };
        rope_apply(v, rot, cos, sin) * scale
    };
    let qk_rows = |r: u64| if d.qk_norm { Some(r) } else { None };
    for head in 0..d.heads {
        let (g, j) = (head / group, head % group);
        let v = prep(head * hp, qk_rows(0), d.scale);
        hd.qs.store((g, j * rows..(j + 1) * rows, ..), v);
    }
    for g in 0..kvh {
        let v = prep((d.heads + g) * hp, qk_rows(1), 1.0);
        hd.ks.store(g, v);
        hd.vs.store(g, hd.qkv.load((.., (d.heads + kvh + g) * hp..(d.heads + kvh + g + 1) * hp)));
    }
    let bkv = p.block_kv;
    let qrows = d.attn_rows;
    let kt = d.tokens_per_seq;
    // A token row of the batch-stacked head buffers; a query row of one attention.
    let row_b = RowSelect::new(rows, hp);
    let arow = RowSelect::new(qrows, hp);
    // Query row `k * group + j` is head j of the sequence's k-th new token, at position
    // `pos + k`: its offset from `pos` (static), for the mask's causality among the K.
    let queries = (kt > 1).then(|| {
        let row = iota([qrows, 1], 0);
        let offsets = (1..kt)
            .fold(zeros([qrows, 1], i32), |o, k| select(ge(row, (k * group) as i32), o + 1, o));
        (offsets, kt)
    });
    for_range(range(0, scalar(kvh as i32)), (), |g: Val, ()| {
        for_range(range(0, scalar(d.batch as i32)), (), |bi: Val, ()| {
            // The token row of sequence `bi`'s k-th new token (the sequence's own row for
            // one token per sequence).
            let token_row = |k: u64| if kt == 1 { bi } else { bi * kt as i32 + k as i32 };
            // Sequence `bi`'s query rows of the group's heads: attention runs on `group * K`
            // rows (rounded up to 16) whatever the batch.
            let mut qg = zeros([qrows, hp], f32);
            for k in 0..kt {
                for j in 0..group {
                    let q = row_b.take(hd.qs.load((g, j * rows..(j + 1) * rows, ..)), token_row(k));
                    qg = arow.put(qg, (k * group + j) as i32, q);
                }
            }
            let qg = qg.cast(bf16);
            let pos = hd.positions.load(bi);
            // The newest position written and attended: the sequence's last new token's.
            let newest = if kt == 1 { pos } else { pos + (kt - 1) as i32 };
            let new_kv: Vec<(Val, Val)> = (0..kt)
                .map(|k| {
                    (
                        row_b.take(hd.ks.load(g), token_row(k)),
                        row_b.take(hd.vs.load(g), token_row(k)),
                    )
                })
                .collect();
            let bkv_i = bkv as i32;
            // The tile holding the newest position: the last one read, or any one of all.
            let last = newest / bkv_i;
            let (t0, ntiles) = match p.kv_tiles {
                KvTiles::UpToPosition => {
                    let t0 = match d.window {
                        Some(w) => {
                            let first = pos - (w as i32 - 1);
                            select(lt(first, 0), 0, first) / bkv_i
                        }
                        None => scalar(0),
                    };
                    (t0, last + 1)
                }
                KvTiles::All => (scalar(0), scalar((d.positions / bkv) as i32)),
            };
            let fetch = |t: Val, slot: Val| {
                let start = (t * bkv_i).multiple_of(bkv as u32);
                let k = async_copy(
                    hd.k_cache.at((layer, bi, g, ds(start, bkv), ..)),
                    hd.kbuf.at(slot),
                    hd.kv_sems.at((0, slot)),
                );
                let v = async_copy(
                    hd.v_cache.at((layer, bi, g, ds(start, bkv), ..)),
                    hd.vbuf.at(slot),
                    hd.kv_sems.at((1, slot)),
                );
                (k, v)
            };
            // The 16-row groups of tile `t` holding new K/V rows, written back in place from
            // the tile's slot: the one group of the new row; for K > 1 (K <= 16 rows span at
            // most two groups) the group of the first new row in the tile and the next one
            // (the previous one at the tile's end; then it holds no new row and rewrites the
            // bytes read: two DMAs into one group at once would race).
            let write_back = |t: Val, slot: Val| {
                let groups: Vec<Val> = if kt == 1 {
                    let rrow = pos - last * bkv_i;
                    vec![((rrow / 16) * 16).multiple_of(16)]
                } else {
                    let lo = pos - t * bkv_i;
                    let first = ((select(lt(lo, 0), 0, lo) / 16) * 16).multiple_of(16);
                    if written_groups(kt, bkv) == 1 {
                        vec![first]
                    } else {
                        vec![
                            first,
                            select(lt(first + 16, bkv_i), first + 16, first - 16).multiple_of(16),
                        ]
                    }
                };
                groups
                    .into_iter()
                    .enumerate()
                    .map(|(i, g16)| {
                        let tile_start = if kt == 1 { last * bkv_i } else { t * bkv_i };
                        let at = (tile_start + g16).multiple_of(16);
                        let sem = 2 * i as u64;
                        let k = async_copy(
                            hd.kbuf.at((slot, ds(g16, 16), ..)),
                            hd.k_cache.at((layer, bi, g, ds(at, 16), ..)),
                            hd.kv_wsems.at(sem),
                        );
                        let v = async_copy(
                            hd.vbuf.at((slot, ds(g16, 16), ..)),
                            hd.v_cache.at((layer, bi, g, ds(at, 16), ..)),
                            hd.kv_wsems.at(sem + 1),
                        );
                        (k, v)
                    })
                    .collect::<Vec<_>>()
            };
            // Runs `f` on the tiles holding new positions: statically the drain's one tile
            // when the loop stops there (one token), else under a run-time test.
            let holds_new = |t: Val| {
                if kt == 1 {
                    eq(t, last)
                } else {
                    let start = t * bkv_i;
                    le(start, newest) & lt(pos, start + bkv_i)
                }
            };
            let on_new_tile = |t: Val, draining: bool, f: &dyn Fn()| match p.kv_tiles {
                KvTiles::UpToPosition if draining => f(),
                KvTiles::UpToPosition if kt == 1 => {}
                _ => if_else(holds_new(t), f, || ()),
            };
            let (k0, v0) = fetch(t0, scalar(0));
            k0.start();
            v0.start();
            let (state, _) = pipeline(
                range(t0, ntiles - 1),
                Drain::Loop(range(ntiles - 1, ntiles)),
                1,
                (OnlineSoftmax::start(qrows, hp), scalar(0)),
                |next: Val, &(_, slot): &(OnlineSoftmax, Val)| {
                    let (kn, vn) = fetch(next, 1 - slot);
                    kn.start();
                    vn.start();
                },
                |t: Val, (state, slot): (OnlineSoftmax, Val), draining: bool| {
                    let (kc, vc) = fetch(t, slot);
                    kc.wait();
                    vc.wait();
                    // Insert the new K/V rows into their tile and write their groups back.
                    on_new_tile(t, draining, &|| {
                        // One row mask at a time, for both tiles (K masks of a whole tile live
                        // at once would not fit VMEM's scoped budget).
                        let (mut k_tile, mut v_tile) = (hd.kbuf.load(slot), hd.vbuf.load(slot));
                        for (k, &(knew, vnew)) in new_kv.iter().enumerate() {
                            let row = NewRow::at(
                                bkv,
                                hp,
                                if k == 0 { pos } else { pos + k as i32 } - t * bkv_i,
                            );
                            k_tile = row.insert(k_tile, knew);
                            v_tile = row.insert(v_tile, vnew);
                        }
                        hd.kbuf.store(slot, k_tile);
                        hd.vbuf.store(slot, v_tile);
                        for (kw, vw) in write_back(t, slot) {
                            kw.start();
                            vw.start();
                        }
                    });
                    // Positions past each query's (or before its window) are masked, V rows
                    // included (the cache holds whatever it held there). With one token,
                    // only a tile that holds such positions pays for it: the last one read;
                    // with K, the last two may (the queries' own positions). Reading all
                    // tiles, every tile pays (a run-time choice per tile costs more in
                    // libtpu's estimate than the masking: the cost variant stays an upper
                    // bound).
                    let mask = match (p.kv_tiles, d.window) {
                        (KvTiles::UpToPosition, None) if !draining && kt == 1 => None,
                        _ => Some(KvMask {
                            start: t * bkv_i,
                            last: pos,
                            queries,
                            window: d.window,
                            zero_values: true,
                        }),
                    };
                    let state =
                        state.attend(qg, hd.kbuf.load(slot), hd.vbuf.load(slot), None, mask);
                    // The write-back reads this slot: it lands before the slot is refilled.
                    on_new_tile(t, draining, &|| {
                        for (kw, vw) in write_back(t, slot) {
                            kw.wait();
                            vw.wait();
                        }
                    });
                    (state, 1 - slot)
                },
            );
            // Head j's output row for token k back to the token's row of its stacked block.
            let out = state.output();
            for k in 0..kt {
                for j in 0..group {
                    let block = || (g, j * rows..(j + 1) * rows, ..);
                    hd.os.store(
                        block(),
                        row_b.put(
                            hd.os.load(block()),
                            token_row(k),
                            arow.take(out, (k * group + j) as i32),
                        ),
                    );
                }
            }
        });
    });
    for head in 0..d.heads {
        let (g, j) = (head / group, head % group);
        hd.attn
            .store((.., head * hp..(head + 1) * hp), hd.os.load((g, j * rows..(j + 1) * rows, ..)));
    }
}

/// Softmax over the experts, top-k (lowest id wins ties), optional renormalisation; the
/// distinct experts the real rows chose, in order of first choice (row-major, slot-minor),
/// to SMEM: returns the routing and their count (each row's `top_k` choices are distinct, so
/// at least `top_k`; at most [`Plan::distinct_experts`]). A choice that is not the first of
/// its expert is stored to the trash entry past the list. Under EP only the device's own
/// experts are listed, by local id (possibly none: entry 0 then holds local expert 0).
/// Records which rows' router logits are not finite in lane `layer` of
/// `router_non_finite`.
fn route(p: &Plan, hd: H, layer: Val) -> (Routing, Val) {
    let d = &p.dims;
    let k = d.top_k;
    let trash = p.distinct_experts() as i32;
    let logits = hd.rl.load(..);
    record_non_finite(p, hd.router_non_finite, layer, logits);
    let sigmoid = d.scoring == RouterScoring::Sigmoid;
    let routing = Routing::new(logits, d.experts, k, sigmoid, d.renormalize);
    let own_first = hd.spmd.and_then(|spmd| spmd.expert_first());
    if own_first.is_some() {
        hd.ids.store(0, scalar(0));
    }
    let mut distinct = scalar(0);
    for r in 0..d.tokens {
        for j in 0..k {
            let id = routing.id(r as i32, j as i32);
            let first = routing.first_choice(r, j, id);
            let (listed, stored) = match own_first {
                Some(lo) => {
                    (first & ge(id, lo) & lt(id, lo + d.experts_per_device as i32), id - lo)
                }
                None => (first, id),
            };
            hd.ids.store(select(listed, distinct, trash), stored);
            distinct = select(listed, distinct + 1, distinct);
        }
    }
    (routing, distinct)
}

/// Lane `layer` of `status` (`[rows, lanes]` f32): 1 on the real token rows whose router
/// `logits` (`[rows, experts_pad]`, the first `experts` columns real) hold a NaN or an
/// infinity, else 0. A few vector ops per layer, read by the host after the step.
fn record_non_finite(p: &Plan, status: Ref, layer: Val, logits: Val) {
    let d = &p.dims;
    let (rows, width) = (d.rows, d.experts_pad);
    let real = lt(iota([rows, width], 1), d.experts as i32);
    // `x * 0` is NaN exactly for NaN and infinities, and their sum is added.
    let poison = (select(real, logits, 0.0) * 0.0).sum_keepdims(1);
    let fine = eq(poison, 0.0) | ge(iota([rows, 1], 0), d.tokens as i32);
    let bad = select(fine, zeros([rows, 1], f32), 1.0);
    let lanes = status.shape().0[1];
    status.store(.., select(eq(iota([rows, lanes], 1), layer), bad, status.load(..)));
}

/// The expert stream: for each (distinct expert, chunk) item, the chunk (gate | up | down
/// columns, one DMA) of the expert, fetched by id right after routing into a ring of `slots`
/// slots, `slots - 1` items ahead, each item computed after the next one's wait
/// ([`pipeline_lagged`]: `slots - 1` chunks in flight through every compute, never more at
/// once): each expert any row chose is fetched once and applied to every row, times each
/// row's weight for it (zero for rows that did not choose it). One flat pipelined loop
/// over the items, `distinct * chunks` of them (a run-time count; the
/// static worst case [`Plan::distinct_experts`] with [`ExpertFetch::WorstCase`], the
/// entries past the distinct ones fetching the last one again at weight zero): the
/// (expert, chunk) cursor is carried and advanced by compares, not divided out of the item
/// index (libtpu's v6e estimator fails on the scalar division by a chunk count that is not
/// a power of two). Under EP a device may hold none of the chosen experts: its stream is
/// the static worst case, entry 0 standing in (at weight zero) when the list is empty.
fn experts(p: &Plan, hd: H, layer: Val, xn2: Val, routing: Routing, distinct: Val) {
    // `layer`: the layer's slot in `w_experts` (its index where every layer is MoE).
    let d = &p.dims;
    let (ec, slots) = (p.layout.expert_chunks, p.expert_slots);
    let own_first = hd.spmd.and_then(|spmd| spmd.expert_first());
    let worst_case = p.expert_fetch == ExpertFetch::WorstCase || own_first.is_some();
    let total = match worst_case {
        false => distinct * ec as i32,
        true => scalar((p.distinct_experts() * ec) as i32),
    };
    // Row 0 alone chose `top_k` distinct experts: that many items exist whatever the
    // routing (on one device, or under TP; under EP the static worst case's items do), and
    // the lagged stream issues item `ahead` before its loop.
    let ahead = (slots - 1).min(d.top_k.min(p.distinct_experts()) * ec - 1);
    let last = || match own_first {
        Some(_) => select(ge(distinct, 1), distinct - 1, 0),
        None => distinct - 1,
    };
    let entry = |e: Val| if worst_case { select(lt(e, distinct), e, last()) } else { e };
    // Entry `e`'s (local) expert id, clamped into `w_experts`.
    let expert_id = |e: Val| clamp_index(hd.ids.load(entry(e)), d.experts_per_device);
    // The chunk's codes, and a quantized plan's scales with them (same chunking).
    let fetch = |e: Val, c: Val, slot: Val| {
        let id = expert_id(e);
        let mut copies = vec![async_copy(
            hd.w_experts.at((layer, id, c)),
            hd.ex_buf.at(slot),
            hd.ex_sems.at(slot),
        )];
        if let Some(q) = hd.quant {
            copies.push(async_copy(
                q.expert_scales.at((layer, id, c)),
                q.ex_sc.at(slot),
                q.ex_sc_sems.at((0, slot)),
            ));
            copies.push(async_copy(
                q.expert_down_scales.at((layer, id, c)),
                q.ex_dsc.at(slot),
                q.ex_sc_sems.at((1, slot)),
            ));
        }
        copies
    };
    ffn_chunks(p, hd, total, ahead, ec, fetch, |slot, e, _| {
        let chunk = ring_swiglu(p, hd, slot, xn2, d.intermediate);
        let expert = match own_first {
            Some(lo) => expert_id(e) + lo,
            None => expert_id(e),
        };
        let weights = routing.weights_for(expert, d.tokens);
        let weights = if worst_case { select(lt(e, distinct), weights, 0.0) } else { weights };
        (chunk, Some(weights))
    });
}

/// The SwiGLU of the chunk in expert-ring slot `slot` (`[gate | up | down]` columns, a
/// quantized plan's codes with their scales in the ring's scale slots) on `xn2`: an
/// expert's, or a dense MLP's, of `intermediate` columns (the down projection's inputs,
/// which its scale groups count).
fn ring_swiglu(p: &Plan, hd: H, slot: Val, xn2: Val, intermediate: u64) -> Val {
    let eb = p.layout.expert_block;
    let columns = |part: u64| hd.ex_buf.load((slot, .., part * eb..(part + 1) * eb));
    match (hd.quant, p.layout.quant) {
        (Some(q), Some(f)) => {
            let f = f.experts;
            let block = |part: u64, values: Val, weight_inputs: u64| QuantizedBlock {
                codes: columns(part),
                scales: GroupScales { values, group: f.group_of(weight_inputs) },
            };
            let gate_up = |part: u64| q.ex_sc.load((slot, .., part * eb..(part + 1) * eb));
            let (h, i) = (p.dims.hidden, intermediate);
            token_rows(p, xn2, |x| {
                swiglu_chunk(
                    x,
                    block(0, gate_up(0), h),
                    block(1, gate_up(1), h),
                    block(2, q.ex_dsc.load((slot, 0..f.scale_rows(eb, i), ..)), i),
                    WeightLayout::OutIn,
                )
            })
        }
        _ => swiglu_chunk(xn2, columns(0), columns(1), columns(2), WeightLayout::OutIn),
    }
}

/// An FFN stage's chunk stream through the expert ring, shared by the routed experts and
/// the dense MLP: `total` items (item `(e, c)`: chunk `c < chunks` of entry `e`), the first
/// `ahead` issued before the loop, each computed after the next one's wait
/// ([`pipeline_lagged`]); `chunk(slot, e, c)` gives the item's output and its per-row
/// weights (`None`: every row at weight 1), summed into the FFN accumulator; then the
/// all-reduce (N devices) and the residual add.
fn ffn_chunks(
    p: &Plan,
    hd: H,
    total: Val,
    ahead: u64,
    chunks: u64,
    fetch: impl Fn(Val, Val, Val) -> Vec<Dma>,
    chunk: impl Fn(Val, Val, Val) -> (Val, Option<Val>),
) {
    let slots = p.expert_slots;
    for it in 0..ahead {
        for dma in
            fetch(scalar((it / chunks) as i32), scalar((it % chunks) as i32), scalar(it as i32))
        {
            dma.start();
        }
    }
    hd.acc.store(.., 0.0);
    let zero = scalar(0);
    let _ = pipeline_lagged(
        total,
        ahead,
        (zero, zero, zero),
        |_, &(slot, e, c)| {
            let mut item = ExpertItem { pair: e, chunk: c };
            for _ in 0..ahead {
                item = item.next(chunks);
            }
            for dma in fetch(item.pair, item.chunk, ring_add(slot, ahead, slots)) {
                dma.start();
            }
        },
        |_, &(slot, e, c)| {
            for dma in fetch(e, c, slot) {
                dma.wait();
            }
        },
        |_, (slot, e, c): (Val, Val, Val)| {
            let (y, weights) = chunk(slot, e, c);
            let acc = hd.acc.load(..);
            hd.acc.store(
                ..,
                match weights {
                    Some(w) => acc + y * w,
                    None => acc + y,
                },
            );
            let next = ExpertItem { pair: e, chunk: c }.next(chunks);
            (ring_add(slot, 1, slots), next.pair, next.chunk)
        },
    );
    if let Some(spmd) = hd.spmd {
        spmd.all_reduce(hd.acc);
    }
    hd.x.store(.., residual_add(hd.x.load(..), hd.acc.load(..)));
}

/// A dense-MLP layer's FFN (Qwen3-MoE's `mlp_only_layers` / `decoder_sparse_step`): its
/// `mlp_chunks` chunks (`[gate^T | up^T | down]`, the post-attention norm folded, as an
/// expert's) from `w_mlp[slot]` through the expert ring, every row at weight 1. On N
/// devices each holds its slice of the intermediate columns; the accumulator's
/// all-reduce sums them.
fn dense_mlp(p: &Plan, hd: H, slot: Val, xn2: Val) {
    let w_mlp = hd.w_mlp.expect("a plan with dense-MLP layers has w_mlp");
    let chunks = p.layout.mlp_chunks;
    // The chunk's codes, and a quantized plan's scales with them (as an expert's).
    let fetch = |_: Val, c: Val, ring_slot: Val| {
        let mut copies = vec![async_copy(
            w_mlp.at((slot, c)),
            hd.ex_buf.at(ring_slot),
            hd.ex_sems.at(ring_slot),
        )];
        if let (Some(q), Some((scales, down_scales))) = (hd.quant, hd.mlp_scales) {
            copies.push(async_copy(
                scales.at((slot, c)),
                q.ex_sc.at(ring_slot),
                q.ex_sc_sems.at((0, ring_slot)),
            ));
            copies.push(async_copy(
                down_scales.at((slot, c)),
                q.ex_dsc.at(ring_slot),
                q.ex_sc_sems.at((1, ring_slot)),
            ));
        }
        copies
    };
    let ahead = (p.expert_slots - 1).min(chunks - 1);
    let intermediate = p.dims.dense_intermediate.expect("a plan with dense-MLP layers");
    ffn_chunks(p, hd, scalar(chunks as i32), ahead, chunks, fetch, |ring_slot, _, _| {
        (ring_swiglu(p, hd, ring_slot, xn2, intermediate), None)
    });
}
