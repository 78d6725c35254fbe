//! Host arrays: what goes into and comes out of [`crate::Program::run`].

use crate::error::{Result, bail};
use crate::value::{DType, Data, round_bf16};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Elements widened in one parallel chunk.
const WIDEN_CHUNK: usize = 1 << 16;

/// `floats` or `ints` with `f` bound to the conversion of one little-endian element of
/// `dtype` to storage and `size` to its bytes (a closure and a constant per type, so the
/// loops using them inline and vectorize), or `neither` for types no host array holds.
macro_rules! with_widen {
    ($dtype:expr, |$f:ident, $size:ident| floats => $floats:expr, ints => $ints:expr, neither => $neither:expr) => {
        match $dtype {
            DType::F32 => {
                const $size: usize = 4;
                let $f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                $floats
            }
            DType::Bf16 => {
                const $size: usize = 2;
                let $f = |c: &[u8]| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
                $floats
            }
            DType::F16 => {
                const $size: usize = 2;
                let $f = |c: &[u8]| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                $floats
            }
            DType::I32 => {
                const $size: usize = 4;
                let $f = |c: &[u8]| i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                $ints
            }
            DType::I16 => {
                const $size: usize = 2;
                let $f = |c: &[u8]| i32::from(i16::from_le_bytes([c[0], c[1]]));
                $ints
            }
            DType::I8 => {
                const $size: usize = 1;
                let $f = |c: &[u8]| i32::from(c[0] as i8);
                $ints
            }
            DType::Bool => {
                const $size: usize = 1;
                let $f = |c: &[u8]| i32::from(c[0] != 0);
                $ints
            }
            _ => $neither,
        }
    };
}

/// A dense row-major array on the host: element type, shape and little-endian bytes.
#[derive(Clone, PartialEq)]
pub struct HostArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for HostArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_f32();
        let head: Vec<String> = v.iter().take(8).map(|x| format!("{x}")).collect();
        write!(f, "HostArray({}{:?}: [{}{}])", self.dtype, self.shape, head.join(", "), if v.len() > 8 { ", …" } else { "" })
    }
}

impl HostArray {
    fn check(shape: &[usize], n: usize) {
        assert_eq!(shape.iter().product::<usize>(), n, "HostArray: shape {shape:?} does not hold {n} elements");
    }

    pub fn from_f32(shape: &[usize], data: &[f32]) -> Self {
        Self::check(shape, data.len());
        HostArray { dtype: DType::F32, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() }
    }

    pub fn from_i32(shape: &[usize], data: &[i32]) -> Self {
        Self::check(shape, data.len());
        HostArray { dtype: DType::I32, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() }
    }

    pub fn from_bf16(shape: &[usize], data: &[bf16]) -> Self {
        Self::check(shape, data.len());
        HostArray { dtype: DType::Bf16, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() }
    }

    pub fn from_f16(shape: &[usize], data: &[f16]) -> Self {
        Self::check(shape, data.len());
        HostArray { dtype: DType::F16, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() }
    }

    pub fn from_i8(shape: &[usize], data: &[i8]) -> Self {
        Self::check(shape, data.len());
        HostArray { dtype: DType::I8, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() }
    }

    /// Any host buffer viewed as bytes (`bytemuck`): `data` must hold exactly
    /// `shape.product()` elements of `dtype` (e.g. `&[bf16]`, `&[u16]` or `&[u8]` for bf16).
    pub fn from_pod<T: bytemuck::Pod>(dtype: DType, shape: &[usize], data: &[T]) -> Result<Self> {
        let a = HostArray { dtype, shape: shape.to_vec(), bytes: bytemuck::cast_slice(data).to_vec() };
        a.validate("host buffer")?;
        Ok(a)
    }

    /// Float values converted to `dtype` (bf16/f16 rounded to nearest even, f32 as is).
    pub fn from_f32_values(dtype: DType, shape: &[usize], data: &[f32]) -> Result<Self> {
        Self::check(shape, data.len());
        Self::from_data(dtype, shape, &Data::F(data.to_vec()))
    }

    /// Integer values converted to `dtype` (i32, i16, i8 or bool).
    pub fn from_i32_values(dtype: DType, shape: &[usize], data: &[i32]) -> Result<Self> {
        Self::check(shape, data.len());
        Self::from_data(dtype, shape, &Data::I(data.to_vec()))
    }

