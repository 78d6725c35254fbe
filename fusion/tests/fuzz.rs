//! Property tests that last: mutated configs (field deletions, type changes, huge, zero and
//! negative values) and arbitrary plan options (chip, batch, context up to 2^64, layers)
//! through `ModelSpec` parsing and the megakernel planner. Nothing may panic or wrap: a
//! config error names its field, a plan is refused with a `PlanError`, and an accepted plan's
//! byte counts add up.
//!
//! `cargo test -p palladium-fusion --test tests fuzz::` runs a modest number of cases; run longer
//! with `PROPTEST_CASES=20000 cargo test --release -p palladium-fusion --test tests fuzz::`.

use crate::config_fuzz;

use config_fuzz::{config, mutate, mutations};
use palladium_dsl::build::MemorySpace;
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::OperandKind;
use palladium_fusion::plan::{KvTiles, Plan, PlanOptions, Prefetch};
use palladium_model::ModelSpec;
use proptest::prelude::*;

fn fixture(name: &str) -> serde_json::Value {
    let path = format!("{}/../fixtures/models/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn mutated_configs_plan_or_are_refused(
        fixture_name in prop::sample::select(&["tiny-qwen3-moe.json", "tiny-mixtral.json", "qwen3-30b-a3b.json", "tiny-qwen3-moe-sparse-step-2.json"][..]),
        edits in prop::option::weighted(0.7, mutations()),
        chip in prop::sample::select(&[Chip::V4, Chip::V5e, Chip::V5p, Chip::V6e, Chip::V7x][..]),
        batch in prop_oneof![0u64..20, Just(u64::MAX)],
        context in prop_oneof![0u64..5_000, 0u64..50_000, Just(1u64 << 52), Just(u64::MAX)],
        layers in prop::option::of(prop_oneof![0usize..60, Just(usize::MAX)]),
        check_hbm in any::<bool>(),
        all_tiles in any::<bool>(),
        single in any::<bool>(),
        tokens_per_seq in prop_oneof![0u64..20, Just(u64::MAX)],
        logits in any::<bool>(),
        devices in prop::sample::select(&[1u64, 1, 2, 4, 8, 3][..]),
    ) {
        let base = fixture(fixture_name);
        let v = match &edits { Some(e) => mutate(&base, e), None => base };
        let spec = match ModelSpec::from_json(&v) {
            Ok(s) => s,
            Err(e) => {
                prop_assert!(e.field().is_some(), "{e}");
                return Ok(());
            }
        };
        let options = PlanOptions {
            layers,
            check_hbm,
            kv_tiles: if all_tiles { KvTiles::All } else { KvTiles::UpToPosition },
            prefetch: if single { Prefetch::Single } else { Prefetch::Deep },
            tokens_per_seq,
            logits,
            devices,
            ..PlanOptions::new(chip, batch, context)
        };
        match Plan::new(&spec, &options) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(plan) => {
                prop_assert!(plan.context <= spec.max_position_embeddings);
                prop_assert!(plan.dims.positions >= plan.context && plan.dims.positions <= i32::MAX as u64);
                prop_assert!(plan.vmem_total <= plan.vmem_capacity);
                if check_hbm {
                    prop_assert!(plan.hbm_total <= plan.hbm_capacity);
                }
                let sum = plan.layout.operands.iter().filter(|o| (o.space == MemorySpace::Any && o.kind.aliased_input().is_none()) || matches!(o.kind, OperandKind::Logits | OperandKind::NextIds | OperandKind::MaxLogits | OperandKind::RouterNonFinite)).map(|o| u128::from(o.bytes)).sum::<u128>();
                prop_assert_eq!(sum, u128::from(plan.hbm_total));
                // A split covers every head and id once, and its collectives are priced.
                prop_assert_eq!(plan.sharding.is_some(), devices > 1);
                if let Some(sh) = &plan.sharding {
                    prop_assert_eq!(sh.heads.heads_per_device * devices, sh.heads.heads_padded);
                    prop_assert!(sh.heads.heads_padded >= sh.heads.heads && sh.vocab_per_device * devices >= sh.vocab);
                    prop_assert!(sh.collective_seconds.is_finite() && sh.collective_seconds > 0.0 && sh.collective_bytes > 0);
                }
            }
        }
    }
}

/// Every size at the parser's cap at once, the longest context the config allows, the largest
/// batch: every byte count past 2^64 is refused as such (none wraps), with or without the HBM
/// check.
#[test]
fn every_size_at_its_cap_is_refused_without_wrapping() {
    let mut v = fixture("tiny-qwen3-moe.json");
    v["num_hidden_layers"] = serde_json::json!(1u64 << 16);
    for k in [
        "hidden_size",
        "vocab_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_key_value_heads",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "intermediate_size",
    ] {
        v[k] = serde_json::json!(1u64 << 24);
    }
    v["head_dim"] = serde_json::json!(256);
    let spec = ModelSpec::from_json(&v).unwrap();
    for (check_hbm, devices) in [(true, 1), (false, 1), (true, 8), (false, 8)] {
        let options =
            PlanOptions { check_hbm, devices, ..PlanOptions::new(Chip::V7x, 16, 1 << 24) };
        let err = Plan::new(&spec, &options).unwrap_err().to_string();
        assert!(
            err.contains("does not fit any chip") && err.contains("more than 2^64 bytes"),
            "{err}"
        );
    }
}
