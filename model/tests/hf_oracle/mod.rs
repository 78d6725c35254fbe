//! Running `model/tests/hf_reference.py` (transformers' own forward pass of a tiny
//! checkpoint) from a test: shared by `model/tests/hf_conformance.rs` (the plain-Rust
//! reference) and `decode/tests/hf_conformance.rs` (the megakernel), which includes this file
//! by path. Paths are relative to `CARGO_MANIFEST_DIR`'s parent (both crates sit one level
//! under the repository root).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use palladium_model::reference::Generation;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The oracle venv's python, checked to have torch and transformers (else a failure that
/// names the setup script). The check finds the packages without importing them: importing
/// torch and transformers takes seconds of CPU, which the oracle script spends again.
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/palladium/venv-tpu")
    });
    let py = venv.join("bin/python");
    let ok = Command::new(&py)
        .args([
            "-c",
            "import importlib.util, sys; \
             sys.exit(any(importlib.util.find_spec(m) is None for m in ('torch', 'transformers')))",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot import torch and transformers: run scripts/setup.sh (it installs the pinned \
         versions into the oracle venv, $PALLADIUM_TPU_VENV or ~/.cache/palladium/venv-tpu)",
        py.display()
    );
    py
}

/// What `hf_reference.py` wrote: the checkpoint directory (`model.safetensors`,
/// `config.json`) and transformers' generations.
pub struct Oracle {
    pub dir: PathBuf,
    pub f32: Generation,
    pub bf16: Generation,
    /// The float32 model teacher-forced on `bf16.generated_ids` (with `f32_on_bf16_ids`).
    pub f32_on_bf16: Option<Generation>,
}

impl Oracle {
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `hf_reference.py` on `config` (a path relative to the repository root, or absolute).
pub fn run_oracle(
    config: &str,
    seed: u64,
    prompt: &[u32],
    steps: usize,
    f32_on_bf16_ids: bool,
) -> Oracle {
    let py = venv_python();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "hf-{}-{seed}-{}",
        Path::new(config).file_stem().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let prompt_s: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let mut cmd = Command::new(&py);
    cmd.arg(repo_root().join("model/tests/hf_reference.py"))
        .arg("--config")
        .arg(repo_root().join(config))
        .args(["--seed", &seed.to_string()])
        .args(["--prompt-ids", &prompt_s.join(",")])
        .args(["--steps", &steps.to_string()])
        .arg("--out-dir")
        .arg(&dir);
    if f32_on_bf16_ids {
        cmd.arg("--f32-on-bf16-ids");
    }
    let out = cmd.output().expect("run hf_reference.py");
    assert!(
        out.status.success(),
        "hf_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |f: &str| -> Generation {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    Oracle {
        f32: read("hf_float32.json"),
        bf16: read("hf_bfloat16.json"),
        f32_on_bf16: f32_on_bf16_ids.then(|| read("hf_float32_on_bfloat16_ids.json")),
        dir,
    }
}

/// Fixture `fixture` (`fixtures/models/<fixture>.json`) with `edit` applied, written to a
/// scratch file of this process's named after `variant`: its path (the caller removes it).
pub fn variant_config(
    fixture: &str,
    variant: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let path = repo_root().join(format!("fixtures/models/{fixture}.json"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    let cfg = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{variant}-{}.json", std::process::id()));
    std::fs::write(&cfg, v.to_string()).unwrap();
    cfg
}
