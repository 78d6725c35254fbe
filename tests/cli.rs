//! The `palladium` binary end to end.
use std::process::Command;

use crate::common;
use common::{palladium, scratch};

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
    let (ok, _, err) = palladium(&[
        "emit",
        "matmul",
        "--chip",
        "v7x",
        "--set",
        "bm=128",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let module = std::fs::read_to_string(dir.join("matmul.mlir")).unwrap();
    assert!(module.contains("window_bounds = array<i64: 128, 512>"), "{module}");
    assert!(module.contains("iteration_bounds = array<i64: 8, 4, 4>"), "{module}");
    let body = std::fs::read_to_string(dir.join("matmul.body.mlir")).unwrap();
    // After the alias of the module's own location, which ops carry as `loc(..)`.
    let first = body.lines().find(|l| !l.starts_with("#loc")).unwrap_or("");
    assert!(first.starts_with("module attributes {stable_mosaic.version = 15 : i64}"), "{body}");
    assert!(body.contains("loc(\"kernels/src/linalg.rs\":"), "{body}");
    assert!(body.contains("\"stable_mosaic.tpu.matmul\""), "{body}");
    let spec = std::fs::read_to_string(dir.join("matmul.call.json")).unwrap();
    assert!(
        spec.contains(
            r#""inputs":["bf16[1024,2048]","bf16[2048,1024]"],"outputs":["bf16[1024,1024]"]"#
        ),
        "{spec}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3, "no temporary files left");
}

#[test]
fn a_tpu_rule_violation_is_refused_before_anything_is_written() {
    let dir = scratch("emit_bad");
    // 100 tiles 1000 (so the blocks tile the arrays) but breaks the TPU's (16, 128) tile.
    let sets = ["--set", "m=1000", "--set", "n=1000", "--set", "bm=100", "--set", "bn=100"];
    let (ok, _, err) = palladium(
        &[&["emit", "matmul", "--chip", "v6e", "--out", dir.to_str().unwrap()][..], &sets[..]]
            .concat(),
    );
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
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--context",
        "512",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for file in ["megakernel.mlir", "megakernel.body.mlir", "megakernel.call.json"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    assert!(out.contains("layers: 4 of 4"), "{out}");
    assert!(out.contains("read up to each position"), "{out}");
    assert!(!out.contains("cost variant"), "{out}");
    // The cost variants say so, in text and JSON.
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--context",
        "512",
        "--all-kv-tiles",
        "--single-prefetch",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("all of them, masked past the position (cost variant)"), "{out}");
    assert!(out.contains("at most two chunks in flight per stream (cost variant)"), "{out}");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--all-kv-tiles",
        "--single-prefetch",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["kv_tiles"], "All", "{json}");
    assert_eq!(json["prefetch"], "Single", "{json}");
    assert_eq!(json["banks"], 3, "{json}");
}

/// `--devices N`: the split is planned and reported (text and JSON) and the SPMD kernel
/// written (its call spec names the devices and the communication); a count outside 1, 2,
/// 4, 8 and a model that does not fit its devices are refused naming the flag and the
/// devices it needs, nothing written.
#[test]
fn megakernel_devices_plans_and_reports_the_split() {
    let dir = scratch("megakernel_devices");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("qwen3-235b-a22b"),
        "--chip",
        "v7x",
        "--devices",
        "8",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("split over 8 v7x devices")
            && out.contains("layers: 94 of 94")
            && out.contains("a MODEL"),
        "{out}"
    );
    let call = std::fs::read_to_string(dir.join("megakernel.call.json"))
        .expect("the call spec is written");
    assert!(
        call.contains("\"devices\":8") && call.contains("\"has_communication\":true"),
        "{call}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let (_, out, _) = palladium(&[
        "megakernel",
        &model("qwen3-235b-a22b"),
        "--chip",
        "v7x",
        "--devices",
        "8",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["sharding"]["devices"], 8, "{json}");
    assert_eq!(json["sharding"]["collectives"].as_array().map(Vec::len), Some(3), "{json}");
    std::fs::remove_dir_all(&dir).unwrap();
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("qwen3-235b-a22b"),
        "--chip",
        "v7x",
        "--devices",
        "4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("does not fit 4 v7x devices") && err.contains("--devices 8"),
        "{err}"
    );
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--devices",
        "3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("--devices 3 (supported: 1, 2, 4, 8)"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

