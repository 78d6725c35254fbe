//! Every library kernel in interpret mode: its serialized Mosaic body run by
//! `palladium_interpret` on seeded random inputs, against its plain-Rust reference, at its
//! defaults and two other shapes / block sizes, two seeds each.

use palladium::check::{CheckOptions, check};
use palladium_kernels::REGISTRY;
use std::process::Command;

/// Settings per kernel besides the defaults (which always run).
fn shapes(kernel: &str) -> Option<Vec<Vec<(&'static str, &'static str)>>> {
    Some(match kernel {
        "matmul" => vec![
            vec![("m", "256"), ("k", "512"), ("n", "256"), ("bm", "128"), ("bk", "256"), ("bn", "128")],
            vec![("m", "96"), ("k", "384"), ("n", "384"), ("bm", "32"), ("bk", "128"), ("bn", "128")],
        ],
        "rmsnorm" => vec![vec![("rows", "64"), ("hidden", "256"), ("block_rows", "16")], vec![("rows", "48"), ("hidden", "1024"), ("block_rows", "48"), ("eps", "0.01")]],
        "gather_rows" => vec![vec![("n", "5"), ("table_rows", "16"), ("r", "8"), ("d", "128"), ("scale", "0.5")], vec![("n", "12"), ("table_rows", "7"), ("r", "32"), ("d", "384"), ("scale", "-1.5")]],
        "decode_attention" => vec![
            vec![("batch", "3"), ("kv_heads", "2"), ("group", "4"), ("max_context", "1024"), ("block_kv", "128")],
            vec![("batch", "2"), ("kv_heads", "1"), ("group", "16"), ("head_dim", "256"), ("max_context", "768"), ("block_kv", "256")],
        ],
        _ => return None,
    })
}

#[test]
fn every_library_kernel_matches_its_reference_in_interpret_mode() {
    let mut failures = Vec::new();
    for e in REGISTRY {
        let Some(extra) = shapes(e.name) else {
            failures.push(format!("{}: no shapes listed in tests/interpret.rs", e.name));
            continue;
        };
        for set in std::iter::once(Vec::new()).chain(extra) {
            let settings: Vec<(String, String)> = set.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            for seed in [1, 2] {
                match check(e.name, &settings, &CheckOptions { seed, ..CheckOptions::default() }) {
                    Ok(report) => {
                        println!("{report}");
                        if !report.passed() {
                            failures.push(report.to_string());
                        }
                    }
                    Err(err) => failures.push(format!("{} {settings:?} seed {seed}: {err}", e.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn palladium(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn cli_prints_errors_per_output_and_fails_out_of_tolerance() {
    let small = ["--set", "m=64", "--set", "k=256", "--set", "n=128", "--set", "bm=16", "--set", "bk=128", "--set", "bn=128"];
    let (ok, out, err) = palladium(&[&["interpret", "gather_rows", "--seed", "3"][..]].concat());
    assert!(ok, "{out}{err}");
    assert!(out.contains("out      bf16[8,16,256]") && out.contains("max abs err 0.000e0  max rel err 0.000e0  tolerance 1e-2  ok") && out.ends_with("PASS\n"), "{out}");
    let (ok, out, err) = palladium(&[&["interpret", "matmul", "--seed", "1"][..], &small].concat());
    assert!(ok, "{out}{err}");
    assert!(out.contains("matmul m=64 k=256 n=128 bm=16 bk=128 bn=128 on v6e, seed 1: grid (4, 1, 2)"), "{out}");
    // A negative tolerance nothing can meet: the comparison fails, the exit status says so.
    let (ok, out, err) = palladium(&[&["interpret", "matmul", "--seed", "1", "--tolerance=-1"][..], &small].concat());
    assert!(!ok && out.contains("FAIL") && err.contains("`matmul` does not match its reference"), "{out}{err}");
    let (ok, _, err) = palladium(&["interpret", "matmul", "--set", "bm=100"]);
    assert!(!ok && err.contains("TPU block rule: the second-minor block dim (100)"), "{err}");
}
