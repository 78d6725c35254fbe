//! Verify steps (K tokens per sequence in one megakernel run) and speculative decoding in
//! interpret mode: a K-token run's logits equal K one-token runs' within the project's
//! logits tolerance (its greedy ids equal, except at near ties), batched and with a
//! sliding window; and `generate_with` gives plain greedy decoding's ids whatever is
//! drafted (n-gram lookup, a forced correct or wrong continuation), on prompts with and
//! without repetition, for the tiny Qwen3-MoE and Mixtral.
use palladium_decode::speculate::{Drafter, Forced, Ngram, NoDrafts};
use palladium_decode::{Decoder, pack::pack};
use palladium_dsl::spec::Chip;
use palladium_fusion::{megakernel::Megakernel, plan::PlanOptions};
use palladium_model::ModelSpec;
use palladium_model::tolerance::{LogitsDiff, logits_tolerance};
use palladium_model::weights::Weights;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

/// The tiny Mixtral with a sliding window of `window` positions.
fn windowed_mixtral(window: u64) -> ModelSpec {
    let text = std::fs::read_to_string(format!(
        "{}/../fixtures/models/tiny-mixtral.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["sliding_window"] = window.into();
    ModelSpec::from_json(&json).unwrap()
}

fn decoder(
    s: &ModelSpec,
    batch: u64,
    tokens_per_seq: u64,
    context: u64,
    w: &Weights,
    logits: bool,
) -> Decoder {
    let mk = Megakernel::build(
        s,
        &PlanOptions { tokens_per_seq, logits, ..PlanOptions::new(Chip::V6e, batch, context) },
    )
    .unwrap();
    Decoder::new(&mk, vec![pack(s, &mk.plan, w).unwrap()]).unwrap()
}

/// `got`'s row matches `want`'s: logits within the tolerance, the same greedy id unless
/// the two ids' logits are within the tolerance of each other (a near tie).
fn same_row(what: &str, got: (&[f32], u32), want: (&[f32], u32)) {
    let diff = LogitsDiff::new(got.0, want.0);
    assert!(
        diff.within(),
        "{what}: logits differ by {} (relative {})",
        diff.max_abs_diff,
        diff.relative()
    );
    if got.1 != want.1 {
        let gap = (want.0[want.1 as usize] - want.0[got.1 as usize]).abs();
        assert!(
            gap <= logits_tolerance(want.0),
            "{what}: greedy id {} vs {} (gap {gap})",
            got.1,
            want.1
        );
    }
}

/// Sequences fed `tokens[b]` (one run per token at K = 1; K per run, the last run padded
/// and rolled back, at K = 4): every token's logits and greedy id agree.
fn k_runs_match_one_token_runs(name: &str, s: &ModelSpec, tokens: &[Vec<u32>]) {
    let batch = tokens.len();
    let w = Weights::random(s, 3).unwrap();
    let (mut one, mut four) =
        (decoder(s, batch as u64, 1, 32, &w, true), decoder(s, batch as u64, 4, 32, &w, true));
    let n = tokens[0].len();
    let mut singles = Vec::new();
    for i in 0..n {
        let fed: Vec<u32> = tokens.iter().map(|t| t[i]).collect();
        singles.push(one.step(&fed).unwrap());
    }
    let mut rows = 0;
    for start in (0..n).step_by(4) {
        let real = (n - start).min(4);
        // Row b * 4 + k: sequence b's token start + k (padding repeats the last).
        let fed: Vec<u32> =
            tokens.iter().flat_map(|t| (0..4).map(move |k| t[start + k.min(real - 1)])).collect();
        let step = four.step(&fed).unwrap();
        let logits = step.logits.as_ref().unwrap();
        for b in 0..batch {
            for k in 0..real {
                let single = &singles[start + k];
                let what = format!("{name}: sequence {b}, token {}", start + k);
                same_row(
                    &what,
                    (&logits[b * 4 + k], step.ids[b * 4 + k]),
                    (&single.logits.as_ref().unwrap()[b], single.ids[b]),
                );
                assert_eq!(
                    step.max_logits[b * 4 + k],
                    logits[b * 4 + k].iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    "{what}: maximum"
                );
                rows += 1;
            }
            four.rewind(b, start + real);
        }
    }
    assert_eq!(rows, n * batch);
}

#[test]
fn k_token_runs_equal_one_token_runs() {
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 512).collect();
    k_runs_match_one_token_runs(
        "tiny-qwen3-moe",
        &spec("tiny-qwen3-moe"),
        std::slice::from_ref(&prompt),
    );
    let other: Vec<u32> = (0..11).map(|i| (i * 53 + 100) % 512).collect();
    k_runs_match_one_token_runs(
        "tiny-mixtral, batch 2",
        &spec("tiny-mixtral"),
        &[prompt.clone(), other],
    );
    // A window of 6 positions: within the K queries of one run, the first ones' windows
    // start earlier than the last ones'.
    k_runs_match_one_token_runs("tiny-mixtral, sliding window 6", &windowed_mixtral(6), &[prompt]);
}

/// gpt-oss at K = 4, batch 2: the per-layer window (4 positions, so the K queries of a
/// run have windows starting at different tiles' rows) in its sliding layers, full
/// attention in the others, and each of the K rows of a head with its head's sink.
#[test]
fn gpt_oss_k_token_runs_equal_one_token_runs() {
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 512).collect();
    let other: Vec<u32> = (0..11).map(|i| (i * 53 + 100) % 512).collect();
    k_runs_match_one_token_runs(
        "tiny-gpt-oss-256, batch 2",
        &spec("tiny-gpt-oss-256"),
        &[prompt, other],
    );
}

