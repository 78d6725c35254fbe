//! Interpret mode for library kernels: build and lower a kernel, run its serialized Mosaic
//! body in [`palladium_interpret`] on seeded random inputs, and compare every output with
//! the kernel's plain-Rust reference (`palladium_kernels::reference`).
//!
//! Errors are measured per output, relative to the output's scale, under a tolerance per
//! dtype: [`palladium_array::tolerance::output_errors`] and
//! [`palladium_array::tolerance::output_tolerance`].
//!
//! Before any array is allocated, the host memory the check needs ([`HostMemory`]) is
//! computed from the kernel's call spec and refused above [`CheckOptions::max_host_memory`]
//! (the CLI's limit: [`crate::host_memory`]).

use palladium_array::HostArray;
use palladium_array::tolerance::{output_errors, output_tolerance};
use palladium_dsl::ir::{Kernel, check_hbm, padded_vmem_bytes};
use palladium_dsl::spec::{Chip, OperandRole, ScratchSpec};
use palladium_interpret::{CallSpec, InterpError, Module, ParseError, Program};
use palladium_kernels::{KernelEntry, KernelError};
use palladium_lowering::{LowerOptions, Lowered, lower};
use std::fmt;
use std::time::{Duration, Instant};

/// What to check a kernel with.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub chip: Chip,
    pub seed: u64,
    /// Overrides [`output_tolerance`] for every output; finite and non-negative.
    pub tolerance: Option<f32>,
    /// Refuse kernels whose [`HostMemory`] total is larger (bytes; the CLI reads
    /// [`crate::host_memory::limit`]).
    pub max_host_memory: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            chip: Chip::V6e,
            seed: 0,
            tolerance: None,
            max_host_memory: crate::host_memory::DEFAULT_LIMIT,
        }
    }
}

/// The host memory checking a kernel needs, in bytes (saturating), estimated from its call
/// spec before anything is allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// Per input element: the generated values (f32 or i32, before they become the host
    /// array), the host array (the dtype's bytes), its copy in interpreter memory (4 bytes)
    /// and the reference's f32 or i32 copy (4 bytes).
    pub inputs: u64,
    /// Per output element: the interpreter's memory and result (4 bytes + the dtype's), the
    /// reference output (4) and the two f32 arrays compared (8).
    pub outputs: u64,
    /// Windows (double-buffered) and scratch, 4 bytes per element in the interpreter.
    pub buffers: u64,
}

impl HostMemory {
    pub fn of(kernel: &Kernel) -> HostMemory {
        let elems =
            |s: &palladium_dsl::ir::Shape| s.dims().iter().fold(1u64, |n, &d| n.saturating_mul(d));
        let bytes = |dtype: palladium_dsl::DType| u64::from(dtype.memory_bits()).div_ceil(8);
        let (mut inputs, mut outputs, mut buffers) = (0u64, 0u64, 0u64);
        for o in &kernel.call.operands {
            let n = elems(&o.shape);
            if o.role == OperandRole::Output {
                outputs = outputs.saturating_add(n.saturating_mul(16 + bytes(o.dtype)));
            } else {
                inputs = inputs.saturating_add(n.saturating_mul(12 + bytes(o.dtype)));
            }
            if o.block.is_some() {
                buffers = buffers.saturating_add(elems(&o.window_shape()).saturating_mul(8));
            }
        }
        for s in &kernel.call.scratch {
            if let ScratchSpec::Buffer { dtype, shape, .. } = s {
                // Padded like VMEM, then 4 bytes per element as the interpreter holds it.
                let padded = padded_vmem_bytes(*dtype, shape) / bytes(*dtype).max(1);
                buffers = buffers.saturating_add(padded.saturating_mul(4));
            }
        }
        // A mesh kernel's operands, windows and scratch are per device.
        let devices = kernel.call.devices();
        HostMemory {
            inputs: inputs.saturating_mul(devices),
            outputs: outputs.saturating_mul(devices),
            buffers: buffers.saturating_mul(devices),
        }
    }

    pub fn total(&self) -> u64 {
        self.inputs.saturating_add(self.outputs).saturating_add(self.buffers)
    }
}

/// Why a kernel could not be checked (a failed comparison is not an error: see
/// [`Report::passed`]).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("cannot lower `{kernel}` for {chip}:\n{message}")]
    Lower { kernel: String, chip: Chip, message: String },
    #[error("interpreter cannot parse the body of `{kernel}`: {error}")]
    Parse { kernel: String, error: ParseError },
    #[error("interpreter error in `{kernel}`: {error}")]
    Interp { kernel: String, error: Box<InterpError> },
    #[error("`{kernel}`: {message}")]
    Mismatch { kernel: String, message: String },
    #[error("cannot run `{kernel}`: {message}")]
    Refused { kernel: String, message: String },
    #[error("tolerance {0} must be finite and non-negative")]
    Tolerance(f32),
    #[error("`{kernel}` on the device: {message}")]
    Device { kernel: String, message: String },
}

