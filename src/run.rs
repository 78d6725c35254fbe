//! `palladium run`: prompt + greedy decode of a Hugging Face MoE model through its decode
//! megakernel in interpret mode.
//!
//! The config is planned for batch 1 and a KV cache covering the prompt and the decode
//! steps, the megakernel is emitted, verified and lowered for the chip, its serialized body
//! is prepared once in [`palladium_interpret`], and the weights (a safetensors checkpoint
//! with the family's Hugging Face tensor names, or seeded random ones) are packed into its
//! operands ([`palladium_fusion::pack`]). Every token is one megakernel run
//! ([`palladium_fusion::decode::Decoder`]): the prompt at positions `0..`, then `steps`
//! greedy steps, the KV caches carried between runs through the kernel's aliases.

use crate::check::Backend;
use palladium_dsl::spec::Chip;
use palladium_fusion::decode::Decoder;
use palladium_fusion::pack::pack;
use palladium_fusion::plan::{Plan, PlanOptions};
use palladium_lowering::{LowerOptions, lower};
use palladium_model::ModelSpec;
use palladium_model::reference::Generation;
use palladium_model::weights::Weights;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The largest model `run` accepts: the weights are held as f32 (`Weights`), packed bf16, and
/// widened again by the interpreter on every run.
pub const MAX_PARAMS: u64 = 64 << 20;

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum WeightSource {
    /// A `.safetensors` file or a checkpoint directory ([`Weights::load`]).
    Checkpoint(PathBuf),
    /// [`Weights::random`] with this seed.
    Random(u64),
}

/// What `palladium run` runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config: PathBuf,
    pub weights: WeightSource,
    pub prompt: Vec<u32>,
    pub steps: usize,
    pub chip: Chip,
    /// KV-cache positions to plan for (default: prompt + steps).
    pub context: Option<u64>,
}

/// The result of a run.
#[derive(Debug)]
pub struct RunOutput {
    pub spec: ModelSpec,
    pub weights: Weights,
    pub generation: Generation,
    pub plan_context: u64,
    pub runs: usize,
    pub interpret: Duration,
    pub prepare: Duration,
    pub body_bytes: usize,
}

/// Parse `1,2,3`.
pub fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    let ids: Result<Vec<u32>, _> = s.split(',').map(|x| x.trim().parse::<u32>()).collect();
    match ids {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => Err(format!("--prompt-ids {s:?}: expected comma-separated token ids (non-negative integers), e.g. 1,2,3")),
    }
}

/// Run prompt + greedy decode through the megakernel in interpret mode.
pub fn run(o: &RunOptions) -> Result<RunOutput, String> {
    run_on(o, Backend::Interpret)
}

