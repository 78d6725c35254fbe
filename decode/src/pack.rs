//! The host-side weight packer: [`palladium_model::weights::Weights`] or
//! [`palladium_model::quant::QuantizedWeights`] (Hugging Face names, `[out, in]` linear
//! weights) → the megakernel's input arrays, one device's share.
//!
//! There is ONE packer (`pack_from`): every weight operand of the plan's layout is
//! filled from its source map ([`palladium_fusion::source`]), which says for every element
//! which tensor element it is (by role, resolved to its Hugging Face name through
//! [`ModelNames`]), transposed or not, times which folded norm element, or zero padding,
//! and for a quantized operand which code or which scale; device `me`'s slice is part of
//! the map. The index math (q/k/v heads padded to `head_pad`, `o_proj`'s head columns,
//! expert and dense-MLP chunks, `lm_head`'s vocabulary chunks, every device's share) lives
//! there only, and the report prints the same maps ([`palladium_fusion::report::operand_source`]).
//!
//! Rounding: every weight is first rounded to bf16 (as transformers' bf16 model loads
//! it), a folded norm scale is multiplied in f32 (the product of two bf16 values is exact
//! in f32) and the product is rounded to bf16 once. Quantized weights: the codes and scales
//! of [`palladium_model::quant::QuantizedWeights`] are shipped unchanged, with NO norm
//! folded (the kernel applies every RMSNorm weight from the `norms` operand), so the
//! reference forward pass on [`palladium_model::quant::QuantizedWeights::dequantize`]
//! computes what the kernel does.

use palladium_array::quant::f32_to_e4m3fn_saturating;
use palladium_array::{DType, HostArray, round_bf16};
use palladium_fusion::graph::WeightKind;
use palladium_fusion::layout::{CodeFormat, OperandKind};
use palladium_fusion::options::Dims;
use palladium_fusion::plan::Plan;
use palladium_fusion::source::{Element, Instance, Role, source_maps};
use palladium_model::ModelSpec;
use palladium_model::moe::Layout;
use palladium_model::quant::{
    FP8_BLOCK, INT4_GROUP, QuantFormat, QuantizedTensor, QuantizedWeights, StoredTensor,
};
use palladium_model::weights::{
    ExpertNames, FfnNames, FusedExperts, GateUpColumns, MlaQueryNames, ModelNames, QkvNames,
    Tensor, Weights, WeightsError,
};

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
        let z = vec![half::bf16::ZERO; n];
        (HostArray::from_bf16(&self.cache_shape, &z), HostArray::from_bf16(&self.cache_shape, &z))
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
    (0..devices(plan)).map(|me| pack_device(spec, plan, weights, me)).collect()
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
    if let Some(q) = plan.layout.quant {
        return Err(PackError::Layout(format!(
            "bf16 weights for a {} megakernel (plan it with the weights' dtype)",
            q.scheme
        )));
    }
    pack_from(spec, plan, weights, device)
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
    (0..devices(plan)).map(|me| pack_quantized_device(spec, plan, weights, me)).collect()
}

