//! The per-layer graph and its egg rewrites.
use palladium_fusion::graph::{LayerGraph, WeightKind};
use palladium_fusion::plan::layer_weight_bytes;
use palladium_fusion::rewrite::rewrite;
use palladium_model::ModelSpec;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

#[test]
fn qwen3_and_mixtral_layers_fuse_qkv_and_gate_up_and_fold_norms() {
    for (name, router) in
        [("tiny-qwen3-moe", "mlp.gate.weight"), ("tiny-mixtral", "block_sparse_moe.gate.weight")]
    {
        let s = spec(name);
        let g = LayerGraph::build(&s, 0);
        let r = rewrite(&g.to_expr(), &layer_weight_bytes(&s));
        assert_eq!(r.stop, "Saturated", "{name}");
        assert!(r.iterations < 30 && r.egraph_nodes < 10_000, "{name}: {r:?}");
        assert!(r.cost_after < r.cost_before, "{name}");
        let w: Vec<(Vec<&str>, Option<&str>)> = r
            .matmuls
            .iter()
            .map(|m| {
                (
                    m.weights.iter().map(|w| w.name.as_str()).collect(),
                    m.folded_scale.as_ref().map(|w| w.name.as_str()),
                )
            })
            .collect();
        assert_eq!(
            w,
            vec![
                (
                    vec![
                        "self_attn.q_proj.weight",
                        "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight"
                    ],
                    Some("input_layernorm.weight")
                ),
                (vec!["self_attn.o_proj.weight"], None),
                (vec![router], Some("post_attention_layernorm.weight")),
            ],
            "{name}"
        );
        assert_eq!(r.experts.len(), 2, "{name}: gate/up fused");
        assert_eq!(r.experts[0].weights.len(), 2);
        assert_eq!(
            r.experts[0].folded_scale.as_ref().map(|w| w.name.as_str()),
            Some("post_attention_layernorm.weight")
        );
        // The kinds the plan reads the extraction by.
        let kinds: Vec<(Vec<WeightKind>, Option<WeightKind>)> =
            r.matmuls.iter().chain(&r.experts).map(|m| (m.kinds(), m.folded_kind())).collect();
        assert_eq!(
            kinds,
            vec![
                (
                    vec![WeightKind::QProj, WeightKind::KProj, WeightKind::VProj],
                    Some(WeightKind::InputNorm)
                ),
                (vec![WeightKind::OProj], None),
                (vec![WeightKind::Router], Some(WeightKind::PostAttentionNorm)),
                (
                    vec![WeightKind::ExpertGate, WeightKind::ExpertUp],
                    Some(WeightKind::PostAttentionNorm)
                ),
                (vec![WeightKind::ExpertDown], None),
            ],
            "{name}"
        );
    }
}

#[test]
fn graph_is_a_dag_in_layer_order() {
    let s = spec("tiny-qwen3-moe");
    let g = LayerGraph::build(&s, 0);
    let names = g.describe();
    assert_eq!(names.first().map(String::as_str), Some("x"));
    assert!(names.last().unwrap().starts_with("ffn_residual"));
    assert_eq!(names.len(), g.graph.node_count());
}
