//! Quantized weights: the three storage formats of issue 16, their packing, quantization of
//! f32/bf16 weights, loading of Hugging Face block-scaled FP8 checkpoints, and
//! [`QuantizedTensor::dequantize`], the f32 weights the reference forward pass runs on.
//!
//! Every format quantizes an `nn.Linear` weight `W [out, in]` (row-major, as checkpoints store
//! it) in groups, one f32 scale per group, symmetric (no zero point):
//!
//! | format | group | scale | code | packing of `data` |
//! |---|---|---|---|---|
//! | [`QuantFormat::Int8PerChannel`] | one output row | `max\|w\| / 127` | `clamp(rne(w / scale), -128, 127)` | `[out, in]` bytes, two's complement |
//! | [`QuantFormat::Fp8Block`] | a `128 x 128` tile (`[out, in]`) | `max\|w\| / 448` | `e4m3fn_sat(w / scale)` | `[out, in]` `float8_e4m3fn` bytes |
//! | [`QuantFormat::Int4Group`] | 128 consecutive inputs of one row | `max\|w\| / 7` | `clamp(rne(w / scale), -8, 7)` | `[out, ceil(in / 2)]` bytes, [`pack_int4`] per row |
//!
//! `rne` rounds to nearest, ties to even; `w / scale` is one f32 division;
//! [`convert::f32_to_e4m3fn_saturating`] clamps to ±448 and rounds to nearest even, as
//! `ml_dtypes.float8_e4m3fn`. The dequantized weight is `code * scale` (one f32 multiply).
//! Scales lie row-major in [`Scales::values`] with the shapes `[out]`,
//! `[ceil(out / 128), ceil(in / 128)]` (the FP8 checkpoints' `weight_scale_inv`) and
//! `[out, ceil(in / 128)]`; the last tile or group of a dimension that is not a multiple of 128
//! is partial and takes its scale over the elements it has.
//!
//! Edge cases: a scale is never below `f32::MIN_POSITIVE` (2^-126): an all-zero group gets that
//! scale and zero codes (dequantizing to exact zeros), and a group of tiny values whose
//! `max|w| / qmax` would underflow keeps `|w - code * scale| <= scale / 2` instead of dividing
//! by zero. A non-finite weight is refused with its tensor name and index.
//!
//! Which weights each [`WeightsDtype`] converts is [`WeightsDtype::format_of`]; embeddings,
//! norms, biases and the routers (`mlp.gate`, `block_sparse_moe.gate`) always stay as loaded.

/// The element conversions live in the base crate, shared with host arrays and the interpreter.
pub use palladium_array::quant as convert;
mod load;

use indexmap::IndexMap;
use palladium_array::{DType, HostArray};
use thiserror::Error;

use crate::spec::{Family, FfnKind, ModelSpec, Quantization};
use crate::weights::{ExpertNames, FfnNames, ModelNames, QkvNames, Tensor, Weights, WeightsError};
use convert::{
    E4M3FN_MAX, INT4_MAX, INT4_MIN, e4m3fn_to_f32, f32_to_e4m3fn_saturating, round_clamp,
};
pub use convert::{pack_int4, unpack_int4};

/// The tile of [`QuantFormat::Fp8Block`] (`weight_block_size`), `[out, in]`.
pub const FP8_BLOCK: [usize; 2] = [128, 128];
/// The input-dimension group of [`QuantFormat::Int4Group`].
pub const INT4_GROUP: usize = 128;

/// How one quantized weight is stored (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// int8, one scale per output channel.
    Int8PerChannel,
    /// `float8_e4m3fn`, one scale per `block[0] x block[1]` tile.
    Fp8Block { block: [usize; 2] },
    /// int4, one scale per `group` consecutive inputs of a row, two values per byte.
    Int4Group { group: usize },
}

