//! THE comparison and tolerance module of the project, for logits and for kernel outputs.
//!
//! THE logits tolerance: every comparison of logits (`palladium run --check`,
//! `palladium_decode::compare`, the numerics and conformance tests, and whatever later
//! work adds: several devices, quantized weights, multi-token steps) cites this module instead
//! of a number of its own.
//!
//! A step's logits `got` match reference logits `want` when
//!
//! ```text
//! max |got - want| <= 2^-6 * max |want|
//! ```
//!
//! that is 4 bf16 ulps of the step's largest logit (bf16 keeps 8 significant bits: one ulp of
//! `x` is at most `2^-7 |x|`, and 4 ulps at the top binade is `2^-6` to `2^-5` of it). The
//! tolerance is relative to the step's scale because logits are: a tied-embedding model's
//! logits are ~100, a tiny random model's ~4 (where this is 0.0625, the absolute tolerance
//! used before). Differences are taken element-wise; a NaN anywhere is infinitely far.
//!
//! A library kernel's outputs (`palladium interpret`/`exec`) are compared the same way, per
//! output, under a tolerance per dtype ([`output_errors`], [`output_tolerance`]):
//! - max abs error: `max_i |got_i - want_i|`;
//! - max relative error: `max_i |got_i - want_i| / max_j |want_j|`, the error relative to
//!   the output's scale. (Element-wise relative errors are meaningless near zero, where
//!   values come from cancellation: decode attention's bf16 softmax weights, for one, give
//!   absolute errors proportional to the typical output, not to each element. With an
//!   element-wise metric floored at the output's RMS, its worst case over 36 seeded runs was
//!   1.3e-2; with this one, 7.6e-3.)
//!
//! A NaN or infinity in the output where the reference is finite is an infinite error.

use crate::DType;

/// `2^-6`: the largest accepted `max |got - want|` as a fraction of `max |want|`.
pub const LOGITS_RELATIVE_TOLERANCE: f32 = 1.0 / 64.0;

/// How `got` compares with the reference `want` under a relative tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitsDiff {
    /// `max |got - want|` (infinite when a difference is NaN or the lengths differ).
    pub max_abs_diff: f32,
    /// `max |want|`: the step's scale.
    pub scale: f32,
    /// `relative * scale`: the largest accepted `max_abs_diff`.
    pub tolerance: f32,
}

impl LogitsDiff {
    /// `got` against `want` under [`LOGITS_RELATIVE_TOLERANCE`].
    pub fn new(got: &[f32], want: &[f32]) -> Self {
        Self::with_relative(got, want, LOGITS_RELATIVE_TOLERANCE)
    }

    /// `got` against `want` under a caller's relative tolerance (`palladium run --check
    /// --tolerance R`).
    pub fn with_relative(got: &[f32], want: &[f32], relative: f32) -> Self {
        let scale = max_abs(want);
        let max_abs_diff =
            if got.len() == want.len() { max_abs_diff(got, want) } else { f32::INFINITY };
        Self { max_abs_diff, scale, tolerance: relative * scale }
    }

    /// Whether the logits match. False whenever a value is NaN or infinite.
    pub fn within(&self) -> bool {
        self.max_abs_diff <= self.tolerance && self.tolerance.is_finite()
    }

    /// `max_abs_diff / scale`, to compare with the relative tolerance.
    pub fn relative(&self) -> f32 {
        if self.scale > 0.0 {
            self.max_abs_diff / self.scale
        } else if self.max_abs_diff == 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    }
}

/// The tolerance of a step whose reference logits are `want`: `2^-6 * max |want|`. Also the
/// width of a near tie between two of its logits (two ids whose logits are this close are
/// interchangeable under the tolerance).
pub fn logits_tolerance(want: &[f32]) -> f32 {
    LOGITS_RELATIVE_TOLERANCE * max_abs(want)
}

/// `max |x|` (infinite when any value is NaN or infinite).
pub fn max_abs(xs: &[f32]) -> f32 {
    xs.iter().map(|x| if x.is_nan() { f32::INFINITY } else { x.abs() }).fold(0.0, f32::max)
}

/// `max |a - b|` element-wise over the common length (a NaN difference is infinite).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| if (x - y).is_nan() { f32::INFINITY } else { (x - y).abs() })
        .fold(0.0, f32::max)
}

/// Checks a user's relative tolerance (`--tolerance`): finite and positive.
pub fn parse_relative_tolerance(s: &str) -> Result<f32, String> {
    let t: f32 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    if t.is_finite() && t > 0.0 {
        Ok(t)
    } else {
        Err(format!("{s}: a tolerance must be a finite number > 0"))
    }
}

/// The default relative tolerance for a kernel output of `dtype`: bf16 1e-2 (its epsilon is
/// 2^-8), f16 1e-3, f32 1e-5, integers exact.
pub fn output_tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::Bf16 | DType::F8E4M3 | DType::F8E5M2 => 1e-2,
        DType::F16 => 1e-3,
        DType::F32 => 1e-5,
        DType::I32 | DType::I16 | DType::I8 | DType::I4 | DType::Bool => 0.0,
    }
}

/// `(max abs error, max relative error, worst element)` of a kernel output `got` against its
/// reference `want` (same length); see the module docs for the definitions.
pub fn output_errors(got: &[f32], want: &[f32]) -> (f32, f32, Option<(usize, f32, f32)>) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs())).max(f32::MIN_POSITIVE);
    let (mut max_abs, mut worst) = (0f32, None);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let abs = if g == w {
            0.0
        } else if g.is_finite() {
            (g - w).abs()
        } else {
            f32::INFINITY
        };
        if abs > max_abs || worst.is_none() {
            max_abs = max_abs.max(abs);
            worst = Some((i, g, w));
        }
    }
    (max_abs, max_abs / scale, worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tolerance_is_relative_to_the_largest_reference_logit() {
        let want = [4.0, -1.0, 0.5];
        assert_eq!(logits_tolerance(&want), 0.0625);
        assert!(LogitsDiff::new(&[4.0625, -1.0, 0.5], &want).within());
        assert!(!LogitsDiff::new(&[4.07, -1.0, 0.5], &want).within());
        // A tied-embedding model's logits ~120: 1.875.
        assert!(LogitsDiff::new(&[121.8, 3.0], &[120.0, 3.0]).within());
        assert!(!LogitsDiff::new(&[f32::NAN, 3.0], &[120.0, 3.0]).within());
        assert!(!LogitsDiff::new(&[1.0], &[f32::INFINITY]).within());
        assert!(!LogitsDiff::new(&[1.0], &[1.0, 2.0]).within());
    }

    #[test]
    fn kernel_output_errors_are_relative_to_the_output_scale() {
        let (abs, rel, worst) = output_errors(&[1.0, 2.5, -4.0], &[1.0, 2.0, -4.0]);
        assert_eq!((abs, rel, worst), (0.5, 0.125, Some((1, 2.5, 2.0))));
        assert_eq!(output_errors(&[f32::NAN], &[1.0]).1, f32::INFINITY);
        assert_eq!((output_tolerance(DType::Bf16), output_tolerance(DType::I32)), (1e-2, 0.0));
    }

    #[test]
    fn user_tolerances_are_finite_and_positive() {
        assert_eq!(parse_relative_tolerance("0.01"), Ok(0.01));
        for bad in ["-1", "0", "NaN", "inf", "x"] {
            assert!(parse_relative_tolerance(bad).is_err(), "{bad}");
        }
    }
}
