//! Comparison of a megakernel generation with the plain-Rust references ([`compare`]), step
//! by step ([`check_step`]), under the project's logits tolerance.

use palladium_model::reference::{Generation, argmax};
use palladium_model::tolerance::{LOGITS_RELATIVE_TOLERANCE, LogitsDiff};

/// A router margin of the f32 reference (gap between its `top_k`-th and next router logit,
/// relative to the layer's largest `|router logit|`) below this is a routing near tie: the
/// megakernel's router logits differ from the f32 model's by bf16 rounding of its
/// activations and folded weights, so it may route differently there (see [`compare`]). The
/// logits tolerance's own ratio: two router logits within it are interchangeable.
pub const ROUTER_TIE: f32 = LOGITS_RELATIVE_TOLERANCE;

/// How a step's logits were matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched {
    /// Within the logits tolerance ([`palladium_model::tolerance`]) of the bf16 reference.
    Bf16,
    /// The bf16 and f32 references disagree by more than the tolerance (the bf16 model took
    /// another discrete routing decision at a near tie of its bf16 router logits), and the
    /// megakernel is within the tolerance of the f32 reference.
    F32,
    /// Neither, downstream of a routing near tie of the f32 reference (margin below
    /// [`ROUTER_TIE`] at a token fed so far): the megakernel took its own routing decision.
    RoutingTie,
    /// Not explained: a failure.
    None,
}

/// One generated step compared with the references, teacher-forced on the megakernel's ids.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCheck {
    /// The megakernel's id and the references' argmax.
    pub id: u32,
    pub bf16_id: u32,
    pub f32_id: u32,
    /// `ref[argmax] - ref[id]` in the bf16 / f32 reference's logits (0 when equal).
    pub gap_bf16: f32,
    pub gap_f32: f32,
    /// Max `|megakernel - bf16 reference|`, `|megakernel - f32 reference|`,
    /// `|bf16 - f32 reference|` over the logits.
    pub err_bf16: f32,
    pub err_f32: f32,
    pub err_bf16_f32: f32,
    /// `err_bf16` relative to the bf16 reference's scale (`max |logit|`): a property of the
    /// logits, whatever tolerance they are held to.
    pub rel_err_bf16: f32,
    /// The tolerances of the step: `relative * max |logit|` of the bf16 / f32 reference
    /// ([`palladium_model::tolerance`]); also the width of a logit near tie.
    pub tol_bf16: f32,
    pub tol_f32: f32,
    /// Smallest router margin of the f32 reference over every token fed so far.
    pub f32_router_margin: f32,
    pub matched: Matched,
}

impl StepCheck {
    /// Ids: equal to the bf16 reference's argmax, or a logit near tie there (gap within the
    /// step's tolerance); the same against the f32 reference where the logits matched it;
    /// free after a routing near tie. Logits: matched ([`Matched`] not `None`).
    pub fn passed(&self) -> bool {
        let bf16_ok = self.id == self.bf16_id || self.gap_bf16 <= self.tol_bf16;
        let id_ok = match self.matched {
            Matched::Bf16 => bf16_ok,
            Matched::F32 => bf16_ok || self.id == self.f32_id || self.gap_f32 <= self.tol_f32,
            Matched::RoutingTie => true,
            Matched::None => false,
        };
        id_ok && self.matched != Matched::None
    }
}

/// A whole generation compared with the references.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub steps: Vec<StepCheck>,
    /// The relative tolerance applied ([`LOGITS_RELATIVE_TOLERANCE`] unless the user chose one).
    pub relative: f32,
}

impl Comparison {
    /// Every step passed ([`StepCheck::passed`]) and at least one was held to a reference's
    /// logits: the routing exemption covers steps after a near tie, never a whole run.
    pub fn passed(&self) -> bool {
        self.matched() > 0 && self.steps.iter().all(StepCheck::passed)
    }

    /// Steps matched each way.
    pub fn count(&self, m: Matched) -> usize {
        self.steps.iter().filter(|s| s.matched == m).count()
    }

    /// Steps held to a reference's logits within the tolerance (bf16 or f32).
    pub fn matched(&self) -> usize {
        self.count(Matched::Bf16) + self.count(Matched::F32)
    }

    /// Max `|megakernel - bf16 reference|` over all steps, matched or not.
    pub fn max_err_bf16(&self) -> f32 {
        self.steps.iter().map(|s| s.err_bf16).fold(0.0, f32::max)
    }

    /// Max of `|megakernel - bf16 reference| / max |bf16 logit|` over all steps (to compare
    /// with [`Self::relative`]).
    pub fn max_rel_err_bf16(&self) -> f32 {
        self.steps.iter().map(|s| s.rel_err_bf16).fold(0.0, f32::max)
    }

    /// Max `|megakernel - f32 reference|` and `|bf16 - f32 reference|` over all steps.
    pub fn max_err_f32(&self) -> (f32, f32) {
        self.steps.iter().fold((0f32, 0f32), |(a, b), s| (a.max(s.err_f32), b.max(s.err_bf16_f32)))
    }

