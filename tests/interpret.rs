//! Every library kernel in interpret mode: its serialized Mosaic body run by
//! `palladium_interpret` on seeded random inputs, against its plain-Rust reference, at its
//! defaults (or, where those are too big to run in seconds, the defaults with fewer
//! experts / groups) and two other shapes / block sizes, two seeds each.

use palladium::check::{CheckOptions, check};
use palladium_kernels::REGISTRY;
use std::process::Command;

/// Settings per kernel: the defaults (`vec![]`) first, or where the defaults take more than
/// a few seconds to generate or interpret (the MoE kernels' GiB-sized expert weights) the
/// defaults with the expert/group count cut down; then two other shapes / block sizes.
fn shapes(kernel: &str) -> Option<Vec<Vec<(&'static str, &'static str)>>> {
    Some(match kernel {
        "matmul" => vec![
            vec![],
            vec![
                ("m", "256"),
                ("k", "512"),
                ("n", "256"),
                ("bm", "128"),
                ("bk", "256"),
                ("bn", "128"),
            ],
            vec![
                ("m", "96"),
                ("k", "384"),
                ("n", "384"),
                ("bm", "32"),
                ("bk", "128"),
                ("bn", "128"),
                ("out_dtype", "f32"),
            ],
        ],
        "rmsnorm" => vec![
            vec![],
            vec![("rows", "64"), ("hidden", "256"), ("block_rows", "16")],
            vec![("rows", "48"), ("hidden", "1024"), ("block_rows", "48"), ("eps", "0.01")],
        ],
        "gather_rows" => vec![
            vec![],
            vec![("n", "5"), ("table_rows", "16"), ("r", "8"), ("d", "128"), ("scale", "0.5")],
            vec![("n", "12"), ("table_rows", "7"), ("r", "32"), ("d", "384"), ("scale", "-1.5")],
        ],
        "decode_attention" => vec![
            vec![],
            vec![
                ("batch", "3"),
                ("kv_heads", "2"),
                ("group", "4"),
                ("max_context", "1024"),
                ("block_kv", "128"),
            ],
            vec![
                ("batch", "2"),
                ("kv_heads", "1"),
                ("group", "16"),
                ("head_dim", "256"),
                ("max_context", "768"),
                ("block_kv", "256"),
            ],
        ],
        // DeepSeek-V2-Lite's head dims (the defaults); the tiny checkpoints' latent of 64
        // (padded to a lane tile) with a partial rope block and a single tile; V2-like heads
        // with rope filling its block.
        "mla_decode_attention" => vec![
            vec![],
            vec![
                ("batch", "3"),
                ("heads", "4"),
                ("nope", "32"),
                ("rope", "16"),
                ("v_dim", "32"),
                ("rank", "64"),
                ("max_context", "128"),
                ("block_kv", "128"),
                ("scale", "0.144"),
            ],
            vec![
                ("batch", "1"),
                ("heads", "8"),
                ("nope", "64"),
                ("rope", "128"),
                ("v_dim", "64"),
                ("rank", "128"),
                ("max_context", "512"),
                ("block_kv", "64"),
                ("scale", "0.1"),
            ],
        ],
        // Causal (blocks above the diagonal skipped, diagonal ones masked) and not; single-
        // and double-buffered K/V; a head_dim of 128 (no lane slice) with 2 key tiles per
        // major block (m and l tiled over 256 lanes).
        "flash_attention" => vec![
            vec![],
            vec![("causal", "false"), ("kv_buffers", "1")],
            vec![
                ("batch", "1"),
                ("seq_q", "256"),
                ("seq_k", "512"),
                ("head_dim", "128"),
                ("block_k", "256"),
                ("block_k_major", "512"),
                ("causal", "false"),
            ],
        ],
        // Arbitrary (odd, untiled) positions; random caches, so unchanged rows are checked too
        // (the aliased outputs start as the input caches only through the call spec).
        "kv_cache_update" => vec![
            vec![],
            vec![("batch", "5"), ("kv_heads", "1"), ("head_dim", "128"), ("max_context", "48")],
            // 304 = 19 blocks of 16 rows (a cache of whole blocks: the kernel DMAs the aligned
            // block holding the position).
            vec![("batch", "3"), ("kv_heads", "8"), ("head_dim", "64"), ("max_context", "304")],
        ],
        "moe_router" => vec![
            vec![],
            vec![
                ("tokens", "3"),
                ("hidden", "256"),
                ("experts", "64"),
                ("top_k", "2"),
                ("sigmoid", "true"),
                ("renormalize", "false"),
            ],
            vec![
                ("tokens", "16"),
                ("hidden", "1024"),
                ("experts", "256"),
                ("top_k", "6"),
                ("sigmoid", "true"),
            ],
        ],
        // 128 experts are 2.4 GB of weights; the interpreted work is the same with 8.
        "expert_ffn" => vec![
            vec![("experts", "8")],
            // 4 chunks per expert (even), 3 tokens (padded to 16 rows).
            vec![
                ("tokens", "3"),
                ("hidden", "512"),
                ("experts", "4"),
                ("top_k", "2"),
                ("ffn", "512"),
                ("block_ffn", "128"),
            ],
            vec![
                ("tokens", "16"),
                ("hidden", "256"),
                ("experts", "16"),
                ("top_k", "1"),
                ("ffn", "384"),
                ("block_ffn", "128"),
            ],
        ],
        // 128 groups are 1.6 GB of weights and ~50 G interpreted MACs.
        "grouped_matmul" => vec![
            vec![("groups", "8")],
            vec![
                ("m", "256"),
                ("k", "256"),
                ("n", "256"),
                ("groups", "4"),
                ("block_m", "64"),
                ("block_k", "128"),
                ("block_n", "128"),
            ],
            // More groups than m tiles: many empty groups, most tiles straddle.
            vec![
                ("m", "384"),
                ("k", "512"),
                ("n", "128"),
                ("groups", "16"),
                ("block_m", "128"),
                ("block_k", "256"),
                ("block_n", "128"),
            ],
            // A visit axis fixed below the worst case (4 tiles + 7): a routing of 9 visits.
            vec![
                ("m", "256"),
                ("k", "256"),
                ("n", "128"),
                ("groups", "8"),
                ("block_m", "64"),
                ("block_k", "128"),
                ("block_n", "128"),
                ("num_tiles", "9"),
            ],
        ],
        // int4 128-groups with a k split (the defaults, 8 groups), int8 per channel across k
        // steps (the group spans them), fp8 128-groups with many empty groups.
        "grouped_matmul_quantized" => vec![
            vec![("groups", "8")],
            vec![
                ("m", "256"),
                ("k", "512"),
                ("n", "256"),
                ("groups", "4"),
                ("block_m", "64"),
                ("block_k", "256"),
                ("block_n", "128"),
                ("wdtype", "i8"),
                ("group", "512"),
            ],
            vec![
                ("m", "384"),
                ("k", "1024"),
                ("n", "128"),
                ("groups", "16"),
                ("block_m", "128"),
                ("block_k", "1024"),
                ("block_n", "128"),
                ("wdtype", "f8e4m3fn"),
                ("group", "128"),
            ],
        ],
        // The collectives on 4 (the defaults), 2 and 8 virtual devices.
        "permute" => vec![
            vec![],
            vec![("n", "2"), ("rows", "16"), ("cols", "256")],
            vec![("n", "8"), ("shift", "3")],
        ],
        "all_gather" => {
            vec![vec![], vec![("n", "2"), ("rows", "32")], vec![("n", "8"), ("cols", "256")]]
        }
        "reduce_scatter" => {
            vec![vec![], vec![("n", "2"), ("cols", "256")], vec![("n", "8"), ("rows", "32")]]
        }
        "all_reduce" => vec![
            vec![],
            vec![("n", "2"), ("bidirectional", "false")],
            vec![("n", "8"), ("cols", "512")],
        ],
        "gemv" => vec![
            vec![],
            // k split: the output block accumulates across the k axis.
            vec![
                ("batch", "1"),
                ("k", "1024"),
                ("n", "2048"),
                ("block_n", "512"),
                ("block_k", "256"),
            ],
            vec![
                ("batch", "16"),
                ("k", "512"),
                ("n", "1536"),
                ("block_n", "768"),
                ("block_k", "512"),
            ],
        ],
        // int8 per channel (the defaults), int4 groups of 128 with a k split, fp8 128-groups.
        "gemv_quantized" => vec![
            vec![],
            vec![
                ("batch", "1"),
                ("k", "2048"),
                ("n", "1024"),
                ("block_n", "512"),
                ("block_k", "1024"),
                ("wdtype", "i4"),
                ("group", "128"),
            ],
            vec![
                ("batch", "16"),
                ("k", "512"),
                ("n", "1536"),
                ("block_n", "768"),
                ("block_k", "512"),
                ("wdtype", "f8e4m3fn"),
                ("group", "128"),
            ],
        ],
        // int8 per channel across k steps (the group spans them), int4 and fp8 128-groups.
        "matmul_quantized" => vec![
            vec![("m", "256"), ("k", "1024"), ("n", "256"), ("bk", "256"), ("group", "1024")],
            vec![
                ("m", "64"),
                ("k", "2048"),
                ("n", "256"),
                ("bm", "32"),
                ("bk", "1024"),
                ("bn", "128"),
                ("wdtype", "i4"),
                ("group", "128"),
            ],
            vec![
                ("m", "32"),
                ("k", "384"),
                ("n", "384"),
                ("bm", "32"),
                ("bk", "384"),
                ("bn", "128"),
                ("wdtype", "f8e4m3fn"),
                ("group", "128"),
            ],
        ],
        "rmsnorm_matmul_quantized" => vec![
            vec![],
            vec![
                ("rows", "64"),
                ("hidden", "512"),
                ("n", "512"),
                ("block_rows", "16"),
                ("block_n", "128"),
                ("wdtype", "i4"),
                ("group", "128"),
            ],
            vec![
                ("rows", "32"),
                ("hidden", "1024"),
                ("n", "768"),
                ("block_rows", "32"),
                ("block_n", "256"),
                ("wdtype", "f8e4m3fn"),
                ("group", "128"),
            ],
        ],
        // int4 experts (the defaults, 8 experts), fp8, int8 per channel (gate/up group = hidden).
        "expert_ffn_quantized" => vec![
            vec![("experts", "8")],
            vec![
                ("tokens", "3"),
                ("hidden", "512"),
                ("experts", "4"),
                ("top_k", "2"),
                ("ffn", "512"),
                ("block_ffn", "128"),
                ("wdtype", "f8e4m3fn"),
            ],
            vec![
                ("tokens", "16"),
                ("hidden", "256"),
                ("experts", "16"),
                ("top_k", "1"),
                ("ffn", "384"),
                ("block_ffn", "128"),
                ("wdtype", "i8"),
                ("group", "256"),
                ("down_group", "128"),
            ],
        ],
        "residual_add" | "residual_add_inplace" => vec![
            vec![],
            vec![("rows", "64"), ("hidden", "256"), ("block_rows", "16")],
            vec![("rows", "96"), ("hidden", "1024"), ("block_rows", "32")],
        ],
        "rmsnorm_matmul" => vec![
            vec![],
            vec![
                ("rows", "64"),
                ("hidden", "512"),
                ("n", "512"),
                ("block_rows", "16"),
                ("block_n", "128"),
                ("eps", "0.01"),
            ],
            vec![
                ("rows", "32"),
                ("hidden", "256"),
                ("n", "768"),
                ("block_rows", "32"),
                ("block_n", "256"),
            ],
        ],
        "rope" => vec![
            vec![],
            vec![
                ("tokens", "64"),
                ("heads", "4"),
                ("head_dim", "128"),
                ("block_t", "16"),
                ("heads_per_block", "2"),
                ("interleaved", "true"),
            ],
            vec![
                ("tokens", "32"),
                ("heads", "2"),
                ("head_dim", "256"),
                ("block_t", "32"),
                ("heads_per_block", "1"),
            ],
        ],
        _ => return None,
    })
}

