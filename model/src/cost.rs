//! Derived sizes: parameter counts, weight bytes, KV-cache bytes and the HBM bytes one decode
//! step streams. All counts are exact integers from the shapes in the modeling code; only the
//! expected number of distinct experts a batch touches is a float (see
//! [`expected_distinct_experts`]).

use serde::Serialize;

use crate::spec::{
    AttentionForm, FfnKind, LayerSpec, LmHead, ModelSpec, NormKind, QkNorm, SharedExpert,
};

/// Saturating sum. Counts of a parsed model are far below `u64::MAX` (sizes are capped at
/// 2^24 when parsing); saturation only keeps hand-built absurd specs from panicking.
fn sum(xs: &[u64]) -> u64 {
    xs.iter().fold(0u64, |a, &x| a.saturating_add(x))
}

/// `u128` → `u64`, saturating.
fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Parameters of one decoder layer (or the sum over layers), split the way the planner
/// schedules them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LayerParams {
    /// `q_proj`, `k_proj`, `v_proj`, `o_proj` weights and their biases if any (MLA:
    /// `q_proj` or `q_a_proj` + `q_b_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, `o_proj`).
    pub attention: u64,
    /// `input_layernorm` + `post_attention_layernorm` (`2 * hidden`) plus `q_norm` + `k_norm`
    /// (`2 * head_dim`) where the family has them (MLA: `q_a_layernorm`, `kv_a_layernorm`).
    pub norms: u64,
    /// The router `gate` (`hidden * num_experts`); 0 for dense layers.
    pub router: u64,
    /// All routed experts (`num_experts * 3 * hidden * moe_intermediate`).
    pub experts_total: u64,
    /// The `top_k` experts one token runs (`top_k * 3 * hidden * moe_intermediate`).
    pub experts_active: u64,
    /// Shared expert(s) and their gate; always active.
    pub shared_expert: u64,
    /// The dense MLP of a non-MoE layer (`3 * hidden * intermediate`).
    pub dense_mlp: u64,
}

impl LayerParams {
    /// Every parameter stored for the layer.
    pub fn total(&self) -> u64 {
        sum(&[
            self.attention,
            self.norms,
            self.router,
            self.experts_total,
            self.shared_expert,
            self.dense_mlp,
        ])
    }

    /// Parameters one token multiplies with: [`Self::total`] with only `top_k` routed experts.
    pub fn active(&self) -> u64 {
        sum(&[
            self.attention,
            self.norms,
            self.router,
            self.experts_active,
            self.shared_expert,
            self.dense_mlp,
        ])
    }

    fn add(self, o: Self) -> Self {
        Self {
            attention: self.attention.saturating_add(o.attention),
            norms: self.norms.saturating_add(o.norms),
            router: self.router.saturating_add(o.router),
            experts_total: self.experts_total.saturating_add(o.experts_total),
            experts_active: self.experts_active.saturating_add(o.experts_active),
            shared_expert: self.shared_expert.saturating_add(o.shared_expert),
            dense_mlp: self.dense_mlp.saturating_add(o.dense_mlp),
        }
    }
}

/// Parameters of the whole model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelParams {
    /// Sum over all decoder layers.
    pub layers: LayerParams,
    /// `embed_tokens` (`vocab * hidden`).
    pub embedding: u64,
    /// `lm_head` (`vocab * hidden`, plus `vocab` with a bias), 0 when tied to the embedding.
    pub lm_head: u64,
    /// The final `norm` (`hidden`; twice that for a `LayerNorm` with bias).
    pub final_norm: u64,
}

impl ModelParams {
    /// Every stored parameter (the figure model cards quote as "total").
    pub fn total(&self) -> u64 {
        sum(&[self.layers.total(), self.embedding, self.lm_head, self.final_norm])
    }

    /// Active parameters per token, as model cards count them ("A3B"): the layers with `top_k`
    /// experts, plus the whole embedding and `lm_head` matrices. (What a decode step actually
    /// reads is [`DecodeTraffic`]: only one embedding row per token.)
    pub fn active(&self) -> u64 {
        sum(&[self.layers.active(), self.embedding, self.lm_head, self.final_norm])
    }

    /// [`Self::active`] without the embedding matrix (of which a token reads one row).
    pub fn active_without_embedding(&self) -> u64 {
        self.active().saturating_sub(self.embedding)
    }
}