impl QuantFormat {
    /// The largest code magnitude the scale maps `max|w|` to.
    fn code_max(self) -> f32 {
        match self {
            Self::Int8PerChannel => 127.0,
            Self::Fp8Block { .. } => E4M3FN_MAX,
            Self::Int4Group { .. } => f32::from(INT4_MAX),
        }
    }

    /// The shape of the scales of a `[out, in]` weight.
    pub fn scales_shape(self, [out, inp]: [usize; 2]) -> Vec<usize> {
        match self {
            Self::Int8PerChannel => vec![out],
            Self::Fp8Block { block: [bo, bi] } => vec![out.div_ceil(bo), inp.div_ceil(bi)],
            Self::Int4Group { group } => vec![out, inp.div_ceil(group)],
        }
    }

    /// The row-major index into the scales of element `(r, c)` of a weight `in` wide.
    fn scale_index(self, r: usize, c: usize, inp: usize) -> usize {
        match self {
            Self::Int8PerChannel => r,
            Self::Fp8Block { block: [bo, bi] } => (r / bo) * inp.div_ceil(bi) + c / bi,
            Self::Int4Group { group } => r * inp.div_ceil(group) + c / group,
        }
    }

    /// The rows and columns of a `[out, in]` weight that scale `g` (row-major index into
    /// the scales) covers.
    fn group_span(self, g: usize, [out, inp]: [usize; 2]) -> [std::ops::Range<usize>; 2] {
        let (rows, cols) = match self {
            Self::Int8PerChannel => (g..g + 1, 0..inp),
            Self::Fp8Block { block: [bo, bi] } => {
                let (br, bc) = (g / inp.div_ceil(bi), g % inp.div_ceil(bi));
                (br * bo..((br + 1) * bo).min(out), bc * bi..((bc + 1) * bi).min(inp))
            }
            Self::Int4Group { group } => {
                let (r, gc) = (g / inp.div_ceil(group), g % inp.div_ceil(group));
                (r..r + 1, gc * group..((gc + 1) * group).min(inp))
            }
        };
        [rows, cols]
    }

    /// Bytes of packed codes of one row `in` wide.
    pub fn row_bytes(self, inp: usize) -> usize {
        match self {
            Self::Int8PerChannel | Self::Fp8Block { .. } => inp,
            Self::Int4Group { .. } => inp.div_ceil(2),
        }
    }

    /// The name used in messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int8PerChannel => "int8 per channel",
            Self::Fp8Block { .. } => "fp8 e4m3fn 128x128 blocks",
            Self::Int4Group { .. } => "int4 groups of 128",
        }
    }
}

/// The element type scales are stored in (held as f32 either way, exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleDtype {
    /// Quantization at load, and most FP8 checkpoints.
    F32,
    /// Some FP8 checkpoints store `weight_scale_inv` in bf16.
    Bf16,
}

/// A quantized weight's scales: row-major `values` of `shape`
/// ([`QuantFormat::scales_shape`]), stored as `dtype`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scales {
    pub shape: Vec<usize>,
    pub dtype: ScaleDtype,
    pub values: Vec<f32>,
}

/// One quantized `[out, in]` weight: packed codes and their scales, what a kernel packer
/// ships to the device unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedTensor {
    /// `[out, in]` of the weight.
    pub shape: [usize; 2],
    pub format: QuantFormat,
    /// Row-major packed codes: `out` rows of [`QuantFormat::row_bytes`] bytes.
    pub data: Vec<u8>,
    pub scales: Scales,
}

/// A quantized weight as the library's quantized kernels take it
/// ([`QuantizedTensor::kernel_operands`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelOperands {
    pub codes: HostArray,
    pub scales: HostArray,
    pub group: usize,
}

