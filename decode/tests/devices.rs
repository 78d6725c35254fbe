//! The N-device megakernel in the interpreter, through the [`Decoder`] `palladium run
//! --devices N` runs: each device's share of random weights ([`pack_devices`]), the
//! serialized SPMD body run on N virtual devices at once (`Program::run_devices`: remote
//! DMAs and signals between them, deadlocks and races reported), each device's KV caches
//! carried between steps. Every device returns the same greedy ids and maxima (the decoder
//! refuses a run where they differ, naming the devices), its logits' vocabulary slices put
//! back in order; the run passes the project's check against the references ([`compare`],
//! as `--check`); and the logits are within the project's logits tolerance of the
//! one-device kernel's and the ids equal (except at a near tie of the one-device logits)
//! wherever neither run took a routing decision at a near tie (the all-reduces sum in a
//! different order and send bf16 partials, which can flip such a decision). Batches, K
//! tokens per run with drafts and the rollback of rejected ones work on N devices as on
//! one.
use palladium_array::tolerance::{LogitsDiff, logits_tolerance};
use palladium_decode::pack::{pack_devices, pack_quantized_devices};
use palladium_decode::speculate::{Forced, NoDrafts};
use palladium_decode::{DecodeError, Decoder, Matched, compare};
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::OperandKind;
use palladium_fusion::shard::ExpertSplit;
use palladium_fusion::{megakernel::Megakernel, plan::PlanOptions};
use palladium_interpret::Module;
use palladium_model::quant::{QuantizedWeights, WeightsDtype};
use palladium_model::reference::{Generation, StepLogits};
use palladium_model::weights::Weights;
use palladium_model::{FfnKind, ModelSpec};

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

/// The megakernel of `s` on `devices` devices (batch `batch`, K tokens per run, the full
/// logits).
fn megakernel(s: &ModelSpec, devices: u64, batch: u64, tokens_per_seq: u64) -> Megakernel {
    Megakernel::build(
        s,
        &PlanOptions {
            devices,
            logits: true,
            tokens_per_seq,
            ..PlanOptions::new(Chip::V6e, batch, 16)
        },
    )
    .unwrap_or_else(|e| panic!("{devices} devices: {e}"))
}

/// One step's results (every device's agree: the decoder checks): the logits (global
/// vocabulary order), greedy id and maximum of the one sequence.
struct Step {
    logits: Vec<f32>,
    id: u32,
    max: f32,
}

/// Greedy decoding of `prompt` then `generate` more tokens on `devices` devices, whose
/// plan splits the experts as `split`: every prompt token's step too.
fn decode(
    s: &ModelSpec,
    w: &Weights,
    devices: u64,
    prompt: &[u32],
    generate: usize,
    split: Option<ExpertSplit>,
) -> Vec<Step> {
    let mk = megakernel(s, devices, 1, 1);
    assert_eq!(mk.plan.sharding.as_ref().map(|sh| sh.experts.split), split, "{devices} devices");
    let mut decoder = Decoder::new(&mk, pack_devices(s, &mk.plan, w).unwrap()).unwrap();
    assert_eq!(decoder.devices() as u64, devices);
    let mut token = prompt[0];
    let mut steps = Vec::new();
    for pos in 0..prompt.len() + generate {
        let mut step =
            decoder.step(&[token]).unwrap_or_else(|e| panic!("{devices} devices, step {pos}: {e}"));
        let step = Step {
            logits: step.logits.take().expect("planned with the logits").remove(0),
            id: step.ids[0],
            max: step.max_logits[0],
        };
        assert_eq!(step.logits.len(), s.vocab_size as usize);
        token = if pos + 1 < prompt.len() { prompt[pos + 1] } else { step.id };
        steps.push(step);
    }
    steps
}

