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
//!   Where dense-MLP layers sit among the MoE layers (Qwen3-MoE's `mlp_only_layers` /
//!   `decoder_sparse_step`), `L` counts the MoE layers only, and
//! - `w_mlp` `[L_dense, C_d, H, 3*block]` holds each dense-MLP layer's MLP cut as an
//!   expert is (one chunk helper packs both); those layers' router columns in `w_stream`
//!   are zero.
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
//!
//! Quantized weights ([`pack_quantized`], a plan with a
//! [`palladium_fusion::layout::QuantLayout`]): the codes and scales of
//! [`palladium_model::quant::QuantizedWeights`] are shipped unchanged, laid out as the bf16
//! arrays above but with NO norm folded (the kernel applies every RMSNorm weight from the
//! `norms` operand): the quantized tensor is the checkpoint's own weight (quantized at load,
//! or an FP8 checkpoint's as it ships), so the reference forward pass on
//! [`palladium_model::quant::QuantizedWeights::dequantize`] computes what the kernel does.

use palladium_array::quant::f32_to_e4m3fn_saturating;
use palladium_array::{DType, HostArray, round_bf16};
use palladium_fusion::layout::{CodeFormat, OperandKind, SegmentKind};
use palladium_fusion::plan::Plan;
use palladium_fusion::shard::ExpertSplit;
use palladium_model::ModelSpec;
use palladium_model::quant::{
    FP8_BLOCK, INT4_GROUP, QuantFormat, QuantizedTensor, QuantizedWeights, StoredTensor,
};
use palladium_model::spec::FfnKind;
use palladium_model::weights::{FfnNames, MlpNames, ModelNames, Tensor, Weights, WeightsError};

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
    let t = w.get(name).ok_or_else(|| WeightsError::Missing {
        path: "weights".into(),
        name: name.into(),
        expected: shape.to_vec(),
    })?;
    if t.shape != shape {
        return Err(WeightsError::Shape {
            path: "weights".into(),
            name: name.into(),
            expected: shape.to_vec(),
            found: t.shape.clone(),
        }
        .into());
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
    /// intermediate, dense-MLP layers' intermediate (0 without such layers), vocabulary.
    heads: usize,
    kv_heads: usize,
    group: usize,
    intermediate: usize,
    dense_intermediate: usize,
    vocab: usize,
    experts: usize,
    /// Per device.
    heads_per_device: usize,
    kv_heads_per_device: usize,
    kv_replicas: usize,
    experts_per_device: usize,
    intermediate_per_device: usize,
    dense_intermediate_per_device: usize,
    vocab_per_device: usize,
    expert_parallel: bool,
}

