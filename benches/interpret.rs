//! `cargo bench --bench interpret`: our interpreter (the serialized Mosaic body run by
//! `palladium_interpret`) against JAX Pallas's interpret mode (`interpret=True`, jit-compiled,
//! on XLA:CPU) on the same tiled matmul and sizes, and the tiny decode megakernels' tokens
//! per second, all from one run.
//!
//! Matmul, ours: the first call (build, lower, parse, prepare, run: everything from the
//! kernel to its first result), then the median of N `Program::run` calls on the rayon pool
//! (`RAYON_NUM_THREADS`, default one thread per core). JAX: `benches/pallas_interpret.py`
//! with `$PALLADIUM_TPU_VENV/bin/python` (default `~/.cache/palladium/venv-tpu`),
//! `JAX_PLATFORMS=cpu`; its first call (trace, compile, run), then the median of N calls with
//! `block_until_ready`. Without the venv only our side is timed.
//!
//! Megakernels: `palladium run` of the tiny Qwen3-MoE and Mixtral fixtures (random weights,
//! seed 0, a 5-token prompt, 8 steps: 12 megakernel runs); tokens per second = runs / time
//! spent in the interpreter (the prepare is timed apart), the best of N. With
//! `PALLADIUM_BEFORE_BIN=path/to/palladium` (a build of an older commit), the same run of
//! that binary is timed alternately with ours, for before/after ratios from one run.
//!
//! `cargo bench --bench interpret -- matmul` (or `megakernel`) runs only that part; a full
//! run (`--bench`, no part named) also writes the docs book's page
//! `docs/benchmarks/interpret.md`.

#[path = "common/doc_table.rs"]
mod doc_table;

use palladium::check::{Backend, prepare};
use palladium::run::{Drafts, RunOptions, WeightSource, run};
use palladium_dsl::spec::Chip;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Case {
    m: usize,
    k: usize,
    n: usize,
    bm: usize,
    bk: usize,
    bn: usize,
}

/// Seconds: the first call and the median of the steady-state runs.
struct Timing {
    first: f64,
    median: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ours(c: &Case, runs: usize) -> Timing {
    let settings: Vec<(String, String)> =
        [("m", c.m), ("k", c.k), ("n", c.n), ("bm", c.bm), ("bk", c.bk), ("bn", c.bn)]
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
    let entry = palladium_kernels::entry("matmul").unwrap_or_else(|e| panic!("{e}"));
    let inputs = (entry.inputs)(&settings, 0).unwrap_or_else(|e| panic!("{e}"));
    let t = Instant::now();
    let (_, _, program, _) =
        prepare("matmul", &settings, Chip::V6e).unwrap_or_else(|e| panic!("{e}"));
    std::hint::black_box(program.run(&inputs).unwrap_or_else(|e| panic!("{e}")));
    let first = t.elapsed().as_secs_f64();
    let median = median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(program.run(&inputs).unwrap());
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    Timing { first, median }
}

fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/palladium/venv-tpu")
    });
    venv.join("bin/python")
}

/// The number after `"key": ` in the script's JSON line.
fn field(line: &str, key: &str) -> Result<f64, String> {
    let key = format!("\"{key}\": ");
    let start = line.find(&key).ok_or_else(|| format!("unexpected output: {line}"))? + key.len();
    line[start..]
        .split([',', '}'])
        .next()
        .and_then(|x| x.trim().parse().ok())
        .ok_or_else(|| format!("unexpected output: {line}"))
}

