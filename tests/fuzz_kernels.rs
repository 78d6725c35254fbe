//! Property tests over the parameters of every library kernel: random `--set` values
//! (zero, one, huge, negative, non-dividing, NaN, unknown dtypes, as well as values near
//! the defaults that keep the blocks tiling). Nothing may panic; every kernel that builds
//! and verifies also lowers; and every one small enough to interpret in a moment matches
//! its plain-Rust reference.
//!
//! A fixed seed and 12 cases per kernel by default (a few seconds); fuzz longer with e.g.
//! `PROPTEST_CASES=2000 PROPTEST_RNG_SEED=7 cargo test --test tests fuzz_kernels::`.

use palladium::check::{CheckOptions, HostMemory, check};
use palladium_dsl::ir::{VerifyOptions, check_hbm, verify};
use palladium_dsl::spec::Chip;
use palladium_kernels::REGISTRY;
use palladium_lowering::{LowerOptions, lower};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner, contextualize_config};
use std::cell::Cell;

/// Interpret only kernels this small (host bytes, see [`HostMemory`]) with this few grid
/// steps, so a case takes well under a second.
const INTERPRET_BYTES: u64 = 48 << 20;
const INTERPRET_STEPS: u64 = 4096;

fn config(cases: u32) -> Config {
    contextualize_config(Config {
        cases,
        rng_seed: RngSeed::Fixed(0x9a11ad1),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Values for one parameter given its default: mostly near it (halved, doubled, so blocks
/// still tend to tile), sometimes hostile.
fn value(default: &str) -> BoxedStrategy<String> {
    if let Ok(d) = default.parse::<u64>() {
        let near = prop_oneof![
            Just(d),
            Just(d / 2),
            Just(d / 4),
            Just(d.saturating_mul(2)),
            Just(d / 8),
            Just(d / 16),
            Just(d / 32),
            Just(1u64),
            (0u32..9).prop_map(|s| 1u64 << s)
        ]
        .prop_map(|v| v.to_string());
        let hostile = prop_oneof![
            Just("0".to_string()),
            Just("-1".to_string()),
            Just((1u64 << 31).to_string()),
            Just((1u64 << 40).to_string()),
            Just(u64::MAX.to_string()),
            Just("18446744073709551616".to_string()),
            (1u64..5000).prop_map(|v| v.to_string()),
            (0u32..34).prop_map(|s| (1u64 << s).to_string()),
        ];
        return prop_oneof![3 => near, 2 => hostile].boxed();
    }
    if default == "true" || default == "false" {
        return prop_oneof![
            Just("true".to_string()),
            Just("false".to_string()),
            Just("yes".to_string())
        ]
        .boxed();
    }
    if let Ok(f) = default.parse::<f64>() {
        return prop_oneof![
            Just(default.to_string()),
            Just("nan".to_string()),
            Just("inf".to_string()),
            Just("-inf".to_string()),
            Just("1e300".to_string()),
            (-4.0f64..4.0).prop_map(|v| v.to_string()),
            Just((f * 10.0).to_string()),
        ]
        .boxed();
    }
    // A dtype.
    prop_oneof![
        Just(default.to_string()),
        Just("f32".to_string()),
        Just("bf16".to_string()),
        Just("i32".to_string()),
        Just("i8".to_string()),
        Just("f16".to_string()),
        Just("i4".to_string()),
        Just("f8e4m3fn".to_string()),
        Just("bool".to_string()),
        Just("q7".to_string())
    ]
    .boxed()
}

/// Settings: each parameter overridden with probability 1/3.
fn settings(defaults: Vec<(&'static str, String)>) -> BoxedStrategy<Vec<(String, String)>> {
    let per_param: Vec<BoxedStrategy<Option<(String, String)>>> = defaults
        .into_iter()
        .map(|(name, d)| {
            proptest::option::weighted(0.33, value(&d).prop_map(move |v| (name.to_string(), v)))
                .boxed()
        })
        .collect();
    per_param.prop_map(|v| v.into_iter().flatten().collect()).boxed()
}

#[test]
fn every_kernel_survives_random_parameters() {
    let chip = Chip::V6e;
    let mut summary = Vec::new();
    for entry in REGISTRY {
        let mut runner = TestRunner::new(config(12));
        let (built, lowered, interpreted) = (Cell::new(0), Cell::new(0), Cell::new(0));
        let result = runner.run(&settings((entry.defaults)()), |settings| {
            let Ok(kernel) = (entry.build)(&settings) else { return Ok(()) };
            built.set(built.get() + 1);
            if verify(&kernel, VerifyOptions { chip: Some(chip) }).is_err()
                || check_hbm(&kernel, chip).is_err()
            {
                return Ok(());
            }
            lower(&kernel, &LowerOptions { chip }).map_err(|e| {
                TestCaseError::fail(format!(
                    "{} {settings:?} verifies but does not lower: {e}",
                    entry.name
                ))
            })?;
            lowered.set(lowered.get() + 1);
            let steps: u64 = kernel.call.grid.iter().map(|g| g.extent).product();
            if HostMemory::of(&kernel).total() > INTERPRET_BYTES || steps > INTERPRET_STEPS {
                return Ok(());
            }
            let report =
                check(entry.name, &settings, &CheckOptions { chip, ..CheckOptions::default() })
                    .map_err(|e| {
                        TestCaseError::fail(format!(
                            "{} {settings:?} lowers but does not interpret: {e}",
                            entry.name
                        ))
                    })?;
            prop_assert!(report.passed(), "{} {settings:?}:\n{report}", entry.name);
            interpreted.set(interpreted.get() + 1);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{}: {e}", entry.name);
        }
        summary.push(format!(
            "{}: {} built, {} lowered, {} interpreted",
            entry.name,
            built.get(),
            lowered.get(),
            interpreted.get()
        ));
    }
    println!("{}", summary.join("\n"));
}
