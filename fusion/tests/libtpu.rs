//! libtpu (through PJRT, `palladium-runtime`, deviceless) accepts the megakernels: the tiny
//! Qwen3-MoE and Mixtral ones on v5e, v6e and v7x, Qwen3-30B-A3B at batch 1, context 4096 on
//! v7x, and its 22-layer truncation on v6e (31 GiB of HBM); the tiny Qwen3-MoE's cost variant
//! (all KV tiles, single prefetch) on v6e. No estimate: libtpu 0.0.42.1's static
//! profiler aborts on most of these programs (manual DMAs from HBM); `benches/megakernel.rs`
//! takes the estimates where it gives them.
use palladium_dsl::spec::Chip;
use palladium_fusion::{
    megakernel::Megakernel,
    plan::{KvTiles, PlanOptions, Prefetch},
};
use palladium_model::ModelSpec;
use palladium_runtime::{CallSpec, Compiler, Estimate, Job, wrap};
use std::path::Path;

/// The program of the megakernel of `name` planned with `options`.
fn job(name: &str, options: PlanOptions) -> (String, Job) {
    let chip = options.chip;
    let spec = ModelSpec::from_path(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/models/{name}.json")),
    )
    .unwrap();
    let l = Megakernel::build(&spec, &options).unwrap().lowered;
    let program = wrap(&l.body, &CallSpec::from_json(&l.call_json).unwrap()).unwrap();
    (
        format!(
            "{name} on {chip} ({:?}, {:?}, {} layers, K {}, {} weights)",
            options.kv_tiles,
            options.prefetch,
            options.layers.unwrap_or(spec.layers.len()),
            options.tokens_per_seq,
            options.weights.name()
        ),
        Job { program, chip, serialize: false },
    )
}

fn plain(chip: Chip, batch: u64, context: u64, layers: Option<usize>) -> PlanOptions {
    PlanOptions { layers, ..PlanOptions::new(chip, batch, context) }
}

#[test]
fn libtpu_accepts_the_megakernels() {
    let mut jobs = Vec::new();
    for chip in [Chip::V5e, Chip::V6e, Chip::V7x] {
        jobs.push(job("tiny-qwen3-moe", plain(chip, 1, 256, None)));
        jobs.push(job("tiny-mixtral", plain(chip, 2, 300, None)));
    }
    jobs.push(job("qwen3-30b-a3b", plain(Chip::V7x, 1, 4096, None)));
    jobs.push(job("qwen3-30b-a3b", plain(Chip::V6e, 1, 4096, Some(22))));
    // Qwen2-MoE: q/k/v biases and the sigmoid-gated shared expert (60 experts top-4 and a
    // shared expert of 4 experts' width in Qwen1.5-MoE-A2.7B).
    for chip in [Chip::V6e, Chip::V7x] {
        jobs.push(job("tiny-qwen2-moe", plain(chip, 1, 256, None)));
    }
    jobs.push(job("qwen1.5-moe-a2.7b", plain(Chip::V6e, 1, 4096, Some(4))));
    jobs.push(job(
        "tiny-qwen3-moe",
        PlanOptions {
            kv_tiles: KvTiles::All,
            prefetch: Prefetch::Single,
            ..PlanOptions::new(Chip::V6e, 2, 1024)
        },
    ));
    // One worker: the 30B programs are large, and libtpu's RAM per compile with them.
    assert_accepted(&jobs);
}

/// Compile `jobs` one at a time (each takes GBs) without the static estimate, and require
/// libtpu to accept every one.
fn assert_accepted(jobs: &[(String, Job)]) {
    let compiler = Compiler::new(Estimate::No).unwrap_or_else(|e| panic!("{e}")).with_workers(1);
    let t = std::time::Instant::now();
    let results = compiler.compile_all(&jobs.iter().map(|(_, j)| j.clone()).collect::<Vec<_>>());
    println!("{} megakernels compiled in {:.1} s", jobs.len(), t.elapsed().as_secs_f64());
    for ((label, _), r) in jobs.iter().zip(&results) {
        let c = r.as_ref().unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(c.code_size_bytes > 0 && c.hbm.argument_bytes > 0, "{label}: {c:?}");
    }
}