/// Plain greedy (K = 1, no drafts) against speculation (K = 4) with each drafter.
fn speculation_matches_greedy(name: &str, prompt: &[u32], steps: usize) {
    let s = spec(name);
    let w = Weights::random(&s, 5).unwrap();
    let context = (prompt.len() + steps + 3) as u64;
    let mut plain = decoder(&s, 1, 1, context, &w, true);
    let greedy = plain.generate(prompt, steps).unwrap();
    let wrong: Vec<u32> = greedy.generated_ids.iter().map(|&t| (t + 1) % 512).collect();
    // The greedy continuation with one wrong id in the middle: accepted up to it.
    let mut partly = greedy.generated_ids.clone();
    partly[steps / 2] = (partly[steps / 2] + 1) % 512;
    let drafters: Vec<(&str, Box<dyn Drafter>)> = vec![
        ("none", Box::new(NoDrafts)),
        ("ngram:3", Box::new(Ngram { n: 3 })),
        ("ngram:1", Box::new(Ngram { n: 1 })),
        ("forced greedy", Box::new(Forced { continuation: greedy.generated_ids.clone() })),
        ("forced wrong", Box::new(Forced { continuation: wrong })),
        ("forced partly", Box::new(Forced { continuation: partly })),
    ];
    for (what, mut drafter) in drafters {
        let mut dec = decoder(&s, 1, 4, context, &w, true);
        let (g, sp) = dec.generate_with(prompt, steps, drafter.as_mut(), |_, _| {}).unwrap();
        println!(
            "{name} {prompt:?} {what}: {:?}, acceptance {:.2} ({}/{}), {:.2} tokens per run",
            g.generated_ids,
            sp.acceptance_rate(),
            sp.accepted,
            sp.drafted,
            sp.tokens_per_run()
        );
        assert_eq!(
            g.generated_ids, greedy.generated_ids,
            "{name} {what}: ids differ from greedy decoding"
        );
        assert_eq!(g.steps.len(), steps);
        for (i, (a, b)) in g.steps.iter().zip(&greedy.steps).enumerate() {
            same_row(
                &format!("{name} {what}: step {i}"),
                (&a.logits, g.generated_ids[i]),
                (&b.logits, greedy.generated_ids[i]),
            );
        }
        assert_eq!(
            sp.runs + sp.accepted,
            steps,
            "{name} {what}: every decode run generates 1 + its accepted drafts"
        );
        match what {
            "none" => assert_eq!(sp.drafted, 0),
            "forced greedy" => {
                assert_eq!(
                    (sp.accepted, sp.drafted),
                    (sp.drafted, steps - steps.div_ceil(4)),
                    "{name}: all accepted"
                );
                assert_eq!(sp.runs, steps.div_ceil(4));
            }
            "forced wrong" => assert_eq!(sp.accepted, 0),
            "forced partly" => {
                assert!(sp.accepted > 0 && sp.accepted < sp.drafted, "{name}: {sp:?}")
            }
            _ => {}
        }
    }
    // Without the full logits: the same ids from the kernel's argmax alone.
    let mut ids_only = decoder(&s, 1, 4, context, &w, false);
    let (g, _) = ids_only.generate_with(prompt, steps, &mut Ngram { n: 3 }, |_, _| {}).unwrap();
    assert_eq!(g.generated_ids, greedy.generated_ids, "{name}: ids-only kernel");
    assert!(g.steps.is_empty());
}

#[test]
fn tiny_qwen3_speculation_gives_greedy_ids() {
    speculation_matches_greedy("tiny-qwen3-moe", &[1, 17, 300, 42, 5], 12);
    speculation_matches_greedy("tiny-qwen3-moe", &[7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9], 12);
}

#[test]
fn tiny_mixtral_speculation_gives_greedy_ids() {
    speculation_matches_greedy("tiny-mixtral", &[3, 250, 77, 12, 401], 12);
    speculation_matches_greedy("tiny-mixtral", &[20, 21, 22, 20, 21, 22, 20, 21], 12);
}
