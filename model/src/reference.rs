//! A plain-Rust reference forward pass of a [`ModelSpec`] with [`Weights`]: the numerics the
//! megakernel is checked against, itself checked against Hugging Face transformers
//! (`model/tests/hf_conformance.rs`).
//!
//! One decoder layer, as `modeling_qwen3_moe.py` / `modeling_mixtral.py` /
//! `modeling_qwen2_moe.py` (transformers 4.57) compute it:
//!
//! ```text
//! h = rmsnorm(x, input_layernorm)
//! q, k, v = q_proj(h), k_proj(h), v_proj(h)            (viewed as [heads, head_dim])
//! q, k = rmsnorm_per_head(q, q_norm), rmsnorm_per_head(k, k_norm)     (Qwen3-MoE, GLM-4.5)
//!   (`OLMoE`: q, k = rmsnorm(q, q_norm), rmsnorm(k, k_norm) over the whole projections, then
//!   q, k, v clamped to [-clip_qkv, clip_qkv])
//! q, k = rope_neox(q, pos), rope_neox(k, pos)          (theta from the config; the first
//!                                                       rotary_dim of each head, the rest as is)
//! append k, v to the cache; o = softmax(q k^T * head_dim^-0.5 + causal mask) v   (GQA)
//! x = x + o_proj(o)
//! h = rmsnorm(x, post_attention_layernorm)
//! p = softmax(router(h)) in f32; top-k; / sum(top-k) when renormalised
//! x = x + sum over the k experts, in increasing expert index, of p_e * down(silu(gate(h)) * up(h))
//!       + sigmoid(shared_expert_gate(h)) * shared_expert(h)                 (Qwen2-MoE only)
//! ```
//!
//! then `logits = lm_head(rmsnorm(x, norm))` and greedy argmax (first maximum on ties, like
//! `torch.argmax`).
//!
//! DeepSeek's multi-head latent attention (`modeling_deepseek_v3.py` / `_v2.py`) replaces the
//! q/k/v lines, computed as transformers does, not absorbed (every head's key and value are
//! materialised and cached, so this checks the megakernel's absorbed form too):
//!
//! ```text
//! q = q_proj(h), or q_b_proj(rmsnorm(q_a_proj(h), q_a_layernorm))    ([heads, nope + rope])
//! latent, k_rope = split(kv_a_proj_with_mqa(h), [kv_lora_rank, qk_rope_head_dim])
//! k_nope, v = split(kv_b_proj(rmsnorm(latent, kv_a_layernorm)), per head [nope, v_head_dim])
//! q_rope, k_rope = rope(q_rope, pos), rope(k_rope, pos)   (one k_rope shared by all heads)
//! k = cat(k_nope, k_rope); q = cat(q_nope, q_rope); attention as above with the config's scale
//! ```
//!
//! The two low-rank norms take `eps` 1e-6 whatever `rms_norm_eps` says (`DeepseekV3RMSNorm`'s
//! default: the attention builds them without it). RoPE is the [`RopeStyle`] of the config
//! (DeepSeek-V3: de-interleaved then rotate-half; V2: complex pairs in f32, rounded once)
//! with YaRN's frequencies and `cos`/`sin` factor ([`crate::spec::RopeScaling::inv_freq`]).
//!
//! # Precision
//!
//! All arithmetic is `f32` (dot products accumulate in `f64` and are rounded once). With
//! [`Precision::F32`] nothing else is rounded: this is transformers' float32 model. With
//! [`Precision::Bf16`] the weights are rounded to bf16 and every activation is rounded to bf16
//! exactly where transformers' bfloat16 model materialises a bf16 tensor:
//!
//! - RMSNorm (layer norms, q/k norms, final norm): `r(w * r(x * rsqrt(mean(x^2) + eps)))`,
//!   statistics in f32 (`Qwen3MoeRMSNorm` casts to f32, casts back, then multiplies by the
//!   bf16 weight).
//! - `LayerNorm` (Phi-3.5-MoE's layer and final norms, [`NormKind::Layer`]): statistics and the
//!   affine map in f32, `r((x - mean) * rsqrt(var + eps) * w + b)`.
//! - Phi-3.5-MoE's router: [`crate::moe::sparse_mixer`] instead of the softmax top-k.
//! - every linear layer's output (bias included): `r(W x + b)`, accumulated in high precision.
//! - RoPE: `cos`, `sin` are computed in f32 and rounded to bf16, then
//!   `r(r(q * cos) + r(rotate_half(q) * sin))`.
//! - attention: scores `r(r(q . k) * scale)`; softmax in f32 over the bf16 scores, probabilities
//!   rounded; output `r(sum p v)`.
//! - router: logits rounded (linear); softmax, top-k and renormalisation in f32; the k weights
//!   rounded to bf16 (the routing and the experts below are [`crate::moe`]'s, shared with the
//!   kernels' references).
//! - experts: `gate`, `up` outputs rounded, `r(silu(gate))`, `r(silu * up)`, `down` output
//!   rounded, `r(down * weight)`, accumulated as `acc = r(acc + ...)` in increasing expert index
//!   (`index_add_` into a bf16 buffer).
//! - residual adds `r(x + y)`; logits rounded to bf16.
//!
//! A bf16 megakernel that keeps f32 accumulators and rounds at these points should agree with
//! [`Precision::Bf16`] to within a few bf16 ulps of the logits.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::moe::{self, FfnRounding, GluBias, Layout, Projection, SwiGlu, dot64};
use crate::spec::{
    Activation, AttentionForm, AttentionKind, FfnKind, MlaSpec, ModelSpec, Multipliers, NormKind,
    Positions, QkNorm, RopeScaling, RopeStyle, RouterPrecision, Routing,
};
use crate::weights::{
    ExpertNames, FfnNames, FusedExperts, GateUpColumns, MlaQueryNames, MlpNames, ModelNames,
    QkvNames, Tensor, Weights, WeightsError,
};
use palladium_array::round_bf16;