/// Pack quantized `weights` for device `device` of the megakernel of a quantized `plan`: its
/// share as [`pack_device`]'s, each code with its own scale (the source maps look a scale
/// up by the model's row and input of each local code, so a split keeps every code's
/// scale).
pub fn pack_quantized_device(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &QuantizedWeights,
    device: u64,
) -> Result<Packed, PackError> {
    let Some(q) = plan.layout.quant else {
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
    pack_from(spec, plan, weights, device)
}

fn devices(plan: &Plan) -> u64 {
    plan.sharding.as_ref().map_or(1, |sh| sh.devices)
}

/// Where the packer reads tensors: bf16 weights, or quantized ones (codes and scales
/// beside the tensors kept plain).
trait Checkpoint {
    /// A tensor kept as loaded (every one of bf16 weights; norms, router, embedding and a
    /// bf16 `lm_head` of quantized ones), of shape `shape`.
    fn plain(&self, name: &str, shape: &[usize]) -> Result<&Tensor, PackError>;
    /// A tensor quantized as `format`, `[out, in]` = `shape`.
    fn quantized(
        &self,
        name: &str,
        shape: [usize; 2],
        format: QuantFormat,
    ) -> Result<&QuantizedTensor, PackError>;
}

fn missing(name: &str, shape: &[usize]) -> PackError {
    WeightsError::Missing { path: "weights".into(), name: name.into(), expected: shape.to_vec() }
        .into()
}

fn wrong_shape(name: &str, shape: &[usize], found: &[usize]) -> PackError {
    WeightsError::Shape {
        path: "weights".into(),
        name: name.into(),
        expected: shape.to_vec(),
        found: found.to_vec(),
    }
    .into()
}

impl Checkpoint for Weights {
    fn plain(&self, name: &str, shape: &[usize]) -> Result<&Tensor, PackError> {
        let t = self.get(name).ok_or_else(|| missing(name, shape))?;
        if t.shape != shape {
            return Err(wrong_shape(name, shape, &t.shape));
        }
        Ok(t)
    }

    fn quantized(
        &self,
        name: &str,
        _: [usize; 2],
        format: QuantFormat,
    ) -> Result<&QuantizedTensor, PackError> {
        Err(PackError::Layout(format!(
            "tensor \"{name}\" is bf16, the kernel takes it as {}",
            format.name()
        )))
    }
}

impl Checkpoint for QuantizedWeights {
    fn plain(&self, name: &str, shape: &[usize]) -> Result<&Tensor, PackError> {
        match self.get(name) {
            Some(StoredTensor::Plain(t)) if t.shape == shape => Ok(t),
            Some(StoredTensor::Plain(t)) => Err(wrong_shape(name, shape, &t.shape)),
            Some(StoredTensor::Quantized(q)) => Err(PackError::Layout(format!(
                "tensor \"{name}\" is quantized ({}), the {} kernel takes it unquantized",
                q.format.name(),
                self.dtype().name()
            ))),
            None => Err(missing(name, shape)),
        }
    }

    fn quantized(
        &self,
        name: &str,
        shape: [usize; 2],
        format: QuantFormat,
    ) -> Result<&QuantizedTensor, PackError> {
        match self.get(name) {
            Some(StoredTensor::Quantized(q)) if q.shape == shape && q.format == format => Ok(q),
            Some(StoredTensor::Quantized(q)) => Err(PackError::Layout(format!(
                "tensor \"{name}\": {} {:?}, the {} kernel takes {} {shape:?}",
                q.format.name(),
                q.shape,
                self.dtype().name(),
                format.name()
            ))),
            Some(StoredTensor::Plain(_)) => Err(PackError::Layout(format!(
                "tensor \"{name}\" is not quantized, the {} kernel takes it as {}",
                self.dtype().name(),
                format.name()
            ))),
            None => Err(missing(name, &shape)),
        }
    }
}

/// The one packer: every weight operand of `plan`'s layout filled by walking its source
/// map ([`palladium_fusion::source`]) on device `device`.
fn pack_from(
    spec: &ModelSpec,
    plan: &Plan,
    weights: &impl Checkpoint,
    device: u64,
) -> Result<Packed, PackError> {
    if device >= devices(plan) {
        return Err(PackError::Layout(format!(
            "device {device} is not one of the plan's {}",
            devices(plan)
        )));
    }
    let names = ModelNames::new(spec)?;
    let layout = &plan.layout;
    let us = |s: &[u64]| s.iter().map(|&x| x as usize).collect::<Vec<_>>();
    let (mut operands, mut arrays) = (Vec::new(), Vec::new());
    for map in source_maps(plan) {
        let shape = us(&map.shape);
        let mut data = vec![0f32; shape.iter().product()];
        for block in &map.blocks {
            let read = block.read;
            let tshape = us(&read.tensor.shape(&plan.model_dims));
            let inputs = *tshape.last().unwrap_or(&0);
            for inst in block.instances(plan, device) {
                let source = tensor_source(&names, read.tensor, &inst, &tshape, &plan.model_dims)?;
                let name = source.name;
                let fold = match read.fold {
                    Some(norm) => {
                        let norm = Role::Weight(norm);
                        let t = weights.plain(
                            tensor_source(&names, norm, &inst, &[], &plan.model_dims)?.name,
                            &us(&norm.shape(&plan.model_dims)),
                        )?;
                        Some(t)
                    }
                    None => None,
                };
                let axis = |n: u64, f: &dyn Fn(u64) -> Option<u64>| -> Vec<Option<usize>> {
                    (0..n).map(|x| f(x).map(|i| i as usize)).collect()
                };
                let rows = axis(block.rows, &|r| block.row.model(device, inst.chunk, r));
                let cols = axis(block.cols, &|s| block.col.model(device, inst.chunk, s));
                // The element of tensor `[o, i]` (a norm's `[n]` as `[1, n]`) block element
                // (r, s) reads.
                let at = |r: usize, s: usize| {
                    let (o, i) = if read.transposed { (s, r) } else { (r, s) };
                    if tshape.len() == 1 { (0, i) } else { (o, i) }
                };
                let block_at = (inst.at as usize, block.row_stride as usize);
                let mut fill = |value: &dyn Fn(usize, usize) -> f32| {
                    fill_block(&mut data, block_at, &rows, &cols, |r, s| {
                        let (o, i) = at(r, s);
                        value(o, i)
                    })
                };
                // Element [o, i] of the role's tensor in the stored tensor's data.
                let view =
                    source.view.unwrap_or(View { shape: tshape.clone(), ..View::plain(inputs) });
                let index = |o: usize, i: usize| view.offset + o * view.row + i * view.col;
                // A stored matrix's rows and columns (a vector's: one row).
                let stored = match view.shape[..] {
                    [r, c] => [r, c],
                    _ => [1, view.shape.iter().product()],
                };
                match read.element {
                    Element::Value => {
                        let t = weights.plain(name, &view.shape)?;
                        match fold {
                            Some(g) => fill(&|o, i| {
                                round_bf16(t.data[index(o, i)]) * round_bf16(g.data[i])
                            }),
                            None => fill(&|o, i| round_bf16(t.data[index(o, i)])),
                        }
                    }
                    Element::Exact => {
                        let t = weights.plain(name, &view.shape)?;
                        fill(&|o, i| t.data[index(o, i)]);
                    }
                    Element::Code(_) | Element::Scale(_) if view.shape.len() != 2 => {
                        return Err(PackError::Layout(format!(
                            "tensor \"{name}\": fused expert tensors are not quantized (plan them as bf16)"
                        )));
                    }
                    // Codes and scales are by the stored matrix's rows and columns.
                    Element::Code(f) => {
                        let q = weights.quantized(name, stored, stored_format(f))?;
                        fill(&|o, i| {
                            let k = index(o, i);
                            q.code(k / stored[1], k % stored[1])
                        });
                    }
                    Element::Scale(f) => {
                        let q = weights.quantized(name, stored, stored_format(f))?;
                        fill(&|o, i| {
                            let k = index(o, i);
                            q.scale(k / stored[1], k % stored[1])
                        });
                    }
                }
            }
        }
        let o = layout.operand(map.operand).expect("a source map is of a layout operand");
        let array = match o.dtype {
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
            dtype => HostArray::from_f32_values(dtype, &shape, &data),
        };
        operands.push(map.operand);
        arrays.push(array.map_err(|e| PackError::Layout(format!("{}: {e}", map.operand.name())))?);
    }
    let cache_shape = layout.operand(OperandKind::KCache).map(|o| us(&o.shape)).unwrap_or_default();
    Ok(Packed { operands, arrays, cache_shape })
}

/// Writes `value(row, col)` at every element of a block instance at flat offset `at`, row
/// stride `stride`, whose local rows and columns map to the tensor's `rows` and `cols`
/// (`None`: padding, left zero).
fn fill_block(
    data: &mut [f32],
    (at, stride): (usize, usize),
    rows: &[Option<usize>],
    cols: &[Option<usize>],
    value: impl Fn(usize, usize) -> f32,
) {
    for (r, ri) in rows.iter().enumerate() {
        let Some(ri) = *ri else { continue };
        let row = &mut data[at + r * stride..at + r * stride + cols.len()];
        for (dst, ci) in row.iter_mut().zip(cols) {
            if let Some(ci) = *ci {
                *dst = value(ri, ci);
            }
        }
    }
}

/// Where a role's `[out, in]` tensor (a vector's `[n]` as `[1, n]`) sits in a stored
/// tensor of `shape`: element `[o, i]` at `offset + o * row + i * col` of its data. One
/// expert of fused expert tensors (gpt-oss's `gate_up_proj` `[E, hidden, 2I]`, gate and up
/// interleaved, `down_proj` `[E, I, hidden]`, their biases) is such a view.
struct View {
    shape: Vec<usize>,
    offset: usize,
    row: usize,
    col: usize,
}

impl View {
    /// A tensor stored as the role's `[out, in]` (`inputs` columns).
    fn plain(inputs: usize) -> View {
        View { shape: Vec::new(), offset: 0, row: inputs, col: 1 }
    }
}

/// A role's tensor: its Hugging Face name, and where it is a view of a stored tensor of
/// another shape, the view.
struct Source<'n> {
    name: &'n str,
    view: Option<View>,
}

