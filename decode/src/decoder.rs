//! Decoding with the megakernel in interpret mode: one decode step = one run of the
//! serialized body in [`palladium_interpret`] (or on a device: [`Engine`]), with the packed
//! weights ([`crate::pack`]),
//! the token and position of every sequence as scalar prefetch, and the KV caches carried
//! from one run to the next through the kernel's input/output aliases. A megakernel split
//! over N devices (`--devices N`) runs on N virtual devices at once
//! (`Program::run_devices`), each with its own share of the weights
//! ([`crate::pack::pack_devices`]) and its own KV caches, fed the same tokens; every device
//! must return the same greedy ids and maxima (their all-gathered pairs), and the logits
//! are the devices' vocabulary slices put back in vocabulary order. A run feeds K
//! consecutive tokens per sequence (`--tokens-per-seq`, 1 by default) and returns the
//! kernel's greedy ids (and the full logits when the kernel has them). Prefill feeds the
//! prompt K tokens per run at positions `0..`; decoding then verifies the last token and
//! up to K - 1 drafted ones per run ([`crate::speculate`]), plain greedy when nothing is
//! drafted.

use crate::pack::Packed;
use crate::speculate::{Drafter, Speculation, accepted};
use palladium_array::HostArray;
use palladium_fusion::layout::{OperandKind, StreamLayout};
use palladium_fusion::megakernel::Megakernel;
use palladium_interpret::{CallSpec, InterpError, Module, ParseError};
use palladium_model::reference::{Generation, StepLogits};
use std::time::{Duration, Instant};

/// Why a decode step could not run.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the interpreter cannot parse the megakernel body: {0}")]
    Parse(#[from] ParseError),
    #[error("the interpreter rejected the megakernel: {0}")]
    Interp(#[from] Box<InterpError>),
    #[error("the call spec does not match the packed weights: {0}")]
    Interface(String),
    #[error("token id {id} is out of range (vocab_size {vocab})")]
    TokenOutOfRange { id: u32, vocab: u64 },
    #[error(
        "sequence {seq}: position {pos} is past the KV cache ({capacity} positions; plan a larger --context)"
    )]
    ContextFull { seq: usize, pos: usize, capacity: u64 },
    #[error("{got} tokens for a batch of {batch} x {tokens_per_seq} tokens per sequence")]
    Batch { got: usize, batch: usize, tokens_per_seq: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "{at}: the logits are not finite ({what}); the weights or the kernel produce NaN or infinity"
    )]
    NonFinite { at: String, what: String },
    #[error(
        "{at}: the router logits of layer {layer} are not finite (NaN or infinity): the weights, the config's constants or the kernel overflow at or before that layer's router"
    )]
    RouterNonFinite { at: String, layer: usize },
    #[error("the device: {0}")]
    Device(String),
    #[error(
        "megakernel run {run}: device {device} of {devices} gives token row {row} the greedy id {id} (max logit {max}), device 0 gives {id0} ({max0}); the all-gathered greedy pairs must agree on every device"
    )]
    DevicesDisagree {
        run: usize,
        devices: usize,
        device: usize,
        row: usize,
        id: i32,
        max: f32,
        id0: i32,
        max0: f32,
    },
}

impl From<InterpError> for DecodeError {
    fn from(e: InterpError) -> Self {
        DecodeError::Interp(Box::new(e))
    }
}

/// What runs the megakernel once on every device of its mesh (one on one device): each
/// device's call inputs to its outputs (the interpreter, or a device).
pub type Engine =
    Box<dyn FnMut(&[Vec<HostArray>], &CallSpec) -> Result<Vec<Vec<HostArray>>, DecodeError>>;

/// Where the arrays a step feeds and reads sit in the call: input positions (prefetch
/// counted) and output positions, from the megakernel's layout.
#[derive(Clone, Copy, Debug)]
struct Slots {
    tokens: usize,
    positions: usize,
    k_in: usize,
    v_in: usize,
    logits: Option<usize>,
    next_ids: usize,
    max_logits: usize,
    router_non_finite: usize,
    k_out: usize,
    v_out: usize,
}

