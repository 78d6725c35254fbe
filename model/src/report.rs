//! A plain-text summary of a [`ModelSpec`] and its derived sizes, for `palladium` reports and
//! snapshot tests.

use std::fmt::Write as _;

use crate::spec::{
    AttentionForm, AttentionKind, Family, FfnKind, GroupScore, LmHead, ModelSpec, QkNorm,
    RouterScoring, TopKWeights,
};

/// Batches the report lists decode-step traffic for.
pub const REPORT_BATCHES: [u64; 3] = [1, 8, 64];
/// Context length the report uses (capped at `max_position_embeddings`).
pub const REPORT_CONTEXT: u64 = 4096;

/// `1234567` → `"1.23 M"`: three significant decimals with a decimal SI suffix.
pub fn si(x: f64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    UNITS
        .iter()
        .find(|(scale, _)| x.abs() >= *scale)
        .map_or_else(|| format!("{x:.0}"), |(scale, unit)| format!("{:.2} {unit}", x / scale))
}

/// Bytes with [`si`]: `"1.23 MB"`, `"512 B"`.
pub fn bytes(x: f64) -> String {
    let s = si(x);
    if s.ends_with(|c: char| c.is_ascii_digit()) { format!("{s} B") } else { format!("{s}B") }
}

fn attention_text(a: AttentionKind) -> String {
    match a {
        AttentionKind::Full => "full attention".into(),
        AttentionKind::Sliding { window } => format!("sliding window {window}"),
        AttentionKind::Chunked { chunk } => format!("chunked attention, chunks of {chunk}"),
    }
}

fn ffn_text(f: &FfnKind) -> String {
    match f {
        FfnKind::Dense { intermediate } => format!("dense MLP, intermediate {intermediate}"),
        FfnKind::Moe(m) => {
            let weights = match m.routing.top_k_weights {
                TopKWeights::Renormalized => "renormalised",
                TopKWeights::Raw => "not renormalised",
            };
            let shared = m.shared.map_or(String::new(), |s| {
                format!(
                    ", shared expert {}{}",
                    s.intermediate,
                    if s.sigmoid_gate { " (sigmoid gate)" } else { "" }
                )
            });
            let r = &m.routing;
            let mut scoring = match (r.sparse_mixer, r.scoring) {
                (Some(m), _) => format!("sparsemixer, jitter_eps {}", m.jitter_eps),
                (None, RouterScoring::Softmax) => "softmax".to_string(),
                (None, RouterScoring::Sigmoid) => "sigmoid".to_string(),
            };
            if r.correction_bias {
                scoring += ", correction bias to choose";
            }
            if let Some(g) = r.groups {
                let by = match g.score {
                    GroupScore::TopTwoSum => "their best two",
                    GroupScore::Max => "their best",
                };
                scoring += &format!(", best {} of {} groups by {by}", g.chosen_groups, g.groups);
            }
            if r.scaling != 1.0 {
                scoring += &format!(", weights x {}", r.scaling);
            }
            format!(
                "MoE {} experts top-{} ({scoring}, top-k {weights}), expert intermediate {}{shared}",
                m.num_experts, m.top_k, m.intermediate
            )
        }
    }
}

impl ModelSpec {
    /// The report: architecture facts, layer runs, parameter and byte counts (bf16), KV cache
    /// and decode-step HBM traffic for [`REPORT_BATCHES`] at [`REPORT_CONTEXT`].
    pub fn report(&self) -> String {
        // Writing to a String cannot fail.
        let mut s = String::new();
        let _ = self.write_report(&mut s);
        s
    }

