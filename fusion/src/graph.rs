//! The per-layer op graph: one decoder layer of a [`ModelSpec`] as a petgraph DAG of
//! layer-level ops (norms, projections, RoPE, attention, router, experts, residual adds),
//! with the Hugging Face weights each op reads.
//!
//! The MoE layers of the supported models have one kind (full or sliding attention, MoE
//! FFN), so one graph describes all of them ([`crate::plan::rewritten_layer`]'s);
//! [`LayerGraph::kind`] names it and [`crate::plan`] refuses models whose MoE layers differ
//! in kind. Dense-MLP layers among them ([`crate::layout::Ffn::DenseMlp`]) share their
//! attention and the dense stream's form; their MLP is chunked as an expert is. The graph is the input of the
//! egg rewrites ([`crate::rewrite`]), which see it as one expression with shared subterms
//! ([`LayerGraph::to_expr`]).

use palladium_model::{AttentionKind, Family, FfnKind, ModelSpec, QkNorm};
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use serde::Serialize;

/// What a weight is to the model, whatever its Hugging Face name: the rewrites, the plan
/// and the packer match on kinds, never on names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum WeightKind {
    InputNorm,
    QProj,
    KProj,
    VProj,
    QNorm,
    KNorm,
    /// The q/k/v projections' biases (`attention_bias` / Qwen2-MoE's `qkv_bias`).
    QBias,
    KBias,
    VBias,
    OProj,
    /// `o_proj`'s bias (`OLMoE` with `attention_bias`).
    OBias,
    PostAttentionNorm,
    /// The MoE router (`gate.weight`).
    Router,
    /// `DeepSeek`-V3's router's `e_score_correction_bias` (`[experts]`, f32).
    CorrectionBias,
    /// gpt-oss's `self_attn.sinks` (`[heads]`), its router's bias (`[experts]`) and its
    /// experts' biases (an expert's `[intermediate]` gate and up, `[hidden]` down).
    Sinks,
    RouterBias,
    ExpertGateBias,
    ExpertUpBias,
    ExpertDownBias,
    ExpertGate,
    ExpertUp,
    ExpertDown,
    /// A shared expert's projections (Qwen2-MoE's `shared_expert`), and the `[1, hidden]`
    /// gate of a sigmoid-gated one (`shared_expert_gate`).
    SharedGate,
    SharedUp,
    SharedDown,
    SharedExpertGate,
    /// A dense MLP's projections.
    MlpGate,
    MlpUp,
    MlpDown,
    /// `model.norm.weight`, before `lm_head`.
    FinalNorm,
    /// `lm_head.weight`, or the embedding when tied.
    LmHead,
}

/// A Hugging Face weight (name relative to the layer for per-layer weights) and its kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Weight {
    pub kind: WeightKind,
    pub name: String,
}

impl Weight {
    pub fn new(kind: WeightKind, name: impl Into<String>) -> Weight {
        Weight { kind, name: name.into() }
    }
}

/// One layer-level op.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum OpKind {
    /// The layer input (the residual stream).
    Input,
    /// `rmsnorm(x) * weight` over the hidden dim.
    RmsNorm { weight: Weight },
    /// `x @ weight^T` for a Hugging Face `[out, in]` linear weight.
    Linear { weight: Weight },
    /// Per-head RMS norm of q or k (Qwen3).
    HeadNorm { weight: Weight },
    /// Rotary embedding at the token's position.
    Rope,
    /// Write the new K and V into the cache (in place) and attend over the cache.
    Attention,
    /// `a + b`.
    Residual,
    /// `silu(a) * b` (a dense MLP's activation).
    SiluMul,
    /// Softmax over router logits, top-k (renormalised or raw): expert ids and weights.
    TopK { k: u64 },
    /// Routed experts: `sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))`, experts by id.
    Experts { gate: Weight, up: Weight, down: Weight },
}

/// An op of the graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpNode {
    /// A short unique name (`q_proj`, `attn`, ...).
    pub name: String,
    pub kind: OpKind,
}

/// The decoder layer as a DAG; edges carry activations from producer to consumer, in
/// operand order (edge weight = operand position).
#[derive(Debug, Clone)]
pub struct LayerGraph {
    pub graph: StableDiGraph<OpNode, usize>,
    /// The layer's output (the residual stream after the FFN).
    pub output: NodeIndex,
    pub kind: LayerKind,
}

/// What makes two layers stackable into one weight tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerKind {
    pub attention: AttentionKind,
    /// `(experts, top_k, intermediate)`.
    pub moe: Option<(u64, u64, u64)>,
    pub dense_intermediate: Option<u64>,
}

