//! The megakernel report: text for people, JSON (the [`Plan`] itself, serialized) for tools.

use crate::plan::{KvTiles, Plan, Prefetch};
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
    let mut s = String::new();
    let _ = writeln!(s, "megakernel: {} on {}", p.model, p.chip);
    let _ = writeln!(s, "  layers: {} of {} ({}), batch {}, context {} (cache {} positions, tiles of {})", p.layers, p.model_layers, p.layer_kind, d.batch, p.context, d.positions, p.block_kv);
    let _ = writeln!(s, "rewrites (egg, DAG-aware extraction):");
    for (what, r) in [("layer", &p.layer_rewrite), ("head", &p.head_rewrite)] {
        let _ = writeln!(s, "  {what}: {} after {} iterations, {} e-nodes, cost {} -> {}", r.stop, r.iterations, r.egraph_nodes, r.cost_before, r.cost_after);
        for m in r.matmuls.iter().chain(&r.experts) {
            let fold = m.folded_scale.as_ref().map(|f| format!(" (folded {f})")).unwrap_or_default();
            let _ = writeln!(s, "    matmul [{}]{fold}", m.weights.join(" | "));
        }
    }
    let t = &p.traffic;
    let _ = writeln!(s, "weight bytes streamed per step: {} (dense {}, experts {}, lm_head {}, embedding {}, head norms {})", gb((t.dense + t.experts + t.lm_head + t.embedding + t.head_norms) as f64), gb(t.dense as f64), gb(t.experts as f64), gb(t.lm_head as f64), gb(t.embedding as f64), gb(t.head_norms as f64));
    let _ = writeln!(s, "kv bytes per step: read {}, written {}", gb(t.kv_read as f64), gb(t.kv_write as f64));
    let _ = writeln!(s, "total HBM bytes per step: {} (model count {}); floor at {}: {:.1} us", gb(t.total as f64), gb(t.model_total), p.chip, t.floor_seconds * 1e6);
    let _ = writeln!(s, "DMA schedule:");
    let _ = writeln!(s, "  dense ring: {} banks x {} ([{}, {}] bf16), prefetch depth {} chunks across op and layer boundaries", p.banks, mib(p.bank_bytes), d.hidden, p.chunk_cols, p.depth);
    let _ = writeln!(s, "  dense chunks per layer: {} ({}), then {} lm_head chunks", p.per_layer(), p.segments.iter().map(|g| format!("{} cols {}..{}", g.name, g.col, g.col + g.cols)).collect::<Vec<_>>().join(", "), p.lm_chunks);
    let _ = writeln!(s, "  experts: fetched by id after routing, {} slots x {} (gate | up | down [{}, 3 x {}], one DMA), {} chunks per expert, {} ahead", p.expert_slots, mib(p.expert_slot_bytes), d.hidden, p.expert_block, p.expert_chunks, p.expert_slots - 1);
    let kv_loop = match p.kv_tiles {
        KvTiles::UpToPosition => "up to each position",
        KvTiles::All => "all of them, masked past the position (cost variant)",
    };
    let _ = writeln!(s, "  kv: tiles of {} positions double-buffered per (kv head, sequence), read {kv_loop}; new K/V written in place (16-row group)", p.block_kv);
    let _ = writeln!(s, "  DMAs per step: {}", t.dmas);
    if p.prefetch == Prefetch::Single {
        let _ = writeln!(s, "  prefetch: one chunk in flight per stream (cost variant)");
    }
    let _ = writeln!(s, "VMEM plan ({} of {} per core, limit {}):", mib(p.vmem_total), mib(p.vmem_capacity), mib(p.vmem_limit));
    for (n, b) in &p.vmem {
        let _ = writeln!(s, "  {n}: {}", mib(*b));
    }
    let _ = writeln!(s, "HBM: {:.2} GiB of {:.2} GiB usable", p.hbm_total as f64 / (1u64 << 30) as f64, p.hbm_capacity as f64 / (1u64 << 30) as f64);
    let _ = writeln!(s, "operands:");
    for o in &p.operands {
        let _ = writeln!(s, "  {} {} {}{:?} ({}): {}", o.role, o.name, o.dtype, o.shape, o.space, o.source);
    }
    s
}

/// The plan as JSON.
pub fn json(p: &Plan) -> String {
    serde_json::to_string_pretty(p).unwrap_or_default()
}
