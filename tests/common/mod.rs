//! What the CLI's end-to-end tests share: running the built `palladium` binary, the model
//! fixtures, and a fresh scratch folder per test.

// Each test crate uses a part of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run `palladium ARGS`: (success, stdout, stderr).
pub fn palladium(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An empty path under the test target's temporary folder (removed if a previous run left it),
/// this process's own: test binaries (and, under `cargo nextest`, tests) run side by side.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Exit code, stdout, stderr of `palladium ARGS` with `env` set, and the environment variables
/// the tests check otherwise unset (so a developer's own settings change no result).
pub fn palladium_code(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium"))
        .args(args)
        .env_remove("PALLADIUM_MAX_HOST_MEMORY")
        .env_remove("PALLADIUM_COMPILE_WORKERS")
        .envs(env.iter().copied())
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A model config of `fixtures/models`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/models/{name}.json"))
}

/// Files in `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
