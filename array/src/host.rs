//! [`HostArray`]: THE host array of the project. Kernel inputs and reference outputs (the
//! kernel library's cases), what the interpreter takes and returns, what PJRT buffers are
//! made from and read back into, and the megakernel's packed weights are all one type.

use crate::DType;
use crate::bf16::{bf16_to_f32, f32_to_bf16};
use crate::quant::e4m3fn_to_f32;
use half::{bf16, f16};
use std::sync::Arc;

/// A dense row-major array on the host: element type, shape and little-endian bytes, one
/// [`DType::host_bytes`] per element.
///
/// The bytes are shared and immutable while shared (`Arc::make_mut` copies them): cloning an
/// array is cheap, and a consumer that kept a clone knows an array with the same `Arc` holds
/// the same bytes without comparing them (the interpreter's kept inputs: the weights, from
/// decode step to decode step).
#[derive(Clone, PartialEq)]
pub struct HostArray {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Arc<Vec<u8>>,
}

impl std::fmt::Debug for HostArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_f32();
        let head: Vec<String> = v.iter().take(8).map(|x| format!("{x}")).collect();
        write!(
            f,
            "HostArray({}: [{}{}])",
            self.type_string(),
            head.join(", "),
            if v.len() > 8 { ", …" } else { "" }
        )
    }
}

impl HostArray {
    /// An array of `bytes`; `Err` naming the type when their length does not fit it.
    pub fn new(dtype: DType, shape: &[usize], bytes: Vec<u8>) -> Result<Self, String> {
        let a = HostArray { dtype, shape: shape.to_vec(), bytes: Arc::new(bytes) };
        a.validate()?;
        Ok(a)
    }

    /// The typed constructors' common part: `data` holds exactly `shape.product()` elements
    /// (the caller's invariant; a mismatch panics).
    fn of<T: bytemuck::Pod>(dtype: DType, shape: &[usize], data: &[T]) -> Self {
        let n = data.len();
        assert_eq!(
            shape.iter().product::<usize>(),
            n,
            "HostArray: shape {shape:?} does not hold {n} elements"
        );
        HostArray {
            dtype,
            shape: shape.to_vec(),
            bytes: Arc::new(bytemuck::cast_slice(data).to_vec()),
        }
    }

    pub fn from_f32(shape: &[usize], data: &[f32]) -> Self {
        Self::of(DType::F32, shape, data)
    }

    pub fn from_i32(shape: &[usize], data: &[i32]) -> Self {
        Self::of(DType::I32, shape, data)
    }

    pub fn from_bf16(shape: &[usize], data: &[bf16]) -> Self {
        Self::of(DType::Bf16, shape, data)
    }

    pub fn from_f16(shape: &[usize], data: &[f16]) -> Self {
        Self::of(DType::F16, shape, data)
    }

    pub fn from_i8(shape: &[usize], data: &[i8]) -> Self {
        Self::of(DType::I8, shape, data)
    }

    /// f32 values rounded to bf16 (nearest even; exact for values that already are bf16).
    pub fn bf16_from_f32(shape: &[usize], data: &[f32]) -> Self {
        Self::of(DType::Bf16, shape, &data.iter().map(|&x| f32_to_bf16(x)).collect::<Vec<u16>>())
    }

    /// Float values converted to the float `dtype` (bf16/f16 rounded to nearest even).
    pub fn from_f32_values(dtype: DType, shape: &[usize], data: &[f32]) -> Result<Self, String> {
        match dtype {
            DType::F32 => Ok(Self::from_f32(shape, data)),
            DType::Bf16 => Ok(Self::bf16_from_f32(shape, data)),
            DType::F16 => Ok(Self::of(
                DType::F16,
                shape,
                &data.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
            )),
            d => Err(format!("cannot make a {d} array from float values")),
        }
    }

