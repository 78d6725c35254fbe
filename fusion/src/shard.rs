//! The sharding planner: how one decode step splits over `N` devices (`--devices N`, a
//! device as PJRT counts it: a TensorCore on v7x, a chip on v6e), each running the same
//! SPMD megakernel on its share of the weights.
//!
//! - **Attention by heads**: where `N` divides the KV heads, each device holds `kv / N` of
//!   them and their query groups; where the KV heads divide `N`, each KV head is replicated
//!   on `N / kv` devices and its query group is split among them (padded with zero-weight
//!   heads to divide). A padded head attends with a zero query and meets zero `o_proj` rows:
//!   it adds nothing.
//! - **`o_proj` by rows** (the device's heads), its partial output summed by an all-reduce.
//! - **Router and norms replicated**: every device routes every row the same way.
//! - **Experts**: EP (`E / N` whole experts per device, padded with experts no row chooses)
//!   or TP (each expert's intermediate split `N` ways, padded to 128 lanes per device),
//!   chosen by the per-device expert bytes at the static worst case of routing; either way
//!   one all-reduce of the MoE output, so the collective cost does not decide.
//! - **`lm_head` by vocabulary** (`ceil(V / N)` ids per device): each device's greedy
//!   `(max logit, id)` pair is all-gathered and reduced on every device; with `--logits`,
//!   each device returns its vocabulary slice and the call's output sharding concatenates
//!   them (no ICI bytes).
//! - **Collective time is a model**: libtpu's static estimator prices remote DMAs at 0
//!   cycles, so the report prices them from the target's link figures
//!   ([`palladium_dsl::target::Ici::ring_hop`]).
//!
//! The per-device program's dims are the [`Plan`](crate::plan::Plan)'s own (`heads`, `kv_heads`, `group`,
//! `intermediate`, `experts_per_device`, `vocab` per device), so the plan's layout, VMEM,
//! HBM and traffic are per device; [`Sharding`] keeps the global split and the collectives.

use crate::options::{Dims, PlanError, PlanOptions, hbm_usable_bytes, product, round_up};
use palladium_dsl::DType;
use serde::Serialize;

/// Device counts the megakernel plans for.
pub const DEVICE_COUNTS: [u64; 4] = [1, 2, 4, 8];

/// How the experts are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ExpertSplit {
    /// Expert parallel: whole experts, `E / N` per device.
    #[serde(rename = "EP")]
    Ep,
    /// Tensor parallel: every expert's intermediate split `N` ways.
    #[serde(rename = "TP")]
    Tp,
}

impl ExpertSplit {
    pub fn name(self) -> &'static str {
        match self {
            ExpertSplit::Ep => "EP",
            ExpertSplit::Tp => "TP",
        }
    }
}

/// The attention heads' split.
#[derive(Clone, Debug, Serialize)]
pub struct HeadSplit {
    pub heads: u64,
    /// Query heads after padding with zero-weight heads (a multiple of `N`).
    pub heads_padded: u64,
    pub heads_per_device: u64,
    pub kv_heads: u64,
    pub kv_heads_per_device: u64,
    /// Devices holding a copy of each KV head (1: split, not replicated).
    pub kv_replicas: u64,
}

/// The experts' split, with both candidates' per-device expert bytes per step (static worst
/// case) and the reason for the choice.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertChoice {
    pub split: ExpertSplit,
    pub experts_per_device: u64,
    pub intermediate_per_device: u64,
    pub ep_step_bytes: u64,
    pub tp_step_bytes: u64,
    pub reason: String,
}

/// One collective of a step, per device.
#[derive(Clone, Debug, Serialize)]
pub struct Collective {
    pub name: String,
    /// "all-reduce (reduce-scatter + all-gather)" or "all-gather", over a bidirectional ring.
    pub kind: &'static str,
    /// Times per step.
    pub count: u64,
    #[serde(serialize_with = "crate::layout::display")]
    pub wire: DType,
    /// The array each device contributes, bytes on the wire.
    pub message_bytes: u64,
    /// Bytes one device sends per step, all `count` together.
    pub sent_bytes: u64,
    /// Modelled seconds per step, all `count` together.
    pub seconds: f64,
}

/// The split of a step over `devices` devices and its collectives.
#[derive(Clone, Debug, Serialize)]
pub struct Sharding {
    pub devices: u64,
    pub heads: HeadSplit,
    pub experts: ExpertChoice,
    pub vocab: u64,
    pub vocab_per_device: u64,
    pub collectives: Vec<Collective>,
    /// Bytes one device sends per step, and their modelled time.
    pub collective_bytes: u64,
    pub collective_seconds: f64,
    /// Where the link figures come from (a model: libtpu prices remote DMAs at 0).
    pub link_model: String,
}

