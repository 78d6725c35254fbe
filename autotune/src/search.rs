//! The search: enumerate a [`SearchSpace`], build and verify every candidate for a chip,
//! cost the survivors with a [`Runner`] and rank them.
//!
//! Rejections are results, not errors: a sweep over block sizes is expected to hit blocks
//! that break the TPU tiling rule or overflow VMEM, and the reason is what tells the user
//! which corner of the space is closed. Only a malformed space (unknown kernel or
//! parameter) fails the whole search.

use crate::runner::{CostRecord, Runner};
use indexmap::IndexMap;
use palladium_dsl::ir::{VerifyOptions, verify};
use palladium_dsl::spec::Chip;
use palladium_kernels::{KernelError, REGISTRY};
use serde::{Serialize, Serializer};
use std::fmt::{self, Write as _};

/// Named parameters with candidate values, plus fixed settings shared by every candidate.
/// Candidates are the cartesian product in a deterministic order: parameters in insertion
/// order, the first slowest and the last fastest (like a Pallas grid); values in the order
/// given.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    pub kernel: String,
    pub fixed: Vec<(String, String)>,
    pub params: IndexMap<String, Vec<String>>,
}

impl SearchSpace {
    pub fn new(kernel: impl Into<String>) -> SearchSpace {
        SearchSpace { kernel: kernel.into(), fixed: Vec::new(), params: IndexMap::new() }
    }

    /// Set `name` to `value` for every candidate (e.g. the problem shape).
    pub fn fixed(mut self, name: impl Into<String>, value: impl ToString) -> SearchSpace {
        self.fixed.push((name.into(), value.to_string()));
        self
    }

    /// Search `name` over `values` (re-adding a name replaces its values in place).
    pub fn param<T: ToString>(
        mut self,
        name: impl Into<String>,
        values: impl IntoIterator<Item = T>,
    ) -> SearchSpace {
        self.params.insert(name.into(), values.into_iter().map(|v| v.to_string()).collect());
        self
    }

    /// Powers of two from `lo` to `hi` inclusive (`lo` rounded up to a power of two).
    pub fn pow2(lo: u64, hi: u64) -> Vec<u64> {
        std::iter::successors(Some(lo.max(1).next_power_of_two()), |&v| v.checked_mul(2))
            .take_while(|&v| v <= hi)
            .collect()
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        if self.params.is_empty() { 0 } else { self.params.values().map(Vec::len).product() }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every candidate, in enumeration order.
    pub fn candidates(&self) -> Vec<Candidate> {
        let n = self.len();
        let mut out = Vec::with_capacity(n);
        for index in 0..n {
            // Mixed-radix decode of `index`, last parameter fastest.
            let mut rest = index;
            let mut settings = vec![(String::new(), String::new()); self.params.len()];
            for (slot, (name, values)) in self.params.iter().enumerate().rev() {
                settings[slot] = (name.clone(), values[rest % values.len()].clone());
                rest /= values.len();
            }
            out.push(Candidate { index, settings });
        }
        out
    }

    /// Check the kernel and every parameter name exist, so a typo fails once instead of
    /// rejecting every candidate.
    pub fn check(&self) -> Result<(), SearchError> {
        let entry = REGISTRY
            .iter()
            .find(|e| e.name == self.kernel)
            .ok_or_else(|| SearchError::Kernel(KernelError::Unknown(self.kernel.clone())))?;
        let known: Vec<&str> = (entry.defaults)().iter().map(|(n, _)| *n).collect();
        for name in self.fixed.iter().map(|(n, _)| n).chain(self.params.keys()) {
            if !known.contains(&name.as_str()) {
                return Err(SearchError::UnknownParam {
                    kernel: self.kernel.clone(),
                    name: name.clone(),
                    known: known.join(", "),
                });
            }
        }
        if let Some((name, _)) = self.params.iter().find(|(_, v)| v.is_empty()) {
            return Err(SearchError::EmptyParam(name.clone()));
        }
        Ok(())
    }
}

/// One point of the space: the searched parameters' values (fixed settings not repeated).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// Position in enumeration order (also the tie-breaker of the ranking).
    pub index: usize,
    pub settings: Vec<(String, String)>,
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, v)) in self.settings.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{n}={v}")?;
        }
        Ok(())
    }
}

/// Why a whole search could not run.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Kernel(KernelError),
    #[error("kernel `{kernel}` has no parameter `{name}` (known: {known})")]
    UnknownParam { kernel: String, name: String, known: String },
    #[error("parameter `{0}` has no candidate values")]
    EmptyParam(String),
}

/// Where a candidate was rejected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Tracing failed, or the chip-independent verifier (tiling rule, shapes) rejected it.
    Build,
    /// The verifier rejected it for the chip (VMEM budget).
    Verify,
    /// The runner could not cost it.
    Runner,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Build => "build",
            Stage::Verify => "verify",
            Stage::Runner => "runner",
        })
    }
}

/// What happened to one candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Costed(CostRecord),
    Rejected { stage: Stage, reason: String },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CandidateResult {
    pub candidate: Candidate,
    pub outcome: Outcome,
}

impl CandidateResult {
    pub fn cost(&self) -> Option<&CostRecord> {
        match &self.outcome {
            Outcome::Costed(c) => Some(c),
            Outcome::Rejected { .. } => None,
        }
    }
}

fn chip_name<S: Serializer>(chip: &Chip, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(chip.name())
}

/// Every candidate's outcome, in enumeration order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchReport {
    pub kernel: String,
    #[serde(serialize_with = "chip_name")]
    pub chip: Chip,
    pub runner: String,
    pub fixed: Vec<(String, String)>,
    pub results: Vec<CandidateResult>,
}

