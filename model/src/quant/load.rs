//! Reading quantized weights: a Hugging Face block-scaled FP8 checkpoint as it is stored, or
//! an unquantized checkpoint quantized at load.

use std::collections::HashMap;
use std::path::Path;

use super::{
    QuantError, QuantizedTensor, QuantizedWeights, ScaleDtype, Scales, StoredTensor, WeightsDtype,
};
use crate::spec::ModelSpec;
use crate::weights::{
    Tensor, TensorSpec, Weights, WeightsError, decode, file_refs, read_checkpoint, read_header,
    tensor_layout, unravel,
};

/// The suffix an FP8 checkpoint adds to a converted weight's name for its block scales
/// (`<module>.weight` → `<module>.weight_scale_inv`; it holds `scale`, not `1 / scale`, despite
/// the name: `W = Wq * weight_scale_inv`).
const SCALE_SUFFIX: &str = "_scale_inv";

/// One tensor of an FP8 checkpoint, before it is paired with the rest of its weight.
enum Found {
    Plain(Tensor),
    Codes(Vec<u8>),
    Scales(Scales),
}

impl QuantizedWeights {
    /// Reads a checkpoint (a file or a folder, as [`Weights::load`]) as `dtype`, by default what
    /// it is stored as ([`WeightsDtype::of_checkpoint`]). An FP8 block-scaled checkpoint (the
    /// config's `quantization_config`) is read as it is stored and only as fp8; an unquantized
    /// one is read by [`Weights::load`] and quantized ([`QuantizedWeights::quantize`]).
    pub fn load(
        spec: &ModelSpec,
        path: impl AsRef<Path>,
        dtype: Option<WeightsDtype>,
    ) -> Result<Self, QuantError> {
        let stored = WeightsDtype::of_checkpoint(spec);
        let dtype = dtype.unwrap_or(stored);
        if stored == WeightsDtype::Bf16 {
            return Self::quantize(spec, &Weights::load(spec, path)?, dtype);
        }
        if dtype != stored {
            return Err(QuantError::Dtype {
                message: format!(
                    "weights dtype {}: the checkpoint is already quantized ({} in config.json's quantization_config), \
                     and quantizing it again is not supported: use {} (its own format)",
                    dtype.name(),
                    stored.name(),
                    stored.name()
                ),
            });
        }
        let buffers = read_checkpoint(path.as_ref())?;
        Self::from_fp8_safetensors(spec, &file_refs(&buffers))
    }