    /// Integer values converted to the integer (or bool) `dtype`, wrapping as a cast does.
    pub fn from_i32_values(dtype: DType, shape: &[usize], data: &[i32]) -> Result<Self, String> {
        match dtype {
            DType::I32 => Ok(Self::from_i32(shape, data)),
            DType::I16 => {
                Ok(Self::of(DType::I16, shape, &data.iter().map(|&x| x as i16).collect::<Vec<_>>()))
            }
            DType::I8 => {
                Ok(Self::of(DType::I8, shape, &data.iter().map(|&x| x as i8).collect::<Vec<_>>()))
            }
            // One element a byte, its low nibble (numpy's layout of `int4`).
            DType::I4 => Ok(Self::of(
                DType::I4,
                shape,
                &data.iter().map(|&x| x as u8 & 0xF).collect::<Vec<_>>(),
            )),
            DType::Bool => Ok(Self::of(
                DType::Bool,
                shape,
                &data.iter().map(|&x| u8::from(x != 0)).collect::<Vec<_>>(),
            )),
            d => Err(format!("cannot make a {d} array from integer values")),
        }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The array cut into `parts` equal slabs along dim 0: a multi-device call's global
    /// operand (the devices' operands stacked on dim 0, as `jax.shard_map` with `P("x")` and
    /// the runtime's programs take them) into the devices' own. `Err` when dim 0 does not
    /// split evenly.
    pub fn split_leading(&self, parts: usize) -> Result<Vec<HostArray>, String> {
        let rows = self.shape.first().copied().unwrap_or(1);
        if parts == 0 || rows % parts != 0 {
            return Err(format!(
                "{} does not split into {parts} equal parts along dim 0",
                self.type_string()
            ));
        }
        let mut shape = self.shape.clone();
        if let Some(d) = shape.first_mut() {
            *d = rows / parts;
        }
        let chunk = self.bytes.len() / parts;
        Ok((0..parts)
            .map(|i| HostArray {
                dtype: self.dtype,
                shape: shape.clone(),
                bytes: Arc::new(self.bytes[i * chunk..(i + 1) * chunk].to_vec()),
            })
            .collect())
    }

    /// [`HostArray::split_leading`]'s inverse: `parts` (one dtype and shape) stacked along
    /// dim 0. `Err` naming the first part that differs.
    pub fn stack_leading(parts: &[HostArray]) -> Result<HostArray, String> {
        let first = parts.first().ok_or("nothing to stack")?;
        if let Some((i, p)) =
            parts.iter().enumerate().find(|(_, p)| p.dtype != first.dtype || p.shape != first.shape)
        {
            return Err(format!(
                "cannot stack part {i} ({}) on part 0 ({})",
                p.type_string(),
                first.type_string()
            ));
        }
        let mut shape = first.shape.clone();
        match shape.first_mut() {
            Some(d) => *d *= parts.len(),
            None => shape.push(parts.len()),
        }
        HostArray::new(
            first.dtype,
            &shape,
            parts.iter().flat_map(|p| p.bytes.iter().copied()).collect(),
        )
    }

    /// `bf16[8,128]`, as in call specs.
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }

    /// `Err` when the byte count is not the shape's elements of the dtype.
    pub fn validate(&self) -> Result<(), String> {
        let want = self.len() * self.dtype.host_bytes();
        if self.bytes.len() != want {
            return Err(format!(
                "{} holds {want} bytes, not {}",
                self.type_string(),
                self.bytes.len()
            ));
        }
        Ok(())
    }

    /// The elements as f32: floats widened exactly, integers converted.
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.bytes;
        match self.dtype {
            DType::F32 => {
                b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
            DType::Bf16 => {
                b.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
            }
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            DType::F8E4M3 => b.iter().map(|&x| e4m3fn_to_f32(x)).collect(),
            DType::F8E5M2 => b.iter().map(|&x| e5m2_to_f32(x)).collect(),
            DType::I32 | DType::I16 | DType::I8 | DType::I4 | DType::Bool => {
                self.to_i32().into_iter().map(|x| x as f32).collect()
            }
        }
    }