    /// The bytes reinterpreted as `T` (`bytemuck`); `T` must have the element size.
    pub fn to_pod<T: bytemuck::Pod>(&self) -> Vec<T> {
        assert_eq!(std::mem::size_of::<T>(), self.dtype.size(), "HostArray::to_pod: element size of {}", self.dtype);
        bytemuck::pod_collect_to_vec(&self.bytes)
    }

    /// f32 values rounded to bf16 (round to nearest even).
    pub fn bf16_from_f32(shape: &[usize], data: &[f32]) -> Self {
        let v: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
        Self::from_bf16(shape, &v)
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as f32 (floats widened, integers converted).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.to_data() {
            Data::F(v) => v,
            Data::I(v) => v.into_iter().map(|x| x as f32).collect(),
        }
    }

    /// The elements as i32 (integer types only; floats are truncated).
    pub fn to_i32(&self) -> Vec<i32> {
        match self.to_data() {
            Data::I(v) => v,
            Data::F(v) => v.into_iter().map(|x| x as i32).collect(),
        }
    }

    pub fn to_bf16(&self) -> Vec<bf16> {
        match self.dtype {
            DType::Bf16 => bytemuck::pod_collect_to_vec(&self.bytes),
            _ => self.to_f32().into_iter().map(bf16::from_f32).collect(),
        }
    }

    pub(crate) fn to_data(&self) -> Data {
        let b = &self.bytes;
        with_widen!(self.dtype, |f, SIZE| floats => {
            // The hot case (every bf16 operand): widen in parallel chunks, vectorized.
            let mut v = crate::recycle::f32s(b.len() / SIZE);
            v.resize(b.len() / SIZE, 0.0);
            v.par_chunks_mut(WIDEN_CHUNK).zip(b.par_chunks(WIDEN_CHUNK * SIZE)).for_each(|(out, bytes)| {
                out.iter_mut().zip(bytes.chunks_exact(SIZE)).for_each(|(o, c)| *o = f(c));
            });
            Data::F(v)
        }, ints => {
            let mut v = crate::recycle::i32s(b.len() / SIZE);
            v.extend(b.chunks_exact(SIZE).map(f));
            Data::I(v)
        }, neither => Data::I(Vec::new()))
    }

    /// Whether [`HostArray::to_data`] would give exactly `data` (bit for bit): a read of
    /// both, no allocation, stopped early at a difference.
    fn widens_to(&self, data: &Data) -> bool {
        let b = &self.bytes;
        with_widen!(self.dtype, |f, SIZE| floats => match data {
            Data::F(v) => {
                v.len() * SIZE == b.len()
                    && v.par_chunks(WIDEN_CHUNK).zip(b.par_chunks(WIDEN_CHUNK * SIZE)).all(|(v, bytes)| v.iter().zip(bytes.chunks_exact(SIZE)).fold(true, |same, (x, c)| same & (x.to_bits() == f(c).to_bits())))
            }
            Data::I(_) => false,
        }, ints => match data {
            Data::I(v) => v.len() * SIZE == b.len() && v.iter().zip(b.chunks_exact(SIZE)).all(|(x, c)| *x == f(c)),
            Data::F(_) => false,
        }, neither => false)
    }

    pub(crate) fn from_data(dtype: DType, shape: &[usize], d: &Data) -> Result<Self> {
        let bytes: Vec<u8> = match (dtype, d) {
            (DType::F32, Data::F(v)) => bytemuck::cast_slice(v).to_vec(),
            (DType::Bf16, Data::F(v)) => v.iter().flat_map(|&x| ((round_bf16(x).to_bits() >> 16) as u16).to_le_bytes()).collect(),
            (DType::F16, Data::F(v)) => bytemuck::cast_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).to_vec(),
            (DType::I32, Data::I(v)) => bytemuck::cast_slice(v).to_vec(),
            (DType::I16, Data::I(v)) => bytemuck::cast_slice(&v.iter().map(|&x| x as i16).collect::<Vec<_>>()).to_vec(),
            (DType::I8, Data::I(v)) => v.iter().map(|&x| x as i8 as u8).collect(),
            (DType::Bool, Data::I(v)) => v.iter().map(|&x| u8::from(x != 0)).collect(),
            (d, _) => bail!(Unsupported, "cannot return an array of {d}"),
        };
        Ok(HostArray { dtype, shape: shape.to_vec(), bytes })
    }

    /// Check dtype and byte length.
    pub(crate) fn validate(&self, what: &str) -> Result<()> {
        if self.bytes.len() != self.len() * self.dtype.size() {
            bail!(BadInput, "{what}: {} bytes for {} elements of {}", self.bytes.len(), self.len(), self.dtype);
        }
        Ok(())
    }
}

