//! The unfused decode step: the library kernels a step calls when each phase is its own
//! `pallas_call` (per layer rmsnorm, qkv gemv, rope, `kv_cache_update`, `decode_attention`
//! over the full context, o gemv, residual adds, rmsnorm, `moe_router`, `expert_ffn`; then
//! the final rmsnorm and the `lm_head` gemv). The megakernel's benchmark and
//! `palladium profile --unfused` compare the fused step with their sum.

use palladium_model::{FfnKind, ModelSpec};

fn set(s: &[(&str, u64)]) -> Vec<(String, String)> {
    s.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

/// `settings` plus `bench_full_context=true`: static KV bounds, priceable by libtpu.
fn full_context(mut settings: Vec<(String, String)>) -> Vec<(String, String)> {
    settings.push(("bench_full_context".into(), "true".into()));
    settings
}

/// The largest of a few GEMV column blocks dividing `n`.
fn block_n(n: u64) -> u64 {
    [1792, 1024, 896, 512, 256, 128].into_iter().find(|b| n.is_multiple_of(*b)).unwrap_or(128)
}

/// RoPE's heads per block: the most, up to 8, that divide the heads (36 on Qwen3-30B-A3B: 6).
fn heads_per_block(heads: u64) -> u64 {
    (1..=8).rev().find(|d| heads.is_multiple_of(*d)).unwrap_or(1)
}

/// One library kernel of the unfused step, and how many times a step calls it.
#[derive(Clone, Debug)]
pub struct UnfusedKernel {
    pub label: String,
    pub times: u64,
    /// The registry name (`palladium_kernels::build`).
    pub kernel: &'static str,
    pub settings: Vec<(String, String)>,
}

/// The library kernels a decode step of `s` (the first `layers` layers, `batch` sequences,
/// `context` positions) calls when it is not fused.
pub fn unfused_kernels(
    s: &ModelSpec,
    layers: usize,
    batch: u64,
    context: u64,
) -> Result<Vec<UnfusedKernel>, String> {
    let a = &s.attention;
    let h = s.hidden_size;
    let (heads, kvh, hd) = (a.num_heads, a.num_kv_heads, a.head_dim);
    let Some(FfnKind::Moe(m)) = s.layers.first().map(|l| &l.ffn) else {
        return Err("the unfused step is defined for MoE models only".into());
    };
    // Its calls are counted per layer as MoE layers: dense-MLP layers among them would be
    // priced as MoE ones.
    if let Some(l) = s.layers.iter().take(layers).find(|l| !matches!(l.ffn, FfnKind::Moe(_))) {
        return Err(format!(
            "the unfused step is defined for models whose layers are all MoE (layer {} is a dense MLP by the config's mlp_only_layers / decoder_sparse_step)",
            l.index
        ));
    }
    if let Some(shared) = m.shared {
        return Err(format!(
            "the unfused step has no shared-expert call (intermediate {}): it would be priced without it",
            shared.intermediate
        ));
    }
    let rows = batch.div_ceil(16) * 16;
    let l = layers as u64;
    let nqkv = (heads + 2 * kvh) * hd;
    // The KV caches at the megakernel's padded head size (the same KV bytes; libtpu's v6e
    // profiler also aborts on `decode_attention` at head_dim 64) and its KV tile size.
    let hp = hd.div_ceil(128) * 128;
    let vocab = s.vocab_size.div_ceil(1024) * 1024;
    let k = |label: &str, times: u64, kernel: &'static str, settings: Vec<(String, String)>| {
        UnfusedKernel { label: label.into(), times, kernel, settings }
    };
    Ok(vec![
        k(
            "rmsnorm (x2 per layer, + final)",
            2 * l + 1,
            "rmsnorm",
            set(&[("rows", rows), ("hidden", h), ("block_rows", rows)]),
        ),
        k(
            "qkv gemv",
            l,
            "gemv",
            set(&[
                ("batch", batch),
                ("k", h),
                ("n", nqkv),
                ("block_k", h),
                ("block_n", block_n(nqkv)),
            ]),
        ),
        k(
            "rope (q and k heads)",
            l,
            "rope",
            set(&[
                ("tokens", batch),
                ("heads", heads + kvh),
                ("head_dim", hd),
                ("block_t", batch),
                ("heads_per_block", heads_per_block(heads + kvh)),
            ]),
        ),
        k(
            "kv_cache_update",
            l,
            "kv_cache_update",
            set(&[("batch", batch), ("kv_heads", kvh), ("head_dim", hp), ("max_context", context)]),
        ),
        k(
            "decode_attention (full context)",
            l,
            "decode_attention",
            full_context(set(&[
                ("batch", batch),
                ("kv_heads", kvh),
                ("group", heads / kvh),
                ("head_dim", hp),
                ("max_context", context),
                ("block_kv", 1024.min(context)),
            ])),
        ),
        k(
            "o gemv",
            l,
            "gemv",
            set(&[
                ("batch", batch),
                ("k", heads * hd),
                ("n", h),
                ("block_k", heads * hd),
                ("block_n", block_n(h)),
            ]),
        ),
        k(
            "residual_add (x2 per layer)",
            2 * l,
            "residual_add",
            set(&[("rows", rows), ("hidden", h), ("block_rows", rows)]),
        ),
        k(
            "moe_router",
            l,
            "moe_router",
            set(&[
                ("tokens", batch),
                ("hidden", h),
                ("experts", m.num_experts),
                ("top_k", m.top_k),
            ]),
        ),
        k(
            "expert_ffn",
            l,
            "expert_ffn",
            set(&[
                ("tokens", batch),
                ("hidden", h),
                ("experts", m.num_experts),
                ("top_k", m.top_k),
                ("ffn", m.intermediate),
                ("block_ffn", 256.min(m.intermediate)),
            ]),
        ),
        k(
            "lm_head gemv (vocab padded to 1024)",
            1,
            "gemv",
            set(&[("batch", batch), ("k", h), ("n", vocab), ("block_k", h), ("block_n", 1024)]),
        ),
    ])
}
