//! `cargo bench --bench megakernel`: the decode megakernel by libtpu's static cycle
//! estimates (deviceless, through PJRT (`palladium-runtime`); libtpu 0.0.42.1), and its emission time.
//! Every cycle count is libtpu's scheduler estimate of the compiled kernel, not a device
//! measurement; ratios are of numbers measured in the same run, on one chip (v6e).
//!
//! 1. For the tiny Qwen3-MoE (all 4 layers) and Qwen3-30B-A3B truncated to the layers that
//!    fit v6e's HBM (the planner's own `max_layers`), batch 1, 4 and 8, context 4096, the
//!    megakernel in two prefetch variants (same kernel otherwise, same results: tested in
//!    `decode/tests/interpret.rs`): `deep` (what a step runs: a ~24 MiB dense ring and 2
//!    expert chunks in flight) and `single` (at most two chunks in flight per stream, as a
//!    double-buffered Pallas pipeline):
//!    - `floor / mk`: the plain HBM stream's cycles (`Libtpu::floor` on v6e) for the step's
//!      HBM bytes from the plan, over the megakernel's cycles (goal >= 0.85; 1.0 = at the HBM floor);
//!    - `mk / unfused`: the megakernel's cycles over the sum of the unfused library
//!      kernels' cycles for the same step (`palladium_kernels::build` at the model's shapes:
//!      per layer rmsnorm, q/k/v gemv, rope, `kv_cache_update`, `decode_attention`, o gemv,
//!      `residual_add`, rmsnorm, `moe_router`, `expert_ffn`, `residual_add`; times the
//!      layers; plus the final rmsnorm and the `lm_head` gemv; KV kernels at the
//!      megakernel's head size padded to 128 and KV tiles of 1024) (goal <= 0.5).
//! 2. Does the estimate count the traced layer loop? Qwen3-30B-A3B at 1, 2 and 4 layers:
//!    the cycles must grow with the layers.
//! 3. Emission time (plan + trace + verify + lower) of the 94-layer Qwen3-235B-A22B
//!    megakernel, median of 7 (goal < 0.5 s in this release build).
//! 4. Verify steps, alone with `cargo bench --bench megakernel -- tokens` (~10 min, a few
//!    GB): Qwen3-30B-A3B, 8 layers, batch 1, context 4096, v6e, K = 1, 2, 4 and 8 tokens
//!    per sequence, each step at its static worst case (every KV tile, `min(E, K x top_k)`
//!    distinct experts, single prefetch: the variant comparable with the
//!    floor): libtpu's cycles, the step's HBM bytes (dense once, the distinct experts
//!    once, KV), the floor's cycles for those bytes and floor / mk (goal: K = 4 no more
//!    than 0.05 below K = 1); and the expert bytes per step at batch 8 with and without
//!    dedupe (worst case and uniform routing).
//! 5. Several devices, alone with `cargo bench --bench megakernel -- devices` (the plan
//!    only: no compile, seconds): Qwen3-235B-A22B, all 94 layers, on 8 v7x devices, batch
//!    1, 4 and 8, context 4096: per device the HBM bytes a step streams and their floor
//!    time (one TensorCore's HBM bandwidth), and the collectives' bytes sent and their
//!    MODELLED time (the target's measured link figures: libtpu prices remote DMAs at 0).
//! 6. Quantized weights, alone with `cargo bench --bench megakernel -- weights` (4
//!    compiles of minutes each, a few GB): Qwen3-30B-A3B, 8 layers, batch 1, context 4096,
//!    v6e, the same static worst case and single prefetch, bf16, int8, fp8 and int4
//!    weights in the same run: the step's HBM bytes and their ratio to bf16's (expected
//!    ~0.52 int8, ~0.72 fp8), libtpu's cycles and their ratio to bf16's, and floor / mk
//!    (goal: no lower than bf16's).
//!
//! How to read libtpu 0.0.42.1's static estimate (found by probes on the lowered modules):
//! - It prices no loop with a run-time trip count, so every KV loop here has a static one:
//!   the megakernel reads all KV tiles (`KvTiles::All`, masked past the position) and
//!   `decode_attention` runs with `bench_full_context`: both are full-context steps.
//! - It barely prices a DMA started inside an `scf.if` (`gather_rows` probe: 2801 cycles
//!   with no DMA, 3497 with its start and wait under an `if`, 6204 unconditional), so the
//!   megakernel issues every weight DMA unconditionally (software-pipelined loops).
//! - It gives concurrent DMAs each their own bandwidth (Qwen3-30B-A3B, 1 layer: the same
//!   bytes estimate 727k cycles with 2 dense banks, 517k with 3, 338k with 6), while
//!   the floor is a double-buffered stream (one block ahead). So the `deep`
//!   variant can be estimated *below* the floor (ratio above 1.0, an artefact), and the
//!   `single` variant, whose streams have the floor's own shape, is the comparable
//!   number: a lower bound on the deep kernel's efficiency, since it also exposes every
//!   compute phase (attention, routing) that the deep ring runs under.
//! - Its v6e profiler aborts the process ("Unsupported DMA direction: 0 on GL/GLP") with
//!   the KV caches aliased to the outputs once they reach 256 KiB (even with every KV DMA
//!   deleted), and on `kv_cache_update` at the tiny model's shapes: every kernel here is
//!   compiled with its call spec's `input_output_aliases` dropped (a cost-only call spec;
//!   the kernels are unchanged). It also aborts on an explicit DMA of 3, 6 or 12 f32 rows
//!   (fp8/int4 `expert_down_scales` before their rows were padded to 8).
//!
//! The table is also written as JSON to `target/megakernel-bench.json`, and each section's
//! table as the docs book's page `docs/benchmarks/megakernel*.md`.

