//! `palladium run`: prompt + greedy decode of a Hugging Face MoE model through its decode
//! megakernel in interpret mode.
//!
//! The config is planned for batch 1 and a KV cache covering the prompt and the decode
//! steps, the megakernel is emitted, verified and lowered for the chip
//! ([`palladium_fusion::megakernel::Megakernel`]), its serialized body is prepared once in
//! [`palladium_interpret`], and the weights (a safetensors checkpoint with the family's
//! Hugging Face tensor names, or seeded random ones) are packed into its operands
//! ([`palladium_decode::pack`]). Every token is one megakernel run
//! ([`palladium_decode::Decoder`]): the prompt at positions `0..`, then `steps`
//! greedy steps, the KV caches carried between runs through the kernel's aliases. With
//! `--tokens-per-seq K` a run feeds K tokens (the prompt K at a time); with `--speculate`
//! (or `--draft-ids`) each decode run verifies the last token and up to K - 1 drafts
//! ([`palladium_decode::speculate`]): the same ids in fewer runs. With `--devices N` the
//! megakernel is planned split over N devices and every run runs its SPMD body on N
//! virtual devices at once, each with its share of the weights and its own KV caches.

use crate::check::Backend;
use crate::output::Input;
use palladium_decode::Decoder;
use palladium_decode::pack::{pack_devices, pack_quantized_devices};
use palladium_decode::speculate::{Drafter, Forced, Ngram, NoDrafts, Speculation};
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::OperandKind;
use palladium_fusion::megakernel::Megakernel;
use palladium_fusion::plan::{Plan, PlanOptions};
use palladium_model::ModelSpec;
use palladium_model::quant::{QuantizedWeights, WeightsDtype};
use palladium_model::reference::Generation;
use palladium_model::weights::Weights;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    /// KV-cache positions to plan for (default: the positions the run writes, prompt +
    /// steps - 1 + K - 1).
    pub context: Option<u64>,
    /// Whether the reference will be run too (`--check`): counted in the host memory.
    pub check: bool,
    /// Tokens per sequence in one run (`--tokens-per-seq`).
    pub tokens_per_seq: u64,
    /// Where decode runs get their drafts.
    pub drafts: Drafts,
    /// Whether the kernel returns the full logits (`--logits-out`, `--check`).
    pub logits: bool,
    /// `--weights-dtype`; `None`: the checkpoint's own (fp8 for a config with an FP8
    /// `quantization_config`, else bf16).
    pub weights_dtype: Option<WeightsDtype>,
    /// `--devices`: the devices the megakernel is split over (1, 2, 4, 8), interpreted as
    /// that many virtual devices.
    pub devices: u64,
}

impl RunOptions {
    /// The files the run reads: the config, and the checkpoint's index and safetensors files
    /// (those its index or folder names; none where that listing fails, and then so does the
    /// load, before anything is written).
    pub fn inputs(&self) -> Vec<Input> {
        let mut inputs = vec![Input::new("the config", &self.config)];
        if let WeightSource::Checkpoint(path) = &self.weights {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                inputs.push(Input::new("the checkpoint index (--weights)", index));
            }
            let files = palladium_model::weights::checkpoint_paths(path).unwrap_or_default();
            inputs
                .extend(files.into_iter().map(|f| Input::new("a checkpoint file (--weights)", f)));
        }
        inputs
    }
}

/// Where a run's drafts come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drafts {
    /// None: one generated token per run.
    None,
    /// `--speculate ngram:N`: prompt lookup of the last N tokens.
    Ngram(usize),
    /// `--draft-ids`: a forced continuation.
    Forced(Vec<u32>),
}

impl Drafts {
    fn drafter(&self) -> Box<dyn Drafter> {
        match self {
            Drafts::None => Box::new(NoDrafts),
            Drafts::Ngram(n) => Box::new(Ngram { n: *n }),
            Drafts::Forced(ids) => Box::new(Forced { continuation: ids.clone() }),
        }
    }

    /// The flag that chose them (none without drafts).
    pub fn flag(&self) -> Option<&'static str> {
        match self {
            Drafts::None => None,
            Drafts::Ngram(_) => Some("--speculate"),
            Drafts::Forced(_) => Some("--draft-ids"),
        }
    }

    /// As the summary names it.
    pub fn describe(&self) -> String {
        match self {
            Drafts::None => "no drafts".into(),
            Drafts::Ngram(n) => format!("ngram:{n}"),
            Drafts::Forced(ids) => format!("--draft-ids ({} ids)", ids.len()),
        }
    }
}

