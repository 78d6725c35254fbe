//! Every crate's integration tests are one binary, `tests/main.rs` (`autotests = false`):
//! a test file that `main.rs` does not declare would be neither built nor run, silently.

use std::path::{Path, PathBuf};

/// The `tests/*.rs` files of `dir` that `tests/main.rs` does not declare (`mod NAME;`).
fn undeclared(dir: &Path) -> Vec<PathBuf> {
    let tests = dir.join("tests");
    let main = std::fs::read_to_string(tests.join("main.rs"))
        .unwrap_or_else(|e| panic!("{}: {e}", tests.join("main.rs").display()));
    let declared: Vec<&str> =
        main.lines().filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';')).collect();
    let mut missing: Vec<PathBuf> = std::fs::read_dir(&tests)
        .unwrap_or_else(|e| panic!("{}: {e}", tests.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy();
            stem != "main" && !declared.contains(&&*stem)
        })
        .collect();
    missing.sort();
    missing
}

#[test]
fn every_test_file_is_a_module_of_its_crates_test_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![root.to_path_buf()];
    for entry in std::fs::read_dir(root).expect("the repository root") {
        let dir = entry.expect("a directory entry").path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if manifest.contains("autotests = false") {
            crates.push(dir);
        }
    }
    assert!(crates.len() > 5, "found only {crates:?}");
    let missing: Vec<PathBuf> = crates.iter().flat_map(|c| undeclared(c)).collect();
    assert!(
        missing.is_empty(),
        "test files without a `mod` line in their crate's tests/main.rs (never built nor run): \
         {missing:?}"
    );
}

#[test]
fn an_undeclared_test_file_is_found() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("test-binaries-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::write(dir.join("tests/main.rs"), "mod common;\n\nmod declared;\n").unwrap();
    for file in ["declared.rs", "forgotten.rs"] {
        std::fs::write(dir.join("tests").join(file), "").unwrap();
    }
    assert_eq!(undeclared(&dir), vec![dir.join("tests/forgotten.rs")]);
    std::fs::remove_dir_all(&dir).unwrap();
}
