//! The host-side weight packer: [`palladium_model::weights::Weights`] (Hugging Face names,
//! `[out, in]` linear weights) → the megakernel's input arrays in operand order, exactly as
//! `palladium_fusion`'s operand interface and [`palladium_fusion::report::operand_source`] describe them.
//!
//! - `embed` `[ceil(V/16), 16, H]`: the embedding reshaped, zero rows past `V`.
//! - `w_stream` `[L*n + ceil(V/cw), H, cw]`: per layer the `[H, n*cw]` dense-stream matrix
//!   `D_l` cut into `n` column chunks, then `lm_head`'s chunks. Its segments and the chunk pieces come from the layout
//!   ([`palladium_fusion::layout::StreamLayout::segments`], [`palladium_fusion::layout::StreamLayout::pieces`]): q/k/v heads
//!   transposed with `input_layernorm` folded (`D[i, head*hp + c] = W[head*hd + c, i] *
//!   g[i]`), `o_proj` as is with each head's columns padded to `hp`, the router transposed
//!   with `post_attention_layernorm` folded and padded to `experts_pad` columns.
//!   `lm_head^T` (the embedding when tied) has `model.norm` folded.
//! - `w_experts` `[L, E, C, H, 3*block]`: each expert cut into `C` chunks of `block`
//!   intermediate columns, a chunk `[gate^T | up^T | down]` (gate and up with
//!   `post_attention_layernorm` folded), so one DMA fetches it.
//! - `head_norms` `f32[L, 8, hp]` (Qwen3): row 0 `q_norm`, row 1 `k_norm`.
//! - `k_cache`, `v_cache` `bf16[L, B, kv_heads, T, hp]`: zeros ([`Packed::empty_caches`]).
//!
//! On `N` devices ([`pack_device`]) each device's arrays have the per-device shapes of the
//! plan's layout and hold its share per [`palladium_fusion::shard`]: its query heads (and
//! their `o_proj` rows; padded heads zero) and KV heads, its `lm_head` vocabulary slice
//! (ids past `V` zero), its experts (EP; padded experts zero) or its slice of every
//! expert's intermediate columns (TP; padding zero); the router, norms and embedding whole.
//!
//! Rounding: every weight is first rounded to bf16 (as transformers' bf16 model loads
//! it), a folded norm scale is multiplied in f32 (the product of two bf16 values is exact
//! in f32) and the product is rounded to bf16 once.

use palladium_fusion::layout::{OperandKind, SegmentKind};
use palladium_fusion::plan::Plan;
use palladium_fusion::shard::ExpertSplit;
use palladium_array::{HostArray, round_bf16};
use palladium_model::ModelSpec;
use palladium_model::spec::FfnKind;
use palladium_model::weights::{FfnNames, ModelNames, Tensor, Weights, WeightsError};

/// Why weights could not be packed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackError {
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("weights: {0}")]
    Layout(String),
}

/// The megakernel's weight inputs (operand order, after the two scalar-prefetch arrays and
/// before the caches), with the operand each fills.
#[derive(Debug, Clone)]
pub struct Packed {
    pub operands: Vec<OperandKind>,
    pub arrays: Vec<HostArray>,
    /// Shape of each KV cache `[L, B, kv_heads, T, hp]`.
    pub cache_shape: Vec<usize>,
}

impl Packed {
    /// Two zero caches (K, V), as a fresh sequence starts.
    pub fn empty_caches(&self) -> (HostArray, HostArray) {
        let n: usize = self.cache_shape.iter().product();
        let z = vec![half_zero(); n];
        (HostArray::from_bf16(&self.cache_shape, &z), HostArray::from_bf16(&self.cache_shape, &z))
    }
}

fn half_zero() -> half::bf16 {
    half::bf16::ZERO
}

