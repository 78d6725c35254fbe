//! Plans and reports (snapshots), refusals, emission, lowering and emission time.
use palladium_dsl::spec::Chip;
use palladium_fusion::megakernel::Megakernel;
use palladium_fusion::plan::{Plan, PlanError, PlanOptions};
use palladium_fusion::{emit::emit, report};
use palladium_model::ModelSpec;

pub fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

pub fn options(chip: Chip, batch: u64, context: u64, layers: Option<usize>) -> PlanOptions {
    PlanOptions { layers, ..PlanOptions::new(chip, batch, context) }
}

fn snapshot(name: &str, text: &str) {
    insta::with_settings!({ snapshot_path => "../../snapshots/fusion", prepend_module_to_snapshot => false, omit_expression => true }, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn tiny_plans_and_reports() {
    for (name, batch, context) in [("tiny-qwen3-moe", 1, 256), ("tiny-mixtral", 2, 300)] {
        let plan = Plan::new(&spec(name), &options(Chip::V6e, batch, context, None)).unwrap();
        snapshot(&format!("{name}_report"), &report::text(&plan));
        let json: serde_json::Value = serde_json::from_str(&report::json(&plan)).unwrap();
        assert_eq!(json["layers"], 4);
        assert_eq!(json["banks"].as_u64(), Some(plan.banks));
    }
}

#[test]
fn tiny_megakernels_build_verify_and_lower_on_every_chip() {
    for name in ["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen2-moe"] {
        for chip in [Chip::V5e, Chip::V6e, Chip::V7x] {
            let l = Megakernel::build(&spec(name), &options(chip, 1, 256, None))
                .unwrap_or_else(|e| panic!("{name} {chip}: {e}"))
                .lowered;
            assert!(l.body.contains("stable_mosaic.version"));
            assert!(l.call_json.contains("\"input_output_aliases\""));
        }
    }
}

/// The tiny Qwen3-MoE megakernel itself, in our IR (verified first) and as the Mosaic module
/// libtpu gets, so any change to what the fusion pass emits is reviewed.
#[test]
fn tiny_megakernel_snapshots() {
    let mk = Megakernel::build(&spec("tiny-qwen3-moe"), &options(Chip::V6e, 1, 256, None))
        .unwrap_or_else(|e| panic!("{e}"));
    palladium_dsl::ir::verify(
        &mk.kernel,
        palladium_dsl::ir::VerifyOptions { chip: Some(Chip::V6e) },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ir = palladium_dsl::ir::print_kernel(&mk.kernel, Default::default());
    let again = palladium_dsl::ir::print_kernel(&emit(&mk.plan).unwrap(), Default::default());
    assert_eq!(ir, again, "emission is deterministic");
    snapshot("tiny-qwen3-moe_megakernel_ir", &ir);
    snapshot("tiny-qwen3-moe_megakernel_mosaic", &mk.lowered.module);
}

/// The VMEM plan counts exactly what the emitted kernel declares in VMEM (its scratch and
/// its VMEM outputs, padded as the dsl's own VMEM check pads them), plus the estimates: the
/// budget is never below the kernel, whatever the weights, devices and tokens per sequence.
#[test]
fn the_vmem_plan_counts_what_the_kernel_declares() {
    use palladium_dsl::ir::{BufOrigin, MemorySpace, padded_vmem_bytes};
    use palladium_model::quant::WeightsDtype;
    for name in
        ["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen3-moe-sparse-step-2", "tiny-glm4-moe-padded"]
    {
        for weights in
            [WeightsDtype::Bf16, WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4]
        {
            // Dense-MLP layers (a sparse step, GLM's dense first layer) are not planned with
            // int4 weights.
            if (name.contains("sparse-step") || name.contains("glm4"))
                && weights == WeightsDtype::Int4
            {
                continue;
            }
            for (devices, tokens_per_seq) in [(1, 1), (1, 4), (2, 1), (4, 2)] {
                let what =
                    format!("{name} {} devices {devices} K {tokens_per_seq}", weights.name());
                let options = PlanOptions {
                    weights,
                    devices,
                    tokens_per_seq,
                    ..options(Chip::V6e, 2, 256, None)
                };
                let plan = match Plan::new(&spec(name), &options) {
                    Ok(plan) => plan,
                    Err(PlanError::Split { .. }) => continue,
                    Err(e) => panic!("{what}: {e}"),
                };
                let kernel = emit(&plan).unwrap_or_else(|e| panic!("{what}: {e}"));
                let scratch: u64 = kernel
                    .bufs
                    .values()
                    .filter(|b| matches!(b.origin, BufOrigin::Scratch(_)))
                    .filter(|b| b.ty.space == MemorySpace::Vmem)
                    .map(|b| padded_vmem_bytes(b.ty.dtype, &b.ty.shape))
                    .sum();
                let outputs: u64 = kernel
                    .call
                    .operands
                    .iter()
                    .filter(|o| o.space == MemorySpace::Vmem)
                    .map(|o| padded_vmem_bytes(o.dtype, &o.shape))
                    .sum();
                let estimated = |line: &str| line.contains("estimate") || line.contains("headroom");
                let declared: u64 =
                    plan.vmem.iter().filter(|(line, _)| !estimated(line)).map(|(_, b)| b).sum();
                assert_eq!(declared, scratch + outputs, "{what}: {:?}", plan.vmem);
                assert!(plan.vmem_total > declared, "{what}");
                assert!(plan.vmem_limit >= plan.vmem_total, "{what}");
            }
        }
    }
}

#[test]
fn models_that_do_not_fit_are_refused_with_the_numbers() {
    let s = spec("qwen3-30b-a3b");
    match Plan::new(&s, &options(Chip::V6e, 1, 4096, None)) {
        Err(e @ PlanError::Hbm { need, have, max_layers, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&need.to_string()) && msg.contains(&have.to_string()), "{msg}");
            assert!((20..48).contains(&max_layers), "{msg}");
            // The suggested number of layers fits.
            Plan::new(&s, &options(Chip::V6e, 1, 4096, Some(max_layers as usize))).unwrap();
        }
        other => panic!("expected an HBM refusal, got {other:?}"),
    }
    match Plan::new(&s, &options(Chip::V4, 1, 4096, Some(1))) {
        Err(e @ PlanError::Vmem { need, have, .. }) => {
            let msg = e.to_string();
            assert!(
                need > have && msg.contains(&need.to_string()) && msg.contains("dense ring"),
                "{msg}"
            );
        }
        other => panic!("expected a VMEM refusal, got {other:?}"),
    }
    assert!(Plan::new(&s, &options(Chip::V7x, 1, 4096, None)).is_ok());
}

/// Emission (plan + trace + verify + lower) of the 94-layer Qwen3-235B-A22B megakernel. It
/// needs more HBM than one chip has, so the HBM check is off; the time is printed (goal
/// < 0.5 s in a release build; this debug-build bound is loose).
#[test]
fn qwen3_235b_emission_time() {
    let s = ModelSpec::from_path(format!(
        "{}/../fixtures/models/qwen3-235b-a22b.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let t = std::time::Instant::now();
    let mk = Megakernel::build(
        &s,
        &PlanOptions { check_hbm: false, ..options(Chip::V7x, 1, 4096, None) },
    )
    .unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "qwen3-235b-a22b (94 layers) emission: {secs:.3} s, body {} bytes",
        mk.lowered.body.len()
    );
    assert_eq!(mk.plan.layers, 94);
    assert!(secs < 10.0, "{secs}");
}

/// The layout's chunk pieces tile each layer's dense stream: every column of every segment
/// lands in exactly one chunk column, in order, and the segments come in the schedule's
/// order with the widths the emitter's buffers have.
#[test]
fn layout_pieces_tile_the_dense_stream() {
    use palladium_fusion::layout::SegmentKind;
    for (name, chip) in
        [("tiny-qwen3-moe", Chip::V6e), ("tiny-mixtral", Chip::V5e), ("qwen3-30b-a3b", Chip::V7x)]
    {
        let plan = Plan::new(&spec(name), &options(chip, 1, 256, Some(1))).unwrap();
        let (layout, d) = (&plan.layout, &plan.dims);
        let kinds: Vec<SegmentKind> = layout.segments.iter().map(|s| s.kind).collect();
        assert_eq!(kinds, SegmentKind::SCHEDULE, "{name}");
        let widths: Vec<u64> = layout.segments.iter().map(|s| s.cols).collect();
        assert_eq!(
            widths,
            vec![(d.heads + 2 * d.kv_heads) * d.head_pad, d.heads * d.head_pad, d.experts_pad],
            "{name}"
        );
        let mut next = 0;
        for chunk in 0..layout.per_layer {
            for p in layout.pieces(chunk) {
                let s = layout.segment(p.segment).unwrap();
                assert_eq!(s.col + p.seg_col, next, "{name} chunk {chunk}: {p:?}");
                assert_eq!(
                    chunk * layout.chunk_cols + p.chunk_col,
                    next,
                    "{name} chunk {chunk}: {p:?}"
                );
                assert!(
                    p.cols > 0
                        && p.chunk_col + p.cols <= layout.chunk_cols
                        && p.seg_col + p.cols <= s.cols,
                    "{name}: {p:?}"
                );
                next += p.cols;
            }
        }
        assert_eq!(next, widths.iter().sum::<u64>(), "{name}");
        assert!(
            layout.per_layer * layout.chunk_cols - next < layout.chunk_cols,
            "{name}: a chunk of padding only"
        );
    }
}

/// Expert dedupe in the step's traffic (Qwen3-30B-A3B, 128 experts, top-8, 8 layers): the
/// step is priced at the static worst case of `min(E, B x K x top_k)` distinct experts per
/// layer, each fetched once; without dedupe every (row, slot) fetches one; under uniform
/// routing the expected distinct count is `E (1 - (1 - top_k / E)^rows)`. K tokens per
/// sequence multiply the rows.
#[test]
fn expert_bytes_with_and_without_dedupe() {
    let s = spec("qwen3-30b-a3b");
    let expert = 2 * 3 * s.hidden_size * 768;
    for (batch, k, distinct, rows) in
        [(1, 1, 8, 1), (8, 1, 64, 8), (1, 4, 32, 4), (8, 4, 128, 32), (16, 2, 128, 32)]
    {
        let plan = Plan::new(
            &s,
            &PlanOptions {
                tokens_per_seq: k,
                logits: false,
                ..options(Chip::V7x, batch, 4096, Some(8))
            },
        )
        .unwrap();
        let t = &plan.traffic;
        assert_eq!(plan.distinct_experts(), distinct, "batch {batch}, K {k}");
        assert_eq!(t.experts, 8 * distinct * expert, "batch {batch}, K {k}");
        assert_eq!(t.experts_without_dedupe, 8 * rows * 8 * expert, "batch {batch}, K {k}");
        let uniform =
            8.0 * 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powi(rows as i32)) * expert as f64;
        assert!(
            (t.experts_uniform_routing - uniform).abs() < 1.0,
            "batch {batch}, K {k}: {}",
            t.experts_uniform_routing
        );
        assert!(
            t.experts_uniform_routing <= t.experts as f64 + 1.0
                && t.experts <= t.experts_without_dedupe
        );
        println!(
            "batch {batch}, K {k}: expert bytes per step {:.3} GB (worst case {distinct} distinct), {:.3} GB without dedupe, {:.3} GB under uniform routing",
            t.experts as f64 / 1e9,
            t.experts_without_dedupe as f64 / 1e9,
            t.experts_uniform_routing / 1e9
        );
    }
}

/// `tokens_per_seq` out of 1..=16, or past the context, is refused naming the flag.
#[test]
fn tokens_per_seq_is_checked() {
    let s = spec("tiny-qwen3-moe");
    for (k, context, want) in [
        (0, 256, "--tokens-per-seq 0 (supported: 1..=16)"),
        (17, 256, "--tokens-per-seq 17 (supported: 1..=16)"),
        (8, 4, "--tokens-per-seq 8 is more than --context 4"),
    ] {
        let err = Plan::new(
            &s,
            &PlanOptions { tokens_per_seq: k, ..options(Chip::V6e, 1, context, None) },
        )
        .unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
    }
}

/// Issue 16's schemes: the weight bytes of a step against bf16 in the same plan settings
/// (Qwen3-30B-A3B, v6e, 8 layers, batch 1, context 4096, every KV tile, worst-case
/// experts), the bytes by dtype adding up to the weight streams, the VMEM plan counting the
/// scales, and the tiny models building, verifying and lowering on every chip.
#[test]
fn quantized_plans_stream_fewer_bytes_and_build_on_every_chip() {
    use palladium_fusion::plan::{ExpertFetch, KvTiles};
    use palladium_model::quant::WeightsDtype;
    let s = spec("qwen3-30b-a3b");
    let plan = |weights| {
        Plan::new(
            &s,
            &PlanOptions {
                kv_tiles: KvTiles::All,
                expert_fetch: ExpertFetch::WorstCase,
                logits: false,
                weights,
                ..options(Chip::V6e, 1, 4096, Some(8))
            },
        )
        .unwrap()
    };
    let bf16 = plan(WeightsDtype::Bf16);
    assert!(bf16.traffic.by_dtype.is_none() && bf16.layout.quant.is_none());
    for (weights, low, high) in [
        (WeightsDtype::Int8, 0.50, 0.54),
        (WeightsDtype::Fp8, 0.70, 0.74),
        (WeightsDtype::Int4, 0.40, 0.45),
    ] {
        let p = plan(weights);
        let t = &p.traffic;
        let ratio = t.total as f64 / bf16.traffic.total as f64;
        assert!((low..high).contains(&ratio), "{}: {ratio}", weights.name());
        let by_dtype: u64 = t.by_dtype.as_ref().unwrap().iter().map(|(_, b)| b).sum();
        assert_eq!(by_dtype, t.dense + t.lm_head + t.experts, "{}", weights.name());
        assert!(p.vmem.iter().any(|(name, bytes)| name.starts_with("expert scales") && *bytes > 0));
        let text = report::text(&p);
        assert!(
            text.contains(&format!("weights: {}", weights.name()))
                && text.contains("weight bytes per step by dtype"),
            "{text}"
        );
        println!(
            "{}: {:.3} GB per step, {ratio:.3}x bf16's {:.3} GB",
            weights.name(),
            t.total as f64 / 1e9,
            bf16.traffic.total as f64 / 1e9
        );
    }
    for name in ["tiny-qwen3-moe", "tiny-mixtral"] {
        for weights in [WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4] {
            for chip in [Chip::V5e, Chip::V6e, Chip::V7x] {
                let mk = Megakernel::build(
                    &spec(name),
                    &PlanOptions { weights, ..options(chip, 1, 256, None) },
                )
                .unwrap_or_else(|e| panic!("{name} {} {chip}: {e}", weights.name()));
                palladium_dsl::ir::verify(
                    &mk.kernel,
                    palladium_dsl::ir::VerifyOptions { chip: Some(chip) },
                )
                .unwrap_or_else(|e| panic!("{e}"));
                assert!(mk.lowered.body.contains("stable_mosaic.version"));
            }
        }
    }
    // int8 fits all 48 layers on one v6e (bf16 fits 22); on v5e the HBM refusal suggests a
    // number of layers that fits, and no more.
    assert_eq!(
        Plan::new(
            &s,
            &PlanOptions { weights: WeightsDtype::Int8, ..options(Chip::V6e, 1, 4096, None) }
        )
        .unwrap()
        .layers,
        48
    );
    for weights in [WeightsDtype::Int8, WeightsDtype::Fp8] {
        let o = |layers| PlanOptions { weights, ..options(Chip::V5e, 1, 4096, layers) };
        match Plan::new(&s, &o(None)) {
            Err(PlanError::Hbm { max_layers, .. }) => {
                Plan::new(&s, &o(Some(max_layers as usize)))
                    .unwrap_or_else(|e| panic!("{}: {max_layers} layers: {e}", weights.name()));
                assert!(
                    matches!(
                        Plan::new(&s, &o(Some(max_layers as usize + 1))),
                        Err(PlanError::Hbm { .. })
                    ),
                    "{}: {max_layers} + 1 layers fit",
                    weights.name()
                );
            }
            other => panic!(
                "{}: expected an HBM refusal on v5e, got {:?}",
                weights.name(),
                other.map(|p| p.layers)
            ),
        }
    }
    let int8 = Plan::new(
        &spec("tiny-qwen3-moe"),
        &PlanOptions { weights: WeightsDtype::Int8, ..options(Chip::V6e, 1, 256, None) },
    )
    .unwrap();
    snapshot("tiny-qwen3-moe_int8_report", &report::text(&int8));
}

/// fp8 needs `o_proj`'s 128x128 tiles whole in the padded head layout, and an FP8 checkpoint's
/// config plans fp8 only.
#[test]
fn quantized_plans_refuse_what_they_cannot_lay_out() {
    use palladium_fusion::plan::weights_dtype;
    use palladium_model::quant::WeightsDtype;
    let text = std::fs::read_to_string(format!(
        "{}/../fixtures/models/tiny-qwen3-moe.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["head_dim"] = 96.into();
    let s = ModelSpec::from_json(&json).unwrap();
    let err = Plan::new(
        &s,
        &PlanOptions { weights: WeightsDtype::Fp8, ..options(Chip::V6e, 1, 256, None) },
    )
    .unwrap_err();
    assert!(err.to_string().contains("fp8 weights with head_dim 96"), "{err}");
    Plan::new(&s, &PlanOptions { weights: WeightsDtype::Int8, ..options(Chip::V6e, 1, 256, None) })
        .unwrap();
    json["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]});
    let fp8 = ModelSpec::from_json(&json).unwrap();
    assert_eq!(weights_dtype(&fp8, None), Ok(WeightsDtype::Fp8));
    assert_eq!(weights_dtype(&spec("tiny-qwen3-moe"), None), Ok(WeightsDtype::Bf16));
    let err = weights_dtype(&fp8, Some(WeightsDtype::Int4)).unwrap_err();
    assert!(
        err.to_string().contains(
            "--weights-dtype int4: the config's quantization_config stores the weights as fp8"
        ),
        "{err}"
    );
}

/// A layer kind per layer: the tiny Qwen3-MoE with `decoder_sparse_step: 2` (layers 0 and 2
/// dense MLPs, 1 and 3 MoE). The plan lists the kinds, `w_experts` holds the MoE layers
/// and `w_mlp` the dense ones (chunked as an expert is), the report lists the kinds
/// (snapshot), and the emitted kernel chooses the FFN stage under an `scf.if`; with every
/// layer MoE none of it appears.
#[test]
fn dense_mlp_layers_among_moe_layers_are_planned_reported_and_emitted() {
    use palladium_fusion::layout::{Ffn, OperandKind};
    let mixed = spec("tiny-qwen3-moe-sparse-step-2");
    let mk = Megakernel::build(&mixed, &options(Chip::V6e, 1, 256, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let plan = &mk.plan;
    assert_eq!(plan.layer_ffns.layers_of(Ffn::DenseMlp), [0, 2]);
    assert_eq!(plan.layer_ffns.layers_of(Ffn::RoutedExperts), [1, 3]);
    let shape_of = |plan: &Plan, kind| plan.layout.operand(kind).map(|o| o.shape.clone());
    let shape = |kind| shape_of(plan, kind);
    assert_eq!(shape(OperandKind::WExperts), Some(vec![2, 8, 1, 256, 384]));
    // intermediate_size 512 in chunks of the experts' 128 columns.
    assert_eq!(shape(OperandKind::WMlp), Some(vec![2, 4, 256, 384]));
    assert_eq!(plan.traffic.mlp, 2 * 2 * 3 * 256 * 512);
    let text = report::text(plan);
    assert!(
        text.contains(
            "layer kinds (FFN stage per layer): 0 dense MLP, 1 routed experts, 2 dense MLP, 3 routed experts"
        ),
        "{text}"
    );
    snapshot("tiny-qwen3-moe-sparse-step-2_report", &text);
    let json: serde_json::Value = serde_json::from_str(&report::json(plan)).unwrap();
    assert_eq!(
        json["layer_ffns"],
        serde_json::json!(["dense_mlp", "routed_experts", "dense_mlp", "routed_experts"])
    );
    assert!(mk.lowered.module.contains("scf.if"));
    palladium_dsl::ir::verify(
        &mk.kernel,
        palladium_dsl::ir::VerifyOptions { chip: Some(Chip::V6e) },
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // On 2 devices the dense MLP is split by intermediate columns (the experts go EP here).
    let two = PlanOptions { devices: 2, ..options(Chip::V6e, 1, 256, None) };
    let plan = Plan::new(&mixed, &two).unwrap();
    assert_eq!(plan.dims.dense_intermediate, Some(256));
    assert_eq!(shape_of(&plan, OperandKind::WMlp), Some(vec![2, 2, 256, 384]));
    assert!(report::text(&plan).contains("its intermediate split 2 ways (256 columns per device)"));

    let moe = Plan::new(&spec("tiny-qwen3-moe"), &options(Chip::V6e, 1, 256, None)).unwrap();
    assert!(moe.layout.operand(OperandKind::WMlp).is_none());
    let json: serde_json::Value = serde_json::from_str(&report::json(&moe)).unwrap();
    assert!(json.get("layer_ffns").is_none() && json.get("mlp_chunks").is_none());
}

/// Dense-MLP layers are planned with int8 and fp8 weights (codes and scales as an
/// expert's, through the same ring); refused, naming the config fields, with int4 (whose
/// scheme keeps a dense MLP int8 while the expert ring holds int4 codes) and where no
/// planned layer is MoE.
#[test]
fn dense_mlp_layers_are_refused_where_not_emitted() {
    use palladium_fusion::layout::OperandKind;
    use palladium_model::quant::WeightsDtype;
    let mixed = spec("tiny-qwen3-moe-mlp-only-layers");
    for weights in [WeightsDtype::Int8, WeightsDtype::Fp8] {
        let options = PlanOptions { weights, ..options(Chip::V6e, 1, 256, None) };
        let plan = Plan::new(&mixed, &options).unwrap_or_else(|e| panic!("{e}"));
        let w_mlp = plan.layout.operand(OperandKind::WMlp).unwrap();
        assert_eq!(w_mlp.dtype, plan.layout.operand(OperandKind::WExperts).unwrap().dtype);
        assert!(plan.layout.operand(OperandKind::MlpDownScales).is_some());
    }
    let int4 = PlanOptions { weights: WeightsDtype::Int4, ..options(Chip::V6e, 1, 256, None) };
    match Plan::new(&mixed, &int4) {
        Err(e @ PlanError::Unsupported(_)) => {
            let msg = e.to_string();
            assert!(
                msg.contains("--weights-dtype int4")
                    && msg.contains("mlp_only_layers / decoder_sparse_step")
                    && msg.contains("[1]"),
                "{msg}"
            );
        }
        other => panic!("int4: expected a refusal, got {other:?}"),
    }
    // The MoE layers alone plan with any weights.
    let int4 = PlanOptions { layers: Some(1), ..int4 };
    assert!(Plan::new(&mixed, &int4).unwrap().layer_ffns.all_routed());
    // The unfused step (`profile --unfused`) counts MoE layers only: refused, not mispriced.
    let err = palladium_fusion::unfused::unfused_kernels(&mixed, 4, 1, 256).unwrap_err();
    assert!(err.contains("layer 1 is a dense MLP") && err.contains("mlp_only_layers"), "{err}");
    assert!(palladium_fusion::unfused::unfused_kernels(&mixed, 1, 1, 256).is_ok());
    // Layer 0 of decoder_sparse_step 2 is dense: planned alone, no layer is MoE.
    match Plan::new(&spec("tiny-qwen3-moe-sparse-step-2"), &options(Chip::V6e, 1, 256, Some(1))) {
        Err(e @ PlanError::Unsupported(_)) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no MoE layer")
                    && msg.contains("mlp_only_layers / decoder_sparse_step"),
                "{msg}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// DeepSeek's multi-head latent attention has no megakernel stage yet: planning a DeepSeek
/// config is refused naming MLA and the model type (not a shape error further in), on any
/// weights dtype.
#[test]
fn mla_is_refused_by_name() {
    use palladium_model::quant::WeightsDtype;
    for name in ["tiny-deepseek-v3", "tiny-deepseek-v2"] {
        for weights in [WeightsDtype::Bf16, WeightsDtype::Fp8] {
            let o = PlanOptions { weights, ..options(Chip::V6e, 1, 256, None) };
            match Plan::new(&spec(name), &o) {
                Err(e @ PlanError::Unsupported(_)) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("multi-head latent attention") && msg.contains("deepseek_v"),
                        "{name}: {msg}"
                    );
                }
                other => panic!("{name}: expected a refusal, got {other:?}"),
            }
        }
    }
}

/// What the reference computes and the megakernel does not emit yet is refused by name: a
/// router bias (no family has one so far). `OLMoE` plans, on several devices too.
#[test]
fn features_the_megakernel_lacks_are_refused_by_feature() {
    let olmoe = spec("tiny-olmoe");
    assert!(Plan::new(&olmoe, &options(Chip::V6e, 1, 256, Some(2))).is_ok());
    let two = PlanOptions { devices: 2, ..options(Chip::V7x, 1, 256, None) };
    let split = Plan::new(&olmoe, &two).unwrap().sharding.unwrap();
    assert!(split.collectives.iter().any(|c| c.name.starts_with("q/k sums of squares")));
    let mut biased = olmoe.clone();
    for layer in &mut biased.layers {
        if let palladium_model::spec::FfnKind::Moe(m) = &mut layer.ffn {
            m.routing.router_bias = true;
        }
    }
    // A router bias (gpt-oss's) is the `router_bias` operand, whatever the family.
    let p = Plan::new(&biased, &options(Chip::V6e, 1, 256, None)).unwrap();
    let bias = p.layout.operand(palladium_fusion::layout::OperandKind::RouterBias);
    assert_eq!(bias.map(|o| o.shape.clone()), Some(vec![4, 8, 128]));
}

/// GLM-4.5 plans with DeepSeek-V3's router as data: the correction bias a row per layer
/// (`correction_bias`, read by the MoE layers only: layer 0 is dense), 1 of 2 expert groups
/// kept, the weights scaled by 2.5; partial rotary (32 of each head's 64 lanes).
#[test]
fn glm4_moe_plans_its_router_options_and_partial_rotary() {
    use palladium_fusion::layout::OperandKind;
    let p = Plan::new(&spec("tiny-glm4-moe"), &options(Chip::V6e, 1, 256, None)).unwrap();
    let d = &p.dims;
    assert!(d.correction_bias);
    let groups = d.expert_groups.map(|g| (g.groups, g.chosen_groups));
    assert_eq!((groups, d.routed_scaling, d.rotary_dim), (Some((2, 1)), 2.5, Some(32)));
    assert_eq!(p.layout.operand(OperandKind::CorrectionBias).unwrap().shape, [4, 8, 128]);
    assert_eq!(p.traffic.correction_bias, 3 * 8 * 128 * 4);
    let text = report::text(&p);
    assert!(text.contains("mlp.gate.e_score_correction_bias"), "{text}");
    assert!(text.contains("mlp.shared_experts.down_proj.weight"), "{text}");
    assert!(text.contains("layers [1, 2, 3] only"), "{text}");
}

/// Sizes that fill no 128-lane tile are padded with zeros in every weight: tiny GLM-4.5
/// with hidden 192, expert (and shared expert) intermediate 80 and a dense first layer of
/// 200 plans at 256, 128, 128 and 256 (on 2 devices the shared expert's and the dense
/// MLP's columns split 128 per device), the report names the sizes and the zero bytes
/// streamed, the operand prose says where the checkpoint ends; a model that fills its
/// tiles pads nothing. GLM-4.5-Air as shipped (dense intermediate 10944) plans with fp8
/// weights on v7x.
#[test]
fn sizes_that_fill_no_tile_are_padded() {
    use palladium_model::quant::WeightsDtype;
    let s = spec("tiny-glm4-moe-padded");
    let p = Plan::new(&s, &options(Chip::V6e, 1, 256, None)).unwrap();
    let (d, m) = (&p.dims, &p.model_dims);
    let sizes = |d: &palladium_fusion::plan::Dims| {
        (d.hidden, d.intermediate, d.shared_intermediate, d.dense_intermediate)
    };
    assert_eq!(sizes(d), (256, 128, Some(128), Some(256)));
    assert_eq!(sizes(m), (192, 80, Some(80), Some(200)));
    assert_eq!(p.layout.shared_entries, 1);
    // The dense stream and lm_head: 64 of every 256 rows are zero.
    let t = &p.traffic;
    assert!(t.padding >= (t.dense + t.lm_head + t.embedding) / 4, "{t:?}");
    assert!(t.padding < t.dense + t.lm_head + t.embedding + t.experts + t.mlp, "{t:?}");
    let text = report::text(&p);
    assert!(
        text.contains("padding to native tiles: hidden 192 -> 256, expert intermediate 80 -> 128, shared expert intermediate 80 -> 128, dense-MLP intermediate 200 -> 256, zero in every weight"),
        "{text}"
    );
    assert!(text.contains("(zero past 192)") && text.contains("(zero past 80)"), "{text}");
    let two = PlanOptions { devices: 2, ..options(Chip::V6e, 1, 256, None) };
    let p2 = Plan::new(&s, &two).unwrap();
    assert_eq!(sizes(&p2.dims), (256, 128, Some(128), Some(128)));
    let text = report::text(&p2);
    assert!(
        text.contains("padding to native tiles: hidden 192 -> 256, expert intermediate 80 -> 128, shared expert intermediate 80 -> 256 (128 per device), dense-MLP intermediate 200 -> 256 (128 per device), zero"),
        "{text}"
    );
    for weights in [WeightsDtype::Int8, WeightsDtype::Fp8] {
        let o = PlanOptions { weights, ..options(Chip::V6e, 1, 256, None) };
        assert_eq!(sizes(&Plan::new(&s, &o).unwrap().dims), sizes(d), "{weights:?}");
    }
    let plain = Plan::new(&spec("tiny-glm4-moe"), &options(Chip::V6e, 1, 256, None)).unwrap();
    assert_eq!(plain.traffic.padding, 0);
    assert!(!report::text(&plain).contains("padding to native tiles"));
    // GLM-4.5-Air as shipped: its dense first layer's 10944 columns padded to 11008.
    let o = PlanOptions { weights: WeightsDtype::Fp8, ..options(Chip::V7x, 1, 256, Some(4)) };
    let air = Plan::new(&spec("glm-4.5-air"), &o).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (air.dims.dense_intermediate, air.model_dims.dense_intermediate),
        (Some(11008), Some(10944))
    );
    assert!(report::text(&air).contains("dense-MLP intermediate 10944 -> 11008"));
}

/// Qwen2-MoE plans: its shared expert as 2 more entries of `w_experts` (256 intermediate
/// columns as two experts' 128), its gate as the router's column 8 (so 128 padded columns
/// still), its q/k/v biases a row per head; with quantized weights too (the shared
/// entries' codes and scales); the unfused step is refused (it has no shared-expert call).
#[test]
fn qwen2_moe_plans_its_shared_expert_and_biases() {
    use palladium_fusion::layout::OperandKind;
    use palladium_model::quant::WeightsDtype;
    let s = spec("tiny-qwen2-moe");
    let p = Plan::new(&s, &options(Chip::V6e, 1, 256, None)).unwrap();
    assert_eq!(p.layout.shared_entries, 2);
    assert!(p.dims.shared_gate);
    assert_eq!(p.dims.experts_pad, 128);
    assert_eq!(p.layout.operand(OperandKind::WExperts).unwrap().shape[..2], [4, 8 + 2]);
    // 4 q heads + 2 k + 2 v, each padded to 128 lanes.
    assert_eq!(p.layout.operand(OperandKind::QkvBias).unwrap().shape, [4, 8, 128]);
    // The report's operand prose names what the new blocks read.
    let text = report::text(&p);
    for read in ["q_proj.bias", "shared_expert.down_proj.weight", "shared_expert_gate.weight"] {
        assert!(text.contains(read), "{read} not in the report:\n{text}");
    }
    // Quantized: the shared entries' codes and scales beside the experts', the gate's
    // column in the bf16 router operand.
    for weights in [WeightsDtype::Int8, WeightsDtype::Fp8, WeightsDtype::Int4] {
        let o = PlanOptions { weights, ..options(Chip::V6e, 1, 256, None) };
        let p = Plan::new(&s, &o).unwrap();
        for kind in
            [OperandKind::WExperts, OperandKind::ExpertScales, OperandKind::ExpertDownScales]
        {
            assert_eq!(p.layout.operand(kind).unwrap().shape[..2], [4, 8 + 2], "{weights:?}");
        }
        let text = report::text(&p);
        for read in ["shared_expert.up_proj.weight", "shared_expert_gate.weight"] {
            assert!(text.contains(read), "{weights:?}: {read} not in the report:\n{text}");
        }
    }
    let unfused = palladium_fusion::unfused::unfused_kernels(&s, 4, 1, 256).unwrap_err();
    assert!(unfused.contains("shared-expert"), "{unfused}");
}

/// DBRX plans (its `LayerNorms` a stage option, its fused `Wqkv` and row-stacked experts
/// read through the source maps) and its emitted Mosaic is reviewed: the norms subtract
/// the mean, the q/k/v and expert operands' prose names DBRX's tensors.
#[test]
fn tiny_dbrx_megakernel_snapshot() {
    let mk = Megakernel::build(&spec("tiny-dbrx"), &options(Chip::V6e, 1, 256, None))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(mk.plan.dims.layer_norm);
    snapshot("tiny-dbrx_megakernel_mosaic", &mk.lowered.module);
}

/// Llama 4 and Granite read (the reference computes them), but no stage emits Llama 4's
/// chunked attention, `NoPE` layers, L2 q/k norm, input-scaling routing weights or RoPE
/// form, or Granite's multipliers: refused naming each, not planned wrong. (gpt-oss's
/// stages are emitted: [`gpt_oss_plans_its_stage_options`].)
#[test]
fn llama4_granite_ernie_and_phimoe_are_refused_by_feature() {
    for (fixture, features) in [
        (
            "tiny-llama4",
            &[
                "chunked attention",
                "NoPE layers",
                "the L2 q/k norm after RoPE",
                "routing weights scaling the experts' input",
                "Llama 3 RoPE scaling or complex-pair RoPE",
                "llama4_text",
            ][..],
        ),
        ("tiny-granitemoe", &["Granite's embedding, residual and logits multipliers"][..]),
        ("tiny-ernie4_5-moe", &["Llama 3 RoPE scaling or complex-pair RoPE"][..]),
        (
            "tiny-phimoe",
            &[
                "LayerNorm with bias",
                "an lm_head bias",
                "the sparsemixer router",
                "LongRoPE",
                "phimoe",
            ][..],
        ),
    ] {
        match Plan::new(&spec(fixture), &options(Chip::V6e, 1, 256, Some(2))) {
            Err(e @ PlanError::Unsupported(_)) => {
                let msg = e.to_string();
                for feature in features {
                    assert!(msg.contains(feature), "{fixture}: {feature}: {msg}");
                }
            }
            other => panic!("{fixture}: expected a refusal, got {other:?}"),
        }
    }
}

/// gpt-oss's stage options as plan data: the alternating sliding (window 4) and full
/// layers, the sinks, the router and expert biases, the clamped SwiGLU, YaRN's tables; the
/// operands they add and the KV tiles the sliding layers skip.
#[test]
fn gpt_oss_plans_its_stage_options() {
    use palladium_fusion::layout::OperandKind;
    let s = spec("tiny-gpt-oss-256");
    let p = Plan::new(&s, &options(Chip::V6e, 1, 256, None)).unwrap();
    let d = &p.dims;
    assert_eq!((d.window, d.sliding_layers.as_deref()), (Some(4), Some(&[0, 2][..])));
    assert!(d.sinks && d.router_bias && d.expert_bias && d.qkv_bias && d.o_bias);
    assert_eq!(d.clamped_swiglu, Some((1.702, 7.0)));
    let (inv_freq, factor) = d.rope_table.clone().unwrap();
    assert_eq!(inv_freq.len(), 32);
    assert!((factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-6, "{factor}");
    assert_eq!(p.layout.operand(OperandKind::Sinks).unwrap().shape, [4, 2, 16, 128]);
    assert_eq!(p.layout.operand(OperandKind::RouterBias).unwrap().shape, [4, 8, 128]);
    let eb = p.layout.expert_block;
    assert_eq!(
        p.layout.operand(OperandKind::ExpertBias).unwrap().shape,
        [4, 8, 128 / eb, 8, (2 * eb).max(256)]
    );
    // Context 256 in one tile of 256: the sliding layers read the window's tile and the
    // one before it, at most the cache's one tile; so at this context the same bytes.
    let long = Plan::new(&s, &options(Chip::V6e, 1, 4096, None)).unwrap();
    let (tile, tiles) = (long.block_kv, long.dims.positions / long.block_kv);
    let per_tile = 2 * 2 * tile * 128 * 2;
    assert_eq!(long.traffic.kv_read, (2 * 2 + 2 * tiles) * per_tile, "2 sliding layers: 2 tiles");
    let text = report::text(&p);
    for read in ["self_attn.sinks", "router.bias", "gate_up_proj_bias", "down_proj_bias"] {
        assert!(text.contains(read), "{read} not in the report:\n{text}");
    }
    // Both layer kinds under one traced layer loop; a quantized plan (its router bias and
    // norm rows beside the bf16 router, the expert ring's scales beside the bias blocks)
    // builds too, though the model crate does not quantize fused expert tensors.
    Megakernel::build(&s, &options(Chip::V6e, 1, 256, None)).unwrap_or_else(|e| panic!("{e}"));
    let int8 = PlanOptions {
        weights: palladium_model::quant::WeightsDtype::Int8,
        ..options(Chip::V6e, 1, 256, None)
    };
    Megakernel::build(&s, &int8).unwrap_or_else(|e| panic!("int8: {e}"));
    // Sliding layers of two windows are two attention kinds: refused, naming the layers.
    let mut two_windows = s.clone();
    two_windows.layers[2].attention = palladium_model::AttentionKind::Sliding { window: 8 };
    match Plan::new(&two_windows, &options(Chip::V6e, 1, 256, None)) {
        Err(e @ PlanError::Unsupported(_)) => {
            assert!(e.to_string().contains("layers of different kinds (layer 0"), "{e}");
            assert!(e.to_string().contains("layer 2: sliding attention (window 8)"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The tiny gpt-oss megakernel as the Mosaic module libtpu gets (the per-layer window,
/// sinks, biases, clamped SwiGLU and YaRN tables), so any change to it is reviewed.
#[test]
fn tiny_gpt_oss_megakernel_snapshot() {
    let mk = Megakernel::build(&spec("tiny-gpt-oss-256"), &options(Chip::V6e, 1, 256, None))
        .unwrap_or_else(|e| panic!("{e}"));
    snapshot("tiny-gpt-oss-256_megakernel_mosaic", &mk.lowered.module);
}