/// Parse `--speculate`: `ngram` or `ngram:N` (N >= 1), to N.
pub fn parse_speculate(s: &str) -> Result<usize, String> {
    let bad = || {
        format!(
            "--speculate {s:?}: expected ngram or ngram:N (N >= 1, the suffix length looked up), e.g. ngram:3"
        )
    };
    match s.split_once(':') {
        None if s == "ngram" => Ok(Ngram::DEFAULT_N),
        Some(("ngram", n)) => n.parse::<usize>().ok().filter(|&n| n >= 1).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// The result of a run.
#[derive(Debug)]
pub struct RunOutput {
    pub spec: ModelSpec,
    /// The weights the kernel computes with: as loaded, or the quantized ones dequantized
    /// (what `--check`'s reference runs on).
    pub weights: Weights,
    /// The weights dtype the megakernel ran with.
    pub weights_dtype: WeightsDtype,
    /// Quantized at load: the unquantized weights, for the quantization error.
    pub unquantized: Option<Weights>,
    pub generation: Generation,
    /// Drafting's record (runs, drafted and accepted tokens).
    pub speculation: Speculation,
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
        _ => Err(format!(
            "--prompt-ids {s:?}: expected comma-separated token ids (non-negative integers), e.g. 1,2,3"
        )),
    }
}

/// Host memory a run holds at its peak, by part, in bytes (see [`host_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// The checkpoint's files, read whole (`--weights`; bounded by 4 bytes per parameter).
    pub checkpoint: u64,
    /// [`Weights`]: 4 bytes (f32) per parameter.
    pub weights: u64,
    /// The packed bf16 operands, KV caches included ([`Plan::hbm_total`], one device's, times
    /// the devices), plus the f32 staging of the largest one while packing.
    pub operands: u64,
    /// One interpreter run: every device's inputs widened to f32 (twice their bf16 bytes)
    /// and its two returned KV caches.
    pub interpreter: u64,
    /// `--check`: the bf16 and f32 references' weights (f32 each).
    pub reference: u64,
    /// Quantized weights: the codes (at most a byte per parameter) and the dequantized f32
    /// weights; with `--check` on weights quantized at load, the two more references of the
    /// quantization error (f32 each).
    pub quantized: u64,
}

impl HostMemory {
    pub fn total(&self) -> u64 {
        [
            self.checkpoint,
            self.weights,
            self.operands,
            self.interpreter,
            self.reference,
            self.quantized,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b))
    }

    fn parts(&self) -> [(&'static str, u64); 6] {
        [
            ("checkpoint files", self.checkpoint),
            ("weights (f32)", self.weights),
            ("packed operands and KV caches", self.operands),
            ("interpreter buffers", self.interpreter),
            ("--check references", self.reference),
            ("quantized and dequantized weights", self.quantized),
        ]
    }
}

/// What a run of `spec` through `plan` holds in host memory (everything saturating: a
/// saturated count is refused like any other over the limit); a split plan's operands and
/// interpreter buffers are one device's, held once per device.
pub fn host_memory(spec: &ModelSpec, plan: &Plan, o: &RunOptions) -> HostMemory {
    let devices = plan.sharding.as_ref().map_or(1, |sh| sh.devices);
    let params = spec.params().total();
    let f32_params = params.saturating_mul(4);
    let operands = &plan.layout.operands;
    let largest = operands.iter().map(|op| op.bytes).max().unwrap_or(0);
    let kv: u64 = operands
        .iter()
        .filter(|op| matches!(op.kind, OperandKind::KCache | OperandKind::VCache))
        .map(|op| op.bytes)
        .sum();
    HostMemory {
        checkpoint: if matches!(o.weights, WeightSource::Checkpoint(_)) { f32_params } else { 0 },
        weights: f32_params,
        operands: plan.hbm_total.saturating_mul(devices).saturating_add(largest.saturating_mul(2)),
        interpreter: plan.hbm_total.saturating_mul(2).saturating_add(kv).saturating_mul(devices),
        reference: if o.check { f32_params.saturating_mul(2) } else { 0 },
        quantized: match plan.layout.quant {
            None => 0,
            Some(_) => params.saturating_add(f32_params).saturating_add(if o.check {
                f32_params.saturating_mul(2)
            } else {
                0
            }),
        },
    }
}

