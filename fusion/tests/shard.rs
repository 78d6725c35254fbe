//! The sharding planner (`--devices N`): the split, the experts' choice, the per-device
//! fit, the collectives' model, the refusals.
use palladium_dsl::spec::Chip;
use palladium_fusion::plan::{Plan, PlanError, PlanOptions};
use palladium_fusion::report;
use palladium_fusion::shard::ExpertSplit;
use palladium_model::ModelSpec;

fn fixture(name: &str) -> String {
    format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))
}

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(fixture(name)).unwrap()
}

fn options(chip: Chip, batch: u64, devices: u64) -> PlanOptions {
    PlanOptions { devices, ..PlanOptions::new(chip, batch, 4096) }
}

#[test]
fn qwen3_235b_fits_eight_v7x_devices() {
    let s = spec("qwen3-235b-a22b");
    let one = Plan::new(&s, &PlanOptions { check_hbm: false, ..options(Chip::V7x, 1, 1) }).unwrap();
    let p = Plan::new(&s, &options(Chip::V7x, 1, 8)).unwrap();
    let sh = p.sharding.as_ref().expect("8 devices are a split");
    assert_eq!(p.layers, 94);
    assert!(p.hbm_total <= p.hbm_capacity && p.vmem_total <= p.vmem_capacity);
    // 64 query heads over 4 KV heads: each KV head on 2 devices, 8 query heads each.
    assert_eq!(
        (
            sh.heads.heads_per_device,
            sh.heads.kv_heads_per_device,
            sh.heads.kv_replicas,
            sh.heads.heads_padded
        ),
        (8, 1, 2, 64)
    );
    assert_eq!((p.dims.heads, p.dims.kv_heads, p.dims.group), (8, 1, 8));
    // lm_head by vocabulary: 151936 / 8 ids per device.
    assert_eq!((sh.vocab, sh.vocab_per_device), (151936, 18992));
    // Each device streams less than one device did, and holds at least an eighth.
    assert!(p.traffic.total < one.traffic.total);
    assert!(p.hbm_total * 8 >= one.hbm_total && p.hbm_total < one.hbm_total / 4);
    // Two bf16 all-reduces of the [rows, H] activation per layer, one gather of the
    // greedy pairs: 2 (N-1)/N of the message each.
    let activation = p.dims.rows * p.dims.hidden * 2;
    assert_eq!(sh.collectives.len(), 3);
    for c in &sh.collectives[..2] {
        assert_eq!(
            (c.count, c.message_bytes, c.sent_bytes, c.wire.to_string().as_str()),
            (94, activation, 94 * 2 * 7 * activation / 8, "bf16")
        );
    }
    assert_eq!(sh.collectives[2].sent_bytes, 7 * p.dims.rows * 8);
    // Across chips at the measured 45 GB/s per core and direction, plus the measured
    // latency of each collective.
    let per_all_reduce = 3.5e-6 + (2 * 7 * activation / 8) as f64 / (2.0 * 45e9);
    assert!(
        (sh.collectives[0].seconds - 94.0 * per_all_reduce).abs() < 1e-9,
        "{}",
        sh.collectives[0].seconds
    );
    assert!(sh.link_model.contains("measured cross-chip"));
    let text = report::text(&p);
    for needle in [
        "split over 8 v7x devices",
        "experts: TP",
        "a MODEL",
        "all-reduce",
        "bf16 wire",
        "floor + collectives",
    ] {
        assert!(text.contains(needle), "{needle} not in\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&report::json(&p)).unwrap();
    assert_eq!(
        (json["sharding"]["devices"].as_u64(), json["sharding"]["experts"]["split"].as_str()),
        (Some(8), Some("TP"))
    );
    // One device: no split, and the JSON report as before.
    assert!(one.sharding.is_none());
    let json: serde_json::Value = serde_json::from_str(&report::json(&one)).unwrap();
    assert!(json.get("sharding").is_none());
}

#[test]
fn experts_split_by_the_bytes_a_device_streams() {
    let s = spec("qwen3-235b-a22b");
    // Batch 1: the 8 chosen experts may all sit on one device under EP (8 whole experts),
    // while TP streams 1/8 of each (intermediate 1536 padded to 2048): TP.
    let p = Plan::new(&s, &options(Chip::V7x, 1, 8)).unwrap();
    let e = &p.sharding.as_ref().unwrap().experts;
    assert_eq!(
        (e.split, e.experts_per_device, e.intermediate_per_device),
        (ExpertSplit::Tp, 128, 256)
    );
    assert!(e.tp_step_bytes < e.ep_step_bytes && e.reason.starts_with("TP"), "{}", e.reason);
    assert!(e.reason.contains("intermediate 1536 padded to 2048, 256 per device"), "{}", e.reason);
    assert_eq!(p.dims.intermediate, 256);
    // Batch 16: 128 choices; EP's worst device streams its 16 whole experts, TP all 128
    // eighths (padded): EP.
    let p = Plan::new(&s, &options(Chip::V7x, 16, 8)).unwrap();
    let e = &p.sharding.as_ref().unwrap().experts;
    assert_eq!(
        (e.split, e.experts_per_device, e.intermediate_per_device),
        (ExpertSplit::Ep, 16, 1536)
    );
    assert_eq!(p.dims.experts_per_device, 16);
    assert_eq!(p.distinct_experts(), 16);
    // The router stays whole on every device.
    assert_eq!((p.dims.experts, p.dims.experts_pad), (128, 128));
}

#[test]
fn refusals_name_the_reason() {
    let s = spec("qwen3-235b-a22b");
    // One device: at most 19 layers fit, and the refusal says how many devices hold all 94.
    match Plan::new(&s, &options(Chip::V7x, 1, 1)) {
        Err(e @ PlanError::Hbm { max_layers: 19, .. }) => assert!(
            e.to_string().contains(
                "(at most 19 of the model's layers fit; it needs at least 8 devices (--devices 8))"
            ),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    match Plan::new(&s, &options(Chip::V7x, 1, 4)) {
        Err(e @ PlanError::Devices { .. }) => {
            assert!(e.to_string().contains("needs at least 8 devices (--devices 8)"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    match Plan::new(&s, &options(Chip::V6e, 1, 8)) {
        Err(e @ PlanError::Devices { .. }) => assert!(
            e.to_string().contains("needs at least 16 devices, more than the 8 supported"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    match Plan::new(&s, &options(Chip::V7x, 1, 3)) {
        Err(e @ PlanError::Invalid(_)) => {
            assert!(e.to_string().contains("--devices 3 (supported: 1, 2, 4, 8)"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // 6 KV heads neither split over 4 devices nor replicate onto them.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen3-moe")).unwrap()).unwrap();
    v["num_attention_heads"] = 12.into();
    v["num_key_value_heads"] = 6.into();
    let odd = ModelSpec::from_json(&v).unwrap();
    assert!(Plan::new(&odd, &options(Chip::V6e, 1, 2)).is_ok());
    match Plan::new(&odd, &options(Chip::V6e, 1, 4)) {
        Err(e @ PlanError::Split { .. }) => {
            assert!(e.to_string().contains("the 6 KV heads"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Quantized weights split like bf16 ones (their scales follow each code).
    let int8 = PlanOptions {
        weights: palladium_model::quant::WeightsDtype::Int8,
        ..options(Chip::V6e, 1, 2)
    };
    let p = Plan::new(&spec("tiny-qwen3-moe"), &int8).unwrap();
    assert!(p.layout.quant.is_some() && p.sharding.as_ref().is_some_and(|sh| sh.devices == 2));
}

#[test]
fn query_heads_pad_to_divide_the_devices() {
    // 12 query heads over 4 KV heads on 8 devices: each KV head on 2 devices, its group of
    // 3 padded to 4 with a zero-weight head.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-qwen3-moe")).unwrap()).unwrap();
    v["num_attention_heads"] = 12.into();
    v["num_key_value_heads"] = 4.into();
    let s = ModelSpec::from_json(&v).unwrap();
    let p = Plan::new(&s, &options(Chip::V6e, 1, 8)).unwrap();
    let h = &p.sharding.as_ref().unwrap().heads;
    assert_eq!(
        (h.heads_padded, h.heads_per_device, h.kv_heads_per_device, h.kv_replicas),
        (16, 2, 1, 2)
    );
    assert!(report::text(&p).contains("padded with zero weights to 16"));
    // v6e is not measured: the published per-link figure, no latency.
    assert!(p.sharding.unwrap().link_model.contains("published"));
}

/// The N-device megakernel: one SPMD program over the mesh, with the barrier, the remote
/// hops and the call's communication flags (what `jax.shard_map` gives a Pallas kernel).
#[test]
fn sharded_plans_emit_one_spmd_program_with_in_kernel_collectives() {
    use palladium_fusion::megakernel::Megakernel;
    for (model, chip, batch, devices, split) in [
        ("tiny-qwen3-moe", Chip::V6e, 1, 2, ExpertSplit::Ep),
        ("tiny-qwen3-moe", Chip::V6e, 4, 4, ExpertSplit::Ep),
        ("qwen3-235b-a22b", Chip::V7x, 1, 8, ExpertSplit::Tp),
    ] {
        let what = format!("{model} on {devices} {chip} devices");
        let m = Megakernel::build(
            &spec(model),
            &PlanOptions { devices, ..PlanOptions::new(chip, batch, 256) },
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(m.plan.sharding.as_ref().unwrap().experts.split, split, "{what}");
        let body = &m.lowered.module;
        for op in [
            "tpu.device_id",
            "tpu.sem_barrier",
            "tpu.sem_signal",
            "tpu.enqueue_dma",
            "tpu.wait_dma2",
        ] {
            assert!(body.contains(op), "{what}: no {op}");
        }
        // One barrier per step: its two signals and one wait, outside the layer loop.
        assert_eq!(body.matches("tpu.sem_barrier").count(), 1, "{what}");
        assert!(
            m.lowered.call_json.contains("\"has_communication\":true")
                && m.lowered.call_json.contains("\"collective_id\":0"),
            "{what}: {}",
            m.lowered.call_json
        );
    }
}

#[test]
fn the_acceptance_models_plan_on_their_devices() {
    // Qwen3-30B-A3B on 4 v6e chips: 4 KV heads, one per device, 8 query heads each.
    let p = Plan::new(&spec("qwen3-30b-a3b"), &options(Chip::V6e, 1, 4)).unwrap();
    let sh = p.sharding.as_ref().unwrap();
    assert_eq!(
        (p.layers, sh.heads.heads_per_device, sh.heads.kv_heads_per_device, sh.heads.kv_replicas),
        (48, 8, 1, 1)
    );
    assert!(p.hbm_total <= p.hbm_capacity && p.vmem_total <= p.vmem_capacity);
    assert!(sh.link_model.contains("published"));
    // Mixtral-8x7B on the 2 TensorCores of one v7x chip: 4 of the 8 KV heads each, the
    // ring at the sibling-core figures.
    let s = spec("mixtral-8x7b");
    assert_eq!(
        (
            s.layers.len(),
            s.hidden_size,
            s.attention.num_heads,
            s.attention.num_kv_heads,
            s.attention.head_dim,
            s.vocab_size
        ),
        (32, 4096, 32, 8, 128, 32000)
    );
    let p = Plan::new(&s, &options(Chip::V7x, 1, 2)).unwrap();
    let sh = p.sharding.as_ref().unwrap();
    assert_eq!(
        (sh.heads.heads_per_device, sh.heads.kv_heads_per_device, sh.vocab_per_device),
        (16, 4, 16000)
    );
    // Batch 1 chooses 2 experts: under EP both may be one device's, under TP each device
    // streams half of both.
    assert_eq!((sh.experts.split, sh.experts.intermediate_per_device), (ExpertSplit::Tp, 7168));
    assert!(
        sh.experts.reason.contains("intermediate 14336, 7168 per device"),
        "{}",
        sh.experts.reason
    );
    assert!(p.hbm_total <= p.hbm_capacity && p.vmem_total <= p.vmem_capacity);
    assert!(sh.link_model.contains("sibling"));
}

/// A split plan's operand prose is one device's share: the model's heads, experts, expert
/// columns and vocabulary ids of a device's local ones in terms of its index `me`, and
/// per-device sizes (the one-device wording, `o_proj.weight [H, heads*64]` or an
/// `lm_head` row `c*1024 + j`, would describe the whole model).
#[test]
fn the_operand_prose_of_a_split_plan_is_one_devices_share() {
    let s = spec("tiny-qwen3-moe");
    // 4 devices: each of the 2 KV heads on 2 devices, one query head each; experts EP.
    let p = Plan::new(
        &s,
        &PlanOptions { devices: 4, logits: true, ..PlanOptions::new(Chip::V6e, 1, 64) },
    )
    .unwrap();
    let text = report::text(&p);
    // An operand's line: "  input w_stream bf16[..] (any): ..." (not a VMEM plan line
    // such as "  router logits (router_logits): ..").
    let operand = |name: &str| {
        text.lines()
            .find(|l| {
                let mut words = l.trim_start().split(' ');
                ["prefetch", "input", "output"].contains(&words.next().unwrap_or(""))
                    && words.next() == Some(name)
            })
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
            .to_string()
    };
    let stream = operand("w_stream");
    for needle in [
        "device me's share (of 4: 1 of the 4 query heads, a 2-way split of its KV head's query group; each of the 2 KV heads replicated on 2 devices; experts EP, 2 of the 8 experts; 128 of the 512 vocabulary ids",
        "q_proj.weight[g*64 + j % 128 for the model's head g = (me / 2)*2 + (me % 2)*1 + j / 128 (each head's 64 padded to 128), i] * model.layers.{l}.input_layernorm.weight[i]",
        "k_proj.weight[g*64 + j % 128 for the model's head g = (me / 2)*1 + j / 128",
        "o_proj.weight[i, g*64 + j % 128 for the model's head g = (me / 2)*2 + (me % 2)*1 + j / 128",
        "lm_head.weight[me*128 + c*1024 + j (zero past local 128 or the model's 512), i] * model.norm.weight[i]",
    ] {
        assert!(stream.contains(needle), "{needle} not in\n{stream}");
    }
    assert!(!stream.contains("heads*64") && !stream.contains("[c*1024 + j, i]"), "{stream}");
    assert!(
        operand("w_experts").contains("e local, the name's {e} = me*2 + e"),
        "{}",
        operand("w_experts")
    );
    assert!(
        operand("k_cache").contains("kv head g (the model's KV head me / 2)"),
        "{}",
        operand("k_cache")
    );
    assert!(operand("logits").contains("for token v (the model's token me*128 + v; the devices' slices concatenated give the vocabulary)") && operand("logits").contains("v >= 128 are padding"), "{}", operand("logits"));
    // Experts TP (Qwen3-235B-A22B on 8 v7x devices): the model's columns of a device's slice.
    let p = Plan::new(&spec("qwen3-235b-a22b"), &options(Chip::V7x, 1, 8)).unwrap();
    let experts = report::operand_source(
        &p,
        p.layout.operand(palladium_fusion::layout::OperandKind::WExperts).unwrap(),
    );
    assert!(
        experts.contains("experts TP, 256 of each expert's intermediate columns")
            && experts.contains("gate_proj.weight[me*256 + c*128 + j (zero past local 256"),
        "{experts}"
    );
    assert!(!experts.contains("the model's expert"), "{experts}");
}