/// The source of tensor `role` (of `shape`, `[out, in]` or `[n]`) of `inst`'s layer and
/// expert, in the model of sizes `m`: a tensor of its own, or a view of one it shares
/// (gpt-oss's fused experts, DBRX's fused `Wqkv` and its experts stacked by rows).
fn tensor_source<'n>(
    names: &'n ModelNames,
    role: Role,
    inst: &Instance,
    shape: &[usize],
    m: &Dims,
) -> Result<Source<'n>, PackError> {
    let experts = m.experts as usize;
    let layer = inst.layer.and_then(|l| names.layers.get(l as usize).map(|ln| (l, ln)));
    if let (Role::Weight(kind), Some((l, ln))) = (role, layer) {
        let e = || inst.expert.expect("an expert tensor's block stacks experts") as usize;
        let h = m.hidden as usize;
        use WeightKind::*;
        match (kind, &ln.qkv, &ln.ffn) {
            // DBRX's `Wqkv`: q, k and v its row blocks.
            (QProj | KProj | VProj, QkvNames::Fused { qkv }, _) => {
                let (q, kv) = ((m.heads * m.head_dim) as usize, (m.kv_heads * m.head_dim) as usize);
                let first = match kind {
                    QProj => 0,
                    KProj => q,
                    _ => q + kv,
                };
                let view = View { shape: vec![q + 2 * kv, h], offset: first * h, row: h, col: 1 };
                return Ok(Source { name: qkv, view: Some(view) });
            }
            // DBRX's experts: rows `e * I ..` of `w1`, `v1`, and of `w2` in `x @ W` form.
            (
                ExpertGate | ExpertUp | ExpertDown,
                _,
                FfnNames::Moe { experts: ExpertNames::Stacked { gate, up, down }, .. },
            ) => {
                let i = m.intermediate as usize;
                let (name, row, col) = match kind {
                    ExpertGate => (gate, h, 1),
                    ExpertUp => (up, h, 1),
                    _ => (down, 1, h),
                };
                let view = View { shape: vec![experts * i, h], offset: e() * i * h, row, col };
                return Ok(Source { name, view: Some(view) });
            }
            (
                ExpertGate | ExpertUp | ExpertDown | ExpertGateBias | ExpertUpBias | ExpertDownBias,
                _,
                FfnNames::Moe { experts: ExpertNames::Fused(f), .. },
            ) => return fused_view(f, kind, (e(), experts), shape, l),
            _ => {}
        }
    }
    tensor_name(names, role, inst).map(|name| Source { name, view: None })
}