/// Expected number of distinct experts a batch of `batch` tokens selects in one layer, when each
/// token picks `top_k` of `num_experts` experts uniformly at random and tokens are independent:
/// `E * (1 - (1 - k/E)^B)`. (Each expert is in a token's top-k with probability `k/E`.) Real
/// routers are not uniform, and correlated tokens touch fewer experts, so this is a planning
/// estimate, exact only for `batch <= 1` (`= k`) and for `k == E`.
pub fn expected_distinct_experts(num_experts: u64, top_k: u64, batch: u64) -> f64 {
    if num_experts == 0 || batch == 0 {
        return 0.0;
    }
    let e = num_experts as f64;
    let miss = 1.0 - top_k as f64 / e;
    e * (1.0 - miss.powi(batch.min(i32::MAX as u64) as i32))
}

/// HBM traffic of one decode step, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodeTraffic {
    pub batch: u64,
    /// Cached positions each sequence attends over (its own new position included).
    pub context: u64,
    /// Attention, norm, router, dense-MLP and shared-expert weights of all layers, final norm.
    pub dense_weights: u64,
    /// Routed expert weights: the expected distinct experts per layer times one expert's bytes.
    pub expert_weights: f64,
    /// `lm_head` (the embedding matrix when tied).
    pub lm_head: u64,
    /// One embedding row per sequence.
    pub embedding_rows: u64,
    /// K and V read from the cache: per layer `min(context, window)` positions per sequence.
    pub kv_read: u64,
    /// The new position's K and V written per layer and sequence.
    pub kv_write: u64,
}

impl DecodeTraffic {
    /// All weight bytes read.
    pub fn weights(&self) -> f64 {
        // In f64: each count may have saturated at `u64::MAX`.
        self.dense_weights as f64
            + self.lm_head as f64
            + self.embedding_rows as f64
            + self.expert_weights
    }

    /// Everything the step moves to or from HBM (activations, a few KiB, are left out).
    pub fn total(&self) -> f64 {
        self.weights() + self.kv_read as f64 + self.kv_write as f64
    }
}

impl ModelSpec {
    /// Parameters of one layer.
    pub fn layer_params(&self, layer: &LayerSpec) -> LayerParams {
        // In u128: a product of four parsed sizes (each <= 2^24) always fits.
        let h = u128::from(self.hidden_size);
        let a = &self.attention;
        let q = u128::from(a.num_heads) * u128::from(a.head_dim);
        let kv = u128::from(a.num_kv_heads) * u128::from(a.head_dim);
        let qkv_bias = if a.qkv_bias { q + 2 * kv } else { 0 };
        let o_bias = if a.o_bias { h } else { 0 };
        let qk_norm = match a.qk_norm {
            QkNorm::None | QkNorm::L2AfterRope => 0,
            QkNorm::PerHeadRms { weight_len } | QkNorm::PerHeadRmsAfterRope { weight_len } => {
                2 * u128::from(weight_len)
            }
            QkNorm::WholeRms { q_len, k_len } => u128::from(q_len) + u128::from(k_len),
        };
        // gpt-oss's experts have biases: 2 * inter on gate/up, hidden on down.
        let mlp_bias = |inter: u64| if self.mlp.bias { 2 * u128::from(inter) + h } else { 0 };
        let mlp = |inter: u64| 3 * h * u128::from(inter) + mlp_bias(inter);
        let sinks = if a.sinks { u128::from(a.num_heads) } else { 0 };
        let (attention, attention_norms) = match a.form {
            AttentionForm::Gqa => (h * (q + 2 * kv) + q * h + qkv_bias + o_bias + sinks, qk_norm),
            AttentionForm::Mla(m) => {
                let heads = u128::from(a.num_heads);
                let (query, q_norm) = match m.q_lora_rank {
                    None => (h * q, 0),
                    Some(r) => (u128::from(r) * (h + q), u128::from(r)),
                };
                let lora = u128::from(m.kv_lora_rank);
                let kv_a = h * (lora + u128::from(m.qk_rope_head_dim));
                let kv_b = lora * heads * u128::from(m.qk_nope_head_dim + m.v_head_dim);
                let o = heads * u128::from(m.v_head_dim) * h;
                (query + kv_a + kv_b + o, q_norm + lora)
            }
        };
        // `LayerNorms` with bias (Phi-3.5-MoE) store a bias as long as the weight.
        let norm = if self.norm.kind == (NormKind::Layer { bias: true }) { 2 * h } else { h };
        let mut p = LayerParams {
            attention: sat(attention),
            norms: sat(2 * norm + attention_norms),
            ..LayerParams::default()
        };
        match &layer.ffn {
            FfnKind::Dense { intermediate } => p.dense_mlp = sat(mlp(*intermediate)),
            FfnKind::Moe(m) => {
                let router_bias = if m.routing.router_bias { 1 } else { 0 };
                p.router = sat((h + router_bias) * u128::from(m.num_experts));
                p.experts_total = sat(u128::from(m.num_experts) * mlp(m.intermediate));
                p.experts_active = sat(u128::from(m.top_k) * mlp(m.intermediate));
                p.shared_expert =
                    m.shared.map_or(0, |SharedExpert { intermediate, sigmoid_gate }| {
                        sat(mlp(intermediate) + if sigmoid_gate { h } else { 0 })
                    });
            }
        }
        p
    }