/// The heads' split over `n` devices, or why they do not split.
fn split_heads(dims: &Dims, n: u64) -> Result<HeadSplit, String> {
    let (heads, kv) = (dims.heads, dims.kv_heads);
    if kv.is_multiple_of(n) {
        return Ok(HeadSplit {
            heads,
            heads_padded: heads,
            heads_per_device: heads / n,
            kv_heads: kv,
            kv_heads_per_device: kv / n,
            kv_replicas: 1,
        });
    }
    if n.is_multiple_of(kv) {
        let replicas = n / kv;
        let group = round_up(dims.group, replicas);
        return Ok(HeadSplit {
            heads,
            heads_padded: group * kv,
            heads_per_device: group / replicas,
            kv_heads: kv,
            kv_heads_per_device: 1,
            kv_replicas: replicas,
        });
    }
    Err(format!(
        "the {kv} KV heads neither split evenly over {n} devices nor replicate evenly onto them (each device's query heads must share its KV heads)"
    ))
}

/// EP or TP for the experts, from the per-device expert bytes per step at the static
/// worst case of routing (`min(E, rows x top_k)` distinct experts, all on one device
/// under EP at worst), among the splits whose expert weights fit `hbm` per device (where
/// neither does, the one that stores less, for the refusal to be about the best).
fn choose_experts(dims: &Dims, n: u64, layers: u64, hbm: u64) -> Result<ExpertChoice, PlanError> {
    let (h, e, i) = (dims.hidden, dims.experts, dims.intermediate);
    let chosen = dims.tokens * dims.top_k;
    let ep_experts = e.div_ceil(n);
    let tp_intermediate = round_up(i, 128 * n) / n;
    // Whole experts, padded to 128 lanes as on one device (`Dims::tiled`).
    let ep_intermediate = round_up(i, 128);
    let ep_step_bytes = product(
        "the expert weights read per step",
        &[layers, ep_experts.min(chosen), 2, 3, h, ep_intermediate],
    )?;
    let tp_step_bytes = product(
        "the expert weights read per step",
        &[layers, e.min(chosen), 2, 3, h, tp_intermediate],
    )?;
    let ep_stored =
        product("a device's expert weights", &[layers, ep_experts, 2, 3, h, ep_intermediate])?;
    let tp_stored = product("a device's expert weights", &[layers, e, 2, 3, h, tp_intermediate])?;
    let gb = |b: u64| format!("{:.3} GB", b as f64 / 1e9);
    let padded = if tp_intermediate * n > i {
        format!(" padded to {}", tp_intermediate * n)
    } else {
        String::new()
    };
    let both = format!(
        "per device per step at the static worst case: EP {} (up to {} of the {} experts a step chooses on one device, whole), TP {} (every chosen expert's 1/{n}: intermediate {i}{padded}, {} per device); either way one all-reduce of the MoE output",
        gb(ep_step_bytes),
        ep_experts.min(chosen),
        e.min(chosen),
        gb(tp_step_bytes),
        tp_intermediate
    );
    let stored = format!(
        "stored per device: EP {}, TP {}, {} usable",
        gb(ep_stored),
        gb(tp_stored),
        gb(hbm)
    );
    let tp = ExpertChoice {
        split: ExpertSplit::Tp,
        experts_per_device: e,
        intermediate_per_device: tp_intermediate,
        ep_step_bytes,
        tp_step_bytes,
        reason: String::new(),
    };
    let ep = ExpertChoice {
        split: ExpertSplit::Ep,
        experts_per_device: ep_experts,
        intermediate_per_device: ep_intermediate,
        ep_step_bytes,
        tp_step_bytes,
        reason: String::new(),
    };
    let (choice, why) = match (ep_stored <= hbm, tp_stored <= hbm) {
        (true, false) => (ep, "only EP's experts fit the device's HBM"),
        (false, true) => (tp, "only TP's experts fit the device's HBM"),
        (false, false) if tp_stored < ep_stored => {
            (tp, "neither split's experts fit the device's HBM; TP stores less")
        }
        (false, false) => (ep, "neither split's experts fit the device's HBM; EP stores no more"),
        _ if tp_step_bytes < ep_step_bytes => (tp, "TP streams fewer bytes"),
        _ => (ep, "EP streams no more bytes, whole experts"),
    };
    Ok(ExpertChoice { reason: format!("{why}: {both}; {stored}"), ..choice })
}

