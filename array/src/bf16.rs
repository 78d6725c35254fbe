//! bf16 rounding: THE helper every reference, the interpreter and the weight loader use, so
//! they round identically (round to nearest, ties to even; a NaN stays a quiet NaN of the
//! same sign, as `half::bf16::from_f32` and the TPU do).

/// The bf16 bit pattern nearest to `x`. No branch on the rounding path, so loops over tiles
/// vectorize.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    let quiet_nan = b | 0x0040_0000;
    ((if x.is_nan() { quiet_nan } else { rounded }) >> 16) as u16
}

/// The f32 value of a bf16 bit pattern (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to the nearest bf16, as an f32.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(round_bf16(1.0 + 1.0 / 200.0), 1.0 + 1.0 / 128.0);
        assert_eq!(round_bf16(-3.0), -3.0);
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn it_agrees_with_half_bit_for_bit_nan_included() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffbf_ffff),
            f32::MAX,
            f32::MIN_POSITIVE / 3.0,
            -0.0,
        ];
        let sweep =
            (0..1u32 << 20).map(|i| f32::from_bits(i.wrapping_mul(4099).wrapping_add(i << 12)));
        for x in specials.into_iter().chain(sweep) {
            assert_eq!(
                f32_to_bf16(x),
                bf16::from_f32(x).to_bits(),
                "{x:e} ({:#010x})",
                x.to_bits()
            );
        }
    }
}
