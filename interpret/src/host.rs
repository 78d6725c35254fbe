//! Host arrays ([`HostArray`], the project's one) in and out of the interpreter's values, and
//! the call spec of a run.

use crate::error::{Result, bail};
use crate::value::{DType, Data};
use half::f16;
use palladium_array::quant::{e4m3fn_to_f32, f32_to_e4m3fn};
use palladium_array::{DType as Element, HostArray, f32_to_bf16};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Elements widened in one parallel chunk.
const WIDEN_CHUNK: usize = 1 << 16;

/// `floats` or `ints` with `f` bound to the conversion of one little-endian element of
/// `dtype` to storage and `size` to its bytes (a closure and a constant per type, so the
/// loops using them inline and vectorize), or `neither` for the types the interpreter does
/// not run (e5m2: refused before, as `interpreter_dtype` has none for it).
macro_rules! with_widen {
    ($dtype:expr, |$f:ident, $size:ident| floats => $floats:expr, ints => $ints:expr, neither => $neither:expr) => {
        match $dtype {
            Element::F32 => {
                const $size: usize = 4;
                let $f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                $floats
            }
            Element::Bf16 => {
                const $size: usize = 2;
                let $f =
                    |c: &[u8]| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
                $floats
            }
            Element::F16 => {
                const $size: usize = 2;
                let $f = |c: &[u8]| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                $floats
            }
            Element::I32 => {
                const $size: usize = 4;
                let $f = |c: &[u8]| i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                $ints
            }
            Element::I16 => {
                const $size: usize = 2;
                let $f = |c: &[u8]| i32::from(i16::from_le_bytes([c[0], c[1]]));
                $ints
            }
            Element::I8 => {
                const $size: usize = 1;
                let $f = |c: &[u8]| i32::from(c[0] as i8);
                $ints
            }
            Element::I4 => {
                const $size: usize = 1;
                let $f = |c: &[u8]| i32::from(((c[0] as i8) << 4) >> 4);
                $ints
            }
            Element::F8E4M3 => {
                const $size: usize = 1;
                let $f = |c: &[u8]| e4m3fn_to_f32(c[0]);
                $floats
            }
            Element::Bool => {
                const $size: usize = 1;
                let $f = |c: &[u8]| i32::from(c[0] != 0);
                $ints
            }
            _ => $neither,
        }
    };
}

/// The interpreter's element type for a host array's (`None` for the one it does not run:
/// `f8E5M2`).
pub(crate) fn interpreter_dtype(d: Element) -> Option<DType> {
    Some(match d {
        Element::Bf16 => DType::Bf16,
        Element::F16 => DType::F16,
        Element::F32 => DType::F32,
        Element::I32 => DType::I32,
        Element::I16 => DType::I16,
        Element::I8 => DType::I8,
        Element::I4 => DType::I4,
        Element::F8E4M3 => DType::F8E4M3FN,
        Element::Bool => DType::Bool,
        Element::F8E5M2 => return None,
    })
}

/// A host array's values as the interpreter holds them.
pub(crate) fn to_data(a: &HostArray) -> Data {
    let b = &a.bytes;
    with_widen!(a.dtype, |f, SIZE| floats => {
        // The hot case (every bf16 operand): widen vectorized, in parallel chunks when large
        // (a small one, e.g. a decode step's KV cache, is not worth waking the pool).
        let n = b.len() / SIZE;
        let mut v = crate::recycle::f32s(n);
        if crate::value::split_copy(n) {
            v.resize(n, 0.0);
            v.par_chunks_mut(WIDEN_CHUNK).zip(b.par_chunks(WIDEN_CHUNK * SIZE)).for_each(|(out, bytes)| {
                out.iter_mut().zip(bytes.chunks_exact(SIZE)).for_each(|(o, c)| *o = f(c));
            });
        } else {
            v.extend(b.chunks_exact(SIZE).map(f));
        }
        Data::F(v)
    }, ints => {
        let mut v = crate::recycle::i32s(b.len() / SIZE);
        v.extend(b.chunks_exact(SIZE).map(f));
        Data::I(v)
    }, neither => Data::I(Vec::new()))
}

