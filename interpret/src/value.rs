//! Runtime values: element types, whole vector tiles, scalars, and the elementwise math on
//! them. Floats of every width are held as `f32` (bf16/f16 values rounded to nearest even
//! after every op that produces them, as the hardware does); integers up to 32 bits as
//! `i32` in tiles and `i64` in scalars.

use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::parse::{FloatKind, Type};
use half::{bf16, f16};
use palladium_array::quant::{e4m3fn_to_f32, f32_to_e4m3fn};
use rayon::prelude::*;
use smallvec::SmallVec;
use std::sync::Arc;

pub(crate) use crate::view::Shape;

/// An element type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    /// Signed 4-bit integers (quantized weights), held sign-extended like every integer.
    I4,
    I8,
    I16,
    I32,
    I64,
    Index,
    /// `float8_e4m3fn` (quantized weights), held as its exact f32 value.
    F8E4M3FN,
    F16,
    Bf16,
    F32,
    F64,
    DmaSem,
    Sem,
}

impl DType {
    pub fn from_type(t: &Type) -> Option<DType> {
        Some(match t {
            Type::Int(1) => DType::Bool,
            Type::Int(4) => DType::I4,
            Type::Int(8) => DType::I8,
            Type::Int(16) => DType::I16,
            Type::Int(32) => DType::I32,
            Type::Int(64) => DType::I64,
            Type::Index => DType::Index,
            Type::Float(FloatKind::F8E4M3FN) => DType::F8E4M3FN,
            Type::Float(FloatKind::F16) => DType::F16,
            Type::Float(FloatKind::Bf16) => DType::Bf16,
            Type::Float(FloatKind::F32) => DType::F32,
            Type::Float(FloatKind::F64) => DType::F64,
            Type::DmaSemaphore => DType::DmaSem,
            Type::Semaphore => DType::Sem,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F8E4M3FN | DType::F16 | DType::Bf16 | DType::F32 | DType::F64)
    }

    pub fn is_sem(self) -> bool {
        matches!(self, DType::DmaSem | DType::Sem)
    }

    /// Bits of one element.
    pub fn bits(self) -> u32 {
        match self {
            DType::Bool => 1,
            DType::I4 => 4,
            DType::I8 | DType::F8E4M3FN => 8,
            DType::I16 | DType::F16 | DType::Bf16 => 16,
            DType::I32 | DType::F32 | DType::DmaSem | DType::Sem => 32,
            DType::I64 | DType::Index | DType::F64 => 64,
        }
    }

    /// Bytes of one element in host arrays and for DMA byte counts (`i1` counts as 1).
    pub fn size(self) -> usize {
        (self.bits() as usize).div_ceil(8)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::I4 => "i4",
            DType::I8 => "i8",
            DType::F8E4M3FN => "f8E4M3FN",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Index => "index",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::DmaSem => "!tpu.dma_semaphore",
            DType::Sem => "!tpu.semaphore",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Round an f32 to the precision of `dt` (bf16/f16/f8e4m3fn: round to nearest even; e4m3fn
/// as `ml_dtypes` converts, NaN past its largest value).
#[inline]
pub(crate) fn round_f(dt: DType, x: f32) -> f32 {
    match dt {
        DType::Bf16 => round_bf16(x),
        DType::F8E4M3FN => round_e4m3fn(x),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

pub(crate) use palladium_array::round_bf16;

/// `x` rounded to `float8_e4m3fn` (the one conversion, `palladium_array::quant`).
fn round_e4m3fn(x: f32) -> f32 {
    e4m3fn_to_f32(f32_to_e4m3fn(x))
}

/// [`round_f`] over a whole slice (one dispatch on `dt`, a vectorizable loop).
pub(crate) fn round_slice(dt: DType, xs: &mut [f32]) {
    match dt {
        DType::Bf16 => xs.iter_mut().for_each(|x| *x = round_bf16(*x)),
        DType::F16 => xs.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::F8E4M3FN => xs.iter_mut().for_each(|x| *x = round_e4m3fn(*x)),
        _ => {}
    }
}

/// `xs` rounded to `dt` into a new vector (one pass: no copy rounded afterwards).
pub(crate) fn rounded(dt: DType, xs: &[f32]) -> Vec<f32> {
    match dt {
        DType::Bf16 => xs.iter().map(|&x| round_bf16(x)).collect(),
        DType::F16 => xs.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        DType::F8E4M3FN => xs.iter().map(|&x| round_e4m3fn(x)).collect(),
        _ => xs.to_vec(),
    }
}

/// Wrap an integer to the width of `dt` (sign-extended; `i1` as 0/1).
#[inline]
pub(crate) fn wrap_i(dt: DType, x: i64) -> i64 {
    match dt {
        DType::Bool => x & 1,
        DType::I4 => i64::from(((x as i8) << 4) >> 4),
        DType::I8 => i64::from(x as i8),
        DType::I16 => i64::from(x as i16),
        DType::I32 | DType::DmaSem | DType::Sem => i64::from(x as i32),
        _ => x,
    }
}

/// The unsigned value of `x` at the width of `dt`.
#[inline]
fn unsigned(dt: DType, x: i64) -> u64 {
    let bits = dt.bits();
    if bits >= 64 { x as u64 } else { (x as u64) & ((1u64 << bits) - 1) }
}

/// Tile storage.
#[derive(Clone, Debug)]
pub(crate) enum Data {
    F(Vec<f32>),
    I(Vec<i32>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }
    /// Keep the vector for a later run ([`crate::recycle`]).
    pub fn recycle(self) {
        match self {
            Data::F(v) => crate::recycle::keep_f32s(v),
            Data::I(v) => crate::recycle::keep_i32s(v),
        }
    }
    /// `n` elements of unspecified values (recycled storage; see [`crate::memory`]).
    pub fn stale(dt: DType, n: usize) -> Data {
        if dt.is_float() {
            Data::F(crate::recycle::stale_f32s(n))
        } else {
            Data::I(crate::recycle::stale_i32s(n))
        }
    }
    pub fn filled(dt: DType, n: usize, f: f32, i: i32) -> Data {
        if dt.is_float() {
            let mut v = crate::recycle::f32s(n);
            v.resize(n, f);
            Data::F(v)
        } else {
            let mut v = crate::recycle::i32s(n);
            v.resize(n, i);
            Data::I(v)
        }
    }
}

/// A whole vector value (`vector<…>`).
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub dt: DType,
    pub shape: Shape,
    pub data: Arc<Data>,
}

impl Tile {
    pub fn new(dt: DType, shape: Shape, data: Data) -> Tile {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tile { dt, shape, data: Arc::new(data) }
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn i(&self) -> &[i32] {
        match &*self.data {
            Data::I(v) => v,
            Data::F(_) => &[],
        }
    }
    pub fn splat(dt: DType, shape: Shape, s: &Val) -> Tile {
        let n = shape.iter().product();
        let data = match s {
            Val::Float(x) => Data::F(vec![round_f(dt, *x as f32); n]),
            Val::Int(x) if dt.is_float() => Data::F(vec![round_f(dt, *x as f32); n]),
            Val::Int(x) => Data::I(vec![wrap_i(dt, *x) as i32; n]),
            _ => Data::filled(dt, n, f32::NAN, 0),
        };
        Tile::new(dt, shape, data)
    }
    /// Element `k` as a scalar value.
    pub fn get(&self, k: usize) -> Val {
        match &*self.data {
            Data::F(v) => Val::Float(f64::from(v[k])),
            Data::I(v) => Val::Int(i64::from(v[k])),
        }
    }
}

/// A value in a slot.
#[derive(Clone, Debug, Default)]
pub(crate) enum Val {
    #[default]
    Undef,
    /// Integers, `index` and `i1` (0/1).
    Int(i64),
    /// Floats (already rounded to their type).
    Float(f64),
    Tile(Tile),
    Ref(Arc<crate::view::View>),
}

impl Val {
    pub fn int(&self) -> Result<i64> {
        match self {
            Val::Int(i) => Ok(*i),
            other => bail!(Malformed, "expected an integer scalar, got {}", other.kind()),
        }
    }
    pub fn tile(&self) -> Result<&Tile> {
        match self {
            Val::Tile(t) => Ok(t),
            other => bail!(Malformed, "expected a vector, got {}", other.kind()),
        }
    }
    pub fn view(&self) -> Result<&Arc<crate::view::View>> {
        match self {
            Val::Ref(v) => Ok(v),
            other => bail!(Malformed, "expected a memref, got {}", other.kind()),
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Val::Undef => "an undefined value",
            Val::Int(_) => "an integer",
            Val::Float(_) => "a float",
            Val::Tile(_) => "a vector",
            Val::Ref(_) => "a memref",
        }
    }
}

// --- strided iteration ------------------------------------------------------------------------

/// Call `f(offset, len, inner_stride)` for every innermost row of `shape` laid out with
/// `strides` from `off` (row-major order). A rank-0 shape is one row of length 1.
#[inline]
pub(crate) fn walk_rows(
    shape: &[usize],
    strides: &[isize],
    off: isize,
    mut f: impl FnMut(isize, usize, isize),
) {
    let n = shape.len();
    if n == 0 {
        f(off, 1, 1);
        return;
    }
    if shape.contains(&0) {
        return;
    }
    let (inner, istride) = (shape[n - 1], strides[n - 1]);
    let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, n - 1);
    let mut base = off;
    loop {
        f(base, inner, istride);
        // Advance the outer index.
        let mut d = n - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            base += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            base -= strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// Copies of at least this many contiguous elements are split across the rayon pool.
const PARALLEL_COPY_MIN: usize = 1 << 18;

/// Whether a large copy should be split across the pool: not from inside a task of a
/// parallel grid, whose pool is already busy.
pub(crate) fn split_copy(n: usize) -> bool {
    n >= PARALLEL_COPY_MIN && rayon::current_thread_index().is_none()
}

/// Whether `shape` laid out with `strides` is one contiguous run (row-major, no gaps).
pub(crate) fn contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut want = 1isize;
    for d in (0..shape.len()).rev() {
        if shape[d] != 1 && strides[d] != want {
            return false;
        }
        want *= shape[d] as isize;
    }
    true
}

/// Gather `shape` elements from `src` (strided) into a new contiguous vector.
pub(crate) fn gather<T: Copy + Send + Sync>(
    src: &[T],
    off: isize,
    strides: &[isize],
    shape: &[usize],
) -> Vec<T> {
    let n: usize = shape.iter().product();
    if split_copy(n) && contiguous(shape, strides) {
        let mut out = Vec::with_capacity(n);
        out.par_extend(src[off as usize..off as usize + n].par_iter().copied());
        return out;
    }
    let mut out = Vec::with_capacity(n);
    walk_rows(shape, strides, off, |o, len, s| {
        let o = o as usize;
        if s == 1 {
            out.extend_from_slice(&src[o..o + len]);
        } else if s == 0 {
            out.extend(std::iter::repeat_n(src[o], len));
        } else {
            for k in 0..len {
                out.push(src[(o as isize + k as isize * s) as usize]);
            }
        }
    });
    out
}

/// Scatter contiguous `vals` into `dst` (strided), optionally only where `mask` is set, or
/// adding (`add`).
pub(crate) fn scatter<T: Copy + std::ops::Add<Output = T>>(
    dst: &mut [T],
    off: isize,
    strides: &[isize],
    shape: &[usize],
    vals: &[T],
    mask: Option<&[i32]>,
    add: bool,
) {
    let mut k = 0usize;
    walk_rows(shape, strides, off, |o, len, s| {
        let src = &vals[k..k + len];
        if s == 1 && mask.is_none() {
            let d = &mut dst[o as usize..o as usize + len];
            if add {
                d.iter_mut().zip(src).for_each(|(x, y)| *x = *x + *y);
            } else {
                d.copy_from_slice(src);
            }
        } else {
            for (j, &v) in src.iter().enumerate() {
                let p = (o + j as isize * s) as usize;
                if mask.is_none_or(|m| m[k + j] != 0) {
                    dst[p] = if add { dst[p] + v } else { v };
                }
            }
        }
        k += len;
    });
}

/// Copy `shape` elements from `src` (strided from `soff`) to `dst` (strided from `doff`),
/// row by row, without an intermediate buffer.
pub(crate) fn copy_strided<T: Copy + Send + Sync>(
    dst: &mut [T],
    doff: isize,
    dstrides: &[isize],
    src: &[T],
    soff: isize,
    sstrides: &[isize],
    shape: &[usize],
) {
    let total: usize = shape.iter().product();
    if split_copy(total) && contiguous(shape, dstrides) && contiguous(shape, sstrides) {
        let (d, s) = (
            &mut dst[doff as usize..doff as usize + total],
            &src[soff as usize..soff as usize + total],
        );
        d.par_chunks_mut(PARALLEL_COPY_MIN / 4)
            .zip(s.par_chunks(PARALLEL_COPY_MIN / 4))
            .for_each(|(d, s)| d.copy_from_slice(s));
        return;
    }
    let n = shape.len();
    if n == 0 {
        dst[doff as usize] = src[soff as usize];
        return;
    }
    if shape.contains(&0) {
        return;
    }
    let (inner, ds, ss) = (shape[n - 1], dstrides[n - 1], sstrides[n - 1]);
    let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, n - 1);
    let (mut d, mut s) = (doff, soff);
    loop {
        if ds == 1 && ss == 1 {
            dst[d as usize..d as usize + inner]
                .copy_from_slice(&src[s as usize..s as usize + inner]);
        } else {
            for j in 0..inner as isize {
                dst[(d + j * ds) as usize] = src[(s + j * ss) as usize];
            }
        }
        let mut k = n - 1;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            d += dstrides[k];
            s += sstrides[k];
            if idx[k] < shape[k] {
                break;
            }
            d -= dstrides[k] * shape[k] as isize;
            s -= sstrides[k] * shape[k] as isize;
            idx[k] = 0;
        }
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides_of(shape: &[usize]) -> Shape {
    let mut s: Shape = SmallVec::from_elem(0, shape.len());
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc *= shape[d];
    }
    s
}

/// Permute a tile: result dim `d` is input dim `perm[d]`.
pub(crate) fn permute(t: &Tile, perm: &[usize]) -> Tile {
    let shape: Shape = perm.iter().map(|&p| t.shape[p]).collect();
    let n = perm.len();
    if n >= 2 && perm[n - 2] == n - 1 && perm[n - 1] == n - 2 && (0..n - 2).all(|d| perm[d] == d) {
        let (r, c) = (t.shape[n - 2], t.shape[n - 1]);
        let data = match &*t.data {
            Data::F(v) => Data::F(transpose_last2(v, r, c)),
            Data::I(v) => Data::I(transpose_last2(v, r, c)),
        };
        return Tile::new(t.dt, shape, data);
    }
    let st = strides_of(&t.shape);
    let strides: SmallVec<[isize; 4]> = perm.iter().map(|&p| st[p] as isize).collect();
    let data = match &*t.data {
        Data::F(v) => Data::F(gather(v, 0, &strides, &shape)),
        Data::I(v) => Data::I(gather(v, 0, &strides, &shape)),
    };
    Tile::new(t.dt, shape, data)
}

/// Swap the last two dims of `src` (a stack of `r×c` matrices), in cache-sized blocks.
fn transpose_last2<T: Copy + Default>(src: &[T], r: usize, c: usize) -> Vec<T> {
    const B: usize = 16;
    let mut out = vec![T::default(); src.len()];
    if r == 0 || c == 0 {
        return out;
    }
    for (s, o) in src.chunks_exact(r * c).zip(out.chunks_exact_mut(r * c)) {
        for i0 in (0..r).step_by(B) {
            for j0 in (0..c).step_by(B) {
                for i in i0..(i0 + B).min(r) {
                    for j in j0..(j0 + B).min(c) {
                        o[j * r + i] = s[i * c + j];
                    }
                }
            }
        }
    }
    out
}

// --- elementwise ops --------------------------------------------------------------------------

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bin {
    AddF,
    SubF,
    MulF,
    DivF,
    RemF,
    MaxF,
    MinF,
    MaxNumF,
    MinNumF,
    PowF,
    Atan2,
    AddI,
    SubI,
    MulI,
    DivSI,
    DivUI,
    RemSI,
    RemUI,
    MaxSI,
    MinSI,
    MaxUI,
    MinUI,
    AndI,
    OrI,
    XorI,
    ShlI,
    ShrSI,
    ShrUI,
    CeilDivSI,
    FloorDivSI,
}

impl Bin {
    pub fn from_name(n: &str) -> Option<Bin> {
        use Bin::*;
        Some(match n {
            "arith.addf" => AddF,
            "arith.subf" => SubF,
            "arith.mulf" => MulF,
            "arith.divf" => DivF,
            "arith.remf" => RemF,
            "arith.maximumf" => MaxF,
            "arith.minimumf" => MinF,
            "arith.maxnumf" => MaxNumF,
            "arith.minnumf" => MinNumF,
            "math.powf" => PowF,
            "math.atan2" => Atan2,
            "arith.addi" => AddI,
            "arith.subi" => SubI,
            "arith.muli" => MulI,
            "arith.divsi" => DivSI,
            "arith.divui" => DivUI,
            "arith.remsi" => RemSI,
            "arith.remui" => RemUI,
            "arith.maxsi" => MaxSI,
            "arith.minsi" => MinSI,
            "arith.maxui" => MaxUI,
            "arith.minui" => MinUI,
            "arith.andi" => AndI,
            "arith.ori" => OrI,
            "arith.xori" => XorI,
            "arith.shli" => ShlI,
            "arith.shrsi" => ShrSI,
            "arith.shrui" => ShrUI,
            "arith.ceildivsi" => CeilDivSI,
            "arith.floordivsi" => FloorDivSI,
            _ => return None,
        })
    }
}

#[inline]
fn fbin(op: Bin, a: f32, b: f32) -> f32 {
    use Bin::*;
    match op {
        AddF => a + b,
        SubF => a - b,
        MulF => a * b,
        DivF => a / b,
        RemF => a % b,
        MaxF => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else if a == b {
                if a.is_sign_negative() { b } else { a }
            } else {
                a.max(b)
            }
        }
        MinF => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else if a == b {
                if a.is_sign_negative() { a } else { b }
            } else {
                a.min(b)
            }
        }
        MaxNumF => a.max(b),
        MinNumF => a.min(b),
        PowF => a.powf(b),
        Atan2 => a.atan2(b),
        _ => f32::NAN,
    }
}

fn ibin(op: Bin, dt: DType, a: i64, b: i64) -> Result<i64> {
    use Bin::*;
    let (ua, ub) = (unsigned(dt, a), unsigned(dt, b));
    let bits = u64::from(dt.bits());
    let r = match op {
        AddI => a.wrapping_add(b),
        SubI => a.wrapping_sub(b),
        MulI => a.wrapping_mul(b),
        DivSI | RemSI | CeilDivSI | FloorDivSI | DivUI | RemUI if b == 0 => {
            bail!(Undefined, "integer division by zero")
        }
        DivSI => a.wrapping_div(b),
        RemSI => a.wrapping_rem(b),
        CeilDivSI => {
            let q = a.wrapping_div(b);
            if (a % b != 0) && ((a < 0) == (b < 0)) { q + 1 } else { q }
        }
        FloorDivSI => {
            let q = a.wrapping_div(b);
            if (a % b != 0) && ((a < 0) != (b < 0)) { q - 1 } else { q }
        }
        DivUI => (ua / ub) as i64,
        RemUI => (ua % ub) as i64,
        MaxSI => a.max(b),
        MinSI => a.min(b),
        MaxUI => ua.max(ub) as i64,
        MinUI => ua.min(ub) as i64,
        AndI => a & b,
        OrI => a | b,
        XorI => a ^ b,
        ShlI => {
            if ub >= bits {
                0
            } else {
                a.wrapping_shl(ub as u32)
            }
        }
        ShrSI => {
            if ub >= bits {
                if a < 0 { -1 } else { 0 }
            } else {
                a >> ub
            }
        }
        ShrUI => {
            if ub >= bits {
                0
            } else {
                (ua >> ub) as i64
            }
        }
        _ => bail!(Malformed, "{op:?} is not an integer op"),
    };
    Ok(wrap_i(dt, r))
}

/// `a op b` on two scalars or two tiles of the same shape.
pub(crate) fn binary(op: Bin, dt: DType, a: &Val, b: &Val) -> Result<Val> {
    match (a, b) {
        (Val::Tile(x), Val::Tile(y)) => {
            if x.shape != y.shape {
                bail!(Mismatch, "operand shapes differ: {:?} vs {:?}", x.shape, y.shape);
            }
            let data = match (&*x.data, &*y.data) {
                (Data::F(p), Data::F(q)) => {
                    let mut out: Vec<f32> = match op {
                        Bin::AddF => p.iter().zip(q).map(|(a, b)| a + b).collect(),
                        Bin::SubF => p.iter().zip(q).map(|(a, b)| a - b).collect(),
                        Bin::MulF => p.iter().zip(q).map(|(a, b)| a * b).collect(),
                        Bin::DivF => p.iter().zip(q).map(|(a, b)| a / b).collect(),
                        _ => p.iter().zip(q).map(|(a, b)| fbin(op, *a, *b)).collect(),
                    };
                    round_slice(dt, &mut out);
                    Data::F(out)
                }
                (Data::I(p), Data::I(q)) => {
                    // Bitwise ops, min and max of sign-extended values stay sign-extended.
                    let out = match op {
                        Bin::AddI if dt == DType::I32 => {
                            p.iter().zip(q).map(|(a, b)| a.wrapping_add(*b)).collect()
                        }
                        Bin::SubI if dt == DType::I32 => {
                            p.iter().zip(q).map(|(a, b)| a.wrapping_sub(*b)).collect()
                        }
                        Bin::MulI if dt == DType::I32 => {
                            p.iter().zip(q).map(|(a, b)| a.wrapping_mul(*b)).collect()
                        }
                        Bin::AndI => p.iter().zip(q).map(|(a, b)| a & b).collect(),
                        Bin::OrI => p.iter().zip(q).map(|(a, b)| a | b).collect(),
                        Bin::XorI => p.iter().zip(q).map(|(a, b)| a ^ b).collect(),
                        Bin::MaxSI if dt != DType::Bool => {
                            p.iter().zip(q).map(|(a, b)| *a.max(b)).collect()
                        }
                        Bin::MinSI if dt != DType::Bool => {
                            p.iter().zip(q).map(|(a, b)| *a.min(b)).collect()
                        }
                        _ => p
                            .iter()
                            .zip(q)
                            .map(|(a, b)| {
                                ibin(op, dt, i64::from(*a), i64::from(*b)).map(|r| r as i32)
                            })
                            .collect::<Result<Vec<_>>>()?,
                    };
                    Data::I(out)
                }
                _ => bail!(Mismatch, "operands of different element kinds"),
            };
            Ok(Val::Tile(Tile::new(dt, x.shape.clone(), data)))
        }
        (Val::Float(x), Val::Float(y)) => {
            Ok(Val::Float(f64::from(round_f(dt, fbin(op, *x as f32, *y as f32)))))
        }
        (Val::Int(x), Val::Int(y)) => Ok(Val::Int(ibin(op, dt, *x, *y)?)),
        _ => bail!(Mismatch, "operands are {} and {}", a.kind(), b.kind()),
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Un {
    NegF,
    AbsF,
    AbsI,
    Exp,
    Exp2,
    Log,
    Log1p,
    Log2,
    Sqrt,
    Rsqrt,
    Tanh,
    Sin,
    Cos,
    Tan,
    Floor,
    Ceil,
    Round,
    RoundEven,
    Erf,
    Ctlz,
    Ctpop,
    Reciprocal,
    Trunc,
}

impl Un {
    pub fn from_name(n: &str) -> Option<Un> {
        use Un::*;
        Some(match n {
            "arith.negf" => NegF,
            "math.absf" => AbsF,
            "math.absi" => AbsI,
            "math.exp" => Exp,
            "math.exp2" => Exp2,
            "math.log" => Log,
            "math.log1p" => Log1p,
            "math.log2" => Log2,
            "math.sqrt" => Sqrt,
            "math.rsqrt" => Rsqrt,
            "math.tanh" => Tanh,
            "math.sin" => Sin,
            "math.cos" => Cos,
            "math.tan" => Tan,
            "math.floor" => Floor,
            "math.ceil" => Ceil,
            "math.round" => Round,
            "math.roundeven" => RoundEven,
            "math.erf" => Erf,
            "math.ctlz" => Ctlz,
            "math.ctpop" => Ctpop,
            "tpu.reciprocal" => Reciprocal,
            "math.trunc" => Trunc,
            _ => return None,
        })
    }
}

#[inline]
fn fun(op: Un, x: f32) -> f32 {
    use Un::*;
    match op {
        NegF => -x,
        AbsF => x.abs(),
        Exp => x.exp(),
        Exp2 => x.exp2(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Log2 => x.log2(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Tanh => x.tanh(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tan => x.tan(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round(),
        RoundEven => x.round_ties_even(),
        Erf => libm::erff(x),
        Reciprocal => 1.0 / x,
        Trunc => x.trunc(),
        _ => f32::NAN,
    }
}

fn iun(op: Un, dt: DType, x: i64) -> i64 {
    let u = unsigned(dt, x);
    let bits = dt.bits();
    wrap_i(
        dt,
        match op {
            Un::AbsI => x.wrapping_abs(),
            Un::Ctlz => i64::from(u.leading_zeros()) - (64 - i64::from(bits)),
            Un::Ctpop => i64::from(u.count_ones()),
            _ => x,
        },
    )
}

pub(crate) fn unary(op: Un, dt: DType, a: &Val) -> Result<Val> {
    Ok(match a {
        Val::Tile(t) => {
            let data = match &*t.data {
                Data::F(p) => {
                    // The common ops as their own loops (`fun`'s match is not taken out of
                    // the loop), then one rounding pass.
                    let mut out: Vec<f32> = match op {
                        Un::NegF => p.iter().map(|&x| -x).collect(),
                        Un::AbsF => p.iter().map(|&x| x.abs()).collect(),
                        Un::Rsqrt => p.iter().map(|&x| 1.0 / x.sqrt()).collect(),
                        Un::Sqrt => p.iter().map(|&x| x.sqrt()).collect(),
                        Un::Reciprocal => p.iter().map(|&x| 1.0 / x).collect(),
                        Un::Exp => p.iter().map(|&x| x.exp()).collect(),
                        _ => p.iter().map(|&x| fun(op, x)).collect(),
                    };
                    round_slice(dt, &mut out);
                    Data::F(out)
                }
                Data::I(p) => {
                    Data::I(p.iter().map(|x| iun(op, dt, i64::from(*x)) as i32).collect())
                }
            };
            Val::Tile(Tile::new(dt, t.shape.clone(), data))
        }
        Val::Float(x) => Val::Float(f64::from(round_f(dt, fun(op, *x as f32)))),
        Val::Int(x) => Val::Int(iun(op, dt, *x)),
        _ => bail!(Mismatch, "operand is {}", a.kind()),
    })
}

/// `arith.cmpf` predicates (0 = false … 15 = true) on f32.
#[inline]
fn cmpf(pred: i64, a: f32, b: f32) -> bool {
    let uno = a.is_nan() || b.is_nan();
    match pred {
        0 => false,
        1 => !uno && a == b,
        2 => !uno && a > b,
        3 => !uno && a >= b,
        4 => !uno && a < b,
        5 => !uno && a <= b,
        6 => !uno && a != b,
        7 => !uno,
        8 => uno || a == b,
        9 => uno || a > b,
        10 => uno || a >= b,
        11 => uno || a < b,
        12 => uno || a <= b,
        13 => uno || a != b,
        14 => uno,
        _ => true,
    }
}

/// `arith.cmpi` predicates (eq ne slt sle sgt sge ult ule ugt uge).
#[inline]
fn cmpi(pred: i64, dt: DType, a: i64, b: i64) -> bool {
    let (ua, ub) = (unsigned(dt, a), unsigned(dt, b));
    match pred {
        0 => a == b,
        1 => a != b,
        2 => a < b,
        3 => a <= b,
        4 => a > b,
        5 => a >= b,
        6 => ua < ub,
        7 => ua <= ub,
        8 => ua > ub,
        _ => ua >= ub,
    }
}

/// `pred` as a constant: one loop per predicate, compiled without a branch on it per
/// element (a comparison per element is all these loops do).
macro_rules! by_pred {
    ($pred:expr, $f:ident, $p:expr, $q:expr) => {
        match $pred {
            0 => $f::<0>($p, $q),
            1 => $f::<1>($p, $q),
            2 => $f::<2>($p, $q),
            3 => $f::<3>($p, $q),
            4 => $f::<4>($p, $q),
            5 => $f::<5>($p, $q),
            6 => $f::<6>($p, $q),
            7 => $f::<7>($p, $q),
            8 => $f::<8>($p, $q),
            9 => $f::<9>($p, $q),
            10 => $f::<10>($p, $q),
            11 => $f::<11>($p, $q),
            12 => $f::<12>($p, $q),
            13 => $f::<13>($p, $q),
            14 => $f::<14>($p, $q),
            _ => $f::<15>($p, $q),
        }
    };
}

fn cmp_f<const P: i64>(p: &[f32], q: &[f32]) -> Vec<i32> {
    p.iter().zip(q).map(|(a, b)| i32::from(cmpf(P, *a, *b))).collect()
}

/// Signed predicates (`P` at most 5) on i32s.
fn cmp_si<const P: i64>(p: &[i32], q: &[i32]) -> Vec<i32> {
    p.iter()
        .zip(q)
        .map(|(&a, &b)| i32::from(cmpi(P, DType::I32, i64::from(a), i64::from(b))))
        .collect()
}

pub(crate) fn compare(float: bool, pred: i64, dt: DType, a: &Val, b: &Val) -> Result<Val> {
    Ok(match (a, b) {
        (Val::Tile(x), Val::Tile(y)) => {
            if x.shape != y.shape {
                bail!(Mismatch, "operand shapes differ: {:?} vs {:?}", x.shape, y.shape);
            }
            let out: Vec<i32> = match (&*x.data, &*y.data) {
                (Data::F(p), Data::F(q)) => by_pred!(pred, cmp_f, p, q),
                // Signed predicates on sign-extended values need no widening.
                (Data::I(p), Data::I(q)) if pred <= 5 => by_pred!(pred, cmp_si, p, q),
                (Data::I(p), Data::I(q)) => p
                    .iter()
                    .zip(q)
                    .map(|(a, b)| i32::from(cmpi(pred, dt, i64::from(*a), i64::from(*b))))
                    .collect(),
                _ => bail!(Mismatch, "operands of different element kinds"),
            };
            Val::Tile(Tile::new(DType::Bool, x.shape.clone(), Data::I(out)))
        }
        (Val::Float(x), Val::Float(y)) if float => {
            Val::Int(i64::from(cmpf(pred, *x as f32, *y as f32)))
        }
        (Val::Int(x), Val::Int(y)) if !float => Val::Int(i64::from(cmpi(pred, dt, *x, *y))),
        _ => bail!(Mismatch, "cannot compare {} with {}", a.kind(), b.kind()),
    })
}

pub(crate) fn select(c: &Val, t: &Val, f: &Val) -> Result<Val> {
    match c {
        Val::Int(c) => Ok(if *c != 0 { t.clone() } else { f.clone() }),
        Val::Tile(m) => {
            let (Val::Tile(a), Val::Tile(b)) = (t, f) else {
                bail!(Mismatch, "a vector condition needs vector operands")
            };
            if a.shape != m.shape || b.shape != m.shape {
                bail!(Mismatch, "select shapes differ");
            }
            let m = m.i();
            let data = match (&*a.data, &*b.data) {
                (Data::F(p), Data::F(q)) => Data::F(
                    m.iter()
                        .zip(p.iter().zip(q))
                        .map(|(c, (x, y))| if *c != 0 { *x } else { *y })
                        .collect(),
                ),
                (Data::I(p), Data::I(q)) => Data::I(
                    m.iter()
                        .zip(p.iter().zip(q))
                        .map(|(c, (x, y))| if *c != 0 { *x } else { *y })
                        .collect(),
                ),
                _ => bail!(Mismatch, "select operands of different kinds"),
            };
            Ok(Val::Tile(Tile::new(a.dt, a.shape.clone(), data)))
        }
        _ => bail!(Mismatch, "select condition is {}", c.kind()),
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum Cast {
    ExtF,
    TruncF,
    ExtSI,
    ExtUI,
    TruncI,
    FpToSI,
    FpToUI,
    SiToFp,
    UiToFp,
    IndexCast,
    IndexCastUI,
    Bitcast,
}

impl Cast {
    pub fn from_name(n: &str) -> Option<Cast> {
        use Cast::*;
        Some(match n {
            "arith.extf" => ExtF,
            "arith.truncf" => TruncF,
            "arith.extsi" => ExtSI,
            "arith.extui" => ExtUI,
            "arith.trunci" => TruncI,
            "arith.fptosi" => FpToSI,
            "arith.fptoui" => FpToUI,
            "arith.sitofp" => SiToFp,
            "arith.uitofp" => UiToFp,
            "arith.index_cast" => IndexCast,
            "arith.index_castui" => IndexCastUI,
            "arith.bitcast" => Bitcast,
            _ => return None,
        })
    }
}

fn cast_scalar_f(op: Cast, from: DType, to: DType, x: f32) -> Result<Either> {
    Ok(match op {
        Cast::ExtF | Cast::TruncF => Either::F(round_f(to, x)),
        Cast::FpToSI => Either::I(wrap_i(to, x as i64)),
        Cast::FpToUI => Either::I(wrap_i(to, if x <= 0.0 { 0 } else { x as u64 as i64 })),
        Cast::Bitcast => Either::I(wrap_i(
            to,
            match from {
                DType::F32 => i64::from(x.to_bits() as i32),
                DType::Bf16 => i64::from(bf16::from_f32(x).to_bits() as i16),
                DType::F16 => i64::from(f16::from_f32(x).to_bits() as i16),
                _ => bail!(Unsupported, "bitcast from {from}"),
            },
        )),
        _ => bail!(Malformed, "{op:?} applied to a float"),
    })
}

fn cast_scalar_i(op: Cast, from: DType, to: DType, x: i64) -> Result<Either> {
    Ok(match op {
        Cast::ExtSI | Cast::IndexCast => {
            Either::I(wrap_i(to, if from == DType::Bool && x != 0 { -1 } else { x }))
        }
        Cast::ExtUI | Cast::IndexCastUI => Either::I(wrap_i(to, unsigned(from, x) as i64)),
        Cast::TruncI => Either::I(wrap_i(to, x)),
        Cast::SiToFp => Either::F(round_f(to, x as f32)),
        Cast::UiToFp => Either::F(round_f(to, unsigned(from, x) as f32)),
        Cast::Bitcast => Either::F(match to {
            DType::F32 => f32::from_bits(x as u32),
            DType::Bf16 => bf16::from_bits(x as u16).to_f32(),
            DType::F16 => f16::from_bits(x as u16).to_f32(),
            _ => return Ok(Either::I(wrap_i(to, x))),
        }),
        _ => bail!(Malformed, "{op:?} applied to an integer"),
    })
}

enum Either {
    F(f32),
    I(i64),
}

pub(crate) fn cast(op: Cast, from: DType, to: DType, a: &Val) -> Result<Val> {
    let one = |e: Either| match e {
        Either::F(f) => Val::Float(f64::from(f)),
        Either::I(i) => Val::Int(i),
    };
    Ok(match a {
        Val::Float(x) => one(cast_scalar_f(op, from, to, *x as f32)?),
        Val::Int(x) => one(cast_scalar_i(op, from, to, *x)?),
        // A float cast that keeps every value (to f32, or to its own type) shares the
        // storage, as a shape cast does.
        Val::Tile(t)
            if to.is_float()
                && matches!(&*t.data, Data::F(_))
                && (to == DType::F32
                    || (to == from && matches!(op, Cast::ExtF | Cast::TruncF))) =>
        {
            Val::Tile(Tile { dt: to, shape: t.shape.clone(), data: t.data.clone() })
        }
        Val::Tile(t) => {
            let n = t.len();
            let data = match &*t.data {
                Data::F(p) => {
                    if to.is_float() {
                        Data::F(rounded(to, p))
                    } else {
                        let mut out = Vec::with_capacity(n);
                        for x in p {
                            match cast_scalar_f(op, from, to, *x)? {
                                Either::I(i) => out.push(i as i32),
                                Either::F(_) => bail!(Malformed, "float-to-float cast to {to}"),
                            }
                        }
                        Data::I(out)
                    }
                }
                // `i1` widened (a mask as 0/1 or 0/-1), `i32` to f32 or bf16: one loop each.
                Data::I(p)
                    if from == DType::Bool
                        && matches!(op, Cast::ExtUI | Cast::ExtSI)
                        && matches!(
                            to,
                            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::Index
                        ) =>
                {
                    let neg = op == Cast::ExtSI;
                    Data::I(
                        p.iter().map(|&x| if neg { -i32::from(x != 0) } else { x & 1 }).collect(),
                    )
                }
                Data::I(p)
                    if from == DType::I32
                        && matches!(op, Cast::SiToFp)
                        && matches!(to, DType::F32 | DType::Bf16) =>
                {
                    let bf = to == DType::Bf16;
                    Data::F(
                        p.iter()
                            .map(|&x| if bf { round_bf16(x as f32) } else { x as f32 })
                            .collect(),
                    )
                }
                Data::I(p) => {
                    if to.is_float() {
                        let mut out = Vec::with_capacity(n);
                        for x in p {
                            match cast_scalar_i(op, from, to, i64::from(*x))? {
                                Either::F(f) => out.push(f),
                                Either::I(i) => out.push(i as f32),
                            }
                        }
                        Data::F(out)
                    } else {
                        let mut out = Vec::with_capacity(n);
                        for x in p {
                            match cast_scalar_i(op, from, to, i64::from(*x))? {
                                Either::I(i) => out.push(i as i32),
                                Either::F(_) => {
                                    bail!(Malformed, "int-to-int cast produced a float")
                                }
                            }
                        }
                        Data::I(out)
                    }
                }
            };
            Val::Tile(Tile::new(to, t.shape.clone(), data))
        }
        _ => bail!(Mismatch, "cannot cast {}", a.kind()),
    })
}

/// Error helper for ops that require a float element type.
#[allow(dead_code)]
pub(crate) fn need_float(dt: DType) -> Result<()> {
    if dt.is_float() {
        Ok(())
    } else {
        Err(InterpError::new(ErrorKind::Malformed, format!("expected a float type, got {dt}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_element_types_convert_as_ml_dtypes() {
        let tile = |dt: DType, data: Data| {
            Val::Tile(Tile::new(dt, [data.len()].into_iter().collect(), data))
        };
        let floats = |v: &Val| match &*v.tile().unwrap().data {
            Data::F(x) => x.clone(),
            Data::I(_) => panic!("a float tile"),
        };
        // i4: held sign-extended; sitofp gives the value, trunci wraps to 4 bits.
        let int4 = tile(DType::I4, Data::I(vec![-8, -1, 0, 7]));
        assert_eq!(
            floats(&cast(Cast::SiToFp, DType::I4, DType::Bf16, &int4).unwrap()),
            vec![-8.0, -1.0, 0.0, 7.0]
        );
        let wide = tile(DType::I32, Data::I(vec![8, 15, -9, 23]));
        assert_eq!(
            cast(Cast::TruncI, DType::I32, DType::I4, &wide).unwrap().tile().unwrap().i(),
            &[-8, -1, 7, 7]
        );
        // f8e4m3fn: truncf rounds to nearest even (17 ties to 16), past 464 is NaN; extf exact.
        let x = tile(DType::F32, Data::F(vec![17.0, 448.0, 465.0, 2f32.powi(-9)]));
        let f8 = cast(Cast::TruncF, DType::F32, DType::F8E4M3FN, &x).unwrap();
        let back = floats(&cast(Cast::ExtF, DType::F8E4M3FN, DType::F32, &f8).unwrap());
        assert_eq!((back[0], back[1], back[3]), (16.0, 448.0, 2f32.powi(-9)));
        assert!(back[2].is_nan());
    }

    #[test]
    fn vector_compares_and_casts_give_what_the_scalar_ops_give() {
        let tile = |dt: DType, data: Data| {
            Val::Tile(Tile::new(dt, [data.len()].into_iter().collect(), data))
        };
        let fs = [f32::NAN, -f32::INFINITY, -1.5, -0.0, 0.0, 1.5, 2.0, f32::INFINITY];
        let (fa, fb): (Vec<f32>, Vec<f32>) =
            fs.iter().flat_map(|&a| fs.iter().map(move |&b| (a, b))).unzip();
        let is = [i32::MIN, -7, -1, 0, 1, 7, i32::MAX];
        let (ia, ib): (Vec<i32>, Vec<i32>) =
            is.iter().flat_map(|&a| is.iter().map(move |&b| (a, b))).unzip();
        let (x, y) = (tile(DType::F32, Data::F(fa.clone())), tile(DType::F32, Data::F(fb.clone())));
        for pred in 0..16 {
            let got = compare(true, pred, DType::F32, &x, &y).unwrap();
            let want: Vec<i32> = fa
                .iter()
                .zip(&fb)
                .map(|(&a, &b)| {
                    compare(true, pred, DType::F32, &Val::Float(a.into()), &Val::Float(b.into()))
                        .unwrap()
                        .int()
                        .unwrap() as i32
                })
                .collect();
            assert_eq!(got.tile().unwrap().i(), want, "cmpf predicate {pred}");
        }
        let (x, y) = (tile(DType::I32, Data::I(ia.clone())), tile(DType::I32, Data::I(ib.clone())));
        for pred in 0..10 {
            let got = compare(false, pred, DType::I32, &x, &y).unwrap();
            let want: Vec<i32> = ia
                .iter()
                .zip(&ib)
                .map(|(&a, &b)| {
                    compare(false, pred, DType::I32, &Val::Int(a.into()), &Val::Int(b.into()))
                        .unwrap()
                        .int()
                        .unwrap() as i32
                })
                .collect();
            assert_eq!(got.tile().unwrap().i(), want, "cmpi predicate {pred}");
        }
        // Widened masks and i32 to float: the one-loop paths against the scalar casts.
        let mask = tile(DType::Bool, Data::I(vec![0, 1, 1, 0]));
        for (op, to) in
            [(Cast::ExtUI, DType::I32), (Cast::ExtSI, DType::I32), (Cast::ExtSI, DType::I8)]
        {
            let want: Vec<i32> = [0, 1, 1, 0]
                .iter()
                .map(|&b| cast(op, DType::Bool, to, &Val::Int(b)).unwrap().int().unwrap() as i32)
                .collect();
            assert_eq!(
                cast(op, DType::Bool, to, &mask).unwrap().tile().unwrap().i(),
                want,
                "{op:?} to {to}"
            );
        }
        let ints = tile(DType::I32, Data::I(is.to_vec()));
        for to in [DType::F32, DType::Bf16] {
            let Data::F(got) =
                &*cast(Cast::SiToFp, DType::I32, to, &ints).unwrap().tile().unwrap().data.clone()
            else {
                panic!("floats")
            };
            let want: Vec<u32> = is
                .iter()
                .map(|&i| match cast(Cast::SiToFp, DType::I32, to, &Val::Int(i.into())).unwrap() {
                    Val::Float(f) => (f as f32).to_bits(),
                    _ => panic!("a float"),
                })
                .collect();
            assert_eq!(got.iter().map(|f| f.to_bits()).collect::<Vec<_>>(), want, "sitofp to {to}");
        }
    }

    #[test]
    fn branch_free_bf16_rounding_matches_half() {
        // Every 997th bit pattern, plus the edges (ties, overflow to inf, NaNs, zeros).
        let edges = [
            0u32,
            0x8000_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0x7f80_0001,
            0xffc0_0000,
            0x0000_0001,
            0x0080_8000,
        ];
        for b in (0..=u32::MAX).step_by(997).chain(edges) {
            let x = f32::from_bits(b);
            let (want, got) = (bf16::from_f32(x).to_f32(), round_bf16(x));
            assert_eq!(want.to_bits(), got.to_bits(), "bits {b:#010x}");
        }
    }
}
