//! The `palladium` binary end to end.
use std::path::PathBuf;
use std::process::Command;

fn palladium(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn kernels_lists_every_library_kernel_with_its_parameters() {
    let (ok, out, _) = palladium(&["kernels"]);
    assert!(ok);
    for name in palladium_kernels::names() {
        assert!(out.contains(name), "{out}");
    }
    assert!(out.contains("params: m=1024 k=2048 n=1024 bm=256 bk=512 bn=256"), "{out}");
}

#[test]
fn emit_writes_module_body_and_call_spec() {
    let dir = scratch("emit_ok");
    let (ok, _, err) = palladium(&["emit", "matmul", "--chip", "v7x", "--set", "bm=128", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let module = std::fs::read_to_string(dir.join("matmul.mlir")).unwrap();
    assert!(module.contains("window_bounds = array<i64: 128, 512>"), "{module}");
    assert!(module.contains("iteration_bounds = array<i64: 8, 4, 4>"), "{module}");
    let body = std::fs::read_to_string(dir.join("matmul.body.mlir")).unwrap();
    assert!(body.starts_with("module attributes {stable_mosaic.version = 15 : i64}"), "{body}");
    assert!(body.contains("\"stable_mosaic.tpu.matmul\""), "{body}");
    let spec = std::fs::read_to_string(dir.join("matmul.call.json")).unwrap();
    assert!(spec.contains(r#""inputs":["bf16[1024,2048]","bf16[2048,1024]"],"outputs":["bf16[1024,1024]"]"#), "{spec}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3, "no temporary files left");
}

#[test]
fn a_tpu_rule_violation_is_refused_before_anything_is_written() {
    let dir = scratch("emit_bad");
    let (ok, _, err) = palladium(&["emit", "matmul", "--chip", "v6e", "--set", "bm=100", "--set", "bn=100", "--out", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("operand x"), "{err}");
    assert!(err.contains("TPU block rule: the second-minor block dim (100) must be a multiple of 16 (native bf16 tile (16,128))"), "{err}");
    assert!(err.contains("the last block dim (100) must be a multiple of 128 lanes"), "{err}");
    assert!(!dir.exists(), "nothing is written for a refused kernel");
}

#[test]
fn bad_settings_and_unknown_kernels_are_named() {
    let (ok, _, err) = palladium(&["ir", "matmul", "--set", "bq=1"]);
    assert!(!ok && err.contains("kernel `matmul` has no parameter `bq`"), "{err}");
    let (ok, _, err) = palladium(&["ir", "matmul", "--set", "bm"]);
    assert!(!ok && err.contains("bad --set `bm`: write NAME=VALUE"), "{err}");
    let (ok, _, err) = palladium(&["emit", "nope", "--chip", "v6e", "--out", "/nonexistent"]);
    let known = palladium_kernels::names().join(", ");
    assert!(!ok && err.contains(&format!("unknown kernel `nope` (known: {known})")), "{err}");
    let (ok, _, err) = palladium(&["ir", "matmul", "--chip", "v9"]);
    assert!(!ok && err.contains("unknown chip `v9`"), "{err}");
}

#[test]
fn the_vmem_budget_is_checked_for_the_chosen_chip() {
    // 2 x (1024x2048 + 2048x1024 + 1024x1024) bf16 + a 4 MiB f32 accumulator = 24 MiB:
    // within v6e's 32 MiB default scoped VMEM, over v5e's 16 MiB.
    let sets = ["--set", "bm=1024", "--set", "bn=1024", "--set", "bk=2048"];
    let (ok, _, err) = palladium(&[&["ir", "matmul", "--chip", "v6e"][..], &sets[..]].concat());
    assert!(ok, "{err}");
    let (ok, _, err) = palladium(&[&["ir", "matmul", "--chip", "v5e"][..], &sets[..]].concat());
    assert!(!ok, "{err}");
    assert!(err.contains("VMEM budget exceeded: 25165824 bytes needed"), "{err}");
    assert!(err.contains("limit 16777216 bytes on v5e"), "{err}");
}

fn model(name: &str) -> String {
    format!("{}/fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn megakernel_writes_its_files_and_reports_the_plan() {
    let dir = scratch("megakernel_ok");
    let (ok, out, err) = palladium(&["megakernel", &model("tiny-qwen3-moe"), "--chip", "v6e", "--context", "512", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    for file in ["megakernel.mlir", "megakernel.body.mlir", "megakernel.call.json"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    assert!(out.contains("layers: 4 of 4"), "{out}");
    assert!(out.contains("read up to each position"), "{out}");
    assert!(!out.contains("cost variant"), "{out}");
    // The cost variants say so, in text and JSON.
    let (ok, out, err) = palladium(&["megakernel", &model("tiny-qwen3-moe"), "--chip", "v6e", "--context", "512", "--all-kv-tiles", "--single-prefetch", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("all of them, masked past the position (cost variant)"), "{out}");
    assert!(out.contains("one chunk in flight per stream (cost variant)"), "{out}");
    let (ok, out, err) = palladium(&["megakernel", &model("tiny-qwen3-moe"), "--chip", "v6e", "--all-kv-tiles", "--single-prefetch", "--json", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["kv_tiles"], "All", "{json}");
    assert_eq!(json["prefetch"], "Single", "{json}");
    assert_eq!(json["banks"], 2, "{json}");
}

#[test]
fn a_megakernel_too_large_for_the_chip_is_refused_with_the_numbers() {
    let dir = scratch("megakernel_refused");
    let (ok, _, err) = palladium(&["megakernel", &model("qwen3-30b-a3b"), "--chip", "v5e", "--out", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("does not fit v5e HBM") && err.contains("try --layers N"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

#[test]
fn compile_reports_libtpus_cycles_and_writes_all_five_files() {
    let (ok, out, err) = palladium(&["compile", "matmul", "--chip", "v6e", "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints one JSON object");
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(json["chip"], "v6e", "{json}");
    // What JAX Pallas's own matmul of the same shape and blocks gets.
    assert_eq!(json["estimated_cycles"], 46041, "{json}");
    assert!(json["code_size_bytes"].as_u64().is_some_and(|n| n > 0), "{json}");
    assert_eq!(json["hbm"]["argument_bytes"], (1024 * 2048 + 2048 * 1024) * 2, "{json}");
    assert_eq!(json["vmem_limit_bytes"], 32 << 20, "{json}");

    // gather_rows's DMAs abort v6e's estimator: compiled all the same, no estimate, and why.
    let dir = scratch("compile_out");
    let (ok, out, err) = palladium(&["compile", "gather_rows", "--chip", "v6e", "--out", dir.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["estimated_cycles"], serde_json::Value::Null, "{json}");
    assert!(json["estimate_note"].as_str().is_some_and(|n| n.contains("Unsupported DMA direction")), "{json}");
    for file in ["gather_rows.mlir", "gather_rows.body.mlir", "gather_rows.call.json", "gather_rows.stablehlo.mlir", "gather_rows.executable"] {
        assert!(std::fs::metadata(dir.join(file)).is_ok_and(|m| m.len() > 0), "{file} missing or empty");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 5, "no temporary files left");
    let program = std::fs::read_to_string(dir.join("gather_rows.stablehlo.mlir")).unwrap();
    assert!(program.contains("stablehlo.custom_call @tpu_custom_call"), "{program}");
}

#[test]
fn compile_refuses_what_does_not_verify_and_writes_nothing() {
    let dir = scratch("compile_refused");
    let (ok, _, err) = palladium(&["compile", "matmul", "--chip", "v5e", "--set", "bm=1024", "--set", "bn=1024", "--set", "bk=2048", "--out", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("VMEM budget exceeded"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

#[test]
fn megakernel_compile_adds_the_compile_object() {
    let dir = scratch("megakernel_compile");
    let (ok, out, err) = palladium(&["megakernel", &model("tiny-qwen3-moe"), "--chip", "v6e", "--context", "512", "--all-kv-tiles", "--single-prefetch", "--json", "--compile", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let c = &json["compile"];
    assert_eq!(c["ok"], true, "{c}");
    assert!(c["code_size_bytes"].as_u64().is_some_and(|n| n > 0), "{c}");
    assert!(c["estimated_cycles"].as_u64().is_some_and(|n| n > 0) || c["estimate_note"].is_string(), "{c}");
    assert!(dir.join("megakernel.executable").is_file() && dir.join("megakernel.stablehlo.mlir").is_file());
}

#[test]
fn exec_and_run_on_tpu_say_when_no_tpu_is_attached() {
    // This machine has no TPU: libtpu's PJRT_Client_Create fails, and both commands say so
    // (run before loading any weights).
    let (ok, _, err) = palladium(&["exec", "matmul", "--seed", "3"]);
    assert!(!ok);
    assert!(err.contains("`matmul` on the device: no TPU attached") && err.contains("PJRT_Client_Create failed"), "{err}");
    let (ok, _, err) = palladium(&["run", &model("tiny-qwen3-moe"), "--random-weights", "--prompt-ids", "1,2", "--steps", "2", "--backend", "tpu"]);
    assert!(!ok);
    assert!(err.contains("--backend tpu: no TPU attached"), "{err}");
    let (ok, _, err) = palladium(&["run", &model("tiny-qwen3-moe"), "--random-weights", "--prompt-ids", "1,2", "--steps", "2", "--backend", "gpu"]);
    assert!(!ok && err.contains("unknown backend `gpu` (known: interpret, tpu)"), "{err}");
}