impl LayerKind {
    pub fn of(layer: &palladium_model::LayerSpec) -> Self {
        match &layer.ffn {
            FfnKind::Moe(m) => LayerKind {
                attention: layer.attention,
                moe: Some((m.num_experts, m.top_k, m.intermediate)),
                dense_intermediate: None,
            },
            FfnKind::Dense { intermediate } => LayerKind {
                attention: layer.attention,
                moe: None,
                dense_intermediate: Some(*intermediate),
            },
        }
    }

    pub fn describe(&self) -> String {
        let attn = match self.attention {
            AttentionKind::Full => "full attention".to_string(),
            AttentionKind::Sliding { window } => format!("sliding attention (window {window})"),
            AttentionKind::Chunked { chunk } => format!("chunked attention (chunks of {chunk})"),
        };
        match (self.moe, self.dense_intermediate) {
            (Some((e, k, i)), _) => format!("{attn} + MoE {e} experts top-{k} (intermediate {i})"),
            (_, Some(i)) => format!("{attn} + dense MLP (intermediate {i})"),
            _ => attn,
        }
    }
}

impl LayerGraph {
    /// The graph of layer `index` of `spec`, with Hugging Face weight names relative to the
    /// layer (`self_attn.q_proj.weight`, `mlp.experts.{e}.gate_proj.weight`, ...).
    pub fn build(spec: &ModelSpec, index: usize) -> LayerGraph {
        let layer = &spec.layers[index];
        let mixtral = spec.family == palladium_model::Family::Mixtral;
        let mut g = StableDiGraph::new();
        let node = |g: &mut StableDiGraph<OpNode, usize>,
                    name: &str,
                    kind: OpKind,
                    inputs: &[NodeIndex]| {
            let n = g.add_node(OpNode { name: name.to_string(), kind });
            for (i, &src) in inputs.iter().enumerate() {
                g.add_edge(src, n, i);
            }
            n
        };
        let x = node(&mut g, "x", OpKind::Input, &[]);
        let w = |kind: WeightKind, name: &str| Weight::new(kind, name);
        let n1 = node(
            &mut g,
            "input_layernorm",
            OpKind::RmsNorm { weight: w(WeightKind::InputNorm, "input_layernorm.weight") },
            &[x],
        );
        let q = node(
            &mut g,
            "q_proj",
            OpKind::Linear { weight: w(WeightKind::QProj, "self_attn.q_proj.weight") },
            &[n1],
        );
        let k = node(
            &mut g,
            "k_proj",
            OpKind::Linear { weight: w(WeightKind::KProj, "self_attn.k_proj.weight") },
            &[n1],
        );
        let v = node(
            &mut g,
            "v_proj",
            OpKind::Linear { weight: w(WeightKind::VProj, "self_attn.v_proj.weight") },
            &[n1],
        );
        let (q, k) = match spec.attention.qk_norm {
            QkNorm::PerHeadRms { .. } => (
                node(
                    &mut g,
                    "q_norm",
                    OpKind::HeadNorm { weight: w(WeightKind::QNorm, "self_attn.q_norm.weight") },
                    &[q],
                ),
                node(
                    &mut g,
                    "k_norm",
                    OpKind::HeadNorm { weight: w(WeightKind::KNorm, "self_attn.k_norm.weight") },
                    &[k],
                ),
            ),
            // OLMoE's norms over the whole projections are the attention stage's (before
            // the view as heads); no weight to fold or fuse. Llama 4's L2 norm is never
            // planned (`plan::supported` refuses it by name before any graph is built).
            QkNorm::None | QkNorm::WholeRms { .. } | QkNorm::L2AfterRope => (q, k),
        };
        let qr = node(&mut g, "q_rope", OpKind::Rope, &[q]);
        let kr = node(&mut g, "k_rope", OpKind::Rope, &[k]);
        let attn = node(&mut g, "attn", OpKind::Attention, &[qr, kr, v]);
        let o = node(
            &mut g,
            "o_proj",
            OpKind::Linear { weight: w(WeightKind::OProj, "self_attn.o_proj.weight") },
            &[attn],
        );
        let h = node(&mut g, "attn_residual", OpKind::Residual, &[x, o]);
        let n2 = node(
            &mut g,
            "post_attention_layernorm",
            OpKind::RmsNorm {
                weight: w(WeightKind::PostAttentionNorm, "post_attention_layernorm.weight"),
            },
            &[h],
        );
        let ffn = match &layer.ffn {
            FfnKind::Moe(m) => {
                let (gate_w, prefix, names) = if mixtral {
                    (
                        "block_sparse_moe.gate.weight",
                        "block_sparse_moe.experts.{e}",
                        ["w1", "w3", "w2"],
                    )
                } else if spec.family == Family::GptOss {
                    ("mlp.router.weight", "mlp.experts", ["", "", ""])
                } else {
                    ("mlp.gate.weight", "mlp.experts.{e}", ["gate_proj", "up_proj", "down_proj"])
                };
                let logits = node(
                    &mut g,
                    "router",
                    OpKind::Linear { weight: w(WeightKind::Router, gate_w) },
                    &[n2],
                );
                let topk = node(&mut g, "topk", OpKind::TopK { k: m.top_k }, &[logits]);
                let ew =
                    |kind: WeightKind, n: &str| Weight::new(kind, format!("{prefix}.{n}.weight"));
                let experts = match spec.family {
                    // gpt-oss's fused tensors (`x @ W`): expert e's `[out, in]` views.
                    Family::GptOss => OpKind::Experts {
                        gate: Weight::new(
                            WeightKind::ExpertGate,
                            "mlp.experts.gate_up_proj[{e},:,0::2]^T",
                        ),
                        up: Weight::new(
                            WeightKind::ExpertUp,
                            "mlp.experts.gate_up_proj[{e},:,1::2]^T",
                        ),
                        down: Weight::new(WeightKind::ExpertDown, "mlp.experts.down_proj[{e}]^T"),
                    },
                    _ => OpKind::Experts {
                        gate: ew(WeightKind::ExpertGate, names[0]),
                        up: ew(WeightKind::ExpertUp, names[1]),
                        down: ew(WeightKind::ExpertDown, names[2]),
                    },
                };
                node(&mut g, "experts", experts, &[n2, topk])
            }
            FfnKind::Dense { .. } => {
                let gt = node(
                    &mut g,
                    "gate_proj",
                    OpKind::Linear { weight: w(WeightKind::MlpGate, "mlp.gate_proj.weight") },
                    &[n2],
                );
                let up = node(
                    &mut g,
                    "up_proj",
                    OpKind::Linear { weight: w(WeightKind::MlpUp, "mlp.up_proj.weight") },
                    &[n2],
                );
                let act = node(&mut g, "silu_mul", OpKind::SiluMul, &[gt, up]);
                node(
                    &mut g,
                    "down_proj",
                    OpKind::Linear { weight: w(WeightKind::MlpDown, "mlp.down_proj.weight") },
                    &[act],
                )
            }
        };
        let out = node(&mut g, "ffn_residual", OpKind::Residual, &[h, ffn]);
        LayerGraph { graph: g, output: out, kind: LayerKind::of(layer) }
    }

