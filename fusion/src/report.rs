//! The megakernel report: text for people, JSON (the [`Plan`] itself, serialized, with
//! each operand's [`operand_source`]) for tools.

use crate::layout::{Ffn, Operand, OperandKind, role_name};
use crate::plan::{ExpertFetch, KvTiles, Plan, Prefetch, TWO_AHEAD_SLOTS};
use crate::shard::{ExpertSplit, Sharding};
use crate::source::source_map;
use std::fmt::Write;

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
}

fn gb(b: f64) -> String {
    format!("{:.3} GB", b / 1e9)
}

/// The human-readable report.
pub fn text(p: &Plan) -> String {
    let d = &p.dims;
    let layout = &p.layout;
    let mut s = String::new();
    let _ = writeln!(s, "megakernel: {} on {}", p.model, p.chip);
    if let Some(sh) = &p.sharding {
        sharding(&mut s, p, sh);
    }
    let _ = writeln!(
        s,
        "  layers: {} of {} ({}), batch {}, context {} (cache {} positions, tiles of {})",
        p.layers, p.model_layers, p.layer_kind, d.batch, p.context, d.positions, p.block_kv
    );
    if !p.layer_ffns.all_routed() {
        layer_kinds(&mut s, p);
    }
    if d.tokens_per_seq > 1 {
        let _ = writeln!(
            s,
            "  tokens per sequence: {} (positions p..p+{}, causal among them): {} token rows",
            d.tokens_per_seq,
            d.tokens_per_seq - 1,
            d.tokens
        );
    }
    let _ = writeln!(s, "rewrites (egg, DAG-aware extraction):");
    for (what, r) in [("layer", &p.layer_rewrite), ("head", &p.head_rewrite)] {
        let _ = writeln!(
            s,
            "  {what}: {} after {} iterations, {} e-nodes, cost {} -> {}",
            r.stop, r.iterations, r.egraph_nodes, r.cost_before, r.cost_after
        );
        for m in r.matmuls.iter().chain(&r.experts) {
            let _ = writeln!(s, "    matmul {}", m.describe());
        }
    }
    let t = &p.traffic;
    // The dense MLP's share where layers mix kinds.
    let mlp = if t.mlp > 0 { format!(", dense MLP {}", gb(t.mlp as f64)) } else { String::new() };
    let mut bias = if t.qkv_bias > 0 {
        format!(", q/k/v biases {}", gb(t.qkv_bias as f64))
    } else {
        String::new()
    };
    if t.correction_bias > 0 {
        bias += &format!(", correction biases {}", gb(t.correction_bias as f64));
    }
    if t.sinks > 0 {
        bias += &format!(", sinks and router biases {}", gb(t.sinks as f64));
    }
    let _ = writeln!(
        s,
        "weight bytes streamed per step: {} (dense {}, experts {}{mlp}, lm_head {}, embedding {}, head norms {}{bias})",
        gb((t.dense
            + t.experts
            + t.mlp
            + t.lm_head
            + t.embedding
            + t.head_norms
            + t.qkv_bias
            + t.correction_bias
            + t.sinks) as f64),
        gb(t.dense as f64),
        gb(t.experts as f64),
        gb(t.lm_head as f64),
        gb(t.embedding as f64),
        gb(t.head_norms as f64)
    );
    padding(&mut s, p);
    let _ = writeln!(
        s,
        "expert bytes per step: {} at the static worst case of {} distinct experts per layer (min(E, batch x K x top_k), each fetched once), {} without dedupe ({} fetches per layer), {} expected under uniform routing",
        gb(t.experts as f64),
        p.distinct_experts(),
        gb(t.experts_without_dedupe as f64),
        d.tokens * d.top_k,
        gb(t.experts_uniform_routing)
    );
    if let (Some(q), Some(parts)) = (&layout.quant, &t.by_dtype) {
        let lm = q.lm_head.map_or("bf16".to_string(), |f| format!("{} per channel", f.codes));
        let group = |f: crate::layout::CodeFormat| {
            f.group.map_or("per output channel".to_string(), |g| format!("groups of {g} inputs"))
        };
        let _ = writeln!(
            s,
            "weights: {} (dense q/k/v/o {} {}, experts {} {}, lm_head {lm}, router bf16; norms applied in the kernel, not folded)",
            q.scheme,
            q.dense.codes,
            group(q.dense),
            q.experts.codes,
            group(q.experts)
        );
        let _ = writeln!(
            s,
            "weight bytes per step by dtype: {}",
            parts
                .iter()
                .map(|(d, b)| format!("{d} {}", gb(*b as f64)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        s,
        "kv bytes per step: read {}, written {}",
        gb(t.kv_read as f64),
        gb(t.kv_write as f64)
    );
    let model_count =
        if p.sharding.is_some() { "model count, all devices together" } else { "model count" };
    let _ = writeln!(
        s,
        "total HBM bytes per step: {} ({model_count} {}); floor at {}: {:.1} us",
        gb(t.total as f64),
        gb(t.model_total),
        p.chip,
        t.floor_seconds * 1e6
    );
    let _ = writeln!(s, "DMA schedule:");
    let ring_dtype =
        layout.operand(OperandKind::WStream).map_or("bf16".to_string(), |o| o.dtype.to_string());
    let _ = writeln!(
        s,
        "  dense ring: {} banks x {} ([{}, {}] {ring_dtype}), prefetch depth {} chunks across op and layer boundaries",
        p.banks,
        mib(p.bank_bytes),
        d.hidden,
        layout.chunk_cols,
        p.depth
    );
    let lm_where = if layout.quant.is_some() {
        format!(
            "lm_head in its own stream ({TWO_AHEAD_SLOTS} banks, {} chunks ahead)",
            TWO_AHEAD_SLOTS - 1
        )
    } else {
        "lm_head chunks".into()
    };
    let _ = writeln!(
        s,
        "  dense chunks per layer: {} ({}), then {} {lm_where}",
        layout.per_layer,
        layout
            .segments
            .iter()
            .map(|g| format!("{} cols {}..{}", g.kind.name(), g.col, g.col + g.cols))
            .collect::<Vec<_>>()
            .join(", "),
        layout.lm_chunks
    );
    let fetch = match p.expert_fetch {
        ExpertFetch::Distinct => "the distinct experts (run-time count)",
        ExpertFetch::WorstCase => "the static worst case of distinct experts (cost variant)",
    };
    let _ = writeln!(
        s,
        "  experts: {fetch}, each once, fetched by id after routing, {} slots x {} (gate | up | down [{}, 3 x {}], one DMA), {} chunks per expert, {} ahead",
        p.expert_slots,
        mib(p.expert_slot_bytes),
        d.hidden,
        layout.expert_block,
        layout.expert_chunks,
        p.expert_slots - 1
    );
    let kv_loop = match p.kv_tiles {
        KvTiles::UpToPosition => "up to each position",
        KvTiles::All => "all of them, masked past the position (cost variant)",
    };
    let written = if d.tokens_per_seq == 1 {
        "new K/V written in place (16-row group)".to_string()
    } else {
        format!(
            "the {} new K/V rows written in place (16-row groups, two per tile holding them)",
            d.tokens_per_seq
        )
    };
    let _ = writeln!(
        s,
        "  kv: tiles of {} positions double-buffered per (kv head, sequence), read {kv_loop}; {written}",
        p.block_kv
    );
    let _ = writeln!(s, "  DMAs per step: {}", t.dmas);
    if p.prefetch == Prefetch::Single {
        let _ = writeln!(s, "  prefetch: at most two chunks in flight per stream (cost variant)");
    }
    let _ = writeln!(
        s,
        "VMEM plan ({} of {} per core, limit {}):",
        mib(p.vmem_total),
        mib(p.vmem_capacity),
        mib(p.vmem_limit)
    );
    for (n, b) in &p.vmem {
        let _ = writeln!(s, "  {n}: {}", mib(*b));
    }
    let _ = writeln!(
        s,
        "HBM: {:.2} GiB of {:.2} GiB usable",
        p.hbm_total as f64 / (1u64 << 30) as f64,
        p.hbm_capacity as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(s, "operands:");
    for o in &layout.operands {
        let _ = writeln!(
            s,
            "  {} {} {}{:?} ({}): {}",
            role_name(o.role),
            o.kind.name(),
            o.dtype,
            o.shape,
            o.space,
            operand_source(p, o)
        );
    }
    s
}

/// The sizes padded to native tiles (the model's against the kernel's, all devices'
/// columns together, with each device's where they are split) and the zero bytes they
/// stream per step; nothing where every size fills its tiles.
fn padding(s: &mut String, p: &Plan) {
    let (d, m) = (&p.dims, &p.model_dims);
    let devices = p.sharding.as_ref().map_or(1, |sh| sh.devices);
    let tp = p.sharding.as_ref().is_some_and(|sh| sh.experts.split == ExpertSplit::Tp);
    let mut sizes = Vec::new();
    // `kernel`: one device's size, split `ways` ways.
    let mut size = |what: &str, model: Option<u64>, kernel: Option<u64>, ways: u64| {
        if let (Some(model), Some(kernel)) = (model, kernel)
            && model != kernel * ways
        {
            let per_device =
                if ways > 1 { format!(" ({kernel} per device)") } else { String::new() };
            sizes.push(format!("{what} {model} -> {}{per_device}", kernel * ways));
        }
    };
    size("hidden", Some(m.hidden), Some(d.hidden), 1);
    size(
        "expert intermediate",
        Some(m.intermediate),
        Some(d.intermediate),
        if tp { devices } else { 1 },
    );
    size("shared expert intermediate", m.shared_intermediate, d.shared_intermediate, devices);
    size("dense-MLP intermediate", m.dense_intermediate, d.dense_intermediate, devices);
    if sizes.is_empty() && p.traffic.padding == 0 {
        return;
    }
    let _ = writeln!(
        s,
        "padding to native tiles: {}, zero in every weight: {} of the weight bytes per step",
        sizes.join(", "),
        gb(p.traffic.padding as f64)
    );
}

/// The layers' kinds where they mix: which layers run which FFN stage, the dense MLP's
/// chunks, and what the uniform dense stream costs the dense-MLP layers.
fn layer_kinds(s: &mut String, p: &Plan) {
    let d = &p.dims;
    let layout = &p.layout;
    let _ = writeln!(s, "  layer kinds (FFN stage per layer): {}", p.layer_ffns.describe());
    let dense = p.layer_ffns.count(Ffn::DenseMlp);
    let _ = writeln!(
        s,
        "  dense MLP: intermediate {} (per device), {} chunks of {} columns streamed through the expert ring's slots (w_mlp, {} per step, every row at weight 1); the dense-MLP layers' router columns in the dense stream are zero (a uniform stream: {} bytes per step streamed and projected, not read)",
        d.dense_intermediate.unwrap_or(0),
        layout.mlp_chunks,
        layout.expert_block,
        gb(p.traffic.mlp as f64),
        dense * 2 * d.hidden * d.experts_pad
    );
}

/// The split over several devices: what each device holds, the experts' choice and why,
/// per-device HBM and VMEM, and the collectives with their modelled time.
fn sharding(s: &mut String, p: &Plan, sh: &Sharding) {
    let d = &p.dims;
    let n = sh.devices;
    let _ = writeln!(
        s,
        "split over {n} {} devices (one SPMD program each; the figures below the split are one device's):",
        p.chip
    );
    let hs = &sh.heads;
    let kv = if hs.kv_replicas > 1 {
        format!("each of the {} KV heads replicated on {} devices", hs.kv_heads, hs.kv_replicas)
    } else {
        format!("{} of the {} KV heads", hs.kv_heads_per_device, hs.kv_heads)
    };
    let padded = if hs.heads_padded > hs.heads {
        format!(" (padded with zero weights to {})", hs.heads_padded)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "  attention by heads: {} of the {} query heads{padded} per device, {kv}; o_proj by rows (the device's heads), summed by an all-reduce",
        hs.heads_per_device, hs.heads
    );
    let _ = writeln!(s, "  router and norms replicated");
    let e = &sh.experts;
    let split = match e.split {
        ExpertSplit::Ep => format!(
            "{}, {} of the {} experts per device",
            e.split.name(),
            e.experts_per_device,
            d.experts
        ),
        ExpertSplit::Tp => format!(
            "{}, every expert's intermediate split {n} ways ({} columns per device)",
            e.split.name(),
            e.intermediate_per_device
        ),
    };
    let _ = writeln!(s, "  experts: {split}. Why: {}", e.reason);
    if let Some(i) = d.dense_intermediate {
        let _ = writeln!(
            s,
            "  dense MLP (the dense-MLP layers): TP whatever the experts' split, its intermediate split {n} ways ({i} columns per device), summed by the same all-reduce as the experts' output"
        );
    }
    let _ = writeln!(
        s,
        "  lm_head by vocabulary: {} of the {} ids per device (padded to {} chunks); the greedy (max logit, id) pairs all-gathered; with --logits each device returns its slice (concatenated by the call's output sharding, no ICI bytes)",
        sh.vocab_per_device, sh.vocab, p.layout.lm_chunks
    );
    let _ = writeln!(
        s,
        "  per device: HBM {:.2} GiB of {:.2} GiB usable, {} streamed per step, floor {:.1} us; VMEM {}",
        p.hbm_total as f64 / (1u64 << 30) as f64,
        p.hbm_capacity as f64 / (1u64 << 30) as f64,
        gb(p.traffic.total as f64),
        p.traffic.floor_seconds * 1e6,
        mib(p.vmem_total)
    );
    let _ = writeln!(
        s,
        "  collectives per step (a MODEL from the link figures: {}; libtpu prices remote DMAs at 0):",
        sh.link_model
    );
    for c in &sh.collectives {
        let _ = writeln!(
            s,
            "    {} x{}: {}, {} wire, {} bytes each, {} sent per device, {:.1} us",
            c.name,
            c.count,
            c.kind,
            c.wire,
            c.message_bytes,
            gb(c.sent_bytes as f64),
            c.seconds * 1e6
        );
    }
    let _ = writeln!(
        s,
        "  collective bytes per step {} per device, modelled {:.1} us; floor + collectives {:.1} us per step",
        gb(sh.collective_bytes as f64),
        sh.collective_seconds * 1e6,
        (p.traffic.floor_seconds + sh.collective_seconds) * 1e6
    );
}

/// The model's KV head and vocabulary ids of a device's local ones, as the cache and logits
/// prose names them, in terms of the device's index `me` (the weights' are their source
/// maps'), and what the device holds; `None` on one device.
struct DeviceIndex {
    /// The model's KV head of local KV head `j`.
    kv_head: String,
    /// The model's vocabulary id of the device's first id.
    vocab_start: String,
    /// What the device holds, opening a per-device operand's prose.
    device: String,
}

impl DeviceIndex {
    fn of(p: &Plan) -> Option<DeviceIndex> {
        let d = &p.dims;
        let sh = p.sharding.as_ref()?;
        let (n, hs) = (sh.devices, &sh.heads);
        let (kv_head, heads) = if hs.kv_replicas > 1 {
            let r = hs.kv_replicas;
            let pad = if hs.heads_padded > hs.heads {
                format!(", padded with zero-weight heads to {}", hs.heads_padded / hs.kv_heads)
            } else {
                String::new()
            };
            (
                format!("me / {r}"),
                format!(
                    "{} of the {} query heads, a {r}-way split of its KV head's query group{pad}; each of the {} KV heads replicated on {r} devices",
                    hs.heads_per_device, hs.heads, hs.kv_heads
                ),
            )
        } else {
            (
                format!("me*{} + j", hs.kv_heads_per_device),
                format!(
                    "{} of the {} query heads and {} of the {} KV heads",
                    hs.heads_per_device, hs.heads, hs.kv_heads_per_device, hs.kv_heads
                ),
            )
        };
        let e = &sh.experts;
        let experts = match e.split {
            ExpertSplit::Ep => {
                format!("experts EP, {} of the {} experts", e.experts_per_device, d.experts)
            }
            ExpertSplit::Tp => format!(
                "experts TP, {} of each expert's intermediate columns",
                e.intermediate_per_device
            ),
        };
        Some(DeviceIndex {
            kv_head,
            vocab_start: format!("me*{}", sh.vocab_per_device),
            device: format!(
                "device me's share (of {n}: {heads}; {experts}; {} of the {} vocabulary ids; the model's indices past its sizes are zero padding): ",
                sh.vocab_per_device, sh.vocab
            ),
        })
    }
}

/// How Hugging Face tensors map into operand `o` of `p`'s layout, element by element: a
/// weight operand's source map ([`crate::source`], what the packer walks) rendered; the
/// other operands' contents. On several devices, device `me`'s share.
pub fn operand_source(p: &Plan, o: &Operand) -> String {
    let ix = DeviceIndex::of(p);
    let text = match source_map(p, o.kind) {
        Some(map) => map.describe(p),
        None => other_source(p, o, ix.as_ref()),
    };
    match ix {
        Some(ix) if per_device(o.kind) => format!("{}{text}", ix.device),
        _ => text,
    }
}

/// Whether operand `kind` holds a device's share (its prose opens with the device's).
fn per_device(kind: OperandKind) -> bool {
    !matches!(
        kind,
        OperandKind::Tokens
            | OperandKind::Positions
            | OperandKind::Embed
            | OperandKind::Router
            | OperandKind::Norms
            | OperandKind::HeadNorms
            | OperandKind::CorrectionBias
            | OperandKind::RouterBias
            | OperandKind::OBias
            | OperandKind::NextIds
            | OperandKind::MaxLogits
            | OperandKind::RouterNonFinite
            | OperandKind::KCacheOut
            | OperandKind::VCacheOut
    )
}

/// [`operand_source`] of an operand that is not a weight (no source map); on several
/// devices (`ix`), local indices mapped to the model's.
fn other_source(p: &Plan, o: &Operand, ix: Option<&DeviceIndex>) -> String {
    let d = &p.dims;
    let layout = &p.layout;
    let (hd, cw) = (d.head_dim, layout.chunk_cols);
    match o.kind {
        OperandKind::Tokens if d.tokens_per_seq == 1 => "token id of each sequence".into(),
        OperandKind::Tokens => format!("token id of row r = b * {k} + k: sequence b's k-th new token (k < {k}), at position positions[b] + k", k = d.tokens_per_seq),
        OperandKind::Positions if d.tokens_per_seq == 1 => format!("position of each sequence's new token (0-based, < {}); K/V are written there and attention covers positions 0..=pos", d.positions),
        OperandKind::Positions => format!(
            "position p of each sequence's first new token (0-based, p + {} < {}); K/V are written at p..p+{}, and token k attends to positions 0..=p+k",
            d.tokens_per_seq - 1,
            d.positions,
            d.tokens_per_seq - 1
        ),
        OperandKind::KCache | OperandKind::VCache => {
            let what = if o.kind == OperandKind::KCache { "K" } else { "V" };
            let out = layout.operands.iter().find(|x| x.kind.aliased_input() == Some(o.kind)).map_or("", |x| x.kind.name());
            let head = ix.map_or(String::new(), |ix| format!(" (the model's KV head {})", ix.kv_head.replace('j', "g")));
            // K as cached: after its norm where the model norms k, before or after RoPE.
            let k = match (d.qk_norm || d.whole_qk_norm, d.qk_norm_after_rope) {
                (false, _) => "RoPE",
                (true, false) => "k_norm and RoPE",
                (true, true) => "RoPE and k_norm",
            };
            format!("{what} of layer l, sequence b, kv head g{head} at position t: [l, b, g, t, :{hd}] (after {k} for K; cols {hd}.. zero); aliased to the output {out} (updated in place)")
        }
        OperandKind::Logits => {
            let (token, slice) = ix.map_or((String::new(), "vocab".to_string()), |ix| (format!(" (the model's token {} + v; the devices' slices concatenated give the vocabulary)", ix.vocab_start), d.vocab.to_string()));
            format!("logits of token row r (sequence b's k-th new token: r = b * K + k, K = {}) for token v{token} at [v / {cw}, r, v % {cw}] (rows >= batch * K and v >= {slice} are padding)", d.tokens_per_seq)
        }
        OperandKind::NextIds => "greedy next id of token row r at [r, :] (every lane): the lowest id among the row's maximal logits (rows >= batch * K are padding)".into(),
        OperandKind::MaxLogits => "maximum logit of token row r at [r, :] (every lane), NaN when any of the row's logits is not finite (so a bad step is caught without the full logits)".into(),
        OperandKind::RouterNonFinite => format!("1 at [r, l] when token row r's router logits in layer l are not all finite (NaN or infinity), else 0 (lanes l >= {} and rows >= batch * K are 0): the step names the layer where the numbers went bad", p.layers),
        OperandKind::KCacheOut | OperandKind::VCacheOut => "aliases the input of the same name (KV written in place)".into(),
        // The weights: their source maps.
        _ => String::new(),
    }
}

/// The plan as JSON, each operand with its `source` ([`operand_source`]).
pub fn json(p: &Plan) -> String {
    let mut value = serde_json::to_value(p).unwrap_or_default();
    if let Some(operands) = value.get_mut("operands").and_then(|v| v.as_array_mut()) {
        for (json, o) in operands.iter_mut().zip(&p.layout.operands) {
            if let Some(obj) = json.as_object_mut() {
                obj.insert("source".into(), operand_source(p, o).into());
            }
        }
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}