/// Where activations are rounded (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// transformers' float32 model: no rounding.
    F32,
    /// transformers' bfloat16 model: bf16 weights, activations rounded where it rounds them.
    Bf16,
}

/// Why a forward pass was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ForwardError {
    #[error("token id {id} is out of range (vocab_size {vocab})")]
    TokenOutOfRange { id: u32, vocab: u64 },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("position {pos} is past max_position_embeddings {max}")]
    TooLong { pos: usize, max: u64 },
}

/// Prompt + greedy decode output, in the `--logits-out` layout:
/// `{"generated_ids": [...], "steps": [{"logits": [...]}, ...]}`. `steps[i].logits` are the
/// logits that chose `generated_ids[i]`: step 0 follows the whole prompt, step `i` follows
/// feeding `generated_ids[i-1]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    pub generated_ids: Vec<u32>,
    pub steps: Vec<StepLogits>,
}

/// How closely two generations agree (see [`Generation::agreement`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    /// First step whose generated id differs; `None` when all compared ids match.
    pub first_id_mismatch: Option<usize>,
    /// Steps compared: the shorter of the two.
    pub steps: usize,
    /// Largest `|a - b|` over the logits of the compared steps.
    pub max_abs: f32,
    /// `max_abs` divided by the largest `|b|` logit (the scale of the expected logits).
    pub max_rel: f32,
}

impl Generation {
    /// Compares `self` with an expected generation `expected` over the steps both have. Logits
    /// are compared only up to and including the first id mismatch (after it the two runs see
    /// different tokens).
    pub fn agreement(&self, expected: &Generation) -> Agreement {
        let steps = self.steps.len().min(expected.steps.len());
        let first_id_mismatch =
            self.generated_ids.iter().zip(&expected.generated_ids).position(|(a, b)| a != b);
        let upto = first_id_mismatch.map_or(steps, |i| (i + 1).min(steps));
        let (mut max_abs, mut scale) = (0f32, 0f32);
        for (a, b) in self.steps[..upto].iter().zip(&expected.steps[..upto]) {
            for (x, y) in a.logits.iter().zip(&b.logits) {
                let d = (x - y).abs();
                max_abs = if d.is_nan() { f32::INFINITY } else { max_abs.max(d) };
                scale = scale.max(y.abs());
            }
            if a.logits.len() != b.logits.len() {
                max_abs = f32::INFINITY;
            }
        }
        Agreement {
            first_id_mismatch,
            steps,
            max_abs,
            max_rel: if scale > 0.0 { max_abs / scale } else { max_abs },
        }
    }
}

/// One decode step's logits (`vocab_size` values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLogits {
    pub logits: Vec<f32>,
}

/// Index of the first maximum (NaN never wins).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best
}

struct Mlp {
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    /// gate, up and down biases (gpt-oss's experts).
    bias: Option<[Vec<f32>; 3]>,
    activation: Activation,
}

impl Mlp {
    fn swiglu(&self) -> SwiGlu<'_> {
        SwiGlu {
            gate: projection(&self.gate),
            up: projection(&self.up),
            down: projection(&self.down),
            bias: self.bias.as_ref().map(|[gate, up, down]| GluBias { gate, up, down }),
            activation: self.activation,
        }
    }

    /// Expert `e` of fused expert tensors ([`FusedExperts`]), as `[out, in]` matrices: gate
    /// and up are `gate_up`'s even and odd columns.
    fn fused_expert(
        f: &FusedExperts,
        e: usize,
        get: &impl Fn(&str) -> Tensor,
        activation: Activation,
    ) -> Mlp {
        let (gate_up, down) = (get(&f.gate_up), get(&f.down));
        let (hidden, two_i) = match f.layout {
            Layout::InOut => (gate_up.shape[1], gate_up.shape[2]),
            Layout::OutIn => (gate_up.shape[2], gate_up.shape[1]),
        };
        let inter = two_i / 2;
        let gu = &gate_up.data[e * hidden * two_i..(e + 1) * hidden * two_i];
        // Outputs `pick(j)` of an expert's slice (`inputs x` all outputs, in `f.layout`), as
        // an `[out, in]` tensor.
        let out_in = |w: &[f32], inputs: usize, outputs: usize, pick: &dyn Fn(usize) -> usize| {
            let all = w.len() / inputs;
            let data = (0..outputs)
                .flat_map(|o| {
                    (0..inputs).map(move |i| match f.layout {
                        Layout::InOut => w[i * all + pick(o)],
                        Layout::OutIn => w[pick(o) * inputs + i],
                    })
                })
                .collect();
            Tensor { shape: vec![outputs, inputs], data }
        };
        let d = &down.data[e * inter * hidden..(e + 1) * inter * hidden];
        // The gate's and the up projection's column of output `o`.
        let (gate_col, up_col): (&dyn Fn(usize) -> usize, &dyn Fn(usize) -> usize) =
            match f.gate_up_columns {
                GateUpColumns::Interleaved => (&|o| 2 * o, &|o| 2 * o + 1),
                GateUpColumns::Halves => (&|o| o, &move |o| inter + o),
            };
        let bias = f.gate_up_bias.as_ref().zip(f.down_bias.as_ref()).map(|(gub, db)| {
            let (gub, db) = (get(gub), get(db));
            let gub = &gub.data[e * two_i..(e + 1) * two_i];
            [
                (0..inter).map(|o| gub[gate_col(o)]).collect(),
                (0..inter).map(|o| gub[up_col(o)]).collect(),
                db.data[e * hidden..(e + 1) * hidden].to_vec(),
            ]
        });
        Mlp {
            gate: out_in(gu, hidden, inter, gate_col),
            up: out_in(gu, hidden, inter, up_col),
            down: out_in(d, inter, hidden, &|o| o),
            bias,
            activation,
        }
    }
}