fn get<'w>(w: &'w Weights, name: &str, shape: &[usize]) -> Result<&'w Tensor, PackError> {
    let t = w.get(name).ok_or_else(|| WeightsError::Missing { path: "weights".into(), name: name.into(), expected: shape.to_vec() })?;
    if t.shape != shape {
        return Err(WeightsError::Shape { path: "weights".into(), name: name.into(), expected: shape.to_vec(), found: t.shape.clone() }.into());
    }
    Ok(t)
}

fn bf(x: f32) -> f32 {
    round_bf16(x)
}

/// Which global head, expert column, expert and vocabulary id each of a device's local
/// ones is (`None`: padding, zero weights); the identity on one device.
struct DeviceShare {
    me: usize,
    /// Global counts: query heads, KV heads, query heads per KV head, experts'
    /// intermediate, vocabulary.
    heads: usize,
    kv_heads: usize,
    group: usize,
    intermediate: usize,
    vocab: usize,
    experts: usize,
    /// Per device.
    heads_per_device: usize,
    kv_heads_per_device: usize,
    kv_replicas: usize,
    experts_per_device: usize,
    intermediate_per_device: usize,
    vocab_per_device: usize,
    expert_parallel: bool,
}

impl DeviceShare {
    fn new(spec: &ModelSpec, plan: &Plan, device: u64) -> Result<DeviceShare, PackError> {
        let d = &plan.dims;
        let us = |x: u64| x as usize;
        let global_heads = spec.attention.num_heads as usize;
        let global_kv = spec.attention.num_kv_heads as usize;
        let intermediate = match spec.layers.first().map(|layer| &layer.ffn) {
            Some(FfnKind::Moe(moe)) => moe.intermediate as usize,
            _ => return Err(PackError::Layout("the model's first layer is not an MoE layer".into())),
        };
        let one = DeviceShare {
            me: 0,
            heads: global_heads,
            kv_heads: global_kv,
            group: global_heads / global_kv,
            intermediate,
            vocab: spec.vocab_size as usize,
            experts: us(d.experts),
            heads_per_device: us(d.heads),
            kv_heads_per_device: us(d.kv_heads),
            kv_replicas: 1,
            experts_per_device: us(d.experts_per_device),
            intermediate_per_device: us(d.intermediate),
            vocab_per_device: us(d.vocab),
            expert_parallel: true,
        };
        match &plan.sharding {
            None if device == 0 => Ok(one),
            Some(sh) if device < sh.devices => Ok(DeviceShare { me: device as usize, kv_replicas: us(sh.heads.kv_replicas), expert_parallel: sh.experts.split == ExpertSplit::Ep, ..one }),
            _ => Err(PackError::Layout(format!("device {device} is not one of the plan's {}", plan.sharding.as_ref().map_or(1, |sh| sh.devices)))),
        }
    }

    /// The global query head of local head `local`: a device's heads are its KV heads'
    /// groups (split), or its slice of its one KV head's padded group (replicated).
    fn q_head(&self, local: usize) -> Option<usize> {
        if self.kv_replicas == 1 {
            return Some(self.me * self.heads_per_device + local);
        }
        let j = (self.me % self.kv_replicas) * self.heads_per_device + local;
        (j < self.group).then(|| self.kv_head(0) * self.group + j)
    }

    fn kv_head(&self, local: usize) -> usize {
        match self.kv_replicas {
            1 => self.me * self.kv_heads_per_device + local,
            r => self.me / r,
        }
    }

    fn expert(&self, local: usize) -> Option<usize> {
        let g = if self.expert_parallel { self.me * self.experts_per_device + local } else { local };
        (g < self.experts).then_some(g)
    }

    fn expert_column(&self, local: usize) -> Option<usize> {
        let g = if self.expert_parallel { local } else { self.me * self.intermediate_per_device + local };
        (g < self.intermediate).then_some(g)
    }

    fn vocab_id(&self, local: usize) -> Option<usize> {
        let g = self.me * self.vocab_per_device + local;
        (local < self.vocab_per_device && g < self.vocab).then_some(g)
    }
}