/// The generation of a decode's steps from the last prompt token on (what
/// [`compare`] checks, teacher-forced on its ids).
fn generation(steps: &[Step], prompt: usize) -> Generation {
    let steps = &steps[prompt - 1..];
    Generation {
        generated_ids: steps.iter().map(|s| s.id).collect(),
        steps: steps.iter().map(|s| StepLogits { logits: s.logits.clone() }).collect(),
    }
}

fn same_tokens_on_devices(
    name: &str,
    s: &ModelSpec,
    seeds: &[u64],
    devices: &[u64],
    split: ExpertSplit,
) {
    for &seed in seeds {
        let w = Weights::random(s, seed).unwrap();
        let prompt = [3, 17 + seed as u32, 300, 42, 5];
        let one = decode(s, &w, 1, &prompt, 6, None);
        let one_check = compare(s, &w, &prompt, &generation(&one, prompt.len())).unwrap();
        println!("{name} seed {seed}, one device: {}", one_check.summary());
        for &n in devices {
            let many = decode(s, &w, n, &prompt, 6, Some(split));
            let check = compare(s, &w, &prompt, &generation(&many, prompt.len())).unwrap();
            println!("{name} seed {seed}, {n} devices: {}", check.summary());
            assert!(
                check.passed(),
                "{name} seed {seed}, {n} devices: {}\n{:#?}",
                check.summary(),
                check.steps
            );
            for (k, (a, b)) in one.iter().zip(&many).enumerate().skip(prompt.len() - 1) {
                let what = format!("{name} seed {seed}, {n} devices, step {k}");
                // The greedy pair is the kernel's own logits' argmax and maximum.
                let argmax = palladium_model::reference::argmax(&b.logits);
                assert_eq!(
                    (b.id as usize, b.max),
                    (argmax, b.logits[argmax]),
                    "{what}: the gathered greedy pair"
                );
                let diff = LogitsDiff::new(&b.logits, &a.logits);
                let (c1, cn) =
                    (&one_check.steps[k + 1 - prompt.len()], &check.steps[k + 1 - prompt.len()]);
                println!(
                    "{what}: id {} / {} on one device, max |diff| {:.5} (tolerance {:.5}), {:?} / {:?}",
                    b.id, a.id, diff.max_abs_diff, diff.tolerance, cn.matched, c1.matched
                );
                // Beyond the tolerance only where either run took a routing decision at a
                // near tie (the references say which): the bf16 partials on the wire move
                // the router's input by a bf16 rounding.
                let routing_tie = c1.matched != Matched::Bf16 || cn.matched != Matched::Bf16;
                assert!(
                    diff.within() || routing_tie,
                    "{what}: logits off by {} (tolerance {})",
                    diff.max_abs_diff,
                    diff.tolerance
                );
                // Ids equal except at a near tie of the one-device logits, or a routing tie.
                let near_tie = (a.logits[a.id as usize] - a.logits[b.id as usize]).abs()
                    <= logits_tolerance(&a.logits);
                assert!(
                    a.id == b.id || near_tie || routing_tie,
                    "{what}: id {} where one device chose {}",
                    b.id,
                    a.id
                );
                // Downstream of a different id or routing decision the runs part ways.
                if a.id != b.id || routing_tie {
                    break;
                }
            }
        }
    }
}

/// Qwen2-MoE's q/k/v biases (the `qkv_bias` operand, each device's heads' rows), with its
/// shared expert taken out of the spec (the megakernel does not emit that stage yet): the
/// kernel matches the reference on one device and on two.
#[test]
fn tiny_qwen2_moe_q_k_v_biases_on_1_and_2_devices() {
    let mut s = spec("tiny-qwen2-moe");
    assert!(s.attention.qkv_bias && !s.attention.o_bias);
    for layer in &mut s.layers {
        if let FfnKind::Moe(moe) = &mut layer.ffn {
            moe.shared = None;
        }
    }
    same_tokens_on_devices("tiny-qwen2-moe (no shared expert)", &s, &[0, 1], &[2], ExpertSplit::Ep);
}