    fn write_report(&self, s: &mut String) -> std::fmt::Result {
        let a = &self.attention;
        let name = match self.family {
            Family::Qwen3Moe => "Qwen3-MoE",
            Family::Mixtral => "Mixtral",
            Family::DeepseekV3 => "DeepSeek-V3",
            Family::DeepseekV2 => "DeepSeek-V2",
            Family::Qwen2Moe => "Qwen2-MoE",
            Family::Glm4Moe => "GLM-4.5-MoE",
            Family::Olmoe => "OLMoE",
            Family::GptOss => "gpt-oss",
            Family::Llama4 => "Llama 4",
            Family::GraniteMoe => "Granite MoE",
            Family::Ernie45Moe => "ERNIE-4.5-MoE",
            Family::Phimoe => "Phi-3.5-MoE",
            Family::HunyuanMoe => "Hunyuan-MoE",
            Family::Dbrx => "DBRX",
        };
        writeln!(
            s,
            "{name} (model_type {:?}), {} layers",
            self.family.model_type(),
            self.layers.len()
        )?;
        writeln!(
            s,
            "  hidden {}, vocab {}, max positions {}, dtype {}",
            self.hidden_size,
            self.vocab_size,
            self.max_position_embeddings,
            self.dtype.map_or("unspecified (float32)", |d| d.name())
        )?;
        if let Some(q) = &self.quantization {
            writeln!(s, "  quantized checkpoint: {}", q.describe())?;
        }
        writeln!(
            s,
            "attention: {} q heads / {} kv heads (group {}), head_dim {}, scale {}",
            a.num_heads,
            a.num_kv_heads,
            a.group_size(),
            a.head_dim,
            a.scale
        )?;
        match a.qk_norm {
            QkNorm::None => writeln!(s, "  q/k norm: none")?,
            QkNorm::PerHeadRms { weight_len } => {
                writeln!(s, "  q/k norm: per-head RMSNorm, weight [{weight_len}], before RoPE")?
            }
            QkNorm::WholeRms { q_len, k_len } => writeln!(
                s,
                "  q/k norm: RMSNorm over the whole projections, weights [{q_len}] / [{k_len}], before RoPE"
            )?,
            QkNorm::L2AfterRope => {
                writeln!(s, "  q/k norm: per-head L2 norm without weight, after RoPE, RoPE layers")?
            }
            QkNorm::PerHeadRmsAfterRope { weight_len } => {
                writeln!(s, "  q/k norm: per-head RMSNorm, weight [{weight_len}], after RoPE")?
            }
        }
        if let Some(c) = a.clip_qkv {
            writeln!(s, "  q/k/v clipped to [-{c}, {c}]")?;
        }
        writeln!(
            s,
            "  RoPE: {:?}, theta {}, scaling {:?}, rotary_dim {}",
            a.rope.style, a.rope.theta, a.rope.scaling, a.rope.rotary_dim
        )?;
        writeln!(s, "  bias: qkv {}, o {}", a.qkv_bias, a.o_bias)?;
        if let AttentionForm::Mla(m) = a.form {
            writeln!(
                s,
                "  MLA: q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {}, qk_rope_head_dim {}, v_head_dim {}",
                m.q_lora_rank.map_or("null (q_proj)".to_string(), |r| r.to_string()),
                m.kv_lora_rank,
                m.qk_nope_head_dim,
                m.qk_rope_head_dim,
                m.v_head_dim
            )?;
        }
        writeln!(
            s,
            "norms: {:?} eps {}, pre-norm residual blocks, final norm before lm_head",
            self.norm.kind, self.norm.eps
        )?;
        writeln!(
            s,
            "mlp: {:?}, gated {} (down(act(gate(x)) * up(x))){}",
            self.mlp.activation,
            self.mlp.gated,
            if self.mlp.bias { ", biases on gate, up and down" } else { "" }
        )?;
        writeln!(
            s,
            "lm_head: {}{}",
            match self.lm_head {
                LmHead::Untied => "untied",
                LmHead::Tied => "tied to embed_tokens",
            },
            if self.lm_head_bias { ", with bias" } else { "" }
        )?;

        writeln!(s, "layers:")?;
        let mut start = 0;
        while start < self.layers.len() {
            let l = &self.layers[start];
            let end = self.layers[start..]
                .iter()
                .position(|m| m.attention != l.attention || m.ffn != l.ffn)
                .map_or(self.layers.len(), |n| start + n);
            writeln!(
                s,
                "  {:>3}..={:<3} {}; {}",
                start,
                end - 1,
                attention_text(l.attention),
                ffn_text(&l.ffn)
            )?;
            start = end;
        }
        if self.defaulted.is_empty() {
            writeln!(s, "defaulted fields: none")?;
        } else {
            let list: Vec<String> =
                self.defaulted.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            writeln!(s, "defaulted fields: {}", list.join(", "))?;
        }

        let p = self.params();
        let b = 2.0; // bf16
        writeln!(s, "parameters (bytes at bf16):")?;
        let mut row = |label: &str, n: u64| {
            writeln!(s, "  {label:<28}{:>16} {:>10}  {:>10}", n, si(n as f64), bytes(n as f64 * b))
        };
        row("attention", p.layers.attention)?;
        row("norms (layers)", p.layers.norms)?;
        row("router", p.layers.router)?;
        row("routed experts, total", p.layers.experts_total)?;
        row("routed experts, active/tok", p.layers.experts_active)?;
        row("shared experts", p.layers.shared_expert)?;
        row("dense MLPs", p.layers.dense_mlp)?;
        row("embedding", p.embedding)?;
        row("lm_head", p.lm_head)?;
        row("final norm", p.final_norm)?;
        row("total", p.total())?;
        row("active per token", p.active())?;
        row("active w/o embedding", p.active_without_embedding())?;
        if let Some(l) = self.layers.first() {
            let lp = self.layer_params(l);
            writeln!(
                s,
                "  layer 0: total {} ({}), active {} ({})",
                lp.total(),
                bytes(lp.total() as f64 * b),
                lp.active(),
                bytes(lp.active() as f64 * b)
            )?;
        }

        let kv = self.kv_bytes_per_token_per_layer(2);
        writeln!(
            s,
            "KV cache (bf16): {kv} B per token per layer, {} B per token",
            kv.saturating_mul(self.layers.len() as u64)
        )?;
        if let AttentionForm::Mla(m) = a.form {
            writeln!(
                s,
                "  MLA latent cache: kv_lora_rank {} + qk_rope_head_dim {} = {} values per token per layer; every head's K and V expanded (as plain attention caches them) would be {} B",
                m.kv_lora_rank,
                m.qk_rope_head_dim,
                m.latent_cache_width(),
                self.expanded_kv_bytes_per_token_per_layer(2)
            )?;
        }
        let context = REPORT_CONTEXT.min(self.max_position_embeddings);
        writeln!(s, "decode step HBM bytes (bf16, uniform routing), context {context}:")?;
        for batch in REPORT_BATCHES {
            let t = self.decode_traffic(batch, context, 2);
            writeln!(
                s,
                "  B={batch:<3} weights {} (experts {}), KV read {}, KV write {}, total {}",
                bytes(t.weights()),
                bytes(t.expert_weights),
                bytes(t.kv_read as f64),
                bytes(t.kv_write as f64),
                bytes(t.total())
            )?;
        }
        Ok(())
    }
}