/// Why weights could not be quantized or loaded quantized.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum QuantError {
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("tensor \"{name}\": non-finite value {value} at index {index:?}: cannot quantize")]
    NonFinite { name: String, index: Vec<usize>, value: f32 },
    #[error(
        "{path}: tensor \"{name}\": the block of rows {rows:?}, columns {cols:?} (scale {scale:e} at index {index:?} of its weight_scale_inv) dequantizes to infinity: code {code} x {scale:e} overflows f32; a dequantized weight must be finite"
    )]
    Overflow {
        path: String,
        name: String,
        index: Vec<usize>,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        code: f32,
        scale: f32,
    },
    #[error("tensor \"{name}\": shape {shape:?}: only [out, in] linear weights are quantized")]
    NotMatrix { name: String, shape: Vec<usize> },
    /// The requested [`WeightsDtype`] does not fit the checkpoint.
    #[error("{message}")]
    Dtype { message: String },
}

impl QuantizedTensor {
    /// Quantizes the weight `name` (for messages) to `format` (see the module table).
    pub fn quantize(name: &str, w: &Tensor, format: QuantFormat) -> Result<Self, QuantError> {
        let &[out, inp] = w.shape.as_slice() else {
            return Err(QuantError::NotMatrix { name: name.into(), shape: w.shape.clone() });
        };
        if let Some(i) = w.data.iter().position(|x| !x.is_finite()) {
            return Err(QuantError::NonFinite {
                name: name.into(),
                index: vec![i / inp, i % inp],
                value: w.data[i],
            });
        }
        let scales_shape = format.scales_shape([out, inp]);
        let mut amax = vec![0f32; scales_shape.iter().product()];
        for (i, &x) in w.data.iter().enumerate() {
            let g = format.scale_index(i / inp, i % inp, inp);
            amax[g] = amax[g].max(x.abs());
        }
        let scales: Vec<f32> =
            amax.iter().map(|&m| (m / format.code_max()).max(f32::MIN_POSITIVE)).collect();
        let code =
            |i: usize| -> f32 { w.data[i] / scales[format.scale_index(i / inp, i % inp, inp)] };
        let data = match format {
            QuantFormat::Int8PerChannel => {
                (0..w.data.len()).map(|i| round_clamp(code(i), i8::MIN, i8::MAX) as u8).collect()
            }
            QuantFormat::Fp8Block { .. } => {
                (0..w.data.len()).map(|i| f32_to_e4m3fn_saturating(code(i))).collect()
            }
            QuantFormat::Int4Group { .. } => (0..out)
                .flat_map(|r| {
                    let row: Vec<i8> = (r * inp..(r + 1) * inp)
                        .map(|i| round_clamp(code(i), INT4_MIN, INT4_MAX))
                        .collect();
                    pack_int4(&row)
                })
                .collect(),
        };
        Ok(Self {
            shape: [out, inp],
            format,
            data,
            scales: Scales { shape: scales_shape, dtype: ScaleDtype::F32, values: scales },
        })
    }

    /// The code of element `(r, c)` as a number (before its scale).
    pub fn code(&self, r: usize, c: usize) -> f32 {
        let row = &self.data[r * self.format.row_bytes(self.shape[1])..];
        match self.format {
            QuantFormat::Int8PerChannel => f32::from(row[c] as i8),
            QuantFormat::Fp8Block { .. } => e4m3fn_to_f32(row[c]),
            QuantFormat::Int4Group { .. } => f32::from(unpack_int4(row, c)),
        }
    }

    /// The scale of element `(r, c)`.
    pub fn scale(&self, r: usize, c: usize) -> f32 {
        self.scales.values[self.format.scale_index(r, c, self.shape[1])]
    }

