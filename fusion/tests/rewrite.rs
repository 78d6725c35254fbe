//! The per-layer graph and its egg rewrites.
use palladium_fusion::graph::LayerGraph;
use palladium_fusion::rewrite::rewrite;
use palladium_model::ModelSpec;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn qwen3_layer_fuses_qkv_and_gate_up_and_folds_norms() {
    let s = spec("tiny-qwen3-moe");
    let g = LayerGraph::build(&s, 0);
    let expr = g.to_expr();
    let weights = palladium_fusion::plan::layer_weight_bytes(&s);
    let r = rewrite(&expr, &weights);
    println!("{}\n{:#?}", expr, r);
    assert_eq!(r.stop, "Saturated");
    assert!(r.cost_after < r.cost_before);
}