/// [`run`] on `backend`: in the interpreter, or on an attached TPU (libtpu's PJRT client;
/// refused up front, before the weights load, where there is none).
pub fn run_on(o: &RunOptions, backend: Backend) -> Result<RunOutput, String> {
    let device = match backend {
        Backend::Interpret => None,
        Backend::Tpu => Some(palladium_runtime::exec::Device::tpu().map_err(|e| format!("--backend tpu: {e}"))?),
    };
    let spec = ModelSpec::from_path(&o.config).map_err(|e| format!("cannot read the model config: {e}"))?;
    if o.prompt.is_empty() {
        return Err("the prompt is empty (--prompt-ids)".into());
    }
    if o.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    if let Some((i, &id)) = o.prompt.iter().enumerate().find(|(_, t)| u64::from(**t) >= spec.vocab_size) {
        return Err(format!("--prompt-ids: token {i} is {id}, out of range for this model (vocab_size {}: ids 0..={})", spec.vocab_size, spec.vocab_size - 1));
    }
    let need = (o.prompt.len() + o.steps - 1) as u64;
    if need > spec.max_position_embeddings {
        return Err(format!("prompt ({}) + steps ({}) need {need} positions, past max_position_embeddings {}", o.prompt.len(), o.steps, spec.max_position_embeddings));
    }
    let context = o.context.unwrap_or(need);
    if context < need {
        return Err(format!("--context {context} is too small for prompt ({}) + steps ({}): {need} positions", o.prompt.len(), o.steps));
    }
    let params = spec.params().total();
    if params > MAX_PARAMS {
        return Err(format!(
            "interpret mode runs small models on the CPU: this {} model has {:.2}B parameters (limit {}M, the weights are held in host memory several times over); emit its megakernel with `palladium megakernel` instead",
            spec.family.model_type(),
            params as f64 / 1e9,
            MAX_PARAMS >> 20
        ));
    }
    let weights = match &o.weights {
        WeightSource::Checkpoint(p) => Weights::load(&spec, p).map_err(|e| format!("cannot load the weights: {e}"))?,
        WeightSource::Random(seed) => Weights::random(&spec, *seed).map_err(|e| format!("cannot build random weights: {e}"))?,
    };
    let plan = Plan::new(&spec, &PlanOptions::new(o.chip, 1, context)).map_err(|e| format!("megakernel refused: {e}"))?;
    let kernel = palladium_fusion::emit::emit(&plan).map_err(|e| format!("cannot build the megakernel:\n{e}"))?;
    let lowered = lower(&kernel, &LowerOptions { chip: o.chip }).map_err(|e| format!("cannot lower the megakernel for {}:\n{e}", o.chip))?;
    let packed = pack(&spec, &plan, &weights).map_err(|e| format!("cannot pack the weights: {e}"))?;
    let t = Instant::now();
    let mut decoder = match device {
        None => Decoder::new(&plan, &lowered.body, &lowered.call_json, packed),
        Some(device) => Decoder::with_engine(&plan, &lowered.call_json, packed, tpu_engine(&device, &lowered).map_err(|e| format!("--backend tpu: {e}"))?),
    }
    .map_err(|e| e.to_string())?;
    let prepare = t.elapsed();
    let generation = decoder.generate(&o.prompt, o.steps).map_err(|e| format!("megakernel run failed: {e}"))?;
    Ok(RunOutput {
        spec,
        weights,
        generation,
        plan_context: plan.dims.positions,
        runs: decoder.runs,
        interpret: decoder.elapsed,
        prepare,
        body_bytes: lowered.body.len(),
    })
}

/// The megakernel compiled by libtpu's client: each run moves the call's inputs to the TPU,
/// executes (the KV caches donated to their outputs) and brings the outputs back.
fn tpu_engine(device: &palladium_runtime::exec::Device, lowered: &palladium_lowering::Lowered) -> Result<palladium_fusion::decode::Engine, String> {
    use palladium_fusion::decode::DecodeError;
    use palladium_runtime::exec::HostArray as DeviceArray;
    let spec = palladium_runtime::CallSpec::from_json(&lowered.call_json)?;
    let program = palladium_runtime::wrap(&lowered.body, &spec)?;
    let loaded = device.compile(&program, &spec.inputs, &spec.outputs)?;
    Ok(Box::new(move |inputs, _call| {
        let arrays = inputs.iter().zip(&spec.inputs).map(|(h, ty)| DeviceArray::new(ty.clone(), h.bytes.clone())).collect::<Result<Vec<_>, _>>().map_err(DecodeError::Device)?;
        let run = loaded.run(&arrays).map_err(DecodeError::Device)?;
        run.outputs
            .into_iter()
            .map(|o| {
                let dtype = palladium_interpret::DType::parse(o.ty.dtype.name()).ok_or_else(|| DecodeError::Device(format!("no host arrays of {}", o.ty.dtype)))?;
                Ok(palladium_interpret::HostArray { dtype, shape: o.ty.dims.iter().map(|&d| d as usize).collect(), bytes: o.bytes })
            })
            .collect()
    }))
}

/// The megakernel's generation compared with the references, teacher-forced on its ids
/// ([`palladium_fusion::decode::compare`]: the tolerance and near-tie rules).
pub fn check_reference(o: &RunOptions, out: &RunOutput) -> Result<palladium_fusion::decode::Comparison, String> {
    palladium_fusion::decode::compare(&out.spec, &out.weights, &o.prompt, &out.generation)
}
