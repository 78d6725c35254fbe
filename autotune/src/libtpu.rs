//! The libtpu runner: lower each candidate with `palladium-lowering`, compile it with Google's
//! TPU compiler in-process through PJRT (`palladium-runtime`, deviceless), and cost it by
//! libtpu's static LLO profile (`estimated_cycles`), a [`CostKind::Measured`] record.
//!
//! "Measured" means measured by libtpu's own scheduler estimate of the compiled kernel, not
//! on a device: the numbers compare kernels on one chip, they are not wall time.
//!
//! Candidates compile in parallel worker processes, one per core
//! ([`palladium_runtime::Compiler`]). libtpu 0.0.42.1 aborts the whole process for some
//! kernels while profiling them (v6e: manual DMAs from HBM refs; v5e: bf16 matmuls with an
//! 8-row LHS): such a candidate is rejected with libtpu's fatal message, and the others are
//! costed in fresh workers.

use crate::floor::stream_kernel;
use crate::runner::{CostKind, CostRecord, Runner, RunnerError};
use crate::traffic::{Prefetch, analyze};
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerOptions, lower};
use palladium_runtime::{CallSpec, CompileError, Compiled, Compiler, Estimate, Job, wrap};

/// The libtpu runner.
#[derive(Clone, Debug)]
pub struct Libtpu {
    compiler: Compiler,
    /// Scalar-prefetch contents for the traffic model kept alongside the measurement.
    pub prefetch: Prefetch,
    /// Compile without the call spec's input/output aliases (the kernels are unchanged):
    /// libtpu's v6e profiler aborts on some aliased HBM operands (see
    /// docs/benchmarks.md), and a cost comparison does not need them.
    pub drop_aliases: bool,
}

impl Libtpu {
    /// Locate libtpu (the error says where it looked and how to install it).
    pub fn new() -> Result<Libtpu, RunnerError> {
        let compiler = Compiler::new(Estimate::Yes).map_err(|e| RunnerError(e.to_string()))?;
        Ok(Libtpu { compiler, prefetch: Prefetch::new(), drop_aliases: false })
    }

    pub fn with_prefetch(mut self, prefetch: Prefetch) -> Libtpu {
        self.prefetch = prefetch;
        self
    }

    pub fn without_aliases(mut self) -> Libtpu {
        self.drop_aliases = true;
        self
    }

    /// At most `n` compile workers at once.
    pub fn with_workers(mut self, n: usize) -> Libtpu {
        self.compiler = self.compiler.with_workers(n);
        self
    }

    /// The most compile workers that run at once.
    pub fn workers(&self) -> usize {
        self.compiler.workers()
    }

    /// The StableHLO program libtpu compiles for `kernel` on `chip`.
    pub fn program(&self, kernel: &Kernel, chip: Chip) -> Result<String, RunnerError> {
        let lowered = lower(kernel, &LowerOptions { chip })
            .map_err(|e| RunnerError(format!("lowering: {e}")))?;
        let mut spec = CallSpec::from_json(&lowered.call_json).map_err(RunnerError)?;
        if self.drop_aliases {
            spec.input_output_aliases.clear();
        }
        wrap(&lowered.body, &spec).map_err(RunnerError)
    }

    /// Compile every kernel for `chip` (in parallel); one result per kernel, in order.
    pub fn compile(&self, kernels: &[&Kernel], chip: Chip) -> Vec<Result<Compiled, RunnerError>> {
        let programs: Vec<Result<String, RunnerError>> =
            kernels.iter().map(|k| self.program(k, chip)).collect();
        let jobs: Vec<Job> = programs
            .iter()
            .filter_map(|p| p.as_ref().ok())
            .map(|p| Job { program: p.clone(), chip, serialize: false })
            .collect();
        let mut compiled = self.compiler.compile_all(&jobs).into_iter();
        programs
            .into_iter()
            .map(|p| {
                p?;
                compiled
                    .next()
                    .expect("one result per job")
                    .map_err(|e| RunnerError(describe(e, chip)))
            })
            .collect()
    }

    /// libtpu's estimated cycles of every kernel on `chip`, or why there are none.
    pub fn cycles(&self, kernels: &[&Kernel], chip: Chip) -> Vec<Result<u64, RunnerError>> {
        self.compile(kernels, chip)
            .into_iter()
            .map(|c| c.and_then(|c| estimated(&c, chip)))
            .collect()
    }

    /// Cycles of the plain HBM stream ([`crate::floor`]) of about `bytes` bytes: `(cycles,
    /// bytes actually streamed)` (whole 4 MiB blocks).
    pub fn floor(&self, chip: Chip, bytes: u64) -> Result<(u64, u64), RunnerError> {
        let (kernel, streamed) = stream_kernel(bytes).map_err(RunnerError)?;
        let cycles = self.cycles(&[&kernel], chip).pop().expect("one result")?;
        Ok((cycles, streamed))
    }
}

fn describe(e: CompileError, chip: Chip) -> String {
    match e {
        CompileError::Aborted(why) => format!("libtpu aborted on {chip}: {why}"),
        other => other.to_string(),
    }
}

fn estimated(c: &Compiled, chip: Chip) -> Result<u64, RunnerError> {
    c.estimated_cycles.ok_or_else(|| {
        RunnerError(format!(
            "libtpu compiled it but gives no estimated cycles on {chip}: {}",
            c.estimate_note.as_deref().unwrap_or("no profile")
        ))
    })
}

impl Runner for Libtpu {
    fn name(&self) -> &str {
        "libtpu"
    }

    fn run(&mut self, kernel: &Kernel, chip: Chip) -> Result<CostRecord, RunnerError> {
        self.run_batch(&[kernel], chip).pop().expect("one result per kernel")
    }

    fn run_batch(
        &mut self,
        kernels: &[&Kernel],
        chip: Chip,
    ) -> Vec<Result<CostRecord, RunnerError>> {
        self.cycles(kernels, chip)
            .into_iter()
            .zip(kernels)
            .map(|(cycles, k)| {
                Ok(CostRecord {
                    runner: self.name().to_string(),
                    kind: CostKind::Measured,
                    cycles: cycles? as f64,
                    traffic: analyze(k, &self.prefetch).ok(),
                    model: None,
                })
            })
            .collect()
    }
}