#[path = "common/doc_table.rs"]
mod doc_table;

use palladium_autotune::Libtpu;
use palladium_dsl::spec::Chip;
use palladium_fusion::emit::emit;
use palladium_fusion::megakernel::Megakernel;
use palladium_fusion::plan::{ExpertFetch, KvTiles, Plan, PlanError, PlanOptions, Prefetch};
use palladium_fusion::unfused::{UnfusedKernel, unfused_kernels};
use palladium_model::ModelSpec;
use serde::Serialize;
use std::path::PathBuf;

const CHIP: Chip = Chip::V6e;
const CONTEXT: u64 = 4096;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Static trip counts, priceable by libtpu: every KV tile, and the worst case of distinct
/// experts (`batch * top_k` here: as many fetches as one per (row, slot)).
fn options(chip: Chip, batch: u64, layers: Option<usize>) -> PlanOptions {
    PlanOptions {
        layers,
        kv_tiles: KvTiles::All,
        expert_fetch: ExpertFetch::WorstCase,
        ..PlanOptions::new(chip, batch, CONTEXT)
    }
}

fn options_ctx(chip: Chip, batch: u64, context: u64, layers: Option<usize>) -> PlanOptions {
    PlanOptions { context, ..options(chip, batch, layers) }
}

/// `plan` with at most two chunks in flight per weight stream (same layers).
fn single(s: &ModelSpec, plan: &Plan) -> Plan {
    let o = PlanOptions {
        prefetch: Prefetch::Single,
        ..options_ctx(CHIP, plan.dims.batch, plan.context, Some(plan.layers))
    };
    Plan::new(s, &o).unwrap_or_else(|e| panic!("{e}"))
}