/// `--tokens-per-seq K`: the report says K and the token rows, the operands take B x K
/// tokens; `--logits` adds the full logits to the greedy ids and maxima; K outside 1..=16 is
/// refused naming the flag and the limit, nothing written.
#[test]
fn megakernel_tokens_per_seq_and_logits() {
    let dir = scratch("megakernel_k");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--batch",
        "2",
        "--context",
        "512",
        "--tokens-per-seq",
        "4",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(
        (json["dims"]["tokens_per_seq"].as_u64(), json["dims"]["tokens"].as_u64()),
        (Some(4), Some(8)),
        "{json}"
    );
    let operands: Vec<(String, serde_json::Value)> = json["operands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_string(), o["shape"].clone()))
        .collect();
    let names: Vec<&str> = operands.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        names.contains(&"next_ids") && names.contains(&"max_logits") && !names.contains(&"logits"),
        "{names:?}"
    );
    assert_eq!(operands[0].1, serde_json::json!([8]), "tokens: B x K");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--context",
        "512",
        "--tokens-per-seq",
        "4",
        "--logits",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("tokens per sequence: 4 (positions p..p+3, causal among them): 4 token rows"),
        "{out}"
    );
    assert!(out.contains("output logits f32["), "{out}");
    for k in ["0", "17"] {
        let fresh = scratch(&format!("megakernel_k{k}"));
        let (ok, _, err) = palladium(&[
            "megakernel",
            &model("tiny-qwen3-moe"),
            "--chip",
            "v6e",
            "--tokens-per-seq",
            k,
            "--out",
            fresh.to_str().unwrap(),
        ]);
        assert!(!ok && err.contains(&format!("--tokens-per-seq {k} (supported: 1..=16)")), "{err}");
        assert!(!fresh.exists(), "nothing written");
    }
}

/// Dense-MLP layers among MoE layers (`mlp_only_layers`): the report lists every layer's
/// kind (text and JSON); with int4 weights `run` is refused naming the config field, exit
/// 1, nothing written.
#[test]
fn megakernel_lists_the_layer_kinds_and_int4_dense_layers_are_refused() {
    let dir = scratch("megakernel_kinds");
    let config = model("tiny-qwen3-moe-mlp-only-layers");
    let args = ["megakernel", &config, "--chip", "v6e", "--out", dir.to_str().unwrap()];
    let (ok, out, err) = palladium(&args);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "layer kinds (FFN stage per layer): 0 routed experts, 1 dense MLP, 2-3 routed experts"
        ),
        "{out}"
    );
    assert!(out.contains("input w_mlp bf16[1, 4, 256, 384]"), "{out}");
    let (ok, out, err) = palladium(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["layer_ffns"][1], "dense_mlp", "{json}");
    let logits = dir.join("logits.json");
    refused(
        &[
            "run",
            &config,
            "--random-weights",
            "--prompt-ids",
            "1,2",
            "--steps",
            "2",
            "--weights-dtype",
            "int4",
            "--logits-out",
            logits.to_str().unwrap(),
        ],
        "--weights-dtype int4 with dense-MLP layers (layers [1] by the config's mlp_only_layers / decoder_sparse_step)",
    );
    assert!(!logits.exists(), "nothing written");
}

