//! A projection through one weight block: the decode step's GEMVs (q/k/v, o, router,
//! `lm_head`, the experts' gate/up/down) are all this one product.

use palladium_dsl::prelude::*;

/// How a weight block is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[in, out]`: `x @ w` (Hugging Face's `weight.T`, the library kernels' layout).
    InOut,
    /// `[out, in]`: `x @ w.T`, the MXU reading `w` transposed. The megakernel packs its
    /// o-projection and down-projection columns this way, so that one dense-stream chunk or
    /// expert chunk is `[hidden, columns]` whatever the projection.
    OutIn,
}

/// `x @ w` (or `x @ w.T`) on the MXU, f32 accumulation: the bf16 x bf16 -> f32 product of the
/// activations `x` `[rows, in]` with one weight block. The one place a projection's
/// operands meet, where a different weight format would be decoded.
pub fn project(x: Val, w: Val, layout: WeightLayout) -> Val {
    match layout {
        WeightLayout::InOut => dot(x, w),
        WeightLayout::OutIn => dot_t(x, w),
    }
}

/// The scales of a quantized weight block: f32 `[in / group, out]` (one row when `group` is
/// at least the block's inputs), one per `group` consecutive inputs of each output column,
/// whatever the block's [`WeightLayout`]. The three
/// formats are this one layout: int8 per output channel is `group == in` (one row); int4
/// groups of 128 along the input are `group == 128`; fp8's 128 x 128 tiles are `group == 128`
/// with each tile's scale repeated over its 128 output columns (the packer expands them), so
/// one scale multiplies each (group, column) partial sum.
#[derive(Clone, Copy, Debug)]
pub struct GroupScales {
    pub values: Val,
    pub group: u64,
}

/// `x @ w` (or `x @ w.T`) for a weight block of 8- or 4-bit codes (i8, i4 or f8e4m3fn) and
/// its [`GroupScales`]: per group of inputs, the product of the activations with the codes on
/// the MXU in f32, times that group's scales, summed over the groups in order. The
/// dequantized weight is `code * scale`, so this is [`project`] on it up to f32 rounding (and,
/// for i8, the `Digits` split's 2^-22). A group as wide as the block or wider (int8 per
/// channel; a K-split block inside one group) is one product times one scale row.
///
/// How the codes meet the activations is priced by libtpu (v6e, 8 x 4096 @ 4096 x 14336 in
/// 1792-column blocks, static estimates): the mixed bf16 x i8 `tpu.matmul` costs what an
/// explicit `sitofp` of the tile does (59859 cycles, the conversion a VPU pass over every
/// weight: 0.71 of the HBM floor), an i8 x i8 -> i32 `tpu.matmul` 50844 whether it carries 8
/// or 32 rows. So integer codes against at most 8 rows meet the activations' `Digits` (3 x the rows, one integer
/// product: 52035 with the split and recombination, 0.82 of the floor; `x @ w.T` 60701
/// against the mixed form's 77776). i4 codes are widened to i8 first (`arith.extsi`: Mosaic
/// has no i8 x i4 product, "Mix int/int - NYI"), still cheaper than the mixed bf16 x i4 form
/// at half the bytes (33374 against 40943; `x @ w.T` 41805 against 65421). f8 stays mixed:
/// bf16 x f8 is already at the integer product's price (50915).
pub fn project_quantized(x: Val, codes: Val, scales: GroupScales, layout: WeightLayout) -> Val {
    let inputs = x.shape().dims()[1];
    let group = scales.group.min(inputs);
    let groups = inputs / group;
    // Digits triple the rows: free for a decode step's few rows (the MXU's weight latching
    // bounds it), 1.8x dearer than the mixed form for `grouped_matmul_quantized`'s 512 rows.
    let integer = Digits::apply(codes.dtype(), x.shape().dims()[0]);
    let codes = if integer { codes.cast(DType::I8) } else { codes };
    let digits = integer.then(|| Digits::of(x));
    (0..groups)
        .map(|g| {
            let (lo, hi) = (g * group, (g + 1) * group);
            let wg = match layout {
                WeightLayout::InOut => codes.slice((lo..hi, ..)),
                WeightLayout::OutIn => codes.slice((.., lo..hi)),
            };
            let product = match &digits {
                Some(d) => d.project(lo..hi, wg, layout),
                None => project(x.slice((.., lo..hi)), wg, layout),
            };
            product * scales.values.slice((g..g + 1, ..))
        })
        .reduce(|sum, part| sum + part)
        .expect("a weight block has at least one group of inputs")
}

/// The most activation rows a product with integer codes splits into int8 `Digits`; more
/// rows meet the codes in the mixed bf16 x code product.
pub const DIGIT_ROWS: u64 = 8;

