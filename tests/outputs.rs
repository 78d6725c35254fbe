//! Outputs, the compile worker and the environment end to end: no output replaces an input,
//! a symlinked output is written through, an output folder keeps no stale file of the
//! command's set, every output is checked before any work, the compile worker dies with its
//! parent and is held to the host-memory limit, and bad environment values are named.
use crate::common;
use palladium_model::ModelSpec;
use palladium_model::weights::{SaveDtype, Weights};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fixture, listing, palladium_code, scratch};

fn palladium(args: &[&str]) -> (i32, String, String) {
    palladium_code(args, &[])
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).unwrap().file_type().is_symlink()
}

/// A checkpoint folder W of the tiny Qwen3-MoE: W/config.json, W/model.safetensors.
fn checkpoint(name: &str) -> PathBuf {
    let w = scratch(name);
    std::fs::create_dir_all(&w).unwrap();
    std::fs::copy(fixture("tiny-qwen3-moe"), w.join("config.json")).unwrap();
    let spec = ModelSpec::from_path(w.join("config.json")).unwrap();
    Weights::random(&spec, 5)
        .unwrap()
        .save(w.join("model.safetensors"), SaveDtype::BFloat16)
        .unwrap();
    w
}

/// `run` on the checkpoint `w` (its config), the rest of the arguments after.
fn run_args<'a>(w: &'a str, config: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&["run", config, "--weights", w, "--prompt-ids", "1,2", "--steps", "2"][..], rest].concat()
}

/// `--logits-out` naming the checkpoint, the config, a link to one or a hard link of one is
/// refused before any work, naming both, and every input is left as it was.
#[test]
fn an_output_that_is_an_input_is_refused_before_any_work() {
    let w = checkpoint("outputs-inputs");
    let ws = w.to_str().unwrap();
    let config = w.join("config.json");
    let before =
        [std::fs::read(w.join("model.safetensors")).unwrap(), std::fs::read(&config).unwrap()];
    std::os::unix::fs::symlink(w.join("config.json"), w.join("link.json")).unwrap();
    std::fs::hard_link(w.join("model.safetensors"), w.join("hard.json")).unwrap();
    for (out, input) in [
        ("model.safetensors", "a checkpoint file (--weights) "),
        ("config.json", "the config "),
        ("link.json", "the config "),
        ("hard.json", "a checkpoint file (--weights) "),
    ] {
        let out = w.join(out);
        let (code, stdout, err) = palladium(&run_args(
            ws,
            config.to_str().unwrap(),
            &["--logits-out", out.to_str().unwrap()],
        ));
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("--logits-out: {} is {input}", out.display()))
                && err.contains("an output never replaces an input"),
            "{err}"
        );
        assert!(stdout.is_empty() && !err.contains("interpreted in"), "before any work: {err}");
    }
    let after =
        [std::fs::read(w.join("model.safetensors")).unwrap(), std::fs::read(&config).unwrap()];
    assert!(before == after, "the inputs are unchanged");
    assert_eq!(
        listing(&w),
        ["config.json", "hard.json", "link.json", "model.safetensors"],
        "nothing written"
    );

    // A sharded checkpoint: its index and its shards.
    let spec = ModelSpec::from_path(&config).unwrap();
    let sharded = scratch("outputs-inputs-sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    let weights = Weights::random(&spec, 5).unwrap();
    let shard = "model-00001-of-00001.safetensors";
    weights.save(sharded.join(shard), SaveDtype::BFloat16).unwrap();
    let map: serde_json::Map<String, serde_json::Value> =
        weights.iter().map(|(n, _)| (n.to_string(), shard.into())).collect();
    let index = sharded.join("model.safetensors.index.json");
    std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    for (out, input) in [
        (index.clone(), "the checkpoint index (--weights) "),
        (sharded.join(shard), "a checkpoint file (--weights) "),
    ] {
        let (code, _, err) = palladium(&run_args(
            sharded.to_str().unwrap(),
            config.to_str().unwrap(),
            &["--logits-out", out.to_str().unwrap()],
        ));
        assert!(code == 1 && err.contains(&format!("is {input}")), "{err}");
    }

    // An output folder whose file would replace the config: `megakernel` and `profile`.
    let dir = scratch("outputs-inputs-folder");
    std::fs::create_dir_all(&dir).unwrap();
    for (file, args) in
        [("megakernel.mlir", vec!["megakernel"]), ("summary.json", vec!["profile", "--megakernel"])]
    {
        let config = dir.join(file);
        std::fs::copy(fixture("tiny-qwen3-moe"), &config).unwrap();
        let args = [
            &args[..],
            &[config.to_str().unwrap(), "--chip", "v6e", "--out", dir.to_str().unwrap()],
        ]
        .concat();
        let (code, _, err) = palladium(&args);
        assert!(
            code == 1
                && err.contains(&format!(
                    "--out {}: {} is the config",
                    dir.display(),
                    config.display()
                )),
            "{err}"
        );
        assert_eq!(listing(&dir), [file], "nothing written");
        std::fs::remove_file(config).unwrap();
    }
}