impl Slots {
    fn of(layout: &StreamLayout) -> Result<Slots, DecodeError> {
        let input = |kind: OperandKind| {
            layout.inputs().position(|o| o.kind == kind).ok_or_else(|| {
                DecodeError::Interface(format!("the megakernel has no input {}", kind.name()))
            })
        };
        let output = |kind: OperandKind| {
            layout.outputs().position(|o| o.kind == kind).ok_or_else(|| {
                DecodeError::Interface(format!("the megakernel has no output {}", kind.name()))
            })
        };
        Ok(Slots {
            tokens: input(OperandKind::Tokens)?,
            positions: input(OperandKind::Positions)?,
            k_in: input(OperandKind::KCache)?,
            v_in: input(OperandKind::VCache)?,
            logits: output(OperandKind::Logits).ok(),
            next_ids: output(OperandKind::NextIds)?,
            max_logits: output(OperandKind::MaxLogits)?,
            router_non_finite: output(OperandKind::RouterNonFinite)?,
            k_out: output(OperandKind::KCacheOut)?,
            v_out: output(OperandKind::VCacheOut)?,
        })
    }
}

/// What one run returns, per token row (row `b * K + k`: sequence `b`'s `k`-th token).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The greedy next id after each row's token (the kernel's argmax: the lowest id among
    /// equal maxima).
    pub ids: Vec<u32>,
    /// Each row's maximum logit, NaN when any of its logits is not finite.
    pub max_logits: Vec<f32>,
    /// Each row's logits (`vocab` values), when the kernel returns them (`--logits`).
    pub logits: Option<Vec<Vec<f32>>>,
    /// Each row's first layer whose router logits were not finite (on any device).
    pub router_non_finite: Vec<Option<usize>>,
}

impl Step {
    /// Row `row`'s router logits and logits all finite: else [`DecodeError::RouterNonFinite`]
    /// naming `what` and the first layer gone bad (the cause: everything after it is
    /// poisoned), or [`DecodeError::NonFinite`] naming `what` and the first bad logit (or
    /// the row's maximum, without the full logits).
    fn finite(&self, row: usize, what: impl FnOnce() -> String) -> Result<(), DecodeError> {
        if let Some(layer) = self.router_non_finite[row] {
            return Err(DecodeError::RouterNonFinite { at: what(), layer });
        }
        if let Some(logits) = &self.logits {
            return finite(&logits[row], what);
        }
        let max = self.max_logits[row];
        if max.is_finite() {
            Ok(())
        } else {
            Err(DecodeError::NonFinite { at: what(), what: format!("the row's maximum is {max}") })
        }
    }
}

/// A megakernel ready to run decode steps (on the CPU, or on the engine it was given), with
/// its KV caches.
pub struct Decoder {
    engine: Engine,
    call: CallSpec,
    /// Each device's call inputs (scalar prefetch, weights, caches), in the layout's order.
    inputs: Vec<Vec<HostArray>>,
    slots: Slots,
    /// The model's vocabulary, and the ids of it each device's `lm_head` slice holds
    /// (device `d` ids `d * vocab_per_device..`; the whole vocabulary on one device).
    vocab: u64,
    vocab_per_device: usize,
    batch: usize,
    tokens_per_seq: usize,
    chunk_cols: usize,
    rows: usize,
    layers: usize,
    capacity: u64,
    /// Next position of every sequence.
    lens: Vec<usize>,
    /// Time spent in the runs (the interpreter or the device).
    pub elapsed: Duration,
    pub runs: usize,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("devices", &self.inputs.len())
            .field("batch", &self.batch)
            .field("lens", &self.lens)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// The megakernel `mk` run in the interpreter; `packed`: each device's weights (one
    /// [`Packed`] on one device; [`crate::pack::pack_devices`]), run on that many virtual
    /// devices.
    pub fn new(mk: &Megakernel, packed: Vec<Packed>) -> Result<Self, DecodeError> {
        let program = Module::parse(&mk.lowered.body)?.prepare()?;
        Decoder::with_engine(
            mk,
            packed,
            Box::new(move |inputs, call| match inputs {
                [one] => Ok(vec![program.run_with(one, call)?]),
                devices => Ok(program.run_devices(devices, Some(call))?),
            }),
        )
    }

