//! `palladium profile` end to end: the done condition of issue 18 (the Qwen3-30B-A3B
//! megakernel's trace, SVG and summary), the trace's event format, the SVG's well-formedness,
//! and refusals that write nothing.
use std::path::Path;

use crate::common;
use common::{palladium, scratch};

/// Chrome's trace-event format as Perfetto reads it: `traceEvents`, each event with `ph`;
/// complete events (`X`) with a name, numeric `ts`/`dur` (>= 0) and integer `pid`/`tid`;
/// metadata (`M`) naming processes and threads; no two complete events of one thread
/// overlapping without nesting.
fn check_trace(trace: &serde_json::Value) -> usize {
    let events = trace["traceEvents"].as_array().expect("traceEvents is an array");
    let mut by_thread: std::collections::BTreeMap<(u64, u64), Vec<(f64, f64)>> = Default::default();
    for e in events {
        let ph = e["ph"].as_str().expect("every event has ph");
        let (pid, tid) =
            (e["pid"].as_u64().expect("integer pid"), e["tid"].as_u64().expect("integer tid"));
        match ph {
            "X" => {
                assert!(e["name"].is_string(), "{e}");
                let (ts, dur) = (
                    e["ts"].as_f64().expect("numeric ts"),
                    e["dur"].as_f64().expect("numeric dur"),
                );
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                by_thread.entry((pid, tid)).or_default().push((ts, ts + dur));
            }
            "M" => assert!(
                matches!(e["name"].as_str(), Some("process_name" | "thread_name"))
                    && e["args"]["name"].is_string(),
                "{e}"
            ),
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    for (thread, mut spans) in by_thread {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            assert!(
                w[1].0 >= w[0].1 - 1e-6 * w[0].1.max(1.0),
                "thread {thread:?}: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
        }
    }
    events.len()
}

/// Well-formed XML as far as this SVG goes: balanced tags, quoted attributes, escaped text.
fn check_svg(svg: &str) {
    let mut open: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        assert!(!text.contains('>'), "stray > in {text:?}");
        for (i, _) in text.match_indices('&') {
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;"].iter().any(|e| text[i..].starts_with(e)),
                "unescaped & in {text:?}"
            );
        }
        let gt = rest[lt..].find('>').expect("tag closed") + lt;
        let tag = &rest[lt + 1..gt];
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name.trim()), "</{name}> closes the wrong element");
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().expect("a tag name"));
        }
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
    assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_megakernel_profile_writes_a_trace_an_svg_and_names_the_three_largest_bubbles() {
    let dir = scratch("profile_megakernel");
    let out = dir.to_str().unwrap();
    let (ok, stdout, err) = palladium(&[
        "profile",
        "--megakernel",
        "fixtures/models/qwen3-30b-a3b.json",
        "--chip",
        "v6e",
        "--layers",
        "8",
        "--batch",
        "1",
        "--context",
        "4096",
        "--out",
        out,
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("efficiency"), "{stdout}");
    let largest =
        stdout.split("largest bubbles:").nth(1).expect("the summary lists the largest bubbles");
    for n in ["1. ", "2. ", "3. "] {
        assert!(largest.contains(n), "{stdout}");
    }
    assert!(
        stdout.contains("routing: the static worst case of 8 distinct experts per layer"),
        "{stdout}"
    );
    let trace: serde_json::Value = serde_json::from_str(&read(&dir, "trace.json")).unwrap();
    assert!(check_trace(&trace) > 1000);
    check_svg(&read(&dir, "timeline.svg"));
    let summary: serde_json::Value = serde_json::from_str(&read(&dir, "summary.json")).unwrap();
    assert_eq!(summary["largest_bubbles"].as_array().map(Vec::len), Some(3), "{summary}");
    let eff = summary["hbm_efficiency"].as_f64().unwrap();
    assert!(eff > 0.3 && eff < 1.0, "{summary}");
    // The plan's bytes per step, and the three VMEM outputs (next_ids, max_logits and
    // router_non_finite: [16, 128] of 4 bytes each) the call writes back.
    assert_eq!(summary["hbm_bytes"].as_u64(), Some(1_631_944_704 + 3 * 16 * 128 * 4));
}

#[test]
fn a_library_kernel_profile_has_one_grid_step_section_per_step() {
    let dir = scratch("profile_gemv");
    let (ok, stdout, err) = palladium(&[
        "profile",
        "gemv",
        "--set",
        "block_n=1792",
        "--chip",
        "v6e",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("step time"), "{stdout}");
    let trace: serde_json::Value = serde_json::from_str(&read(&dir, "trace.json")).unwrap();
    check_trace(&trace);
    let steps = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("step ")))
        .count();
    assert_eq!(steps, 14336 / 1792);
    check_svg(&read(&dir, "timeline.svg"));
}

