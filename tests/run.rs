//! `palladium run` end to end: prompt + greedy decode through the megakernel in interpret
//! mode, from a safetensors checkpoint written by `Weights::save` (bf16, and f32 with values
//! that are not bf16: the packer rounds them as transformers' bf16 model loads them) and
//! from random weights; the `--logits-out` JSON compared with the reference
//! (`palladium_decode::compare`); clear errors for bad input.
use crate::common;
use palladium_model::ModelSpec;
use palladium_model::reference::Generation;
use palladium_model::weights::{SaveDtype, Weights};
use std::path::{Path, PathBuf};

use common::{fixture, listing, palladium_code};

fn palladium(args: &[&str]) -> (bool, String, String) {
    palladium_env(args, &[])
}

fn palladium_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let (code, out, err) = palladium_code(args, env);
    (code == 0, out, err)
}

/// A fresh, existing scratch folder.
fn scratch(name: &str) -> PathBuf {
    let dir = common::scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_checkpoint(model: &str, seed: u64, dtype: SaveDtype, perturb: bool) {
    let config = fixture(model);
    let spec = ModelSpec::from_path(&config).unwrap();
    let mut w = Weights::random(&spec, seed).unwrap();
    if perturb {
        // f32 values between bf16 neighbours.
        let names: Vec<String> = w.iter().map(|(n, _)| n.to_string()).collect();
        for n in names {
            for x in w.get_mut(&n).unwrap() {
                *x *= 1.001;
            }
        }
    }
    let dir = scratch(&format!("run-{model}-{seed}-{dtype:?}"));
    w.save(dir.join("model.safetensors"), dtype).unwrap();
    let logits = dir.join("logits.json");
    let prompt = [3u32, 141, 59, 26, 5];
    let prompt_s = prompt.map(|t| t.to_string()).join(",");
    let (ok, out, err) = palladium(&[
        "run",
        config.to_str().unwrap(),
        "--weights",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt_s,
        "--steps",
        "8",
        "--logits-out",
        logits.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let g: Generation = serde_json::from_str(&std::fs::read_to_string(&logits).unwrap()).unwrap();
    assert_eq!(g.steps.len(), 8);
    assert!(g.steps.iter().all(|s| s.logits.len() == spec.vocab_size as usize));
    let printed: Vec<u32> = out.trim().split(',').map(|x| x.parse().unwrap()).collect();
    assert_eq!(printed, g.generated_ids, "{out}");
    let loaded = Weights::load(&spec, dir.join("model.safetensors")).unwrap();
    let c = palladium_decode::compare(&spec, &loaded, &prompt, &g).unwrap();
    println!(
        "{model} seed {seed} {dtype:?}{}: {:?}\n  {}",
        if perturb { " (not bf16-valued)" } else { "" },
        g.generated_ids,
        c.summary()
    );
    assert!(c.passed(), "{}", c.summary());
    if dtype == SaveDtype::BFloat16 && !perturb {
        // A bf16 file holds the random weights exactly: the same run bit for bit.
        let again = dir.join("random.json");
        let (ok, out2, err) = palladium(&[
            "run",
            config.to_str().unwrap(),
            "--random-weights",
            "--seed",
            &seed.to_string(),
            "--prompt-ids",
            &prompt_s,
            "--steps",
            "8",
            "--logits-out",
            again.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        assert_eq!(out2, out);
        assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&logits).unwrap());
    }
}

#[test]
fn run_from_bf16_safetensors_matches_the_reference() {
    run_checkpoint("tiny-qwen3-moe", 11, SaveDtype::BFloat16, false);
    run_checkpoint("tiny-mixtral", 12, SaveDtype::BFloat16, false);
}

#[test]
fn run_from_f32_safetensors_rounds_like_the_bf16_model() {
    run_checkpoint("tiny-qwen3-moe", 13, SaveDtype::Float32, true);
}

#[test]
fn run_random_weights_prints_ids_and_checks() {
    let (ok, out, err) = palladium(&[
        "run",
        fixture("tiny-mixtral").to_str().unwrap(),
        "--random-weights",
        "--seed",
        "4",
        "--prompt-ids",
        "1,2,3",
        "--steps",
        "8",
        "--check",
    ]);
    assert!(ok, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next().unwrap().split(',').count(), 8, "{out}");
    assert!(
        lines.next().unwrap().contains("8/8 steps within 2^-6 x max |logit| of the bf16 reference"),
        "{out}"
    );
    assert!(err.contains("interpreted in"), "{err}");
}

/// `--speculate ngram[:N]` and `--draft-ids` give plain greedy decoding's ids (a bf16
/// checkpoint as `Weights::save` writes it, prompts with and without repetition, both
/// tiny models), print the acceptance rate and tokens per run, and with `--logits-out` and
/// `--check` write logits within the tolerance of the plain run's; forced correct drafts
/// are all accepted (4 tokens per decode run at K = 4).
#[test]
fn speculation_gives_the_ids_of_greedy_decoding() {
    for (model, seed) in [("tiny-qwen3-moe", 21), ("tiny-mixtral", 22)] {
        let config = fixture(model);
        let config = config.to_str().unwrap();
        let spec = ModelSpec::from_path(config).unwrap();
        let dir = scratch(&format!("speculate-{model}"));
        Weights::random(&spec, seed)
            .unwrap()
            .save(dir.join("model.safetensors"), SaveDtype::BFloat16)
            .unwrap();
        let weights = dir.to_str().unwrap();
        for prompt in ["3,141,59,26,5", "9,4,9,4,9,4,9"] {
            let base =
                ["run", config, "--weights", weights, "--prompt-ids", prompt, "--steps", "12"];
            let plain_logits = dir.join("plain.json");
            let (ok, plain, err) =
                palladium(&[&base[..], &["--logits-out", plain_logits.to_str().unwrap()]].concat());
            assert!(ok, "{err}");
            for extra in [
                &["--speculate", "ngram"][..],
                &["--speculate", "ngram:2", "--tokens-per-seq", "8"],
                &["--draft-ids", plain.trim()],
            ] {
                let (ok, out, err) = palladium(&[&base[..], extra].concat());
                assert!(ok, "{extra:?}: {err}");
                assert_eq!(
                    out, plain,
                    "{model} {prompt} {extra:?}: ids differ from greedy decoding"
                );
                assert!(
                    err.contains("acceptance rate") && err.contains("tokens per decode run"),
                    "{err}"
                );
                if extra[0] == "--draft-ids" {
                    assert!(
                        err.contains("acceptance rate 1.000")
                            && err.contains("4.00 tokens per decode run"),
                        "{err}"
                    );
                }
            }
            let logits = dir.join("speculated.json");
            let (ok, out, err) = palladium(
                &[
                    &base[..],
                    &["--speculate", "ngram", "--check", "--logits-out", logits.to_str().unwrap()],
                ]
                .concat(),
            );
            assert!(ok, "{err}");
            assert!(out.starts_with(&plain) && out.contains("steps within 2^-6"), "{out}");
            let (a, b): (Generation, Generation) = (
                serde_json::from_str(&std::fs::read_to_string(&logits).unwrap()).unwrap(),
                serde_json::from_str(&std::fs::read_to_string(&plain_logits).unwrap()).unwrap(),
            );
            assert_eq!(a.generated_ids, b.generated_ids);
            for (x, y) in a.steps.iter().zip(&b.steps) {
                assert!(
                    palladium_model::tolerance::LogitsDiff::new(&x.logits, &y.logits).within(),
                    "{model} {prompt}: speculated logits differ"
                );
            }
        }
    }
}

#[test]
fn run_errors_are_clear() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let dir = scratch("run-errors");
    let cases: [(&[&str], &str); 11] = [
        (
            &[
                "run",
                "no/such/config.json",
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
            ],
            "cannot read the model config",
        ),
        (
            &["run", cfg, "--weights", "no/such/dir", "--prompt-ids", "1", "--steps", "2"],
            "cannot load the weights: no/such/dir",
        ),
        (
            &["run", cfg, "--weights", dir.to_str().unwrap(), "--prompt-ids", "1", "--steps", "2"],
            "no *.safetensors file",
        ),
        (
            &["run", cfg, "--random-weights", "--prompt-ids", "1,512", "--steps", "2"],
            "token 1 is 512, out of range for this model (vocab_size 512",
        ),
        (
            &["run", cfg, "--random-weights", "--prompt-ids", "1,x", "--steps", "2"],
            "expected comma-separated token ids",
        ),
        (
            &["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "0"],
            "--steps must be at least 1",
        ),
        (
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--speculate",
                "bigram",
            ],
            "expected ngram or ngram:N",
        ),
        (
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--speculate",
                "ngram:0",
            ],
            "expected ngram or ngram:N (N >= 1",
        ),
        (
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--speculate",
                "ngram",
                "--tokens-per-seq",
                "17",
            ],
            "--tokens-per-seq 17 (supported: 1..=16)",
        ),
        (
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--draft-ids",
                "1,x",
            ],
            "--draft-ids \"1,x\": expected comma-separated token ids",
        ),
        (
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--draft-ids",
                "1,600",
            ],
            "--draft-ids: token 1 is 600, out of range for this model (vocab_size 512",
        ),
    ];
    for (args, want) in cases {
        let (ok, _, err) = palladium(args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    // Weights of the other family: the first unexpected tensor is named.
    let mix = ModelSpec::from_path(fixture("tiny-mixtral")).unwrap();
    Weights::random(&mix, 0)
        .unwrap()
        .save(dir.join("model.safetensors"), SaveDtype::BFloat16)
        .unwrap();
    let (ok, _, err) = palladium(&[
        "run",
        cfg,
        "--weights",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1",
        "--steps",
        "2",
    ]);
    assert!(!ok && err.contains("block_sparse_moe"), "{err}");
    // Both or neither weight source.
    let (ok, _, err) = palladium(&["run", cfg, "--prompt-ids", "1", "--steps", "2"]);
    assert!(!ok && err.contains("--random-weights"), "{err}");
    // Too big for interpret mode: refused before any weight is built.
    let (ok, _, err) = palladium(&[
        "run",
        fixture("qwen3-30b-a3b").to_str().unwrap(),
        "--random-weights",
        "--prompt-ids",
        "1",
        "--steps",
        "2",
    ]);
    assert!(!ok && err.contains("interpret mode runs small models"), "{err}");
}

/// Drafting needs K >= 2 (a run verifies its last token and K - 1 drafts): `--speculate` or
/// `--draft-ids` with `--tokens-per-seq 1` is refused naming both flags, not run as "0 of 0
/// drafted". The context messages' terms add up to the positions they name, which are what
/// the run writes (prompt + steps - 1 + K - 1: the context 13 below is enough).
#[test]
fn drafts_need_two_tokens_per_run_and_context_terms_add_up() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let base = ["run", cfg, "--random-weights", "--prompt-ids", "1,2,3,4,5", "--steps", "6"];
    let with = |extra: &[&str]| palladium_code(&[&base[..], extra].concat(), &[]);
    for (drafts, flag) in
        [(&["--speculate", "ngram"][..], "--speculate"), (&["--draft-ids", "7,8"], "--draft-ids")]
    {
        let (code, _, err) = with(&[drafts, &["--tokens-per-seq", "1"]].concat());
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("{flag} with --tokens-per-seq 1: a run verifies its last token and up to K - 1 drafts")),
            "{err}"
        );
    }
    let (code, _, err) = with(&["--tokens-per-seq", "4", "--context", "12"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "--context 12 is too small for prompt (5) + steps - 1 (5) + K - 1 (3): 13 positions"
        ),
        "{err}"
    );
    let (code, _, err) = with(&["--context", "9"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--context 9 is too small for prompt (5) + steps - 1 (5): 10 positions"),
        "{err}"
    );
    let (code, _, err) = with(&["--tokens-per-seq", "4", "--context", "13"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = palladium_code(
        &["run", cfg, "--random-weights", "--prompt-ids", "1,2,3,4,5", "--steps", "4093"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "prompt (5) + steps - 1 (4092) need 4097 positions, past max_position_embeddings 4096"
        ),
        "{err}"
    );
}

/// `--check`'s printed relative error is the logits' own: the same with any `--tolerance`.
#[test]
fn the_relative_error_does_not_depend_on_the_tolerance() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let relative = |extra: &[&str]| {
        let args =
            [
                &[
                    "run",
                    cfg,
                    "--random-weights",
                    "--prompt-ids",
                    "1,2,3",
                    "--steps",
                    "3",
                    "--check",
                ][..],
                extra,
            ]
            .concat();
        let (code, out, err) = palladium_code(&args, &[]);
        assert_eq!(code, 0, "{err}");
        let at = out.find(", relative ").unwrap_or_else(|| panic!("{out}"));
        out[at..].split(';').next().unwrap().to_string()
    };
    let default = relative(&[]);
    assert_eq!(relative(&["--tolerance", "0.1"]), default);
    assert_eq!(relative(&["--tolerance", "0.5"]), default);
}

/// Sizes and positions: `--context` past `max_position_embeddings` is refused naming both
/// (2^52 used to overflow a capacity, 4000000 to allocate 16 GB of cache); the host memory a
/// run needs is refused above `PALLADIUM_MAX_HOST_MEMORY`, with the numbers and how to raise it.
#[test]
fn sizes_are_checked_before_anything_is_allocated() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    for context in ["4503599627370496", "4000000", "4097"] {
        let (code, _, err) = palladium_code(
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "1",
                "--context",
                context,
            ],
            &[],
        );
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!(
                "--context {context} is past the model's max_position_embeddings 4096"
            )),
            "{err}"
        );
    }
    let (code, _, err) = palladium_code(
        &["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "18446744073709551615"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("past max_position_embeddings 4096"), "{err}");
    // Over the host-memory limit: the parts, the limit, the knob.
    let (code, _, err) = palladium_code(
        &["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "1", "--check"],
        &[("PALLADIUM_MAX_HOST_MEMORY", "16MiB")],
    );
    assert_eq!(code, 1, "{err}");
    for want in [
        "interpret mode runs small models",
        "of host memory, over the limit of 16777216 bytes",
        "weights (f32)",
        "interpreter buffers",
        "--check references",
        "raise it with PALLADIUM_MAX_HOST_MEMORY=",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let (code, _, err) = palladium_code(
        &["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "1"],
        &[("PALLADIUM_MAX_HOST_MEMORY", "lots")],
    );
    assert!(code == 1 && err.contains("PALLADIUM_MAX_HOST_MEMORY=\"lots\""), "{err}");
    // A model that fits the raised limit but not the chip: refused for HBM, and `run` suggests
    // no flag it does not have.
    let big = fixture("qwen3-30b-a3b");
    let (code, _, err) = palladium_code(
        &[
            "run",
            big.to_str().unwrap(),
            "--random-weights",
            "--prompt-ids",
            "1",
            "--steps",
            "1",
            "--chip",
            "v5e",
        ],
        &[("PALLADIUM_MAX_HOST_MEMORY", "1TiB")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not fit v5e HBM") && !err.contains("--layers"), "{err}");
}

/// Flags: `--seed` belongs to `--random-weights`; user tolerances are finite and positive.
#[test]
fn flags_that_would_be_ignored_or_meaningless_are_refused() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let (code, _, err) = palladium_code(
        &["run", cfg, "--weights", "w", "--seed", "3", "--prompt-ids", "1", "--steps", "1"],
        &[],
    );
    assert!(
        code == 2 && err.contains("'--weights <DIR>' cannot be used with '--seed <SEED>'"),
        "{err}"
    );
    for t in ["-1", "0", "NaN", "inf", "x"] {
        let (code, _, err) = palladium_code(
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "1",
                "--check",
                &format!("--tolerance={t}"),
            ],
            &[],
        );
        assert!(code == 2 && err.contains("--tolerance"), "{t}: {err}");
    }
    let (code, _, err) = palladium_code(
        &["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "1", "--tolerance=0.1"],
        &[],
    );
    assert!(code == 2 && err.contains("--check"), "{err}");
}

/// `--logits-out` is checked before any work and written whole or not at all; a run over
/// a few seconds shows progress on stderr.
#[test]
fn logits_out_is_validated_first_and_written_atomically() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let dir = scratch("run-logits-out");
    for (path, want) in
        [(dir.join("no/such/x.json"), "does not exist"), (dir.clone(), "is a directory")]
    {
        let (code, out, err) = palladium_code(
            &[
                "run",
                cfg,
                "--random-weights",
                "--prompt-ids",
                "1",
                "--steps",
                "2",
                "--logits-out",
                path.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("--logits-out") && err.contains(want), "{err}");
        assert!(out.is_empty() && !err.contains("interpreted in"), "refused before the run: {err}");
    }
    assert!(listing(&dir).is_empty());
    let path = dir.join("l.json");
    let (ok, _, err) = palladium(&[
        "run",
        cfg,
        "--random-weights",
        "--prompt-ids",
        "1",
        "--steps",
        "2",
        "--logits-out",
        path.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(listing(&dir), vec!["l.json".to_string()], "no temporary left");
}

/// Non-finite weights are refused at load, naming the tensor and the first bad index;
/// finite weights whose logits overflow fail at the step that produced them. Nothing is
/// written in either case.
#[test]
fn non_finite_weights_and_logits_are_errors() {
    let config = fixture("tiny-qwen3-moe");
    let spec = ModelSpec::from_path(&config).unwrap();
    let dir = scratch("run-non-finite");
    let logits = dir.join("logits.json");
    for (victim, index) in [
        ("model.layers.1.self_attn.q_proj.weight", 300),
        ("model.layers.2.mlp.experts.3.up_proj.weight", 0),
        ("model.embed_tokens.weight", 7),
        ("lm_head.weight", 257),
        ("model.layers.0.input_layernorm.weight", 5),
    ] {
        let mut w = Weights::random(&spec, 0).unwrap();
        w.get_mut(victim).unwrap()[index] = f32::NAN;
        w.save(dir.join("model.safetensors"), SaveDtype::BFloat16).unwrap();
        let (code, out, err) = palladium_code(
            &[
                "run",
                config.to_str().unwrap(),
                "--weights",
                dir.to_str().unwrap(),
                "--prompt-ids",
                "1,2",
                "--steps",
                "2",
                "--logits-out",
                logits.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 1, "{err}");
        let cols = w.get(victim).unwrap().shape.get(1).copied();
        let at = cols.map_or(format!("[{index}]"), |c| format!("[{}, {}]", index / c, index % c));
        assert!(
            err.contains(victim) && err.contains(&format!("non-finite value NaN at index {at}")),
            "{err}"
        );
        assert!(out.is_empty() && !logits.exists(), "nothing printed or written");
    }
    // Finite but huge: the logits overflow to infinity.
    let mut w = Weights::random(&spec, 0).unwrap();
    w.get_mut("lm_head.weight").unwrap().fill(3.0e38);
    w.save(dir.join("model.safetensors"), SaveDtype::Float32).unwrap();
    let (code, _, err) = palladium_code(
        &[
            "run",
            config.to_str().unwrap(),
            "--weights",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1",
            "--steps",
            "2",
            "--logits-out",
            logits.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("generated step 0: the logits are not finite"), "{err}");
    assert_eq!(listing(&dir), vec!["model.safetensors".to_string()], "nothing written");
}

/// The config's own path is named in its errors, and an empty file says it is empty.
#[test]
fn config_errors_name_the_users_file() {
    let dir = scratch("run-config-errors");
    let path = dir.join("my-model.json");
    std::fs::write(&path, "").unwrap();
    let (code, _, err) = palladium_code(
        &["run", path.to_str().unwrap(), "--random-weights", "--prompt-ids", "1", "--steps", "1"],
        &[],
    );
    assert!(code == 1 && err.contains(&format!("{}: the file is empty", path.display())), "{err}");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen3-moe")).unwrap()).unwrap();
    v["num_experts_per_tok"] = serde_json::json!(-2);
    std::fs::write(&path, v.to_string()).unwrap();
    let (code, _, err) = palladium_code(
        &["run", path.to_str().unwrap(), "--random-weights", "--prompt-ids", "1", "--steps", "1"],
        &[],
    );
    assert!(
        code == 1 && err.contains(&format!("{}: field \"num_experts_per_tok\"", path.display())),
        "{err}"
    );
}

/// A tied-embedding model's logits are ~100: the relative tolerance holds its steps to the
/// reference (an absolute 0.0625 matched none, and the routing exemption passed the run).
#[test]
fn tied_embedding_logits_are_held_to_the_relative_tolerance() {
    let dir = scratch("run-tied");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen3-moe")).unwrap()).unwrap();
    v["tie_word_embeddings"] = serde_json::json!(true);
    let path = dir.join("tied.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let (ok, out, err) = palladium(&[
        "run",
        path.to_str().unwrap(),
        "--random-weights",
        "--seed",
        "1",
        "--prompt-ids",
        "1,17,300,42,5",
        "--steps",
        "6",
        "--check",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("6/6 steps within 2^-6 x max |logit| of the bf16 reference"), "{out}");
}

/// `--devices N`: the megakernel split over N devices and run on N virtual devices passes
/// `--check` and prints the ids of `--devices 1` (tiny Qwen3-MoE on 2, tiny Mixtral on 4),
/// its `--logits-out` within the logits tolerance of one device's; speculation on 2
/// devices gives the same ids.
#[test]
fn devices_give_the_ids_of_one_device_and_pass_the_check() {
    // Seeds at which no routing decision is a near tie (at qwen3's seed 0 one is, and the
    // 2-device run takes it the other way: same ids, logits off the bf16 reference).
    for (model, n, seed) in [("tiny-qwen3-moe", "2", "2"), ("tiny-mixtral", "4", "0")] {
        let config = fixture(model);
        let dir = scratch(&format!("run-devices-{model}"));
        let (one_json, many_json) = (dir.join("one.json"), dir.join("many.json"));
        let base = [
            "run",
            config.to_str().unwrap(),
            "--random-weights",
            "--seed",
            seed,
            "--prompt-ids",
            "1,17,300,42,5",
            "--steps",
            "8",
            "--check",
        ];
        let (ok, one, err) =
            palladium(&[&base[..], &["--logits-out", one_json.to_str().unwrap()]].concat());
        assert!(ok, "{model}, one device: {one}{err}");
        let (ok, many, err) = palladium(
            &[&base[..], &["--devices", n, "--logits-out", many_json.to_str().unwrap()]].concat(),
        );
        assert!(ok, "{model}, {n} devices: {many}{err}");
        assert!(err.contains(&format!("megakernel for v6e on {n} devices")), "{err}");
        let ids = |out: &str| out.lines().next().unwrap().to_string();
        assert_eq!(ids(&many), ids(&one), "{model}: {n} devices' ids");
        assert!(
            many.lines().nth(1).unwrap().starts_with(
                "reference (teacher-forced on these ids): ids equal to the bf16 reference's"
            ),
            "{many}"
        );
        // The logits within the tolerance of one device's up to the first step where either
        // run took a routing decision at a near tie (the references say which: the bf16
        // partials on the wire move the router's input by a bf16 rounding).
        let read = |p: &Path| {
            serde_json::from_str::<Generation>(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        let (g1, gn) = (read(&one_json), read(&many_json));
        assert_eq!(gn.steps.len(), 8);
        let spec = ModelSpec::from_path(&config).unwrap();
        let w = Weights::random(&spec, seed.parse().unwrap()).unwrap();
        let checks = [&g1, &gn]
            .map(|g| palladium_decode::compare(&spec, &w, &[1, 17, 300, 42, 5], g).unwrap());
        let mut compared = 0;
        for (i, (a, b)) in gn.steps.iter().zip(&g1.steps).enumerate() {
            if checks.iter().any(|c| c.steps[i].matched != palladium_decode::Matched::Bf16) {
                break;
            }
            let diff = palladium_model::tolerance::LogitsDiff::new(&a.logits, &b.logits);
            assert!(
                diff.within(),
                "{model}, {n} devices, step {i}: logits off by {} (tolerance {})",
                diff.max_abs_diff,
                diff.tolerance
            );
            compared += 1;
        }
        println!(
            "{model} on {n} devices: ids {}; logits of {compared}/8 steps compared with one device's, all within the tolerance",
            ids(&many)
        );
        if n == "2" {
            let (ok, speculated, err) =
                palladium(&[&base[..], &["--devices", n, "--speculate", "ngram"]].concat());
            assert!(ok, "{err}");
            assert_eq!(ids(&speculated), ids(&one), "{model}: speculation on {n} devices");
            assert!(err.contains("speculation (ngram:3, 4 tokens per run)"), "{err}");
        }
    }
}

/// `--devices` refusals name the flag and the reason: an unsupported count, KV heads that
/// do not split over the devices, the TPU backend (one device's program).
#[test]
fn devices_refusals_name_the_flag_and_the_reason() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let dir = scratch("run-devices-refused");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg).unwrap()).unwrap();
    v["num_attention_heads"] = 6.into();
    v["num_key_value_heads"] = 3.into();
    let three = dir.join("three-kv-heads.json");
    std::fs::write(&three, v.to_string()).unwrap();
    let run = ["run", cfg, "--random-weights", "--prompt-ids", "1,2", "--steps", "2"];
    let cases: [(Vec<&str>, &str); 3] = [
        ([&run[..], &["--devices", "3"]].concat(), "--devices 3 (supported: 1, 2, 4, 8)"),
        (
            vec![
                "run",
                three.to_str().unwrap(),
                "--random-weights",
                "--prompt-ids",
                "1,2",
                "--steps",
                "2",
                "--devices",
                "2",
            ],
            "cannot split the model over 2 devices (--devices 2): the 3 KV heads neither split evenly over 2 devices nor replicate evenly onto them",
        ),
        (
            [&run[..], &["--devices", "2", "--backend", "tpu"]].concat(),
            "--devices 2 with --backend tpu: the TPU engine runs the one-device megakernel",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = palladium_code(&args, &[]);
        assert!(code == 1 && err.contains(want), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: nothing printed: {out}");
    }
}

/// Quantized at load, on 2 devices: `--check` (the reference on the dequantized weights)
/// passes and the ids are one device's.
#[test]
fn quantized_weights_run_on_two_devices() {
    let cfg = fixture("tiny-qwen3-moe");
    let base = [
        "run",
        cfg.to_str().unwrap(),
        "--random-weights",
        "--seed",
        "2",
        "--prompt-ids",
        "1,17,300,42,5",
        "--steps",
        "6",
        "--check",
        "--weights-dtype",
        "int8",
    ];
    let (ok, one, err) = palladium(&base);
    assert!(ok, "{one}{err}");
    let (ok, two, err) = palladium(&[&base[..], &["--devices", "2"]].concat());
    assert!(ok, "{two}{err}");
    assert_eq!(two.lines().next(), one.lines().next(), "{two}");
    assert!(
        two.contains(
            "reference on the dequantized int8 weights (teacher-forced on these ids): ids equal"
        ),
        "{two}"
    );
}

/// Non-finite router logits stop the run naming the layer and the step, on one device and
/// on two: router weights of +-3e38 in layer 1 (finite f32 weights whose logits overflow),
/// and `rope_theta` 1e-30 (RoPE's frequencies overflow, so everything from layer 0's
/// attention on is NaN). Before, the kernel routed the NaN row to one expert id twice and
/// the interpreter stopped on an out-of-bounds expert fetch. Nothing is written.
#[test]
fn non_finite_router_logits_name_the_layer_and_the_step() {
    let dir = scratch("run-router-non-finite");
    let config = dir.join("config.json");
    let logits = dir.join("logits.json");
    let spec = ModelSpec::from_path(fixture("tiny-qwen3-moe")).unwrap();
    let text = std::fs::read_to_string(fixture("tiny-qwen3-moe")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut huge = Weights::random(&spec, 0).unwrap();
    for (i, x) in huge.get_mut("model.layers.1.mlp.gate.weight").unwrap().iter_mut().enumerate() {
        *x = if i % 2 == 0 { 3e38 } else { -3e38 };
    }
    json["rope_theta"] = serde_json::json!(1e-30);
    let tiny_theta = json.to_string();
    for (weights, config_text, layer) in
        [(&huge, &text, 1), (&Weights::random(&spec, 0).unwrap(), &tiny_theta, 0)]
    {
        std::fs::write(&config, config_text).unwrap();
        weights.save(dir.join("model.safetensors"), SaveDtype::Float32).unwrap();
        for (prompt, step) in [("1,2", "prompt token 0 (id 1)"), ("1", "generated step 0")] {
            for devices in ["1", "2"] {
                let (code, out, err) = palladium_code(
                    &[
                        "run",
                        config.to_str().unwrap(),
                        "--weights",
                        dir.to_str().unwrap(),
                        "--prompt-ids",
                        prompt,
                        "--steps",
                        "2",
                        "--devices",
                        devices,
                        "--logits-out",
                        logits.to_str().unwrap(),
                    ],
                    &[],
                );
                assert_eq!(code, 1, "{devices} devices: {err}");
                let want = format!("{step}: the router logits of layer {layer} are not finite");
                assert!(err.contains(&want), "{devices} devices: {err}");
                assert!(out.is_empty() && !logits.exists(), "nothing printed or written");
            }
        }
    }
}
