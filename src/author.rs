//! The authoring API: what a crate outside this repository calls to take a `#[kernel]` of its
//! own from Rust to the files JAX and libtpu take, libtpu's estimate and an interpreted run.
//! Each function is the CLI command of the same name for a kernel the caller built (the CLI's
//! take a library kernel by name), through the same code:
//!
//! - [`emit`]: `palladium emit` (the module, the serialized body and the call spec, written
//!   all or nothing by [`crate::output::OutputFolder`]);
//! - [`compile_for`]: `palladium compile` (libtpu, deviceless, in a worker process:
//!   [`crate::compile::compile`]);
//! - [`interpret`] and [`interpret_against`]: `palladium interpret` (the serialized body in
//!   the CPU interpreter, outputs compared with a reference: [`crate::check`]).
//!
//! Every function first refuses a kernel whose operands do not fit the chip's HBM, as the
//! CLI does.

use crate::check::{
    CheckError, OutputCheck, check_fits, check_prefetch, check_tolerance, compare, interpreter,
    lower_for,
};
use crate::compile::CompileReport;
use crate::output::OutputFolder;
use palladium_array::HostArray;
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_lowering::Lowered;
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a kernel could not be emitted, compiled or interpreted (outputs out of tolerance are
/// not an error: see [`Comparison::passed`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Lowering, the interpreter, operands that do not fit the chip, inputs or a reference
    /// that do not fit the kernel: as `palladium interpret` reports them.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The output folder cannot take the files (checked before anything is written; nothing
    /// is left half-written).
    #[error("cannot emit `{kernel}`: {message}")]
    Emit { kernel: String, message: String },
    /// libtpu is not installed, or refused the kernel (its own message).
    #[error("{0}")]
    Compile(String),
}

/// The files `palladium emit` and `compile --out` write for a kernel named `name`: the Mosaic
/// module, the serialized body, the call spec, then the StableHLO program and the serialized
/// executable. A command that writes only the first three removes the other two an earlier
/// run left: they would not match.
pub fn file_set(name: &str) -> [String; 5] {
    ["mlir", "body.mlir", "call.json", "stablehlo.mlir", "executable"]
        .map(|ext| format!("{name}.{ext}"))
}

/// What `emit` writes for `name`: the module, the serialized body, the call spec.
pub fn emitted_files(name: &str, lowered: Lowered) -> Vec<(String, Vec<u8>)> {
    vec![
        (format!("{name}.mlir"), lowered.module.into_bytes()),
        (format!("{name}.body.mlir"), lowered.body.into_bytes()),
        (format!("{name}.call.json"), lowered.call_json.into_bytes()),
    ]
}

/// Lowers `kernel` for `chip` and writes `KERNEL.mlir` (the Mosaic module as Pallas ships
/// it), `KERNEL.body.mlir` (the serialized `tpu_custom_call` body) and `KERNEL.call.json`
/// (the call spec) into `dir`, creating it: what `palladium emit` writes, and what
/// `palladium_jax.load(dir)` calls from JAX. Returns the paths written.
pub fn emit(kernel: &Kernel, chip: Chip, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let name = &kernel.name;
    let emit_error = |message: String| Error::Emit { kernel: name.clone(), message };
    let out =
        OutputFolder::check("the output folder", dir, &file_set(name), &[]).map_err(emit_error)?;
    check_fits(name, kernel, chip)?;
    let files = emitted_files(name, lower_for(name, kernel, chip)?);
    out.write(&files).map_err(emit_error)?;
    Ok(files.iter().map(|(file, _)| dir.join(file)).collect())
}

/// Compiles `kernel` for `chip` with libtpu, deviceless (no TPU needed), as `palladium
/// compile` does: code size, HBM, the VMEM limit and libtpu's static cycle estimate
/// ([`CompileReport::json`], [`CompileReport::text`]). libtpu is the TPU venv's
/// (`PALLADIUM_TPU_VENV`) or `PALLADIUM_LIBTPU`; without it the error says where it looked and
/// how to install it. The worker process is held to `PALLADIUM_MAX_HOST_MEMORY`.
pub fn compile_for(kernel: &Kernel, chip: Chip) -> Result<CompileReport, Error> {
    let name = &kernel.name;
    let memory_limit = crate::host_memory::compile_limit().map_err(Error::Compile)?;
    check_fits(name, kernel, chip)?;
    let lowered = lower_for(name, kernel, chip)?;
    crate::compile::compile(&lowered, chip, memory_limit).map_err(Error::Compile)
}

/// Runs `kernel`'s serialized body, lowered for `chip`, in the CPU interpreter on `inputs`
/// (the call's operands in declaration order, scalar-prefetch arrays first; a mesh kernel's
/// stacked per device on dim 0) and returns its outputs in declaration order. DMA races,
/// out-of-bounds accesses and deadlocks are errors naming the Rust line that traced the op.
/// Unlike `palladium interpret`, which makes its inputs, no host-memory limit is applied:
/// the caller's arrays exist already.
pub fn interpret(
    kernel: &Kernel,
    chip: Chip,
    inputs: &[HostArray],
) -> Result<Vec<HostArray>, Error> {
    let name = &kernel.name;
    check_fits(name, kernel, chip)?;
    let run = interpreter(name, kernel, chip)?;
    check_prefetch(name, kernel, inputs)?;
    Ok(run(inputs)?)
}

/// [`interpret`], then each output compared with `reference`'s (the outputs a plain-Rust
/// reference computed from the same inputs), as `palladium interpret` compares: the largest
/// error relative to the output's scale, within `tolerance` (finite, non-negative) or the
/// dtype's default (bf16 1e-2, f16 1e-3, f32 1e-5, integers exact).
pub fn interpret_against(
    kernel: &Kernel,
    chip: Chip,
    inputs: &[HostArray],
    reference: &[HostArray],
    tolerance: Option<f32>,
) -> Result<Comparison, Error> {
    check_tolerance(tolerance)?;
    let got = interpret(kernel, chip, inputs)?;
    let outputs = compare(&kernel.name, kernel, &got, reference, tolerance)?;
    Ok(Comparison { kernel: kernel.name.clone(), chip, outputs })
}

/// The result of [`interpret_against`]: one line per output, as `palladium interpret`
/// prints it.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub kernel: String,
    pub chip: Chip,
    pub outputs: Vec<OutputCheck>,
}

impl Comparison {
    /// Every output within its tolerance.
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(OutputCheck::passed)
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} on {}, interpreted against the reference:", self.kernel, self.chip)?;
        for o in &self.outputs {
            writeln!(f, "{o}")?;
        }
        write!(f, "{}", if self.passed() { "PASS" } else { "FAIL" })
    }
}