/// Where the kernel runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The serialized body in the CPU interpreter.
    Interpret,
    /// libtpu's PJRT client on an attached TPU (`palladium exec`).
    Tpu,
}

/// One output compared with its reference.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    pub name: String,
    /// `bf16[1024,1024]`.
    pub ty: String,
    pub max_abs: f32,
    pub max_rel: f32,
    /// Flat index of the element with the largest error, with its values.
    pub worst: Option<(usize, f32, f32)>,
    pub tolerance: f32,
}

impl OutputCheck {
    pub fn passed(&self) -> bool {
        self.max_rel <= self.tolerance
    }
}

/// The result of [`check`].
#[derive(Clone, Debug)]
pub struct Report {
    pub kernel: String,
    /// Every parameter, with the overrides applied.
    pub params: Vec<(String, String)>,
    pub chip: Chip,
    pub seed: u64,
    pub grid: Vec<i64>,
    /// The virtual devices the body ran on (1 but for a mesh kernel).
    pub devices: u64,
    pub outputs: Vec<OutputCheck>,
    /// Parse + prepare of the body.
    pub prepare_time: Duration,
    /// `Program::run`.
    pub run_time: Duration,
    pub reference_time: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(OutputCheck::passed)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: Vec<String> = self.params.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let grid: Vec<String> = self.grid.iter().map(|g| g.to_string()).collect();
        let devices =
            if self.devices > 1 { format!(" x {} devices", self.devices) } else { String::new() };
        writeln!(
            f,
            "{} {} on {}{devices}, seed {}: grid ({}), body interpreted in {:.3} s (prepare {:.3} s), reference {:.3} s",
            self.kernel,
            params.join(" "),
            self.chip,
            self.seed,
            grid.join(", "),
            self.run_time.as_secs_f64(),
            self.prepare_time.as_secs_f64(),
            self.reference_time.as_secs_f64()
        )?;
        for o in &self.outputs {
            writeln!(f, "{o}")?;
        }
        write!(f, "{}", if self.passed() { "PASS" } else { "FAIL" })
    }
}

/// `  o        bf16[2,4,8,128]        max abs err 2.441e-4  max rel err 5.587e-3  tolerance 1e-2  ok`,
/// with the worst element when it failed.
impl fmt::Display for OutputCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  {:<8} {:<22} max abs err {:.3e}  max rel err {:.3e}  tolerance {:.0e}  {}",
            self.name,
            self.ty,
            self.max_abs,
            self.max_rel,
            self.tolerance,
            if self.passed() { "ok" } else { "FAIL" }
        )?;
        if !self.passed()
            && let Some((i, got, want)) = self.worst
        {
            write!(f, " (worst at flat index {i}: got {got}, want {want})")?;
        }
        Ok(())
    }
}

/// Build, lower and prepare a library kernel: `(entry, kernel, program, call spec)`. The
/// call spec (the lowered call JSON: full output shapes and input/output aliases) is what
/// [`Program::run_with`] needs to start an aliased output as a copy of its input.
pub fn prepare(
    name: &str,
    settings: &[(String, String)],
    chip: Chip,
) -> Result<(&'static KernelEntry, palladium_dsl::Kernel, Program, CallSpec), CheckError> {
    let entry = palladium_kernels::entry(name)?;
    let kernel = (entry.build)(settings)?;
    let (program, spec) = lower_and_prepare(name, &kernel, chip)?;
    Ok((entry, kernel, program, spec))
}

/// A tolerance given for every output: finite and non-negative.
pub(crate) fn check_tolerance(tolerance: Option<f32>) -> Result<(), CheckError> {
    match tolerance.filter(|t| !t.is_finite() || *t < 0.0) {
        Some(t) => Err(CheckError::Tolerance(t)),
        None => Ok(()),
    }
}

/// The kernel's operands fit `chip`'s HBM ([`check_hbm`]).
pub(crate) fn check_fits(name: &str, kernel: &Kernel, chip: Chip) -> Result<(), CheckError> {
    check_hbm(kernel, chip)
        .map_err(|message| CheckError::Refused { kernel: name.to_string(), message })
}

/// `kernel` (named `name` in errors) lowered for `chip`.
pub(crate) fn lower_for(name: &str, kernel: &Kernel, chip: Chip) -> Result<Lowered, CheckError> {
    lower(kernel, &LowerOptions { chip }).map_err(|e| CheckError::Lower {
        kernel: name.to_string(),
        chip,
        message: e.to_string(),
    })
}