    /// Parameters of the whole model.
    pub fn params(&self) -> ModelParams {
        let embedding = sat(u128::from(self.vocab_size) * u128::from(self.hidden_size));
        ModelParams {
            layers: self
                .layers
                .iter()
                .map(|l| self.layer_params(l))
                .fold(LayerParams::default(), LayerParams::add),
            embedding,
            lm_head: match self.lm_head {
                LmHead::Untied => embedding,
                LmHead::Tied => 0,
            }
            .saturating_add(if self.lm_head_bias { self.vocab_size } else { 0 }),
            final_norm: match self.norm.kind {
                NormKind::Layer { bias: true } => 2 * self.hidden_size,
                _ => self.hidden_size,
            },
        }
    }

    /// K and V bytes one cached position takes in one layer (`2 * kv_heads * head_dim * bytes`;
    /// MLA, absorbed: the latent and the rope key, `(kv_lora_rank + qk_rope_head_dim) * bytes`).
    pub fn kv_bytes_per_token_per_layer(&self, bytes_per_elem: u64) -> u64 {
        match self.attention.form {
            AttentionForm::Gqa => self.expanded_kv_bytes_per_token_per_layer(bytes_per_elem),
            AttentionForm::Mla(m) => {
                sat(u128::from(m.latent_cache_width()) * u128::from(bytes_per_elem))
            }
        }
    }

    /// What one position and layer would take with every K/V head cached as plain attention
    /// caches it: `kv_heads * (head_dim + v_head_dim) * bytes` (MLA expanded by `kv_b_proj`;
    /// the same as [`Self::kv_bytes_per_token_per_layer`] for grouped-query attention).
    pub fn expanded_kv_bytes_per_token_per_layer(&self, bytes_per_elem: u64) -> u64 {
        let a = &self.attention;
        let v = match a.form {
            AttentionForm::Gqa => a.head_dim,
            AttentionForm::Mla(m) => m.v_head_dim,
        };
        sat(u128::from(a.num_kv_heads) * u128::from(a.head_dim + v) * u128::from(bytes_per_elem))
    }

    /// HBM bytes of one decode step for `batch` sequences at `context` cached positions each,
    /// weights and KV cache in `bytes_per_elem` bytes (2 for bf16). Weights are read once per
    /// step whatever the batch, except routed experts, of which the expected number of distinct
    /// ones under uniform routing is read ([`expected_distinct_experts`]). Integer byte counts
    /// saturate at `u64::MAX` rather than overflow.
    pub fn decode_traffic(&self, batch: u64, context: u64, bytes_per_elem: u64) -> DecodeTraffic {
        let bytes = u128::from(bytes_per_elem);
        let kv_per_pos = u128::from(self.kv_bytes_per_token_per_layer(bytes_per_elem));
        let (mut dense, mut experts, mut kv_read, mut kv_write) =
            (u128::from(self.hidden_size) * bytes, 0.0, 0u128, 0u128);
        for layer in &self.layers {
            let p = self.layer_params(layer);
            dense = dense.saturating_add(
                u128::from(sum(&[p.attention, p.norms, p.router, p.shared_expert, p.dense_mlp]))
                    .saturating_mul(bytes),
            );
            if let FfnKind::Moe(m) = &layer.ffn
                && m.num_experts > 0
            {
                let one_expert = (p.experts_total / m.num_experts) as f64 * bytes_per_elem as f64;
                experts += expected_distinct_experts(m.num_experts, m.top_k, batch) * one_expert;
            }
            // Saturating: batch and context are the caller's, unbounded.
            kv_read = kv_read.saturating_add(
                u128::from(batch)
                    .saturating_mul(u128::from(layer.attention.span(context)))
                    .saturating_mul(kv_per_pos),
            );
            kv_write = kv_write.saturating_add(u128::from(batch).saturating_mul(kv_per_pos));
        }
        let row = u128::from(self.hidden_size) * bytes;
        DecodeTraffic {
            batch,
            context,
            dense_weights: sat(dense),
            expert_weights: experts,
            lm_head: sat(u128::from(self.vocab_size) * row),
            embedding_rows: sat(u128::from(batch.min(self.vocab_size)) * row),
            kv_read: sat(kv_read),
            kv_write: sat(kv_write),
        }
    }
}
