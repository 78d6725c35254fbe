//! libtpu (`shared/tpu-oracle/oracle.py`, deviceless) accepts the megakernels: the tiny
//! Qwen3-MoE and Mixtral ones on v5e, v6e and v7x (module and serialized body), Qwen3-30B-A3B
//! at batch 1, context 4096 on v7x, and its 22-layer truncation on v6e (31 GiB of HBM);
//! the tiny Qwen3-MoE's cost variant (all KV tiles, one chunk in flight) on v6e.
//! Cycle profiles are off (`ORACLE_CYCLES=0`): libtpu 0.0.42.1's static profiler aborts on
//! most of these modules (manual DMAs from HBM), which would lose the whole batch.
use palladium_dsl::spec::Chip;
use palladium_fusion::{emit::emit, plan::{KvTiles, Plan, PlanOptions, Prefetch}};
use palladium_lowering::{LowerOptions, lower};
use palladium_model::ModelSpec;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn oracle_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache/palladium/venv-tpu"));
    let py = venv.join("bin/python");
    assert!(py.is_file(), "the TPU oracle venv is missing: expected {} (set PALLADIUM_TPU_VENV)", py.display());
    py
}

/// Emit `name` and write its three files into `dir`; returns the file stem.
fn write(dir: &Path, name: &str, chip: Chip, batch: u64, context: u64, layers: Option<usize>) -> String {
    write_variant(dir, name, PlanOptions { layers, ..PlanOptions::new(chip, batch, context) })
}

/// As [`write`], for any plan options (the cost variants).
fn write_variant(dir: &Path, name: &str, options: PlanOptions) -> String {
    let chip = options.chip;
    let spec = ModelSpec::from_path(root().join(format!("fixtures/models/{name}.json"))).unwrap();
    let plan = Plan::new(&spec, &options).unwrap();
    let l = lower(&emit(&plan).unwrap(), &LowerOptions { chip }).unwrap();
    let stem = format!("{name}-{chip}-{:?}-{:?}", options.kv_tiles, options.prefetch);
    std::fs::write(dir.join(format!("{stem}.mlir")), &l.module).unwrap();
    std::fs::write(dir.join(format!("{stem}.body.mlir")), &l.body).unwrap();
    std::fs::write(dir.join(format!("{stem}.call.json")), &l.call_json).unwrap();
    stem
}

fn batch(dir: &Path, chip: &str, jobs: &[Json]) -> Vec<Json> {
    let file = format!("jobs-{chip}.json");
    std::fs::write(dir.join(&file), Json::Array(jobs.to_vec()).to_string()).unwrap();
    let t = std::time::Instant::now();
    let out = Command::new(oracle_python())
        .arg(root().join("../shared/tpu-oracle/oracle.py"))
        .args(["batch", &file, "--chip", chip])
        .env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        .env("ORACLE_CYCLES", "0")
        .current_dir(dir)
        .output()
        .expect("cannot run the oracle");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{chip}: {} jobs in {:.1} s", jobs.len(), t.elapsed().as_secs_f64());
    let results: Vec<Json> = text.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).filter(|j: &Json| j.get("path").is_some()).collect();
    assert_eq!(results.len(), jobs.len(), "{chip}: missing results: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    for r in &results {
        assert_eq!(r["ok"], Json::Bool(true), "{chip}: {} failed: {}", r["path"], r["error"]);
    }
    results
}

fn jobs(stem: &str) -> Vec<Json> {
    vec![
        serde_json::json!({"kind": "compile", "path": format!("{stem}.mlir"), "spec": format!("{stem}.call.json")}),
        serde_json::json!({"kind": "compile-body", "path": format!("{stem}.body.mlir"), "spec": format!("{stem}.call.json")}),
    ]
}

#[test]
fn libtpu_accepts_the_megakernels() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fusion-oracle");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for chip in [Chip::V5e, Chip::V6e, Chip::V7x] {
        let mut all = Vec::new();
        all.extend(jobs(&write(&dir, "tiny-qwen3-moe", chip, 1, 256, None)));
        all.extend(jobs(&write(&dir, "tiny-mixtral", chip, 2, 300, None)));
        match chip {
            Chip::V7x => all.extend(jobs(&write(&dir, "qwen3-30b-a3b", chip, 1, 4096, None))),
            Chip::V6e => {
                all.extend(jobs(&write(&dir, "qwen3-30b-a3b", chip, 1, 4096, Some(22))));
                let cost = PlanOptions { kv_tiles: KvTiles::All, prefetch: Prefetch::Single, ..PlanOptions::new(chip, 2, 1024) };
                all.extend(jobs(&write_variant(&dir, "tiny-qwen3-moe", cost)));
            }
            _ => {}
        }
        batch(&dir, chip.name(), &all);
    }
}