/// Verify steps: Qwen3-30B-A3B's K = 4 and K = 8 megakernels (8 layers, batch 1, context
/// 4096) on v7x, with the deep rings (16 MiB dense, 13.5 MiB expert) and with one chunk in
/// flight per stream. (Compiled without the static estimate: with libtpu's profiler on, the
/// deep-ring v7x programs are refused, "Used 74 MiB of 64 MiB vmem", at any K.)
#[test]
fn libtpu_accepts_the_verify_megakernels_on_v7x() {
    let jobs: Vec<(String, Job)> =
        [(4, Prefetch::Deep), (8, Prefetch::Deep), (4, Prefetch::Single), (8, Prefetch::Single)]
            .into_iter()
            .map(|(k, prefetch)| {
                job(
                    "qwen3-30b-a3b",
                    PlanOptions {
                        tokens_per_seq: k,
                        logits: false,
                        prefetch,
                        ..plain(Chip::V7x, 1, 4096, Some(8))
                    },
                )
            })
            .collect();
    assert_accepted(&jobs);
}

/// Quantized weights (issue 16): Qwen3-30B-A3B's int8, fp8 and int4-expert megakernels (8
/// layers, batch 1, context 4096, as a step runs them) on v6e and v7x, and the tiny Qwen3-MoE's
/// on v5e. (Compiled without the static estimate, as above; `cargo bench --bench
/// megakernel -- weights` takes the v6e estimates.)
#[test]
fn libtpu_accepts_the_quantized_megakernels() {
    use palladium_model::quant::WeightsDtype;
    let mut jobs = Vec::new();
    for weights in [WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4] {
        jobs.push(job("tiny-qwen3-moe", PlanOptions { weights, ..plain(Chip::V5e, 1, 256, None) }));
        for chip in [Chip::V6e, Chip::V7x] {
            jobs.push(job(
                "qwen3-30b-a3b",
                PlanOptions { weights, ..plain(chip, 1, 4096, Some(8)) },
            ));
        }
    }
    assert_accepted(&jobs);
}

/// Issue 15's acceptance: the N-device SPMD megakernels, each wrapped in an
/// `sdy.manual_computation` over its devices: Qwen3-30B-A3B on 4 v6e chips (8 layers),
/// Mixtral-8x7B on 2 v7x TensorCores and Qwen3-235B-A22B with all 94 layers on 8 (batch 1,
/// context 4096). Without the static estimate the three compile in about 9 s here (with it,
/// through `palladium megakernel --compile`: 6 s, 41 s and 22 s, about 350 MB each; the v7x
/// estimator aborts on both v7x programs, as on most v7x kernels).
#[test]
fn libtpu_accepts_the_multi_device_megakernels() {
    let jobs = vec![
        job("qwen3-30b-a3b", PlanOptions { devices: 4, ..plain(Chip::V6e, 1, 4096, Some(8)) }),
        job("mixtral-8x7b", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 4096, None) }),
        job("qwen3-235b-a22b", PlanOptions { devices: 8, ..plain(Chip::V7x, 1, 4096, None) }),
        job("tiny-qwen2-moe", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 256, None) }),
    ];
    for (label, j) in &jobs {
        assert!(
            j.program.contains("sdy.manual_computation")
                && j.program.contains("has_communication\\22: true"),
            "{label}"
        );
    }
    assert_accepted(&jobs);
}

/// GLM-4.5 and `OLMoE` (issue 31): the tiny GLM-4.5 (DeepSeek-V3's router as data: the
/// correction bias, 1 of 2 expert groups, scaled weights; partial rotary; its shared expert
/// and dense first layer) on v6e and on 2 v7x devices, fp8 on v6e; the tiny `OLMoE`
/// (whole-projection q/k norms, their sums of squares summed over the devices) on v6e and
/// 2 v7x devices, with `clip_qkv` on v6e; and GLM-4.5 (355B) as shipped,
/// fp8 on 8 v7x devices, its first 4 layers (3 dense, 1 MoE with 160 experts and the shared
/// expert's fp8 codes); the tiny Hunyuan-MoE (q/k norms after RoPE) on v6e and 2 v7x devices.
#[test]
fn libtpu_accepts_the_glm4_moe_and_olmoe_megakernels() {
    use palladium_model::quant::WeightsDtype;
    let mut clipped = ModelSpec::from_path(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-olmoe.json"),
    )
    .unwrap();
    clipped.attention.clip_qkv = Some(0.5);
    let l = Megakernel::build(&clipped, &plain(Chip::V6e, 1, 256, None)).unwrap().lowered;
    let clip_job = Job {
        program: wrap(&l.body, &CallSpec::from_json(&l.call_json).unwrap()).unwrap(),
        chip: Chip::V6e,
        serialize: false,
    };
    let jobs = vec![
        job("tiny-glm4-moe", plain(Chip::V6e, 1, 256, None)),
        job("tiny-glm4-moe", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 256, None) }),
        job(
            "tiny-glm4-moe",
            PlanOptions { weights: WeightsDtype::Fp8, ..plain(Chip::V6e, 1, 256, None) },
        ),
        job("tiny-olmoe", plain(Chip::V6e, 2, 256, None)),
        job("tiny-olmoe", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 256, None) }),
        ("tiny-olmoe with clip_qkv 0.5 on v6e".to_string(), clip_job),
        job("tiny-hunyuan-moe", plain(Chip::V6e, 1, 256, None)),
        job("tiny-hunyuan-moe", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 256, None) }),
        job(
            "glm-4.5",
            PlanOptions {
                devices: 8,
                weights: WeightsDtype::Fp8,
                ..plain(Chip::V7x, 1, 4096, Some(4))
            },
        ),
    ];
    assert_accepted(&jobs);
}