impl DeviceShare {
    fn new(spec: &ModelSpec, plan: &Plan, device: u64) -> Result<DeviceShare, PackError> {
        let d = &plan.dims;
        let us = |x: u64| x as usize;
        let global_heads = spec.attention.num_heads as usize;
        let global_kv = spec.attention.num_kv_heads as usize;
        let ffn = |moe: bool| {
            spec.layers.iter().find_map(|layer| match (&layer.ffn, moe) {
                (FfnKind::Moe(m), true) => Some(m.intermediate as usize),
                (FfnKind::Dense { intermediate }, false) => Some(*intermediate as usize),
                _ => None,
            })
        };
        let Some(intermediate) = ffn(true) else {
            return Err(PackError::Layout("the model has no MoE layer".into()));
        };
        let one = DeviceShare {
            me: 0,
            heads: global_heads,
            kv_heads: global_kv,
            group: global_heads / global_kv,
            intermediate,
            dense_intermediate: ffn(false).unwrap_or(0),
            vocab: spec.vocab_size as usize,
            experts: us(d.experts),
            heads_per_device: us(d.heads),
            kv_heads_per_device: us(d.kv_heads),
            kv_replicas: 1,
            experts_per_device: us(d.experts_per_device),
            intermediate_per_device: us(d.intermediate),
            dense_intermediate_per_device: us(d.dense_intermediate.unwrap_or(0)),
            vocab_per_device: us(d.vocab),
            expert_parallel: true,
        };
        match &plan.sharding {
            None if device == 0 => Ok(one),
            Some(sh) if device < sh.devices => Ok(DeviceShare {
                me: device as usize,
                kv_replicas: us(sh.heads.kv_replicas),
                expert_parallel: sh.experts.split == ExpertSplit::Ep,
                ..one
            }),
            _ => Err(PackError::Layout(format!(
                "device {device} is not one of the plan's {}",
                plan.sharding.as_ref().map_or(1, |sh| sh.devices)
            ))),
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
        let g =
            if self.expert_parallel { self.me * self.experts_per_device + local } else { local };
        (g < self.experts).then_some(g)
    }

    fn expert_column(&self, local: usize) -> Option<usize> {
        let g = if self.expert_parallel {
            local
        } else {
            self.me * self.intermediate_per_device + local
        };
        (g < self.intermediate).then_some(g)
    }

    /// The model's dense-MLP intermediate column of local column `local`: every device
    /// holds a slice (TP), whichever split the experts take.
    fn mlp_column(&self, local: usize) -> Option<usize> {
        let g = self.me * self.dense_intermediate_per_device + local;
        (g < self.dense_intermediate).then_some(g)
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

/// Every device's share of `weights` for the megakernel of `plan`, in device order (one
/// [`Packed`], [`pack`]'s, when the plan is not split): what [`crate::Decoder::new`] takes.
pub fn pack_devices(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &Weights,
) -> Result<Vec<Packed>, PackError> {
    (0..plan.sharding.as_ref().map_or(1, |sh| sh.devices))
        .map(|me| pack_device(spec, plan, weights, me))
        .collect()
}

/// Pack `weights` for device `device` of the megakernel of `plan` (its share of a sharded
/// plan; on one device, device 0 is [`pack`]).
pub fn pack_device(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &Weights,
    device: u64,
) -> Result<Packed, PackError> {
    if weights.family() != spec.family {
        return Err(PackError::Layout(format!(
            "weights of a {} model for a {} config",
            weights.family().model_type(),
            spec.family.model_type()
        )));
    }
    let share = DeviceShare::new(spec, plan, device)?;
    let d = &plan.dims;
    let us = |x: u64| x as usize;
    let (h, hd, hp, heads, kvh) =
        (us(d.hidden), us(d.head_dim), us(d.head_pad), us(d.heads), us(d.kv_heads));
    let (vocab, experts, epad) = (us(d.vocab), us(d.experts), us(d.experts_pad));
    let (global_heads, global_kv) = (share.heads, share.kv_heads);
    let layout = &plan.layout;
    let (l, n, cw) = (plan.layers, us(layout.per_layer), us(layout.chunk_cols));
    let (eb, ec, inter) = (us(layout.expert_block), us(layout.expert_chunks), share.intermediate);
    let names = ModelNames::new(spec)?;
    let shape_of = |kind: OperandKind| {
        layout
            .operand(kind)
            .map(|o| o.shape.iter().map(|&x| x as usize).collect::<Vec<_>>())
            .unwrap_or_default()
    };

    let mut out_names = Vec::new();
    let mut arrays = Vec::new();

    out_names.push(OperandKind::Embed);
    arrays.push(pack_embed(
        get(weights, &names.embed, &[share.vocab, h])?,
        &shape_of(OperandKind::Embed),
    ));

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
        // A dense-MLP layer's router columns are zero.
        let r = match &ln.ffn {
            FfnNames::Moe { router, .. } => Some(get(weights, router, &[experts, h])?),
            FfnNames::Dense(_) => None,
        };
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
                SegmentKind::Router => match r {
                    Some(r) if s < experts => bf(r.data[s * h + i]) * bf(g2.data[i]),
                    _ => 0.0,
                },
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

    // w_experts [L, E, C, H, 3*eb] (the MoE layers): gate | up (norm folded) | down columns
    let xs = shape_of(OperandKind::WExperts);
    let mut wx = vec![0f32; xs.iter().product()];
    let moe_layers =
        names.layers.iter().take(l).filter(|ln| matches!(ln.ffn, FfnNames::Moe { .. }));
    for (slot, ln) in moe_layers.enumerate() {
        let g2 = get(weights, &ln.post_norm, &[h])?;
        let FfnNames::Moe { experts: ex, .. } = &ln.ffn else {
            unreachable!("filtered to the MoE layers");
        };
        for el in 0..share.experts_per_device {
            let Some(m) = share.expert(el).map(|g| &ex[g]) else {
                continue;
            };
            let size = (eb * 3 * h) * ec;
            let at = (slot * share.experts_per_device + el) * size;
            let mlp = MlpTensors::get(weights, m, inter, h)?;
            mlp.pack_chunks(&mut wx[at..at + size], g2, eb, |x| share.expert_column(x));
        }
    }
    out_names.push(OperandKind::WExperts);
    arrays.push(HostArray::bf16_from_f32(&xs, &wx));

    // w_mlp [L_dense, C_d, H, 3*eb] (dense-MLP layers among MoE layers): as an expert.
    if layout.operand(OperandKind::WMlp).is_some() {
        let ms = shape_of(OperandKind::WMlp);
        let mut wm = vec![0f32; ms.iter().product()];
        let size = ms[1..].iter().product::<usize>();
        let dense_layers = names.layers.iter().take(l).filter_map(|ln| match &ln.ffn {
            FfnNames::Dense(m) => Some((ln, m)),
            FfnNames::Moe { .. } => None,
        });
        for (slot, (ln, m)) in dense_layers.enumerate() {
            let g2 = get(weights, &ln.post_norm, &[h])?;
            let mlp = MlpTensors::get(weights, m, share.dense_intermediate, h)?;
            mlp.pack_chunks(&mut wm[slot * size..(slot + 1) * size], g2, eb, |x| {
                share.mlp_column(x)
            });
        }
        out_names.push(OperandKind::WMlp);
        arrays.push(HostArray::bf16_from_f32(&ms, &wm));
    }

    if d.qk_norm {
        out_names.push(OperandKind::HeadNorms);
        arrays.push(pack_head_norms(
            &names,
            l,
            hd,
            hp,
            &shape_of(OperandKind::HeadNorms),
            |name| get(weights, name, &[hd]),
        )?);
    }
    Ok(Packed { operands: out_names, arrays, cache_shape: shape_of(OperandKind::KCache) })
}

/// One gated MLP's bf16 weights (an expert's, or a dense-MLP layer's), `[out, in]`.
struct MlpTensors<'w> {
    gate: &'w Tensor,
    up: &'w Tensor,
    down: &'w Tensor,
    intermediate: usize,
    hidden: usize,
}

impl<'w> MlpTensors<'w> {
    fn get(
        weights: &'w Weights,
        names: &MlpNames,
        intermediate: usize,
        hidden: usize,
    ) -> Result<Self, PackError> {
        Ok(MlpTensors {
            gate: get(weights, &names.gate, &[intermediate, hidden])?,
            up: get(weights, &names.up, &[intermediate, hidden])?,
            down: get(weights, &names.down, &[hidden, intermediate])?,
            intermediate,
            hidden,
        })
    }

    /// The MLP's chunks `[C, H, 3*block]` into `out`: chunk `c` row `i` is `[gate^T | up^T |
    /// down]` over the local intermediate columns `c*block..(c+1)*block` (gate and up with
    /// the post-attention norm `g2` folded); `column` maps a local column to the model's
    /// (`None`: padding, left zero).
    fn pack_chunks(
        &self,
        out: &mut [f32],
        g2: &Tensor,
        block: usize,
        column: impl Fn(usize) -> Option<usize>,
    ) {
        let (h, inter) = (self.hidden, self.intermediate);
        for (c, chunk) in out.chunks_mut(h * 3 * block).enumerate() {
            for i in 0..h {
                let g = bf(g2.data[i]);
                let row = &mut chunk[i * 3 * block..(i + 1) * 3 * block];
                for j in 0..block {
                    let Some(col) = column(c * block + j) else {
                        continue;
                    };
                    row[j] = bf(self.gate.data[col * h + i]) * g;
                    row[block + j] = bf(self.up.data[col * h + i]) * g;
                    row[2 * block + j] = bf(self.down.data[i * inter + col]);
                }
            }
        }
    }
}

/// `embed` `[ceil(V/16), 16, H]` bf16 from the embedding `[V, H]`.
fn pack_embed(emb: &Tensor, shape: &[usize]) -> HostArray {
    let mut e = vec![0f32; shape.iter().product()];
    for (dst, &src) in e.iter_mut().zip(&emb.data) {
        *dst = bf(src);
    }
    HostArray::bf16_from_f32(shape, &e)
}

/// `head_norms` f32 `[L, 8, hp]`: row 0 `q_norm`, row 1 `k_norm` of each layer.
fn pack_head_norms<'w>(
    names: &ModelNames,
    layers: usize,
    hd: usize,
    hp: usize,
    shape: &[usize],
    get: impl Fn(&str) -> Result<&'w Tensor, PackError>,
) -> Result<HostArray, PackError> {
    let mut hn = vec![0f32; shape.iter().product()];
    for (li, ln) in names.layers.iter().take(layers).enumerate() {
        for (row, name) in [ln.q_norm.as_ref(), ln.k_norm.as_ref()].into_iter().enumerate() {
            let name =
                name.ok_or_else(|| PackError::Layout(format!("layer {li}: no q/k norm names")))?;
            let t = get(name)?;
            for c in 0..hd {
                hn[(li * 8 + row) * hp + c] = bf(t.data[c]);
            }
        }
    }
    Ok(HostArray::from_f32(shape, &hn))
}

/// The [`QuantFormat`] a weight in kernel format `f` must be stored in.
fn stored_format(f: CodeFormat) -> QuantFormat {
    match (f.codes, f.group) {
        (DType::F8E4M3, _) => QuantFormat::Fp8Block { block: FP8_BLOCK },
        (DType::I4, _) => QuantFormat::Int4Group { group: INT4_GROUP },
        _ => QuantFormat::Int8PerChannel,
    }
}

/// A tensor kept as loaded (norms, router, embedding, a bf16 `lm_head`), of shape `shape`.
fn plain<'w>(
    w: &'w QuantizedWeights,
    name: &str,
    shape: &[usize],
) -> Result<&'w Tensor, PackError> {
    match w.get(name) {
        Some(StoredTensor::Plain(t)) if t.shape == shape => Ok(t),
        Some(StoredTensor::Plain(t)) => Err(WeightsError::Shape {
            path: "weights".into(),
            name: name.into(),
            expected: shape.to_vec(),
            found: t.shape.clone(),
        }
        .into()),
        Some(StoredTensor::Quantized(q)) => Err(PackError::Layout(format!(
            "tensor \"{name}\" is quantized ({}), the {} kernel takes it unquantized",
            q.format.name(),
            w.dtype().name()
        ))),
        None => Err(WeightsError::Missing {
            path: "weights".into(),
            name: name.into(),
            expected: shape.to_vec(),
        }
        .into()),
    }
}