/// Run prompt + greedy decode through the megakernel on `backend` (the interpreter, or an
/// attached TPU through libtpu's PJRT client, refused up front where there is none, and
/// for `--devices` above 1: its engine runs one device's program);
/// `progress(runs done, runs in all)` after every megakernel run. The host memory the run
/// needs is checked against the limit ([`crate::host_memory`]) before any weight is built
/// or read.
pub fn run(
    o: &RunOptions,
    backend: Backend,
    progress: impl FnMut(usize, usize),
) -> Result<RunOutput, String> {
    if backend == Backend::Tpu && o.devices > 1 {
        return Err(format!(
            "--devices {} with --backend tpu: the TPU engine runs the one-device megakernel on one attached device (no multi-device execution on PJRT yet); run the {}-device megakernel in the interpreter (--backend interpret), or emit it with `palladium megakernel --devices {}`",
            o.devices, o.devices, o.devices
        ));
    }
    let device = match backend {
        Backend::Interpret => None,
        Backend::Tpu => Some(
            palladium_runtime::exec::Device::tpu().map_err(|e| format!("--backend tpu: {e}"))?,
        ),
    };
    let spec = ModelSpec::from_path(&o.config)
        .map_err(|e| format!("cannot read the model config: {e}"))?;
    if o.prompt.is_empty() {
        return Err("the prompt is empty (--prompt-ids)".into());
    }
    if o.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    if let Some((i, &id)) =
        o.prompt.iter().enumerate().find(|(_, t)| u64::from(**t) >= spec.vocab_size)
    {
        return Err(format!(
            "--prompt-ids: token {i} is {id}, out of range for this model (vocab_size {}: ids 0..={})",
            spec.vocab_size,
            spec.vocab_size - 1
        ));
    }
    if let Drafts::Forced(ids) = &o.drafts
        && let Some((i, &id)) =
            ids.iter().enumerate().find(|(_, t)| u64::from(**t) >= spec.vocab_size)
    {
        return Err(format!(
            "--draft-ids: token {i} is {id}, out of range for this model (vocab_size {}: ids 0..={})",
            spec.vocab_size,
            spec.vocab_size - 1
        ));
    }
    let kt = o.tokens_per_seq;
    if kt == 0 || kt > palladium_fusion::plan::MAX_TOKENS_PER_SEQ {
        return Err(format!(
            "--tokens-per-seq {kt} (supported: 1..={})",
            palladium_fusion::plan::MAX_TOKENS_PER_SEQ
        ));
    }
    if let Some(flag) = o.drafts.flag()
        && kt == 1
    {
        return Err(format!(
            "{flag} with --tokens-per-seq 1: a run verifies its last token and up to K - 1 drafts, so K = 1 drafts nothing; give --tokens-per-seq 2 or more (the default with drafts is 4), or drop {flag}"
        ));
    }
    // The last run feeds the token before the last generated one and writes K positions
    // from there: the prompt, all generated tokens but the last, and K - 1 more.
    let need = (o.prompt.len() as u64).saturating_add(o.steps as u64 - 1).saturating_add(kt - 1);
    let terms = format!(
        "prompt ({}) + steps - 1 ({}){}",
        o.prompt.len(),
        o.steps - 1,
        if kt > 1 { format!(" + K - 1 ({})", kt - 1) } else { String::new() }
    );
    if need > spec.max_position_embeddings {
        return Err(format!(
            "{terms} need {need} positions, past max_position_embeddings {}",
            spec.max_position_embeddings
        ));
    }
    let context = o.context.unwrap_or(need);
    if context < need {
        return Err(format!("--context {context} is too small for {terms}: {need} positions"));
    }
    // Planned without the HBM check first: what the run holds in host memory is the first
    // question (interpret mode), the chip's HBM the second.
    let weights_dtype =
        palladium_fusion::plan::weights_dtype(&spec, o.weights_dtype).map_err(|e| e.to_string())?;
    let planned = PlanOptions {
        tokens_per_seq: kt,
        logits: o.logits,
        weights: weights_dtype,
        devices: o.devices,
        ..PlanOptions::new(o.chip, 1, context)
    };
    let unchecked = PlanOptions { check_hbm: false, ..planned.clone() };
    let plan = Plan::new(&spec, &unchecked).map_err(|e| format!("megakernel refused: {e}"))?;
    let memory = host_memory(&spec, &plan, o);
    // A bad limit is its own error, not one "or emit" fixes.
    let limit = crate::host_memory::limit()?;
    crate::host_memory::check_within(
        limit,
        &format!(
            "interpret mode runs small models on the CPU: this {} model ({:.1}M parameters, KV cache of {} positions)",
            spec.family.model_type(),
            spec.params().total() as f64 / 1e6,
            plan.dims.positions
        ),
        memory.total(),
        &memory.parts(),
    )
    .map_err(|e| format!("{e}; or emit its megakernel with `palladium megakernel`"))?;
    if plan.hbm_total > plan.hbm_capacity {
        return Err(Plan::new(&spec, &planned)
            .err()
            .map_or_else(|| "megakernel refused".into(), |e| format!("megakernel refused: {e}")));
    }
    let mk = Megakernel::from_plan(plan).map_err(|e| e.to_string())?;
    let (weights, unquantized, packed) = if weights_dtype == WeightsDtype::Bf16 {
        let weights = match &o.weights {
            WeightSource::Checkpoint(p) => {
                Weights::load(&spec, p).map_err(|e| format!("cannot load the weights: {e}"))?
            }
            WeightSource::Random(seed) => Weights::random(&spec, *seed)
                .map_err(|e| format!("cannot build random weights: {e}"))?,
        };
        let packed = pack_devices(&spec, &mk.plan, &weights)
            .map_err(|e| format!("cannot pack the weights: {e}"))?;
        (weights, None, packed)
    } else {
        // Quantized at load (a bf16 checkpoint, or random weights), or an FP8 checkpoint as
        // it is stored: the unquantized weights are kept for the quantization error.
        let (quantized, unquantized) = match &o.weights {
            WeightSource::Checkpoint(p) if WeightsDtype::of_checkpoint(&spec) == weights_dtype => (
                QuantizedWeights::load(&spec, p, Some(weights_dtype))
                    .map_err(|e| format!("cannot load the weights: {e}"))?,
                None,
            ),
            source => {
                let weights = match source {
                    WeightSource::Checkpoint(p) => Weights::load(&spec, p)
                        .map_err(|e| format!("cannot load the weights: {e}"))?,
                    WeightSource::Random(seed) => Weights::random(&spec, *seed)
                        .map_err(|e| format!("cannot build random weights: {e}"))?,
                };
                (
                    QuantizedWeights::quantize(&spec, &weights, weights_dtype).map_err(|e| {
                        format!("cannot quantize the weights to {}: {e}", weights_dtype.name())
                    })?,
                    Some(weights),
                )
            }
        };
        let packed = pack_quantized_devices(&spec, &mk.plan, &quantized)
            .map_err(|e| format!("cannot pack the weights: {e}"))?;
        (quantized.dequantize(), unquantized, packed)
    };
    let t = Instant::now();
    let mut decoder = match device {
        None => Decoder::new(&mk, packed),
        Some(device) => Decoder::with_engine(
            &mk,
            packed,
            tpu_engine(&device, &mk.lowered).map_err(|e| format!("--backend tpu: {e}"))?,
        ),
    }
    .map_err(|e| e.to_string())?;
    let prepare = t.elapsed();
    let (generation, speculation) = decoder
        .generate_with(&o.prompt, o.steps, o.drafts.drafter().as_mut(), progress)
        .map_err(|e| format!("megakernel run failed: {e}"))?;
    Ok(RunOutput {
        spec,
        weights,
        weights_dtype,
        unquantized,
        generation,
        speculation,
        plan_context: mk.plan.dims.positions,
        runs: decoder.runs,
        interpret: decoder.elapsed,
        prepare,
        body_bytes: mk.lowered.body.len(),
    })
}

