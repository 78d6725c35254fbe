//! Palladium kernels called from JAX (`python/palladium_jax`), deviceless on v6e: `palladium
//! emit` / `palladium megakernel` write the files, then `python/tests/test_deviceless.py` loads
//! them with `palladium_jax.load`, compiles them with libtpu through `jax.jit` and
//! `jax.shard_map`, and compares with JAX's own `tpu_custom_call` (see that script's docs).
//! Needs the venv `scripts/setup.sh` installs (`$PALLADIUM_TPU_VENV`).
use std::path::{Path, PathBuf};
use std::process::Command;

/// `$PALLADIUM_TPU_VENV/bin/python`, default `~/.cache/palladium/venv-tpu`.
fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is not set");
        Path::new(&home).join(".cache/palladium/venv-tpu")
    });
    let py = venv.join("bin/python");
    assert!(
        py.is_file(),
        "the JAX venv is missing: expected {} (run scripts/setup.sh or set PALLADIUM_TPU_VENV)",
        py.display()
    );
    py
}

fn palladium(args: &[&str]) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs palladium");
    assert!(
        out.status.success(),
        "palladium {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn emitted_kernels_compile_from_jax_deviceless_on_v6e() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("jax_interop");
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.to_str().expect("a UTF-8 path");
    for kernel in ["matmul", "residual_add_inplace", "kv_cache_update"] {
        palladium(&["emit", kernel, "--chip", "v6e", "--out", out]);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = repo.join("fixtures/models/tiny-qwen3-moe.json");
    palladium(&[
        "megakernel",
        config.to_str().expect("a UTF-8 path"),
        "--chip",
        "v6e",
        "--out",
        out,
    ]);

    let script = repo.join("python/tests/test_deviceless.py");
    let result = Command::new(venv_python())
        .arg(&script)
        .arg(&dir)
        .output()
        .expect("runs the venv's python");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(result.status.success(), "{} failed:\n{log}", script.display());
    eprintln!("{log}");
}