    /// The operands of the library's quantized kernels (`gemv_quantized` & co.) for this
    /// weight used as `x @ W.T`: codes `[in, out]` (i8, f8e4m3fn, or i4 one value a byte) and
    /// f32 scales `[in / group, out]` with their `group` (int8 per channel: `group = in`; fp8
    /// tiles: each tile's scale repeated over its output columns). `Err` when `in` is not a
    /// whole number of groups (the kernels have no partial group).
    pub fn kernel_operands(&self) -> Result<KernelOperands, QuantError> {
        let [out, inp] = self.shape;
        let group = match self.format {
            QuantFormat::Int8PerChannel => inp,
            QuantFormat::Fp8Block { block: [_, bi] } => bi,
            QuantFormat::Int4Group { group } => group,
        };
        if !inp.is_multiple_of(group) {
            return Err(QuantError::Dtype {
                message: format!(
                    "a [{out}, {inp}] {} weight: {inp} inputs are not whole groups of {group}, which the kernels need",
                    self.format.name()
                ),
            });
        }
        let (dtype, code_byte): (DType, Box<dyn Fn(usize, usize) -> u8 + '_>) = match self.format {
            QuantFormat::Int8PerChannel => (DType::I8, Box::new(|r, c| self.data[r * inp + c])),
            QuantFormat::Fp8Block { .. } => {
                (DType::F8E4M3, Box::new(|r, c| self.data[r * inp + c]))
            }
            QuantFormat::Int4Group { .. } => (
                DType::I4,
                Box::new(|r, c| unpack_int4(&self.data[r * inp.div_ceil(2)..], c) as u8 & 0xF),
            ),
        };
        let codes = (0..inp)
            .flat_map(|c| (0..out).map(move |r| (r, c)))
            .map(|(r, c)| code_byte(r, c))
            .collect();
        let scales: Vec<f32> = (0..inp / group)
            .flat_map(|g| (0..out).map(move |r| (r, g)))
            .map(|(r, g)| self.scale(r, g * group))
            .collect();
        Ok(KernelOperands {
            codes: HostArray::new(dtype, &[inp, out], codes).expect("one byte per code"),
            scales: HostArray::from_f32(&[inp / group, out], &scales),
            group,
        })
    }

    /// The first scale group (row-major index into the scales) whose largest code times its
    /// scale is not a finite f32, with its rows and columns, that code and the scale:
    /// dequantizing it gives infinities (finite codes, a huge stored scale). Only a scale
    /// past `f32::MAX / code_max` can overflow, so the codes are read only then.
    pub fn overflowing_group(&self) -> Option<(usize, [std::ops::Range<usize>; 2], f32, f32)> {
        let code_max = self.format.code_max();
        let scales = &self.scales.values;
        scales.iter().enumerate().filter(|(_, s)| !(*s * code_max).is_finite()).find_map(
            |(g, &scale)| {
                let [rows, cols] = self.format.group_span(g, self.shape);
                let code = rows
                    .clone()
                    .flat_map(|r| cols.clone().map(move |c| (r, c)))
                    .map(|(r, c)| self.code(r, c).abs())
                    .fold(0f32, f32::max);
                (!(code * scale).is_finite()).then_some((g, [rows, cols], code, scale))
            },
        )
    }

    /// The f32 weight these codes stand for: `code * scale` per element.
    pub fn dequantize(&self) -> Tensor {
        let [out, inp] = self.shape;
        let data = (0..out)
            .flat_map(|r| (0..inp).map(move |c| (r, c)))
            .map(|(r, c)| self.code(r, c) * self.scale(r, c))
            .collect();
        Tensor { shape: vec![out, inp], data }
    }

    /// Bytes on the device: packed codes plus scales in their dtype.
    pub fn bytes(&self) -> usize {
        let scale_bytes = match self.scales.dtype {
            ScaleDtype::F32 => 4,
            ScaleDtype::Bf16 => 2,
        };
        self.data.len() + self.scales.values.len() * scale_bytes
    }
}

/// The weights dtype a model runs with (what `--weights-dtype` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightsDtype {
    /// As the checkpoint stores them (bf16 / f16 / f32): nothing quantized.
    Bf16,
    /// Every linear weight of the layers and `lm_head` int8 per channel.
    Int8,
    /// fp8 128x128 blocks on the tensors Hugging Face's FP8 checkpoints convert: every linear
    /// weight of the layers but the routers (not `lm_head`).
    Fp8,
    /// Experts int4 in groups of 128; the other linear weights of the layers and `lm_head` int8.
    Int4,
}

