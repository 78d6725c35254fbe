//! `cargo bench --bench autotune`: sweep the tiled matmul's block sizes with the
//! compile-only runner on v6e and v7x, print the table and the best candidate, and time the
//! sweep itself (build + verify + traffic model per candidate).
//!
//! The cycle column is the roofline *model* of `palladium_autotune::model`, not a
//! measurement: it ranks candidates by modelled HBM traffic, MXU work and grid-step count.
//! The full reports are also written as JSON to `target/tmp/autotune-matmul-<chip>.json`,
//! and a full run (`--bench`) writes the sweeps as the docs book's page
//! `docs/benchmarks/autotune.md`.
//!
//! `PALLADIUM_AUTOTUNE_RUNNER=libtpu` also costs the v6e sweep with the libtpu runner
//! ([`Libtpu`]: libtpu 0.0.42.1's static cycle estimates, deviceless, through PJRT in
//! parallel worker processes), prints
//! its table and compares the two rankings: Spearman rank correlation over the candidates
//! both costed, top-1 agreement, and where each runner's best lands in the other's ranking.
//! (v7x is skipped there: libtpu reports no cycles on v7x.)

#[path = "common/doc_table.rs"]
mod doc_table;

use palladium_autotune::{ChipModel, CompileOnly, Libtpu, SearchReport, SearchSpace, search};
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

    let mut summary = doc_table::Table::new(
        "| chip | candidates | rejected | best (model) | modeled cycles | sweep median ms |",
        "|---|---:|---:|---|---:|---:|",
    );
    let mut sweeps = String::new();
    for chip in [Chip::V6e, Chip::V7x] {
        let c = ChipModel::of(chip);
        let title = format!(
            "matmul {m}x{k}x{n} bf16 on {chip} ({} candidates, compile-only runner)",
            space.len()
        );
        let model = format!(
            "model: {:.0} GB/s HBM, {:.0} TFLOP/s bf16, {:.2} GHz assumed, {:.0} cycles/step overhead",
            c.hbm_bytes_per_s / 1e9,
            c.mxu_bf16_flops_per_s / 1e12,
            c.clock_hz / 1e9,
            c.per_step_overhead_cycles()
        );
        println!("== {title} ==\n   {model}");
        let report =
            search(&space, chip, &mut CompileOnly::new()).unwrap_or_else(|e| panic!("{e}"));
        print!("{}", report.table());
        sweeps.push_str(&format!("## {title}\n\n{model}.\n\n```text\n{}```\n\n", report.table()));
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
        let (budget, max_reps) =
            if benching { (Duration::from_secs(1), 200) } else { (Duration::ZERO, 1) };
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
        let best = report.best().and_then(|b| Some((b.candidate.to_string(), b.cost()?.cycles)));
        summary.row(format!(
            "| {chip} | {} | {} | {} | {} | {:.2} |",
            report.results.len(),
            report.rejected().count(),
            best.as_ref().map_or("none".to_string(), |b| b.0.clone()),
            best.map_or("-".to_string(), |b| format!("{:.0}", b.1)),
            median.as_secs_f64() * 1e3
        ));

        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("autotune-matmul-{chip}.json"));
        if let Err(e) = std::fs::write(&path, report.to_json()) {
            println!("(could not write {}: {e})", path.display());
        }

        if chip == Chip::V6e
            && std::env::var("PALLADIUM_AUTOTUNE_RUNNER").as_deref() == Ok("libtpu")
        {
            let mut libtpu =
                Libtpu::new().unwrap_or_else(|e| panic!("PALLADIUM_AUTOTUNE_RUNNER=libtpu: {e}"));
            let t0 = Instant::now();
            let measured = search(&space, chip, &mut libtpu).unwrap_or_else(|e| panic!("{e}"));
            println!(
                "== the same sweep on {chip}, libtpu runner (static LLO estimates, deviceless, parallel PJRT workers; {:.1} s) ==",
                t0.elapsed().as_secs_f64()
            );
            print!("{}", measured.table());
            let ranking = compare_rankings(&report, &measured);
            println!("{ranking}");
            sweeps.push_str(&format!(
                "## The same sweep on {chip}, libtpu runner (static estimates)\n\n```text\n{}```\n\n{ranking}\n\n",
                measured.table()
            ));
            let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("autotune-matmul-{chip}-libtpu.json"));
            if let Err(e) = std::fs::write(&path, measured.to_json()) {
                println!("(could not write {}: {e})", path.display());
            }
            println!();
        }
    }
    if benching {
        let command = if std::env::var("PALLADIUM_AUTOTUNE_RUNNER").as_deref() == Ok("libtpu") {
            "PALLADIUM_AUTOTUNE_RUNNER=libtpu cargo bench --bench autotune"
        } else {
            "cargo bench --bench autotune"
        };
        doc_table::write_page(
            "autotune.md",
            "Autotune: the matmul block sweep",
            command,
            &format!(
                "The cycles are the roofline *model* of `palladium_autotune::model` (libtpu's \
                 static estimates where a libtpu sweep says so), not measurements.\n\n{}\n{sweeps}",
                summary.markdown()
            ),
        );
    }
}

/// Ranks (1 = best) with ties averaged, of `values`.
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut r = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &o in &order[i..=j] {
            r[o] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rho: Pearson correlation of the ranks.
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// How the static model's ranking compares with libtpu's, as one line.
fn compare_rankings(model: &SearchReport, measured: &SearchReport) -> String {
    let both: Vec<(usize, f64, f64)> = model
        .results
        .iter()
        .zip(&measured.results)
        .filter_map(|(a, b)| Some((a.candidate.index, a.cost()?.cycles, b.cost()?.cycles)))
        .collect();
    if both.len() < 2 {
        return "ranking comparison: fewer than 2 candidates costed by both runners".into();
    }
    let (m, l): (Vec<f64>, Vec<f64>) = both.iter().map(|&(_, a, b)| (a, b)).unzip();
    let rho = spearman(&m, &l);
    let best_of = |v: &[f64]| {
        (0..v.len()).min_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b))).expect("non-empty")
    };
    let (bm, bl) = (best_of(&m), best_of(&l));
    let (rm, rl) = (ranks(&m), ranks(&l));
    let name = |i: usize| model.results[both[i].0].candidate.to_string();
    format!(
        "ranking: static model vs libtpu over {} candidates: Spearman rho = {rho:.3}; top-1 {} (model's best {} is libtpu's #{:.0} at {:.0} cycles, {:.3}x libtpu's best; libtpu's best {} at {:.0} cycles is the model's #{:.0})",
        both.len(),
        if bm == bl { "agrees" } else { "differs" },
        name(bm),
        rl[bm],
        l[bm],
        l[bm] / l[bl],
        name(bl),
        l[bl],
        rm[bl],
    )
}
