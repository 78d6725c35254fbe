//! `cargo bench --bench compile`: wall time of libtpu compiles, in one run.
//!
//! 1. The library matmul (1024x2048x1024, blocks 256x512x256) compiled deviceless for v6e
//!    with libtpu's static cycle estimate, from its serialized body:
//!    - ours: `palladium-runtime` (PJRT in a worker process): `cold` = a fresh worker
//!      (process start + libtpu load + topology + compile + estimate), the whole of what
//!      `palladium compile` pays; `warm` = the median compile + estimate of further jobs
//!      in the same worker, timed in the worker;
//!    - JAX: the same body and call spec through JAX 0.10.2 (`scripts/jax_reference.py
//!      compile-time`: `palladium_jax.load`, `jit(...).lower(...).compile()` on the
//!      topology): `cold` = the whole Python process (interpreter, JAX import, libtpu
//!      start, first compile), `warm` = its median steady compile;
//!    - both must agree on the cycles (46041).
//! 2. The autotune sweep of `benches/autotune.rs` on v6e (36 matmul block candidates,
//!    libtpu runner: parallel workers, one per core): wall time.
//!
//! Machine-dependent numbers: compare the ratios measured in the same run. A full run
//! (`--bench`) also writes the docs book's page `docs/benchmarks/compile.md`.

#[path = "common/doc_table.rs"]
mod doc_table;
#[path = "common/jax.rs"]
mod jax;

use palladium_autotune::{Libtpu, SearchSpace, search};
use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerOptions, lower};
use palladium_runtime::{CallSpec, Compiler, Estimate, Job, wrap};
use std::time::Instant;

const CHIP: Chip = Chip::V6e;

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let warm_runs = if benching { 5 } else { 1 };
    let kernel = palladium_kernels::build("matmul", &[]).unwrap_or_else(|e| panic!("{e}"));
    let lowered = lower(&kernel, &LowerOptions { chip: CHIP }).unwrap_or_else(|e| panic!("{e}"));
    let spec = CallSpec::from_json(&lowered.call_json).unwrap();
    let job = Job { program: wrap(&lowered.body, &spec).unwrap(), chip: CHIP, serialize: false };
    let compiler = Compiler::new(Estimate::Yes).unwrap_or_else(|e| panic!("{e}")).with_workers(1);

    println!(
        "== 1. matmul 1024x2048x1024 bf16 (256x512x256) on {CHIP}: compile + libtpu's static estimate =="
    );
    // Untimed: brings libtpu (hundreds of MB) into the page cache, which JAX's process then
    // also finds there; a cold disk read would dominate whichever side came first.
    compiler.compile(&job).unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let first = compiler.compile(&job).unwrap_or_else(|e| panic!("{e}"));
    let ours_cold = t.elapsed().as_secs_f64();
    // One worker compiles 1 + warm_runs jobs; the warm ones are timed in the worker.
    let results = compiler.compile_all(&vec![job.clone(); 1 + warm_runs]);
    let mut warm: Vec<f64> = Vec::new();
    for r in &results {
        let c = r.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.estimated_cycles, first.estimated_cycles, "the estimate is deterministic");
        warm.push(c.compile_seconds);
    }
    let mut warm = warm.split_off(1);
    warm.sort_by(f64::total_cmp);
    let ours_warm = warm[warm.len() / 2];
    let cycles = first.estimated_cycles.expect("v6e estimates the matmul");

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-bench");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let (body, call) = (dir.join("matmul.body.mlir"), dir.join("matmul.call.json"));
    std::fs::write(&body, &lowered.body).expect("write the body");
    std::fs::write(&call, &lowered.call_json).expect("write the call spec");
    let t = Instant::now();
    let theirs = jax::jax_reference(&[
        "compile-time",
        body.to_str().unwrap(),
        call.to_str().unwrap(),
        "--chip",
        CHIP.name(),
        "--repeat",
        &warm_runs.to_string(),
    ]);
    let jax_cold = t.elapsed().as_secs_f64();
    let mut table = doc_table::Table::new(
        &format!(
            "| matmul on {CHIP} | cold: new process to estimate (s) | warm: one more compile + estimate (s) | cycles |"
        ),
        "|---|---:|---:|---:|",
    );
    table.row(format!(
        "| ours (`palladium-runtime`, a PJRT worker) | {ours_cold:.3} | {ours_warm:.3} | {cycles} |"
    ));
    let mut notes = String::new();
    match theirs {
        Ok(j) => {
            let jax_warm =
                j["steady_s"].as_f64().or_else(|| j["first_s"].as_f64()).unwrap_or(f64::NAN);
            let jax_cycles = j["estimated_cycles"].as_u64();
            table.row(format!(
                "| through JAX {} (one Python process) | {jax_cold:.3} | {jax_warm:.3} | {} |",
                j["jax"].as_str().unwrap_or("?"),
                jax_cycles.map_or("-".into(), |c| c.to_string())
            ));
            let speedup = format!(
                "speed-up (JAX / ours): cold {:.1}x, warm {:.1}x",
                jax_cold / ours_cold,
                jax_warm / ours_warm
            );
            println!("{speedup}");
            notes.push_str(&format!("{speedup}.\n\n"));
            assert_eq!(jax_cycles, Some(cycles), "JAX and the runtime disagree on the cycles");
        }
        Err(e) => {
            println!("JAX: {e}");
            notes.push_str("JAX: not measured (no TPU venv).\n\n");
        }
    }

    println!("\n== 2. autotune sweep, matmul 1024x2048x1024 on {CHIP}, libtpu runner ==");
    let space = SearchSpace::new("matmul")
        .fixed("m", 1024)
        .fixed("k", 2048)
        .fixed("n", 1024)
        .param("bm", [128, 256, 512])
        .param("bk", [256, 512, 1024, 2048])
        .param("bn", [128, 256, 512]);
    let mut libtpu = Libtpu::new().unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let report = search(&space, CHIP, &mut libtpu).unwrap_or_else(|e| panic!("{e}"));
    let sweep = t.elapsed().as_secs_f64();
    let best = report
        .best()
        .and_then(|b| b.cost().map(|c| format!("{} at {:.0} cycles", b.candidate, c.cycles)))
        .unwrap_or_else(|| "none".into());
    let sweep = format!(
        "{} candidates ({} costed) in {sweep:.1} s with up to {} workers; best {best}",
        space.len(),
        report.results.iter().filter(|r| r.cost().is_some()).count(),
        libtpu.workers()
    );
    println!("{sweep}");
    if benching {
        doc_table::write_page(
            "compile.md",
            "Compile speed",
            "cargo bench --bench compile",
            &format!(
                "Wall time of the matmul 1024x2048x1024 (256x512x256) compiled deviceless for \
                 {CHIP} with libtpu's static estimate.\n\n{}\n{notes}The autotune sweep \
                 (matmul block candidates on {CHIP}, libtpu runner): {sweep}.\n",
                table.markdown()
            ),
        );
    }
}