#[test]
fn a_megakernel_too_large_for_the_chip_is_refused_with_the_numbers() {
    let dir = scratch("megakernel_refused");
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("qwen3-30b-a3b"),
        "--chip",
        "v5e",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("does not fit v5e HBM") && err.contains("try --layers N"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

/// Exit code, stdout, stderr, with extra environment variables.
fn palladium_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium"))
        .args(args)
        .env_remove("PALLADIUM_MAX_HOST_MEMORY")
        .env_remove("RUST_BACKTRACE")
        .envs(env.iter().copied())
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn refused(args: &[&str], want: &str) -> String {
    let (code, out, err) = palladium_env(args, &[]);
    assert_eq!(code, Some(1), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(!err.contains("panicked") && !out.contains("PASS"), "{args:?}: {out}{err}");
    err
}

#[test]
fn bad_kernel_parameters_are_refused_naming_the_parameter_and_the_rule() {
    let size_rule =
        "sizes and counts must be between 1 and 2147483647 (TPU index arithmetic is i32)";
    for (kernel, set) in [
        ("matmul", "bm=0"),
        ("rmsnorm", "block_rows=0"),
        ("gemv", "block_n=0"),
        ("decode_attention", "block_kv=0"),
        ("rope", "heads_per_block=0"),
        ("expert_ffn", "block_ffn=0"),
        ("grouped_matmul", "groups=0"),
        ("gather_rows", "table_rows=2147483648"),
        ("matmul", "m=1099511627776"),
    ] {
        let (name, value) = set.split_once('=').unwrap();
        refused(&["ir", kernel, "--set", set], &format!("parameter {name} = {value}: {size_rule}"));
    }
    refused(&["ir", "rmsnorm", "--set", "eps=nan"], "parameter eps = NaN: must be finite");
    refused(&["ir", "rmsnorm", "--set", "eps=-1"], "requires eps >= 0.0, but eps = -1");
    refused(
        &["ir", "matmul", "--set", "out_dtype=i4"],
        "requires out_dtype == bf16 || out_dtype == f32, but out_dtype = i4",
    );
    refused(
        &["ir", "gemv_quantized", "--set", "wdtype=bf16"],
        "requires wdtype == i8 || wdtype == int4 || wdtype == float8_e4m3, but wdtype = bf16",
    );
    refused(
        &["ir", "gemv_quantized", "--set", "group=100"],
        "group = 100 does not divide k = 4096",
    );
    // The latent cache's row: the latent padded to whole lane tiles, the rope key in one.
    refused(&["ir", "mla_decode_attention", "--set", "rope=3"], "2 does not divide rope = 3");
    refused(
        &["ir", "mla_decode_attention", "--set", "rope=130"],
        "requires rope <= 128, but rope = 130",
    );
}

#[test]
fn blocks_that_do_not_tile_and_broken_relations_are_refused_and_nothing_is_written() {
    let dir = scratch("emit_untiled");
    let out = dir.to_str().unwrap();
    for (kernel, set, want) in [
        ("matmul", "bk=1536", "block dim 1 of `x`: bk = 1536 does not divide k = 2048"),
        ("matmul", "bm=384", "block dim 0 of `o`: bm = 384 does not divide m = 1024"),
        ("moe_router", "top_k=200", "requires top_k <= experts, but top_k = 200, experts = 128"),
        ("expert_ffn", "block_ffn=500", "block_ffn = 500 does not divide ffn = 768"),
        ("grouped_matmul", "groups=0", "parameter groups = 0"),
        ("matmul", "m=1099511627776", "parameter m = 1099511627776"),
        (
            "matmul",
            "m=1048576 --set k=16384",
            "the operands of `matmul` need 34.03 GiB (36540776448 bytes: x 32.00 GiB, o 2.00 GiB, y 0.03 GiB), more than the 32.00 GiB of HBM per device on v6e",
        ),
    ] {
        let sets: Vec<&str> = set.split(' ').collect();
        refused(
            &[&["emit", kernel, "--chip", "v6e", "--set"][..], &sets[..], &["--out", out][..]]
                .concat(),
            want,
        );
        assert!(!dir.exists(), "{kernel} {set}: nothing is written");
    }
}

#[test]
fn interpret_refuses_bad_parameters_and_oversized_runs_before_allocating() {
    refused(
        &["interpret", "grouped_matmul", "--set", "groups=0", "--seed", "0"],
        "parameter groups = 0",
    );
    refused(
        &["interpret", "rmsnorm", "--set", "eps=inf", "--seed", "1"],
        "parameter eps = inf: must be finite",
    );
    refused(
        &["interpret", "matmul", "--set", "m=1099511627776", "--seed", "0"],
        "parameter m = 1099511627776",
    );
    // 2 GiB of bf16 input, within v6e's HBM, is 15 GiB of host memory to check.
    let err = refused(
        &["interpret", "matmul", "--set", "m=65536", "--set", "k=16384"],
        "cannot run `matmul`: interpret mode needs 16478109696 bytes (15.35 GiB: inputs 14.22 GiB + outputs and reference 1.12 GiB + windows and scratch 0.00 GiB) of host memory, over the limit of 8589934592 bytes (8.00 GiB)",
    );
    assert!(err.contains("raise it with PALLADIUM_MAX_HOST_MEMORY="), "{err}");
    // The limit from the environment.
    let (code, _, err) =
        palladium_env(&["interpret", "rmsnorm"], &[("PALLADIUM_MAX_HOST_MEMORY", "1MiB")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("over the limit of 1048576 bytes"), "{err}");
    let (code, out, err) =
        palladium_env(&["interpret", "rmsnorm"], &[("PALLADIUM_MAX_HOST_MEMORY", "64MiB")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.ends_with("PASS\n"), "{out}");
    let (code, _, err) =
        palladium_env(&["interpret", "rmsnorm"], &[("PALLADIUM_MAX_HOST_MEMORY", "lots")]);
    assert!(code == Some(1) && err.contains("PALLADIUM_MAX_HOST_MEMORY=\"lots\""), "{err}");
    refused(
        &["interpret", "rmsnorm", "--tolerance=-1"],
        "tolerance -1 must be finite and non-negative",
    );
    refused(
        &["interpret", "rmsnorm", "--tolerance", "NaN"],
        "tolerance NaN must be finite and non-negative",
    );
}

#[test]
fn emit_writes_nothing_when_an_output_path_is_taken_by_a_directory() {
    let dir = scratch("emit_dir_in_the_way");
    std::fs::create_dir_all(dir.join("matmul.call.json/keep")).unwrap();
    let out = dir.to_str().unwrap();
    refused(&["emit", "matmul", "--chip", "v6e", "--out", out], "matmul.call.json is a folder");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["matmul.call.json"], "nothing written, nothing removed");
    assert!(dir.join("matmul.call.json/keep").is_dir());
    // A file where the output directory should be.
    let file = dir.join("file");
    std::fs::write(&file, "").unwrap();
    refused(
        &["emit", "matmul", "--chip", "v6e", "--out", file.join("sub").to_str().unwrap()],
        "is not a folder",
    );
}

/// Byte counts never wrap: a context of 2^52 positions is refused (past the model's
/// `max_position_embeddings`, and the planner's arithmetic is checked) and nothing is written.
#[test]
fn a_megakernel_with_an_absurd_context_is_refused_cleanly() {
    let dir = scratch("megakernel_context");
    for context in ["4503599627370496", "18446744073709551615", "4097"] {
        let out = Command::new(env!("CARGO_BIN_EXE_palladium"))
            .args([
                "megakernel",
                &model("tiny-qwen3-moe"),
                "--chip",
                "v6e",
                "--context",
                context,
                "--out",
                dir.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "--context {context} is past the model's max_position_embeddings 4096"
            )),
            "{err}"
        );
        assert!(!dir.exists(), "nothing written");
    }
}

/// The output folder is checked before planning: a folder where a file must go is refused and
/// nothing is written.
#[test]
fn a_megakernel_output_folder_that_cannot_take_the_files_is_refused_first() {
    let dir = scratch("megakernel_blocked");
    std::fs::create_dir_all(dir.join("megakernel.call.json/keep")).unwrap();
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--context",
        "512",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("megakernel.call.json is a folder"), "{err}");
    let mut left: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, vec!["megakernel.call.json"], "nothing written");
    let file = scratch("megakernel_file");
    std::fs::write(&file, "x").unwrap();
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--out",
        file.join("sub").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("is not a folder"), "{err}");
}

