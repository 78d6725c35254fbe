//! `cargo bench --bench interpret`: our interpreter (the serialized Mosaic body run by
//! `palladium_interpret`) against JAX Pallas's interpret mode (`interpret=True`, jit-compiled,
//! on XLA:CPU) on the same tiled matmul and sizes; prints both medians and the ratio
//! (ours / JAX).
//!
//! Ours: lower, parse and prepare once, then the median of N `Program::run` calls. JAX:
//! `benches/pallas_interpret.py` with `$PALLADIUM_TPU_VENV/bin/python` (default
//! `~/.cache/palladium/venv-tpu`), `JAX_PLATFORMS=cpu`; warm-up (compile) then the median
//! of N calls with `block_until_ready`. Without the venv only our side is timed.

use palladium::check::{prepare, to_host_array};
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ours(c: &Case, runs: usize) -> f64 {
    let settings: Vec<(String, String)> = [("m", c.m), ("k", c.k), ("n", c.n), ("bm", c.bm), ("bk", c.bk), ("bn", c.bn)].iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    let (entry, _, program, _) = prepare("matmul", &settings, Chip::V6e).unwrap_or_else(|e| panic!("{e}"));
    let inputs: Vec<_> = (entry.inputs)(&settings, 0).unwrap().iter().map(|d| to_host_array(d).unwrap()).collect();
    program.run(&inputs).unwrap_or_else(|e| panic!("{e}")); // warm-up
    median((0..runs).map(|_| {
        let t = Instant::now();
        std::hint::black_box(program.run(&inputs).unwrap());
        t.elapsed().as_secs_f64()
    }).collect())
}

fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/palladium/venv-tpu"));
    venv.join("bin/python")
}

/// `Ok(median seconds)`, or why JAX was not timed.
fn jax(c: &Case, runs: usize) -> Result<f64, String> {
    let py = venv_python();
    if !py.is_file() {
        return Err(format!("JAX side skipped: no oracle venv at {} (set PALLADIUM_TPU_VENV or run scripts/setup.sh)", py.display()));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pallas_interpret.py");
    let arg = |n: &str, v: usize| [format!("--{n}"), v.to_string()];
    let args: Vec<String> = [arg("m", c.m), arg("k", c.k), arg("n", c.n), arg("bm", c.bm), arg("bk", c.bk), arg("bn", c.bn), arg("runs", runs)].concat();
    let out = Command::new(&py).arg(&script).args(&args).env("JAX_PLATFORMS", "cpu").output().map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("JAX side failed:\n{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    let line = stdout.lines().last().unwrap_or("");
    let key = "\"median_s\": ";
    let start = line.find(key).ok_or_else(|| format!("unexpected output: {line}"))? + key.len();
    line[start..].split([',', '}']).next().and_then(|x| x.trim().parse().ok()).ok_or_else(|| format!("unexpected output: {line}"))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then one run each.
    let benching = std::env::args().any(|a| a == "--bench");
    let runs = if benching { 7 } else { 1 };
    let cases = [Case { m: 1024, k: 2048, n: 1024, bm: 256, bk: 512, bn: 256 }, Case { m: 256, k: 512, n: 256, bm: 128, bk: 256, bn: 128 }];
    for c in &cases {
        println!("== matmul {}x{}x{} bf16, blocks {}x{}x{}, grid ({}, {}, {}), median of {runs} ==", c.m, c.k, c.n, c.bm, c.bk, c.bn, c.m / c.bm, c.n / c.bn, c.k / c.bk);
        let us = ours(c, runs);
        println!("   palladium interpret (serialized body): {:>9.3} ms", us * 1e3);
        match jax(c, runs) {
            Ok(them) => {
                println!("   JAX Pallas interpret=True (jit, cpu):   {:>9.3} ms", them * 1e3);
                println!("   ratio ours / JAX: {:.2}", us / them);
            }
            Err(why) => println!("   {why}"),
        }
    }
}