/// A tensor quantized as `format` (`[out, in]` = `shape`).
fn codes<'w>(
    w: &'w QuantizedWeights,
    name: &str,
    shape: [usize; 2],
    format: QuantFormat,
) -> Result<&'w QuantizedTensor, PackError> {
    match w.get(name) {
        Some(StoredTensor::Quantized(q)) if q.shape == shape && q.format == format => Ok(q),
        Some(StoredTensor::Quantized(q)) => Err(PackError::Layout(format!(
            "tensor \"{name}\": {} {:?}, the {} kernel takes {} {shape:?}",
            q.format.name(),
            q.shape,
            w.dtype().name(),
            format.name()
        ))),
        Some(StoredTensor::Plain(_)) => Err(PackError::Layout(format!(
            "tensor \"{name}\" is not quantized, the {} kernel takes it as {}",
            w.dtype().name(),
            format.name()
        ))),
        None => Err(WeightsError::Missing {
            path: "weights".into(),
            name: name.into(),
            expected: shape.to_vec(),
        }
        .into()),
    }
}

/// Pack quantized `weights` for the one-device megakernel of a quantized `plan` (see the
/// module docs).
pub fn pack_quantized(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &QuantizedWeights,
) -> Result<Packed, PackError> {
    pack_quantized_device(spec, plan, weights, 0)
}

