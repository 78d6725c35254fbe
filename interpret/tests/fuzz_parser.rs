//! Property tests of the parser and `prepare` on mutated real bodies: the serialized
//! Mosaic body of every library kernel (small settings), with bytes flipped, the text
//! truncated, or whitespace-separated tokens deleted, duplicated or swapped for a token of
//! another body. Errors are expected; a panic (or an abort: an allocation sized by a
//! mutated shape) is a bug.
//!
//! A fixed seed and 24 mutations per kernel by default; fuzz longer with e.g.
//! `PROPTEST_CASES=5000 PROPTEST_RNG_SEED=3 cargo test -p palladium-interpret --test tests
//! fuzz_parser::`.

use palladium_dsl::spec::Chip;
use palladium_interpret::Module;
use palladium_kernels::REGISTRY;
use palladium_lowering::{LowerOptions, lower};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner, contextualize_config};

/// Small settings per kernel (its defaults where they are small already).
fn small(kernel: &str) -> Vec<(String, String)> {
    let s: &[(&str, &str)] = match kernel {
        "matmul" => {
            &[("m", "256"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "128"), ("bn", "128")]
        }
        "expert_ffn" => &[
            ("experts", "4"),
            ("hidden", "256"),
            ("ffn", "256"),
            ("block_ffn", "128"),
            ("top_k", "2"),
        ],
        "grouped_matmul" => &[
            ("m", "256"),
            ("k", "256"),
            ("n", "256"),
            ("groups", "4"),
            ("block_m", "128"),
            ("block_k", "128"),
            ("block_n", "128"),
        ],
        _ => &[],
    };
    s.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

fn bodies() -> Vec<(&'static str, String)> {
    REGISTRY
        .iter()
        .map(|e| {
            let k = (e.build)(&small(e.name)).unwrap_or_else(|err| panic!("{}: {err}", e.name));
            (
                e.name,
                lower(&k, &LowerOptions { chip: Chip::V6e })
                    .unwrap_or_else(|err| panic!("{}: {err}", e.name))
                    .body,
            )
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Mutation {
    /// XOR a byte with a mask.
    Flip {
        at: usize,
        mask: u8,
    },
    Truncate {
        at: usize,
    },
    DeleteToken {
        at: usize,
    },
    DuplicateToken {
        at: usize,
    },
    /// Replace a token with a token of any body (possibly another kernel's).
    ReplaceToken {
        at: usize,
        from: usize,
        with: usize,
    },
    /// Replace a number with a hostile one.
    Number {
        at: usize,
        value: &'static str,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        at.prop_map(|at| Mutation::Truncate { at }),
        at.prop_map(|at| Mutation::DeleteToken { at }),
        at.prop_map(|at| Mutation::DuplicateToken { at }),
        (at, any::<usize>(), any::<usize>()).prop_map(|(at, from, with)| Mutation::ReplaceToken {
            at,
            from,
            with
        }),
        (
            at,
            prop::sample::select(vec![
                "0",
                "-1",
                "4294967296",
                "9223372036854775807",
                "-9223372036854775808",
                "99999999999999999999",
                "1e400",
                "nan"
            ])
        )
            .prop_map(|(at, value)| Mutation::Number { at, value }),
    ]
}

/// Byte ranges of whitespace-separated tokens.
fn tokens(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// Byte ranges of decimal numbers (digit runs, with a leading `-`).
fn numbers(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let s = if i > 0 && b[i - 1] == b'-' { i - 1 } else { i };
            let mut e = i;
            while e < b.len() && b[e].is_ascii_digit() {
                e += 1;
            }
            out.push((s, e));
            i = e;
        } else {
            i += 1;
        }
    }
    out
}

fn apply(text: &str, m: &Mutation, all: &[(&str, String)]) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    let toks = tokens(text);
    let pick = |ranges: &[(usize, usize)], at: usize| ranges.get(at % ranges.len().max(1)).copied();
    match *m {
        Mutation::Flip { at, mask } => {
            let i = at % bytes.len();
            bytes[i] ^= mask;
        }
        Mutation::Truncate { at } => bytes.truncate(at % (bytes.len() + 1)),
        Mutation::DeleteToken { at } => {
            if let Some((s, e)) = pick(&toks, at) {
                bytes.drain(s..e);
            }
        }
        Mutation::DuplicateToken { at } => {
            if let Some((s, e)) = pick(&toks, at) {
                let t = bytes[s..e].to_vec();
                bytes.splice(e..e, [b" ".as_slice(), &t].concat());
            }
        }
        Mutation::ReplaceToken { at, from, with } => {
            let other = &all[from % all.len()].1;
            if let (Some((s, e)), Some((os, oe))) = (pick(&toks, at), pick(&tokens(other), with)) {
                bytes.splice(s..e, other.as_bytes()[os..oe].to_vec());
            }
        }
        Mutation::Number { at, value } => {
            if let Some((s, e)) = pick(&numbers(text), at) {
                bytes.splice(s..e, value.bytes());
            }
        }
    }
    bytes
}

#[test]
fn mutated_bodies_never_panic_the_parser_or_prepare() {
    let all = bodies();
    for (name, body) in &all {
        // The unmutated body parses and prepares.
        Module::parse(body)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .prepare()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let config = contextualize_config(Config {
            cases: 24,
            rng_seed: RngSeed::Fixed(0x5eed),
            failure_persistence: None,
            ..Config::default()
        });
        let mut runner = TestRunner::new(config);
        let result = runner.run(&mutation(), |m| {
            let mutated = apply(body, &m, &all);
            // Invalid UTF-8 never reaches the parser (it takes text).
            if let Ok(text) = std::str::from_utf8(&mutated)
                && let Ok(module) = Module::parse(text)
            {
                let _ = module.prepare();
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{name}: {e}");
        }
    }
}

/// Found by the fuzzer (a result count mutated to 2^32 allocated 4 G result names): a
/// result group larger than the op's type could list is a parse error.
#[test]
fn a_result_group_count_never_sizes_an_allocation() {
    let text =
        "module {\n  %0:4294967296 = \"arith.constant\"() {value = 0 : i32} : () -> i32\n}\n";
    let err = Module::parse(text).unwrap_err().to_string();
    assert!(
        err.contains("result group `%0:4294967296` has more results than the op's type can list"),
        "{err}"
    );
}
