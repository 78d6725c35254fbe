//! Decoding with the megakernel in interpret mode: one decode step = one run of the
//! serialized body in [`palladium_interpret`] (or on a device: [`Engine`]), with the packed
//! weights ([`crate::pack`]),
//! the token and position of every sequence as scalar prefetch, and the KV caches carried
//! from one run to the next through the kernel's input/output aliases. Prefill feeds the
//! prompt one token per run at positions `0..`; greedy decode then feeds back the argmax.

use crate::pack::Packed;
use palladium_fusion::layout::{OperandKind, StreamLayout};
use palladium_fusion::megakernel::Megakernel;
use palladium_array::HostArray;
use palladium_interpret::{CallSpec, InterpError, Module, ParseError};
use palladium_model::reference::{Generation, StepLogits, argmax};
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
    #[error("sequence {seq}: position {pos} is past the KV cache ({capacity} positions; plan a larger --context)")]
    ContextFull { seq: usize, pos: usize, capacity: u64 },
    #[error("{got} tokens for a batch of {batch}")]
    Batch { got: usize, batch: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("{at}: the logits are not finite (token {token}: {value}); the weights or the kernel produce NaN or infinity")]
    NonFinite { at: String, token: usize, value: f32 },
    #[error("the device: {0}")]
    Device(String),
}

impl From<InterpError> for DecodeError {
    fn from(e: InterpError) -> Self {
        DecodeError::Interp(Box::new(e))
    }
}

/// What runs the megakernel once: its call's inputs to its outputs (the interpreter, or a
/// device).
pub type Engine = Box<dyn FnMut(&[HostArray], &CallSpec) -> Result<Vec<HostArray>, DecodeError>>;

/// Where the arrays a step feeds and reads sit in the call: input positions (prefetch
/// counted) and output positions, from the megakernel's layout.
#[derive(Clone, Copy, Debug)]
struct Slots {
    tokens: usize,
    positions: usize,
    k_in: usize,
    v_in: usize,
    logits: usize,
    k_out: usize,
    v_out: usize,
}

impl Slots {
    fn of(layout: &StreamLayout) -> Result<Slots, DecodeError> {
        let input = |kind: OperandKind| layout.inputs().position(|o| o.kind == kind).ok_or_else(|| DecodeError::Interface(format!("the megakernel has no input {}", kind.name())));
        let output = |kind: OperandKind| layout.outputs().position(|o| o.kind == kind).ok_or_else(|| DecodeError::Interface(format!("the megakernel has no output {}", kind.name())));
        Ok(Slots {
            tokens: input(OperandKind::Tokens)?,
            positions: input(OperandKind::Positions)?,
            k_in: input(OperandKind::KCache)?,
            v_in: input(OperandKind::VCache)?,
            logits: output(OperandKind::Logits)?,
            k_out: output(OperandKind::KCacheOut)?,
            v_out: output(OperandKind::VCacheOut)?,
        })
    }
}

/// A megakernel ready to run decode steps (on the CPU, or on the engine it was given), with
/// its KV caches.
pub struct Decoder {
    engine: Engine,
    call: CallSpec,
    /// The call's inputs (scalar prefetch, weights, caches), in the layout's order.
    inputs: Vec<HostArray>,
    slots: Slots,
    vocab: u64,
    batch: usize,
    chunk_cols: usize,
    rows: usize,
    capacity: u64,
    /// Next position of every sequence.
    lens: Vec<usize>,
    /// Time spent in the runs (the interpreter or the device).
    pub elapsed: Duration,
    pub runs: usize,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("batch", &self.batch).field("lens", &self.lens).finish_non_exhaustive()
    }
}

impl Decoder {
    /// The megakernel `mk` run in the interpreter; `packed`: its weights.
    pub fn new(mk: &Megakernel, packed: Packed) -> Result<Self, DecodeError> {
        let program = Module::parse(&mk.lowered.body)?.prepare()?;
        Decoder::with_engine(mk, packed, Box::new(move |inputs, call| Ok(program.run_with(inputs, call)?)))
    }