/// Build, verify and cost every candidate of `space` on `chip` with `runner`. Every
/// candidate is built and verified first; the survivors go to [`Runner::run_batch`] in one
/// call, in enumeration order.
pub fn search(
    space: &SearchSpace,
    chip: Chip,
    runner: &mut dyn Runner,
) -> Result<SearchReport, SearchError> {
    space.check()?;
    let candidates = space.candidates();
    let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(candidates.len());
    let mut verified = Vec::new();
    for candidate in &candidates {
        let settings: Vec<(String, String)> =
            space.fixed.iter().chain(&candidate.settings).cloned().collect();
        let outcome = match palladium_kernels::build(&space.kernel, &settings) {
            Err(KernelError::Build { errors, .. }) => {
                Some(Outcome::Rejected { stage: Stage::Build, reason: errors.to_string() })
            }
            Err(e) => Some(Outcome::Rejected { stage: Stage::Build, reason: e.to_string() }),
            Ok(kernel) => match verify(&kernel, VerifyOptions { chip: Some(chip) }) {
                Err(errors) => {
                    Some(Outcome::Rejected { stage: Stage::Verify, reason: errors.to_string() })
                }
                Ok(()) => {
                    verified.push((candidate.index, kernel));
                    None
                }
            },
        };
        outcomes.push(outcome);
    }
    let kernels: Vec<&palladium_dsl::Kernel> = verified.iter().map(|(_, k)| k).collect();
    let costs = runner.run_batch(&kernels, chip);
    assert_eq!(
        costs.len(),
        kernels.len(),
        "runner `{}` returned {} results for {} kernels",
        runner.name(),
        costs.len(),
        kernels.len()
    );
    for ((index, _), cost) in verified.iter().zip(costs) {
        outcomes[*index] = Some(match cost {
            Ok(cost) => Outcome::Costed(cost),
            Err(e) => Outcome::Rejected { stage: Stage::Runner, reason: e.to_string() },
        });
    }
    let results = candidates
        .into_iter()
        .zip(outcomes)
        .map(|(candidate, outcome)| CandidateResult {
            candidate,
            outcome: outcome.expect("every candidate has an outcome"),
        })
        .collect();
    Ok(SearchReport {
        kernel: space.kernel.clone(),
        chip,
        runner: runner.name().to_string(),
        fixed: space.fixed.clone(),
        results,
    })
}

impl SearchReport {
    /// Costed candidates, cheapest first; equal costs keep enumeration order, so the
    /// ranking is a pure function of the space and the runner's costs.
    pub fn ranking(&self) -> Vec<&CandidateResult> {
        let mut costed: Vec<&CandidateResult> =
            self.results.iter().filter(|r| r.cost().is_some()).collect();
        costed.sort_by(|a, b| {
            let (ca, cb) = (
                a.cost().map_or(f64::INFINITY, |c| c.cycles),
                b.cost().map_or(f64::INFINITY, |c| c.cycles),
            );
            ca.total_cmp(&cb).then(a.candidate.index.cmp(&b.candidate.index))
        });
        costed
    }

    pub fn best(&self) -> Option<&CandidateResult> {
        self.ranking().into_iter().next()
    }

    pub fn rejected(&self) -> impl Iterator<Item = &CandidateResult> {
        self.results.iter().filter(|r| r.cost().is_none())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports are plain data")
    }

    /// A fixed-width table, one row per candidate in enumeration order: status (rank or
    /// rejection stage and the first line of the reason), HBM traffic (MB = 1e6 bytes),
    /// grid steps, VMEM footprint (MiB) and modeled cycles.
    pub fn table(&self) -> String {
        let rank: std::collections::HashMap<usize, usize> =
            self.ranking().iter().enumerate().map(|(r, c)| (c.candidate.index, r + 1)).collect();
        let width =
            self.results.iter().map(|r| r.candidate.to_string().len()).max().unwrap_or(0).max(9);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<width$}  {:<10}  {:>9}  {:>6}  {:>8}  {:>12}  {:<5}",
            "candidate", "status", "HBM MB", "steps", "VMEM MiB", "cycles", "bound"
        );
        for r in &self.results {
            let name = r.candidate.to_string();
            match &r.outcome {
                Outcome::Costed(c) => {
                    let status = format!("ok #{}", rank[&r.candidate.index]);
                    let (hbm, steps, vmem) = c.traffic.as_ref().map_or(
                        (String::from("-"), String::from("-"), String::from("-")),
                        |t| {
                            (
                                format!("{:.2}", t.hbm_bytes() as f64 / 1e6),
                                t.grid_steps.to_string(),
                                format!("{:.2}", t.vmem_bytes as f64 / (1u64 << 20) as f64),
                            )
                        },
                    );
                    let bound = c.model.map_or("-", |m| m.bound);
                    let _ = writeln!(
                        s,
                        "{name:<width$}  {status:<10}  {hbm:>9}  {steps:>6}  {vmem:>8}  {:>12.0}  {bound:<5}",
                        c.cycles
                    );
                }
                Outcome::Rejected { stage, reason } => {
                    let first = reason.lines().next().unwrap_or("").trim();
                    let _ = writeln!(
                        s,
                        "{name:<width$}  {:<10}  {}",
                        format!("rej:{stage}"),
                        short_reason(first)
                    );
                }
            }
        }
        s
    }
}

/// One error line without the source locations trace and verifier errors carry
/// (`error: FILE:L:C: operand x at FILE:L:C: rule` becomes `x: rule`), for the table.
fn short_reason(line: &str) -> String {
    let line = line.rsplit_once(": operand ").map_or(line, |(_, rest)| rest);
    match line.split_once(" at ") {
        Some((what, rest)) => match rest.split_once(": ") {
            Some((_, message)) => format!("{what}: {message}"),
            None => line.to_string(),
        },
        None => line.to_string(),
    }
}