/// JAX's timing, or why JAX was not timed.
fn jax(c: &Case, runs: usize) -> Result<Timing, String> {
    let py = venv_python();
    if !py.is_file() {
        return Err(format!(
            "JAX side skipped: no oracle venv at {} (set PALLADIUM_TPU_VENV or run scripts/setup.sh)",
            py.display()
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pallas_interpret.py");
    let arg = |n: &str, v: usize| [format!("--{n}"), v.to_string()];
    let args: Vec<String> = [
        arg("m", c.m),
        arg("k", c.k),
        arg("n", c.n),
        arg("bm", c.bm),
        arg("bk", c.bk),
        arg("bn", c.bn),
        arg("runs", runs),
    ]
    .concat();
    let out = Command::new(&py)
        .arg(&script)
        .args(&args)
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("JAX side failed:\n{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    let line = stdout.lines().last().unwrap_or("");
    // `compile_s` is the script's first call: trace, compile and run.
    Ok(Timing { first: field(line, "compile_s")?, median: field(line, "median_s")? })
}

const PROMPT: [u32; 5] = [1, 17, 300, 42, 5];
const STEPS: usize = 8;

/// Tokens per second of one `palladium run` of a tiny fixture in this process.
fn megakernel(config: &str) -> Result<(usize, f64), String> {
    let o = RunOptions {
        config: Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/models").join(config),
        weights: WeightSource::Random(0),
        prompt: PROMPT.to_vec(),
        steps: STEPS,
        chip: Chip::V6e,
        context: None,
        check: false,
        tokens_per_seq: 1,
        drafts: Drafts::None,
        // The full logits, as the binary before them returned.
        logits: true,
        weights_dtype: None,
        devices: 1,
    };
    let out = run(&o, Backend::Interpret, |_, _| {})?;
    Ok((out.runs, out.runs as f64 / out.interpret.as_secs_f64()))
}

/// Tokens per second of the same run by another `palladium` binary (`PALLADIUM_BEFORE_BIN`,
/// e.g. a build of the commit before a change), from its summary line ("12 runs (…)
/// interpreted in 0.51 s").
fn megakernel_before(bin: &Path, config: &str) -> Result<f64, String> {
    let prompt = PROMPT.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/models").join(config);
    let out = Command::new(bin)
        .arg("run")
        .arg(&fixture)
        .args([
            "--random-weights",
            "--seed",
            "0",
            "--prompt-ids",
            &prompt,
            "--steps",
            &STEPS.to_string(),
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let line = text
        .lines()
        .find(|l| l.contains(" interpreted in "))
        .ok_or_else(|| format!("{} printed no summary:\n{text}", bin.display()))?;
    let runs: f64 = line
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected summary: {line}"))?;
    let time = line
        .split(" interpreted in ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|x| x.parse::<f64>().ok())
        .ok_or_else(|| format!("unexpected summary: {line}"))?;
    let seconds =
        if line.contains(&format!("interpreted in {time} ms")) { time / 1e3 } else { time };
    Ok(runs / seconds)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then one run each.
    let benching = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench interpret -- matmul` (or `megakernel`): only that part.
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted =
        |part: &str| filters.is_empty() || filters.iter().any(|f| part.contains(f.as_str()));
    let runs = if benching { 7 } else { 1 };
    println!("rayon pool: {} threads", rayon::current_num_threads());
    let cases = [
        Case { m: 1024, k: 2048, n: 1024, bm: 256, bk: 512, bn: 256 },
        Case { m: 256, k: 512, n: 256, bm: 128, bk: 256, bn: 128 },
    ];
    let mut matmuls = doc_table::Table::new(
        "| matmul bf16 | blocks | ours steady | JAX steady | JAX / ours | ours first call | JAX first call | JAX / ours |",
        "|---|---|---|---|---|---|---|---|",
    );
    for c in cases.iter().filter(|_| wanted("matmul")) {
        println!(
            "== matmul {}x{}x{} bf16, blocks {}x{}x{}, grid ({}, {}, {}), median of {runs} ==",
            c.m,
            c.k,
            c.n,
            c.bm,
            c.bk,
            c.bn,
            c.m / c.bm,
            c.n / c.bn,
            c.k / c.bk
        );
        let us = ours(c, runs);
        println!(
            "   palladium interpret (serialized body): steady {:>9.3} ms   first call (lower + parse + prepare + run) {:>9.3} ms",
            us.median * 1e3,
            us.first * 1e3
        );
        let (shape, blocks) =
            (format!("{}x{}x{}", c.m, c.k, c.n), format!("{}x{}x{}", c.bm, c.bk, c.bn));
        let ms = |s: f64| format!("{:.2} ms", s * 1e3);
        let jax_time = jax(c, runs);
        matmuls.row(match &jax_time {
            Ok(them) => format!(
                "| {shape} | {blocks} | {} | {} | {:.2} | {} | {} | {:.1} |",
                ms(us.median),
                ms(them.median),
                them.median / us.median,
                ms(us.first),
                ms(them.first),
                them.first / us.first
            ),
            Err(_) => format!(
                "| {shape} | {blocks} | {} | - | - | {} | - | - |",
                ms(us.median),
                ms(us.first)
            ),
        });
        match jax_time {
            Ok(them) => {
                println!(
                    "   JAX Pallas interpret=True (jit, cpu):   steady {:>9.3} ms   first call (trace + compile + run)        {:>9.3} ms",
                    them.median * 1e3,
                    them.first * 1e3
                );
                println!(
                    "   JAX / ours: steady {:.2}x, first call {:.2}x",
                    them.median / us.median,
                    them.first / us.first
                );
            }
            Err(why) => println!("   {why}"),
        }
    }
    if !wanted("megakernel") {
        return;
    }
    let mut megakernels = doc_table::Table::new(
        "| tiny megakernel | runs | ours | before (PALLADIUM_BEFORE_BIN) | now / before |",
        "|---|---:|---|---|---:|",
    );
    let tries = if benching { 3 } else { 1 };
    let before = std::env::var_os("PALLADIUM_BEFORE_BIN").map(PathBuf::from);
    println!(
        "== tiny decode megakernels (palladium run, random weights, 5-token prompt, {STEPS} steps), best of {tries}{} ==",
        if before.is_some() { ", interleaved with PALLADIUM_BEFORE_BIN" } else { "" }
    );
    for config in ["tiny-qwen3-moe.json", "tiny-mixtral.json"] {
        let (mut runs, mut ours, mut theirs) = (0, 0f64, 0f64);
        for _ in 0..tries {
            match megakernel(config) {
                Ok((n, tps)) => (runs, ours) = (n, ours.max(tps)),
                Err(e) => println!("   {config}: {e}"),
            }
            if let Some(bin) = &before {
                match megakernel_before(bin, config) {
                    Ok(tps) => theirs = theirs.max(tps),
                    Err(e) => println!("   {config}, before: {e}"),
                }
            }
        }
        if ours > 0.0 {
            println!(
                "   {config:<22} {runs} runs: {ours:>8.1} tokens/s ({:.2} ms per token)",
                1e3 / ours
            );
        }
        if theirs > 0.0 {
            println!(
                "   {:<22} before: {theirs:>8.1} tokens/s ({:.2} ms per token); now / before {:.2}x",
                "",
                1e3 / theirs,
                ours / theirs
            );
        }
        let before = if theirs > 0.0 {
            (format!("{theirs:.1} tokens/s"), format!("{:.2}", ours / theirs))
        } else {
            ("-".to_string(), "-".to_string())
        };
        megakernels.row(format!(
            "| {config} | {runs} | {ours:.1} tokens/s | {} | {} |",
            before.0, before.1
        ));
    }
    if benching && filters.is_empty() {
        doc_table::write_page(
            "interpret.md",
            "Interpret mode: speed",
            "cargo bench --bench interpret",
            &format!(
                "The tiled matmul in our interpreter (steady: median of {runs} `Program::run` on a \
                 rayon pool of {} threads; first call: build + lower + parse + prepare + run) \
                 against JAX Pallas `interpret=True` jitted on XLA:CPU (first call: trace + \
                 compile + run).\n\n{}\nThe tiny decode megakernels (`palladium run`, random \
                 weights, 5-token prompt, {STEPS} steps), best of {tries}.\n\n{}",
                rayon::current_num_threads(),
                matmuls.markdown(),
                megakernels.markdown()
            ),
        );
    }
}