    /// [`Decoder::new`] with another engine for the runs (e.g. a TPU).
    pub fn with_engine(mk: &Megakernel, packed: Packed, engine: Engine) -> Result<Self, DecodeError> {
        let plan = &mk.plan;
        let layout = mk.layout();
        let call = CallSpec::from_json(&mk.lowered.call_json)?;
        let slots = Slots::of(layout)?;
        let (k, v) = packed.empty_caches();
        let b = plan.dims.batch as usize;
        // Every input array by the operand it fills, taken in the layout's order.
        let mut arrays: Vec<(OperandKind, HostArray)> = packed.operands.into_iter().zip(packed.arrays).collect();
        arrays.extend([(OperandKind::KCache, k), (OperandKind::VCache, v)]);
        let mut take = |kind: OperandKind| match kind {
            OperandKind::Tokens | OperandKind::Positions => Ok(HostArray::from_i32(&[b], &vec![0; b])),
            kind => arrays.iter().position(|(k, _)| *k == kind).map(|i| arrays.remove(i).1).ok_or_else(|| DecodeError::Interface(format!("no array for the megakernel's input {}", kind.name()))),
        };
        let inputs = layout.inputs().map(|o| take(o.kind)).collect::<Result<Vec<_>, _>>()?;
        if let Some((kind, _)) = arrays.first() {
            return Err(DecodeError::Interface(format!("a packed {} array the megakernel does not take", kind.name())));
        }
        if inputs.len() != call.inputs.len() {
            return Err(DecodeError::Interface(format!("{} arrays for {} call inputs", inputs.len(), call.inputs.len())));
        }
        for ((i, (a, (dt, shape))), o) in inputs.iter().zip(&call.inputs).enumerate().zip(layout.inputs()) {
            if a.dtype != *dt || &a.shape != shape {
                return Err(DecodeError::Interface(format!("input {i} ({}): {}{:?}, the kernel takes {dt}{shape:?}", o.kind.name(), a.dtype, a.shape)));
            }
        }
        for (cache, out) in [(slots.k_in, slots.k_out), (slots.v_in, slots.v_out)] {
            if !call.aliases.contains(&(cache, out)) {
                return Err(DecodeError::Interface(format!("input {cache} is not aliased to output {out}")));
            }
        }
        Ok(Decoder {
            engine,
            call,
            inputs,
            slots,
            vocab: plan.dims.vocab,
            batch: b,
            chunk_cols: plan.layout.chunk_cols as usize,
            rows: plan.dims.rows as usize,
            capacity: plan.dims.positions,
            lens: vec![0; b],
            elapsed: Duration::ZERO,
            runs: 0,
        })
    }