    /// Ops in a topological order (petgraph's `toposort`; the graph is a DAG by construction).
    pub fn topo_order(&self) -> Vec<NodeIndex> {
        petgraph::algo::toposort(&self.graph, None).unwrap_or_default()
    }

    /// The producers of `n`, in operand order.
    pub fn inputs(&self, n: NodeIndex) -> Vec<NodeIndex> {
        let mut e: Vec<(usize, NodeIndex)> = self
            .graph
            .edges_directed(n, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        e.sort();
        e.into_iter().map(|(_, s)| s).collect()
    }

    /// The graph as one s-expression for [`crate::rewrite`], shared subterms written once
    /// per use (egg hash-conses them back into one e-class). The root is `(layer OUT)`.
    pub fn to_expr(&self) -> String {
        fn go(g: &LayerGraph, n: NodeIndex) -> String {
            let op = &g.graph[n];
            let ins: Vec<String> = g.inputs(n).into_iter().map(|i| go(g, i)).collect();
            let w = |s: &Weight| format!("w:{}", s.name);
            match &op.kind {
                OpKind::Input => "x".to_string(),
                OpKind::RmsNorm { weight } => format!("(rmsnorm {} {})", ins[0], w(weight)),
                OpKind::Linear { weight } => format!("(matmul {} {})", ins[0], w(weight)),
                OpKind::HeadNorm { weight } => format!("(headnorm {} {})", ins[0], w(weight)),
                OpKind::Rope => format!("(rope {})", ins[0]),
                OpKind::Attention => format!("(attn {} {} {})", ins[0], ins[1], ins[2]),
                OpKind::SiluMul => format!("(silu_mul {} {})", ins[0], ins[1]),
                OpKind::Residual => format!("(add {} {})", ins[0], ins[1]),
                OpKind::TopK { k } => format!("(topk {} {k})", ins[0]),
                OpKind::Experts { gate, up, down } => {
                    format!("(experts {} {} {} {} {})", ins[0], ins[1], w(gate), w(up), w(down))
                }
            }
        }
        format!("(layer {})", go(self, self.output))
    }

    /// Names of the ops, in topological order (for reports and snapshots).
    pub fn describe(&self) -> Vec<String> {
        self.topo_order()
            .into_iter()
            .map(|n| {
                let ins: Vec<String> =
                    self.inputs(n).into_iter().map(|i| self.graph[i].name.clone()).collect();
                if ins.is_empty() {
                    self.graph[n].name.clone()
                } else {
                    format!("{} <- {}", self.graph[n].name, ins.join(", "))
                }
            })
            .collect()
    }
}
