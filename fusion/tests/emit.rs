//! The tiny megakernels build, verify and lower.
use palladium_dsl::spec::Chip;
use palladium_fusion::plan::{Plan, PlanOptions};
use palladium_model::ModelSpec;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn tiny_qwen3_lowers() {
    let s = spec("tiny-qwen3-moe");
    let plan = Plan::new(&s, &PlanOptions { chip: Chip::V6e, batch: 1, context: 256, layers: None, check_hbm: true }).unwrap();
    let k = palladium_fusion::emit::emit(&plan).unwrap_or_else(|e| panic!("{e}"));
    let lowered = palladium_lowering::lower(&k, &palladium_lowering::LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all("/tmp/mk").unwrap();
    std::fs::write("/tmp/mk/megakernel.mlir", &lowered.module).unwrap();
    std::fs::write("/tmp/mk/megakernel.body.mlir", &lowered.body).unwrap();
    std::fs::write("/tmp/mk/megakernel.call.json", &lowered.call_json).unwrap();
}