fn lower_and_prepare(
    name: &str,
    kernel: &Kernel,
    chip: Chip,
) -> Result<(Program, CallSpec), CheckError> {
    let lowered = lower_for(name, kernel, chip)?;
    let module = Module::parse(&lowered.body)
        .map_err(|error| CheckError::Parse { kernel: name.to_string(), error })?;
    let program = module
        .prepare()
        .map_err(|error| CheckError::Interp { kernel: name.to_string(), error: Box::new(error) })?;
    let spec = CallSpec::from_json(&lowered.call_json)
        .map_err(|error| CheckError::Interp { kernel: name.to_string(), error: Box::new(error) })?;
    Ok((program, spec))
}

/// Check one library kernel in interpret mode.
pub fn check(
    name: &str,
    settings: &[(String, String)],
    options: &CheckOptions,
) -> Result<Report, CheckError> {
    check_on(name, settings, options, Backend::Interpret)
}

/// Check one library kernel on `backend`: the same seeded inputs and reference comparison
/// whether the body runs in the interpreter or on a TPU.
pub fn check_on(
    name: &str,
    settings: &[(String, String)],
    options: &CheckOptions,
    backend: Backend,
) -> Result<Report, CheckError> {
    check_tolerance(options.tolerance)?;
    let t = Instant::now();
    let entry = palladium_kernels::entry(name)?;
    let kernel = (entry.build)(settings)?;
    check_fits(name, &kernel, options.chip)?;
    let need = HostMemory::of(&kernel);
    let parts = [
        ("inputs", need.inputs),
        ("outputs and reference", need.outputs),
        ("windows and scratch", need.buffers),
    ];
    crate::host_memory::check_within(
        options.max_host_memory,
        "interpret mode",
        need.total(),
        &parts,
    )
    .map_err(|message| CheckError::Refused { kernel: name.to_string(), message })?;
    let run: BodyRun<'_> = match backend {
        Backend::Interpret => interpreter(name, &kernel, options.chip)?,
        Backend::Tpu => on_tpu(name, &kernel, options.chip)?,
    };
    let prepare_time = t.elapsed();
    let inputs = (entry.inputs)(settings, options.seed)?;
    check_prefetch(name, &kernel, &inputs)?;
    let t = Instant::now();
    let got = run(&inputs)?;
    let run_time = t.elapsed();
    let t = Instant::now();
    let want = (entry.reference)(settings, &inputs)?;
    let reference_time = t.elapsed();
    let outputs = compare(name, &kernel, &got, &want, options.tolerance)?;
    let mut params: Vec<(String, String)> =
        (entry.defaults)().into_iter().map(|(n, v)| (n.to_string(), v)).collect();
    for (n, v) in settings {
        if let Some(p) = params.iter_mut().find(|(pn, _)| pn == n) {
            p.1.clone_from(v);
        }
    }
    let grid = kernel.call.grid.iter().map(|g| g.extent as i64).collect();
    Ok(Report {
        kernel: name.to_string(),
        params,
        chip: options.chip,
        seed: options.seed,
        grid,
        devices: kernel.call.devices(),
        outputs,
        prepare_time,
        run_time,
        reference_time,
    })
}

/// The kernel's body in the CPU interpreter: lowered for `chip`, parsed and prepared once,
/// run by the returned closure on each set of inputs (a mesh kernel's stacked on dim 0 per
/// device, as [`split_devices`] splits them).
pub(crate) fn interpreter<'a>(
    name: &'a str,
    kernel: &Kernel,
    chip: Chip,
) -> Result<BodyRun<'a>, CheckError> {
    let (program, spec) = lower_and_prepare(name, kernel, chip)?;
    // With the call spec: aliased outputs start as copies of their inputs (in-place
    // kernels such as `kv_cache_update` write only part of them), output shapes as
    // the call has them.
    let interp_error =
        move |error| CheckError::Interp { kernel: name.to_string(), error: Box::new(error) };
    Ok(match kernel.call.devices() as usize {
        1 => {
            Box::new(move |host: &[HostArray]| program.run_with(host, &spec).map_err(interp_error))
        }
        devices => Box::new(move |host: &[HostArray]| {
            let per_device = split_devices(host, devices)
                .map_err(|message| CheckError::Mismatch { kernel: name.to_string(), message })?;
            let outputs = program.run_devices(&per_device, Some(&spec)).map_err(interp_error)?;
            stack_devices(&outputs)
                .map_err(|message| CheckError::Mismatch { kernel: name.to_string(), message })
        }),
    })
}