    /// An FP8 block-scaled checkpoint from bytes in memory, one `(label, bytes)` pair per file.
    /// Every tensor of the layout must be present with its shape; the weights the
    /// `quantization_config` converts as `F8_E4M3` with a `weight_scale_inv` of one F32 or BF16
    /// scale per tile (finite, not negative), the others in BF16, F16 or F32; a NaN code, a
    /// quantized tensor the config keeps unquantized (or the reverse), and a scale without its
    /// weight are errors naming the tensor.
    pub fn from_fp8_safetensors(
        spec: &ModelSpec,
        files: &[(&Path, &[u8])],
    ) -> Result<Self, QuantError> {
        let formats = WeightsDtype::Fp8.format_of(spec)?;
        let layout = tensor_layout(spec)?;
        let expected: HashMap<&str, &TensorSpec> =
            layout.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut found: HashMap<String, Found> = HashMap::new();
        // The file of each weight's scales, for an error about them.
        let mut scale_files: HashMap<String, String> = HashMap::new();
        for (path, bytes) in files {
            let disp = path.display().to_string();
            for entry in read_header(&disp, bytes)? {
                let header = |message: String| WeightsError::Header {
                    path: disp.clone(),
                    name: entry.name.clone(),
                    message,
                };
                let shape_error = |expected: Vec<usize>| WeightsError::Shape {
                    path: disp.clone(),
                    name: entry.name.clone(),
                    expected,
                    found: entry.shape.clone(),
                };
                let non_finite = |i: usize, value: f32| WeightsError::NonFinite {
                    path: disp.clone(),
                    name: entry.name.clone(),
                    index: unravel(i, &entry.shape),
                    value,
                };
                let scaled =
                    entry.name.strip_suffix(SCALE_SUFFIX).filter(|w| expected.contains_key(w));
                let tensor = if let Some(weight) = scaled {
                    let Some(&format) = formats.get(weight) else {
                        return Err(header(format!(
                            "block scales for \"{weight}\", which the checkpoint does not quantize (not a linear weight, or named by quantization_config.modules_to_not_convert)"
                        ))
                        .into());
                    };
                    let ts = expected[weight];
                    let shape = format.scales_shape([ts.shape[0], ts.shape[1]]);
                    if entry.shape != shape {
                        return Err(shape_error(shape).into());
                    }
                    let dtype = match entry.dtype.as_str() {
                        "F32" => ScaleDtype::F32,
                        "BF16" => ScaleDtype::Bf16,
                        other => {
                            return Err(header(format!(
                                "scales stored as {other}; supported: F32, BF16"
                            ))
                            .into());
                        }
                    };
                    let values = decode(&entry.dtype, entry.data).expect("F32 and BF16 decode");
                    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
                        return Err(non_finite(i, values[i]).into());
                    }
                    if let Some(i) = values.iter().position(|&x| x < 0.0) {
                        return Err(header(format!(
                            "negative scale {} at index {:?}",
                            values[i],
                            unravel(i, &shape)
                        ))
                        .into());
                    }
                    scale_files.insert(entry.name.clone(), disp.clone());
                    Found::Scales(Scales { shape, dtype, values })
                } else if let Some(ts) = expected.get(entry.name.as_str()) {
                    if entry.shape != ts.shape {
                        return Err(shape_error(ts.shape.clone()).into());
                    }
                    match (formats.contains_key(&entry.name), entry.dtype.as_str()) {
                        (true, "F8_E4M3") => {
                            if let Some(i) = entry.data.iter().position(|&b| b & 0x7F == 0x7F) {
                                return Err(non_finite(i, f32::NAN).into());
                            }
                            Found::Codes(entry.data.to_vec())
                        }
                        (true, other) => {
                            return Err(header(format!(
                                "stored as {other}, but quantization_config converts it: expected F8_E4M3 with a \"{}{SCALE_SUFFIX}\"",
                                entry.name
                            ))
                            .into());
                        }
                        (false, "F8_E4M3") => {
                            return Err(header(
                                "stored as F8_E4M3, but quantization_config.modules_to_not_convert keeps it unquantized".into(),
                            )
                            .into());
                        }
                        (false, dtype) => {
                            let data =
                                decode(dtype, entry.data).ok_or_else(|| WeightsError::Dtype {
                                    path: disp.clone(),
                                    name: entry.name.clone(),
                                    dtype: dtype.to_string(),
                                })?;
                            if let Some(i) = data.iter().position(|x| !x.is_finite()) {
                                return Err(non_finite(i, data[i]).into());
                            }
                            Found::Plain(Tensor { shape: ts.shape.clone(), data })
                        }
                    }
                } else {
                    if crate::weights::ignored_tensor(spec, &entry.name) {
                        continue;
                    }
                    return Err(WeightsError::Unexpected {
                        path: disp,
                        name: entry.name,
                        family: spec.family.model_type(),
                    }
                    .into());
                };
                if found.insert(entry.name.clone(), tensor).is_some() {
                    return Err(WeightsError::Duplicate { path: disp, name: entry.name }.into());
                }
            }
        }
        let where_ = match files {
            [(p, _)] => p.display().to_string(),
            _ => files
                .first()
                .and_then(|(p, _)| p.parent())
                .map_or_else(|| "checkpoint".into(), |d| d.display().to_string()),
        };
        let mut take = |name: &str, shape: &[usize]| {
            found.remove(name).ok_or_else(|| WeightsError::Missing {
                path: where_.clone(),
                name: name.into(),
                expected: shape.to_vec(),
            })
        };
        let mut tensors = indexmap::IndexMap::with_capacity(layout.len());
        for ts in &layout {
            let stored = match formats.get(&ts.name) {
                Some(&format) => {
                    let shape = [ts.shape[0], ts.shape[1]];
                    let scale_name = format!("{}{SCALE_SUFFIX}", ts.name);
                    let (Found::Codes(data), Found::Scales(scales)) = (
                        take(&ts.name, &ts.shape)?,
                        take(&scale_name, &format.scales_shape(shape))?,
                    ) else {
                        unreachable!(
                            "a converted weight is read as codes, its scale name as scales"
                        );
                    };
                    let tensor = QuantizedTensor { shape, format, data, scales };
                    if let Some((g, [rows, cols], code, scale)) = tensor.overflowing_group() {
                        return Err(QuantError::Overflow {
                            path: scale_files.remove(&scale_name).unwrap_or_default(),
                            name: ts.name.clone(),
                            index: unravel(g, &tensor.scales.shape),
                            rows,
                            cols,
                            code,
                            scale,
                        });
                    }
                    StoredTensor::Quantized(tensor)
                }
                None => {
                    let Found::Plain(t) = take(&ts.name, &ts.shape)? else {
                        unreachable!("a weight kept unquantized is read as a plain tensor");
                    };
                    StoredTensor::Plain(t)
                }
            };
            tensors.insert(ts.name.clone(), stored);
        }
        Ok(Self { family: spec.family, dtype: WeightsDtype::Fp8, tensors })
    }
}