/// The inputs of the last run, widened to the interpreter's storage (bf16/f16 as f32, small
/// ints as i32), by position. A run whose input widens to the same values as last time
/// (weights, from decode step to decode step; a benchmark's operands) shares the kept array
/// instead of converting again: checking reads the bytes and the array but writes nothing,
/// and stops at the first difference. The kernel writing into a shared array copies it
/// first (copy-on-write).
#[derive(Debug, Default)]
pub(crate) struct WidenedInputs(Mutex<Vec<Option<Arc<Data>>>>);

impl WidenedInputs {
    /// `host` (input `position` of the call) as storage. The lock is never held across the
    /// conversion (it runs on the rayon pool, which may run another call meanwhile).
    pub fn get(&self, position: usize, host: &HostArray) -> Arc<Data> {
        let last = self.kept().get(position).cloned().flatten();
        if let Some(data) = last
            && host.widens_to(&data)
        {
            return data;
        }
        let data = Arc::new(host.to_data());
        let mut kept = self.kept();
        if kept.len() <= position {
            kept.resize(position + 1, None);
        }
        kept[position] = Some(data.clone());
        data
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Option<Arc<Data>>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The shapes and aliases of a call (the oracle's call-spec JSON).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallSpec {
    /// Scalar-prefetch arrays then inputs.
    pub inputs: Vec<(DType, Vec<usize>)>,
    pub outputs: Vec<(DType, Vec<usize>)>,
    /// `(operand index counting prefetch arrays, output index)`: the output starts as a copy
    /// of that input.
    pub aliases: Vec<(usize, usize)>,
}

impl CallSpec {
    /// Parse `{"inputs":["bf16[1024,2048]",…],"outputs":[…],"input_output_aliases":[[i,o]],…}`.
    pub fn from_json(json: &str) -> Result<CallSpec> {
        let v: serde_json::Value = match serde_json::from_str(json) {
            Ok(v) => v,
            Err(e) => bail!(BadInput, "call spec: {e}"),
        };
        let arrays = |key: &str| -> Result<Vec<(DType, Vec<usize>)>> {
            let Some(xs) = v.get(key).and_then(|x| x.as_array()) else { bail!(BadInput, "call spec: missing `{key}`") };
            xs.iter().map(|x| parse_array_type(x.as_str().unwrap_or(""))).collect()
        };
        let mut aliases = Vec::new();
        if let Some(xs) = v.get("input_output_aliases").and_then(|x| x.as_array()) {
            for a in xs {
                let pair = a.as_array().map(|p| p.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>()).unwrap_or_default();
                if pair.len() != 2 {
                    bail!(BadInput, "call spec: bad alias {a}");
                }
                aliases.push((pair[0] as usize, pair[1] as usize));
            }
        }
        Ok(CallSpec { inputs: arrays("inputs")?, outputs: arrays("outputs")?, aliases })
    }
}

/// `bf16[8,128]` → (Bf16, [8, 128]).
pub fn parse_array_type(s: &str) -> Result<(DType, Vec<usize>)> {
    let Some((d, rest)) = s.split_once('[') else { bail!(BadInput, "bad array type `{s}`") };
    let Some(dt) = DType::parse(d) else { bail!(BadInput, "unknown dtype `{d}` in `{s}`") };
    let dims = rest.trim_end_matches(']');
    let shape = if dims.trim().is_empty() { Ok(Vec::new()) } else { dims.split(',').map(|x| x.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>() };
    match shape {
        Ok(shape) => Ok((dt, shape)),
        Err(_) => bail!(BadInput, "bad dims in `{s}`"),
    }
}