/// The scalar-prefetch arrays come first among `inputs`, each within the range its operand
/// declares (a mesh kernel's stacked per device: the values are checked, not the length).
pub(crate) fn check_prefetch(
    name: &str,
    kernel: &Kernel,
    inputs: &[HostArray],
) -> Result<(), CheckError> {
    for (o, array) in kernel.call.operands_of(OperandRole::Prefetch).zip(inputs) {
        let values: Vec<i64> = array.to_i32().into_iter().map(i64::from).collect();
        o.check_values(&values).map_err(|why| CheckError::Refused {
            kernel: name.to_string(),
            message: format!("scalar prefetch `{}`: {why}", o.name),
        })?;
    }
    Ok(())
}

/// Each output of the run (`got`) against the reference's (`want`), in call-spec order,
/// under `tolerance` or the dtype's [`output_tolerance`]; a count, shape or dtype that
/// differs is a [`CheckError::Mismatch`].
pub(crate) fn compare(
    name: &str,
    kernel: &Kernel,
    got: &[HostArray],
    want: &[HostArray],
    tolerance: Option<f32>,
) -> Result<Vec<OutputCheck>, CheckError> {
    let specs: Vec<_> = kernel.call.operands_of(OperandRole::Output).collect();
    let mismatch = |message: String| CheckError::Mismatch { kernel: name.to_string(), message };
    if got.len() != want.len() || got.len() != specs.len() {
        return Err(mismatch(format!(
            "the kernel has {} outputs, the run returned {}, the reference {}",
            specs.len(),
            got.len(),
            want.len()
        )));
    }
    let mut outputs = Vec::new();
    for ((g, w), spec) in got.iter().zip(want).zip(&specs) {
        if g.shape != w.shape || g.dtype != w.dtype {
            return Err(mismatch(format!(
                "output {}: the run returned {}{:?}, the reference {}",
                spec.name,
                g.dtype,
                g.shape,
                w.type_string()
            )));
        }
        let (max_abs, max_rel, worst) = output_errors(&g.to_f32(), &w.to_f32());
        outputs.push(OutputCheck {
            name: spec.name.clone(),
            ty: w.type_string(),
            max_abs,
            max_rel,
            worst,
            tolerance: tolerance.unwrap_or_else(|| output_tolerance(w.dtype)),
        });
    }
    Ok(outputs)
}

/// A mesh kernel's global inputs (each the devices' operands stacked on dim 0, as the
/// registry's cases make them) as the devices' own: `devices` lists of operands.
fn split_devices(host: &[HostArray], devices: usize) -> Result<Vec<Vec<HostArray>>, String> {
    let mut per_device = vec![Vec::with_capacity(host.len()); devices];
    for (i, array) in host.iter().enumerate() {
        let parts = array.split_leading(devices).map_err(|e| format!("input {i}: {e}"))?;
        for (d, part) in parts.into_iter().enumerate() {
            per_device[d].push(part);
        }
    }
    Ok(per_device)
}

/// The devices' outputs of a mesh kernel, each output stacked on dim 0 in device order.
fn stack_devices(outputs: &[Vec<HostArray>]) -> Result<Vec<HostArray>, String> {
    let count = outputs.first().map_or(0, Vec::len);
    (0..count)
        .map(|o| {
            HostArray::stack_leading(&outputs.iter().map(|d| d[o].clone()).collect::<Vec<_>>())
                .map_err(|e| format!("output {o}: {e}"))
        })
        .collect()
}

/// One run of a kernel's body: its inputs to its outputs.
pub(crate) type BodyRun<'a> = Box<dyn Fn(&[HostArray]) -> Result<Vec<HostArray>, CheckError> + 'a>;

/// The kernel lowered, wrapped in its `tpu_custom_call` program and compiled by libtpu's
/// client on the attached TPU.
fn on_tpu(
    name: &str,
    kernel: &palladium_dsl::Kernel,
    chip: Chip,
) -> Result<BodyRun<'static>, CheckError> {
    use palladium_runtime::exec::Device;
    let device_error = |message: String| CheckError::Device { kernel: name.to_string(), message };
    let lowered = lower_for(name, kernel, chip)?;
    let spec = palladium_runtime::CallSpec::from_json(&lowered.call_json).map_err(device_error)?;
    let program = palladium_runtime::wrap(&lowered.body, &spec).map_err(device_error)?;
    let device = Device::tpu().map_err(device_error)?;
    let loaded = device.compile(&program, &spec.inputs, &spec.outputs).map_err(device_error)?;
    let name = name.to_string();
    Ok(Box::new(move |host: &[HostArray]| {
        loaded
            .run(host)
            .map(|run| run.outputs)
            .map_err(|message| CheckError::Device { kernel: name.clone(), message })
    }))
}