/// A checkpoint's `[out, in]` linear weight as a [`Projection`].
fn projection(w: &Tensor) -> Projection<'_> {
    Projection::new(&w.data, w.shape[1], w.shape[0], Layout::OutIn)
}

enum Ffn {
    Dense(Mlp),
    Moe {
        router: Tensor,
        router_bias: Option<Tensor>,
        experts: Vec<Mlp>,
        top_k: usize,
        routing: Routing,
        /// `e_score_correction_bias`, where the routing has one.
        correction_bias: Option<Tensor>,
        /// The shared expert's MLP and its sigmoid gate's `[1, hidden]` weight, if any.
        shared: Option<Box<(Mlp, Option<Tensor>)>>,
    },
}

/// The projections that make q, k and v (see [`QkvNames`]).
enum Qkv {
    Gqa {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_bias: Option<Tensor>,
        k_bias: Option<Tensor>,
        v_bias: Option<Tensor>,
        q_norm: Option<Tensor>,
        k_norm: Option<Tensor>,
    },
    Mla {
        query: MlaQuery,
        kv_a: Tensor,
        kv_a_norm: Tensor,
        kv_b: Tensor,
    },
}

enum MlaQuery {
    Direct(Tensor),
    LowRank { a: Tensor, norm: Tensor, b: Tensor },
}

/// `eps` of MLA's `q_a_layernorm` and `kv_a_layernorm`: `DeepseekV3RMSNorm`'s default, as the
/// attention builds them without the config's `rms_norm_eps`.
const MLA_NORM_EPS: f32 = 1e-6;

struct Layer {
    input_norm: Tensor,
    /// The `LayerNorms`' biases (Phi-3.5-MoE).
    input_norm_bias: Option<Tensor>,
    post_norm_bias: Option<Tensor>,
    qkv: Qkv,
    o: Tensor,
    o_bias: Option<Tensor>,
    /// gpt-oss's attention sinks, one logit per query head.
    sinks: Option<Tensor>,
    post_norm: Tensor,
    ffn: Ffn,
    /// Which cached positions this layer attends to.
    span: AttentionKind,
    /// Position encoding: RoPE, or none (with Llama 4's temperature tuning).
    positions: Positions,
}

/// The K/V cache of one sequence: per layer, `len` positions of `[kv_heads, head_dim]` keys
/// (after q/k norm and RoPE) and `[kv_heads, v_head_dim]` values (`v_head_dim` is `head_dim`
/// but for MLA, whose heads are cached expanded), in the precision of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCache {
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Layer `layer`'s keys, `[len, kv_heads, head_dim]` row-major.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.k[layer]
    }

    /// Layer `layer`'s values, `[len, kv_heads, v_head_dim]` row-major.
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.v[layer]
    }
}

/// The reference model: a [`ModelSpec`]'s forward pass over its [`Weights`].
pub struct Reference {
    precision: Precision,
    hidden: usize,
    vocab: usize,
    heads: usize,
    kv_heads: usize,
    /// Width of a query/key head.
    head_dim: usize,
    /// Width of a value head.
    v_dim: usize,
    scale: f32,
    eps: f32,
    /// The layer and final norms' form ([`NormKind`]).
    norm: NormKind,
    /// Granite's multipliers (identity elsewhere).
    multipliers: Multipliers,
    max_pos: u64,
    /// `OLMoE`: `q_norm` / `k_norm` over the whole projections, not per head.
    whole_qk_norm: bool,
    /// Llama 4: each q and k head L2-normed after RoPE, on the RoPE layers.
    l2_qk_norm: bool,
    /// Hunyuan: the per-head q/k RMS norms follow RoPE (they precede it elsewhere).
    qk_norm_after_rope: bool,
    /// `OLMoE`'s `clip_qkv`.
    clip_qkv: Option<f32>,
    /// Dimensions RoPE rotates: the first `rotary` of each head (all of them but with a
    /// `partial_rotary_factor`: GLM-4.5), the rest passed through.
    rotary: usize,
    /// RoPE inverse frequencies, `rotary / 2` of them, computed in f32 as transformers does.
    inv_freq: Vec<f32>,
    /// YaRN's factor on `cos` and `sin` (1 otherwise; `LongRoPE`'s short mscale).
    rope_factor: f32,
    /// `LongRoPE`: the inverse frequencies and factor of sequences longer than the third
    /// value (`original_max_position_embeddings`).
    long_rope: Option<(Vec<f32>, f32, u64)>,
    rope_style: RopeStyle,
    /// MLA's dimensions; `None` for grouped-query attention.
    mla: Option<MlaSpec>,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    final_norm_bias: Option<Tensor>,
    lm_head: Tensor,
    lm_head_bias: Option<Tensor>,
}