/// The plan of `name` at `batch`, truncated to the layers that fit `chip` if needed.
/// The cost variant (see [`cycles`]) has no aliases, so the KV outputs need HBM of their own
/// too: layers are dropped until they fit as well.
fn plan_fitting(
    s: &ModelSpec,
    chip: Chip,
    batch: u64,
    context: u64,
    layers: Option<usize>,
) -> Plan {
    let mut p = match Plan::new(s, &options_ctx(chip, batch, context, layers)) {
        Ok(p) => p,
        Err(PlanError::Hbm { max_layers, .. }) => {
            Plan::new(s, &options_ctx(chip, batch, context, Some(max_layers as usize)))
                .unwrap_or_else(|e| panic!("{e}"))
        }
        Err(e) => panic!("{e}"),
    };
    let kv_out = |p: &Plan| {
        p.layout
            .operands
            .iter()
            .filter(|o| o.kind.aliased_input().is_some())
            .map(|o| o.bytes)
            .sum::<u64>()
    };
    while p.layers > 1 && p.hbm_total + kv_out(&p) > p.hbm_capacity {
        p = Plan::new(s, &options_ctx(chip, batch, context, Some(p.layers - 1)))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    p
}

#[derive(Clone, Debug, Serialize)]
struct Row {
    model: String,
    layers: usize,
    batch: u64,
    context: u64,
    chip: String,
    bytes: u64,
    floor: Option<u64>,
    /// The megakernel as it runs (`Prefetch::Deep`) and with at most two chunks in flight per
    /// stream (`Prefetch::Single`).
    megakernel_deep: Option<u64>,
    megakernel_single: Option<u64>,
    /// floor / megakernel
    floor_ratio_deep: Option<f64>,
    floor_ratio_single: Option<f64>,
    unfused: Option<u64>,
    /// megakernel / unfused
    unfused_ratio_deep: Option<f64>,
    unfused_ratio_single: Option<f64>,
    note: String,
}

/// Sum of the unfused kernels' cycles, or why there is none; prints each kernel.
fn unfused_sum(
    libtpu: &Libtpu,
    s: &ModelSpec,
    layers: usize,
    batch: u64,
    context: u64,
) -> Result<(u64, Vec<String>), String> {
    let ks = unfused_kernels(s, layers, batch, context)?;
    let mut built = Vec::new();
    for UnfusedKernel { label, kernel: name, settings, .. } in &ks {
        built.push(
            palladium_kernels::build(name, settings)
                .map_err(|e| format!("{label}: cannot build {name} {settings:?}: {e}"))?,
        );
    }
    let refs: Vec<&palladium_dsl::Kernel> = built.iter().collect();
    let costs = cycles(libtpu, &refs, CHIP);
    let mut total = 0u64;
    let mut missing = Vec::new();
    for (UnfusedKernel { label, times, kernel: name, .. }, c) in ks.iter().zip(costs) {
        match c {
            Ok(c) => {
                println!("    {label:<38} {name:<18} {c:>10} cyc x {times}");
                total += c * times;
            }
            Err(e) => {
                println!(
                    "    {label:<38} {name:<18} no estimate: {}",
                    e.lines().next().unwrap_or("")
                );
                missing.push(label.clone());
            }
        }
    }
    // A kernel libtpu cannot profile is left out of the sum (said in the note): the sum is
    // then a lower bound, and mk / unfused an upper bound.
    if missing.len() == ks.len() {
        Err("no estimate for any unfused kernel".into())
    } else {
        Ok((total, missing))
    }
}

fn floor_cycles(libtpu: &Libtpu, chip: Chip, bytes: u64) -> Result<u64, String> {
    let (cycles, streamed) = libtpu.floor(chip, bytes).map_err(|e| e.to_string())?;
    Ok((cycles as f64 * bytes as f64 / streamed as f64).round() as u64)
}

/// libtpu's cycles for `kernels` (compiled in parallel workers; an abort rejects only the
/// kernel it happened on), each with its call spec's `input_output_aliases` dropped
/// ([`Libtpu::without_aliases`]): a cost-only variant, the kernels are unchanged. With the KV
/// caches aliased to the outputs, libtpu 0.0.42.1's v6e profiler aborts ("Unsupported DMA
/// direction: 0 on GL/GLP") on the megakernel once the aliased caches reach 256 KiB
/// (context > 256 on the tiny model), even with every KV DMA deleted from the module, and
/// on `kv_cache_update` at the tiny model's shapes; without the aliases both profile.
fn cycles(
    libtpu: &Libtpu,
    kernels: &[&palladium_dsl::Kernel],
    chip: Chip,
) -> Vec<Result<u64, String>> {
    libtpu.cycles(kernels, chip).into_iter().map(|c| c.map_err(|e| e.to_string())).collect()
}

/// The megakernels of `plans`: cycles or libtpu's reason. One worker process per
/// megakernel, one at a time: libtpu's estimator walks the traced loops' static trip counts, so a
/// full-size one takes up to ~100 s and ~15 GB (Qwen3-30B-A3B, 23 layers, batch 8), and a
/// process does not give that memory back between compiles.
fn megakernel_cycles(
    libtpu: &Libtpu,
    plans: &[(String, Plan)],
    chip: Chip,
) -> Vec<Result<u64, String>> {
    plans
        .iter()
        .map(|(label, p)| {
            let k = emit(p).unwrap_or_else(|e| panic!("emit {label}: {e}"));
            cycles(libtpu, &[&k], chip).pop().expect("one answer")
        })
        .collect()
}

/// Median and all of 7 emissions of Qwen3-235B-A22B's 94-layer megakernel on `devices` v7x
/// devices (one device: past its HBM, unchecked).
fn emission_time(devices: u64) -> (f64, Vec<f64>) {
    let s = spec("qwen3-235b-a22b");
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = std::time::Instant::now();
        let mk = Megakernel::build(
            &s,
            &PlanOptions { check_hbm: devices > 1, devices, ..options(Chip::V7x, 1, None) },
        )
        .unwrap();
        times.push(t.elapsed().as_secs_f64());
        assert_eq!(mk.plan.layers, 94);
        assert!(mk.lowered.body.contains("stable_mosaic.version"));
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], times)
}

