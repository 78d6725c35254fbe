//! Test helpers: the kernels under test (the library's, plus `#[kernel]`s for the ops the
//! library does not use) and the TPU oracle.
#![allow(dead_code)]

use palladium_dsl::Kernel;
use std::path::{Path, PathBuf};
use std::process::Command;

// --- the kernels of the tests ------------------------------------------------------------------

/// Every kernel the lowering tests cover, by name: each kernel of the library
/// (`palladium_kernels::REGISTRY`, at its defaults), then [`extra_kernels`].
pub fn all_kernels() -> Vec<(String, Kernel)> {
    let mut all: Vec<(String, Kernel)> = palladium_kernels::REGISTRY
        .iter()
        .map(|e| (e.name.to_string(), (e.build)(&[]).unwrap_or_else(|err| panic!("library kernel {}: {err}", e.name))))
        .collect();
    all.extend(extra_kernels());
    all
}

/// A library kernel at its defaults.
pub fn library_kernel(name: &str) -> Kernel {
    palladium_kernels::build(name, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// The op-coverage kernels (`palladium_kernels::coverage`), plus library kernels at
/// non-default settings that change the emitted types.
pub fn extra_kernels() -> Vec<(String, Kernel)> {
    let mut all: Vec<(String, Kernel)> = palladium_kernels::coverage::ALL
        .iter()
        .map(|(name, build)| (name.to_string(), build().unwrap_or_else(|e| panic!("coverage kernel {name}: {e}"))))
        .collect();
    let settings = [("matmul_f32_out", "matmul", [("out_dtype", "f32")])];
    for (label, kernel, sets) in settings {
        let sets: Vec<(String, String)> = sets.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        all.push((label.to_string(), palladium_kernels::build(kernel, &sets).unwrap_or_else(|e| panic!("{label}: {e}"))));
    }
    all
}

// --- the oracle ---------------------------------------------------------------------------------

/// `../shared/tpu-oracle/oracle.py` relative to the repository root.
pub fn oracle_script() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tpu-oracle/oracle.py");
    assert!(p.is_file(), "the TPU oracle is missing: expected {} (a checkout of shared/ beside the repository)", p.display());
    p
}

/// The oracle's Python: `$PALLADIUM_TPU_VENV/bin/python`, default `~/.cache/palladium/venv-tpu`.
pub fn oracle_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is not set");
        Path::new(&home).join(".cache/palladium/venv-tpu")
    });
    let py = venv.join("bin/python");
    assert!(py.is_file(), "the TPU oracle venv is missing: expected {} (set PALLADIUM_TPU_VENV)", py.display());
    py
}

/// Run `oracle.py ARGS…` in `dir`; returns (success, stdout).
pub fn oracle(dir: &Path, args: &[&str]) -> (bool, String) {
    oracle_with_env(dir, args, &[])
}

/// [`oracle`] with extra environment variables (e.g. `ORACLE_CYCLES=0`).
pub fn oracle_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    // Deviceless compiles need no TPU, so libtpu's single-process lock only gets in the way
    // when another oracle (another test binary, a developer's shell) runs at the same time.
    let out = Command::new(oracle_python())
        .arg(oracle_script())
        .args(args)
        .env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("cannot run the oracle");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A fresh scratch directory under the target dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("cannot create a scratch dir");
    d
}
