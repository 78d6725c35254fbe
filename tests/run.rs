//! `palladium run` end to end: prompt + greedy decode through the megakernel in interpret
//! mode, from a safetensors checkpoint written by `Weights::save` (bf16, and f32 with values
//! that are not bf16: the packer rounds them as transformers' bf16 model loads them) and
//! from random weights; the `--logits-out` JSON compared with the reference
//! (`palladium_fusion::decode::compare`); clear errors for bad input.
use palladium_model::ModelSpec;
use palladium_model::reference::Generation;
use palladium_model::weights::{SaveDtype, Weights};
use std::path::{Path, PathBuf};
use std::process::Command;

fn palladium(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_palladium")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/models/{name}.json"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
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
    let (ok, out, err) = palladium(&["run", config.to_str().unwrap(), "--weights", dir.to_str().unwrap(), "--prompt-ids", &prompt_s, "--steps", "8", "--logits-out", logits.to_str().unwrap()]);
    assert!(ok, "{err}");
    let g: Generation = serde_json::from_str(&std::fs::read_to_string(&logits).unwrap()).unwrap();
    assert_eq!(g.steps.len(), 8);
    assert!(g.steps.iter().all(|s| s.logits.len() == spec.vocab_size as usize));
    let printed: Vec<u32> = out.trim().split(',').map(|x| x.parse().unwrap()).collect();
    assert_eq!(printed, g.generated_ids, "{out}");
    let loaded = Weights::load(&spec, dir.join("model.safetensors")).unwrap();
    let c = palladium_fusion::decode::compare(&spec, &loaded, &prompt, &g).unwrap();
    println!("{model} seed {seed} {dtype:?}{}: {:?}\n  {}", if perturb { " (not bf16-valued)" } else { "" }, g.generated_ids, c.summary());
    assert!(c.passed(), "{}", c.summary());
    if dtype == SaveDtype::BFloat16 && !perturb {
        // A bf16 file holds the random weights exactly: the same run bit for bit.
        let again = dir.join("random.json");
        let (ok, out2, err) = palladium(&["run", config.to_str().unwrap(), "--random-weights", "--seed", &seed.to_string(), "--prompt-ids", &prompt_s, "--steps", "8", "--logits-out", again.to_str().unwrap()]);
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
    let (ok, out, err) = palladium(&["run", fixture("tiny-mixtral").to_str().unwrap(), "--random-weights", "--seed", "4", "--prompt-ids", "1,2,3", "--steps", "8", "--check"]);
    assert!(ok, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next().unwrap().split(',').count(), 8, "{out}");
    assert!(lines.next().unwrap().contains("within 0.0625 of the bf16 reference"), "{out}");
    assert!(err.contains("interpreted in"), "{err}");
}

#[test]
fn run_errors_are_clear() {
    let cfg = fixture("tiny-qwen3-moe");
    let cfg = cfg.to_str().unwrap();
    let dir = scratch("run-errors");
    let cases: [(&[&str], &str); 6] = [
        (&["run", "no/such/config.json", "--random-weights", "--prompt-ids", "1", "--steps", "2"], "cannot read the model config"),
        (&["run", cfg, "--weights", "no/such/dir", "--prompt-ids", "1", "--steps", "2"], "cannot load the weights: no/such/dir"),
        (&["run", cfg, "--weights", dir.to_str().unwrap(), "--prompt-ids", "1", "--steps", "2"], "no *.safetensors file"),
        (&["run", cfg, "--random-weights", "--prompt-ids", "1,512", "--steps", "2"], "token 1 is 512, out of range for this model (vocab_size 512"),
        (&["run", cfg, "--random-weights", "--prompt-ids", "1,x", "--steps", "2"], "expected comma-separated token ids"),
        (&["run", cfg, "--random-weights", "--prompt-ids", "1", "--steps", "0"], "--steps must be at least 1"),
    ];
    for (args, want) in cases {
        let (ok, _, err) = palladium(args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    // Weights of the other family: the first unexpected tensor is named.
    let mix = ModelSpec::from_path(fixture("tiny-mixtral")).unwrap();
    Weights::random(&mix, 0).unwrap().save(dir.join("model.safetensors"), SaveDtype::BFloat16).unwrap();
    let (ok, _, err) = palladium(&["run", cfg, "--weights", dir.to_str().unwrap(), "--prompt-ids", "1", "--steps", "2"]);
    assert!(!ok && err.contains("block_sparse_moe"), "{err}");
    // Both or neither weight source.
    let (ok, _, err) = palladium(&["run", cfg, "--prompt-ids", "1", "--steps", "2"]);
    assert!(!ok && err.contains("--random-weights"), "{err}");
    // Too big for interpret mode: refused before any weight is built.
    let (ok, _, err) = palladium(&["run", fixture("qwen3-30b-a3b").to_str().unwrap(), "--random-weights", "--prompt-ids", "1", "--steps", "2"]);
    assert!(!ok && err.contains("interpret mode runs small models"), "{err}");
}
