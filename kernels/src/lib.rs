//! Palladium's kernel library. Every kernel is a `#[kernel]` function with defaulted
//! compile-time parameters, listed in [`REGISTRY`] so tools can build it by name, generate
//! random inputs for it and compute its expected outputs with a plain-Rust reference.
//!
//! Adding a kernel: write it (`#[kernel] pub fn foo(..)`), its reference math in
//! [`mod@reference`] (f32 over slices), a `cases::foo` module with `inputs` and `reference`
//! (see [`cases`]), then one line in [`REGISTRY`]: `entry!(foo, "what it does", cases::foo)`.
//! `entry!(foo, "...")` without cases registers a kernel that cannot be checked; the
//! registry test fails for it.
//!
//! Where the reference math lives: the mixture-of-experts math (router scoring, top-k and
//! its tie and NaN rules, renormalisation, the SwiGLU experts and their combine) is the
//! model crate's, `palladium_model::moe`, the same code as the reference forward pass
//! (`palladium_model::reference`, what `run --check` compares the megakernel with);
//! [`moe_reference`] only calls it with the kernels' conventions (f32 router logits and
//! weights, bf16 rounding of the SwiGLU activation and the output) and their operand
//! layouts. [`mod@reference`] holds the other kernels' plain f32 references.

mod attention;
pub mod body;
pub mod cases;
mod collectives;
pub mod coverage;
mod decode;
mod ffn;
mod flash;
mod gather;
mod gmm;
mod kv_cache;
mod linalg;
mod mla;
pub mod moe_reference;
mod norm;
mod norm_matmul;
mod quantized;
pub mod reference;
mod residual;
mod rotary;
mod router;

pub use palladium_array::HostArray;

pub use attention::decode_attention;
pub use collectives::{all_gather, all_reduce, permute, reduce_scatter};
pub use decode::gemv;
pub use ffn::expert_ffn;
pub use flash::flash_attention;
pub use gather::gather_rows;
pub use gmm::{grouped_matmul, grouped_matmul_quantized};
pub use kv_cache::kv_cache_update;
pub use linalg::matmul;
pub use mla::mla_decode_attention;
pub use norm::rmsnorm;
pub use norm_matmul::rmsnorm_matmul;
pub use quantized::{
    expert_ffn_quantized, gemv_quantized, matmul_quantized, rmsnorm_matmul_quantized,
};
pub use residual::{residual_add, residual_add_inplace};
pub use rotary::rope;
pub use router::moe_router;

use palladium_dsl::{BuildErrors, Kernel, build::ParamError};

/// Why a kernel could not be built by name.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("unknown kernel `{0}` (known: {known})", known = names().join(", "))]
    Unknown(String),
    #[error("bad --set `{0}`: write NAME=VALUE")]
    BadSetting(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("kernel `{kernel}` cannot be built:\n{errors}")]
    Build { kernel: String, errors: BuildErrors },
    #[error("kernel `{0}` has no reference (add a `cases` module and name it in its `entry!`)")]
    NoReference(String),
}

/// Builds a kernel from `NAME=VALUE` settings.
pub type BuildFn = fn(&[(String, String)]) -> Result<Kernel, KernelError>;

/// Random inputs for `NAME=VALUE` settings and a seed: scalar-prefetch arrays, then inputs.
pub type InputsFn = fn(&[(String, String)], u64) -> Result<Vec<HostArray>, KernelError>;

/// The expected outputs for `NAME=VALUE` settings and inputs (as [`InputsFn`] orders them).
pub type ReferenceFn = fn(&[(String, String)], &[HostArray]) -> Result<Vec<HostArray>, KernelError>;