    /// [`Decoder::new`] with another engine for the runs (e.g. a TPU).
    pub fn with_engine(
        mk: &Megakernel,
        packed: Vec<Packed>,
        engine: Engine,
    ) -> Result<Self, DecodeError> {
        let plan = &mk.plan;
        let devices = plan.sharding.as_ref().map_or(1, |sh| sh.devices) as usize;
        if packed.len() != devices {
            return Err(DecodeError::Interface(format!(
                "the weights are packed for {} device(s), the megakernel runs on {devices}",
                packed.len()
            )));
        }
        let call = CallSpec::from_json(&mk.lowered.call_json)?;
        let slots = Slots::of(mk.layout())?;
        let inputs = packed
            .into_iter()
            .map(|p| device_inputs(mk, &call, p))
            .collect::<Result<Vec<_>, _>>()?;
        for (cache, out) in [(slots.k_in, slots.k_out), (slots.v_in, slots.v_out)] {
            if !call.aliases.contains(&(cache, out)) {
                return Err(DecodeError::Interface(format!(
                    "input {cache} is not aliased to output {out}"
                )));
            }
        }
        let b = plan.dims.batch as usize;
        Ok(Decoder {
            engine,
            call,
            inputs,
            slots,
            vocab: plan.sharding.as_ref().map_or(plan.dims.vocab, |sh| sh.vocab),
            vocab_per_device: plan.dims.vocab as usize,
            batch: b,
            tokens_per_seq: plan.dims.tokens_per_seq as usize,
            chunk_cols: plan.layout.chunk_cols as usize,
            rows: plan.dims.rows as usize,
            layers: plan.layers,
            capacity: plan.dims.positions,
            lens: vec![0; b],
            elapsed: Duration::ZERO,
            runs: 0,
        })
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The devices each run runs on (1: the one-device megakernel).
    pub fn devices(&self) -> usize {
        self.inputs.len()
    }

    /// Tokens per sequence in one run (K).
    pub fn tokens_per_seq(&self) -> usize {
        self.tokens_per_seq
    }

    /// Whether the runs return the full logits (the kernel was planned with them).
    pub fn has_logits(&self) -> bool {
        self.slots.logits.is_some()
    }

    /// Next position of sequence `seq` (tokens fed so far).
    pub fn len(&self, seq: usize) -> usize {
        self.lens[seq]
    }

    /// Whether no token has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// Empty every sequence's cache (positions restart at 0; stale rows are never read).
    pub fn reset(&mut self) {
        self.lens.fill(0);
    }

    /// Roll sequence `seq` back to its first `len` positions (never forward): the rows of
    /// rejected draft tokens stay in the cache, past the position, where they are masked
    /// and overwritten by the next run.
    pub fn rewind(&mut self, seq: usize, len: usize) {
        self.lens[seq] = self.lens[seq].min(len);
    }

    /// Device `device`'s K and V caches as they are now (`[L, B, kv_heads, T, hp]` bf16: its
    /// KV heads).
    pub fn caches(&self, device: usize) -> (&HostArray, &HostArray) {
        (&self.inputs[device][self.slots.k_in], &self.inputs[device][self.slots.v_in])
    }

    /// One megakernel run: `tokens[b * K + k]` is fed to sequence `b` at its next position
    /// plus `k`; every sequence advances by K positions ([`Self::rewind`] takes rejected
    /// ones back). Returns each token row's greedy next id, maximum logit and (when the
    /// kernel has them) logits.
    pub fn step(&mut self, tokens: &[u32]) -> Result<Step, DecodeError> {
        let kt = self.tokens_per_seq;
        if tokens.len() != self.batch * kt {
            return Err(DecodeError::Batch {
                got: tokens.len(),
                batch: self.batch,
                tokens_per_seq: kt,
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| u64::from(t) >= self.vocab) {
            return Err(DecodeError::TokenOutOfRange { id: t, vocab: self.vocab });
        }
        for (seq, &len) in self.lens.iter().enumerate() {
            if (len + kt) as u64 > self.capacity {
                return Err(DecodeError::ContextFull {
                    seq,
                    pos: len + kt - 1,
                    capacity: self.capacity,
                });
            }
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = self.lens.iter().map(|&p| p as i32).collect();
        let s = self.slots;
        for inputs in &mut self.inputs {
            inputs[s.tokens] = HostArray::from_i32(&[tokens.len()], &ids);
            inputs[s.positions] = HostArray::from_i32(&[self.batch], &pos);
        }
        let t = Instant::now();
        let out = (self.engine)(&self.inputs, &self.call)?;
        self.elapsed += t.elapsed();
        self.runs += 1;
        if out.len() != self.inputs.len() {
            return Err(DecodeError::Interface(format!(
                "the run returned outputs of {} devices for {}",
                out.len(),
                self.inputs.len()
            )));
        }
        // Each device's logits slice, greedy ids and maxima; its caches carried over; the
        // first layer of each token row whose router logits were not finite on any device.
        let mut gathered = Vec::with_capacity(out.len());
        let mut router_non_finite: Vec<Option<usize>> = vec![None; tokens.len()];
        for (inputs, out) in self.inputs.iter_mut().zip(out) {
            if out.len() != self.call.outputs.len() {
                return Err(DecodeError::Interface(format!(
                    "the run returned {} arrays for {} call outputs",
                    out.len(),
                    self.call.outputs.len()
                )));
            }
            let (mut logits, mut next_ids, mut max_logits) = (None, Vec::new(), Vec::new());
            for (i, array) in out.into_iter().enumerate() {
                if Some(i) == s.logits {
                    logits = Some(array.to_f32());
                } else if i == s.next_ids {
                    next_ids = array.to_i32();
                } else if i == s.max_logits {
                    max_logits = array.to_f32();
                } else if i == s.router_non_finite {
                    // [rows, lanes]: lane l of row r is layer l's flag.
                    let status = array.to_f32();
                    let lanes = status.len() / self.rows;
                    for (r, first) in router_non_finite.iter_mut().enumerate() {
                        let bad = (0..self.layers).find(|&l| status[r * lanes + l] != 0.0);
                        *first = match (*first, bad) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                } else if i == s.k_out {
                    inputs[s.k_in] = array;
                } else if i == s.v_out {
                    inputs[s.v_in] = array;
                }
            }
            gathered.push((logits, next_ids, max_logits));
        }
        for l in &mut self.lens {
            *l += kt;
        }
        let (cw, rows, rows_used) = (self.chunk_cols, self.rows, tokens.len());
        // Row r's values sit at lane 0 of row r ([rows, 128]), the same on every device.
        let (_, ids0, max0) = &gathered[0];
        for (device, (_, ids, max)) in gathered.iter().enumerate().skip(1) {
            let same = |r: usize| {
                ids[r * 128] == ids0[r * 128]
                    && (max[r * 128].to_bits() == max0[r * 128].to_bits()
                        || (max[r * 128].is_nan() && max0[r * 128].is_nan()))
            };
            if let Some(row) = (0..rows_used).find(|&r| !same(r)) {
                let at = row * 128;
                return Err(DecodeError::DevicesDisagree {
                    run: self.runs,
                    devices: gathered.len(),
                    device,
                    row,
                    id: ids[at],
                    max: max[at],
                    id0: ids0[at],
                    max0: max0[at],
                });
            }
        }
        let ids = (0..rows_used).map(|r| ids0[r * 128] as u32).collect();
        let max_logits = (0..rows_used).map(|r| max0[r * 128]).collect();
        // Id v is device v / slice's local id v % slice, at [v' / cw, r, v' % cw] of its logits.
        let slices: Option<Vec<Vec<f32>>> =
            gathered.into_iter().map(|(logits, _, _)| logits).collect();
        let slice = self.vocab_per_device;
        let logits = slices.map(|slices| {
            (0..rows_used)
                .map(|r| {
                    (0..self.vocab as usize)
                        .map(|v| {
                            let (device, local) = (v / slice, v % slice);
                            slices[device][((local / cw) * rows + r) * cw + local % cw]
                        })
                        .collect()
                })
                .collect()
        });
        Ok(Step { ids, max_logits, logits, router_non_finite })
    }

    /// Batch 1: the prompt, then `steps` greedy decode steps; `steps[i].logits` (when the
    /// kernel returns logits) chose `generated_ids[i]` (the `--logits-out` layout of
    /// [`palladium_model::reference::Reference::generate`]). Starts from an empty cache.
    pub fn generate(&mut self, prompt: &[u32], steps: usize) -> Result<Generation, DecodeError> {
        self.generate_with(prompt, steps, &mut crate::speculate::NoDrafts, |_, _| {})
            .map(|(g, _)| g)
    }

    /// [`Self::generate`] with drafts from `drafter` verified K tokens per run
    /// (speculative decoding: the ids are greedy decoding's; only the number of runs
    /// changes), calling `progress(tokens done, tokens in all)` after every run (the CLI's
    /// progress bar). The prompt is fed K tokens per run (positions `0..`); each decode run
    /// feeds the last token and up to K - 1 drafts, accepts the longest prefix of drafts
    /// that agrees with the kernel's greedy ids, and rolls the cache back past it. Logits
    /// with a NaN or an infinity are an error naming the token or step
    /// ([`DecodeError::NonFinite`]).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        steps: usize,
        drafter: &mut dyn Drafter,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<(Generation, Speculation), DecodeError> {
        if self.batch != 1 {
            return Err(DecodeError::Batch {
                got: 1,
                batch: self.batch,
                tokens_per_seq: self.tokens_per_seq,
            });
        }
        let kt = self.tokens_per_seq;
        let (&last, first) = prompt.split_last().ok_or(DecodeError::EmptyPrompt)?;
        if let Some(&id) = prompt.iter().find(|&&t| u64::from(t) >= self.vocab) {
            return Err(DecodeError::TokenOutOfRange { id, vocab: self.vocab });
        }
        // The last run feeds the token before the last generated one, at position
        // prompt + steps - 2, and writes K positions from there.
        let need = (prompt.len() + steps.saturating_sub(1) + kt - 1) as u64;
        if need > self.capacity {
            return Err(DecodeError::ContextFull {
                seq: 0,
                pos: need as usize - 1,
                capacity: self.capacity,
            });
        }
        let total = prompt.len() + steps.saturating_sub(1);
        self.reset();
        // Prefill: all prompt tokens but the last, K per run (a short last run is padded
        // with its last token; the padding's cache rows are rolled back).
        for (c, chunk) in first.chunks(kt).enumerate() {
            let mut fed = chunk.to_vec();
            fed.resize(kt, chunk[chunk.len() - 1]);
            let step = self.step(&fed)?;
            for (k, &t) in chunk.iter().enumerate() {
                let i = c * kt + k;
                step.finite(k, || format!("prompt token {i} (id {t})"))?;
            }
            self.rewind(0, c * kt + chunk.len());
            progress(c * kt + chunk.len(), total);
        }
        let mut out = Generation {
            generated_ids: Vec::with_capacity(steps),
            steps: Vec::with_capacity(steps),
        };
        let mut spec = Speculation::default();
        let mut context = prompt.to_vec();
        // The token fed next (the cache holds every token before it).
        let mut pending = last;
        while out.generated_ids.len() < steps {
            // No draft past the last step: the run's greedy id after the last accepted
            // draft is generated too.
            let left = steps - out.generated_ids.len();
            let drafts = drafter.draft(&context, out.generated_ids.len(), (kt - 1).min(left - 1));
            let mut fed = vec![pending];
            fed.extend(&drafts);
            fed.resize(kt, pending);
            let start = self.lens[0];
            let step = self.step(&fed)?;
            let take = accepted(&drafts, &step.ids) + 1;
            for k in 0..take {
                step.finite(k, || format!("generated step {}", out.generated_ids.len()))?;
                let id = step.ids[k];
                out.generated_ids.push(id);
                context.push(id);
                if let Some(logits) = &step.logits {
                    out.steps.push(StepLogits { logits: logits[k].clone() });
                }
            }
            spec.record(drafts.len(), take - 1);
            pending = step.ids[take - 1];
            self.rewind(0, start + take);
            progress((start + take).min(total), total);
        }
        Ok((out, spec))
    }
}

/// One device's call inputs in the layout's order: the scalar prefetch (zeros until a run
/// sets them), its packed weights and its two empty KV caches, checked against the call.
fn device_inputs(
    mk: &Megakernel,
    call: &CallSpec,
    packed: Packed,
) -> Result<Vec<HostArray>, DecodeError> {
    let (layout, dims) = (mk.layout(), &mk.plan.dims);
    let (b, tokens) = (dims.batch as usize, dims.tokens as usize);
    let (k, v) = packed.empty_caches();
    // Every input array by the operand it fills, taken in the layout's order.
    let mut arrays: Vec<(OperandKind, HostArray)> =
        packed.operands.into_iter().zip(packed.arrays).collect();
    arrays.extend([(OperandKind::KCache, k), (OperandKind::VCache, v)]);
    let mut take = |kind: OperandKind| match kind {
        OperandKind::Tokens => Ok(HostArray::from_i32(&[tokens], &vec![0; tokens])),
        OperandKind::Positions => Ok(HostArray::from_i32(&[b], &vec![0; b])),
        kind => arrays.iter().position(|(k, _)| *k == kind).map(|i| arrays.remove(i).1).ok_or_else(
            || {
                DecodeError::Interface(format!(
                    "no array for the megakernel's input {}",
                    kind.name()
                ))
            },
        ),
    };
    let inputs = layout.inputs().map(|o| take(o.kind)).collect::<Result<Vec<_>, _>>()?;
    if let Some((kind, _)) = arrays.first() {
        return Err(DecodeError::Interface(format!(
            "a packed {} array the megakernel does not take",
            kind.name()
        )));
    }
    if inputs.len() != call.inputs.len() {
        return Err(DecodeError::Interface(format!(
            "{} arrays for {} call inputs",
            inputs.len(),
            call.inputs.len()
        )));
    }
    for ((i, (a, (dt, shape))), o) in
        inputs.iter().zip(&call.inputs).enumerate().zip(layout.inputs())
    {
        if a.dtype != *dt || &a.shape != shape {
            return Err(DecodeError::Interface(format!(
                "input {i} ({}): {}{:?}, the kernel takes {dt}{shape:?}",
                o.kind.name(),
                a.dtype,
                a.shape
            )));
        }
    }
    Ok(inputs)
}

/// `logits` all finite, or [`DecodeError::NonFinite`] naming `what` and the first bad one.
fn finite(logits: &[f32], what: impl FnOnce() -> String) -> Result<(), DecodeError> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(token) => Err(DecodeError::NonFinite {
            at: what(),
            what: format!("token {token}: {}", logits[token]),
        }),
    }
}