/// Section 4: K tokens per sequence (verify steps) against the HBM floor, and expert dedupe.
fn tokens_per_seq(libtpu: &Libtpu) {
    let s30 = spec("qwen3-30b-a3b");
    let layers = Some(8);
    let plan = |batch: u64, k: u64| {
        let o = PlanOptions {
            tokens_per_seq: k,
            logits: false,
            prefetch: Prefetch::Single,
            ..options(CHIP, batch, layers)
        };
        Plan::new(&s30, &o).unwrap_or_else(|e| panic!("K {k}: {e}"))
    };
    let plans: Vec<(String, Plan)> =
        [1, 2, 4, 8].into_iter().map(|k| (format!("K {k}"), plan(1, k))).collect();
    let mk = megakernel_cycles(libtpu, &plans, CHIP);
    let what = format!(
        "qwen3-30b-a3b, 8 layers, batch 1, context {CONTEXT}, {CHIP}: K tokens per sequence (every KV tile, worst-case distinct experts, single prefetch; libtpu's static estimates)"
    );
    println!("\n== {what} ==");
    let mut table = doc_table::Table::new(
        "| K | distinct experts per layer | HBM bytes (dense, experts, kv) | floor cyc | mk cyc | floor/mk |",
        "|---:|---:|---:|---:|---:|---:|",
    );
    let mut rows = Vec::new();
    for ((label, p), c) in plans.iter().zip(&mk) {
        let t = &p.traffic;
        let (floor, ratio) = floor_and_fraction(libtpu, t.total, c);
        table.row(format!(
            "| {} | {} | {} ({}, {}, {}) | {} | {} | {ratio} |",
            p.dims.tokens_per_seq,
            p.distinct_experts(),
            t.total,
            t.dense + t.lm_head,
            t.experts,
            t.kv_read + t.kv_write,
            show(&floor),
            show(c)
        ));
        rows.push(serde_json::json!({"label": label, "tokens_per_seq": p.dims.tokens_per_seq, "bytes": t.total, "dense": t.dense + t.lm_head, "experts": t.experts, "kv": t.kv_read + t.kv_write, "floor": floor.ok(), "cycles": c.as_ref().ok()}));
    }
    println!("\n== expert bytes per step at batch 8 (qwen3-30b-a3b, 8 layers) ==");
    let mut dedupe = String::new();
    for k in [1, 4] {
        let t = plan(8, k).traffic;
        let line = format!(
            "K {k}: without dedupe {:.3} GB; with dedupe {:.3} GB at the worst case of min(E, 8 x K x top_k) distinct experts, {:.3} GB expected under uniform routing",
            t.experts_without_dedupe as f64 / 1e9,
            t.experts as f64 / 1e9,
            t.experts_uniform_routing / 1e9
        );
        println!("  {line}");
        dedupe.push_str(&format!("- {line}\n"));
    }
    doc_table::write_page(
        "megakernel-tokens.md",
        "Verify steps: K tokens per sequence",
        "cargo bench --bench megakernel -- tokens",
        &format!(
            "{what}.\n\n{}\nExpert bytes per step at batch 8 (8 layers):\n\n{dedupe}",
            table.markdown()
        ),
    );
    let path = target_dir().join("megakernel-tokens-bench.json");
    if std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({"rows": rows})).unwrap_or_default(),
    )
    .is_ok()
    {
        println!("(also in {})", path.display());
    }
}