/// The megakernel compiled by libtpu's client: each run moves the call's inputs to the TPU,
/// executes (the KV caches donated to their outputs) and brings the outputs back.
fn tpu_engine(
    device: &palladium_runtime::exec::Device,
    lowered: &palladium_lowering::Lowered,
) -> Result<palladium_decode::Engine, String> {
    use palladium_decode::DecodeError;
    let spec = palladium_runtime::CallSpec::from_json(&lowered.call_json)?;
    let program = palladium_runtime::wrap(&lowered.body, &spec)?;
    let loaded = device.compile(&program, &spec.inputs, &spec.outputs)?;
    Ok(Box::new(move |inputs, _call| match inputs {
        [one] => Ok(vec![loaded.run(one).map_err(DecodeError::Device)?.outputs]),
        devices => Err(DecodeError::Device(format!(
            "the TPU engine runs one device's program, not {}",
            devices.len()
        ))),
    }))
}

/// The megakernel's generation compared with the references, teacher-forced on its ids
/// ([`palladium_decode::compare_with`]: the tolerance and near-tie rules) under the
/// relative logits tolerance `relative` ([`palladium_model::tolerance`]).
pub fn check_reference(
    o: &RunOptions,
    out: &RunOutput,
    relative: f32,
) -> Result<palladium_decode::Comparison, String> {
    palladium_decode::compare_with(&out.spec, &out.weights, &o.prompt, &out.generation, relative)
}

