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

/// Multi-head latent attention's layer (DeepSeek-V3's low-rank query, DeepSeek-V2's
/// direct one): the query's first projection and `kv_a_proj_with_mqa` read the same normed
/// input, so the rewrites fold `input_layernorm` into both and fuse them into one matmul
/// (the design's one `H`-input segment); `q_a_layernorm` folds into `q_b_proj`; the latent
/// attention keeps `kv_a_layernorm` and `kv_b_proj` (folded and stacked by the stage's
/// source maps, not by a matmul here).
#[test]
fn deepseek_layers_fuse_the_query_and_latent_projections_and_fold_their_norms() {
    let fused = |q| (vec![q, WeightKind::KvAProj], Some(WeightKind::InputNorm));
    for (name, query, attention) in [
        (
            "tiny-deepseek-v3",
            "q_b_proj",
            vec![
                fused(WeightKind::QAProj),
                (vec![WeightKind::QBProj], Some(WeightKind::QANorm)),
                (vec![WeightKind::OProj], None),
            ],
        ),
        (
            "tiny-deepseek-v2",
            "q_proj",
            vec![fused(WeightKind::QProj), (vec![WeightKind::OProj], None)],
        ),
    ] {
        let s = spec(name);
        let g = LayerGraph::build(&s, 0);
        let names = g.describe();
        assert!(
            names.contains(&format!("attn <- {query}, kv_a_proj_with_mqa")),
            "{name}: {names:?}"
        );
        let r = rewrite(&g.to_expr(), &layer_weight_bytes(&s));
        assert_eq!(r.stop, "Saturated", "{name}");
        assert!(r.cost_after < r.cost_before, "{name}");
        let kinds: Vec<(Vec<WeightKind>, Option<WeightKind>)> =
            r.matmuls.iter().map(|m| (m.kinds(), m.folded_kind())).collect();
        assert_eq!(kinds[..attention.len()], attention[..], "{name}: {}", r.expr);
        for weight in ["kv_a_layernorm", "kv_b_proj"] {
            assert!(r.expr.contains(&format!("w:self_attn.{weight}.weight")), "{name}: {}", r.expr);
        }
    }
}