/// Section 5: Qwen3-235B-A22B over 8 v7x devices, from the plan.
fn devices() {
    let s = spec("qwen3-235b-a22b");
    let what = format!(
        "qwen3-235b-a22b, 94 layers, 8 v7x devices, context {CONTEXT}: per device per step (plan only; collective time is a model)"
    );
    println!("== {what} ==");
    let mut table = doc_table::Table::new(
        "| batch | experts | HBM bytes | HBM floor us | collective bytes sent | collectives us (model) | floor + collectives us | VMEM MiB | HBM GiB held |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    );
    let mut rows = Vec::new();
    for batch in [1, 4, 8] {
        let p = Plan::new(
            &s,
            &PlanOptions {
                devices: 8,
                logits: false,
                ..PlanOptions::new(Chip::V7x, batch, CONTEXT)
            },
        )
        .unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        let sh = p.sharding.as_ref().expect("8 devices are a split");
        let (floor, coll) = (p.traffic.floor_seconds * 1e6, sh.collective_seconds * 1e6);
        table.row(format!(
            "| {batch} | {} | {} | {floor:.1} | {} | {coll:.1} | {:.1} | {:.1} | {:.2} |",
            sh.experts.split.name(),
            p.traffic.total,
            sh.collective_bytes,
            floor + coll,
            p.vmem_total as f64 / (1u64 << 20) as f64,
            p.hbm_total as f64 / (1u64 << 30) as f64
        ));
        rows.push(serde_json::json!({"batch": batch, "experts": sh.experts.split.name(), "hbm_bytes": p.traffic.total, "floor_seconds": p.traffic.floor_seconds, "collective_bytes": sh.collective_bytes, "collective_seconds": sh.collective_seconds, "vmem_bytes": p.vmem_total, "hbm_held_bytes": p.hbm_total, "link_model": sh.link_model}));
    }
    let (median, times) = emission_time(8);
    let emission = format!(
        "emission (plan + trace + verify + lower) of the 8-device program: median {median:.3} s over {} runs: {}",
        times.len(),
        times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>().join(" ")
    );
    println!("{emission}");
    doc_table::write_page(
        "megakernel-devices.md",
        "Several devices: Qwen3-235B-A22B on 8 v7x devices",
        "cargo bench --bench megakernel -- devices",
        &format!("{what}.\n\n{}\nThe {emission} (wall time).\n", table.markdown()),
    );
    let path = target_dir().join("megakernel-devices-bench.json");
    if std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({"rows": rows})).unwrap_or_default(),
    )
    .is_ok()
    {
        println!("(also in {})", path.display());
    }
}

/// Section 6: bf16, int8, fp8 and int4 weights against the HBM floor, in one run.
fn weights(libtpu: &Libtpu) {
    use palladium_model::quant::WeightsDtype;
    let s30 = spec("qwen3-30b-a3b");
    let dtypes = [WeightsDtype::Bf16, WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4];
    let plans: Vec<(String, Plan)> = dtypes
        .iter()
        .map(|&weights| {
            let o = PlanOptions {
                logits: false,
                prefetch: Prefetch::Single,
                weights,
                ..options(CHIP, 1, Some(8))
            };
            (
                weights.name().to_string(),
                Plan::new(&s30, &o).unwrap_or_else(|e| panic!("{}: {e}", weights.name())),
            )
        })
        .collect();
    let mk = megakernel_cycles(libtpu, &plans, CHIP);
    let what = format!(
        "qwen3-30b-a3b, 8 layers, batch 1, context {CONTEXT}, {CHIP}: weights dtype (every KV tile, worst-case distinct experts, single prefetch; libtpu's static estimates)"
    );
    println!("\n== {what} ==");
    let mut table = doc_table::Table::new(
        "| weights | HBM bytes per step | bytes / bf16 | by dtype | floor cyc | mk cyc | mk / bf16 | floor/mk |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    );
    let (bf16_bytes, bf16_cycles) = (plans[0].1.traffic.total, mk[0].as_ref().ok().copied());
    let mut rows = Vec::new();
    for ((label, p), c) in plans.iter().zip(&mk) {
        let t = &p.traffic;
        let (floor, ratio) = floor_and_fraction(libtpu, t.total, c);
        let vs_bf16 = match (c, bf16_cycles) {
            (Ok(c), Some(b)) => format!("{:.3}", *c as f64 / b as f64),
            _ => "-".into(),
        };
        let by_dtype = t.by_dtype.as_ref().map_or("bf16".into(), |parts| {
            parts
                .iter()
                .map(|(d, b)| format!("{d} {:.3} GB", *b as f64 / 1e9))
                .collect::<Vec<_>>()
                .join(", ")
        });
        table.row(format!(
            "| {label} | {} | {:.3} | {by_dtype} | {} | {} | {vs_bf16} | {ratio} |",
            t.total,
            t.total as f64 / bf16_bytes as f64,
            show(&floor),
            show(c)
        ));
        rows.push(serde_json::json!({"weights": label, "bytes": t.total, "bytes_by_dtype": t.by_dtype, "floor": floor.ok(), "cycles": c.as_ref().ok()}));
    }
    doc_table::write_page(
        "megakernel-weights.md",
        "Quantized weights: the megakernel's step by weights dtype",
        "cargo bench --bench megakernel -- weights",
        &format!("{what}.\n\n{}", table.markdown()),
    );
    let path = target_dir().join("megakernel-weights-bench.json");
    if std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({"rows": rows})).unwrap_or_default(),
    )
    .is_ok()
    {
        println!("(also in {})", path.display());
    }
}