/// Qwen2-MoE whole: q/k/v biases and the sigmoid-gated shared expert (its entries streamed
/// first in the expert ring; on 2 devices each holds half its intermediate columns).
#[test]
fn tiny_qwen2_moe_gives_the_same_tokens_on_1_and_2_devices() {
    same_tokens_on_devices(
        "tiny-qwen2-moe",
        &spec("tiny-qwen2-moe"),
        &[0, 1],
        &[2],
        ExpertSplit::Ep,
    );
}

/// GLM-4.5: DeepSeek-V3's router (the correction bias row replicated: every device routes
/// over all experts), 1 of 2 expert groups, the scaled weights, partial rotary, q/k/v
/// biases, the ungated shared expert split by columns and the dense first layer.
#[test]
fn tiny_glm4_moe_gives_the_same_tokens_on_1_and_2_devices() {
    same_tokens_on_devices("tiny-glm4-moe", &spec("tiny-glm4-moe"), &[0, 1], &[2], ExpertSplit::Ep);
}

/// GLM-4.5 with sizes padded to 128-lane tiles (hidden 192, intermediates 80 and 200): on
/// 2 devices each holds 128 of the dense MLP's and the shared expert's padded columns.
#[test]
fn tiny_glm4_moe_with_padded_sizes_on_1_and_2_devices() {
    let s = spec("tiny-glm4-moe-padded");
    same_tokens_on_devices("tiny-glm4-moe-padded", &s, &[0], &[2], ExpertSplit::Ep);
}

/// Hunyuan-MoE: the per-head q/k norms after RoPE (the `head_norms` rows on every
/// device), the NTK-alpha RoPE base, the f32 router and the ungated shared MLP split by
/// columns.
#[test]
fn tiny_hunyuan_moe_gives_the_same_tokens_on_1_and_2_devices() {
    let s = spec("tiny-hunyuan-moe");
    same_tokens_on_devices("tiny-hunyuan-moe", &s, &[0, 1], &[2], ExpertSplit::Ep);
}

/// Qwen3-MoE with `attention_bias` (q/k/v biases and `o_proj`'s, the `o_bias` operand):
/// on 2 devices `o_proj`'s bias is added once, after the attention output's all-reduce.
#[test]
fn tiny_qwen3_moe_with_attention_biases_on_1_and_2_devices() {
    let mut s = spec("tiny-qwen3-moe");
    (s.attention.qkv_bias, s.attention.o_bias) = (true, true);
    same_tokens_on_devices("tiny-qwen3-moe (biases)", &s, &[0, 1], &[2], ExpertSplit::Ep);
}

/// `OLMoE`'s q/k norms over the whole projections on several devices: each device's sums
/// of squares over its heads summed over the devices (f32 on the wire); on 4 devices each
/// of the 2 KV heads is on 2 devices and counted once.
#[test]
fn tiny_olmoe_gives_the_same_tokens_on_1_2_and_4_devices() {
    same_tokens_on_devices("tiny-olmoe", &spec("tiny-olmoe"), &[0, 1], &[2, 4], ExpertSplit::Ep);
}

/// Experts split by expert (EP): the planner's choice for the tiny models at batch 1. On
/// 8 devices each of the 2 KV heads is on 4 devices, its 2 query heads padded to 4.
#[test]
fn tiny_qwen3_moe_gives_the_same_tokens_on_1_2_4_and_8_devices() {
    same_tokens_on_devices(
        "tiny-qwen3-moe",
        &spec("tiny-qwen3-moe"),
        &[0, 1],
        &[2, 4, 8],
        ExpertSplit::Ep,
    );
}

#[test]
fn tiny_mixtral_gives_the_same_tokens_on_1_2_and_4_devices() {
    same_tokens_on_devices(
        "tiny-mixtral",
        &spec("tiny-mixtral"),
        &[0, 1],
        &[2, 4],
        ExpertSplit::Ep,
    );
}