    pub fn batch(&self) -> usize {
        self.batch
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

    /// The K and V caches as they are now (`[L, B, kv_heads, T, hp]` bf16).
    pub fn caches(&self) -> (&HostArray, &HostArray) {
        (&self.inputs[self.slots.k_in], &self.inputs[self.slots.v_in])
    }

    /// One megakernel run: `tokens[b]` is fed to sequence `b` at its next position; returns
    /// every sequence's logits (`vocab` values).
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, DecodeError> {
        if tokens.len() != self.batch {
            return Err(DecodeError::Batch { got: tokens.len(), batch: self.batch });
        }
        for (seq, &t) in tokens.iter().enumerate() {
            if u64::from(t) >= self.vocab {
                return Err(DecodeError::TokenOutOfRange { id: t, vocab: self.vocab });
            }
            if self.lens[seq] as u64 >= self.capacity {
                return Err(DecodeError::ContextFull { seq, pos: self.lens[seq], capacity: self.capacity });
            }
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = self.lens.iter().map(|&p| p as i32).collect();
        let s = self.slots;
        self.inputs[s.tokens] = HostArray::from_i32(&[self.batch], &ids);
        self.inputs[s.positions] = HostArray::from_i32(&[self.batch], &pos);
        let t = Instant::now();
        let out = (self.engine)(&self.inputs, &self.call)?;
        self.elapsed += t.elapsed();
        self.runs += 1;
        if out.len() != self.call.outputs.len() {
            return Err(DecodeError::Interface(format!("the run returned {} arrays for {} call outputs", out.len(), self.call.outputs.len())));
        }
        let mut logits = Vec::new();
        for (i, array) in out.into_iter().enumerate() {
            if i == s.logits {
                logits = array.to_f32();
            } else if i == s.k_out {
                self.inputs[s.k_in] = array;
            } else if i == s.v_out {
                self.inputs[s.v_in] = array;
            }
        }
        for l in &mut self.lens {
            *l += 1;
        }
        let (cw, rows) = (self.chunk_cols, self.rows);
        Ok((0..self.batch)
            .map(|b| (0..self.vocab as usize).map(|v| logits[((v / cw) * rows + b) * cw + v % cw]).collect())
            .collect())
    }

    /// Batch 1: the prompt (one run per token, positions `0..`), then `steps` greedy decode
    /// steps; `steps[i].logits` chose `generated_ids[i]` (the `--logits-out` layout of
    /// [`palladium_model::reference::Reference::generate`]). Starts from an empty cache.
    pub fn generate(&mut self, prompt: &[u32], steps: usize) -> Result<Generation, DecodeError> {
        self.generate_with(prompt, steps, |_, _| {})
    }

    /// [`Self::generate`], calling `progress(runs done, runs in all)` after every run (the
    /// CLI's progress bar). Logits with a NaN or an infinity are an error naming the token
    /// or step ([`DecodeError::NonFinite`]).
    pub fn generate_with(&mut self, prompt: &[u32], steps: usize, mut progress: impl FnMut(usize, usize)) -> Result<Generation, DecodeError> {
        if self.batch != 1 {
            return Err(DecodeError::Batch { got: 1, batch: self.batch });
        }
        let (last, first) = prompt.split_last().ok_or(DecodeError::EmptyPrompt)?;
        if let Some(&id) = prompt.iter().find(|&&t| u64::from(t) >= self.vocab) {
            return Err(DecodeError::TokenOutOfRange { id, vocab: self.vocab });
        }
        let need = (prompt.len() + steps.saturating_sub(1)) as u64;
        if need > self.capacity {
            return Err(DecodeError::ContextFull { seq: 0, pos: need as usize - 1, capacity: self.capacity });
        }
        let runs = need as usize;
        self.reset();
        for (i, &t) in first.iter().enumerate() {
            let logits = self.step(&[t])?.remove(0);
            finite(&logits, || format!("prompt token {i} (id {t})"))?;
            progress(i + 1, runs);
        }
        let mut logits = self.step(&[*last])?.remove(0);
        progress(prompt.len(), runs);
        let mut out = Generation { generated_ids: Vec::with_capacity(steps), steps: Vec::with_capacity(steps) };
        for s in 0..steps {
            finite(&logits, || format!("generated step {s}"))?;
            let id = argmax(&logits) as u32;
            out.generated_ids.push(id);
            let next = if s + 1 < steps { Some(self.step(&[id])?.remove(0)) } else { None };
            out.steps.push(StepLogits { logits: std::mem::take(&mut logits) });
            if let Some(n) = next {
                logits = n;
                progress(prompt.len() + s + 1, runs);
            }
        }
        Ok(out)
    }
}

/// `logits` all finite, or [`DecodeError::NonFinite`] naming `what` and the first bad one.
fn finite(logits: &[f32], what: impl FnOnce() -> String) -> Result<(), DecodeError> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(token) => Err(DecodeError::NonFinite { at: what(), token, value: logits[token] }),
    }
}