impl std::fmt::Debug for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reference")
            .field("precision", &self.precision)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl Reference {
    /// Builds the reference for `spec` from `weights` (copied; rounded to bf16 for
    /// [`Precision::Bf16`]). Fails if a tensor is missing or misshapen.
    pub fn new(
        spec: &ModelSpec,
        weights: &Weights,
        precision: Precision,
    ) -> Result<Self, WeightsError> {
        let names = ModelNames::new(spec)?;
        let layout = crate::weights::tensor_layout(spec)?;
        for ts in &layout {
            match weights.get(&ts.name) {
                None => {
                    return Err(WeightsError::Missing {
                        path: "weights".into(),
                        name: ts.name.clone(),
                        expected: ts.shape.clone(),
                    });
                }
                Some(t) if t.shape != ts.shape => {
                    return Err(WeightsError::Shape {
                        path: "weights".into(),
                        name: ts.name.clone(),
                        expected: ts.shape.clone(),
                        found: t.shape.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        let get = |n: &str| {
            let t = weights.get(n).expect("checked against the layout above");
            match precision {
                Precision::F32 => t.clone(),
                Precision::Bf16 => t.to_bf16_valued(),
            }
        };
        let opt = |n: &Option<String>| n.as_deref().map(get);
        let activation = spec.mlp.activation;
        let mlp = |m: &MlpNames| Mlp {
            gate: get(&m.gate),
            up: get(&m.up),
            down: get(&m.down),
            bias: None,
            activation,
        };
        let layers = names
            .layers
            .iter()
            .zip(&spec.layers)
            .map(|(ln, ls)| Layer {
                input_norm: get(&ln.input_norm),
                input_norm_bias: opt(&ln.input_norm_bias),
                post_norm_bias: opt(&ln.post_norm_bias),
                qkv: match &ln.qkv {
                    QkvNames::Gqa(g) => Qkv::Gqa {
                        q: get(&g.q),
                        k: get(&g.k),
                        v: get(&g.v),
                        q_bias: opt(&g.q_bias),
                        k_bias: opt(&g.k_bias),
                        v_bias: opt(&g.v_bias),
                        q_norm: opt(&g.q_norm),
                        k_norm: opt(&g.k_norm),
                    },
                    // DBRX's `Wqkv`: q, k and v are its row blocks, in that order.
                    QkvNames::Fused { qkv } => {
                        let w = get(qkv);
                        let a = &spec.attention;
                        let (q, kv) = (
                            (a.num_heads * a.head_dim) as usize,
                            (a.num_kv_heads * a.head_dim) as usize,
                        );
                        Qkv::Gqa {
                            q: w.rows(0..q),
                            k: w.rows(q..q + kv),
                            v: w.rows(q + kv..q + 2 * kv),
                            q_bias: None,
                            k_bias: None,
                            v_bias: None,
                            q_norm: None,
                            k_norm: None,
                        }
                    }
                    QkvNames::Mla(m) => Qkv::Mla {
                        query: match &m.query {
                            MlaQueryNames::Direct { q } => MlaQuery::Direct(get(q)),
                            MlaQueryNames::LowRank { q_a, q_a_norm, q_b } => {
                                MlaQuery::LowRank { a: get(q_a), norm: get(q_a_norm), b: get(q_b) }
                            }
                        },
                        kv_a: get(&m.kv_a),
                        kv_a_norm: get(&m.kv_a_norm),
                        kv_b: get(&m.kv_b),
                    },
                },
                o: get(&ln.o),
                o_bias: opt(&ln.o_bias),
                sinks: opt(&ln.sinks),
                post_norm: get(&ln.post_norm),
                ffn: match (&ln.ffn, &ls.ffn) {
                    (FfnNames::Dense(m), _) => Ffn::Dense(mlp(m)),
                    (
                        FfnNames::Moe { router, router_bias, correction_bias, experts, shared },
                        FfnKind::Moe(moe),
                    ) => Ffn::Moe {
                        router: get(router),
                        router_bias: opt(router_bias),
                        experts: match experts {
                            ExpertNames::PerExpert(m) => m.iter().map(mlp).collect(),
                            ExpertNames::Fused(f) => (0..moe.num_experts as usize)
                                .map(|e| Mlp::fused_expert(f, e, &get, activation))
                                .collect(),
                            ExpertNames::Stacked { gate, up, down } => {
                                let (gate, up, down) = (get(gate), get(up), get(down));
                                let inter = moe.intermediate as usize;
                                (0..moe.num_experts as usize)
                                    .map(|e| {
                                        let rows = e * inter..(e + 1) * inter;
                                        Mlp {
                                            gate: gate.rows(rows.clone()),
                                            up: up.rows(rows.clone()),
                                            down: down.rows(rows).transposed(),
                                            bias: None,
                                            activation,
                                        }
                                    })
                                    .collect()
                            }
                        },
                        top_k: moe.top_k as usize,
                        routing: moe.routing,
                        correction_bias: opt(correction_bias),
                        shared: shared.as_ref().map(|s| Box::new((mlp(&s.mlp), opt(&s.gate)))),
                    },
                    (FfnNames::Moe { .. }, FfnKind::Dense { .. }) => {
                        unreachable!("ModelNames follows the layer's FFN kind")
                    }
                },
                span: ls.attention,
                positions: ls.positions,
            })
            .collect();
        let a = &spec.attention;
        // The short regime (any sequence, but `LongRoPE`'s past its original length).
        let (inv_freq, rope_factor) = a.rope.scaling.inv_freq(a.rope.theta, a.rope.rotary_dim, 0);
        let long_rope = match &a.rope.scaling {
            RopeScaling::LongRope(l) => {
                let past = l.original_max_position_embeddings;
                let (inv, factor) =
                    a.rope.scaling.inv_freq(a.rope.theta, a.rope.rotary_dim, past + 1);
                Some((inv, factor, past))
            }
            _ => None,
        };
        let mla = match a.form {
            AttentionForm::Gqa => None,
            AttentionForm::Mla(m) => Some(m),
        };
        let rotary = a.rope.rotary_dim as usize;
        Ok(Self {
            precision,
            hidden: spec.hidden_size as usize,
            vocab: spec.vocab_size as usize,
            heads: a.num_heads as usize,
            kv_heads: a.num_kv_heads as usize,
            head_dim: a.head_dim as usize,
            v_dim: mla.map_or(a.head_dim, |m| m.v_head_dim) as usize,
            scale: a.scale as f32,
            eps: spec.norm.eps as f32,
            norm: spec.norm.kind,
            multipliers: spec.multipliers,
            max_pos: spec.max_position_embeddings,
            whole_qk_norm: matches!(a.qk_norm, QkNorm::WholeRms { .. }),
            l2_qk_norm: a.qk_norm == QkNorm::L2AfterRope,
            qk_norm_after_rope: matches!(a.qk_norm, QkNorm::PerHeadRmsAfterRope { .. }),
            clip_qkv: a.clip_qkv.map(|c| c as f32),
            rotary,
            inv_freq,
            rope_factor,
            long_rope,
            rope_style: a.rope.style,
            mla,
            embed: get(&names.embed),
            layers,
            final_norm: get(&names.final_norm),
            final_norm_bias: opt(&names.final_norm_bias),
            lm_head: get(&names.lm_head),
            lm_head_bias: opt(&names.lm_head_bias),
        })
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> KvCache {
        KvCache {
            len: 0,
            k: vec![Vec::new(); self.layers.len()],
            v: vec![Vec::new(); self.layers.len()],
        }
    }

    /// One decode step: feeds `token` at position `cache.len()`, returns its logits.
    pub fn step(&self, cache: &mut KvCache, token: u32) -> Result<Vec<f32>, ForwardError> {
        Ok(self.step_traced(cache, token)?.0)
    }

    /// [`Self::step`], also returning the step's smallest *router margin*: over the MoE
    /// layers, the gap between the `top_k`-th and the `(top_k + 1)`-th largest router logit,
    /// relative to the largest `|router logit|` of that layer (the scale the rounding
    /// differences of another implementation are relative to; infinite without MoE layers).
    /// A small margin is a routing near tie: another
    /// implementation whose router logits differ by rounding may pick a different expert
    /// there, a discrete change that no logit tolerance covers (and that persists through the
    /// K/V written at this position).
    pub fn step_traced(
        &self,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<(Vec<f32>, f32), ForwardError> {
        let mut margin = f32::INFINITY;
        let mut out =
            self.forward_traced(&[(0, token)], std::slice::from_mut(cache), &mut margin)?;
        Ok((out.pop().expect("one row in, one row out"), margin))
    }

    /// Feeds a whole block of tokens to one sequence in a single pass (every token attends to
    /// the cache plus the block's earlier tokens: a causal mask), returning every position's
    /// logits. With an empty cache this is the no-cache full-prefix forward.
    pub fn forward_block(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let rows: Vec<(usize, u32)> = tokens.iter().map(|&t| (0, t)).collect();
        self.forward(&rows, std::slice::from_mut(cache))
    }

    /// One decode step for a batch of sequences: `tokens[i]` goes to `caches[i]`.
    pub fn step_batch(
        &self,
        caches: &mut [KvCache],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        assert_eq!(caches.len(), tokens.len(), "one token per cache");
        let rows: Vec<(usize, u32)> = tokens.iter().copied().enumerate().collect();
        self.forward(&rows, caches)
    }

    /// Prompt (fed token by token through the cache) then `steps` greedy decode steps.
    pub fn generate(&self, prompt: &[u32], steps: usize) -> Result<Generation, ForwardError> {
        self.decode(prompt, steps, |_, greedy| greedy)
    }

    /// Teacher forcing: the prompt, then `forced` fed one by one whatever the logits say.
    /// `steps[i].logits` are the logits before `forced[i]` is fed (as in [`Self::generate`]);
    /// `generated_ids[i]` is their argmax, the token greedy decoding would have picked. Used to
    /// compare logits with another implementation at every step without one near-tie flip
    /// sending the two runs down different token paths.
    pub fn teacher_force(
        &self,
        prompt: &[u32],
        forced: &[u32],
    ) -> Result<Generation, ForwardError> {
        self.decode(prompt, forced.len(), |s, _| forced[s])
    }

    /// The prompt, then `steps` steps: each records the logits and their argmax, then feeds
    /// `feed(step, argmax)` (the argmax itself for greedy decoding).
    fn decode(
        &self,
        prompt: &[u32],
        steps: usize,
        feed: impl Fn(usize, u32) -> u32,
    ) -> Result<Generation, ForwardError> {
        let (last, first) = prompt.split_last().ok_or(ForwardError::EmptyPrompt)?;
        let mut cache = self.new_cache();
        for &t in first {
            self.step(&mut cache, t)?;
        }
        let mut logits = self.step(&mut cache, *last)?;
        let mut out = Generation {
            generated_ids: Vec::with_capacity(steps),
            steps: Vec::with_capacity(steps),
        };
        for s in 0..steps {
            let greedy = argmax(&logits) as u32;
            out.generated_ids.push(greedy);
            let next =
                if s + 1 < steps { Some(self.step(&mut cache, feed(s, greedy))?) } else { None };
            out.steps.push(StepLogits { logits: std::mem::take(&mut logits) });
            if let Some(n) = next {
                logits = n;
            }
        }
        Ok(out)
    }

    /// Several prompts at once: each prompt is fed as one block ([`Self::forward_block`]),
    /// then all sequences decode together ([`Self::step_batch`]).
    pub fn generate_batch(
        &self,
        prompts: &[&[u32]],
        steps: usize,
    ) -> Result<Vec<Generation>, ForwardError> {
        let mut caches: Vec<KvCache> = prompts.iter().map(|_| self.new_cache()).collect();
        let mut logits = Vec::with_capacity(prompts.len());
        for (p, c) in prompts.iter().zip(&mut caches) {
            let block = self.forward_block(c, p)?;
            logits.push(block.into_iter().last().ok_or(ForwardError::EmptyPrompt)?);
        }
        let mut outs: Vec<Generation> = prompts
            .iter()
            .map(|_| Generation { generated_ids: Vec::new(), steps: Vec::new() })
            .collect();
        for s in 0..steps {
            let ids: Vec<u32> = logits.iter().map(|l| argmax(l) as u32).collect();
            let next = if s + 1 < steps { Some(self.step_batch(&mut caches, &ids)?) } else { None };
            for ((o, id), l) in outs.iter_mut().zip(&ids).zip(std::mem::take(&mut logits)) {
                o.generated_ids.push(*id);
                o.steps.push(StepLogits { logits: l });
            }
            if let Some(n) = next {
                logits = n;
            }
        }
        Ok(outs)
    }

    #[inline]
    fn r(&self, x: f32) -> f32 {
        match self.precision {
            Precision::F32 => x,
            Precision::Bf16 => round_bf16(x),
        }
    }

    /// `y = r(W x + b)` for `W: [out, in]`.
    fn linear(&self, w: &Tensor, b: Option<&Tensor>, x: &[f32]) -> Vec<f32> {
        let y = projection(w).apply(x, b.map(|b| &b.data[..]));
        y.into_iter().map(|v| self.r(v)).collect()
    }

    /// Where the FFNs round: where transformers' model of this precision does.
    fn ffn_rounding(&self) -> FfnRounding {
        match self.precision {
            Precision::F32 => FfnRounding::None,
            Precision::Bf16 => FfnRounding::Transformers,
        }
    }

    /// RMSNorm of `x` in place: `r(w * r(x * rsqrt(mean(x^2) + eps)))`, the config's `eps`.
    fn rmsnorm(&self, x: &mut [f32], w: &Tensor) {
        self.rmsnorm_eps(x, w, self.eps);
    }

    /// [`Self::rmsnorm`] with another `eps`.
    fn rmsnorm_eps(&self, x: &mut [f32], w: &Tensor, eps: f32) {
        let ms =
            (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64) as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, &g) in x.iter_mut().zip(&w.data) {
            let normed = *v * inv;
            let f32_weight = self.norm == NormKind::RmsF32Weight;
            *v = self.r(g * if f32_weight { normed } else { self.r(normed) });
        }
    }

    /// A layer or final norm in place: the model's [`NormKind`]; `b` is a `LayerNorm`'s bias.
    fn norm(&self, x: &mut [f32], w: &Tensor, b: Option<&Tensor>) {
        match self.norm {
            NormKind::Rms | NormKind::RmsF32Weight => self.rmsnorm(x, w),
            NormKind::Layer { .. } => {
                // `nn.LayerNorm`: statistics and affine map in f32 (the biased variance),
                // rounded once.
                let n = x.len() as f64;
                let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
                let var = (x.iter().map(|&v| f64::from(v - mean).powi(2)).sum::<f64>() / n) as f32;
                let rstd = 1.0 / (var + self.eps).sqrt();
                for (i, v) in x.iter_mut().enumerate() {
                    let bias = b.map_or(0.0, |b| b.data[i]);
                    *v = self.r((*v - mean) * rstd * w.data[i] + bias);
                }
            }
        }
    }

    /// A residual branch's output as it is added: times Granite's `residual_multiplier`,
    /// rounded (as is, elsewhere).
    fn residual_branch(&self, y: f32) -> f32 {
        match self.multipliers.residual {
            1.0 => y,
            m => self.r(y * m as f32),
        }
    }

    /// `Llama4TextL2Norm` in place: `r(x * rsqrt(mean(x^2) + eps))`, no weight.
    fn l2norm(&self, x: &mut [f32]) {
        let ms =
            (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64) as f32;
        let inv = 1.0 / (ms + self.eps).sqrt();
        x.iter_mut().for_each(|v| *v = self.r(*v * inv));
    }

    /// RoPE of one head's rotated dimensions in place, in the config's [`RopeStyle`]; `cos`
    /// and `sin` are the f32 tables (YaRN's factor included), rounded here where transformers
    /// rounds them.
    fn rope(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        match self.rope_style {
            RopeStyle::NeoxRotateHalf => self.rope_neox(x, cos, sin),
            RopeStyle::DeinterleaveRotateHalf => {
                // `view(d/2, 2).transpose(-1, -2).reshape(d)`: evens, then odds.
                let d = x.to_vec();
                let half = d.len() / 2;
                for i in 0..half {
                    x[i] = d[2 * i];
                    x[i + half] = d[2 * i + 1];
                }
                self.rope_neox(x, cos, sin);
            }
            RopeStyle::ComplexPairs => {
                // `view_as_complex(x.float()) * polar(1, f) * factor`, cast back once.
                for (i, pair) in x.chunks_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = self.r(a * cos[i] - b * sin[i]);
                    pair[1] = self.r(a * sin[i] + b * cos[i]);
                }
            }
        }
    }

    /// `NeoX` RoPE of one head in place, `cos`/`sin` rounded as the activations.
    fn rope_neox(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let (cos, sin): (Vec<f32>, Vec<f32>) =
            cos.iter().zip(sin).map(|(&c, &s)| (self.r(c), self.r(s))).unzip();
        let half = x.len() / 2;
        for i in 0..half {
            let (a, b) = (x[i], x[i + half]);
            // rotate_half(x) = cat(-x2, x1)
            x[i] = self.r(self.r(a * cos[i]) + self.r(-b * sin[i]));
            x[i + half] = self.r(self.r(b * cos[i]) + self.r(a * sin[i]));
        }
    }

    /// The FFN of one row: a dense MLP, or the routed experts ([`moe`]'s math). Lowers
    /// `margin` to the routing's margin (see [`Self::step_traced`]).
    fn ffn(&self, ffn: &Ffn, x: &[f32], margin: &mut f32) -> Vec<f32> {
        match ffn {
            Ffn::Dense(m) => moe::swiglu(&m.swiglu(), x, self.ffn_rounding()),
            Ffn::Moe { router, router_bias, experts, top_k, routing, correction_bias, shared } => {
                let f32_router = routing.precision != RouterPrecision::Activations;
                // An f32 router's logits are not rounded to the activations' dtype.
                let logits = match f32_router {
                    true => projection(router).apply(x, router_bias.as_ref().map(|b| &b.data[..])),
                    false => self.linear(router, router_bias.as_ref(), x),
                };
                let choice = moe::Choice {
                    correction_bias: correction_bias.as_ref().map(|b| &b.data[..]),
                    groups: routing.groups,
                    scaling: routing.scaling as f32,
                };
                let route = match routing.sparse_mixer {
                    Some(m) => moe::sparse_mixer(&logits, m.jitter_eps, |v| self.r(v)),
                    None => moe::route_with(
                        &logits,
                        *top_k,
                        routing.scoring,
                        routing.top_k_weights,
                        &choice,
                    ),
                };
                *margin = margin.min(route.margin);
                let expert = |e: usize| experts[e].swiglu();
                let rounding = match (self.precision, routing.precision) {
                    (Precision::Bf16, RouterPrecision::F32) => FfnRounding::TransformersF32Sum,
                    _ => self.ffn_rounding(),
                };
                let mut out = moe::moe_ffn_weighted(
                    x,
                    self.hidden,
                    &route.chosen,
                    expert,
                    rounding,
                    routing.weighting,
                );
                if let Some((mlp, gate)) = shared.as_deref() {
                    let shared =
                        moe::Shared { mlp: mlp.swiglu(), gate: gate.as_ref().map(projection) };
                    moe::add_shared(&mut out, &shared, x, rounding);
                }
                out
            }
        }
    }

    /// One row's query `[heads, head_dim]`, key `[kv_heads, head_dim]` and value
    /// `[kv_heads, v_dim]` from its normed hidden state `hn`, after q/k norm and RoPE.
    /// `rope`: whether the layer rotates (Llama 4's `NoPE` layers do not).
    fn qkv(
        &self,
        qkv: &Qkv,
        hn: &[f32],
        (cos, sin): &(Vec<f32>, Vec<f32>),
        rope: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let hd = self.head_dim;
        match qkv {
            Qkv::Gqa { q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm } => {
                let mut q = self.linear(q, q_bias.as_ref(), hn);
                let mut k = self.linear(k, k_bias.as_ref(), hn);
                let mut v = self.linear(v, v_bias.as_ref(), hn);
                if self.whole_qk_norm {
                    self.rmsnorm(&mut q, q_norm.as_ref().expect("OLMoE has q_norm"));
                    self.rmsnorm(&mut k, k_norm.as_ref().expect("OLMoE has k_norm"));
                }
                if let Some(c) = self.clip_qkv {
                    for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                        *x = x.clamp(-c, c);
                    }
                }
                let per_head = !self.whole_qk_norm;
                for (x, norm) in [(&mut q, q_norm), (&mut k, k_norm)] {
                    let per_head_norm = norm.as_ref().filter(|_| per_head);
                    for head in x.chunks_mut(hd) {
                        if let (false, Some(n)) = (self.qk_norm_after_rope, per_head_norm) {
                            self.rmsnorm(head, n);
                        }
                        if rope {
                            self.rope(&mut head[..self.rotary], cos, sin);
                            if self.l2_qk_norm {
                                self.l2norm(head);
                            }
                        }
                        if let (true, Some(n)) = (self.qk_norm_after_rope, per_head_norm) {
                            self.rmsnorm(head, n);
                        }
                    }
                }
                (q, k, v)
            }
            Qkv::Mla { query, kv_a, kv_a_norm, kv_b } => {
                let m = self.mla.expect("an MLA layer has MLA dimensions");
                let (nope, lora) = (m.qk_nope_head_dim as usize, m.kv_lora_rank as usize);
                let vd = self.v_dim;
                let mut q = match query {
                    MlaQuery::Direct(w) => self.linear(w, None, hn),
                    MlaQuery::LowRank { a, norm, b } => {
                        let mut qa = self.linear(a, None, hn);
                        self.rmsnorm_eps(&mut qa, norm, MLA_NORM_EPS);
                        self.linear(b, None, &qa)
                    }
                };
                for head in q.chunks_mut(hd) {
                    self.rope(&mut head[nope..], cos, sin);
                }
                let mut compressed = self.linear(kv_a, None, hn);
                let (latent, k_rope) = compressed.split_at_mut(lora);
                self.rmsnorm_eps(latent, kv_a_norm, MLA_NORM_EPS);
                self.rope(k_rope, cos, sin);
                let kv = self.linear(kv_b, None, latent);
                let mut k = Vec::with_capacity(self.kv_heads * hd);
                let mut v = Vec::with_capacity(self.kv_heads * vd);
                for head in kv.chunks(nope + vd) {
                    k.extend_from_slice(&head[..nope]);
                    k.extend_from_slice(k_rope);
                    v.extend_from_slice(&head[nope..]);
                }
                (q, k, v)
            }
        }
    }

    /// The forward pass over `rows`: `(cache index, token)`, each row at the next position of
    /// its sequence, rows of one sequence in order. Returns each row's logits.
    fn forward(
        &self,
        rows: &[(usize, u32)],
        caches: &mut [KvCache],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let mut margin = f32::INFINITY;
        self.forward_traced(rows, caches, &mut margin)
    }

    /// [`Self::forward`]; `margin` is lowered to the smallest router margin seen (see
    /// [`Self::step_traced`]).
    fn forward_traced(
        &self,
        rows: &[(usize, u32)],
        caches: &mut [KvCache],
        margin: &mut f32,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let (h, hd, vd, nh, nkv) =
            (self.hidden, self.head_dim, self.v_dim, self.heads, self.kv_heads);
        let group = nh / nkv;
        // Positions.
        let mut next: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut pos = Vec::with_capacity(rows.len());
        for &(c, t) in rows {
            if t as usize >= self.vocab {
                return Err(ForwardError::TokenOutOfRange { id: t, vocab: self.vocab as u64 });
            }
            if next[c] as u64 >= self.max_pos {
                return Err(ForwardError::TooLong { pos: next[c], max: self.max_pos });
            }
            pos.push(next[c]);
            next[c] += 1;
        }
        // RoPE tables per row: f32 `cos(pos * inv_freq) * factor` ([`Self::rope`] rounds).
        // `LongRoPE` picks its factors by the sequence's length after this call (transformers'
        // `seq_len = cache_position[-1] + 1`).
        let tables: Vec<(Vec<f32>, Vec<f32>)> = pos
            .iter()
            .zip(rows)
            .map(|(&p, &(c, _))| {
                let (inv_freq, factor) = match &self.long_rope {
                    Some((inv, factor, original)) if next[c] as u64 > *original => (inv, *factor),
                    _ => (&self.inv_freq, self.rope_factor),
                };
                let f: Vec<f32> = inv_freq.iter().map(|&w| w * p as f32).collect();
                (
                    f.iter().map(|&x| x.cos() * factor).collect(),
                    f.iter().map(|&x| x.sin() * factor).collect(),
                )
            })
            .collect();
        let mut xs: Vec<Vec<f32>> = rows
            .iter()
            .map(|&(_, t)| {
                let row = &self.embed.data[t as usize * h..(t as usize + 1) * h];
                match self.multipliers.embedding {
                    1.0 => row.to_vec(),
                    m => row.iter().map(|&v| self.r(v * m as f32)).collect(),
                }
            })
            .collect();
        for (li, layer) in self.layers.iter().enumerate() {
            // q/k/v, q/k norm, RoPE; append k/v to the caches in row order.
            let mut qs = Vec::with_capacity(rows.len());
            for (r, &(c, _)) in rows.iter().enumerate() {
                let mut hn = xs[r].clone();
                self.norm(&mut hn, &layer.input_norm, layer.input_norm_bias.as_ref());
                let rope = layer.positions.is_rope();
                let (mut q, k, v) = self.qkv(&layer.qkv, &hn, &tables[r], rope);
                if let Positions::NoPe { temperature: Some(t) } = layer.positions {
                    // `log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1` in f32; the
                    // product rounded once.
                    let steps = ((pos[r] as f32 + 1.0) / t.floor_scale as f32).floor();
                    let scale = steps.ln_1p() * t.attn_scale as f32 + 1.0;
                    q.iter_mut().for_each(|x| *x = self.r(*x * scale));
                }
                debug_assert_eq!(caches[c].k[li].len(), pos[r] * nkv * hd);
                caches[c].k[li].extend_from_slice(&k);
                caches[c].v[li].extend_from_slice(&v);
                qs.push(q);
            }
            for (r, &(c, _)) in rows.iter().enumerate() {
                // Causal (sliding-window, chunked) attention over the cache, GQA.
                let p = pos[r];
                let start = match layer.span {
                    AttentionKind::Full => 0,
                    AttentionKind::Sliding { window } => (p + 1).saturating_sub(window as usize),
                    AttentionKind::Chunked { chunk } => p / chunk as usize * chunk as usize,
                };
                let (keys, vals) = (&caches[c].k[li], &caches[c].v[li]);
                let mut o = vec![0f32; nh * vd];
                for head in 0..nh {
                    let g = head / group;
                    let q = &qs[r][head * hd..(head + 1) * hd];
                    let scores: Vec<f32> = (start..=p)
                        .map(|j| {
                            let kj = &keys[(j * nkv + g) * hd..(j * nkv + g + 1) * hd];
                            self.r(self.r(dot64(q, kj) as f32) * self.scale)
                        })
                        .collect();
                    let sink = layer.sinks.as_ref().map(|s| s.data[head]);
                    let mx = scores.iter().copied().chain(sink).fold(f32::NEG_INFINITY, f32::max);
                    // With sinks transformers subtracts the max in the activations' dtype
                    // (`combined_logits - max`, rounded) before its softmax; without, the f32
                    // softmax subtracts it unrounded.
                    let shifted = |s: f32| if sink.is_some() { self.r(s - mx) } else { s - mx };
                    let e: Vec<f32> = scores.iter().map(|&s| shifted(s).exp()).collect();
                    let sum: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |s| shifted(s).exp());
                    let probs: Vec<f32> = e.iter().map(|&v| self.r(v / sum)).collect();
                    for d in 0..vd {
                        let acc: f64 = (start..=p)
                            .zip(&probs)
                            .map(|(j, &pj)| f64::from(pj) * f64::from(vals[(j * nkv + g) * vd + d]))
                            .sum();
                        o[head * vd + d] = self.r(acc as f32);
                    }
                }
                let attn = self.linear(&layer.o, layer.o_bias.as_ref(), &o);
                let x = &mut xs[r];
                for (x, a) in x.iter_mut().zip(attn) {
                    *x = self.r(*x + self.residual_branch(a));
                }
                let mut hn = x.clone();
                self.norm(&mut hn, &layer.post_norm, layer.post_norm_bias.as_ref());
                let f = self.ffn(&layer.ffn, &hn, margin);
                for (x, f) in x.iter_mut().zip(f) {
                    *x = self.r(*x + self.residual_branch(f));
                }
            }
        }
        for (c, n) in caches.iter_mut().zip(next) {
            c.len = n;
        }
        Ok(xs
            .into_iter()
            .map(|mut x| {
                self.norm(&mut x, &self.final_norm, self.final_norm_bias.as_ref());
                let logits = self.linear(&self.lm_head, self.lm_head_bias.as_ref(), &x);
                match self.multipliers.logits_divisor {
                    1.0 => logits,
                    d => logits.into_iter().map(|l| self.r(l / d as f32)).collect(),
                }
            })
            .collect())
    }
}
