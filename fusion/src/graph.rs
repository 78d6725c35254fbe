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

use std::collections::BTreeMap;

use palladium_model::moe::Layout;
use palladium_model::spec::MlaSpec;
use palladium_model::weights::{
    ExpertNames, FfnNames, GateUpColumns, MlaQueryNames, ModelNames, QkvNames, WeightsError,
};
use palladium_model::{AttentionForm, AttentionKind, FfnKind, ModelSpec, QkNorm};
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
    /// Multi-head latent attention's (`DeepSeek`): the low-rank query (`q_a_proj`,
    /// `q_a_layernorm`, `q_b_proj`; a direct query is [`WeightKind::QProj`]), the latent and
    /// rope key's projection (`kv_a_proj_with_mqa`), the latent's norm (`kv_a_layernorm`)
    /// and its expansion to every head's key and value parts (`kv_b_proj`).
    QAProj,
    QANorm,
    QBProj,
    KvAProj,
    KvANorm,
    KvBProj,
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

/// The checkpoint's tensor names by [`WeightKind`], from the model crate's one naming of
/// them (`palladium_model::weights::ModelNames`): a layer's relative to its prefix
/// (`self_attn.q_proj.weight`; an expert's with `{e}` for the expert), the prefix with `{l}`
/// for the layer (`model.layers.{l}.`). The graph, the rewrites' report and the source maps'
/// prose name weights by it; the packer reads the same `ModelNames`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TensorNames {
    pub layer_prefix: String,
    pub embed: String,
    pub final_norm: String,
    pub lm_head: String,
    layer: BTreeMap<WeightKind, String>,
}

impl TensorNames {
    pub fn new(spec: &ModelSpec) -> Result<Self, WeightsError> {
        // Names are alike across layers of one FFN kind and across experts: name the first
        // layer of each kind with one expert (a model may have 2^16 layers of 2^24 experts).
        let mut sample = ModelSpec { layers: Vec::new(), ..spec.clone() };
        for layer in &spec.layers {
            let kind = std::mem::discriminant(&layer.ffn);
            if sample.layers.iter().all(|l| std::mem::discriminant(&l.ffn) != kind) {
                let mut layer = layer.clone();
                if let FfnKind::Moe(m) = &mut layer.ffn {
                    (m.num_experts, m.top_k) = (1, 1);
                }
                sample.layers.push(layer);
            }
        }
        let names = ModelNames::new(&sample)?;
        let mut layer = BTreeMap::new();
        for ln in &names.layers {
            let relative = |n: &str| n.strip_prefix(ln.prefix.as_str()).unwrap_or(n).to_string();
            let mut put = |kind, n: Option<&String>| {
                if let Some(n) = n {
                    layer.entry(kind).or_insert_with(|| relative(n));
                }
            };
            use WeightKind::*;
            put(InputNorm, Some(&ln.input_norm));
            put(OProj, Some(&ln.o));
            put(OBias, ln.o_bias.as_ref());
            put(PostAttentionNorm, Some(&ln.post_norm));
            put(Sinks, ln.sinks.as_ref());
            match &ln.qkv {
                QkvNames::Gqa(g) => {
                    for (kind, n) in [(QProj, &g.q), (KProj, &g.k), (VProj, &g.v)] {
                        put(kind, Some(n));
                    }
                    put(QBias, g.q_bias.as_ref());
                    put(KBias, g.k_bias.as_ref());
                    put(VBias, g.v_bias.as_ref());
                    put(QNorm, g.q_norm.as_ref());
                    put(KNorm, g.k_norm.as_ref());
                }
                // Its row blocks (`Q` = heads x head_dim rows, `KV` the kv heads'): distinct
                // names, or the rewrites would take the three matmuls for one.
                QkvNames::Fused { qkv } => {
                    for (kind, rows) in [(QProj, "0:Q"), (KProj, "Q:Q+KV"), (VProj, "Q+KV:")] {
                        put(kind, Some(&format!("{qkv}[{rows}]")));
                    }
                }
                QkvNames::Mla(m) => {
                    match &m.query {
                        MlaQueryNames::Direct { q } => put(QProj, Some(q)),
                        MlaQueryNames::LowRank { q_a, q_a_norm, q_b } => {
                            put(QAProj, Some(q_a));
                            put(QANorm, Some(q_a_norm));
                            put(QBProj, Some(q_b));
                        }
                    }
                    put(KvAProj, Some(&m.kv_a));
                    put(KvANorm, Some(&m.kv_a_norm));
                    put(KvBProj, Some(&m.kv_b));
                }
            }
            match &ln.ffn {
                FfnNames::Dense(m) => {
                    put(MlpGate, Some(&m.gate));
                    put(MlpUp, Some(&m.up));
                    put(MlpDown, Some(&m.down));
                }
                FfnNames::Moe { router, router_bias, correction_bias, experts, shared } => {
                    put(Router, Some(router));
                    put(CorrectionBias, correction_bias.as_ref());
                    put(RouterBias, router_bias.as_ref());
                    for (kind, n) in expert_names(experts) {
                        put(kind, Some(&n));
                    }
                    if let Some(sh) = shared {
                        put(SharedGate, Some(&sh.mlp.gate));
                        put(SharedUp, Some(&sh.mlp.up));
                        put(SharedDown, Some(&sh.mlp.down));
                        put(SharedExpertGate, sh.gate.as_ref());
                    }
                }
            }
        }
        let layer_prefix = match (names.layers.first(), sample.layers.first()) {
            (Some(n), Some(l)) => n.prefix.replacen(&format!(".{}.", l.index), ".{l}.", 1),
            _ => String::new(),
        };
        Ok(TensorNames {
            layer_prefix,
            embed: names.embed,
            final_norm: names.final_norm,
            lm_head: names.lm_head,
            layer,
        })
    }