/// Interpreter values as a host array of `dtype`.
pub(crate) fn from_data(dtype: DType, shape: &[usize], d: &Data) -> Result<HostArray> {
    let (element, bytes): (Element, Vec<u8>) = match (dtype, d) {
        (DType::F32, Data::F(v)) => (Element::F32, bytemuck::cast_slice(v).to_vec()),
        (DType::Bf16, Data::F(v)) => {
            (Element::Bf16, v.iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect())
        }
        (DType::F16, Data::F(v)) => (
            Element::F16,
            bytemuck::cast_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).to_vec(),
        ),
        (DType::I32, Data::I(v)) => (Element::I32, bytemuck::cast_slice(v).to_vec()),
        (DType::I16, Data::I(v)) => (
            Element::I16,
            bytemuck::cast_slice(&v.iter().map(|&x| x as i16).collect::<Vec<_>>()).to_vec(),
        ),
        (DType::I8, Data::I(v)) => (Element::I8, v.iter().map(|&x| x as i8 as u8).collect()),
        // One element a byte (numpy's layout of `int4`): the low nibble, sign-extended.
        (DType::I4, Data::I(v)) => (Element::I4, v.iter().map(|&x| x as i8 as u8 & 0xF).collect()),
        (DType::F8E4M3FN, Data::F(v)) => {
            (Element::F8E4M3, v.iter().map(|&x| f32_to_e4m3fn(x)).collect())
        }
        (DType::Bool, Data::I(v)) => (Element::Bool, v.iter().map(|&x| u8::from(x != 0)).collect()),
        (d, _) => bail!(Unsupported, "cannot return an array of {d}"),
    };
    Ok(HostArray { dtype: element, shape: shape.to_vec(), bytes: Arc::new(bytes) })
}

/// The inputs of the last run, widened to the interpreter's storage (bf16/f16 as f32, small
/// ints as i32), by position, with the bytes they were widened from. A run whose input has
/// the same bytes as last time (weights, from decode step to decode step; a benchmark's
/// operands) shares the kept array instead of converting again. The bytes are kept as the
/// caller's `Arc` (no copy): an input holding that same `Arc` holds the same bytes (they are
/// immutable while shared), so the decoder's weights pass without being read; other inputs
/// are compared by a `memcmp` (stopped at the first difference, split in chunks across the
/// rayon pool when large). The kernel writing into a shared array copies it first
/// (copy-on-write).
#[derive(Debug, Default)]
pub(crate) struct WidenedInputs(Mutex<Vec<Option<Arc<Widened>>>>);

/// An input's bytes and their widened values.
#[derive(Debug)]
struct Widened {
    dtype: Element,
    bytes: Arc<Vec<u8>>,
    data: Arc<Data>,
}

impl WidenedInputs {
    /// `host` (input `position` of the call) as storage. The lock is never held across the
    /// check or the conversion (the conversion runs on the rayon pool, which may run another
    /// call meanwhile).
    pub fn get(&self, position: usize, host: &HostArray) -> Arc<Data> {
        let last = self.kept().get(position).cloned().flatten();
        if let Some(w) = last
            && w.dtype == host.dtype
            && (Arc::ptr_eq(&w.bytes, &host.bytes) || same_bytes(&w.bytes, &host.bytes))
        {
            return w.data.clone();
        }
        let data = Arc::new(to_data(host));
        let widened =
            Arc::new(Widened { dtype: host.dtype, bytes: host.bytes.clone(), data: data.clone() });
        let mut kept = self.kept();
        if kept.len() <= position {
            kept.resize(position + 1, None);
        }
        kept[position] = Some(widened);
        data
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Option<Arc<Widened>>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Bytes compared in one parallel chunk.
const COMPARE_CHUNK: usize = 1 << 20;

/// `a == b`; large arrays (the weights) compared in chunks across the rayon pool, every
/// byte still compared (the answer is the same whatever the thread count).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // Not from inside a task of a parallel grid, whose pool is already busy.
    if a.len() < 4 * COMPARE_CHUNK || rayon::current_thread_index().is_some() {
        return a == b;
    }
    a.par_chunks(COMPARE_CHUNK).zip(b.par_chunks(COMPARE_CHUNK)).all(|(x, y)| x == y)
}

/// The shapes and aliases of a call (the oracle's call-spec JSON).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallSpec {
    /// Scalar-prefetch arrays then inputs.
    pub inputs: Vec<(Element, Vec<usize>)>,
    pub outputs: Vec<(Element, Vec<usize>)>,
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
        let arrays = |key: &str| -> Result<Vec<(Element, Vec<usize>)>> {
            let Some(xs) = v.get(key).and_then(|x| x.as_array()) else {
                bail!(BadInput, "call spec: missing `{key}`")
            };
            xs.iter().map(|x| parse_array_type(x.as_str().unwrap_or(""))).collect()
        };
        let mut aliases = Vec::new();
        if let Some(xs) = v.get("input_output_aliases").and_then(|x| x.as_array()) {
            for a in xs {
                let pair = a
                    .as_array()
                    .map(|p| p.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>())
                    .unwrap_or_default();
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
pub fn parse_array_type(s: &str) -> Result<(Element, Vec<usize>)> {
    let Some((d, rest)) = s.split_once('[') else { bail!(BadInput, "bad array type `{s}`") };
    let dt = match d.parse::<Element>() {
        Ok(dt) => dt,
        Err(e) => bail!(BadInput, "{e} in `{s}`"),
    };
    let dims = rest.trim_end_matches(']');
    let shape = if dims.trim().is_empty() {
        Ok(Vec::new())
    } else {
        dims.split(',').map(|x| x.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>()
    };
    match shape {
        Ok(shape) => Ok((dt, shape)),
        Err(_) => bail!(BadInput, "bad dims in `{s}`"),
    }
}