/// Expert `e`'s `kind` tensor (`[out, in]` = `shape`; a bias `[n]`) in the fused tensors
/// `f` of layer `l`.
fn fused_view<'n>(
    f: &'n FusedExperts,
    kind: WeightKind,
    (e, experts): (usize, usize),
    shape: &[usize],
    l: u64,
) -> Result<Source<'n>, PackError> {
    let missing_bias =
        || PackError::Layout(format!("layer {l}: no fused expert biases (the config has none)"));
    // Gate's and up's column `o` among `2I` columns: interleaved (gpt-oss) or halves.
    let gate_up_step = |i: usize| match f.gate_up_columns {
        GateUpColumns::Interleaved => (2, 1),
        GateUpColumns::Halves => (1, i),
    };
    Ok(match kind {
        WeightKind::ExpertGate | WeightKind::ExpertUp => {
            let (i, h) = (shape[0], shape[1]);
            let (step, up) = gate_up_step(i);
            let first = if kind == WeightKind::ExpertUp { up } else { 0 };
            let view = match f.layout {
                // [E, hidden, 2I]: [o, x] at x * 2I + column(o).
                Layout::InOut => View {
                    shape: vec![experts, h, 2 * i],
                    offset: e * h * 2 * i + first,
                    row: step,
                    col: 2 * i,
                },
                // [E, 2I, hidden].
                Layout::OutIn => View {
                    shape: vec![experts, 2 * i, h],
                    offset: e * 2 * i * h + first * h,
                    row: step * h,
                    col: 1,
                },
            };
            Source { name: &f.gate_up, view: Some(view) }
        }
        WeightKind::ExpertDown => {
            let (h, i) = (shape[0], shape[1]);
            let view = match f.layout {
                // [E, I, hidden]: [o, x] at x * hidden + o.
                Layout::InOut => {
                    View { shape: vec![experts, i, h], offset: e * i * h, row: 1, col: h }
                }
                Layout::OutIn => {
                    View { shape: vec![experts, h, i], offset: e * h * i, row: i, col: 1 }
                }
            };
            Source { name: &f.down, view: Some(view) }
        }
        WeightKind::ExpertGateBias | WeightKind::ExpertUpBias => {
            let i = shape[0];
            let (step, up) = gate_up_step(i);
            let first = if kind == WeightKind::ExpertUpBias { up } else { 0 };
            let name = f.gate_up_bias.as_deref().ok_or_else(missing_bias)?;
            let view =
                View { shape: vec![experts, 2 * i], offset: e * 2 * i + first, row: 0, col: step };
            Source { name, view: Some(view) }
        }
        _ => {
            let h = shape[0];
            let name = f.down_bias.as_deref().ok_or_else(missing_bias)?;
            Source {
                name,
                view: Some(View { shape: vec![experts, h], offset: e * h, row: 0, col: 1 }),
            }
        }
    })
}

