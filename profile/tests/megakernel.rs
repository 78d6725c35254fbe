//! The model on the decode megakernel (Qwen3-30B-A3B, 8 layers, v6e, batch 1, context 4096,
//! every KV tile, the static worst case of experts): libtpu's estimator brackets the truth
//! (docs/benchmarks.md: it gives every concurrent DMA its own bandwidth, so the deep ring
//! scores above the HBM floor, and the one-chunk-ahead variant is a lower bound), and the
//! model, whose DMAs share the bandwidth, must land between the two.
//!
//! libtpu's figures take minutes and several GB to compute, so they are cached in
//! `tests/data/megakernel-v6e.json`; `PALLADIUM_MEASURE_LIBTPU=1` measures them again (one
//! compile at a time, aliases dropped from the call spec as in `cargo bench --bench
//! megakernel`) and rewrites the file.

use palladium_autotune::Libtpu;
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_fusion::emit::emit;
use palladium_fusion::plan::{ExpertFetch, KvTiles, Plan, PlanOptions, Prefetch};
use palladium_model::ModelSpec;
use palladium_profile::calibration::Calibration;
use palladium_profile::{Inputs, simulate};
use serde_json::json;

const CHIP: Chip = Chip::V6e;

fn plan(prefetch: Prefetch) -> Plan {
    let spec = ModelSpec::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/models/qwen3-30b-a3b.json"
    ))
    .unwrap();
    let options = PlanOptions {
        layers: Some(8),
        kv_tiles: KvTiles::All,
        prefetch,
        logits: false,
        expert_fetch: ExpertFetch::WorstCase,
        ..PlanOptions::new(CHIP, 1, 4096)
    };
    Plan::new(&spec, &options).unwrap()
}

fn libtpu_figures(deep: &Kernel, single: &Kernel, bytes: u64) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/megakernel-v6e.json");
    if std::env::var_os("PALLADIUM_MEASURE_LIBTPU").is_none() {
        return serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    }
    let libtpu = Libtpu::new().unwrap_or_else(|e| panic!("{e}")).with_workers(1).without_aliases();
    let one =
        |k: &Kernel| libtpu.cycles(&[k], CHIP).pop().unwrap().unwrap_or_else(|e| panic!("{e}"));
    let (deep_cycles, single_cycles) = (one(deep), one(single));
    let (floor, streamed) = libtpu.floor(CHIP, bytes).unwrap();
    let floor_cycles = (floor as f64 * bytes as f64 / streamed as f64).round() as u64;
    let figures = json!({"libtpu": "0.0.42.1", "bytes": bytes, "floor_cycles": floor_cycles, "deep_cycles": deep_cycles, "single_cycles": single_cycles});
    std::fs::write(path, serde_json::to_string_pretty(&figures).unwrap() + "\n").unwrap();
    figures
}

#[test]
fn the_megakernel_lies_between_libtpus_single_prefetch_and_deep_estimates() {
    let (deep_plan, single_plan) = (plan(Prefetch::Deep), plan(Prefetch::Single));
    let bytes = deep_plan.traffic.total;
    assert_eq!(bytes, single_plan.traffic.total);
    let (deep, single) = (emit(&deep_plan).unwrap(), emit(&single_plan).unwrap());
    let f = libtpu_figures(&deep, &single, bytes);
    assert_eq!(
        f["bytes"].as_u64(),
        Some(bytes),
        "tests/data/megakernel-v6e.json is for another plan: rerun with PALLADIUM_MEASURE_LIBTPU=1"
    );
    let floor = f["floor_cycles"].as_f64().unwrap();
    let c = Calibration::committed();
    let c = c.chip(CHIP).unwrap();
    // The step at the end of the context, as `palladium profile` models it by default.
    let mut inputs = Inputs::default();
    inputs.prefetch.insert("positions".into(), vec![4095]);
    let model_deep = simulate(&deep, CHIP, c, &inputs).unwrap();
    let model_single = simulate(&single, CHIP, c, &inputs).unwrap();
    assert!(model_deep.assumptions.is_empty(), "{:?}", model_deep.assumptions);
    // HBM bytes the model moved: the plan's (the logits are not returned).
    assert!(
        (model_deep.hbm_bytes() as f64 / bytes as f64 - 1.0).abs() < 0.01,
        "{} vs {bytes}",
        model_deep.hbm_bytes()
    );
    let ratio = |cycles: f64| floor / cycles;
    let (libtpu_deep, libtpu_single) =
        (ratio(f["deep_cycles"].as_f64().unwrap()), ratio(f["single_cycles"].as_f64().unwrap()));
    let (ours_deep, ours_single) = (ratio(model_deep.cycles), ratio(model_single.cycles));
    eprintln!(
        "floor/mk: libtpu single {libtpu_single:.3}, deep {libtpu_deep:.3}; model deep {ours_deep:.3} (HBM efficiency {:.3}), single {ours_single:.3} (HBM efficiency {:.3})",
        model_deep.hbm_efficiency(),
        model_single.hbm_efficiency()
    );
    assert!(
        libtpu_single < ours_deep && ours_deep < libtpu_deep,
        "the model's deep ring ({ours_deep:.3}) is not between libtpu's single ({libtpu_single:.3}) and deep ({libtpu_deep:.3})"
    );
}