#[test]
fn profile_refusals_name_the_problem_and_write_nothing() {
    let cases: [(&[&str], &str); 4] = [
        (&["profile", "gemv", "--chip", "v5e"], "no calibration for v5e (calibrated: v6e, v7x)"),
        (&["profile", "gemv", "--chip", "v6e", "--batch", "4"], "--batch is a megakernel option"),
        (
            &[
                "profile",
                "--megakernel",
                "fixtures/models/qwen3-30b-a3b.json",
                "--chip",
                "v6e",
                "--layers",
                "1",
                "--positions",
                "1,2",
            ],
            "--positions: 2 positions for --batch 1",
        ),
        (
            &[
                "profile",
                "--megakernel",
                "fixtures/models/qwen3-30b-a3b.json",
                "--chip",
                "v6e",
                "--layers",
                "1",
                "--positions",
                "4096",
            ],
            "--positions: 4096 + 1 new tokens is past --context 4096",
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let dir = scratch(&format!("profile_refused_{i}"));
        let mut args = args.to_vec();
        args.extend(["--out", dir.to_str().unwrap()]);
        let (ok, _, err) = palladium(&args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
        assert!(!dir.exists(), "{args:?} wrote {}", dir.display());
    }
}

/// Exit code and stderr of `palladium ARGS`.
fn palladium_code(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_palladium"))
        .args(args)
        .output()
        .expect("runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every flag `profile` takes is used by the chosen target or refused as a usage error
/// (exit 2) naming it: clap's `requires` let these through, since KERNEL and --megakernel
/// conflict. A flag given at its default value is refused too: it is still ignored.
#[test]
fn flags_the_chosen_target_does_not_use_are_refused() {
    let tiny = "fixtures/models/tiny-qwen3-moe.json";
    let cases: [(&[&str], &str); 6] = [
        (&["--megakernel", tiny, "--set", "block_n=1792"], "--set applies to a library KERNEL"),
        (
            &["--megakernel", tiny, "--prefetch", "lens=1,2"],
            "--prefetch applies to a library KERNEL",
        ),
        (&["gemv", "--positions", "5"], "--positions is a megakernel option"),
        (&["gemv", "--unfused"], "--unfused is a megakernel option"),
        (&["gemv", "--batch", "1"], "--batch is a megakernel option"),
        (&["gemv", "--weights-dtype", "int4"], "--weights-dtype is a megakernel option"),
    ];
    for (i, (flags, want)) in cases.iter().enumerate() {
        let dir = scratch(&format!("profile_unused_flag_{i}"));
        let mut args = vec!["profile"];
        args.extend(*flags);
        args.extend(["--chip", "v6e", "--out", dir.to_str().unwrap()]);
        let (code, err) = palladium_code(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!dir.exists(), "{args:?} wrote {}", dir.display());
    }
}

/// `--unfused` compares like with like: a fused step on several devices, with quantized
/// weights or at given positions is refused with the difference, not compared with the
/// one-device bf16 full-context unfused step. A negative position is not a position.
#[test]
fn unfused_refuses_a_fused_step_it_does_not_model() {
    let model = "fixtures/models/qwen3-30b-a3b.json";
    let cases: [(&[&str], &str); 5] = [
        (
            &["--unfused", "--devices", "4"],
            "--unfused: the unfused step is modelled on one device, the fused one on --devices 4",
        ),
        (
            &["--unfused", "--weights-dtype", "int4"],
            "--unfused: the unfused step is modelled with bf16 library kernels, the fused one with int4 weights",
        ),
        (
            &["--unfused", "--positions", "5"],
            "--unfused: the unfused step attends to the full context (static bounds), the fused one from --positions",
        ),
        (&["--positions=-1"], "--positions: -1 is not a position (positions are 0 or more)"),
        (&["--batch", "2", "--positions=7,-3"], "--positions: -3 is not a position"),
    ];
    for (i, (flags, want)) in cases.iter().enumerate() {
        let dir = scratch(&format!("profile_unfused_unlike_{i}"));
        let mut args = vec!["profile", "--megakernel", model, "--layers", "1"];
        args.extend(*flags);
        args.extend(["--chip", "v6e", "--out", dir.to_str().unwrap()]);
        let (code, err) = palladium_code(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!dir.exists(), "{args:?} wrote {}", dir.display());
    }
}

#[test]
fn a_loop_bounded_by_scalar_prefetch_needs_its_values() {
    // decode_attention's KV loop runs to `lens[b]` (scalar prefetch): refused at the loop
    // without the values, run with its real trip counts with them.
    let dir = scratch("profile_decode_attention");
    let out = dir.to_str().unwrap();
    let (ok, _, err) = palladium(&["profile", "decode_attention", "--chip", "v6e", "--out", out]);
    assert!(
        !ok && err.contains("the loop's upper bound depends on run-time data")
            && err.contains("pipeline.rs"),
        "{err}"
    );
    assert!(!dir.exists());
    let (ok, _, err) = palladium(&[
        "profile",
        "decode_attention",
        "--chip",
        "v6e",
        "--prefetch",
        "lens=3",
        "--out",
        out,
    ]);
    assert!(
        !ok && err.contains("scalar prefetch `lens`: 1 values given, the operand has 2"),
        "{err}"
    );
    // Values outside the range the kernel declares for `lens` (1..=max_context): past the
    // cache, negative, or large enough to allocate without end, refused before any work.
    for (lens, value) in [
        ("lens=99999,99999", "value 0 is 99999"),
        ("lens=-1,-1", "value 0 is -1"),
        ("lens=2147483647,1", "value 0 is 2147483647"),
    ] {
        let args =
            ["profile", "decode_attention", "--chip", "v6e", "--prefetch", lens, "--out", out];
        let (code, err) = palladium_code(&args);
        assert_eq!(code, Some(1), "{lens}: {err}");
        assert!(
            err.contains(&format!(
                "scalar prefetch `lens`: {value}, outside the range 1..=4096 the kernel declares for it"
            )),
            "{lens}: {err}"
        );
        assert!(!dir.exists());
    }
    let summary = |lens: &str| -> serde_json::Value {
        let (ok, _, err) = palladium(&[
            "profile",
            "decode_attention",
            "--chip",
            "v6e",
            "--prefetch",
            lens,
            "--out",
            out,
        ]);
        assert!(ok, "{err}");
        serde_json::from_str(&read(&dir, "summary.json")).unwrap()
    };
    let (short, long) = (summary("lens=512,512"), summary("lens=4096,4096"));
    // K and V tiles of 512 positions: 8 times the bytes read for 8 times the context.
    let kv = |s: &serde_json::Value| s["hbm_bytes"].as_u64().unwrap();
    assert!(kv(&long) > 6 * kv(&short), "{} vs {}", kv(&long), kv(&short));
    // Each grid step also pays its fixed cost and the first tile's wait, whatever the context.
    assert!(long["cycles"].as_f64().unwrap() > 3.0 * short["cycles"].as_f64().unwrap());
}

#[test]
fn unfused_compares_the_fused_step_with_its_library_kernels() {
    let dir = scratch("profile_unfused");
    let (ok, stdout, err) = palladium(&[
        "profile",
        "--megakernel",
        "fixtures/models/qwen3-30b-a3b.json",
        "--chip",
        "v6e",
        "--layers",
        "2",
        "--all-kv-tiles",
        "--unfused",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("unfused step (") && stdout.contains("fused / unfused"), "{stdout}");
    let summary: serde_json::Value = serde_json::from_str(&read(&dir, "summary.json")).unwrap();
    let u = &summary["unfused"];
    // Per layer rmsnorm x2, qkv, rope, KV update, attention, o, residual x2, router, experts;
    // then the final rmsnorm and lm_head: 11 L + 2 calls.
    let calls: u64 =
        u["calls"].as_array().unwrap().iter().map(|c| c["times"].as_u64().unwrap()).sum();
    assert_eq!(calls, 11 * 2 + 2, "{u}");
    let per_call = u["call_cycles"].as_f64().unwrap();
    let sum: f64 = u["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["times"].as_f64().unwrap() * (c["cycles"].as_f64().unwrap() + per_call))
        .sum();
    assert!((sum / u["cycles"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{u}");
    let ratio = u["fused_over_unfused"].as_f64().unwrap();
    assert!((ratio - summary["cycles"].as_f64().unwrap() / sum).abs() < 1e-9, "{u}");
    let (ok, _, err) = palladium(&[
        "profile",
        "--megakernel",
        "fixtures/models/qwen3-30b-a3b.json",
        "--chip",
        "v6e",
        "--layers",
        "2",
        "--tokens-per-seq",
        "2",
        "--unfused",
        "--out",
        scratch("profile_unfused_k2").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("--unfused: the unfused step is one token per sequence"), "{err}");
}

#[test]
fn a_multi_device_profile_names_its_collectives_and_the_planners_figure() {
    // The megakernel on 4 devices: device 0's timeline, the collectives apart, the planner's
    // modelled collective time beside the timeline's.
    let dir = scratch("profile_devices");
    let out = dir.to_str().unwrap();
    let (ok, stdout, err) = palladium(&[
        "profile",
        "--megakernel",
        "fixtures/models/qwen3-30b-a3b.json",
        "--chip",
        "v6e",
        "--layers",
        "2",
        "--devices",
        "4",
        "--context",
        "1024",
        "--out",
        out,
    ]);
    assert!(ok, "{err}");
    for want in [
        "collectives ",
        "sent over ICI (device 0 of 4, SPMD symmetry",
        "libtpu prices remote DMAs at 0 cycles",
        "planner ",
        "on collectives",
        "collective: allreduce_",
    ] {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
    let summary: serde_json::Value = serde_json::from_str(&read(&dir, "summary.json")).unwrap();
    assert_eq!(summary["devices"]["devices"], 4);
    let (ours, planner) = (
        summary["devices"]["collective_cycles"].as_f64().unwrap(),
        summary["devices"]["planner_collective_cycles"].as_f64().unwrap(),
    );
    assert!(ours > planner && planner > 0.0, "{ours} vs {planner}");
    check_trace(&serde_json::from_str(&read(&dir, "trace.json")).unwrap());
    // A library collective: its mesh from its settings.
    let dir = scratch("profile_all_reduce");
    let (ok, stdout, err) = palladium(&[
        "profile",
        "all_reduce",
        "--set",
        "n=4",
        "--chip",
        "v6e",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok && stdout.contains("device 0 of 4"), "{err}{stdout}");
}

#[test]
fn v7x_profiles_with_its_derived_coefficients_labelled() {
    // Qwen3-235B-A22B on 8 v7x devices (2 layers): calibrated for v7x, the DMA latency
    // derived from v6e's fit and said so; the measured cross-chip links price the hops.
    let dir = scratch("profile_v7x_devices");
    let (ok, stdout, err) = palladium(&[
        "profile",
        "--megakernel",
        "fixtures/models/qwen3-235b-a22b.json",
        "--chip",
        "v7x",
        "--devices",
        "8",
        "--layers",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for want in [
        "calibration: dma_latency_cycles derived, not fitted to v7x",
        "device 0 of 8",
        "measured cross-chip remote copy",
        "hop latency 500 cycles",
    ] {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
}