impl WeightsDtype {
    /// The accepted names, in the order messages list them.
    pub const NAMES: &'static str = "bf16, int8, fp8, int4";

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "bf16" => Self::Bf16,
            "int8" => Self::Int8,
            "fp8" => Self::Fp8,
            "int4" => Self::Int4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
            Self::Fp8 => "fp8",
            Self::Int4 => "int4",
        }
    }

    /// What the checkpoint of `spec` is stored as: fp8 when its config has an FP8
    /// `quantization_config`, else bf16 (the unquantized dtypes).
    pub fn of_checkpoint(spec: &ModelSpec) -> Self {
        match spec.quantization {
            Some(Quantization::Fp8Block { .. }) => Self::Fp8,
            // Read by `Weights::load`, which decodes the experts' codes.
            Some(Quantization::Mxfp4 { .. }) | None => Self::Bf16,
        }
    }

    /// The format of every weight this dtype quantizes, by tensor name, in checkpoint order;
    /// a tensor not listed stays as loaded. With [`WeightsDtype::Fp8`] the converted set is
    /// the config's `quantization_config` if it has one, else transformers' rule with
    /// `modules_to_not_convert = ["lm_head", <every router>]`.
    pub fn format_of(
        self,
        spec: &ModelSpec,
    ) -> Result<IndexMap<String, QuantFormat>, WeightsError> {
        let names = ModelNames::new(spec)?;
        let mut out = IndexMap::new();
        let int8 = QuantFormat::Int8PerChannel;
        let fp8 = QuantFormat::Fp8Block { block: FP8_BLOCK };
        let routers: Vec<String> = names
            .layers
            .iter()
            .filter_map(|l| match &l.ffn {
                FfnNames::Moe { router, .. } => {
                    Some(router.trim_end_matches(".weight").to_string())
                }
                FfnNames::Dense(_) => None,
            })
            .collect();
        let fp8_rule = match &spec.quantization {
            Some(q) => q.clone(),
            None => Quantization::Fp8Block {
                weight_block_size: [FP8_BLOCK[0] as u64, FP8_BLOCK[1] as u64],
                modules_to_not_convert: std::iter::once("lm_head".to_string())
                    .chain(routers)
                    .collect(),
            },
        };
        let (dense, expert) = match self {
            Self::Bf16 => return Ok(out),
            Self::Int8 => (int8, int8),
            Self::Fp8 => (fp8, fp8),
            Self::Int4 => (int8, QuantFormat::Int4Group { group: INT4_GROUP }),
        };
        for (layer, planned) in names.layers.iter().zip(&spec.layers) {
            let mut add = |name: &str, format| {
                if self != Self::Fp8 || fp8_rule.converts(name) {
                    out.insert(name.to_string(), format);
                }
            };
            let qkv = match &layer.qkv {
                QkvNames::Gqa(g) => vec![&g.q, &g.k, &g.v],
                QkvNames::Mla(m) => m.linears(),
                QkvNames::Fused { qkv } => vec![qkv],
            };
            for n in qkv.into_iter().chain([&layer.o]) {
                add(n, dense);
            }
            match &layer.ffn {
                FfnNames::Dense(m) => {
                    [&m.gate, &m.up, &m.down].into_iter().for_each(|n| add(n, dense))
                }
                FfnNames::Moe { router, experts, shared, .. } => {
                    if self == Self::Fp8 {
                        add(router, fp8);
                    }
                    // DBRX's experts stacked by rows (`[experts * I, hidden]` each, `w2` in
                    // `x @ W` form) quantize as whole tensors in fp8's 128 x 128 blocks: a
                    // block is then one expert's, of 128 outputs and 128 inputs whichever
                    // form, where `I` is whole blocks. Per-row int8 and int4 would group
                    // `w2` by its outputs, not its inputs.
                    if let ExpertNames::Stacked { gate, up, down } = experts {
                        let i = match &planned.ffn {
                            FfnKind::Moe(m) => m.intermediate,
                            FfnKind::Dense { intermediate } => *intermediate,
                        };
                        if self != Self::Fp8 || i % FP8_BLOCK[0] as u64 != 0 {
                            return Err(WeightsError::Unsupported {
                                what: format!(
                                    "--weights-dtype {} with {}'s experts stacked by rows (quantized as fp8, with an intermediate size of whole {}-row blocks: {i})",
                                    self.name(),
                                    spec.family.model_type(),
                                    FP8_BLOCK[0]
                                ),
                            });
                        }
                        [gate, up, down].into_iter().for_each(|n| add(n, expert));
                        continue;
                    }
                    let Some(experts) = experts.per_expert() else {
                        return Err(WeightsError::Unsupported {
                            what: format!(
                                "--weights-dtype {} with {}'s fused expert tensors (quantized per expert module only)",
                                self.name(),
                                spec.family.model_type()
                            ),
                        });
                    };
                    for m in experts {
                        [&m.gate, &m.up, &m.down].into_iter().for_each(|n| add(n, expert));
                    }
                    // A shared expert streams through the megakernel's expert ring as the
                    // routed experts' chunks do: their format (int4's too). Its
                    // `[1, hidden]` sigmoid gate stays as loaded, like the router.
                    if let Some(m) = shared.as_ref().map(|s| &s.mlp) {
                        [&m.gate, &m.up, &m.down].into_iter().for_each(|n| add(n, expert));
                    }
                }
            }
        }
        // A tied head is the embedding, which stays as loaded.
        if names.lm_head != names.embed && (self != Self::Fp8 || fp8_rule.converts(&names.lm_head))
        {
            out.insert(names.lm_head.clone(), dense);
        }
        Ok(out)
    }
}