/// Sizes padded to 128-lane tiles (issue 31): the tiny GLM-4.5 of hidden 192 and
/// intermediates 80 and 200 on v6e (bf16 and fp8) and on 2 v7x devices, and GLM-4.5-Air
/// as shipped (its dense first layer's 10944 columns padded to 11008), fp8 on one v7x
/// device, its first 4 layers.
#[test]
fn libtpu_accepts_megakernels_with_padded_sizes() {
    use palladium_model::quant::WeightsDtype;
    let fp8 = |o: PlanOptions| PlanOptions { weights: WeightsDtype::Fp8, ..o };
    let jobs = vec![
        job("tiny-glm4-moe-padded", plain(Chip::V6e, 1, 256, None)),
        job("tiny-glm4-moe-padded", fp8(plain(Chip::V6e, 1, 256, None))),
        job("tiny-glm4-moe-padded", PlanOptions { devices: 2, ..plain(Chip::V7x, 1, 256, None) }),
        job("glm-4.5-air", fp8(plain(Chip::V7x, 1, 4096, Some(4)))),
    ];
    assert_accepted(&jobs);
}

/// A layer kind per layer (issue 29): the tiny Qwen3-MoE with dense-MLP layers among its MoE
/// layers (`mlp_only_layers: [1]`; `decoder_sparse_step: 2`, layer 0 dense) on v6e, on one
/// device and split over 2 (the dense MLP by intermediate columns), bf16 and int8: the FFN
/// stage chosen per layer under an `scf.if` inside the traced layer loop.
#[test]
fn libtpu_accepts_megakernels_with_mixed_layer_kinds() {
    let jobs = vec![
        job("tiny-qwen3-moe-mlp-only-layers", plain(Chip::V6e, 1, 256, None)),
        job("tiny-qwen3-moe-sparse-step-2", plain(Chip::V6e, 2, 256, None)),
        job(
            "tiny-qwen3-moe-sparse-step-2",
            PlanOptions { devices: 2, ..plain(Chip::V6e, 1, 256, None) },
        ),
        job(
            "tiny-qwen3-moe-mlp-only-layers",
            PlanOptions {
                weights: palladium_model::quant::WeightsDtype::Int8,
                ..plain(Chip::V6e, 1, 256, None)
            },
        ),
    ];
    assert_accepted(&jobs);
}

/// DBRX-Instruct (4 of its 40 layers, batch 1, context 4096) on the v7x devices the whole
/// model needs: bf16 on 4 (263 GB), fp8 on 2: its `LayerNorms`, the fused `Wqkv`'s heads
/// (48 query, 8 KV, split with their heads) and the stacked experts (16, split as the plan
/// chooses: TP on 2 devices).
#[test]
fn libtpu_accepts_dbrx() {
    use palladium_model::quant::WeightsDtype;
    let jobs: Vec<(String, Job)> = [(WeightsDtype::Bf16, 4), (WeightsDtype::Fp8, 2)]
        .into_iter()
        .map(|(weights, devices)| {
            let options = plain(Chip::V7x, 1, 4096, Some(4));
            job("dbrx-instruct", PlanOptions { weights, devices, ..options })
        })
        .collect();
    assert_accepted(&jobs);
}
