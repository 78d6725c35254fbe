//! The N-device megakernel in the interpreter: each device's share of random weights
//! ([`pack_device`]), the serialized SPMD body run on N virtual devices at once
//! (`Program::run_devices`: remote DMAs and signals between them, deadlocks and races
//! reported), the KV caches carried between steps. Every device returns the same greedy
//! ids and maxima; they equal the one-device kernel's (ids except at a near tie of the
//! one-device logits), and the logits (each device's vocabulary slice, concatenated) are
//! within the project's logits tolerance of the one-device ones (the all-reduces sum in a
//! different order and send bf16 partials).
use palladium_array::HostArray;
use palladium_array::tolerance::{LogitsDiff, logits_tolerance};
use palladium_decode::pack::pack_device;
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::OperandKind;
use palladium_fusion::{megakernel::Megakernel, plan::PlanOptions};
use palladium_interpret::{CallSpec, Module};
use palladium_model::ModelSpec;
use palladium_model::weights::Weights;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// One step's results, device 0's (checked equal on every device): the logits (global
/// vocabulary order), greedy id and maximum of the one sequence.
struct Step {
    logits: Vec<f32>,
    id: i32,
    max: f32,
}

/// Greedy decoding of `prompt` then `generate` more tokens on `devices` devices.
fn decode(s: &ModelSpec, w: &Weights, devices: u64, prompt: &[u32], generate: usize) -> Vec<Step> {
    let mk = Megakernel::build(s, &PlanOptions { devices, logits: true, ..PlanOptions::new(Chip::V6e, 1, 16) }).unwrap_or_else(|e| panic!("{devices} devices: {e}"));
    let (plan, call) = (&mk.plan, CallSpec::from_json(&mk.lowered.call_json).unwrap());
    let program = Module::parse(&mk.lowered.body).unwrap().prepare().unwrap();
    let packed: Vec<_> = (0..devices).map(|me| pack_device(s, plan, w, me).unwrap()).collect();
    let mut caches: Vec<(HostArray, HostArray)> = packed.iter().map(|p| p.empty_caches()).collect();
    let (cw, rows, vocab_slice) = (plan.layout.chunk_cols as usize, plan.dims.rows as usize, plan.dims.vocab as usize);
    let vocab = s.vocab_size as usize;
    let mut token = prompt[0];
    let mut steps = Vec::new();
    for pos in 0..prompt.len() + generate {
        let inputs: Vec<Vec<HostArray>> = (0..devices as usize)
            .map(|me| {
                plan.layout
                    .inputs()
                    .map(|o| match o.kind {
                        OperandKind::Tokens => HostArray::from_i32(&[1], &[token as i32]),
                        OperandKind::Positions => HostArray::from_i32(&[1], &[pos as i32]),
                        OperandKind::KCache => caches[me].0.clone(),
                        OperandKind::VCache => caches[me].1.clone(),
                        kind => packed[me].arrays[packed[me].operands.iter().position(|&k| k == kind).unwrap()].clone(),
                    })
                    .collect()
            })
            .collect();
        let outs = if devices == 1 { vec![program.run_with(&inputs[0], &call).unwrap()] } else { program.run_devices(&inputs, Some(&call)).unwrap_or_else(|e| panic!("{devices} devices, step {pos}: {e}")) };
        let at = |kind| plan.layout.outputs().position(|o| o.kind == kind).unwrap();
        let (ids, maxes) = (at(OperandKind::NextIds), at(OperandKind::MaxLogits));
        let mut logits = Vec::new();
        for (me, out) in outs.iter().enumerate() {
            assert_eq!(out[ids].to_i32()[0], outs[0][ids].to_i32()[0], "{devices} devices, step {pos}: device {me}'s id");
            assert_eq!(out[maxes].to_f32()[0].to_bits(), outs[0][maxes].to_f32()[0].to_bits(), "{devices} devices, step {pos}: device {me}'s maximum");
            let slice = out[at(OperandKind::Logits)].to_f32();
            logits.extend((0..vocab_slice).map(|v| slice[((v / cw) * rows) * cw + v % cw]));
            caches[me] = (out[at(OperandKind::KCacheOut)].clone(), out[at(OperandKind::VCacheOut)].clone());
        }
        logits.truncate(vocab);
        let step = Step { logits, id: outs[0][ids].to_i32()[0], max: outs[0][maxes].to_f32()[0] };
        token = if pos + 1 < prompt.len() { prompt[pos + 1] } else { step.id as u32 };
        steps.push(step);
    }
    steps
}

fn same_tokens_on_devices(name: &str, devices: &[u64]) {
    let s = spec(name);
    for seed in 0..2 {
        let w = Weights::random(&s, seed).unwrap();
        let prompt = [3, 17 + seed as u32, 300, 42, 5];
        let one = decode(&s, &w, 1, &prompt, 4);
        for &n in devices {
            let many = decode(&s, &w, n, &prompt, 4);
            for (pos, (a, b)) in one.iter().zip(&many).enumerate() {
                let what = format!("{name} seed {seed}, {n} devices, step {pos}");
                let diff = LogitsDiff::new(&b.logits, &a.logits);
                println!("{what}: id {} / {}, max |diff| {:.5} (tolerance {:.5})", b.id, a.id, diff.max_abs_diff, diff.tolerance);
                assert!(diff.within(), "{what}: logits off by {} (tolerance {})", diff.max_abs_diff, diff.tolerance);
                // The greedy pair is the kernel's own logits' argmax and maximum.
                let argmax = palladium_model::reference::argmax(&b.logits);
                assert_eq!((b.id as usize, b.max), (argmax, b.logits[argmax]), "{what}: the gathered greedy pair");
                // Ids equal except at a near tie of the one-device logits.
                let near_tie = (a.logits[a.id as usize] - a.logits[b.id as usize]).abs() <= logits_tolerance(&a.logits);
                assert!(a.id == b.id || near_tie, "{what}: id {} where one device chose {}", b.id, a.id);
                if a.id != b.id {
                    break;
                }
            }
        }
    }
}

#[test]
fn tiny_qwen3_moe_gives_the_same_tokens_on_1_2_and_4_devices() {
    same_tokens_on_devices("tiny-qwen3-moe", &[2, 4]);
}
