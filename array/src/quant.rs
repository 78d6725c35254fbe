//! THE element conversions of the quantized formats, bit for bit as `ml_dtypes` defines them
//! (`float8_e4m3fn`, `int4`): the model crate quantizes with them, host arrays and the
//! interpreter decode with them; checked against `ml_dtypes` and XLA in
//! `model/tests/quant_oracle.rs`.

/// Largest finite `float8_e4m3fn` value (`0x7E` / `0xFE`).
pub const E4M3FN_MAX: f32 = 448.0;

/// The value of a `float8_e4m3fn` byte: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
/// exponent 0 holds the subnormals `m * 2^-9`; there is no infinity, and `S.1111.111`
/// (`0x7F`, `0xFF`) is NaN (a quiet f32 NaN with the byte's sign, as `ml_dtypes` gives).
pub fn e4m3fn_to_f32(byte: u8) -> f32 {
    let negative = byte & 0x80 != 0;
    let exponent = i32::from((byte >> 3) & 0xF);
    let mantissa = f32::from(byte & 0x7);
    let magnitude = match exponent {
        15 if mantissa == 7.0 => return f32::from_bits(0x7FC0_0000 | u32::from(negative) << 31),
        0 => mantissa * 2f32.powi(-9),
        e => (8.0 + mantissa) * 2f32.powi(e - 10),
    };
    if negative { -magnitude } else { magnitude }
}

/// `x` as `float8_e4m3fn`, `ml_dtypes`' `astype`: round to nearest, ties to even (subnormals
/// included; below half the smallest subnormal, a zero of `x`'s sign); NaN stays NaN and keeps
/// its sign; anything that rounds past 448 (magnitudes above 464, infinities) becomes NaN of
/// `x`'s sign: the format has no infinity and this conversion does not saturate.
pub fn f32_to_e4m3fn(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() || a > 2.0 * E4M3FN_MAX {
        return sign | 0x7F; // NaN, infinities, and magnitudes far past the largest value
    }
    // The spacing of e4m3fn values around `a`: 2^(e-3) in binade e, 2^-9 in the subnormals.
    let binade = if a < 2f32.powi(-6) { -6 } else { ((a.to_bits() >> 23) as i32) - 127 };
    // `a / 2^(binade-3)` is exact (a power-of-two division of a value in [0, 16)).
    let steps = (a * 2f32.powi(3 - binade)).round_ties_even() as i32;
    let (binade, steps) = if steps == 16 { (binade + 1, 8) } else { (binade, steps) };
    let byte = if steps < 8 {
        // Subnormal (binade -6 only) or zero.
        steps as u8
    } else {
        let field = binade + 7;
        if field > 15 || (field == 15 && steps == 15) {
            return sign | 0x7F;
        }
        (field as u8) << 3 | (steps - 8) as u8
    };
    sign | byte
}

/// `x` as `float8_e4m3fn`, saturating: magnitudes past 448 (infinities included) become ±448,
/// then [`f32_to_e4m3fn`] rounds (NaN stays NaN). What FP8 checkpoints are quantized with
/// (`(w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`).
pub fn f32_to_e4m3fn_saturating(x: f32) -> u8 {
    f32_to_e4m3fn(x.clamp(-E4M3FN_MAX, E4M3FN_MAX))
}

/// `x` rounded to the nearest integer (ties to even) and clamped to `[lo, hi]`, the integer
/// formats' conversion (`np.clip(np.rint(x), lo, hi)`); `x` must not be NaN.
pub fn round_clamp(x: f32, lo: i8, hi: i8) -> i8 {
    x.round_ties_even().clamp(f32::from(lo), f32::from(hi)) as i8
}

/// Smallest and largest `int4` values (`ml_dtypes.int4`, two's complement).
pub const INT4_MIN: i8 = -8;
pub const INT4_MAX: i8 = 7;

/// Packs `int4` values two per byte: element `2j` in the low nibble of byte `j`, element
/// `2j+1` in the high nibble, each nibble the value's 4-bit two's complement (XLA's packing of
/// `s4` arrays, what `jax.lax.bitcast_convert_type(x, uint8)` of an `[.., 2]` `int4` array
/// gives). An odd count leaves the last high nibble 0. Values must lie in `[-8, 7]`.
pub fn pack_int4(values: &[i8]) -> Vec<u8> {
    debug_assert!(values.iter().all(|v| (INT4_MIN..=INT4_MAX).contains(v)));
    values
        .chunks(2)
        .map(|pair| {
            let low = pair[0] as u8 & 0xF;
            let high = pair.get(1).map_or(0, |&v| v as u8 & 0xF);
            low | high << 4
        })
        .collect()
}

/// The `int4` value at element `i` of [`pack_int4`]'s bytes, sign-extended with a signed
/// shift (an arithmetic right shift of the nibble moved to the top of an `i8`).
pub fn unpack_int4(packed: &[u8], i: usize) -> i8 {
    let byte = packed[i / 2] as i8;
    if i.is_multiple_of(2) { (byte << 4) >> 4 } else { byte >> 4 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_round_trips_every_finite_byte() {
        for b in 0..=255u8 {
            let x = e4m3fn_to_f32(b);
            if x.is_nan() {
                assert_eq!(b & 0x7F, 0x7F);
            } else {
                assert_eq!(f32_to_e4m3fn(x), b, "byte {b:#04x} = {x}");
            }
        }
        assert_eq!(e4m3fn_to_f32(0x7E), 448.0);
        assert_eq!(e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3fn_to_f32(0x08), 2f32.powi(-6));
    }

    #[test]
    fn e4m3fn_rounding_edges() {
        assert_eq!(f32_to_e4m3fn(464.0), 0x7E, "a tie at the top rounds to even, 448");
        assert_eq!(f32_to_e4m3fn(464.0001), 0x7F, "past it: NaN");
        assert_eq!(f32_to_e4m3fn(-f32::INFINITY), 0xFF);
        assert_eq!(f32_to_e4m3fn_saturating(1e30), 0x7E);
        assert_eq!(f32_to_e4m3fn_saturating(-f32::INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3fn(2f32.powi(-10)), 0x00, "half the smallest subnormal ties to 0");
        assert_eq!(f32_to_e4m3fn(-2f32.powi(-10)), 0x80);
        assert_eq!(f32_to_e4m3fn(3.0 * 2f32.powi(-10)), 0x02, "1.5 subnormal steps tie to 2");
        assert_eq!(f32_to_e4m3fn(15.5 * 2f32.powi(-10)), 0x08, "rounds up into the normals");
        assert_eq!(f32_to_e4m3fn(17.0), 0x58, "17 ties between 16 and 18: even mantissa 16");
    }

    #[test]
    fn int4_packs_low_nibble_first_and_sign_extends() {
        let values = [1, -2, 7, -8, -1];
        let packed = pack_int4(&values);
        assert_eq!(packed, [0xE1, 0x87, 0x0F]);
        let back: Vec<i8> = (0..values.len()).map(|i| unpack_int4(&packed, i)).collect();
        assert_eq!(back, values);
    }

    #[test]
    fn round_clamp_ties_to_even() {
        let got: Vec<i8> = [0.5, 1.5, 2.5, -0.5, -1.5, 200.0, -200.0]
            .iter()
            .map(|&x| round_clamp(x, -128, 127))
            .collect();
        assert_eq!(got, [0, 2, 2, 0, -2, 127, -128]);
    }
}
