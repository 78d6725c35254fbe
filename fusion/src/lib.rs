//! Palladium's decode megakernel: a whole decode step of an MoE model (all layers, final
//! norm, `lm_head`) as ONE grid-less kernel streaming weights from HBM, built by the
//! compiler from the model's `config.json` (nothing is hand-written per model).
//!
//! Pipeline (one module per step, in order):
//! - [`graph`]: the per-layer op graph (petgraph `StableDiGraph`) from a
//!   [`palladium_model::ModelSpec`];
//! - [`rewrite`]: egg rewrites inside a layer (RMS-norm scales folded into weights, q/k/v
//!   fused into one projection, gate/up fused), DAG-aware extraction, `Saturated` asserted;
//!   the extraction decides the dense stream's segments;
//! - [`options`]: what a plan is asked for ([`options::PlanOptions`]) and the terms both
//!   planners share (the kernel's dims, planning errors, checked byte arithmetic): [`plan`]
//!   and [`shard`] build on it, and only `plan` calls `shard`, so the dependency goes one way;
//! - [`plan`]: the streaming plan, in named stages — dims, the rewrites read into segments,
//!   the weights' layout ([`layout::StreamLayout`]: operands, segments, chunks, typed), the
//!   prefetch schedule (dense ring banks and depth, expert ring), the scratch, VMEM budget
//!   per chip, HBM fit (refusals carry the numbers), traffic;
//! - [`scratch`]: the kernel's scratch declared once (each buffer's name, memory space,
//!   dtype and shape; the semaphore arrays), from the plan's dims, layout and rings: what
//!   [`emit`] declares, taking each handle by its typed key, and what the VMEM budget sums
//!   at the dsl's padded sizes;
//! - [`source`]: the typed source map of every weight operand (which checkpoint tensor
//!   each element is, transposed, fused, a norm folded, padded, codes or scales, device
//!   `me`'s slice): what `palladium-decode`'s one packer walks and [`report`] renders;
//! - [`shard`]: the split over `--devices N` (attention by heads, experts EP or TP,
//!   `lm_head` by vocabulary), the collectives priced from the target's link model; the
//!   plan is then one device's;
//! - [`stage`]: the decode step's stages, one file each (embedding, input norm + q/k/v,
//!   attention, o-proj + residual, router, routed experts, dense MLP, final norm +
//!   `lm_head` + greedy; the dense stream and the expert ring they stream through): each
//!   names its operands (by [`layout::OperandKind`]) and scratch (by [`scratch`]'s keys)
//!   in its handles and holds its emit code, calling the kernel bodies; quantization is
//!   the data of its operands ([`stage::WeightTile`]), not a branch;
//! - [`emit`]: the one [`palladium_dsl::Kernel`], traced with the DSL's `KernelBuilder`:
//!   the operands and scratch declared, then the stages composed (prologue, layer loop,
//!   the step's end; on `N > 1` devices with [`spmd`]'s in-kernel collectives);
//! - [`megakernel`]: [`megakernel::Megakernel::build`], plan + emit + lowering, the compiled
//!   megakernel (running it is `palladium-decode`'s);
//! - [`report`]: the text and JSON report (`palladium megakernel ... [--json]`).
//!
//! # Operand interface
//!
//! Order (Pallas operand order; `L` layers, `B` batch, `K` tokens per sequence
//! (`--tokens-per-seq`, row `r = b * K + k` is sequence `b`'s `k`-th new token), `rows` =
//! `B * K` rounded up to 16, `H` hidden, `hp` = `head_dim`
//! rounded up to 128, `E` experts, `I` expert intermediate, `cw` = [`layout::StreamLayout::chunk_cols`],
//! `n` = dense chunks per layer, `C` = `I / expert_block`, `T` = cache positions; where
//! dense-MLP layers sit among the MoE layers, `L_moe` and `L_dense` count each kind,
//! `C_d` = `intermediate_size / expert_block`; `H`, `I`, `S` and `intermediate_size` are
//! the kernel's sizes, rounded up to 128 lanes where the model's fill no tile, the padding
//! zero: [`options::Dims::tiled`], `docs/megakernel.md`'s Padding):
//!
//! | # | name | type | space | content |
//! |---|---|---|---|---|
//! | 0 | `tokens` | `i32[B*K]` | SMEM (scalar prefetch) | token id per token row |
//! | 1 | `positions` | `i32[B]` | SMEM (scalar prefetch) | position `p` of the sequence's first new token (token `k` at `p + k`, attending to `0..=p+k`) |
//! | 2 | `embed` | `bf16[ceil(V/16), 16, H]` | HBM | `embed_tokens.weight` reshaped, zero rows past `V` |
//! | 3 | `w_stream` | `bf16[L*n + ceil(V/cw), H, cw]` | HBM | the dense stream: per layer `[q|k|v heads (transposed, input_layernorm folded) | o_proj.weight (heads padded to hp) | router^T (post_attention_layernorm folded, padded to 128)]` in `n` chunks of `cw` columns, then `lm_head^T` with the final norm folded in chunks of `cw` columns |
//! | 4 | `w_experts` | `bf16[L, E, C, H, 3*block]` (`L_moe` where layers mix kinds; `E + S/I` with a shared expert) | HBM | chunk `c` of expert `e`, one DMA: `[gate^T cols | up^T cols` (post-attention norm folded) `| down_proj.weight cols]`; entry `E + j` the shared expert's intermediate columns `j*I..(j+1)*I` |
//! | | `w_mlp` (only where layers mix kinds) | `bf16[L_dense, C_d, H, 3*block]` | HBM | chunk `c` of a dense-MLP layer's MLP, as an expert's; those layers' router columns in `w_stream` are zero |
//! | 5 | `head_norms` (q/k norms only) | `f32[L, 8, hp]`; OLMoE's: `f32[L, R, hp]` | HBM | Qwen3, GLM-4.5 (per head): row 0 `q_norm`, row 1 `k_norm`; OLMoE (whole projections): row `t` head `t`'s slice of `q_norm` then `k_norm`, `R` = heads + kv heads rounded up to 8 |
//! | | `qkv_bias` (q/k/v biases only) | `f32[L, R, hp]` | HBM | row `t` the bias of head `t` of the q, k, v heads in order, padded to `hp`; `R` = heads + 2 kv heads rounded up to 8 |
//! | | `o_bias` (`o_proj` biases only) | `f32[L, 8, H]` | HBM | row 0: layer `l`'s `o_proj.bias`, whole on every device (added once, after the all-reduce) |
//! | | `correction_bias` (DeepSeek-V3 routing only) | `f32[L, 8, 128*ceil(E/128)]` | HBM | row 0 of MoE layer `l`: its `e_score_correction_bias` (f32, unrounded); dense layers' zero |
//! | | `sinks` (gpt-oss) | `f32[L, kv_heads, attn_rows, 128]` | HBM | row `k*group + j` of kv group `g`: the sink of query head `g*group + j`, every lane |
//! | | `router_bias` (gpt-oss) | `f32[L, 8, 128*ceil(E/128)]` | HBM | row 0 of MoE layer `l`: the router's bias |
//! | | `expert_bias` (gpt-oss) | `f32[L, E, C, 8, max(2*block, H)]` | HBM | chunk `c` of expert `e`: row 0 `[gate bias | up bias]` of its columns, row 1 the down bias (chunk 0 only) |
//! | | `k_cache`, `v_cache` | `bf16[L, B, kv_heads, T, hp]` | HBM | K (normed, roped) / V; aliased to outputs |
//! | out | `logits` (only with `--logits`) | `f32[ceil(V/cw), rows, cw]` | VMEM | logit of token row r, token v at `[v / cw, r, v % cw]` |
//! | out | `next_ids` | `i32[rows, 128]` | VMEM | greedy next id of token row r (lowest id among equal maxima), every lane of row r |
//! | out | `max_logits` | `f32[rows, 128]` | VMEM | row r's maximum logit, NaN when any of its logits is not finite |
//! | out | `router_non_finite` | `f32[rows, 128*ceil(L/128)]` | VMEM | 1 at `[r, l]` when row r's router logits in layer l are not all finite, else 0 |
//! | out | `k_cache_out`, `v_cache_out` | as the inputs | HBM | the caches, the K new positions written in place |
//!
//! Quantized weights ([`plan::PlanOptions::weights`] int8, fp8 or int4;
//! [`layout::QuantLayout`]) change the interface: `w_stream` holds the codes (`i8` or
//! `f8E4M3FN`) of the q/k/v and o columns only, `[L*n, H, cw]`, with no norm folded;
//! `w_experts` holds codes (`i8`, `f8E4M3FN` or `i4`); and after the inputs above (before
//! the caches) come `qkv_scales f32[L, H/group, n_qkv]`, `o_scales f32[L, n_o/group, H]`,
//! `w_router bf16[L, H, 128*ceil(E/128)]`, `norms f32[L+1, 8, H]` (input and post-attention
//! norms per layer, the final norm at `L`), `w_lm_head` (`i8` or bf16 `[ceil(V/cw), H, cw]`),
//! `lm_scales f32[ceil(V/cw), 1, cw]` (int8 `lm_head` only), `expert_scales f32[L, E, C,
//! H/group, 2*block]` and `expert_down_scales f32[L, E, C, block/group, H]` (then, where
//! layers mix kinds, `mlp_scales f32[L_dense, C_d, H/group, 2*block]` and `mlp_down_scales
//! f32[L_dense, C_d, block/group, H]`, `w_mlp` in the experts' code dtype). The kernel then
//! applies every RMSNorm weight itself.
//!
//! # Layer kinds
//!
//! The plan holds every layer's FFN stage ([`plan::Plan::layer_ffns`],
//! [`layout::Ffn`]): routed experts, or a dense MLP (Qwen3-MoE's `mlp_only_layers` /
//! `decoder_sparse_step`); one attention kind for every layer but for a sliding window
//! (gpt-oss's sliding and full layers, `options::Dims::sliding_layers`). The dense stream is
//! uniform per layer, so the dense ring is unchanged; the dense MLP streams its chunks
//! (shaped as an expert's) through the expert ring; the emitted layer loop picks the stage
//! under an `scf.if` from scalar compares of the layer index, and emits nothing new where
//! every layer is MoE. Quantized plans (int8, fp8) lay the dense MLP's codes and scales
//! out as an expert's (`w_mlp`, `mlp_scales`, `mlp_down_scales`); int4 is refused (its
//! scheme keeps a dense MLP int8, the expert ring holds int4 codes).
//!
//! A shared expert (Qwen2-MoE) is no layer kind of its own: it is `S / I` more entries of
//! `w_experts` per MoE layer, streamed first in the routed experts' item stream at its
//! gate's weight (`sigmoid` of the router column after the experts', or 1); see
//! `docs/megakernel.md` (the shared-expert stage).
//!
//! Adding the dense-MLP stage (bf16 and quantized, 1 and N devices) touched 8 source files
//! with code, against the count of about 17 files and 30 functions for a layer
//! feature: `options.rs` (`Dims`), `layout.rs` (`Ffn`, `LayerFfns`, `OperandKind`,
//! `StreamLayout`), `plan.rs` (`Plan`, `Traffic`, `rewritten_layer`, `layer_weight_bytes`,
//! `Plan::for_devices`, `dense_intermediate`, `supported`, `dims`, `rewrites`,
//! `stream_layout`, `hbm_fit`, `weight_traffic`, `traffic`), `shard.rs` (`split`),
//! `emit.rs` (`H`, `emit`, `layer_body`, `ffn`, `experts`, `ring_swiglu`, `ffn_chunks`,
//! `dense_mlp`), `report.rs` (`text`, `layer_kinds`, `operand_source`, `bf16_source`,
//! `quantized_source`), `unfused.rs` (`unfused_kernels`: refuses what it would misprice)
//! and `palladium-decode`'s `pack.rs` (`DeviceShare`, `DeviceShare::new`,
//! `DeviceShare::mlp_column`, `pack_device`, `pack_quantized_device`, `MlpTensors`,
//! `QuantizedMlp`, `MlpChunks`): 41 functions and types, 13 of them new
//! (six of the others only gained a field or an enum case), plus the doc comments of this
//! crate and `graph.rs`. The model crate (spec, parse, weights, reference, quantization),
//! the graph, the rewrites, the scratch, the collectives, the router and the kernel bodies
//! were not touched: the model crate already parsed the per-layer FFN kind, and the dense
//! MLP reuses the expert ring and the SwiGLU chunk body. Since then the packer and the
//! report's operand prose go through the source maps ([`source`]): the packer's
//! `DeviceShare`, `MlpTensors`, `QuantizedMlp`, `MlpChunks` and the report's `bf16_source`
//! and `quantized_source` are gone, and the same stage would touch `source.rs` (`blocks`,
//! `ffn`, `Role::shape`) and `pack.rs`'s `tensor_name` instead.
//!
//! Since the emitter is organised as [`stage`]s, the emit side of that stage is one new
//! file, `stage/dense_mlp.rs` (`DenseMlp`, `DenseMlp::new`, `DenseMlp::emit`: its operands
//! by kind, its chunk stream through the shared `ExpertRing`, which takes its codes and
//! scales as `RingWeights` whatever the dtype), and three items of `emit.rs` (`Stages`,
//! `Stages::new`, `ffn`: the layer-kind dispatch); the expert stage, the ring and the
//! quantized path are not touched. Adding it now would touch, by a reading of the code
//! (not redone): `options.rs` (`Dims`), `layout.rs` (`Ffn`, `LayerFfns`, `OperandKind`,
//! `StreamLayout`), `plan.rs` (the 13 items above), `shard.rs` (`split`), `source.rs`
//! (`Share`, `Share::of`, `blocks`, `ffn`, `Role::shape`, `tensor_name`),
//! `stage/dense_mlp.rs` (new: 3), `emit.rs` (3), `report.rs` (`text`, `layer_kinds`),
//! `unfused.rs` (`unfused_kernels`) and `pack.rs` (`tensor_name`): 10 files and 35
//! functions and types, 6 of them on the emit side (against 8 there before), against the 8
//! files and 41 above and the 17 and 30. What is still spread: the plan's dims, layout, traffic and HBM arithmetic
//! (`plan.rs`), and the scratch, declared once in `scratch.rs` in the kernel's order
//! rather than in each stage's file (a stage takes its buffers there by key).
//!
//! The table says what each weight operand holds; the exact per-element mapping from the
//! checkpoint's tensors (transposes, fusion, folding, padding, quantized codes and scales,
//! each device's slice) is the operand's source map, [`source::source_maps`], the one
//! truth: the packer fills the arrays from it and [`report::operand_source`] prints it for
//! every operand.
//! Numerics differ from Hugging Face in two documented ways: the residual stream stays f32,
//! and norm scales are folded into bf16 weights (one rounding of `w * g` instead of rounding
//! the scaled activations).

pub mod emit;
pub mod graph;
pub mod layout;
pub mod megakernel;
pub mod options;
pub mod plan;
pub mod report;
pub mod rewrite;
pub mod scratch;
pub mod shard;
pub mod source;
pub mod spmd;
pub mod stage;
pub mod unfused;