/// The Hugging Face name of tensor `role` of `inst`'s layer and expert.
/// Multi-head latent attention's tensor of `kind` among a layer's attention names (none
/// for grouped-query attention's, or a query the layer projects otherwise).
fn mla_tensor_name(qkv: &QkvNames, kind: WeightKind) -> Option<&str> {
    let QkvNames::Mla(m) = qkv else { return None };
    let low_rank = match &m.query {
        MlaQueryNames::LowRank { q_a, q_a_norm, q_b } => Some((q_a, q_a_norm, q_b)),
        MlaQueryNames::Direct { .. } => None,
    };
    Some(match kind {
        WeightKind::QProj => match &m.query {
            MlaQueryNames::Direct { q } => q,
            MlaQueryNames::LowRank { .. } => return None,
        },
        WeightKind::QAProj => low_rank?.0,
        WeightKind::QANorm => low_rank?.1,
        WeightKind::QBProj => low_rank?.2,
        WeightKind::KvAProj => &m.kv_a,
        WeightKind::KvANorm => &m.kv_a_norm,
        WeightKind::KvBProj => &m.kv_b,
        _ => return None,
    })
}

/// The Hugging Face name of tensor `role` of `inst`'s layer and expert (a tensor of its
/// own: [`stored`] places the others).
fn tensor_name<'n>(
    names: &'n ModelNames,
    role: Role,
    inst: &Instance,
) -> Result<&'n str, PackError> {
    let Role::Weight(kind) = role else { return Ok(&names.embed) };
    match kind {
        WeightKind::FinalNorm => return Ok(&names.final_norm),
        WeightKind::LmHead => return Ok(&names.lm_head),
        _ => {}
    }
    let l = inst.layer.expect("a per-layer tensor's block stacks layers") as usize;
    let ln = names
        .layers
        .get(l)
        .ok_or_else(|| PackError::Layout(format!("the model has no layer {l}")))?;
    let wrong = |what: &str| PackError::Layout(format!("layer {l}: {what}"));
    Ok(match (kind, &ln.ffn) {
        (WeightKind::InputNorm, _) => &ln.input_norm,
        (WeightKind::PostAttentionNorm, _) => &ln.post_norm,
        (WeightKind::OProj, _) => &ln.o,
        (WeightKind::OBias, _) => {
            ln.o_bias.as_deref().ok_or_else(|| wrong("no o_proj bias (the config has none)"))?
        }
        (
            WeightKind::QProj
            | WeightKind::QAProj
            | WeightKind::QANorm
            | WeightKind::QBProj
            | WeightKind::KvAProj
            | WeightKind::KvANorm
            | WeightKind::KvBProj,
            _,
        ) if ln.gqa().is_none() => mla_tensor_name(&ln.qkv, kind)
            .ok_or_else(|| wrong(&format!("no {kind:?} tensor (its query is not the plan's)")))?,
        (WeightKind::QProj | WeightKind::KProj | WeightKind::VProj, _) => {
            let g = ln.gqa().ok_or_else(|| wrong("no q/k/v projections (MLA attention)"))?;
            match kind {
                WeightKind::QProj => &g.q,
                WeightKind::KProj => &g.k,
                _ => &g.v,
            }
        }
        (WeightKind::QBias | WeightKind::KBias | WeightKind::VBias, _) => {
            let g = ln.gqa().ok_or_else(|| wrong("no q/k/v biases (MLA attention)"))?;
            let b = match kind {
                WeightKind::QBias => &g.q_bias,
                WeightKind::KBias => &g.k_bias,
                _ => &g.v_bias,
            };
            b.as_deref().ok_or_else(|| wrong("no q/k/v bias names (the config has no qkv_bias)"))?
        }
        (WeightKind::QNorm | WeightKind::KNorm, _) => {
            let g = ln.gqa().ok_or_else(|| wrong("no q/k norm names"))?;
            let n = if kind == WeightKind::QNorm { &g.q_norm } else { &g.k_norm };
            n.as_deref().ok_or_else(|| wrong("no q/k norm names"))?
        }
        (WeightKind::Router, FfnNames::Moe { router, .. }) => router,
        (WeightKind::RouterBias, FfnNames::Moe { router_bias, .. }) => {
            router_bias.as_deref().ok_or_else(|| wrong("no router bias (the config has none)"))?
        }
        (WeightKind::Sinks, _) => {
            ln.sinks.as_deref().ok_or_else(|| wrong("no attention sinks (the config has none)"))?
        }
        (WeightKind::CorrectionBias, FfnNames::Moe { correction_bias, .. }) => correction_bias
            .as_deref()
            .ok_or_else(|| wrong("no e_score_correction_bias (the router has none)"))?,
        (
            WeightKind::ExpertGate | WeightKind::ExpertUp | WeightKind::ExpertDown,
            FfnNames::Moe { experts, .. },
        ) => {
            let e = inst.expert.expect("an expert tensor's block stacks experts") as usize;
            let experts =
                experts.per_expert().ok_or_else(|| wrong("fused expert tensors (gpt-oss)"))?;
            let m = experts.get(e).ok_or_else(|| wrong(&format!("no expert {e}")))?;
            match kind {
                WeightKind::ExpertGate => &m.gate,
                WeightKind::ExpertUp => &m.up,
                _ => &m.down,
            }
        }
        (
            WeightKind::SharedGate | WeightKind::SharedUp | WeightKind::SharedDown,
            FfnNames::Moe { shared: Some(s), .. },
        ) => match kind {
            WeightKind::SharedGate => &s.mlp.gate,
            WeightKind::SharedUp => &s.mlp.up,
            _ => &s.mlp.down,
        },
        (WeightKind::SharedExpertGate, FfnNames::Moe { shared: Some(s), .. }) => s
            .gate
            .as_deref()
            .ok_or_else(|| wrong("no shared_expert_gate (an ungated shared expert)"))?,
        (WeightKind::MlpGate, FfnNames::Dense(m)) => &m.gate,
        (WeightKind::MlpUp, FfnNames::Dense(m)) => &m.up,
        (WeightKind::MlpDown, FfnNames::Dense(m)) => &m.down,
        (kind, _) => {
            return Err(wrong(&format!("no {kind:?} tensor (the layer's FFN is not the plan's)")));
        }
    })
}

