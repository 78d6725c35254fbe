//! `cargo bench --bench autotune`: sweep the tiled matmul's block sizes with the
//! compile-only runner on v6e and v7x, print the table and the best candidate, and time the
//! sweep itself (build + verify + traffic model per candidate).
//!
//! The cycle column is the roofline *model* of `palladium_autotune::model`, not a
//! measurement: it ranks candidates by modelled HBM traffic, MXU work and grid-step count.
//! The full reports are also written as JSON to `target/tmp/autotune-matmul-<chip>.json`.

use palladium_autotune::{ChipModel, CompileOnly, SearchSpace, search};
use palladium_dsl::spec::Chip;
use std::time::{Duration, Instant};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then time one sweep
    // only, to keep the test run short.
    let benching = std::env::args().any(|a| a == "--bench");
    let (m, k, n) = (1024, 2048, 1024);
    let space = SearchSpace::new("matmul")
        .fixed("m", m)
        .fixed("k", k)
        .fixed("n", n)
        .param("bm", [128, 256, 512])
        .param("bk", [256, 512, 1024, 2048])
        .param("bn", [128, 256, 512]);

    for chip in [Chip::V6e, Chip::V7x] {
        let c = ChipModel::of(chip);
        println!(
            "== matmul {m}x{k}x{n} bf16 on {chip} ({} candidates, compile-only runner) ==\n   model: {:.0} GB/s HBM, {:.0} TFLOP/s bf16, {:.2} GHz assumed, {:.0} cycles/step overhead",
            space.len(),
            c.hbm_bytes_per_s / 1e9,
            c.mxu_bf16_flops_per_s / 1e12,
            c.clock_hz / 1e9,
            c.per_step_overhead_cycles()
        );
        let report = search(&space, chip, &mut CompileOnly::new()).unwrap_or_else(|e| panic!("{e}"));
        print!("{}", report.table());
        match report.best() {
            Some(best) => {
                let cost = best.cost().expect("ranked candidates are costed");
                let t = cost.traffic.as_ref().expect("the compile-only runner reports traffic");
                println!(
                    "best: {}  ({:.0} modeled cycles = {:.1} us at the assumed clock; HBM {:.2} MB, {} steps, VMEM {:.2} MiB, {}-bound)",
                    best.candidate,
                    cost.cycles,
                    cost.cycles / c.clock_hz * 1e6,
                    t.hbm_bytes() as f64 / 1e6,
                    t.grid_steps,
                    t.vmem_bytes as f64 / (1u64 << 20) as f64,
                    cost.model.map_or("?", |m| m.bound),
                );
            }
            None => println!("best: none (every candidate rejected)"),
        }
        println!("rejected: {} of {}", report.rejected().count(), report.results.len());

        // Time the sweep: repeat until ~1 s has passed (at most 200 sweeps) when benching.
        let (budget, max_reps) = if benching { (Duration::from_secs(1), 200) } else { (Duration::ZERO, 1) };
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < max_reps && (times.is_empty() || start.elapsed() < budget) {
            let t0 = Instant::now();
            let r = search(&space, chip, &mut CompileOnly::new()).unwrap_or_else(|e| panic!("{e}"));
            times.push(t0.elapsed());
            assert_eq!(r, report, "the sweep is deterministic");
        }
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "sweep time: median {:.2} ms over {} sweeps (min {:.2} ms) = {:.0} candidates/s\n",
            median.as_secs_f64() * 1e3,
            times.len(),
            times[0].as_secs_f64() * 1e3,
            space.len() as f64 / median.as_secs_f64()
        );

        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("autotune-matmul-{chip}.json"));
        if let Err(e) = std::fs::write(&path, report.to_json()) {
            println!("(could not write {}: {e})", path.display());
        }
    }
}