/// Bytes per code of the copy [`project_quantized`] makes of a weight block of `codes` on
/// its way into the MXU against `rows` activation rows, for a VMEM plan: none for i8 codes
/// meeting the `Digits` (the MXU takes them as they are), two otherwise: i4 widened to i8
/// for the digits (libtpu's scoped VMEM refused Qwen3-30B-A3B's int4 megakernel on v6e,
/// 8 layers, by 286 KiB with one byte per code counted: the widening holds more than the i8
/// copy), and the codes meeting bf16 activations in the mixed product (f8, or more rows
/// than the digits take), counted as a bf16 copy of the block (libtpu's scoped VMEM
/// refused the int4 megakernel in the mixed form without room for it).
pub fn widened_code_bytes(codes: DType, rows: u64) -> u64 {
    if codes == DType::I8 && Digits::apply(codes, rows) { 0 } else { 2 }
}

/// Activations `x` `[rows, in]` as [`Digits::COUNT`] int8 digits per element, stacked as
/// `COUNT x rows` rows of one i8 `[COUNT * rows, in]` operand, so that a product with i8
/// codes is one i8 x i8 -> i32 `tpu.matmul` (the MXU's integer rate, no conversion of the
/// weight tile; see [`project_quantized`]). Per row, `v = x * 127 / max|x|` (`|v| <= 127`),
/// `d0 = round(v)`, `d1 = round((v - d0) * 128)`, `d2 = round(((v - d0) * 128 - d1) * 128)`
/// (round half to even; `|d1|, |d2| <= 64`), so `x = (d0 + d1 / 2^7 + d2 / 2^14) * max|x| / 127`
/// within `2^-15 * max|x| / 127` (about `2^-22 * max|x|`) plus f32 rounding of `v`. The
/// integer sums are exact (`|digit * code| <= 127 * 128`, so up to 131072 inputs fit i32);
/// [`Digits::project`] recombines them in f32 and multiplies by the row's `max|x| / 127`.
/// An all-zero row (padding) has digits 0 and gives 0.
struct Digits {
    stacked: Val,
    /// f32 `[rows, 1]`: `max|x| / 127` per row.
    row_scale: Val,
    rows: u64,
}

impl Digits {
    const COUNT: u64 = 3;
    /// The most activation rows split into digits (3 x 8 = 24 rows cost what 8 do).
    const MAX_ROWS: u64 = DIGIT_ROWS;
    /// The radix between digits: 2^7, so the rounding remainder (at most 1/2) times it stays
    /// within int8.
    const RADIX: f64 = 128.0;

    /// Whether a product of `codes` against `rows` activation rows goes through the digits:
    /// integer codes and at most [`Digits::MAX_ROWS`] rows.
    fn apply(codes: DType, rows: u64) -> bool {
        matches!(codes, DType::I8 | DType::I4) && rows <= Self::MAX_ROWS
    }

    fn of(x: Val) -> Self {
        let rows = x.shape().dims()[0];
        let x = x.cast(DType::F32);
        // A floor far below any activation keeps an all-zero row's scale finite and normal.
        let amax = x.abs().max_keepdims(1).maximum(f32::MIN_POSITIVE as f64 * 2f64.powi(30));
        let mut v = x * (amax.reciprocal(false) * 127.0);
        let mut digits = Vec::new();
        for i in 0..Self::COUNT {
            let d = v.round();
            if i + 1 < Self::COUNT {
                v = (v - d) * Self::RADIX;
            }
            digits.push(d);
        }
        Digits {
            stacked: concatenate(&digits, 0).cast(DType::I8),
            row_scale: amax * (1.0 / 127.0),
            rows,
        }
    }

    /// The activations' inputs `cols` times the i8 codes `w` of those inputs (laid out as
    /// `layout` says), in f32: one integer product, its digit rows recombined.
    fn project(&self, cols: std::ops::Range<u64>, w: Val, layout: WeightLayout) -> Val {
        let x = self.stacked.slice((.., cols));
        let sums = match layout {
            WeightLayout::InOut => dot(x, w),
            WeightLayout::OutIn => dot_t(x, w),
        }
        .cast(DType::F32);
        let r = self.rows;
        let digit = |i: u64| sums.slice((i * r..(i + 1) * r, ..));
        (1..Self::COUNT).fold(digit(0), |sum, i| sum + digit(i) * Self::RADIX.powi(-(i as i32)))
            * self.row_scale
    }
}

/// A weight block as a projection's operand: bf16 values ([`project`]) or 8/4-bit codes with
/// their scales ([`QuantizedBlock`], [`project_quantized`]). Bodies that take weight blocks
/// (`swiglu_chunk`) are generic over it, so one body serves both.
pub trait WeightBlock: Copy {
    /// `x @ self` (or `x @ self.T`) in f32.
    fn project_from(self, x: Val, layout: WeightLayout) -> Val;
}

impl WeightBlock for Val {
    fn project_from(self, x: Val, layout: WeightLayout) -> Val {
        project(x, self, layout)
    }
}

/// A quantized weight block: its codes (i8, i4 or f8e4m3fn) and [`GroupScales`].
#[derive(Clone, Copy, Debug)]
pub struct QuantizedBlock {
    pub codes: Val,
    pub scales: GroupScales,
}

impl WeightBlock for QuantizedBlock {
    fn project_from(self, x: Val, layout: WeightLayout) -> Val {
        project_quantized(x, self.codes, self.scales, layout)
    }
}