    /// Steps where the id differs from the bf16 reference's argmax.
    pub fn id_mismatches(&self) -> Vec<usize> {
        self.steps.iter().enumerate().filter(|(_, s)| s.id != s.bf16_id).map(|(i, _)| i).collect()
    }

    /// One line: ids, how steps matched, errors over all steps.
    pub fn summary(&self) -> String {
        let mism = self.id_mismatches();
        let ids = if mism.is_empty() {
            "ids equal to the bf16 reference's".to_string()
        } else {
            format!(
                "ids differ at {}",
                mism.iter()
                    .map(|&i| {
                        let s = &self.steps[i];
                        format!("step {i} (bf16 reference gap {:.4}, {:?})", s.gap_bf16, s.matched)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let rule = if self.relative == LOGITS_RELATIVE_TOLERANCE {
            "2^-6".to_string()
        } else {
            format!("{}", self.relative)
        };
        let (f, bf) = self.max_err_f32();
        let verdict = if self.passed() {
            ""
        } else if self.matched() == 0 && !self.steps.is_empty() {
            " — FAILED: no step within the tolerance"
        } else {
            " — FAILED"
        };
        format!(
            "{ids}; logits of {}/{} steps within {rule} x max |logit| of the bf16 reference (over all steps: max |diff| {:.4}, relative {:.4}; ours vs f32 reference {:.4}, bf16 vs f32 reference {:.4}){}{}{verdict}",
            self.count(Matched::Bf16),
            self.steps.len(),
            self.max_err_bf16(),
            self.max_rel_err_bf16(),
            f,
            bf,
            match self.count(Matched::F32) {
                0 => String::new(),
                n => format!(", {n} matched to the f32 reference after a bf16 routing divergence"),
            },
            match self.count(Matched::RoutingTie) {
                0 => String::new(),
                n => format!(", {n} after a routing near tie"),
            },
        )
    }
}

/// The rule of [`compare`] for one step: `logits` (the megakernel's, which chose `id`)
/// against the bf16 reference's `bf16` and the f32 reference's `f32` logits at the same
/// position (both after the same tokens), with `f32_router_margin` the smallest router margin
/// of the f32 reference over every token fed so far. Tolerance `relative * max |reference
/// logit|` ([`palladium_model::tolerance`]; [`LOGITS_RELATIVE_TOLERANCE`] by default); held
/// to the f32 logits only where the two references disagree by more than it; exempt only
/// after a routing near tie ([`ROUTER_TIE`]). Also used against transformers' own logits
/// (`decode/tests/hf_conformance.rs`).
pub fn check_step(
    logits: &[f32],
    id: u32,
    bf16: &[f32],
    f32: &[f32],
    f32_router_margin: f32,
    relative: f32,
) -> StepCheck {
    let gap =
        |l: &[f32], best: usize| l[best] - l.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let (bi, fi) = (argmax(bf16), argmax(f32));
    let (ours_bf16, ours_f32, refs) = (
        LogitsDiff::with_relative(logits, bf16, relative),
        LogitsDiff::with_relative(logits, f32, relative),
        LogitsDiff::with_relative(f32, bf16, relative),
    );
    let matched = if ours_bf16.within() {
        Matched::Bf16
    } else if !refs.within() && ours_f32.within() {
        Matched::F32
    } else if f32_router_margin < ROUTER_TIE {
        Matched::RoutingTie
    } else {
        Matched::None
    };
    StepCheck {
        id,
        bf16_id: bi as u32,
        f32_id: fi as u32,
        gap_bf16: gap(bf16, bi),
        gap_f32: gap(f32, fi),
        err_bf16: ours_bf16.max_abs_diff,
        err_f32: ours_f32.max_abs_diff,
        err_bf16_f32: refs.max_abs_diff,
        rel_err_bf16: ours_bf16.relative(),
        tol_bf16: ours_bf16.tolerance,
        tol_f32: ours_f32.tolerance,
        f32_router_margin,
        matched,
    }
}

/// Compare a batch-1 `generation` (of `prompt`) with [`palladium_model::reference::Reference`]
/// in [`Precision::Bf16`](palladium_model::reference::Precision) (transformers' bf16 model,
/// the ground truth) and in `Precision::F32` (transformers' f32 model), both teacher-forced
/// on the generation's ids, step by step ([`StepCheck::passed`], [`Matched`]).
///
/// Why two references: the megakernel rounds at other points than transformers' bf16 model
/// (f32 residual stream and router logits, norm scales folded into bf16 weights), so its
/// logits sit ~0.02-0.05 from the bf16 model's — as far as the exact f32 model's do: that is
/// the bf16 model's own rounding noise, not an error of either. Where router logits are in a
/// near tie the two round differently and may pick different experts, a discrete change
/// that persists through the K/V cache. The tiny models' bf16 router logits tie often (one
/// bf16 ulp apart), and then transformers' own bf16 and f32 models disagree by as much. A
/// step is accepted against the f32 model only when the two references themselves disagree
/// there, and matches neither only downstream of a near tie of the f32 model's router.
pub fn compare(
    spec: &palladium_model::ModelSpec,
    weights: &palladium_model::weights::Weights,
    prompt: &[u32],
    generation: &Generation,
) -> Result<Comparison, String> {
    compare_with(spec, weights, prompt, generation, LOGITS_RELATIVE_TOLERANCE)
}

/// [`compare`] under a caller's relative tolerance (`palladium run --check --tolerance R`).
pub fn compare_with(
    spec: &palladium_model::ModelSpec,
    weights: &palladium_model::weights::Weights,
    prompt: &[u32],
    generation: &Generation,
    relative: f32,
) -> Result<Comparison, String> {
    use palladium_model::reference::{Precision, Reference};
    let rb = Reference::new(spec, weights, Precision::Bf16).map_err(|e| e.to_string())?;
    let rf = Reference::new(spec, weights, Precision::F32).map_err(|e| e.to_string())?;
    let (mut cb, mut cf) = (rb.new_cache(), rf.new_cache());
    let mut margin = f32::INFINITY;
    let mut feed = |t: u32, margin: &mut f32| -> Result<(Vec<f32>, Vec<f32>), String> {
        let lb = rb.step(&mut cb, t).map_err(|e| e.to_string())?;
        let (lf, m) = rf.step_traced(&mut cf, t).map_err(|e| e.to_string())?;
        *margin = margin.min(m);
        Ok((lb, lf))
    };
    let mut last = None;
    for &t in prompt {
        last = Some(feed(t, &mut margin)?);
    }
    let mut steps = Vec::new();
    for (i, (step, &id)) in generation.steps.iter().zip(&generation.generated_ids).enumerate() {
        let (lb, lf) = last.take().ok_or("empty prompt")?;
        steps.push(check_step(&step.logits, id, &lb, &lf, margin, relative));
        if i + 1 < generation.steps.len() {
            last = Some(feed(id, &mut margin)?);
        }
    }
    Ok(Comparison { steps, relative })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(err: f32, scale: f32, margin: f32) -> StepCheck {
        let reference = vec![scale, 0.0, -1.0];
        let ours = vec![scale + err, 0.0, -1.0];
        check_step(&ours, 0, &reference, &reference, margin, LOGITS_RELATIVE_TOLERANCE)
    }

    #[test]
    fn the_tolerance_scales_with_the_logits() {
        // |logit| ~120 (a tied embedding): 1.5 is within 2^-6 * 120 = 1.875.
        assert_eq!(step(1.5, 120.0, 1.0).matched, Matched::Bf16);
        // |logit| ~4: 0.0625 is the tolerance, 0.07 is not.
        assert_eq!(step(0.0625, 4.0, 1.0).matched, Matched::Bf16);
        assert_eq!(step(0.07, 4.0, 1.0).matched, Matched::None);
        assert_eq!(step(f32::NAN, 4.0, 1.0).matched, Matched::None);
    }

    #[test]
    fn exemptions_never_pass_a_run_without_a_matched_step() {
        // Every step off by far more than the tolerance, all after a routing near tie.
        let exempt = Comparison {
            steps: vec![step(5.0, 120.0, 0.0); 6],
            relative: LOGITS_RELATIVE_TOLERANCE,
        };
        assert!(exempt.steps.iter().all(|s| s.matched == Matched::RoutingTie && s.passed()));
        assert!(!exempt.passed());
        assert!(
            exempt.summary().contains("0/6 steps")
                && exempt.summary().contains("FAILED: no step within the tolerance"),
            "{}",
            exempt.summary()
        );
        // The summary's max |diff| covers every step, matched or not.
        assert!(exempt.summary().contains("max |diff| 5.0000"), "{}", exempt.summary());
        let mut mixed = exempt.clone();
        mixed.steps[0] = step(0.5, 120.0, 1.0);
        assert!(mixed.passed());
        assert_eq!(mixed.max_err_bf16(), 5.0);
    }

    #[test]
    fn the_relative_error_does_not_depend_on_the_tolerance() {
        // `--check --tolerance 0.1` used to divide the error by 0.1 x max |logit| / 2^-6.
        let (reference, ours) = (vec![4.0, 0.0, -1.0], vec![4.05, 0.0, -1.0]);
        let at = |relative| check_step(&ours, 0, &reference, &reference, 1.0, relative);
        let (default, loose) = (at(LOGITS_RELATIVE_TOLERANCE), at(0.1));
        assert!((default.rel_err_bf16 - 0.05 / 4.0).abs() < 1e-6, "{}", default.rel_err_bf16);
        assert_eq!(loose.rel_err_bf16, default.rel_err_bf16);
        let summary = Comparison { steps: vec![loose], relative: 0.1 }.summary();
        assert!(summary.contains("relative 0.0125;"), "{summary}");
    }
}