/// The per-device dims of a step split over `options.devices` devices (`moe_layers` of
/// its layers MoE), and the split (`None` on one device, whose dims are returned
/// unchanged). A dense MLP (layers mixing kinds), as a shared expert, is split by
/// intermediate columns like TP experts, whichever split the experts take: its output
/// joins the experts' all-reduce.
pub fn split(
    dims: Dims,
    options: &PlanOptions,
    moe_layers: usize,
) -> Result<(Dims, Option<(HeadSplit, ExpertChoice)>), PlanError> {
    let n = options.devices;
    if n == 1 {
        return Ok((dims, None));
    }
    let heads = split_heads(&dims, n).map_err(|reason| PlanError::Split { devices: n, reason })?;
    let experts = choose_experts(&dims, n, moe_layers as u64, hbm_usable_bytes(options.chip))?;
    let per_device = Dims {
        heads: heads.heads_per_device,
        kv_heads: heads.kv_heads_per_device,
        group: heads.heads_per_device / heads.kv_heads_per_device,
        attn_rows: round_up(
            heads.heads_per_device / heads.kv_heads_per_device * dims.tokens_per_seq,
            16,
        ),
        experts_per_device: experts.experts_per_device,
        intermediate: experts.intermediate_per_device,
        dense_intermediate: dims.dense_intermediate.map(|i| round_up(i, 128 * n) / n),
        shared_intermediate: dims.shared_intermediate.map(|i| round_up(i, 128 * n) / n),
        vocab: dims.vocab.div_ceil(n),
        ..dims
    };
    Ok((per_device, Some((heads, experts))))
}

/// The collectives of a step on the per-device `dims` and their modelled time, from the
/// chip's link model.
pub fn sharding(
    options: &PlanOptions,
    layers: usize,
    dims: &Dims,
    vocab: u64,
    (heads, experts): (HeadSplit, ExpertChoice),
) -> Result<Sharding, PlanError> {
    let n = options.devices;
    let target = options.chip.target();
    let (rows, h, l) = (dims.rows, dims.hidden, layers as u64);
    let hop = |message: u64| target.ici.ring_hop(n as u32, target.devices_per_chip(), message);
    let link_model =
        hop(rows * h * 2).map(|r| r.source.to_string()).ok_or_else(|| PlanError::Split {
            devices: n,
            reason: format!(
                "{} publishes no ICI bandwidth to price the collectives with",
                options.chip
            ),
        })?;
    // A bidirectional ring: half of the data each way. An all-reduce of S bytes sends
    // 2 (N-1)/N S per device (reduce-scatter, then all-gather), an all-gather of a P-byte
    // piece (N-1) P; each collective also pays the link's fixed latency.
    let all_reduce = |name: &str, count: u64, message: u64| {
        let sent = 2 * (n - 1) * message / n;
        let r = hop(message / n).expect("priced above");
        Collective {
            name: name.into(),
            kind: "all-reduce (reduce-scatter + all-gather, bidirectional ring)",
            count,
            wire: DType::Bf16,
            message_bytes: message,
            sent_bytes: count * sent,
            seconds: count as f64 * (r.latency + sent as f64 / (2.0 * r.bandwidth)),
        }
    };
    let all_gather = |name: &str, count: u64, piece: u64, wire| {
        let sent = (n - 1) * piece;
        let r = hop(piece).expect("priced above");
        Collective {
            name: name.into(),
            kind: "all-gather (bidirectional ring)",
            count,
            wire,
            message_bytes: piece,
            sent_bytes: count * sent,
            seconds: count as f64 * (r.latency + sent as f64 / (2.0 * r.bandwidth)),
        }
    };
    let activation = rows * h * 2;
    let mut collectives = vec![
        all_reduce("attention output (after o_proj)", l, activation),
        all_reduce("MoE output (after the experts)", l, activation),
        // One f32 maximum and one i32 id per row: exact, 8 bytes a row.
        all_gather("greedy (max logit, id) per row", 1, rows * 8, DType::F32),
    ];
    if dims.whole_qk_norm {
        // OLMoE's q and k sums of squares, an f32 [rows (to 8), 128] block per device.
        collectives.push(all_gather(
            "q/k sums of squares (norms over the whole projections)",
            l,
            rows.next_multiple_of(8) * 128 * 4,
            DType::F32,
        ));
    }
    let collective_bytes = collectives.iter().map(|c| c.sent_bytes).sum();
    let collective_seconds = collectives.iter().map(|c| c.seconds).sum();
    Ok(Sharding {
        devices: n,
        heads,
        experts,
        vocab,
        vocab_per_device: dims.vocab,
        collectives,
        collective_bytes,
        collective_seconds,
        link_model,
    })
}