    /// The elements as i32: integers sign-extended (bool as 0/1, int4 from its low nibble),
    /// floats truncated toward zero.
    pub fn to_i32(&self) -> Vec<i32> {
        let b = &self.bytes;
        match self.dtype {
            DType::I32 => {
                b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
            DType::I16 => {
                b.chunks_exact(2).map(|c| i32::from(i16::from_le_bytes([c[0], c[1]]))).collect()
            }
            DType::I8 => b.iter().map(|&x| i32::from(x as i8)).collect(),
            DType::I4 => b.iter().map(|&x| i32::from(((x << 4) as i8) >> 4)).collect(),
            DType::Bool => b.iter().map(|&x| i32::from(x != 0)).collect(),
            DType::F32 | DType::Bf16 | DType::F16 | DType::F8E4M3 | DType::F8E5M2 => {
                self.to_f32().into_iter().map(|x| x as i32).collect()
            }
        }
    }

    /// The elements as bf16 (other dtypes rounded to nearest even).
    pub fn to_bf16(&self) -> Vec<bf16> {
        match self.dtype {
            DType::Bf16 => bytemuck::pod_collect_to_vec(&self.bytes[..]),
            _ => self.to_f32().into_iter().map(|x| bf16::from_bits(f32_to_bf16(x))).collect(),
        }
    }
}

/// An `f8E5M2` byte's value: IEEE-like (1 sign, 5 exponent bits with bias 15, 2 mantissa
/// bits; infinities and NaNs at the top exponent). e4m3fn is [`e4m3fn_to_f32`], the quantized
/// weights' conversion.
fn e5m2_to_f32(x: u8) -> f32 {
    let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from(x & 0x7f) >> 2;
    let m = f32::from(x & 3);
    match e {
        31 if m == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        0 => sign * m / 4.0 * 2f32.powi(-14),
        _ => sign * (1.0 + m / 4.0) * 2f32.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_leading_and_stack_leading_are_inverse() {
        let a = HostArray::from_i32(&[6, 2], &(0..12).collect::<Vec<_>>());
        let parts = a.split_leading(3).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.to_i32()).collect::<Vec<_>>(),
            [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11]]
        );
        assert_eq!(parts[1].shape, [2, 2]);
        assert_eq!(HostArray::stack_leading(&parts).unwrap(), a);
        assert_eq!(
            a.split_leading(4).unwrap_err(),
            "i32[6,2] does not split into 4 equal parts along dim 0"
        );
        let err =
            HostArray::stack_leading(&[parts[0].clone(), HostArray::from_i32(&[1, 2], &[0, 1])])
                .unwrap_err();
        assert_eq!(err, "cannot stack part 1 (i32[1,2]) on part 0 (i32[2,2])");
    }

    #[test]
    fn values_round_trip_through_every_integer_and_bf16() {
        let a = HostArray::bf16_from_f32(&[2, 2], &[1.0, 1.0 + 1.0 / 256.0, -3.5, 1e-3]);
        assert_eq!(a.to_f32(), vec![1.0, 1.0, -3.5, crate::round_bf16(1e-3)]);
        assert_eq!(a.bytes.len(), 8);
        let ints = HostArray::from_i32_values(DType::I8, &[3], &[-1, 127, 300]).unwrap();
        assert_eq!(ints.to_i32(), vec![-1, 127, 44]);
        let bools = HostArray::from_i32_values(DType::Bool, &[3], &[0, 5, -1]).unwrap();
        assert_eq!((bools.bytes.to_vec(), bools.to_f32()), (vec![0, 1, 1], vec![0.0, 1.0, 1.0]));
        let int4 = HostArray::new(DType::I4, &[2], vec![0x07, 0x0f]).unwrap();
        assert_eq!(int4.to_i32(), vec![7, -1]);
        assert!(HostArray::from_f32_values(DType::I32, &[1], &[1.0]).unwrap_err().contains("i32"));
    }

    #[test]
    fn a_wrong_byte_count_is_an_error_naming_the_type() {
        assert_eq!(
            HostArray::new(DType::F32, &[2], vec![0; 7]).unwrap_err(),
            "f32[2] holds 8 bytes, not 7"
        );
    }

    #[test]
    fn eight_bit_floats_decode() {
        // e4m3fn: 0x38 = 1.0, 0x7e = 448 (its largest), 0x01 = 2^-9, 0xff = NaN.
        let e4m3 =
            HostArray::new(DType::F8E4M3, &[4], vec![0x38, 0x7e, 0x01, 0xff]).unwrap().to_f32();
        assert_eq!(e4m3[..3], [1.0, 448.0, 2f32.powi(-9)]);
        assert!(e4m3[3].is_nan());
        // e5m2: 0x3c = 1.0, 0x7b = 57344 (its largest), 0x7c = inf, 0xc0 = -2.
        let e5m2 =
            HostArray::new(DType::F8E5M2, &[4], vec![0x3c, 0x7b, 0x7c, 0xc0]).unwrap().to_f32();
        assert_eq!(e5m2, vec![1.0, 57344.0, f32::INFINITY, -2.0]);
    }
}
