//! Running programs on a device through PJRT: create a client, compile a StableHLO program
//! for it, move host arrays to device buffers, execute (several outputs; inputs aliased to
//! outputs are donated), and copy the results back.
//!
//! On a TPU host this is libtpu's client ([`Device::tpu`]); without one, libtpu's
//! `PJRT_Client_Create` fails and [`Device::tpu`] says so. The same path is exercised on
//! XLA's CPU PJRT plugin (`lammps-jax-pjrt-cpu`, installed into the TPU venv by
//! `scripts/setup.sh`; [`cpu_plugin`]) with plain StableHLO programs.
//!
//! The calls are this crate's own (`ffi.rs`), with the argument structs current plugins
//! (CPU 0.115, libtpu 0.112) require for `PJRT_Client_Create` and `PJRT_ExecuteOptions`.

use crate::ffi::{self, Client, LoadedExecutable};
use crate::libtpu::{self, LIBTPU_ENVIRONMENT};
use crate::stablehlo::ArrayType;
pub use palladium_array::HostArray;
use palladium_dsl::DType;
use pjrt_sys as sys;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Environment variable naming a PJRT CPU plugin to use instead of the venv's.
pub const CPU_PLUGIN_ENV: &str = "PALLADIUM_PJRT_CPU_PLUGIN";

/// The CPU PJRT plugin: `$PALLADIUM_PJRT_CPU_PLUGIN`, else the `lammps-jax-pjrt-cpu` wheel
/// in the TPU venv (XLA's `pjrt_c_api_cpu_plugin.so`).
pub fn cpu_plugin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(CPU_PLUGIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    let venv = libtpu::venv()?;
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"))
        .find(|p| p.is_file());
    found.ok_or_else(|| {
        format!(
            "the PJRT CPU plugin is missing: looked for {}/python3*/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so (run scripts/setup.sh, or set {CPU_PLUGIN_ENV})",
            lib.display()
        )
    })
}

/// PJRT's element type for `d`.
fn buffer_type(d: DType) -> sys::PJRT_Buffer_Type {
    match d {
        DType::Bf16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
        DType::F16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
        DType::F32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
        DType::F8E4M3 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3FN,
        DType::F8E5M2 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E5M2,
        DType::I32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
        DType::I16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S16,
        DType::I8 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
        DType::I4 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S4,
        DType::Bool => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
    }
}

/// A PJRT client of one plugin.
pub struct Device {
    client: Rc<Client>,
}

impl Device {
    /// Load the plugin at `path` and create its client; the error says which step failed.
    pub fn open(path: &Path) -> Result<Device, String> {
        let plugin = Rc::new(ffi::Plugin::load(path)?);
        let client = Client::create(plugin)
            .map_err(|e| format!("PJRT_Client_Create failed for {}: {e}", path.display()))?;
        Ok(Device { client: Rc::new(client) })
    }

    /// libtpu's client: only where a TPU is attached. libtpu must see its environment
    /// ([`LIBTPU_ENVIRONMENT`]) from the start of the process: a caller without it gets an
    /// error that says what to set (the CLI re-executes itself with it).
    pub fn tpu() -> Result<Device, String> {
        let missing: Vec<String> = LIBTPU_ENVIRONMENT
            .iter()
            .filter(|(k, v)| std::env::var(k).as_deref() != Ok(*v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "libtpu needs {} in the environment before it loads",
                missing.join(" ")
            ));
        }
        let path = libtpu::locate()?;
        let unusable = |e: String| format!("no TPU attached (or usable) here: {e}");
        crate::worker::probe_client(&path).map_err(|e| {
            unusable(format!("PJRT_Client_Create failed for {}: {e}", path.display()))
        })?;
        Device::open(&path).map_err(unusable)
    }

    /// `PJRT_Client_PlatformName`: `cpu`, `tpu`.
    pub fn platform(&self) -> Result<String, String> {
        self.client.platform()
    }

    /// Compile a StableHLO program whose parameters and results are `inputs` and `outputs`
    /// (checked against the arrays at each run).
    pub fn compile(
        &self,
        program: &str,
        inputs: &[ArrayType],
        outputs: &[ArrayType],
    ) -> Result<Loaded, String> {
        let options = crate::ffi::single_device_options();
        let exe = self
            .client
            .compile(program.as_bytes(), &options)
            .map_err(|e| format!("the device rejected the program: {e}"))?;
        let n = exe.num_outputs()?;
        if n != outputs.len() {
            return Err(format!("the program has {n} results, not {}", outputs.len()));
        }
        Ok(Loaded {
            exe,
            client: self.client.clone(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        })
    }
}

/// A program compiled for a device (the device's client kept alive with it).
pub struct Loaded {
    exe: LoadedExecutable,
    client: Rc<Client>,
    inputs: Vec<ArrayType>,
    outputs: Vec<ArrayType>,
}

/// The results of one run.
#[derive(Clone, Debug)]
pub struct Run {
    pub outputs: Vec<HostArray>,
    /// Per input: whether its buffer was donated to an output (deleted by the run).
    pub donated: Vec<bool>,
}

impl Loaded {
    /// Run once: `inputs` (checked against the program's parameters) to device buffers,
    /// execute, every output back to the host. Inputs the program aliases to outputs are
    /// donated to them.
    pub fn run(&self, inputs: &[HostArray]) -> Result<Run, String> {
        if inputs.len() != self.inputs.len() {
            return Err(format!(
                "the program takes {} inputs, not {}",
                self.inputs.len(),
                inputs.len()
            ));
        }
        let mut buffers = Vec::with_capacity(inputs.len());
        for (i, (a, want)) in inputs.iter().zip(&self.inputs).enumerate() {
            let dims: Vec<i64> = a.shape.iter().map(|&d| d as i64).collect();
            if a.dtype != want.dtype
                || !dims.iter().copied().eq(want.dims.iter().map(|&d| d as i64))
            {
                return Err(format!("input {i} is {}, the program takes {want}", a.type_string()));
            }
            a.validate().map_err(|e| format!("input {i}: {e}"))?;
            buffers.push(
                self.client
                    .buffer(&a.bytes, buffer_type(a.dtype), &dims)
                    .map_err(|e| format!("input {i} to the device: {e}"))?,
            );
        }
        let outs = self
            .exe
            .execute(&buffers.iter().collect::<Vec<_>>())
            .map_err(|e| format!("execution failed: {e}"))?;
        let donated = buffers.iter().map(|b| b.is_deleted()).collect::<Result<Vec<_>, _>>()?;
        let outputs = outs
            .iter()
            .zip(&self.outputs)
            .enumerate()
            .map(|(o, (b, ty))| {
                let shape: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
                HostArray::new(
                    ty.dtype,
                    &shape,
                    b.to_host().map_err(|e| format!("output {o} to the host: {e}"))?,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Run { outputs, donated })
    }
}