/// `--logits-out` through a symlink, to an existing file or a dangling one: the target gets
/// the JSON, the link stays a link.
#[test]
fn a_symlinked_logits_out_is_written_through() {
    let dir = scratch("outputs-links");
    std::fs::create_dir_all(dir.join("there")).unwrap();
    std::fs::write(dir.join("there/old.json"), "old").unwrap();
    std::os::unix::fs::symlink("there/old.json", dir.join("link.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("there/new.json"), dir.join("dangling.json")).unwrap();
    let cfg = fixture("tiny-qwen3-moe");
    for (link, target) in [("link.json", "there/old.json"), ("dangling.json", "there/new.json")] {
        let (code, _, err) = palladium(&[
            "run",
            cfg.to_str().unwrap(),
            "--random-weights",
            "--prompt-ids",
            "1",
            "--steps",
            "2",
            "--logits-out",
            dir.join(link).to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(is_link(&dir.join(link)), "{link} stays a link");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(target)).unwrap()).unwrap();
        assert_eq!(json["generated_ids"].as_array().map(Vec::len), Some(2), "{json}");
    }
    assert_eq!(listing(&dir.join("there")), ["new.json", "old.json"], "no temporary left");
}

/// `megakernel --out DIR` over an earlier `--compile` run's files removes the executable and
/// the StableHLO program it does not rewrite (they were another model's), as `emit` does for
/// a kernel `compile` wrote; files outside the command's set stay.
#[test]
fn an_output_folder_keeps_no_stale_file_of_the_commands_set() {
    let dir = scratch("outputs-stale");
    std::fs::create_dir_all(&dir).unwrap();
    for stale in [
        "megakernel.executable",
        "megakernel.stablehlo.mlir",
        "matmul.executable",
        "matmul.stablehlo.mlir",
        "notes.txt",
    ] {
        std::fs::write(dir.join(stale), "an earlier run's").unwrap();
    }
    let out = dir.to_str().unwrap();
    let cfg = fixture("tiny-qwen3-moe");
    let (code, _, err) =
        palladium(&["megakernel", cfg.to_str().unwrap(), "--chip", "v6e", "--out", out]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = palladium(&["emit", "matmul", "--chip", "v6e", "--out", out]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        listing(&dir),
        [
            "matmul.body.mlir",
            "matmul.call.json",
            "matmul.mlir",
            "megakernel.body.mlir",
            "megakernel.call.json",
            "megakernel.mlir",
            "notes.txt"
        ]
    );
}

/// An output folder that takes no files is refused before the compile starts: with libtpu
/// pointed nowhere, the error is about the folder, not libtpu. /proc takes no new file even
/// from root.
#[test]
fn an_unwritable_output_folder_is_refused_before_compiling() {
    let cfg = fixture("tiny-qwen3-moe");
    let nowhere = [("PALLADIUM_LIBTPU", "/nonexistent/libtpu.so")];
    for args in [vec!["megakernel", cfg.to_str().unwrap(), "--compile"], vec!["compile", "matmul"]]
    {
        let args = [&args[..], &["--chip", "v6e", "--out", "/proc/palladium-out"]].concat();
        let (code, _, err) = palladium_code(&args, &nowhere);
        assert!(
            code == 1
                && err.contains(
                    "cannot write into --out /proc/palladium-out: /proc does not take new files"
                ),
            "{err}"
        );
    }
}

/// A regular file where `--logits-out`'s folder should be is named as such.
#[test]
fn a_file_in_place_of_the_output_folder_is_named() {
    let dir = scratch("outputs-afile");
    std::fs::create_dir_all(&dir).unwrap();
    let afile = dir.join("afile");
    std::fs::write(&afile, "").unwrap();
    let out = afile.join("x.json");
    let cfg = fixture("tiny-qwen3-moe");
    let (code, _, err) = palladium(&[
        "run",
        cfg.to_str().unwrap(),
        "--random-weights",
        "--prompt-ids",
        "1",
        "--steps",
        "2",
        "--logits-out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "--logits-out {}: {} is not a folder",
            out.display(),
            afile.display()
        )),
        "{err}"
    );
}

/// `PALLADIUM_MAX_HOST_MEMORY` too large is told apart from a non-positive one, and neither
/// suggests emitting the megakernel instead.
#[test]
fn a_bad_host_memory_limit_says_what_is_wrong_with_it() {
    let cfg = fixture("tiny-qwen3-moe");
    let run =
        ["run", cfg.to_str().unwrap(), "--random-weights", "--prompt-ids", "1", "--steps", "2"];
    for (value, want) in [
        ("99999999999999999999999", "too large: the largest limit is 18446744073709551615 bytes"),
        ("0", "must be a positive size"),
    ] {
        let (code, _, err) = palladium_code(&run, &[("PALLADIUM_MAX_HOST_MEMORY", value)]);
        assert!(
            code == 1 && err.contains(&format!("PALLADIUM_MAX_HOST_MEMORY={value:?}: {want}")),
            "{err}"
        );
        assert!(!err.contains("or emit"), "{err}");
    }
}

/// `PALLADIUM_COMPILE_WORKERS` that is not a positive number is refused, naming it.
#[test]
fn a_bad_compile_worker_count_is_refused() {
    for value in ["abc", "0", "-2"] {
        let (code, _, err) = palladium_code(
            &["compile", "matmul", "--chip", "v6e"],
            &[("PALLADIUM_COMPILE_WORKERS", value)],
        );
        assert!(
            code == 1
                && err.contains(&format!(
                    "PALLADIUM_COMPILE_WORKERS={value:?}: expected a positive whole number of compile workers"
                )),
            "{err}"
        );
    }
}

/// The state letter of process `pid` (`R`, `S`, `Z` ...), `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("State:")).and_then(|s| s.trim().chars().next())
}

/// The child of `parent` and its resident bytes, if it has one.
fn child_of(parent: u32) -> Option<(u32, u64)> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let status = std::fs::read_to_string(e.path().join("status")).ok()?;
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        (field("PPid:")? == parent.to_string()).then_some(())?;
        let kib: u64 = field("VmRSS:")?.trim_end_matches("kB").trim().parse().ok()?;
        Some((pid, kib * 1024))
    })
}