/// A library kernel: its name, a one-line description, its parameters, a builder, and
/// (for checking it) an input generator and a reference.
///
/// A mesh kernel (a call spec with a mesh, `CallSpec::devices() > 1`: the collectives) has
/// inputs and outputs per device; here, as in the runtime's programs (`jax.shard_map` with
/// `P("x")`), each is the devices' operands stacked on dim 0 in device order
/// ([`HostArray::split_leading`] gives the devices' own).
#[derive(Debug)]
pub struct KernelEntry {
    pub name: &'static str,
    pub description: &'static str,
    /// `(name, default value)` of every compile-time parameter.
    pub defaults: fn() -> Vec<(&'static str, String)>,
    /// Build with `NAME=VALUE` overrides of the defaults.
    pub build: BuildFn,
    /// Seeded random inputs within the kernel's constraints (never all zero).
    pub inputs: InputsFn,
    /// The plain-Rust reference ([`mod@reference`]).
    pub reference: ReferenceFn,
}

macro_rules! entry {
    ($kernel:ident, $description:literal) => {
        entry!(@ $kernel, $description,
            |_, _| Err(KernelError::NoReference($kernel::NAME.to_string())),
            |_, _| Err(KernelError::NoReference($kernel::NAME.to_string())))
    };
    ($kernel:ident, $description:literal, $($cases:ident)::+) => {
        entry!(@ $kernel, $description,
            |settings, seed| {
                let params = entry!(@params $kernel, settings);
                Ok($($cases)::+::inputs(&params, seed))
            },
            |settings, inputs| {
                let params = entry!(@params $kernel, settings);
                Ok($($cases)::+::reference(&params, inputs))
            })
    };
    (@params $kernel:ident, $settings:expr) => {{
        let mut params = $kernel::Params::default();
        for (name, value) in $settings {
            params.set(name, value)?;
        }
        params
    }};
    (@ $kernel:ident, $description:literal, $inputs:expr, $reference:expr) => {
        KernelEntry {
            name: $kernel::NAME,
            description: $description,
            defaults: || $kernel::Params::default().values(),
            build: |settings| {
                let params = entry!(@params $kernel, settings);
                $kernel::build(&params).map_err(|errors| KernelError::Build { kernel: $kernel::NAME.to_string(), errors })
            },
            inputs: $inputs,
            reference: $reference,
        }
    };
}

/// Every kernel in the library.
pub static REGISTRY: &[KernelEntry] = &[
    entry!(
        matmul,
        "tiled bf16 matmul with an f32 VMEM accumulator (Pallas's reference matmul)",
        cases::matmul
    ),
    entry!(rmsnorm, "RMSNorm over the hidden dim, f32 math, bf16 in/out", cases::rmsnorm),
    entry!(
        gather_rows,
        "gather row blocks from HBM by scalar-prefetched ids with double-buffered DMAs",
        cases::gather_rows
    ),
    entry!(
        decode_attention,
        "GQA decode attention over an HBM KV cache: per-sequence lengths, double-buffered KV tiles, online softmax",
        cases::decode_attention
    ),
    entry!(
        mla_decode_attention,
        "DeepSeek MLA decode attention, absorbed: W_UK into the query, W_UV on the output (kv_b_proj as shipped), over a latent cache of [latent | rope key] rows, online softmax",
        cases::mla_decode_attention
    ),
    entry!(
        kv_cache_update,
        "in-place KV cache update: the new token's K/V rows DMA'd (HBM to HBM) into the aliased caches at per-sequence positions from scalar prefetch",
        cases::kv_cache_update
    ),
    entry!(
        moe_router,
        "MoE router: x @ w_router logits, softmax/sigmoid scores, top-k (optionally renormalised) ids and weights to SMEM",
        cases::moe_router
    ),
    entry!(
        expert_ffn,
        "MoE decode expert FFN: SwiGLU experts fetched by routed id with double-buffered manual DMAs, weighted f32 combine",
        cases::expert_ffn
    ),
    entry!(
        grouped_matmul,
        "megablox-style grouped matmul: expert-sorted rows, group metadata in scalar prefetch, masked merge of straddling tiles",
        cases::grouped_matmul
    ),
    entry!(
        gemv,
        "decode GEMV: small bf16 batch against a large bf16 weight streamed in column blocks, f32 out",
        cases::gemv
    ),
    entry!(residual_add, "residual add of two bf16 arrays in f32, row blocks", cases::residual_add),
    entry!(
        residual_add_inplace,
        "residual_add with the residual input aliased to the output (in-place update)",
        cases::residual_add_inplace
    ),
    entry!(
        rmsnorm_matmul,
        "RMSNorm (f32) fused into the next bf16 projection; normalised rows cached in VMEM across column blocks",
        cases::rmsnorm_matmul
    ),
    entry!(
        flash_attention,
        "flash attention forward (Pallas's TPU kernel): online softmax over kv blocks in VMEM scratch, causal by iota, Buffered K/V specs",
        cases::flash_attention
    ),
    entry!(
        gemv_quantized,
        "gemv with 8/4-bit weights (i8, i4, f8e4m3fn codes) and f32 scales per group of inputs per column, fed to the MXU as bf16 x code dots",
        cases::gemv_quantized
    ),
    entry!(
        matmul_quantized,
        "tiled matmul with 8/4-bit weights and f32 group scales applied to each group's partial product",
        cases::matmul_quantized
    ),
    entry!(
        rmsnorm_matmul_quantized,
        "rmsnorm_matmul with 8/4-bit weights and f32 group scales",
        cases::rmsnorm_matmul_quantized
    ),
    entry!(
        expert_ffn_quantized,
        "expert_ffn with 8/4-bit experts (default int4, groups of 128) and their scales as pipeline blocks indexed by the routed ids",
        cases::expert_ffn_quantized
    ),
    entry!(
        grouped_matmul_quantized,
        "grouped_matmul with 8/4-bit experts (default int4, groups of 128) and f32 group scales as blocks beside their codes",
        cases::grouped_matmul_quantized
    ),
    entry!(
        rope,
        "rotary embedding on [tokens, heads*head_dim], neox or interleaved, rotation as an exact ±1 matmul",
        cases::rope
    ),
    entry!(
        permute,
        "ring permute over a 1-D device mesh (lax.ppermute): one remote DMA to device i + shift after a barrier with both ring neighbours",
        cases::permute
    ),
    entry!(
        all_gather,
        "ring all-gather over a 1-D device mesh: n - 1 remote-DMA hops, every device's x stacked in device order",
        cases::all_gather
    ),
    entry!(
        reduce_scatter,
        "ring reduce-scatter over a 1-D device mesh: f32 sums on the device, bf16 partials on the wire, device i gets row block i of the sum",
        cases::reduce_scatter
    ),
    entry!(
        all_reduce,
        "ring all-reduce over a 1-D device mesh (reduce-scatter then all-gather), optionally bidirectional (half the columns each way)",
        cases::all_reduce
    ),
];

pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.name).collect()
}

/// Build a library kernel by name with `NAME=VALUE` settings.
pub fn build(name: &str, settings: &[(String, String)]) -> Result<Kernel, KernelError> {
    let entry = REGISTRY
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| KernelError::Unknown(name.to_string()))?;
    (entry.build)(settings)
}

/// The registry entry of a kernel.
pub fn entry(name: &str) -> Result<&'static KernelEntry, KernelError> {
    REGISTRY.iter().find(|e| e.name == name).ok_or_else(|| KernelError::Unknown(name.to_string()))
}

/// Parse `NAME=VALUE`.
pub fn parse_setting(s: &str) -> Result<(String, String), KernelError> {
    match s.split_once('=') {
        Some((n, v)) if !n.trim().is_empty() => Ok((n.trim().to_string(), v.trim().to_string())),
        _ => Err(KernelError::BadSetting(s.to_string())),
    }
}