#[test]
fn every_library_kernel_matches_its_reference_in_interpret_mode() {
    let mut failures = Vec::new();
    for e in REGISTRY {
        let Some(sets) = shapes(e.name) else {
            failures.push(format!("{}: no shapes listed in tests/interpret.rs", e.name));
            continue;
        };
        for set in sets {
            let settings: Vec<(String, String)> =
                set.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            for seed in [1, 2] {
                match check(e.name, &settings, &CheckOptions { seed, ..CheckOptions::default() }) {
                    Ok(report) => {
                        println!("{report}");
                        if !report.passed() {
                            failures.push(report.to_string());
                        }
                    }
                    Err(err) => {
                        failures.push(format!("{} {settings:?} seed {seed}: {err}", e.name))
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The ring collectives round each hop's partial sum to bf16 (the wire's type); their
/// references add in the ring's order with the same roundings, so the interpreted sums are
/// their references bit for bit at every ring size (a reference that summed in f32 and
/// rounded once drifted past the bf16 tolerance near 12 devices).
#[test]
fn ring_sums_match_their_references_bit_for_bit() {
    for (kernel, extra) in
        [("reduce_scatter", None), ("all_reduce", Some("true")), ("all_reduce", Some("false"))]
    {
        for n in [2, 3, 7, 12] {
            let mut settings = vec![("n".to_string(), n.to_string())];
            if let Some(b) = extra {
                settings.push(("bidirectional".to_string(), b.to_string()));
            }
            let report = check(kernel, &settings, &CheckOptions { seed: 5, ..Default::default() })
                .unwrap_or_else(|e| panic!("{kernel} {settings:?}: {e}"));
            for o in &report.outputs {
                assert_eq!(o.max_abs, 0.0, "{kernel} {settings:?}: {}", report);
            }
        }
    }
}

fn palladium(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_prints_errors_per_output_and_fails_out_of_tolerance() {
    let small = [
        "--set", "m=64", "--set", "k=256", "--set", "n=128", "--set", "bm=16", "--set", "bk=128",
        "--set", "bn=128",
    ];
    let (ok, out, err) = palladium(&[&["interpret", "gather_rows", "--seed", "3"][..]].concat());
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("out      bf16[8,16,256]")
            && out.contains("max abs err 0.000e0  max rel err 0.000e0  tolerance 1e-2  ok")
            && out.ends_with("PASS\n"),
        "{out}"
    );
    let (ok, out, err) = palladium(&[&["interpret", "matmul", "--seed", "1"][..], &small].concat());
    assert!(ok, "{out}{err}");
    assert!(out.contains("matmul m=64 k=256 n=128 bm=16 bk=128 bn=128 out_dtype=bf16 on v6e, seed 1: grid (4, 1, 2)"), "{out}");
    // An exact tolerance f32 output cannot meet (the interpreter sums the k blocks in another
    // order than the reference; negative tolerances are refused): the comparison fails, the
    // exit status says so.
    let (ok, out, err) =
        palladium(
            &[
                &[
                    "interpret",
                    "matmul",
                    "--seed",
                    "1",
                    "--set",
                    "out_dtype=f32",
                    "--tolerance",
                    "0",
                ][..],
                &small,
            ]
            .concat(),
        );
    assert!(
        !ok && out.contains("FAIL") && err.contains("`matmul` does not match its reference"),
        "{out}{err}"
    );
    let (ok, _, err) = palladium(&["interpret", "matmul", "--set", "m=1000", "--set", "bm=100"]);
    assert!(!ok && err.contains("TPU block rule: the second-minor block dim (100)"), "{err}");
}