#[test]
fn compile_reports_libtpus_cycles_and_writes_all_five_files() {
    let (ok, out, err) = palladium(&["compile", "matmul", "--chip", "v6e", "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&out).expect("--json prints one JSON object");
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(json["chip"], "v6e", "{json}");
    // What JAX Pallas's own matmul of the same shape and blocks gets.
    assert_eq!(json["estimated_cycles"], 46041, "{json}");
    assert!(json["code_size_bytes"].as_u64().is_some_and(|n| n > 0), "{json}");
    assert_eq!(json["hbm"]["argument_bytes"], (1024 * 2048 + 2048 * 1024) * 2, "{json}");
    assert_eq!(json["vmem_limit_bytes"], 32 << 20, "{json}");

    // gather_rows's DMAs abort v6e's estimator: compiled all the same, no estimate, and why.
    let dir = scratch("compile_out");
    let (ok, out, err) = palladium(&[
        "compile",
        "gather_rows",
        "--chip",
        "v6e",
        "--out",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["estimated_cycles"], serde_json::Value::Null, "{json}");
    assert!(
        json["estimate_note"].as_str().is_some_and(|n| n.contains("Unsupported DMA direction")),
        "{json}"
    );
    for file in [
        "gather_rows.mlir",
        "gather_rows.body.mlir",
        "gather_rows.call.json",
        "gather_rows.stablehlo.mlir",
        "gather_rows.executable",
    ] {
        assert!(
            std::fs::metadata(dir.join(file)).is_ok_and(|m| m.len() > 0),
            "{file} missing or empty"
        );
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 5, "no temporary files left");
    let program = std::fs::read_to_string(dir.join("gather_rows.stablehlo.mlir")).unwrap();
    assert!(program.contains("stablehlo.custom_call @tpu_custom_call"), "{program}");
}

#[test]
fn compile_runs_a_collective_on_its_devices_and_claims_no_cycles() {
    // 4 devices: the 4 chips of v6e:2x2; 8 need v6e:2x4; 32 fit no deviceless v7x slice.
    let (ok, out, err) = palladium(&["compile", "all_reduce", "--chip", "v6e", "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (json["devices"].as_u64(), json["topology"].as_str()),
        (Some(4), Some("v6e:2x2")),
        "{json}"
    );
    // libtpu prices the remote DMAs at 0 cycles: no figure, and the note says why.
    assert_eq!(json["estimated_cycles"], serde_json::Value::Null, "{json}");
    assert!(
        json["estimate_note"]
            .as_str()
            .is_some_and(|n| n.contains("prices remote DMAs at 0 cycles")),
        "{json}"
    );
    let (ok, out, err) = palladium(&["compile", "permute", "--chip", "v6e", "--set", "n=8"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("permute compiled by libtpu for v6e (deviceless, 8 devices of v6e:2x4)")
            && !out.contains("cycles (libtpu's static estimate)"),
        "{out}"
    );
    let (ok, _, err) = palladium(&["compile", "permute", "--chip", "v7x", "--set", "n=32"]);
    assert!(!ok && err.contains("a program for 32 devices does not fit a deviceless v7x topology: the largest here is tpu7x:2x2x2 with 16 devices"), "{err}");
}

#[test]
fn compile_refuses_what_does_not_verify_and_writes_nothing() {
    let dir = scratch("compile_refused");
    let (ok, _, err) = palladium(&[
        "compile",
        "matmul",
        "--chip",
        "v5e",
        "--set",
        "bm=1024",
        "--set",
        "bn=1024",
        "--set",
        "bk=2048",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("VMEM budget exceeded"), "{err}");
    assert!(!dir.exists(), "nothing written");
}

#[test]
fn megakernel_compile_adds_the_compile_object() {
    let dir = scratch("megakernel_compile");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--context",
        "512",
        "--all-kv-tiles",
        "--single-prefetch",
        "--json",
        "--compile",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let c = &json["compile"];
    assert_eq!(c["ok"], true, "{c}");
    assert!(c["code_size_bytes"].as_u64().is_some_and(|n| n > 0), "{c}");
    assert!(
        c["estimated_cycles"].as_u64().is_some_and(|n| n > 0) || c["estimate_note"].is_string(),
        "{c}"
    );
    assert!(
        dir.join("megakernel.executable").is_file()
            && dir.join("megakernel.stablehlo.mlir").is_file()
    );
}

#[test]
fn exec_and_run_on_tpu_say_when_no_tpu_is_attached() {
    // This machine has no TPU: libtpu's PJRT_Client_Create fails, and both commands say so
    // (run before loading any weights).
    let (ok, _, err) = palladium(&["exec", "matmul", "--seed", "3"]);
    assert!(!ok);
    assert!(
        err.contains("`matmul` on the device: no TPU attached")
            && err.contains("PJRT_Client_Create failed"),
        "{err}"
    );
    let (ok, _, err) = palladium(&[
        "run",
        &model("tiny-qwen3-moe"),
        "--random-weights",
        "--prompt-ids",
        "1,2",
        "--steps",
        "2",
        "--backend",
        "tpu",
    ]);
    assert!(!ok);
    assert!(err.contains("--backend tpu: no TPU attached"), "{err}");
    let (ok, _, err) = palladium(&[
        "run",
        &model("tiny-qwen3-moe"),
        "--random-weights",
        "--prompt-ids",
        "1,2",
        "--steps",
        "2",
        "--backend",
        "gpu",
    ]);
    assert!(!ok && err.contains("unknown backend `gpu` (known: interpret, tpu)"), "{err}");
}

#[test]
fn run_quantized_weights_dtypes_pass_the_check_and_report_the_quantization_error() {
    for dtype in ["int8", "fp8", "int4"] {
        let (ok, out, err) = palladium(&[
            "run",
            &model("tiny-mixtral"),
            "--random-weights",
            "--prompt-ids",
            "1,2",
            "--steps",
            "2",
            "--check",
            "--weights-dtype",
            dtype,
        ]);
        assert!(ok, "{dtype}: {err}");
        assert!(out.contains(&format!("reference on the dequantized {dtype} weights")), "{out}");
        assert!(out.contains("quantization error against the bf16 model (reported, not checked): max |logits diff|"), "{out}");
    }
    let (ok, _, err) = palladium(&[
        "run",
        &model("tiny-qwen3-moe"),
        "--random-weights",
        "--prompt-ids",
        "1,2",
        "--steps",
        "2",
        "--weights-dtype",
        "int3",
    ]);
    assert!(
        !ok && err.contains("unknown weights dtype `int3` (known: bf16, int8, fp8, int4)"),
        "{err}"
    );
    // MXFP4 kept as codes is refused by name, saying what an MXFP4 checkpoint does instead.
    let (ok, _, err) = palladium(&[
        "megakernel",
        &model("tiny-gpt-oss-256"),
        "--chip",
        "v6e",
        "--weights-dtype",
        "mxfp4",
        "--out",
        &scratch("weights_dtype_mxfp4").display().to_string(),
    ]);
    assert!(
        !ok && err.contains("`mxfp4` (MXFP4 experts kept as codes in HBM) is not supported yet"),
        "{err}"
    );
}

/// `megakernel --weights-dtype` sets the operand dtypes; a config with an FP8
/// `quantization_config` plans fp8 by itself and refuses another dtype, naming the config.
#[test]
fn megakernel_weights_dtype_sets_the_operands() {
    let dir = scratch("megakernel_weights_dtype");
    let (ok, out, err) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--weights-dtype",
        "int4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "weights: int4 (dense q/k/v/o i8 per output channel, experts i4 groups of 128 inputs"
        ),
        "{out}"
    );
    assert!(
        out.contains("input w_experts i4[4, 8, 1, 256, 384]")
            && out.contains("input expert_down_scales f32[4, 8, 1, 1, 256]"),
        "{out}"
    );
    let (ok, out, _) = palladium(&[
        "megakernel",
        &model("tiny-qwen3-moe"),
        "--chip",
        "v6e",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok && !out.contains("\"quant\""), "a bf16 plan has no quant layout: {out}");
    let text = std::fs::read_to_string(model("tiny-qwen3-moe")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]});
    let config = dir.join("fp8.json");
    std::fs::write(&config, json.to_string()).unwrap();
    let (ok, out, err) = palladium(&[
        "megakernel",
        config.to_str().unwrap(),
        "--chip",
        "v6e",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("weights: fp8"), "{err}{out}");
    let (ok, _, err) = palladium(&[
        "megakernel",
        config.to_str().unwrap(),
        "--chip",
        "v6e",
        "--weights-dtype",
        "int8",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains(
            "--weights-dtype int8: the config's quantization_config stores the weights as fp8"
        ),
        "{err}"
    );
}