/// [`pack_devices`] for quantized `weights`: every device's share, in device order.
pub fn pack_quantized_devices(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &QuantizedWeights,
) -> Result<Vec<Packed>, PackError> {
    (0..plan.sharding.as_ref().map_or(1, |sh| sh.devices))
        .map(|me| pack_quantized_device(spec, plan, weights, me))
        .collect()
}

/// Pack quantized `weights` for device `device` of the megakernel of a quantized `plan`: its
/// share as [`pack_device`]'s, each code with its own scale. Scales are looked up by the
/// model's row and column of each local one, so a split keeps every code's scale: q/k/v,
/// `lm_head` and TP's gate/up split output channels; `o_proj` (by heads) and TP's
/// `down_proj` split inputs, and a group of the kernel's inputs (one padded head; 128 of a
/// device's intermediate columns, which TP pads to a multiple of 128) lies in one of the
/// checkpoint's groups.
pub fn pack_quantized_device(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &QuantizedWeights,
    device: u64,
) -> Result<Packed, PackError> {
    let layout = &plan.layout;
    let Some(q) = layout.quant else {
        return Err(PackError::Layout(
            "quantized weights for a bf16 megakernel (plan it with the weights' dtype)".into(),
        ));
    };
    if q.scheme != weights.dtype().name() {
        return Err(PackError::Layout(format!(
            "{} weights for a {} megakernel",
            weights.dtype().name(),
            q.scheme
        )));
    }
    let share = DeviceShare::new(spec, plan, device)?;
    let d = &plan.dims;
    let us = |x: u64| x as usize;
    let (h, hd, hp, heads, kvh) =
        (us(d.hidden), us(d.head_dim), us(d.head_pad), us(d.heads), us(d.kv_heads));
    let (vocab, experts, epad) = (us(d.vocab), us(d.experts), us(d.experts_pad));
    // The model's sizes (the dims are one device's).
    let (global_heads, global_kv, global_vocab, inter) =
        (share.heads, share.kv_heads, share.vocab, share.intermediate);
    let (l, n, cw, eb, ec) = (
        plan.layers,
        us(layout.per_layer),
        us(layout.chunk_cols),
        us(layout.expert_block),
        us(layout.expert_chunks),
    );
    let names = ModelNames::new(spec)?;
    let shape_of = |kind: OperandKind| {
        layout
            .operand(kind)
            .map(|o| o.shape.iter().map(|&x| x as usize).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let array = |kind: OperandKind, data: &[f32]| {
        let o = layout.operand(kind).expect("a quantized plan's operand");
        let shape = shape_of(kind);
        let made = match o.dtype {
            DType::I8 | DType::I4 => HostArray::from_i32_values(
                o.dtype,
                &shape,
                &data.iter().map(|&x| x as i32).collect::<Vec<_>>(),
            ),
            DType::F8E4M3 => HostArray::new(
                o.dtype,
                &shape,
                data.iter().map(|&x| f32_to_e4m3fn_saturating(x)).collect(),
            ),
            dtype => HostArray::from_f32_values(dtype, &shape, data),
        };
        made.map_err(|e| PackError::Layout(format!("{}: {e}", kind.name())))
    };
    let (dense_format, expert_format) = (stored_format(q.dense), stored_format(q.experts));
    let (nq, nqkv) = (heads * hp, (heads + 2 * kvh) * hp);
    let (qkv_group, o_group) = (us(q.dense.group_of(d.hidden)), us(q.dense.group_of(nq as u64)));
    let (in_group, down_group) =
        (us(q.experts.group_of(d.hidden)), us(q.experts.group_of(d.intermediate)));
    let mut out: Vec<(OperandKind, HostArray)> = vec![(
        OperandKind::Embed,
        pack_embed(
            plain(weights, &names.embed, &[global_vocab, h])?,
            &shape_of(OperandKind::Embed),
        ),
    )];

    let (ss, qs, os, rs, ns) = (
        shape_of(OperandKind::WStream),
        shape_of(OperandKind::QkvScales),
        shape_of(OperandKind::OScales),
        shape_of(OperandKind::Router),
        shape_of(OperandKind::Norms),
    );
    let (mut ws, mut qsc, mut osc) = (
        vec![0f32; ss.iter().product()],
        vec![0f32; qs.iter().product()],
        vec![0f32; os.iter().product()],
    );
    let (mut router, mut norms) =
        (vec![0f32; rs.iter().product()], vec![0f32; ns.iter().product()]);
    let (qrows, orows) = (qs[1], os[1]);
    for (li, ln) in names.layers.iter().take(l).enumerate() {
        for (row, name) in [&ln.input_norm, &ln.post_norm].into_iter().enumerate() {
            let g = plain(weights, name, &[h])?;
            for i in 0..h {
                norms[(li * 8 + row) * h + i] = bf(g.data[i]);
            }
        }
        // A dense-MLP layer's router rows stay zero.
        if let FfnNames::Moe { router: router_name, .. } = &ln.ffn {
            let r = plain(weights, router_name, &[experts, h])?;
            for i in 0..h {
                for e in 0..experts {
                    router[(li * h + i) * epad + e] = bf(r.data[e * h + i]);
                }
            }
        }
        let qw = codes(weights, &ln.q, [global_heads * hd, h], dense_format)?;
        let kw = codes(weights, &ln.k, [global_kv * hd, h], dense_format)?;
        let vw = codes(weights, &ln.v, [global_kv * hd, h], dense_format)?;
        let ow = codes(weights, &ln.o, [h, global_heads * hd], dense_format)?;
        // q/k/v column `s` (a padded head column of the device's heads): its weight and the
        // model's row, none in the padding (columns, or zero-weight heads).
        let qkv_row = |s: usize| -> Option<(&QuantizedTensor, usize)> {
            let (head, c) = (s / hp, s % hp);
            if c >= hd {
                return None;
            }
            if head < heads {
                share.q_head(head).map(|g| (qw, g * hd + c))
            } else if head < heads + kvh {
                Some((kw, share.kv_head(head - heads) * hd + c))
            } else {
                Some((vw, share.kv_head(head - heads - kvh) * hd + c))
            }
        };
        // o_proj's padded input column `s`: the model's input, none in the padding.
        let o_input = |s: usize| -> Option<usize> {
            if s % hp < hd { share.q_head(s / hp).map(|g| g * hd + s % hp) } else { None }
        };
        for ci in 0..n {
            let base = (li * n + ci) * h * cw;
            for p in layout.pieces(ci as u64) {
                for j in 0..us(p.cols) {
                    let (s, col) = (us(p.seg_col) + j, us(p.chunk_col) + j);
                    for i in 0..h {
                        ws[base + i * cw + col] = match p.segment {
                            SegmentKind::Qkv => qkv_row(s).map_or(0.0, |(w, row)| w.code(row, i)),
                            SegmentKind::OProj => o_input(s).map_or(0.0, |c| ow.code(i, c)),
                            SegmentKind::Router => {
                                return Err(PackError::Layout(
                                    "a quantized dense stream has no router segment".into(),
                                ));
                            }
                        };
                    }
                }
            }
        }
        for g in 0..qrows {
            for s in 0..nqkv {
                qsc[(li * qrows + g) * nqkv + s] =
                    qkv_row(s).map_or(0.0, |(w, row)| w.scale(row, g * qkv_group));
            }
        }
        for g in 0..orows {
            // A group of padded inputs lies in one of the checkpoint's groups (the plan checks
            // head_dim for fp8): its first real input's scale.
            let Some(c) = o_input(g * o_group) else { continue };
            for i in 0..h {
                osc[(li * orows + g) * h + i] = ow.scale(i, c);
            }
        }
    }
    let gf = plain(weights, &names.final_norm, &[h])?;
    for i in 0..h {
        norms[l * 8 * h + i] = bf(gf.data[i]);
    }
    out.extend([
        (OperandKind::WStream, array(OperandKind::WStream, &ws)?),
        (OperandKind::QkvScales, array(OperandKind::QkvScales, &qsc)?),
        (OperandKind::OScales, array(OperandKind::OScales, &osc)?),
    ]);
    out.extend([
        (OperandKind::Router, array(OperandKind::Router, &router)?),
        (OperandKind::Norms, array(OperandKind::Norms, &norms)?),
    ]);

    // lm_head [lm, H, cw] (codes, or bf16) and its scales [lm, 1, cw].
    let lms = shape_of(OperandKind::LmHead);
    let mut lm = vec![0f32; lms.iter().product()];
    match q.lm_head {
        Some(f) => {
            let head = codes(weights, &names.lm_head, [global_vocab, h], stored_format(f))?;
            let mut sc = vec![0f32; shape_of(OperandKind::LmScales).iter().product()];
            for t in 0..vocab {
                let Some(g) = share.vocab_id(t) else { continue };
                let (c, j) = (t / cw, t % cw);
                for i in 0..h {
                    lm[(c * h + i) * cw + j] = head.code(g, i);
                }
                sc[c * cw + j] = head.scale(g, 0);
            }
            out.extend([
                (OperandKind::LmHead, array(OperandKind::LmHead, &lm)?),
                (OperandKind::LmScales, array(OperandKind::LmScales, &sc)?),
            ]);
        }
        None => {
            let head = plain(weights, &names.lm_head, &[global_vocab, h])?;
            for t in 0..vocab {
                let Some(g) = share.vocab_id(t) else { continue };
                let (c, j) = (t / cw, t % cw);
                for i in 0..h {
                    lm[(c * h + i) * cw + j] = bf(head.data[g * h + i]);
                }
            }
            out.push((OperandKind::LmHead, array(OperandKind::LmHead, &lm)?));
        }
    }

    // w_experts [L, E, C, H, 3*eb] codes; scales [L, E, C, in rows, 2*eb] and [L, E, C, down rows, H].
    let (xs, xss, xds) = (
        shape_of(OperandKind::WExperts),
        shape_of(OperandKind::ExpertScales),
        shape_of(OperandKind::ExpertDownScales),
    );
    let (mut wx, mut xsc, mut xdsc) = (
        vec![0f32; xs.iter().product()],
        vec![0f32; xss.iter().product()],
        vec![0f32; xds.iter().product()],
    );
    // The down scales' operand rows are padded for the DMA (`CodeFormat::dma_scale_rows`).
    let (in_rows, down_stride) = (xss[3], xds[3]);
    let expert_chunks = MlpChunks {
        h,
        block: eb,
        in_rows,
        in_group,
        down_rows: us(q.experts.scale_rows(layout.expert_block, d.intermediate)),
        down_group,
        down_stride,
    };
    let moe_layers =
        names.layers.iter().take(l).filter(|ln| matches!(ln.ffn, FfnNames::Moe { .. }));
    for (slot, ln) in moe_layers.enumerate() {
        let FfnNames::Moe { experts: ex, .. } = &ln.ffn else {
            unreachable!("filtered to the MoE layers");
        };
        for el in 0..share.experts_per_device {
            // Padding experts (EP) stay zero, codes and scales.
            let Some(m) = share.expert(el).map(|g| &ex[g]) else { continue };
            let mlp = QuantizedMlp::get(weights, m, inter, h, expert_format)?;
            let item = (slot * share.experts_per_device + el) * ec;
            expert_chunks
                .pack(&mlp, ec, item, (&mut wx, &mut xsc, &mut xdsc), |x| share.expert_column(x));
        }
    }
    out.extend([
        (OperandKind::WExperts, array(OperandKind::WExperts, &wx)?),
        (OperandKind::ExpertScales, array(OperandKind::ExpertScales, &xsc)?),
        (OperandKind::ExpertDownScales, array(OperandKind::ExpertDownScales, &xdsc)?),
    ]);
    // w_mlp [L_dense, C_d, H, 3*eb] codes and their scales, as an expert's (dense-MLP
    // layers among MoE layers; the plan keeps them to the experts' code format).
    if layout.operand(OperandKind::WMlp).is_some() {
        let (ms, mss, mds) = (
            shape_of(OperandKind::WMlp),
            shape_of(OperandKind::MlpScales),
            shape_of(OperandKind::MlpDownScales),
        );
        let (mut wm, mut msc, mut mdsc) = (
            vec![0f32; ms.iter().product()],
            vec![0f32; mss.iter().product()],
            vec![0f32; mds.iter().product()],
        );
        let di = d.dense_intermediate.unwrap_or(0);
        let mlp_chunks = MlpChunks {
            down_rows: us(q.experts.scale_rows(layout.expert_block, di)),
            down_group: us(q.experts.group_of(di)),
            ..expert_chunks
        };
        let dense_layers = names.layers.iter().take(l).filter_map(|ln| match &ln.ffn {
            FfnNames::Dense(m) => Some(m),
            FfnNames::Moe { .. } => None,
        });
        for (slot, m) in dense_layers.enumerate() {
            let mlp = QuantizedMlp::get(weights, m, share.dense_intermediate, h, expert_format)?;
            mlp_chunks.pack(&mlp, ms[1], slot * ms[1], (&mut wm, &mut msc, &mut mdsc), |x| {
                share.mlp_column(x)
            });
        }
        out.extend([
            (OperandKind::WMlp, array(OperandKind::WMlp, &wm)?),
            (OperandKind::MlpScales, array(OperandKind::MlpScales, &msc)?),
            (OperandKind::MlpDownScales, array(OperandKind::MlpDownScales, &mdsc)?),
        ]);
    }
    if d.qk_norm {
        let hs = shape_of(OperandKind::HeadNorms);
        out.push((
            OperandKind::HeadNorms,
            pack_head_norms(&names, l, hd, hp, &hs, |name| plain(weights, name, &[hd]))?,
        ));
    }
    let (operands, arrays) = out.into_iter().unzip();
    Ok(Packed { operands, arrays, cache_shape: shape_of(OperandKind::KCache) })
}

/// One gated MLP's codes (an expert's, or a dense-MLP layer's), `[out, in]`.
struct QuantizedMlp<'w> {
    gate: &'w QuantizedTensor,
    up: &'w QuantizedTensor,
    down: &'w QuantizedTensor,
}

impl<'w> QuantizedMlp<'w> {
    fn get(
        weights: &'w QuantizedWeights,
        names: &MlpNames,
        intermediate: usize,
        hidden: usize,
        format: QuantFormat,
    ) -> Result<Self, PackError> {
        Ok(QuantizedMlp {
            gate: codes(weights, &names.gate, [intermediate, hidden], format)?,
            up: codes(weights, &names.up, [intermediate, hidden], format)?,
            down: codes(weights, &names.down, [hidden, intermediate], format)?,
        })
    }
}

/// How a quantized MLP is cut into the expert ring's chunks: `[H, 3*block]` codes, their
/// gate/up scales `[in_rows, 2*block]` (a group of `in_group` inputs a row) and down scales
/// `[down_stride, H]` (the first `down_rows` rows real, a group of `down_group` inputs
/// each).
#[derive(Clone, Copy)]
struct MlpChunks {
    h: usize,
    block: usize,
    in_rows: usize,
    in_group: usize,
    down_rows: usize,
    down_group: usize,
    down_stride: usize,
}

impl MlpChunks {
    /// `mlp`'s `chunks` chunks as items `first..first + chunks` of the (codes, scales, down
    /// scales) arrays; `column` maps a local intermediate column to the model's (`None`:
    /// padding, codes and scales left zero).
    fn pack(
        &self,
        mlp: &QuantizedMlp,
        chunks: usize,
        first: usize,
        (codes, scales, down_scales): (&mut [f32], &mut [f32], &mut [f32]),
        column: impl Fn(usize) -> Option<usize>,
    ) {
        let (h, eb, in_rows) = (self.h, self.block, self.in_rows);
        for c in 0..chunks {
            let item = first + c;
            for i in 0..h {
                let row = &mut codes[(item * h + i) * 3 * eb..(item * h + i + 1) * 3 * eb];
                for j in 0..eb {
                    // The model's intermediate column (TP: the device's slice; padding zero).
                    let Some(col) = column(c * eb + j) else { continue };
                    row[j] = mlp.gate.code(col, i);
                    row[eb + j] = mlp.up.code(col, i);
                    row[2 * eb + j] = mlp.down.code(i, col);
                }
            }
            for g in 0..in_rows {
                for j in 0..eb {
                    let Some(col) = column(c * eb + j) else { continue };
                    let at = (item * in_rows + g) * 2 * eb;
                    scales[at + j] = mlp.gate.scale(col, g * self.in_group);
                    scales[at + eb + j] = mlp.up.scale(col, g * self.in_group);
                }
            }
            for g in 0..self.down_rows {
                let Some(col) = column(c * eb + g * self.down_group) else { continue };
                for i in 0..h {
                    down_scales[(item * self.down_stride + g) * h + i] = mlp.down.scale(i, col);
                }
            }
        }
    }
}
