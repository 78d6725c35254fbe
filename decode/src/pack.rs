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
//! Rounding: every weight is first rounded to bf16 (as transformers' bf16 model loads
//! it), a folded norm scale is multiplied in f32 (the product of two bf16 values is exact
//! in f32) and the product is rounded to bf16 once.

use palladium_fusion::layout::{OperandKind, SegmentKind};
use palladium_fusion::plan::Plan;
use palladium_array::{HostArray, round_bf16};
use palladium_model::ModelSpec;
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

/// Pack `weights` (of the model `spec`) for the megakernel of `plan`.
pub fn pack(spec: &ModelSpec, plan: &Plan, weights: &Weights) -> Result<Packed, PackError> {
    if weights.family() != spec.family {
        return Err(PackError::Layout(format!("weights of a {} model for a {} config", weights.family().model_type(), spec.family.model_type())));
    }
    let d = &plan.dims;
    let us = |x: u64| x as usize;
    let (h, hd, hp, heads, kvh) = (us(d.hidden), us(d.head_dim), us(d.head_pad), us(d.heads), us(d.kv_heads));
    let (vocab, experts, epad) = (us(d.vocab), us(d.experts), us(d.experts_pad));
    let layout = &plan.layout;
    let (l, n, cw) = (plan.layers, us(layout.per_layer), us(layout.chunk_cols));
    let (eb, ec, inter) = (us(layout.expert_block), us(layout.expert_chunks), us(d.intermediate));
    let names = ModelNames::new(spec)?;
    let shape_of = |kind: OperandKind| layout.operand(kind).map(|o| o.shape.iter().map(|&x| x as usize).collect::<Vec<_>>()).unwrap_or_default();

    let mut out_names = Vec::new();
    let mut arrays = Vec::new();

    // embed [ceil(V/16), 16, H]
    let emb = get(weights, &names.embed, &[vocab, h])?;
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
        let q = get(weights, &ln.q, &[heads * hd, h])?;
        let k = get(weights, &ln.k, &[kvh * hd, h])?;
        let v = get(weights, &ln.v, &[kvh * hd, h])?;
        let o = get(weights, &ln.o, &[h, heads * hd])?;
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
                        (q, head * hd + c)
                    } else if head < heads + kvh {
                        (k, (head - heads) * hd + c)
                    } else {
                        (v, (head - heads - kvh) * hd + c)
                    };
                    bf(w.data[row * h + i]) * bf(g1.data[i])
                }
                SegmentKind::OProj => {
                    let (head, c) = (s / hp, s % hp);
                    if c >= hd { 0.0 } else { bf(o.data[i * heads * hd + head * hd + c]) }
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
    let head = get(weights, &names.lm_head, &[vocab, h])?;
    let gf = get(weights, &names.final_norm, &[h])?;
    let lm_base = l * n * h * cw;
    for t in 0..vocab {
        let (c, j) = (t / cw, t % cw);
        for i in 0..h {
            ws[lm_base + (c * h + i) * cw + j] = bf(head.data[t * h + i]) * bf(gf.data[i]);
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
        for (ei, m) in ex.iter().enumerate() {
            let gate = get(weights, &m.gate, &[inter, h])?;
            let up = get(weights, &m.up, &[inter, h])?;
            let down = get(weights, &m.down, &[h, inter])?;
            for c in 0..ec {
                let base = ((li * experts + ei) * ec + c) * h * 3 * eb;
                for i in 0..h {
                    let g = bf(g2.data[i]);
                    let row = &mut wx[base + i * 3 * eb..base + (i + 1) * 3 * eb];
                    for j in 0..eb {
                        let col = c * eb + j;
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