/// The quantization error of a run quantized at load: the megakernel's logits against the
/// bf16 reference on the unquantized weights, teacher-forced on its ids: the largest
/// `|ours - reference|` over the steps, absolute and relative to the reference's
/// `max |logit|`. Reported, not checked (`None` when nothing was quantized at load).
pub fn quantization_error(o: &RunOptions, out: &RunOutput) -> Result<Option<(f32, f32)>, String> {
    let Some(unquantized) = &out.unquantized else {
        return Ok(None);
    };
    let c = palladium_decode::compare_with(
        &out.spec,
        unquantized,
        &o.prompt,
        &out.generation,
        palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE,
    )?;
    let max =
        |f: fn(&palladium_decode::StepCheck) -> f32| c.steps.iter().map(f).fold(0.0, f32::max);
    Ok(Some((max(|s| s.err_bf16), max(|s| s.rel_err_bf16))))
}

/// Shows that a long run is alive: a progress bar on a terminal, otherwise a line on stderr
/// every few seconds.
#[derive(Debug)]
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    start: Instant,
    last_line: Option<Instant>,
}

impl Progress {
    /// Lines at most this often when stderr is not a terminal.
    const LINE_EVERY: Duration = Duration::from_secs(5);
    /// No line before this: a short run prints only its summary.
    const QUIET_FOR: Duration = Duration::from_secs(2);

    pub fn new() -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:40}] {pos}/{len} tokens, {elapsed} elapsed, ETA {eta}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_message("interpreting the megakernel");
            bar
        });
        Self { bar, start: Instant::now(), last_line: None }
    }

    /// After run `done` of `total`.
    pub fn update(&mut self, done: usize, total: usize) {
        if let Some(bar) = &self.bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            return;
        }
        if let Some(line) = self.line(done, total, Instant::now()) {
            eprintln!("{line}");
        }
    }

    /// The line to print after run `done` of `total` at `now`, if one is due: none for the
    /// first seconds (a short run prints only its summary), then one every few seconds, and
    /// one at the end once any was printed.
    fn line(&mut self, done: usize, total: usize, now: Instant) -> Option<String> {
        if now.saturating_duration_since(self.start) < Self::QUIET_FOR {
            return None;
        }
        let due =
            self.last_line.is_none_or(|t| now.saturating_duration_since(t) >= Self::LINE_EVERY);
        if !(due || (done == total && self.last_line.is_some())) {
            return None;
        }
        self.last_line = Some(now);
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        let left = elapsed / done.max(1) as f64 * total.saturating_sub(done) as f64;
        Some(format!(
            "run: {done}/{total} tokens through the megakernel ({:.0}%), {elapsed:.1} s, ~{left:.0} s left at this rate",
            100.0 * done as f64 / total.max(1) as f64
        ))
    }

    /// Removes the bar (before the summary is printed).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_start_within_seconds_and_repeat() {
        let mut p = Progress { bar: None, start: Instant::now(), last_line: None };
        let at = |s: f64| p.start + Duration::from_secs_f64(s);
        let (t1, t2, t3, t4, t5) = (at(1.0), at(2.5), at(4.0), at(7.6), at(8.0));
        assert_eq!(p.line(1, 4000, t1), None, "quiet at first");
        assert_eq!(
            p.line(5, 4000, t2).as_deref(),
            Some(
                "run: 5/4000 tokens through the megakernel (0%), 2.5 s, ~1998 s left at this rate"
            )
        );
        assert_eq!(p.line(8, 4000, t3), None, "not again before 5 s");
        assert!(p.line(12, 4000, t4).is_some_and(|l| l.starts_with("run: 12/4000")));
        assert!(
            p.line(4000, 4000, t5).is_some_and(
                |l| l.starts_with("run: 4000/4000 tokens through the megakernel (100%)")
            ),
            "the end"
        );
        let mut short = Progress { bar: None, start: Instant::now(), last_line: None };
        let end = short.start + Duration::from_secs(1);
        assert_eq!(short.line(12, 12, end), None, "a short run prints nothing");
    }
}