/// One tensor of [`QuantizedWeights`]: as loaded, or quantized.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredTensor {
    Plain(Tensor),
    Quantized(QuantizedTensor),
}

/// A model's weights with the linear weights of a [`WeightsDtype`] quantized, keyed by
/// Hugging Face name in checkpoint order (the names and order of [`Weights`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedWeights {
    family: Family,
    dtype: WeightsDtype,
    tensors: IndexMap<String, StoredTensor>,
}

impl QuantizedWeights {
    /// Quantizes loaded (or random) weights to `dtype` ([`WeightsDtype::format_of`]).
    pub fn quantize(
        spec: &ModelSpec,
        weights: &Weights,
        dtype: WeightsDtype,
    ) -> Result<Self, QuantError> {
        let formats = dtype.format_of(spec)?;
        let tensors = weights
            .iter()
            .map(|(name, t)| {
                let stored = match formats.get(name) {
                    Some(&f) => StoredTensor::Quantized(QuantizedTensor::quantize(name, t, f)?),
                    None => StoredTensor::Plain(t.clone()),
                };
                Ok((name.to_string(), stored))
            })
            .collect::<Result<_, QuantError>>()?;
        Ok(Self { family: weights.family(), dtype, tensors })
    }

    pub fn dtype(&self) -> WeightsDtype {
        self.dtype
    }

    pub fn get(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.get(name)
    }

    /// Tensors in checkpoint order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &StoredTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The f32 weights the quantized ones stand for (plain tensors unchanged): what the
    /// reference forward pass runs on to check a quantized kernel.
    pub fn dequantize(&self) -> Weights {
        let tensors = self
            .tensors
            .iter()
            .map(|(name, t)| {
                let t = match t {
                    StoredTensor::Plain(t) => t.clone(),
                    StoredTensor::Quantized(q) => q.dequantize(),
                };
                (name.clone(), t)
            })
            .collect();
        Weights::from_tensors(self.family, tensors)
    }
}