/// Pack `weights` (of the model `spec`) for the one-device megakernel of `plan`.
pub fn pack(spec: &ModelSpec, plan: &Plan, weights: &Weights) -> Result<Packed, PackError> {
    pack_device(spec, plan, weights, 0)
}

/// Pack `weights` for device `device` of the megakernel of `plan` (its share of a sharded
/// plan; on one device, device 0 is [`pack`]).
pub fn pack_device(spec: &ModelSpec, plan: &Plan, weights: &Weights, device: u64) -> Result<Packed, PackError> {
    if weights.family() != spec.family {
        return Err(PackError::Layout(format!("weights of a {} model for a {} config", weights.family().model_type(), spec.family.model_type())));
    }
    let share = DeviceShare::new(spec, plan, device)?;
    let d = &plan.dims;
    let us = |x: u64| x as usize;
    let (h, hd, hp, heads, kvh) = (us(d.hidden), us(d.head_dim), us(d.head_pad), us(d.heads), us(d.kv_heads));
    let (vocab, experts, epad) = (us(d.vocab), us(d.experts), us(d.experts_pad));
    let (global_heads, global_kv) = (share.heads, share.kv_heads);
    let layout = &plan.layout;
    let (l, n, cw) = (plan.layers, us(layout.per_layer), us(layout.chunk_cols));
    let (eb, ec, inter) = (us(layout.expert_block), us(layout.expert_chunks), share.intermediate);
    let names = ModelNames::new(spec)?;
    let shape_of = |kind: OperandKind| layout.operand(kind).map(|o| o.shape.iter().map(|&x| x as usize).collect::<Vec<_>>()).unwrap_or_default();

    let mut out_names = Vec::new();
    let mut arrays = Vec::new();

    // embed [ceil(V/16), 16, H]
    let emb = get(weights, &names.embed, &[share.vocab, h])?;
    let es = shape_of(OperandKind::Embed);
    let mut e = vec![0f32; es.iter().product()];
    for (dst, &src) in e.iter_mut().zip(&emb.data) {
        *dst = bf(src);
    }
    out_names.push(OperandKind::Embed);
    arrays.push(HostArray::bf16_from_f32(&es, &e));

    // w_stream [L*n + lm, H, cw]: the layers' chunks, then lm_head's.
    let ss = shape_of(OperandKind::WStream);
    let mut ws = vec![0f32; ss.iter().product()];
    for (li, ln) in names.layers.iter().take(l).enumerate() {
        let g1 = get(weights, &ln.input_norm, &[h])?;
        let g2 = get(weights, &ln.post_norm, &[h])?;
        let q = get(weights, &ln.q, &[global_heads * hd, h])?;
        let k = get(weights, &ln.k, &[global_kv * hd, h])?;
        let v = get(weights, &ln.v, &[global_kv * hd, h])?;
        let o = get(weights, &ln.o, &[h, global_heads * hd])?;
        let FfnNames::Moe { router, .. } = &ln.ffn else {
            return Err(PackError::Layout(format!("layer {li} is not an MoE layer")));
        };
        let r = get(weights, router, &[experts, h])?;
        // Value of column `s` of segment `seg`, row (hidden index) `i`.
        let value = |seg: SegmentKind, s: usize, i: usize| -> f32 {
            match seg {
                SegmentKind::Qkv => {
                    let (head, c) = (s / hp, s % hp);
                    if c >= hd {
                        return 0.0;
                    }
                    let (w, row) = if head < heads {
                        match share.q_head(head) {
                            Some(g) => (q, g * hd + c),
                            None => return 0.0,
                        }
                    } else if head < heads + kvh {
                        (k, share.kv_head(head - heads) * hd + c)
                    } else {
                        (v, share.kv_head(head - heads - kvh) * hd + c)
                    };
                    bf(w.data[row * h + i]) * bf(g1.data[i])
                }
                SegmentKind::OProj => {
                    let (head, c) = (s / hp, s % hp);
                    match share.q_head(head) {
                        Some(g) if c < hd => bf(o.data[i * global_heads * hd + g * hd + c]),
                        _ => 0.0,
                    }
                }
                SegmentKind::Router => {
                    if s >= experts { 0.0 } else { bf(r.data[s * h + i]) * bf(g2.data[i]) }
                }
            }
        };
        for ci in 0..n {
            let base = (li * n + ci) * h * cw;
            for p in layout.pieces(ci as u64) {
                let seg = p.segment;
                for j in 0..us(p.cols) {
                    let s = us(p.seg_col) + j;
                    let col = us(p.chunk_col) + j;
                    for i in 0..h {
                        ws[base + i * cw + col] = value(seg, s, i);
                    }
                }
            }
        }
        debug_assert!(layout.segment(SegmentKind::Router).is_some_and(|s| us(s.cols) == epad));
    }
    let head = get(weights, &names.lm_head, &[share.vocab, h])?;
    let gf = get(weights, &names.final_norm, &[h])?;
    let lm_base = l * n * h * cw;
    for t in 0..vocab {
        let Some(g) = share.vocab_id(t) else {
            continue;
        };
        let (c, j) = (t / cw, t % cw);
        for i in 0..h {
            ws[lm_base + (c * h + i) * cw + j] = bf(head.data[g * h + i]) * bf(gf.data[i]);
        }
    }
    out_names.push(OperandKind::WStream);
    arrays.push(HostArray::bf16_from_f32(&ss, &ws));

    // w_experts [L, E, C, H, 3*eb]: gate | up (norm folded) | down columns
    let xs = shape_of(OperandKind::WExperts);
    let mut wx = vec![0f32; xs.iter().product()];
    for (li, ln) in names.layers.iter().take(l).enumerate() {
        let g2 = get(weights, &ln.post_norm, &[h])?;
        let FfnNames::Moe { experts: ex, .. } = &ln.ffn else {
            return Err(PackError::Layout(format!("layer {li} is not an MoE layer")));
        };
        for el in 0..share.experts_per_device {
            let Some(m) = share.expert(el).map(|g| &ex[g]) else {
                continue;
            };
            let gate = get(weights, &m.gate, &[inter, h])?;
            let up = get(weights, &m.up, &[inter, h])?;
            let down = get(weights, &m.down, &[h, inter])?;
            for c in 0..ec {
                let base = ((li * share.experts_per_device + el) * ec + c) * h * 3 * eb;
                for i in 0..h {
                    let g = bf(g2.data[i]);
                    let row = &mut wx[base + i * 3 * eb..base + (i + 1) * 3 * eb];
                    for j in 0..eb {
                        let Some(col) = share.expert_column(c * eb + j) else {
                            continue;
                        };
                        row[j] = bf(gate.data[col * h + i]) * g;
                        row[eb + j] = bf(up.data[col * h + i]) * g;
                        row[2 * eb + j] = bf(down.data[i * inter + col]);
                    }
                }
            }
        }
    }
    out_names.push(OperandKind::WExperts);
    arrays.push(HostArray::bf16_from_f32(&xs, &wx));

    // head_norms f32[L, 8, hp]
    if d.qk_norm {
        let hs = shape_of(OperandKind::HeadNorms);
        let mut hn = vec![0f32; hs.iter().product()];
        for (li, ln) in names.layers.iter().take(l).enumerate() {
            for (row, name) in [ln.q_norm.as_ref(), ln.k_norm.as_ref()].into_iter().enumerate() {
                let name = name.ok_or_else(|| PackError::Layout(format!("layer {li}: no q/k norm names")))?;
                let t = get(weights, name, &[hd])?;
                for c in 0..hd {
                    hn[(li * 8 + row) * hp + c] = bf(t.data[c]);
                }
            }
        }
        out_names.push(OperandKind::HeadNorms);
        arrays.push(HostArray::from_f32(&hs, &hn));
    }
    Ok(Packed { operands: out_names, arrays, cache_shape: shape_of(OperandKind::KCache) })
}