/// Experts split inside (TP): with 512 intermediate columns a device streams half of each
/// chosen expert, fewer bytes than EP's whole ones. (Seed 1 is left out: a prompt token's
/// routing is at a near tie there, which both 2 and 4 devices take the other way, and no
/// step then comes within the tolerance of a reference, which `compare` refuses.)
#[test]
fn tiny_qwen3_moe_with_tensor_parallel_experts_gives_the_same_tokens() {
    let path = format!("{}/../fixtures/models/tiny-qwen3-moe.json", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["moe_intermediate_size"] = 512.into();
    same_tokens_on_devices(
        "tiny-qwen3-moe (intermediate 512)",
        &ModelSpec::from_json(&v).unwrap(),
        &[0, 2, 4],
        &[2, 4],
        ExpertSplit::Tp,
    );
}

/// Tiny Qwen3-MoE with sizes padded to 128-lane tiles (hidden 192, expert intermediate
/// 400), experts split inside (TP): 256 padded columns per device on 2 devices (device 1
/// holds columns 256..400 and zeros), 128 on 4 (device 3 holds 384..400).
fn padded_qwen3_moe() -> ModelSpec {
    let path = format!("{}/../fixtures/models/tiny-qwen3-moe.json", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["hidden_size"] = 192.into();
    v["moe_intermediate_size"] = 400.into();
    ModelSpec::from_json(&v).unwrap()
}

#[test]
fn tiny_qwen3_moe_with_padded_tensor_parallel_experts_gives_the_same_tokens() {
    let s = padded_qwen3_moe();
    same_tokens_on_devices("tiny-qwen3-moe (padded)", &s, &[0], &[2, 4], ExpertSplit::Tp);
}

/// gpt-oss on 2 and 4 devices: the sinks split with their heads (on 4, each kv head on 2
/// devices, a device's one query head's sink), the router bias replicated, the experts'
/// biases with their experts (EP), the alternating sliding (window 4, 11 positions) and
/// full layers. (Seed 1 is left out: a prompt token's routing is at a near
/// tie there, on one device as on two, and no step then comes within the tolerance of a
/// reference, which `compare` refuses.)
#[test]
fn tiny_gpt_oss_gives_the_same_tokens_on_1_2_and_4_devices() {
    let s = spec("tiny-gpt-oss-256");
    same_tokens_on_devices("tiny-gpt-oss-256", &s, &[0, 2], &[2, 4], ExpertSplit::Ep);
}

/// gpt-oss with its experts split inside (TP, 512 intermediate columns): each device
/// holds its columns' gate/up biases, and the down bias is added once (device 0's share),
/// before the all-reduce of the partial sums.
#[test]
fn tiny_gpt_oss_with_tensor_parallel_experts_gives_the_same_tokens() {
    let path = format!("{}/../fixtures/models/tiny-gpt-oss-256.json", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["intermediate_size"] = 512.into();
    same_tokens_on_devices(
        "tiny-gpt-oss-256 (intermediate 512)",
        &ModelSpec::from_json(&v).unwrap(),
        &[0],
        &[2],
        ExpertSplit::Tp,
    );
}

/// The decoder of `s` on `devices` devices with `w`'s shares.
fn decoder(s: &ModelSpec, w: &Weights, devices: u64, batch: u64, tokens_per_seq: u64) -> Decoder {
    let mk = megakernel(s, devices, batch, tokens_per_seq);
    Decoder::new(&mk, pack_devices(s, &mk.plan, w).unwrap()).unwrap()
}

/// Two sequences in one run on 2 devices (teacher-forced): every row's logits within the
/// tolerance of the one-device kernel's, its id equal except at a near tie.
#[test]
fn a_batch_on_two_devices_matches_one_device() {
    let s = spec("tiny-mixtral");
    let w = Weights::random(&s, 5).unwrap();
    let (mut one, mut two) = (decoder(&s, &w, 1, 2, 1), decoder(&s, &w, 2, 2, 1));
    let tokens = [[3, 141, 59, 26, 5, 9], [7, 7, 300, 2, 45, 11]];
    for (t, fed) in tokens[0].iter().zip(tokens[1]).map(|(&a, b)| [a, b]).enumerate() {
        let (a, b) = (one.step(&fed).unwrap(), two.step(&fed).unwrap());
        let (la, lb) = (a.logits.unwrap(), b.logits.unwrap());
        for seq in 0..2 {
            let what = format!("token {t}, sequence {seq}");
            let diff = LogitsDiff::new(&lb[seq], &la[seq]);
            assert!(
                diff.within(),
                "{what}: logits off by {} (tolerance {})",
                diff.max_abs_diff,
                diff.tolerance
            );
            let near_tie = (la[seq][a.ids[seq] as usize] - la[seq][b.ids[seq] as usize]).abs()
                <= logits_tolerance(&la[seq]);
            assert!(
                a.ids[seq] == b.ids[seq] || near_tie,
                "{what}: id {} where one device chose {}",
                b.ids[seq],
                a.ids[seq]
            );
        }
    }
    assert_eq!((one.len(1), two.len(1)), (6, 6));
}

/// Verify runs of K = 4 tokens on 2 devices, with drafts all accepted and all rejected
/// (each run's rejected rows rolled back): plain greedy decoding's ids on 2 devices.
#[test]
fn speculation_on_two_devices_gives_greedy_ids() {
    let s = spec("tiny-qwen3-moe");
    let w = Weights::random(&s, 0).unwrap();
    let prompt = [1, 17, 300, 42, 5];
    let greedy = decoder(&s, &w, 2, 1, 1).generate(&prompt, 8).unwrap();
    let wrong: Vec<u32> =
        greedy.generated_ids.iter().map(|&t| (t + 1) % s.vocab_size as u32).collect();
    for (what, continuation, accepted) in
        [("forced greedy", greedy.generated_ids.clone(), 6), ("forced wrong", wrong, 0)]
    {
        let mut four = decoder(&s, &w, 2, 1, 4);
        let (g, sp) =
            four.generate_with(&prompt, 8, &mut Forced { continuation }, |_, _| {}).unwrap();
        assert_eq!(g.generated_ids, greedy.generated_ids, "{what}");
        assert_eq!(sp.accepted, accepted, "{what}: {sp:?}");
        for (i, (a, b)) in g.steps.iter().zip(&greedy.steps).enumerate() {
            let diff = LogitsDiff::new(&a.logits, &b.logits);
            assert!(
                diff.within(),
                "{what}, step {i}: logits off by {} (tolerance {})",
                diff.max_abs_diff,
                diff.tolerance
            );
        }
    }
    // The same ids from the kernel's gathered argmax alone (no logits returned).
    let mk = Megakernel::build(
        &s,
        &PlanOptions { devices: 2, logits: false, ..PlanOptions::new(Chip::V6e, 1, 16) },
    )
    .unwrap();
    let mut ids_only = Decoder::new(&mk, pack_devices(&s, &mk.plan, &w).unwrap()).unwrap();
    let (g, _) = ids_only.generate_with(&prompt, 8, &mut NoDrafts, |_, _| {}).unwrap();
    assert_eq!(g.generated_ids, greedy.generated_ids, "ids only");
}

/// A device whose greedy pair differs from device 0's (here: device 1's id bumped after
/// the run) stops the decode with an error naming both devices, the run and the row.
#[test]
fn devices_that_disagree_are_an_error_naming_them() {
    let s = spec("tiny-qwen3-moe");
    let w = Weights::random(&s, 0).unwrap();
    let mk = megakernel(&s, 2, 1, 1);
    let program = Module::parse(&mk.lowered.body).unwrap().prepare().unwrap();
    let ids = mk.plan.layout.outputs().position(|o| o.kind == OperandKind::NextIds).unwrap();
    let mut runs = 0;
    let engine: palladium_decode::Engine = Box::new(move |inputs, call| {
        let mut out = program.run_devices(inputs, Some(call))?;
        runs += 1;
        if runs == 2 {
            let (shape, bumped) = (
                out[1][ids].shape.clone(),
                out[1][ids].to_i32().iter().map(|&id| id + 1).collect::<Vec<_>>(),
            );
            out[1][ids] = palladium_array::HostArray::from_i32(&shape, &bumped);
        }
        Ok(out)
    });
    let mut decoder =
        Decoder::with_engine(&mk, pack_devices(&s, &mk.plan, &w).unwrap(), engine).unwrap();
    decoder.step(&[3]).unwrap();
    let e = decoder.step(&[17]).unwrap_err();
    assert!(
        matches!(e, DecodeError::DevicesDisagree { run: 2, devices: 2, device: 1, row: 0, .. }),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with("megakernel run 2: device 1 of 2 gives token row 0 the greedy id"),
        "{text}"
    );
    assert!(text.contains("device 0 gives"), "{text}");
    // Weights packed for another device count are refused before any run.
    let one = pack_devices(&s, &megakernel(&s, 1, 1, 1).plan, &w).unwrap();
    let e = Decoder::new(&mk, one).unwrap_err().to_string();
    assert_eq!(
        e,
        "the call spec does not match the packed weights: the weights are packed for 1 device(s), the megakernel runs on 2"
    );
}

/// Quantized weights on several devices: int8 (per output channel), fp8 (128 x 128 blocks)
/// and int4 experts (groups of 128 inputs), experts EP on 2 devices and TP (512
/// intermediate columns: `down_proj`'s inputs split at group boundaries) on 2 and 4; each
/// device's codes with their scales. Every run passes the check against the
/// reference on the dequantized weights and gives the one-device quantized kernel's ids
/// and logits (within the tolerance) up to a routing near tie of either.
#[test]
fn quantized_weights_on_several_devices_match_the_reference() {
    let path = format!("{}/../fixtures/models/tiny-qwen3-moe.json", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["moe_intermediate_size"] = 512.into();
    let wide = ModelSpec::from_json(&v).unwrap();
    let prompt = [3, 17, 300, 42, 5];
    // Every format on EP (heads split: o_proj's inputs); on TP the formats whose groups
    // split down_proj's inputs: fp8 blocks on 2 devices (256 columns each), int4 groups on 4
    // (128 each, one group).
    let cases = [
        (
            "tiny-qwen3-moe",
            spec("tiny-qwen3-moe"),
            2,
            ExpertSplit::Ep,
            &[WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4][..],
        ),
        (
            "tiny-qwen3-moe (intermediate 512)",
            wide.clone(),
            2,
            ExpertSplit::Tp,
            &[WeightsDtype::Fp8],
        ),
        ("tiny-qwen3-moe (intermediate 512)", wide, 4, ExpertSplit::Tp, &[WeightsDtype::Int4]),
        // Padded sizes: each device's groups hold the checkpoint's partial last tile or
        // group (columns 384..400) beside zero codes.
        (
            "tiny-qwen3-moe (padded)",
            padded_qwen3_moe(),
            2,
            ExpertSplit::Tp,
            &[WeightsDtype::Int8, WeightsDtype::Fp8],
        ),
        ("tiny-qwen3-moe (padded)", padded_qwen3_moe(), 4, ExpertSplit::Tp, &[WeightsDtype::Int4]),
    ];
    for (name, s, devices, split, dtypes) in cases {
        let w = Weights::random(&s, 3).unwrap();
        for &dtype in dtypes {
            let q = QuantizedWeights::quantize(&s, &w, dtype).unwrap();
            let generate = |n: u64| {
                let mk = Megakernel::build(
                    &s,
                    &PlanOptions {
                        devices: n,
                        weights: dtype,
                        ..PlanOptions::new(Chip::V6e, 1, 16)
                    },
                )
                .unwrap_or_else(|e| panic!("{name} {} on {n}: {e}", dtype.name()));
                assert_eq!(
                    mk.plan.sharding.as_ref().map(|sh| sh.experts.split),
                    (n > 1).then_some(split)
                );
                Decoder::new(&mk, pack_quantized_devices(&s, &mk.plan, &q).unwrap())
                    .unwrap()
                    .generate(&prompt, 6)
                    .unwrap()
            };
            let (one, many) = (generate(1), generate(devices));
            let what = format!("{name} {} on {devices} devices", dtype.name());
            let check = palladium_decode::compare_with(
                &s,
                &q.dequantize(),
                &prompt,
                &many,
                palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE,
            )
            .unwrap();
            println!("{what}: {:?}; {}", many.generated_ids, check.summary());

            assert!(check.passed(), "{what}: {}", check.summary());
            let c1 = palladium_decode::compare_with(
                &s,
                &q.dequantize(),
                &prompt,
                &one,
                palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE,
            )
            .unwrap();
            println!("  one device: {:?}; {}", one.generated_ids, c1.summary());
            // The one-device run's ids and logits (within the tolerance) up to the first step
            // where either run took a routing decision at a near tie.
            for (k, ((a, b), (s1, sn))) in
                one.steps.iter().zip(&many.steps).zip(c1.steps.iter().zip(&check.steps)).enumerate()
            {
                if s1.matched != Matched::Bf16 || sn.matched != Matched::Bf16 {
                    break;
                }
                let diff = LogitsDiff::new(&b.logits, &a.logits);
                assert!(
                    diff.within() && one.generated_ids[k] == many.generated_ids[k],
                    "{what}, step {k}: id {} / {}, logits off by {}",
                    many.generated_ids[k],
                    one.generated_ids[k],
                    diff.max_abs_diff
                );
            }
        }
    }
}

/// DBRX: `LayerNorms` (the norm stage's option), the fused `Wqkv`'s q/k/v row blocks split
/// with their heads, the row-stacked experts split by expert (EP).
#[test]
fn tiny_dbrx_gives_the_same_tokens_on_1_and_2_devices() {
    same_tokens_on_devices("tiny-dbrx", &spec("tiny-dbrx"), &[0, 1], &[2], ExpertSplit::Ep);
}

/// DBRX with sizes that fill no tile (`d_model` 192, heads of 48, `ffn_hidden_size` 400):
/// the `LayerNorms`' mean and variance over the model's 192 lanes (the padded ones masked),
/// each device's columns of the stacked experts (TP: 256 padded columns per device).
#[test]
fn tiny_dbrx_with_padded_sizes_and_tensor_parallel_experts() {
    let s = padded_dbrx();
    same_tokens_on_devices("tiny-dbrx (padded)", &s, &[0], &[2], ExpertSplit::Tp);
}

/// Tiny DBRX with `d_model` 192 (64 padded lanes) and `ffn_hidden_size` 400.
fn padded_dbrx() -> ModelSpec {
    let path = format!("{}/../fixtures/models/tiny-dbrx.json", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["d_model"] = 192.into();
    v["ffn_config"]["ffn_hidden_size"] = 400.into();
    ModelSpec::from_json(&v).unwrap()
}

/// The `LayerNorms` of padded DBRX on a residual stream far from zero mean (every
/// embedding shifted by 4): the padded lanes of the centred stream (`-mean` before the
/// mask) count in neither the variance nor the result, so the kernel matches the
/// reference.
#[test]
fn padded_layer_norms_mask_the_padded_lanes() {
    let s = padded_dbrx();
    let mut w = Weights::random(&s, 3).unwrap();
    w.get_mut("transformer.wte.weight").unwrap().iter_mut().for_each(|x| *x += 4.0);
    let prompt = [3, 17, 300, 42, 5];
    let steps = decode(&s, &w, 1, &prompt, 4, None);
    let check = compare(&s, &w, &prompt, &generation(&steps, prompt.len())).unwrap();
    assert!(check.passed(), "{}", check.summary());
}