/// libtpu's floor cycles for `bytes` (at [`CHIP`]) and floor / `mk` as text ("-" where either
/// has no estimate).
fn floor_and_fraction(
    libtpu: &Libtpu,
    bytes: u64,
    mk: &Result<u64, String>,
) -> (Result<u64, String>, String) {
    let floor = floor_cycles(libtpu, CHIP, bytes);
    let ratio = match (&floor, mk) {
        (Ok(f), Ok(c)) => format!("{:.3}", *f as f64 / *c as f64),
        _ => "-".into(),
    };
    (floor, ratio)
}

/// A cycle count, or why libtpu gave none (its error's first line).
fn show(r: &Result<u64, String>) -> String {
    r.as_ref().map_or_else(
        |e| format!("no estimate ({})", e.lines().next().unwrap_or("")),
        |v| v.to_string(),
    )
}

/// libtpu with the KV aliases dropped from the call spec (see the module docs), or exit
/// with its error.
fn libtpu_without_aliases() -> Libtpu {
    Libtpu::new()
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        })
        .without_aliases()
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    if benching && std::env::args().skip(1).any(|a| a == "devices") {
        devices();
        return;
    }
    if benching && std::env::args().skip(1).any(|a| a == "weights") {
        weights(&libtpu_without_aliases());
        return;
    }
    if benching && std::env::args().skip(1).any(|a| a == "tokens") {
        tokens_per_seq(&libtpu_without_aliases());
        return;
    }
    let (median, times) = emission_time(1);
    println!(
        "== emission (plan + trace + verify + lower) of qwen3-235b-a22b, 94 layers, v7x, batch 1, context {CONTEXT} =="
    );
    println!(
        "median {median:.3} s over {} runs: {}",
        times.len(),
        times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>().join(" ")
    );
    if !benching {
        return;
    }
    let libtpu = libtpu_without_aliases();

    // 2. Layer scaling first: it says whether the ratios below mean anything.
    let s30 = spec("qwen3-30b-a3b");
    let tiny = spec("tiny-qwen3-moe");
    println!("\n== does libtpu's estimate count the traced layer loop? batch 1, {CHIP} ==");
    let mut scaling: Vec<(String, Plan)> = Vec::new();
    for n in [1usize, 2, 4] {
        scaling.push((
            format!("tiny-qwen3-moe ctx 256, {n} layers"),
            plan_fitting(&tiny, CHIP, 1, 256, Some(n)),
        ));
    }
    for n in [1usize, 2, 4] {
        scaling.push((
            format!("qwen3-30b-a3b ctx {CONTEXT}, {n} layers"),
            plan_fitting(&s30, CHIP, 1, CONTEXT, Some(n)),
        ));
    }
    let sc = megakernel_cycles(&libtpu, &scaling, CHIP);
    for ((label, p), c) in scaling.iter().zip(&sc) {
        println!(
            "  {label}: {} B per step, {}",
            p.traffic.total,
            c.as_ref().map_or_else(|e| format!("no estimate: {e}"), |c| format!("{c} cycles"))
        );
    }

    // 1. The table.
    let mut cases: Vec<(String, &ModelSpec, Plan)> = Vec::new();
    for batch in [1, 4, 8] {
        cases.push((
            "tiny-qwen3-moe".into(),
            &tiny,
            plan_fitting(&tiny, CHIP, batch, CONTEXT, None),
        ));
    }
    for batch in [1, 4, 8] {
        cases.push(("qwen3-30b-a3b".into(), &s30, plan_fitting(&s30, CHIP, batch, CONTEXT, None)));
    }
    let mut plans: Vec<(String, Plan)> = Vec::new();
    for (n, s, p) in &cases {
        plans.push((format!("{n} deep"), p.clone()));
        plans.push((format!("{n} single"), single(s, p)));
    }
    let mut mk = megakernel_cycles(&libtpu, &plans, CHIP).into_iter();
    let mut rows = Vec::new();
    for (name, s, p) in &cases {
        let (deep, single) = (mk.next().expect("deep"), mk.next().expect("single"));
        println!(
            "\n== {name}, {} layers, batch {}, context {}, {CHIP}: unfused kernels ==",
            p.layers, p.dims.batch, p.context
        );
        let bytes = p.traffic.total;
        let floor = floor_cycles(&libtpu, CHIP, bytes);
        let unfused = unfused_sum(&libtpu, s, p.layers, p.dims.batch, p.context);
        let mut notes = Vec::new();
        for (what, r) in [("deep", &deep), ("single", &single)] {
            if let Err(e) = r {
                notes.push(format!("megakernel {what}: {e}"));
            }
        }
        if let Err(e) = &floor {
            notes.push(format!("floor: {e}"));
        }
        match &unfused {
            Err(e) => notes.push(format!("unfused: {e}")),
            Ok((_, missing)) if !missing.is_empty() => notes
                .push(format!("unfused sum without {} (libtpu aborts on it)", missing.join(", "))),
            Ok(_) => {}
        }
        let (deep, single, floor) = (deep.ok(), single.ok(), floor.ok());
        let unfused = unfused.ok().map(|u| u.0);
        let ratio = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a as f64 / b as f64);
        rows.push(Row {
            model: name.clone(),
            layers: p.layers,
            batch: p.dims.batch,
            context: p.context,
            chip: CHIP.name().into(),
            bytes,
            floor,
            megakernel_deep: deep,
            megakernel_single: single,
            floor_ratio_deep: ratio(floor, deep),
            floor_ratio_single: ratio(floor, single),
            unfused,
            unfused_ratio_deep: ratio(deep, unfused),
            unfused_ratio_single: ratio(single, unfused),
            note: notes.join("; "),
        });
    }

    let what = "libtpu 0.0.42.1 static estimates, deviceless, full-context steps at context 4096 on v6e; floor/mk: 1.0 = at the HBM floor, goal >= 0.85; mk/unfused: goal <= 0.5; deep = as run, single = at most two chunks in flight per stream, the variant comparable with the floor";
    println!("\n== summary ({what}) ==");
    let mut table = doc_table::Table::new(
        "| model | layers | batch | bytes | floor cyc | mk cyc deep / single | floor/mk deep / single | unfused sum cyc | mk/unfused deep / single |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    let o = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let r = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for row in &rows {
        table.row(format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} | {} | {} / {} |",
            row.model,
            row.layers,
            row.batch,
            row.bytes,
            o(row.floor),
            o(row.megakernel_deep),
            o(row.megakernel_single),
            r(row.floor_ratio_deep),
            r(row.floor_ratio_single),
            o(row.unfused),
            r(row.unfused_ratio_deep),
            r(row.unfused_ratio_single)
        ));
    }
    let mut notes = String::new();
    for row in rows.iter().filter(|r| !r.note.is_empty()) {
        let note = format!(
            "{} L{} b{} ctx {}: {}",
            row.model, row.layers, row.batch, row.context, row.note
        );
        println!("  {note}");
        notes.push_str(&format!("- {note}\n"));
    }
    let emission =
        format!("emission of qwen3-235b-a22b (94 layers): median {median:.3} s (goal < 0.5 s)");
    println!("{emission}");
    doc_table::write_page(
        "megakernel.md",
        "Decode megakernel: against the HBM floor and the unfused kernels",
        "cargo bench --bench megakernel",
        &format!(
            "{what}.\n\n{}{}{notes}\nThe {emission} (wall time, release build).\n",
            table.markdown(),
            if notes.is_empty() { "" } else { "\n" }
        ),
    );
    let json = serde_json::json!({"rows": rows, "emission_seconds": times, "emission_median_seconds": median,
        "layer_scaling": scaling.iter().zip(&sc).map(|((l, p), c)| serde_json::json!({"layers": p.layers, "label": l, "bytes": p.traffic.total, "cycles": c.as_ref().ok()})).collect::<Vec<_>>()});
    let path = target_dir().join("megakernel-bench.json");
    if std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap_or_default()).is_ok() {
        println!("(also in {})", path.display());
    }
}
