//! What the CLI's end-to-end tests share: running the built `palladium` binary, and a fresh
//! scratch folder per test.
use std::path::PathBuf;
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

/// An empty path under the test target's temporary folder (removed if a previous run left it).
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
