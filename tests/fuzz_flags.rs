//! Property tests over the command lines of `profile` and of `run`'s speculation: random
//! combinations of the targets, the profile options (--set, --prefetch, the plan options,
//! --unfused, --positions) and the drafting flags (--speculate, --draft-ids,
//! --tokens-per-seq, --context, --check, --tolerance, --devices). Every run either succeeds
//! with the right answer (the files written, the positions profiled, the ids of plain
//! greedy decoding) or exits 1 or 2 with the message an oracle predicts from the flags;
//! never a panic or an abort, and never a flag ignored with exit 0.
//!
//! A fixed seed and a few dozen cases (a few seconds each command line); fuzz longer with
//! e.g. `PROPTEST_CASES=500 PROPTEST_RNG_SEED=7 cargo test --test tests fuzz_flags::`.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner, contextualize_config};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

fn config(cases: u32) -> Config {
    contextualize_config(Config {
        cases,
        rng_seed: RngSeed::Fixed(0xf1a95),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Exit code (`None`: killed by a signal), stdout, stderr.
fn palladium(args: &[String]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium"))
        .args(args)
        .env_remove("PALLADIUM_MAX_HOST_MEMORY")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a command line must do.
#[derive(Debug)]
enum Expect {
    /// Exit 0.
    Ok,
    /// Exit `code` with every one of these in the message.
    Refused(i32, Vec<String>),
}

fn refused(code: i32, wants: &[&str]) -> Expect {
    Expect::Refused(code, wants.iter().map(|s| s.to_string()).collect())
}

/// The outcome checked against the prediction; what succeeded is returned for the caller's
/// own checks.
fn outcome(args: &[String], expect: &Expect) -> Result<Option<(String, String)>, String> {
    let (code, out, err) = palladium(args);
    let bad = |why: &str| Err(format!("{args:?}: {why} (exit {code:?})\n{out}{err}"));
    if err.contains("panicked") || code.is_none() {
        return bad("panicked or killed");
    }
    match expect {
        Expect::Ok if code == Some(0) => Ok(Some((out, err))),
        Expect::Ok => bad("expected success"),
        Expect::Refused(want, wants) => {
            if code != Some(*want) {
                return bad(&format!("expected exit {want} with {wants:?}"));
            }
            match wants.iter().find(|w| !err.contains(w.as_str())) {
                Some(w) => bad(&format!("the message lacks {w:?}")),
                None => Ok(None),
            }
        }
    }
}

/// This process's own empty path (test binaries, and tests under `cargo nextest`, run side
/// by side).
fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Gemv,
    DecodeAttention,
    /// Qwen3-30B-A3B's megakernel, `--layers` 1 or 2.
    Megakernel(u64),
}

#[derive(Clone, Debug)]
struct ProfileCase {
    target: Target,
    set: bool,
    lens: Option<(i64, i64)>,
    batch: Option<u64>,
    layers: Option<u64>,
    context: Option<u64>,
    tokens_per_seq: Option<u64>,
    devices: Option<u64>,
    int4: bool,
    /// --all-kv-tiles, --single-prefetch, --logits, --worst-case-experts.
    switches: [bool; 4],
    unfused: bool,
    positions: Option<Vec<i64>>,
}

const SWITCHES: [&str; 4] =
    ["--all-kv-tiles", "--single-prefetch", "--logits", "--worst-case-experts"];

fn profile_case() -> impl Strategy<Value = ProfileCase> {
    let target = prop_oneof![
        1 => Just(Target::Gemv),
        1 => Just(Target::DecodeAttention),
        2 => (1u64..=2).prop_map(Target::Megakernel),
    ];
    let len = prop_oneof![
        Just(-1i64),
        Just(0),
        Just(1),
        Just(700),
        Just(4096),
        Just(4097),
        Just(99999),
        Just(i32::MAX as i64)
    ];
    let position = prop_oneof![Just(-1i64), Just(0), Just(5), Just(200), Just(255), Just(4095)];
    let small =
        |p: f64, values: Vec<u64>| proptest::option::weighted(p, proptest::sample::select(values));
    (
        (
            target,
            proptest::bool::weighted(0.3),
            proptest::option::weighted(0.6, (len.clone(), len)),
        ),
        (
            small(0.3, vec![1, 2]),
            small(0.1, vec![1]),
            small(0.4, vec![256, 4096]),
            small(0.3, vec![1, 2]),
            small(0.3, vec![1, 2]),
            proptest::bool::weighted(0.2),
        ),
        (
            proptest::array::uniform4(proptest::bool::weighted(0.15)),
            proptest::bool::weighted(0.3),
            proptest::option::weighted(0.4, proptest::collection::vec(position, 1..=2)),
            proptest::bool::weighted(0.35),
        ),
    )
        .prop_map(
            |(
                (target, set, lens),
                (batch, layers, context, tokens_per_seq, devices, int4),
                (switches, unfused, positions, stray),
            )| {
                let mut case = ProfileCase {
                    target,
                    set,
                    lens,
                    batch,
                    layers,
                    context,
                    tokens_per_seq,
                    devices,
                    int4,
                    switches,
                    unfused,
                    positions,
                };
                // Most cases give only the target's own flags; the rest, any.
                if !stray {
                    case.keep_to_the_target();
                }
                case
            },
        )
}

impl ProfileCase {
    /// Drops the flags the target does not take.
    fn keep_to_the_target(&mut self) {
        if let Target::Megakernel(_) = self.target {
            (self.set, self.lens) = (false, None);
        } else {
            *self = ProfileCase {
                target: self.target,
                set: self.set,
                lens: self.lens,
                batch: None,
                layers: None,
                context: None,
                tokens_per_seq: None,
                devices: None,
                int4: false,
                switches: [false; 4],
                unfused: false,
                positions: None,
            };
        }
    }

    fn args(&self, out: &str) -> Vec<String> {
        let mut a: Vec<String> = vec!["profile".into()];
        match self.target {
            Target::Gemv => a.push("gemv".into()),
            Target::DecodeAttention => a.push("decode_attention".into()),
            Target::Megakernel(layers) => a.extend([
                "--megakernel".into(),
                "fixtures/models/qwen3-30b-a3b.json".into(),
                "--layers".into(),
                layers.to_string(),
            ]),
        }
        if self.set {
            let setting = if self.target == Target::DecodeAttention {
                "block_kv=1024"
            } else {
                "block_n=1792"
            };
            a.extend(["--set".into(), setting.into()]);
        }
        if let Some((x, y)) = self.lens {
            a.push(format!("--prefetch=lens={x},{y}"));
        }
        let numbers = [
            ("--batch", self.batch),
            ("--layers", self.layers.filter(|_| !matches!(self.target, Target::Megakernel(_)))),
            ("--context", self.context),
            ("--tokens-per-seq", self.tokens_per_seq),
            ("--devices", self.devices),
        ];
        for (flag, v) in numbers {
            if let Some(v) = v {
                a.extend([flag.into(), v.to_string()]);
            }
        }
        if self.int4 {
            a.extend(["--weights-dtype".into(), "int4".into()]);
        }
        for (on, flag) in self.switches.iter().zip(SWITCHES) {
            if *on {
                a.push(flag.into());
            }
        }
        if self.unfused {
            a.push("--unfused".into());
        }
        if let Some(p) = &self.positions {
            let list: Vec<String> = p.iter().map(i64::to_string).collect();
            a.push(format!("--positions={}", list.join(",")));
        }
        a.extend(["--chip".into(), "v6e".into(), "--out".into(), out.into()]);
        a
    }

    /// The megakernel-only flags given.
    fn plan_flags(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        for (flag, given) in [
            ("--batch", self.batch.is_some()),
            ("--layers", self.layers.is_some()),
            ("--context", self.context.is_some()),
            ("--tokens-per-seq", self.tokens_per_seq.is_some()),
            ("--devices", self.devices.is_some()),
            ("--weights-dtype", self.int4),
            ("--unfused", self.unfused),
            ("--positions", self.positions.is_some()),
        ] {
            if given {
                f.push(flag);
            }
        }
        f.extend(SWITCHES.iter().zip(self.switches).filter(|(_, on)| *on).map(|(f, _)| *f));
        f
    }

    fn expect(&self) -> Expect {
        let kernel = |name: &str| -> Expect {
            if !self.plan_flags().is_empty() {
                return refused(2, &["is a megakernel option", &format!("to profile `{name}`")]);
            }
            match (self.target, self.lens) {
                (Target::Gemv, Some(_)) => refused(1, &["scalar prefetch `lens`"]),
                (Target::Gemv, None) => Expect::Ok,
                (_, None) => refused(1, &["the loop's upper bound depends on run-time data"]),
                (_, Some((x, y))) => match [x, y].iter().position(|v| !(1..=4096).contains(v)) {
                    Some(i) => refused(
                        1,
                        &[&format!(
                            "scalar prefetch `lens`: value {i} is {}, outside the range 1..=4096",
                            [x, y][i]
                        )],
                    ),
                    None => Expect::Ok,
                },
            }
        };
        match self.target {
            Target::Gemv => kernel("gemv"),
            Target::DecodeAttention => kernel("decode_attention"),
            Target::Megakernel(_) => {
                if self.set || self.lens.is_some() {
                    return refused(2, &["applies to a library KERNEL"]);
                }
                let k = self.tokens_per_seq.unwrap_or(1);
                if self.unfused {
                    let why = if k != 1 {
                        "one token per sequence"
                    } else if self.devices.unwrap_or(1) != 1 {
                        "modelled on one device"
                    } else if self.int4 {
                        "with int4 weights"
                    } else if self.positions.is_some() {
                        "the fused one from --positions"
                    } else {
                        ""
                    };
                    if !why.is_empty() {
                        return refused(1, &["--unfused: the unfused step", why]);
                    }
                }
                let (batch, context) = (self.batch.unwrap_or(1), self.context.unwrap_or(4096));
                if let Some(p) = &self.positions {
                    if p.len() as u64 != batch {
                        return refused(
                            1,
                            &[&format!("--positions: {} positions for --batch {batch}", p.len())],
                        );
                    }
                    if let Some(bad) = p.iter().find(|&&p| p < 0) {
                        return refused(1, &[&format!("--positions: {bad} is not a position")]);
                    }
                    if let Some(bad) = p.iter().find(|&&p| p as u64 + k > context) {
                        return refused(
                            1,
                            &[&format!("--positions: {bad} + {k} new tokens is past --context")],
                        );
                    }
                }
                Expect::Ok
            }
        }
    }

    /// The positions a successful megakernel profile must report.
    fn profiled_positions(&self) -> Vec<i64> {
        let (batch, context) = (self.batch.unwrap_or(1), self.context.unwrap_or(4096));
        let k = self.tokens_per_seq.unwrap_or(1);
        self.positions.clone().unwrap_or_else(|| vec![(context - k) as i64; batch as usize])
    }
}

#[test]
fn profile_command_lines_use_every_flag_or_refuse_it() {
    let dir = scratch("fuzz_flags_profile");
    let out = dir.to_str().unwrap().to_string();
    let (refusals, successes) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    TestRunner::new(config(40))
        .run(&profile_case(), |case| {
            let _ = std::fs::remove_dir_all(&dir);
            let args = case.args(&out);
            let expect = case.expect();
            let Some((stdout, _)) = outcome(&args, &expect).map_err(TestCaseError::fail)? else {
                prop_assert!(!dir.exists(), "{args:?} was refused but wrote {out}");
                refusals.set(refusals.get() + 1);
                return Ok(());
            };
            successes.set(successes.get() + 1);
            for name in ["trace.json", "timeline.svg", "summary.json"] {
                prop_assert!(dir.join(name).is_file(), "{args:?}: no {name}");
            }
            let summary: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                    .unwrap();
            prop_assert_eq!(summary.get("unfused").is_some(), case.unfused, "{:?}", args);
            if let Target::Megakernel(_) = case.target {
                let want = format!("positions: {:?}", case.profiled_positions());
                prop_assert!(stdout.contains(&want), "{:?}: {} not in\n{}", args, want, stdout);
            }
            Ok(())
        })
        .unwrap();
    println!("{} refused, {} profiled", refusals.get(), successes.get());
    assert!(refusals.get() > 0 && successes.get() > 0);
}

#[derive(Clone, Debug)]
struct RunCase {
    steps: u64,
    tokens_per_seq: Option<u64>,
    speculate: Option<&'static str>,
    draft_ids: Option<&'static str>,
    context: Option<u64>,
    check: bool,
    tolerance: bool,
    devices: u64,
}

fn run_case() -> impl Strategy<Value = RunCase> {
    (
        proptest::sample::select(vec![1u64, 3]),
        proptest::option::weighted(0.6, proptest::sample::select(vec![1u64, 2, 2, 4, 4, 0, 17])),
        proptest::option::weighted(
            0.5,
            proptest::sample::select(vec![
                "ngram", "ngram", "ngram:2", "ngram:2", "ngram:0", "bigram",
            ]),
        ),
        proptest::option::weighted(0.2, proptest::sample::select(vec!["5,6,7", "5,6,7", "1,x"])),
        proptest::option::weighted(0.3, proptest::sample::select(vec![3u64, 6, 64, 64])),
        proptest::bool::weighted(0.3),
        proptest::bool::weighted(0.1),
        proptest::sample::select(vec![1u64, 1, 2]),
    )
        .prop_map(
            |(steps, tokens_per_seq, speculate, draft_ids, context, check, tolerance, devices)| {
                RunCase {
                    steps,
                    tokens_per_seq,
                    speculate,
                    draft_ids,
                    context,
                    check,
                    tolerance,
                    devices,
                }
            },
        )
}

const PROMPT: [u32; 5] = [1, 2, 3, 1, 2];

impl RunCase {
    fn args(&self) -> Vec<String> {
        let prompt: Vec<String> = PROMPT.iter().map(u32::to_string).collect();
        let mut a: Vec<String> = [
            "run",
            "fixtures/models/tiny-qwen3-moe.json",
            "--random-weights",
            "--prompt-ids",
            &prompt.join(","),
            "--steps",
            &self.steps.to_string(),
        ]
        .map(String::from)
        .to_vec();
        let options = [
            ("--tokens-per-seq", self.tokens_per_seq.map(|k| k.to_string())),
            ("--speculate", self.speculate.map(String::from)),
            ("--draft-ids", self.draft_ids.map(String::from)),
            ("--context", self.context.map(|c| c.to_string())),
            ("--tolerance", self.tolerance.then(|| "0.1".to_string())),
        ];
        for (flag, v) in options {
            if let Some(v) = v {
                a.extend([flag.to_string(), v]);
            }
        }
        if self.check {
            a.push("--check".into());
        }
        a.extend(["--devices".into(), self.devices.to_string()]);
        a
    }

    fn expect(&self) -> Expect {
        // clap's own refusals first: a malformed --speculate, both draft sources, a
        // --tolerance without --check.
        if self.speculate.is_some_and(|s| s != "ngram" && s != "ngram:2") {
            return refused(2, &["--speculate"]);
        }
        if self.speculate.is_some() && self.draft_ids.is_some() {
            return refused(2, &["--draft-ids"]);
        }
        if self.tolerance && !self.check {
            return refused(2, &["--check"]);
        }
        if self.draft_ids == Some("1,x") {
            return refused(1, &["--draft-ids \"1,x\": expected comma-separated token ids"]);
        }
        let drafts = self.speculate.is_some() || self.draft_ids.is_some();
        let k = self.tokens_per_seq.unwrap_or(if drafts { 4 } else { 1 });
        if k == 0 || k > 16 {
            return refused(1, &[&format!("--tokens-per-seq {k} (supported: 1..=16)")]);
        }
        if drafts && k == 1 {
            let flag = if self.speculate.is_some() { "--speculate" } else { "--draft-ids" };
            return refused(1, &[&format!("{flag} with --tokens-per-seq 1")]);
        }
        let need = PROMPT.len() as u64 + self.steps - 1 + k - 1;
        match self.context {
            Some(c) if c < need => refused(
                1,
                &[
                    &format!("--context {c} is too small for prompt"),
                    &format!(": {need} positions"),
                ],
            ),
            _ => Expect::Ok,
        }
    }
}

/// The terms of a "prompt (a) + steps - 1 (b) + K - 1 (c): N positions" message add up.
fn terms_add_up(err: &str) -> bool {
    let Some(at) = err.find("prompt (") else { return true };
    let line = err[at..].lines().next().unwrap_or_default();
    let (terms, total) = line.split_once(": ").unwrap_or((line, ""));
    let sum: u64 =
        terms.split('(').skip(1).filter_map(|t| t.split(')').next()?.parse::<u64>().ok()).sum();
    total.split(' ').next().and_then(|n| n.parse::<u64>().ok()) == Some(sum)
}

#[test]
fn speculation_command_lines_give_greedy_ids_or_a_clear_refusal() {
    let greedy: std::cell::RefCell<HashMap<u64, String>> = Default::default();
    let (refusals, successes) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    TestRunner::new(config(32))
        .run(&run_case(), |case| {
            let args = case.args();
            let expect = case.expect();
            if let Expect::Refused(1, _) = expect {
                let (_, _, err) = palladium(&args);
                prop_assert!(terms_add_up(&err), "{:?}: {}", args, err);
            }
            let Some((stdout, stderr)) = outcome(&args, &expect).map_err(TestCaseError::fail)?
            else {
                refusals.set(refusals.get() + 1);
                return Ok(());
            };
            successes.set(successes.get() + 1);
            let mut greedy = greedy.borrow_mut();
            let plain = greedy.entry(case.steps).or_insert_with(|| {
                let plain = RunCase {
                    tokens_per_seq: None,
                    speculate: None,
                    draft_ids: None,
                    context: None,
                    check: false,
                    tolerance: false,
                    devices: 1,
                    ..case.clone()
                };
                let (code, out, err) = palladium(&plain.args());
                assert_eq!(code, Some(0), "{err}");
                out.lines().next().unwrap_or_default().to_string()
            });
            prop_assert_eq!(
                stdout.lines().next().unwrap_or_default(),
                plain.as_str(),
                "{:?}: not greedy decoding's ids",
                args
            );
            let drafted = case.speculate.is_some() || case.draft_ids.is_some();
            prop_assert_eq!(stderr.contains("speculation ("), drafted, "{:?}: {}", args, stderr);
            prop_assert_eq!(stdout.contains("reference"), case.check, "{:?}: {}", args, stdout);
            Ok(())
        })
        .unwrap();
    println!("{} refused, {} ran", refusals.get(), successes.get());
    assert!(refusals.get() > 0 && successes.get() > 0);
}