    /// The name of a weight of `kind`: a layer's relative to its prefix; `None` where the
    /// model has no such weight.
    pub fn get(&self, kind: WeightKind) -> Option<&str> {
        match kind {
            WeightKind::FinalNorm => Some(&self.final_norm),
            WeightKind::LmHead => Some(&self.lm_head),
            _ => self.layer.get(&kind).map(String::as_str),
        }
    }

    /// [`Self::get`] for a weight every planned model has.
    fn of(&self, kind: WeightKind) -> String {
        self.get(kind).unwrap_or_default().to_string()
    }
}

/// A layer's expert weights and biases by kind, `{e}` for the expert: a module per expert's
/// names, or the views of fused and stacked tensors that hold an expert's `[out, in]`
/// matrix (`I` the intermediate size).
fn expert_names(experts: &ExpertNames) -> Vec<(WeightKind, String)> {
    use WeightKind::*;
    match experts {
        ExpertNames::PerExpert(m) => {
            let any = |n: &String| n.replacen("experts.0.", "experts.{e}.", 1);
            vec![
                (ExpertGate, any(&m[0].gate)),
                (ExpertUp, any(&m[0].up)),
                (ExpertDown, any(&m[0].down)),
            ]
        }
        ExpertNames::Fused(f) => {
            let (gate, up) = match f.gate_up_columns {
                GateUpColumns::Interleaved => ("0::2", "1::2"),
                GateUpColumns::Halves => (":I", "I:"),
            };
            let (gu, down) = (&f.gate_up, &f.down);
            let mut out = match f.layout {
                Layout::InOut => vec![
                    (ExpertGate, format!("{gu}[{{e}},:,{gate}]^T")),
                    (ExpertUp, format!("{gu}[{{e}},:,{up}]^T")),
                    (ExpertDown, format!("{down}[{{e}}]^T")),
                ],
                Layout::OutIn => vec![
                    (ExpertGate, format!("{gu}[{{e}},{gate}]")),
                    (ExpertUp, format!("{gu}[{{e}},{up}]")),
                    (ExpertDown, format!("{down}[{{e}}]")),
                ],
            };
            if let Some(b) = &f.gate_up_bias {
                out.push((ExpertGateBias, format!("{b}[{{e}},{gate}]")));
                out.push((ExpertUpBias, format!("{b}[{{e}},{up}]")));
            }
            if let Some(b) = &f.down_bias {
                out.push((ExpertDownBias, format!("{b}[{{e}}]")));
            }
            out
        }
        // No parentheses or spaces: the rewrites read the names as s-expression symbols.
        ExpertNames::Stacked { gate, up, down } => vec![
            (ExpertGate, format!("{gate}[{{e}}*I:{{e}}*I+I]")),
            (ExpertUp, format!("{up}[{{e}}*I:{{e}}*I+I]")),
            (ExpertDown, format!("{down}[{{e}}*I:{{e}}*I+I]^T")),
        ],
    }
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
    /// Multi-head latent attention on the query and `kv_a_proj_with_mqa`'s output: the
    /// latent normed by `kv_norm`, RoPE on the rope parts, the latent cache written in
    /// place, attention with `kv_b`'s key and value parts (absorbed for decode:
    /// `docs/deepseek.md`).
    LatentAttention { kv_norm: Weight, kv_b: Weight },
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
        // `Plan::new` names the model's tensors first, refusing a model it cannot name.
        let names = TensorNames::new(spec).expect("the model crate names every model it reads");
        let layer = &spec.layers[index];
        let mut g = StableDiGraph::new();
        let x = node(&mut g, "x", OpKind::Input, &[]);
        let w = |kind| Weight::new(kind, names.of(kind));
        let n1 = node(
            &mut g,
            "input_layernorm",
            OpKind::RmsNorm { weight: w(WeightKind::InputNorm) },
            &[x],
        );
        let attn = match spec.attention.form {
            AttentionForm::Gqa => gqa_attention(&mut g, spec, &names, n1),
            AttentionForm::Mla(mla) => latent_attention(&mut g, mla, &names, n1),
        };
        let o = node(&mut g, "o_proj", OpKind::Linear { weight: w(WeightKind::OProj) }, &[attn]);
        let h = node(&mut g, "attn_residual", OpKind::Residual, &[x, o]);
        let n2 = node(
            &mut g,
            "post_attention_layernorm",
            OpKind::RmsNorm { weight: w(WeightKind::PostAttentionNorm) },
            &[h],
        );
        let ffn = match &layer.ffn {
            FfnKind::Moe(m) => {
                let logits =
                    node(&mut g, "router", OpKind::Linear { weight: w(WeightKind::Router) }, &[n2]);
                let topk = node(&mut g, "topk", OpKind::TopK { k: m.top_k }, &[logits]);
                let experts = OpKind::Experts {
                    gate: w(WeightKind::ExpertGate),
                    up: w(WeightKind::ExpertUp),
                    down: w(WeightKind::ExpertDown),
                };
                node(&mut g, "experts", experts, &[n2, topk])
            }
            FfnKind::Dense { .. } => {
                let linear = |g: &mut StableDiGraph<OpNode, usize>, label, kind, input| {
                    node(g, label, OpKind::Linear { weight: w(kind) }, &[input])
                };
                let gt = linear(&mut g, "gate_proj", WeightKind::MlpGate, n2);
                let up = linear(&mut g, "up_proj", WeightKind::MlpUp, n2);
                let act = node(&mut g, "silu_mul", OpKind::SiluMul, &[gt, up]);
                linear(&mut g, "down_proj", WeightKind::MlpDown, act)
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
                OpKind::LatentAttention { kv_norm, kv_b } => {
                    format!("(mla_attn {} {} {} {})", ins[0], ins[1], w(kv_norm), w(kv_b))
                }
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

/// Adds op `name` of `kind` reading `inputs` (in operand order) to `g`.
fn node(
    g: &mut StableDiGraph<OpNode, usize>,
    name: &str,
    kind: OpKind,
    inputs: &[NodeIndex],
) -> NodeIndex {
    let n = g.add_node(OpNode { name: name.to_string(), kind });
    for (i, &src) in inputs.iter().enumerate() {
        g.add_edge(src, n, i);
    }
    n
}

/// Grouped-query attention on the normed input `n1`: `q_proj`, `k_proj`, `v_proj` (their
/// per-head norms), RoPE, attention over the K/V cache.
fn gqa_attention(
    g: &mut StableDiGraph<OpNode, usize>,
    spec: &ModelSpec,
    names: &TensorNames,
    n1: NodeIndex,
) -> NodeIndex {
    let w = |kind| Weight::new(kind, names.of(kind));
    let q = node(g, "q_proj", OpKind::Linear { weight: w(WeightKind::QProj) }, &[n1]);
    let k = node(g, "k_proj", OpKind::Linear { weight: w(WeightKind::KProj) }, &[n1]);
    let v = node(g, "v_proj", OpKind::Linear { weight: w(WeightKind::VProj) }, &[n1]);
    let (q, k) = match spec.attention.qk_norm {
        QkNorm::PerHeadRms { .. } => (
            node(g, "q_norm", OpKind::HeadNorm { weight: w(WeightKind::QNorm) }, &[q]),
            node(g, "k_norm", OpKind::HeadNorm { weight: w(WeightKind::KNorm) }, &[k]),
        ),
        // OLMoE's norms over the whole projections are the attention stage's (before the
        // view as heads), Hunyuan's per-head ones after RoPE too; no weight to fold or fuse.
        // Llama 4's L2 norm is never planned (`plan::supported` refuses it by name before
        // any graph is built).
        QkNorm::None
        | QkNorm::WholeRms { .. }
        | QkNorm::L2AfterRope
        | QkNorm::PerHeadRmsAfterRope { .. } => (q, k),
    };
    let qr = node(g, "q_rope", OpKind::Rope, &[q]);
    let kr = node(g, "k_rope", OpKind::Rope, &[k]);
    node(g, "attn", OpKind::Attention, &[qr, kr, v])
}

/// Multi-head latent attention on the normed input `n1`: the query (`q_proj`, or
/// `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`) and `kv_a_proj_with_mqa`, both reading
/// `n1`, into the latent attention with `kv_a_layernorm` and `kv_b_proj`.
fn latent_attention(
    g: &mut StableDiGraph<OpNode, usize>,
    mla: MlaSpec,
    names: &TensorNames,
    n1: NodeIndex,
) -> NodeIndex {
    let w = |kind| Weight::new(kind, names.of(kind));
    let linear = |g: &mut StableDiGraph<OpNode, usize>, kind, label: &str, input| {
        node(g, label, OpKind::Linear { weight: w(kind) }, &[input])
    };
    let q = match mla.q_lora_rank {
        None => linear(g, WeightKind::QProj, "q_proj", n1),
        Some(_) => {
            let q_a = linear(g, WeightKind::QAProj, "q_a_proj", n1);
            let weight = w(WeightKind::QANorm);
            let normed = node(g, "q_a_layernorm", OpKind::RmsNorm { weight }, &[q_a]);
            linear(g, WeightKind::QBProj, "q_b_proj", normed)
        }
    };
    let kv_a = linear(g, WeightKind::KvAProj, "kv_a_proj_with_mqa", n1);
    let kind =
        OpKind::LatentAttention { kv_norm: w(WeightKind::KvANorm), kv_b: w(WeightKind::KvBProj) };
    node(g, "attn", kind, &[q, kv_a])
}