/// SIGKILL to `compile` in the middle of libtpu's work (its static estimator on a 8192^3
/// matmul runs for a minute and grows by GBs): the worker goes too, within its 100 ms poll
/// (a generous 5 s here), and removes its folder. Before, it ran on, re-parented to init.
#[test]
fn the_compile_worker_dies_with_its_parent() {
    let mut parent = Command::new(env!("CARGO_BIN_EXE_palladium"))
        .args(["compile", "matmul", "--chip", "v6e"])
        .args(["--set", "m=8192", "--set", "k=8192", "--set", "n=8192"])
        .env("PALLADIUM_MAX_HOST_MEMORY", "3GiB")
        .env_remove("PALLADIUM_COMPILE_WORKERS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starts");
    let start = std::time::Instant::now();
    // Compiling: libtpu loaded (~300 MB) and the estimator under way.
    let worker = loop {
        match child_of(parent.id()) {
            Some((pid, rss)) if rss > 600 << 20 => break pid,
            _ if start.elapsed().as_secs() > 120 => {
                let _ = parent.kill();
                panic!("no compile worker got under way");
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    let dir = std::env::temp_dir().join(format!("palladium-worker-{}-0", parent.id()));
    assert!(dir.is_dir(), "{}", dir.display());
    parent.kill().expect("SIGKILL");
    let _ = parent.wait();
    let killed = std::time::Instant::now();
    // A zombie is dead: whether init reaps it is init's business.
    while state(worker).is_some_and(|s| s != 'Z' && s != 'X') && killed.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let alive = state(worker).is_some_and(|s| s != 'Z' && s != 'X');
    if alive {
        let _ = Command::new("kill").args(["-9", &worker.to_string()]).status();
    }
    assert!(!alive, "the worker {worker} outlived its parent by 5 s");
    assert!(!dir.exists(), "the worker removed its folder {}", dir.display());
}

/// A compile worker past the host-memory limit is stopped; the estimator's compile is then
/// done again without the estimate (the note says why and how to raise the limit), and a
/// plain compile that passes it is refused with the same reason.
#[test]
fn the_compile_worker_is_held_to_the_host_memory_limit() {
    let big = [
        "compile", "matmul", "--chip", "v6e", "--set", "m=8192", "--set", "k=8192", "--set",
        "n=8192",
    ];
    let (code, out, err) = palladium_code(&big, &[("PALLADIUM_MAX_HOST_MEMORY", "1GiB")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("estimated cycles none: libtpu's static estimator needs more host memory on this program than the limit")
            && out.contains("past the limit of 1073741824 bytes (1.00 GiB), and was stopped; raise the limit with PALLADIUM_MAX_HOST_MEMORY="),
        "{out}"
    );
    let (code, _, err) = palladium_code(
        &["compile", "matmul", "--chip", "v6e"],
        &[("PALLADIUM_MAX_HOST_MEMORY", "100MiB")],
    );
    assert!(
        code == 1
            && err.contains("cannot compile `matmul` for v6e: the compile worker (libtpu) held")
            && err.contains("past the limit of 104857600 bytes")
            && err.contains("raise the limit with PALLADIUM_MAX_HOST_MEMORY="),
        "{err}"
    );
}