/// The [`QuantFormat`] a weight in kernel format `f` must be stored in.
fn stored_format(f: CodeFormat) -> QuantFormat {
    match (f.codes, f.group) {
        (DType::F8E4M3, _) => QuantFormat::Fp8Block { block: FP8_BLOCK },
        (DType::I4, _) => QuantFormat::Int4Group { group: INT4_GROUP },
        _ => QuantFormat::Int8PerChannel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every weight of multi-head latent attention resolves to the layer's checkpoint name:
    /// the low-rank query's three (DeepSeek-V3) or the direct one (DeepSeek-V2), the latent's
    /// projection, norm and expansion; the other query's kinds resolve to none.
    #[test]
    fn mla_weights_resolve_to_the_checkpoint_names() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/models");
        for (fixture, query, absent) in [
            (
                "tiny-deepseek-v3",
                vec![
                    (WeightKind::QAProj, "q_a_proj.weight"),
                    (WeightKind::QANorm, "q_a_layernorm.weight"),
                    (WeightKind::QBProj, "q_b_proj.weight"),
                ],
                vec![WeightKind::QProj],
            ),
            (
                "tiny-deepseek-v2",
                vec![(WeightKind::QProj, "q_proj.weight")],
                vec![WeightKind::QAProj, WeightKind::QANorm, WeightKind::QBProj],
            ),
        ] {
            let spec = ModelSpec::from_path(format!("{dir}/{fixture}.json")).unwrap();
            let names = ModelNames::new(&spec).unwrap();
            let qkv = &names.layers[1].qkv;
            let latent = [
                (WeightKind::KvAProj, "kv_a_proj_with_mqa.weight"),
                (WeightKind::KvANorm, "kv_a_layernorm.weight"),
                (WeightKind::KvBProj, "kv_b_proj.weight"),
            ];
            for (kind, name) in query.into_iter().chain(latent) {
                let want = format!("model.layers.1.self_attn.{name}");
                assert_eq!(mla_tensor_name(qkv, kind), Some(want.as_str()), "{fixture}");
            }
            for kind in absent.into_iter().chain([WeightKind::KProj, WeightKind::OProj]) {
                assert_eq!(mla_tensor_name(qkv, kind), None, "{fixture}: {kind:?}");
            }
        }
    }
}
