//! `palladium profile`: a discrete-event timeline model of an emitted kernel, run on the core
//! IR as the program would execute.
//!
//! - **Control flow** is evaluated: the grid point by point (Pallas's pipeline as
//!   [`palladium_array::pipeline`] models it: each windowed input's next block fetched during
//!   the current step when its block index changes, outputs written back when theirs does),
//!   `for` loops with their real trip counts, `if`s on known conditions. Integer scalars are
//!   evaluated ([`palladium_dsl::ir::ScalarOp`], which also evaluates the index maps) where
//!   their inputs are known: constants, grid indices, the scalar-prefetch arrays the caller gives
//!   ([`Inputs::prefetch`], e.g. the megakernel's positions) and SMEM written with known
//!   values. A loop bound that depends on anything else (data) is an error naming the loop;
//!   an `if` on such a condition is assumed taken, and the summary lists each assumption.
//! - **DMAs** are transfers on the DMA engines ([`dma`]): every HBM transfer in flight shares
//!   the device's HBM bandwidth fairly; a DMA semaphore counts the bytes of its completed
//!   transfers, and a wait stalls the core until its bytes have arrived. A stall is a
//!   bubble, attributed to the transfer that ended it.
//! - **Compute** is costed op by op ([`cost`]) with coefficients fitted to libtpu's
//!   estimates ([`calibration`]). Between two synchronisation points (a DMA start or wait,
//!   a loop iteration) the units work in parallel, as a VLIW bundle schedule packs them: the
//!   stretch takes its busiest unit's cycles.
//!
//! - **Several devices** (a kernel with a mesh: the library collectives, the megakernel
//!   with `--devices N`): device 0 is profiled, and by SPMD symmetry it stands for every
//!   device: each runs the same schedule, so the incoming copy of a hop lands when this
//!   device's own outgoing copy of it does, and a remote signal arrives here when this
//!   device's own signal lands there. A remote copy occupies one direction of the ICI link
//!   to its target (a port: one to each ring neighbour; with two devices both lead to the
//!   other one, and a copy takes the less busy), shared fairly by the copies on it, at the
//!   target table's hop figures ([`palladium_dsl::target::Ici::ring_hop`]: every hop at the
//!   ring's slowest link, since a ring advances at its slowest hop) plus the hop latency
//!   before the first byte. It does not take HBM bandwidth: every emitted collective copies
//!   VMEM to VMEM, and a remote copy that touches HBM is listed as an assumption.

pub mod calibration;
pub mod cost;
pub mod dma;
pub mod report;

use calibration::Coefficients;
use cost::{Unit, op_cost};
use dma::{Engine, Resource};
use indexmap::IndexMap;
use palladium_array::pipeline::{Pipeline, Role, Step};
use palladium_dsl::ir::{
    Block, CompiledIndexMap, Index, Kernel, Offset, Op, OpData, ScalarOp, Type, Value,
};
use palladium_dsl::spec::{Chip, OperandRole, PipelineMode};
use std::collections::HashMap;

/// Why a kernel could not be profiled.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no calibration for {chip} (calibrated: {calibrated}); {remedy}")]
    NotCalibrated { chip: String, calibrated: String, remedy: String },
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("cannot profile `{kernel}` at {at}: {why}")]
    Unsupported { kernel: String, at: String, why: String },
    #[error("scalar prefetch `{name}`: {why}")]
    Prefetch { name: String, why: String },
    #[error(
        "cannot profile `{kernel}`: the call runs past {bound} (at {at}); the model holds every event of one call in memory (about 5 KiB each with the reports): check the settings and the scalar-prefetch values that bound its loops"
    )]
    TooLarge { kernel: String, bound: String, at: String },
}

/// How much one profile may run and record. Loops run their real trip counts, so data
/// (scalar prefetch) could otherwise make one call run, or record, without end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Ops run.
    pub ops: u64,
    /// Timeline events recorded: DMAs, compute stretches, waits, sections.
    pub events: usize,
}

impl Bounds {
    /// 15 times the ops and 4 times the events of the largest realistic call measured
    /// (Qwen3-235B-A22B's megakernel on 8 devices, batch 16 x 4 tokens, 40960 positions,
    /// every KV tile: 11.6M ops, 460k events, 2.3 GB with the trace and SVG).
    pub const DEFAULT: Bounds = Bounds { ops: 200_000_000, events: 2_000_000 };
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds::DEFAULT
    }
}

/// What the program reads at run time that the model needs.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Contents of scalar-prefetch operands by name (row-major); one not given is unknown.
    pub prefetch: IndexMap<String, Vec<i64>>,
}

/// Busy time of the core on one stretch of compute between two synchronisation points.
#[derive(Clone, Debug)]
pub struct ComputeSpan {
    pub start: f64,
    pub end: f64,
    /// Cycles per unit ([`Unit::ALL`] order).
    pub units: [f64; 6],
    /// Where the first op of the stretch was traced.
    pub loc: String,
    pub context: String,
}

impl ComputeSpan {
    /// The unit with the most cycles.
    pub fn dominant(&self) -> Unit {
        let i = (0..6).max_by(|&a, &b| self.units[a].total_cmp(&self.units[b])).unwrap_or(0);
        Unit::ALL[i]
    }
}

/// One transfer.
#[derive(Clone, Debug)]
pub struct DmaEvent {
    pub src: String,
    pub dst: String,
    pub bytes: u64,
    pub resource: Resource,
    pub issued: f64,
    pub done: f64,
    /// Where it was started (`pipeline` for the grid's own block copies).
    pub loc: String,
    pub context: String,
}

impl DmaEvent {
    /// A remote copy or signal (on an ICI link): part of a collective.
    pub fn is_remote(&self) -> bool {
        matches!(self.resource, Resource::Link(_))
    }
}

/// A stall of the core on a DMA: a bubble.
#[derive(Clone, Debug)]
pub struct Wait {
    pub start: f64,
    pub end: f64,
    /// The transfer whose completion ended it (index into [`Timeline::dmas`]).
    pub dma: usize,
    pub loc: String,
    pub context: String,
}

/// One iteration of the outermost loop of the body (or one grid step): the SVG's sections.
#[derive(Clone, Debug)]
pub struct Section {
    pub start: f64,
    pub end: f64,
    pub label: String,
}

/// The ICI link model of a multi-device profile.
#[derive(Clone, Debug)]
pub struct Links {
    /// Devices in the call's mesh.
    pub devices: u64,
    /// Cycles from a remote copy's or signal's start to its first byte (or arrival).
    pub hop_latency_cycles: f64,
    /// Where the figures come from ([`palladium_dsl::target::RingHop::source`]).
    pub source: &'static str,
    /// The planner's modelled collective cycles per step, where the caller has a plan (the
    /// megakernel; `fusion/src/shard.rs`), for the summary to set beside the timeline's.
    pub planner_collective_cycles: Option<f64>,
}

/// The modeled execution of one kernel call.
#[derive(Clone, Debug)]
pub struct Timeline {
    pub kernel: String,
    pub chip: Chip,
    /// The link model where the kernel runs on several devices (device 0 profiled).
    pub links: Option<Links>,
    pub clock_hz: f64,
    pub hbm_bytes_per_cycle: f64,
    /// The call's cycles: until the last output DMA lands.
    pub cycles: f64,
    pub compute: Vec<ComputeSpan>,
    pub dmas: Vec<DmaEvent>,
    pub waits: Vec<Wait>,
    pub sections: Vec<Section>,
    /// Each assumption the model made, with how often.
    pub assumptions: IndexMap<String, u64>,
}

impl Timeline {
    pub fn hbm_bytes(&self) -> u64 {
        self.dmas.iter().filter(|d| d.resource == Resource::Hbm).map(|d| d.bytes).sum()
    }

    /// HBM bytes / (calibrated bandwidth x step time): 1.0 is the stream never pausing.
    pub fn hbm_efficiency(&self) -> f64 {
        self.hbm_bytes() as f64 / self.hbm_bytes_per_cycle / self.cycles
    }

    /// The HBM stream's own time: bytes / calibrated bandwidth.
    pub fn hbm_stream_cycles(&self) -> f64 {
        self.hbm_bytes() as f64 / self.hbm_bytes_per_cycle
    }

    /// Bytes this device sends over ICI links.
    pub fn ici_bytes(&self) -> u64 {
        self.dmas.iter().filter(|d| d.is_remote()).map(|d| d.bytes).sum()
    }

    /// Collective time: the cycles during which a remote copy or signal of this device is
    /// in flight (the union of their intervals from start to arrival, latency included).
    pub fn collective_cycles(&self) -> f64 {
        self.remote_cycles(|_| true)
    }

    /// As [`Timeline::collective_cycles`], over the remote transfers `keep` selects.
    pub fn remote_cycles(&self, keep: impl Fn(&DmaEvent) -> bool) -> f64 {
        let mut spans: Vec<(f64, f64)> = self
            .dmas
            .iter()
            .filter(|d| d.is_remote() && keep(d))
            .map(|d| (d.issued, d.done))
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut total, mut end) = (0.0, f64::NEG_INFINITY);
        for (a, b) in spans {
            if b > end {
                total += b - a.max(end);
                end = b;
            }
        }
        total
    }

    pub fn micros(&self, cycles: f64) -> f64 {
        cycles / self.clock_hz * 1e6
    }
}

/// Profile one call of `kernel` on `chip` with the coefficients `c`, within
/// [`Bounds::DEFAULT`].
pub fn simulate(
    kernel: &Kernel,
    chip: Chip,
    c: &Coefficients,
    inputs: &Inputs,
) -> Result<Timeline, ProfileError> {
    simulate_within(kernel, chip, c, inputs, Bounds::DEFAULT)
}

/// [`simulate`] within `bounds`: a call that runs or records more is refused
/// ([`ProfileError::TooLarge`]), naming where it was.
pub fn simulate_within(
    kernel: &Kernel,
    chip: Chip,
    c: &Coefficients,
    inputs: &Inputs,
    bounds: Bounds,
) -> Result<Timeline, ProfileError> {
    let mut w = Walker::new(kernel, chip, c);
    w.bounds = bounds;
    let links = w.links.as_ref().map(|l| Links {
        devices: l.0,
        hop_latency_cycles: l.1.hop_latency * w.target.clock_hz,
        source: l.1.source,
        planner_collective_cycles: None,
    });
    if let Some(l) = &links {
        w.assumptions.insert(
            format!(
                "SPMD symmetry: device 0 of {} profiled; every device runs the same schedule, so an incoming copy or signal lands when this device's own outgoing one does (every hop at the ring's slowest link)",
                l.devices
            ),
            1,
        );
    }
    w.bind_prefetch(inputs)?;
    w.run_grid()?;
    let cycles = w.now.max(w.engine.drain());
    for (ev, &id) in w.dmas.iter_mut().zip(&w.dma_ids) {
        ev.done = w.engine.transfers[id].done.unwrap_or(cycles);
    }
    Ok(Timeline {
        kernel: kernel.name.clone(),
        chip,
        links,
        clock_hz: chip.target().clock_hz,
        hbm_bytes_per_cycle: c.hbm_bytes_per_cycle,
        cycles,
        compute: w.compute,
        dmas: w.dmas,
        waits: w.waits,
        sections: w.sections,
        assumptions: w.assumptions,
    })
}

/// A ref value resolved to the buffer (or semaphore array) it names and the offsets into
/// it; `live` maps the ref's own dims to the root's.
struct RefLoc {
    root: Value,
    offsets: Vec<Option<i64>>,
    live: Vec<usize>,
}

#[derive(Default)]
struct SemState {
    /// Bytes (DMA semaphores) or signals (regular ones) available.
    count: f64,
    /// Transfers that will signal it, and what each adds (bytes or signals).
    pending: Vec<(usize, f64)>,
}

struct Walker<'k> {
    k: &'k Kernel,
    c: &'k Coefficients,
    target: &'static palladium_dsl::target::Target,
    now: f64,
    ints: HashMap<Value, i64>,
    grid_idx: Vec<i64>,
    prefetch: HashMap<Value, Vec<i64>>,
    /// The scalar-prefetch arrays' contents in operand order, as the index maps read them.
    tables: Vec<Option<Vec<i64>>>,
    smem: HashMap<(Value, i64), i64>,
    sems: HashMap<(Value, i64), SemState>,
    names: HashMap<Value, String>,
    engine: Engine,
    /// Enclosing traced loops: (loop, induction variable).
    loops: Vec<(Op, i64)>,
    open: Option<ComputeSpan>,
    compute: Vec<ComputeSpan>,
    dmas: Vec<DmaEvent>,
    dma_ids: Vec<usize>,
    /// Transfer id -> index in `dmas`.
    event_of: HashMap<usize, usize>,
    waits: Vec<Wait>,
    sections: Vec<Section>,
    assumptions: IndexMap<String, u64>,
    /// Index maps are evaluated without taking core time.
    silent: bool,
    /// The mesh's devices and the link figures of a hop, on several devices (this device
    /// is 0).
    links: Option<(u64, palladium_dsl::target::RingHop)>,
    /// Ops run so far, and the bounds on them and on the events.
    ops_run: u64,
    bounds: Bounds,
}

fn short_loc(k: &Kernel, op: Op) -> String {
    match k.ops[op].loc {
        Some(l) => format!("{}:{}", l.file.rsplit('/').next().unwrap_or(l.file), l.line),
        None => op.to_string(),
    }
}

impl<'k> Walker<'k> {
    fn new(k: &'k Kernel, chip: Chip, c: &'k Coefficients) -> Walker<'k> {
        let mut names = HashMap::new();
        for (_, b) in k.bufs.iter() {
            names.insert(b.value, b.name.clone());
        }
        for (_, s) in k.sems.iter() {
            names.insert(s.value, s.name.clone());
        }
        let target = chip.target();
        let devices = k.call.devices();
        let links = (devices > 1)
            .then(|| {
                target
                    .ici
                    .ring_hop(devices as u32, target.devices_per_chip(), 0)
                    .map(|hop| (devices, hop))
            })
            .flatten();
        Walker {
            k,
            c,
            target,
            now: 0.0,
            ints: HashMap::new(),
            grid_idx: vec![0; k.call.grid.len()],
            prefetch: HashMap::new(),
            tables: Vec::new(),
            smem: HashMap::new(),
            sems: HashMap::new(),
            names,
            engine: Engine::new(
                c.hbm_bytes_per_cycle,
                c.local_dma_bytes_per_cycle,
                c.dma_latency_cycles,
            ),
            loops: Vec::new(),
            open: None,
            compute: Vec::new(),
            dmas: Vec::new(),
            dma_ids: Vec::new(),
            event_of: HashMap::new(),
            waits: Vec::new(),
            sections: Vec::new(),
            assumptions: IndexMap::new(),
            silent: false,
            links,
            ops_run: 0,
            bounds: Bounds::DEFAULT,
        }
    }

    fn unsupported(&self, op: Option<Op>, why: impl Into<String>) -> ProfileError {
        let at = match op {
            Some(op) => match self.k.ops[op].loc {
                Some(l) => format!("{} ({l})", self.k.ops[op].data.mnemonic()),
                None => format!("{} ({op})", self.k.ops[op].data.mnemonic()),
            },
            None => "the call".into(),
        };
        ProfileError::Unsupported { kernel: self.k.name.clone(), at, why: why.into() }
    }

    fn context(&self) -> String {
        self.loops
            .iter()
            .map(|&(op, i)| format!("{}={i}", short_loc(self.k, op)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One more op, within [`Self::bounds`].
    fn within_bounds(&mut self, op: Op) -> Result<(), ProfileError> {
        self.ops_run += 1;
        let events = self.dmas.len() + self.compute.len() + self.waits.len() + self.sections.len();
        let bound = if self.ops_run > self.bounds.ops {
            format!("{} ops", self.bounds.ops)
        } else if events > self.bounds.events {
            format!("{} timeline events", self.bounds.events)
        } else {
            return Ok(());
        };
        let at = match self.context() {
            loops if loops.is_empty() => short_loc(self.k, op),
            loops => format!("{}, in {loops}", short_loc(self.k, op)),
        };
        Err(ProfileError::TooLarge { kernel: self.k.name.clone(), bound, at })
    }

    fn bind_prefetch(&mut self, inputs: &Inputs) -> Result<(), ProfileError> {
        let params = &self.k.blocks[self.k.entry].params;
        let first = self.k.call.grid.len();
        for (name, _) in &inputs.prefetch {
            if !self
                .k
                .call
                .operands
                .iter()
                .any(|o| o.role == OperandRole::Prefetch && &o.name == name)
            {
                return Err(ProfileError::Prefetch {
                    name: name.clone(),
                    why: format!("`{}` has no scalar-prefetch operand of that name", self.k.name),
                });
            }
        }
        // Prefetch operands come first in the call, so operand i is entry parameter
        // `grid + i` (and table i of the index maps).
        for (i, o) in
            self.k.call.operands.iter().enumerate().filter(|(_, o)| o.role == OperandRole::Prefetch)
        {
            self.tables.push(None);
            let Some(values) = inputs.prefetch.get(&o.name) else { continue };
            let want = o.shape.num_elements() as usize;
            if values.len() != want {
                return Err(ProfileError::Prefetch {
                    name: o.name.clone(),
                    why: format!("{} values given, the operand has {want}", values.len()),
                });
            }
            // Before any of them drives a loop or a DMA offset.
            o.check_values(values)
                .map_err(|why| ProfileError::Prefetch { name: o.name.clone(), why })?;
            self.prefetch.insert(params[first + i], values.clone());
            *self.tables.last_mut().expect("pushed above") = Some(values.clone());
        }
        Ok(())
    }

    // --- time ---------------------------------------------------------------------------

    fn spend(&mut self, op: Option<Op>, unit: Unit, cycles: f64) {
        if self.silent || cycles <= 0.0 {
            return;
        }
        if self.open.is_none() {
            let loc = op.map_or_else(|| "pipeline".to_string(), |op| short_loc(self.k, op));
            self.open = Some(ComputeSpan {
                start: self.now,
                end: self.now,
                units: [0.0; 6],
                loc,
                context: self.context(),
            });
        }
        let span = self.open.as_mut().expect("opened above");
        span.units[Unit::ALL.iter().position(|&u| u == unit).unwrap_or(0)] += cycles;
        // The units issue in parallel (VLIW bundles): a stretch takes its busiest unit's time.
        span.end = span.start + span.units.iter().copied().fold(0.0, f64::max);
        self.now = span.end;
    }

    fn flush(&mut self) {
        if let Some(s) = self.open.take() {
            self.compute.push(s);
        }
    }

    fn issue(
        &mut self,
        resource: Resource,
        bytes: u64,
        src: String,
        dst: String,
        loc: String,
    ) -> usize {
        self.flush();
        let id = self.engine.issue(self.now, resource, bytes as f64);
        self.record(id, resource, bytes, src, dst, loc);
        id
    }

    fn record(
        &mut self,
        id: usize,
        resource: Resource,
        bytes: u64,
        src: String,
        dst: String,
        loc: String,
    ) {
        self.event_of.insert(id, self.dmas.len());
        self.dmas.push(DmaEvent {
            src,
            dst,
            bytes,
            resource,
            issued: self.now,
            done: f64::NAN,
            loc,
            context: self.context(),
        });
        self.dma_ids.push(id);
    }

    /// Issue a remote copy (`bytes`) or signal (0 bytes) from this device (0) to device
    /// `to` on the port that leads there (see the crate doc): the less busy of the two when
    /// both ring neighbours are `to` (two devices), a route of its own for a device that is
    /// no neighbour. A copy to this device itself is an on-chip copy.
    fn issue_remote(
        &mut self,
        op: Op,
        to: i64,
        bytes: u64,
        src: String,
        dst: String,
    ) -> Result<usize, ProfileError> {
        let loc = short_loc(self.k, op);
        let n = self.k.call.devices() as i64;
        if !(0..n).contains(&to) {
            return Err(
                self.unsupported(Some(op), format!("targets device {to}; the mesh has {n}"))
            );
        }
        if to == 0 {
            return Ok(self.issue(Resource::Local, bytes, src, dst, loc));
        }
        let Some((devices, _)) = self.links else {
            return Err(self.unsupported(
                Some(op),
                format!(
                    "{} publishes no ICI link figure: its remote copies cannot be priced",
                    self.target.chip
                ),
            ));
        };
        let (right, left) = (1 % n, n - 1);
        let port = match (to == right, to == left) {
            (true, true) => u32::from(
                self.engine.in_flight(Resource::Link(1)) < self.engine.in_flight(Resource::Link(0)),
            ),
            (true, false) => 0,
            (false, true) => 1,
            _ => 2 + to as u32,
        };
        let hop = self
            .target
            .ici
            .ring_hop(devices as u32, self.target.devices_per_chip(), bytes)
            .expect("priced when the walker was made");
        self.flush();
        let clock = self.target.clock_hz;
        let id = self.engine.issue_at_rate(
            self.now,
            Resource::Link(port),
            bytes as f64,
            hop.bandwidth / clock,
            hop.hop_latency * clock,
        );
        self.record(id, Resource::Link(port), bytes, src, dst, loc);
        Ok(id)
    }

    /// Take `need` (bytes or signals) from semaphore `key`, stalling until transfers on it
    /// have brought them; a wait nothing in flight will satisfy is an error.
    fn acquire(
        &mut self,
        op: Op,
        key: (Value, i64),
        need: f64,
        sem: Value,
        what: &str,
    ) -> Result<(), ProfileError> {
        self.flush();
        self.engine.advance_to(self.now);
        loop {
            let st = self.sems.entry(key).or_default();
            let transfers = &self.engine.transfers;
            let (done, pending): (Vec<_>, Vec<_>) =
                st.pending.iter().copied().partition(|&(i, _)| transfers[i].done.is_some());
            st.count += done.iter().map(|&(_, n)| n).sum::<f64>();
            st.pending = pending;
            if st.count >= need - 0.5 {
                st.count -= need;
                return Ok(());
            }
            let ids: Vec<usize> = st.pending.iter().map(|&(i, _)| i).collect();
            if ids.is_empty() {
                let name = self.name(sem);
                return Err(self.unsupported(Some(op), format!("waits for {need} {what} on semaphore `{name}` with no {} in flight on it (the program would hang)", if what == "bytes" { "DMA" } else { "signal" })));
            }
            self.wait_for(&ids, short_loc(self.k, op));
        }
    }

    /// Stall until transfer `id` is done; a stall is recorded as a wait.
    fn wait_for(&mut self, ids: &[usize], loc: String) -> Option<usize> {
        self.flush();
        let (id, t) = self.engine.until_any(ids)?;
        if t > self.now {
            self.waits.push(Wait {
                start: self.now,
                end: t,
                dma: self.event_of[&id],
                loc,
                context: self.context(),
            });
            self.now = t;
        }
        Some(id)
    }

    // --- scalars and refs ----------------------------------------------------------------

    fn int(&self, v: Value) -> Option<i64> {
        self.ints.get(&v).copied()
    }

    fn set(&mut self, v: Value, x: Option<i64>) {
        match x {
            Some(x) => self.ints.insert(v, x),
            None => self.ints.remove(&v),
        };
    }

    fn locate(&self, v: Value) -> RefLoc {
        if let Some(op) = self.k.def_op(v)
            && let OpData::RefSlice { base, index } = &self.k.ops[op].data
        {
            return self.index_into(*base, index);
        }
        let rank = match self.k.ty(v) {
            Type::Ref(r) => r.shape.rank(),
            Type::Sem(_, s) => s.rank(),
            _ => 0,
        };
        RefLoc { root: v, offsets: vec![Some(0); rank], live: (0..rank).collect() }
    }

    fn index_into(&self, base: Value, index: &[Index]) -> RefLoc {
        let mut loc = self.locate(base);
        let mut live = Vec::new();
        for (d, idx) in index.iter().enumerate() {
            let Some(&rd) = loc.live.get(d) else { continue };
            let off = match idx.offset() {
                Offset::Static(s) => Some(s),
                Offset::Dynamic(v) => self.int(v),
            };
            loc.offsets[rd] = loc.offsets[rd].zip(off).map(|(a, b)| a + b);
            if matches!(idx, Index::Slice { .. }) {
                live.push(rd);
            }
        }
        live.extend(loc.live.iter().skip(index.len()));
        loc.live = live;
        loc
    }

    /// Row-major element index of `loc` in its root, if every offset is known.
    fn flat(&self, loc: &RefLoc) -> Option<i64> {
        let dims: Vec<u64> = match self.k.ty(loc.root) {
            Type::Ref(r) => r.shape.dims().to_vec(),
            Type::Sem(_, s) => s.dims().to_vec(),
            _ => vec![],
        };
        let mut flat = 0i64;
        for (d, o) in dims.iter().zip(&loc.offsets) {
            flat = flat * *d as i64 + (*o)?;
        }
        Some(flat)
    }

    fn sem_key(&self, op: Op, sem: Value) -> Result<(Value, i64), ProfileError> {
        let loc = self.locate(sem);
        let flat = self.flat(&loc).ok_or_else(|| {
            self.unsupported(Some(op), "the semaphore's index depends on run-time data")
        })?;
        Ok((loc.root, flat))
    }

    fn name(&self, v: Value) -> String {
        let root = self.locate(v).root;
        self.names.get(&root).cloned().unwrap_or_else(|| root.to_string())
    }

    fn ref_bytes(&self, v: Value) -> u64 {
        match self.k.ty(v) {
            Type::Ref(r) => r.bytes(),
            _ => 0,
        }
    }

    fn space_is_hbm(&self, v: Value) -> bool {
        matches!(self.k.ty(v), Type::Ref(r) if r.space.is_hbm_like())
    }

    // --- the program ---------------------------------------------------------------------

    /// The grid, step by step, as [`palladium_array::pipeline`] moves the windows: each
    /// input's next block is fetched during the current step (before the body runs; after it
    /// for a `Buffered(1)` window, which has no second buffer), an output's block is written
    /// back after the step it leaves. Block indices that depend on unknown prefetch contents
    /// (or on ops the index-map evaluator does not know) count as changed: the copy is made.
    fn run_grid(&mut self) -> Result<(), ProfileError> {
        let k = self.k;
        let grid: Vec<i64> = k.call.grid.iter().map(|g| g.extent as i64).collect();
        /// How a window's block index is known.
        enum Map {
            /// Whole-array operand: always block 0.
            Whole,
            Compiled(CompiledIndexMap),
            /// Not evaluable: every step moves the block.
            Unknown,
        }
        struct Window {
            operand: usize,
            role: Role,
            bytes: u64,
            synchronous: bool,
            map: Map,
        }
        let windows: Vec<Window> = k
            .call
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_windowed())
            .map(|(i, o)| Window {
                operand: i,
                role: if o.role == OperandRole::Input { Role::Input } else { Role::Output },
                bytes: (o.window_shape().num_elements() * u64::from(o.dtype.memory_bits()))
                    .div_ceil(8),
                synchronous: o.pipeline_mode == Some(PipelineMode::Buffered(1)),
                map: match o.index_map {
                    None => Map::Whole,
                    Some(map) => match CompiledIndexMap::compile(k, o, map) {
                        Ok(m) => Map::Compiled(m),
                        Err(_) => Map::Unknown,
                    },
                },
            })
            .collect();
        let mut pipeline = Pipeline::new(&grid, windows.iter().map(|w| w.role).collect());
        let steps = pipeline.steps_left();
        let tables = std::mem::take(&mut self.tables);
        let mut slots = Vec::new();
        let mut block_index = |i: usize, point: &[i64], b: &mut Option<Vec<i64>>| {
            let known = match &windows[i].map {
                Map::Whole => {
                    b.get_or_insert_with(Vec::new).clear();
                    true
                }
                Map::Compiled(m) => {
                    let idx = b.get_or_insert_with(Vec::new);
                    m.eval(point, &tables, &mut slots, idx).unwrap_or(false)
                }
                Map::Unknown => false,
            };
            if !known {
                *b = None;
            }
            Ok::<_, std::convert::Infallible>(())
        };
        let (mut step, mut next) = (Step::default(), Step::default());
        let Ok(mut more) = pipeline.next_step(&mut step, &mut block_index);
        let pipeline_loc = "pipeline".to_string();
        let mut fetch: Vec<Option<usize>> = vec![None; windows.len()];
        let mut writeback: Vec<Option<usize>> = vec![None; windows.len()];
        let fetch_into = |w: &mut Self, fetch: &mut [Option<usize>], i: usize| {
            let name = k.call.operands[windows[i].operand].name.clone();
            let id =
                w.issue(Resource::Hbm, windows[i].bytes, name, "window".into(), "pipeline".into());
            fetch[i] = Some(id);
        };
        // The first step's blocks are fetched before the grid starts.
        for c in step.changes.iter().filter(|c| c.role == Role::Input) {
            fetch_into(self, &mut fetch, c.operand);
        }
        let params = k.blocks[k.entry].params.clone();
        while more {
            let start = self.now;
            let Ok(has_next) = pipeline.next_step(&mut next, &mut block_index);
            // The next step's changes are what moves during this one.
            let moves: &[_] = if has_next { &next.changes } else { &[] };
            self.grid_idx.clone_from(&step.point);
            for (d, &x) in step.point.iter().enumerate() {
                self.ints.insert(params[d], x);
            }
            self.spend(None, Unit::Scalar, self.c.grid_step_cycles);
            for id in fetch.iter_mut().filter_map(Option::take) {
                self.wait_for(&[id], pipeline_loc.clone());
            }
            for c in moves.iter().filter(|c| c.role == Role::Input) {
                if !windows[c.operand].synchronous {
                    fetch_into(self, &mut fetch, c.operand);
                }
            }
            self.run_block(k.entry)?;
            // After the body, in window order: `Buffered(1)` fetches and the write-backs of
            // the output blocks this step leaves (every one after the last step).
            let mut moved = vec![false; windows.len()];
            for c in moves {
                moved[c.operand] = true;
            }
            if !has_next {
                for (i, _) in pipeline.finish() {
                    moved[i] = true;
                }
            }
            for (i, win) in windows.iter().enumerate().filter(|(i, _)| moved[*i]) {
                if win.role == Role::Input {
                    if win.synchronous {
                        fetch_into(self, &mut fetch, i);
                    }
                    continue;
                }
                if let Some(id) = writeback[i].take() {
                    self.wait_for(&[id], pipeline_loc.clone());
                }
                let name = k.call.operands[windows[i].operand].name.clone();
                writeback[i] = Some(self.issue(
                    Resource::Hbm,
                    windows[i].bytes,
                    "window".into(),
                    name,
                    pipeline_loc.clone(),
                ));
            }
            self.flush();
            if steps > 1 {
                let label = format!("step {}", step.index);
                self.sections.push(Section { start, end: self.now, label });
            }
            std::mem::swap(&mut step, &mut next);
            more = has_next;
        }
        for id in writeback.into_iter().flatten() {
            self.wait_for(&[id], pipeline_loc.clone());
        }
        self.flush();
        Ok(())
    }

    /// Run `b`'s ops; the values its `yield` hands back.
    fn run_block(&mut self, b: Block) -> Result<Vec<Option<i64>>, ProfileError> {
        for &op in &self.k.blocks[b].ops {
            if let OpData::Yield { values } = &self.k.ops[op].data {
                return Ok(values.iter().map(|&v| self.int(v)).collect());
            }
            self.within_bounds(op)?;
            self.op(op)?;
        }
        Ok(vec![])
    }

    fn bind_results(&mut self, op: Op, values: &[Option<i64>]) {
        for (i, &r) in self.k.ops[op].results.clone().iter().enumerate() {
            self.set(r, values.get(i).copied().flatten());
        }
    }

    fn op(&mut self, op: Op) -> Result<(), ProfileError> {
        let k = self.k;
        if let Some((unit, cycles)) = op_cost(k, op, self.c, self.target) {
            self.spend(Some(op), unit, cycles);
        }
        let result = k.ops[op].results.first().copied();
        let scalar_result = result.is_some_and(|r| matches!(k.ty(r), Type::Scalar(_)));
        // Integer scalars: THE scalar evaluator; a fault (a division by zero) is unknown.
        if let Some((sop, args)) = ScalarOp::of(k, op) {
            let mut values = [None; 3];
            for (v, &a) in values.iter_mut().zip(&args) {
                *v = self.int(a);
            }
            self.set(k.result(op), sop.apply(&values[..args.len()]).unwrap_or(None));
            return Ok(());
        }
        match &k.ops[op].data {
            OpData::ProgramId { axis } => {
                self.set(k.result(op), self.grid_idx.get(*axis as usize).copied())
            }
            OpData::NumPrograms { axis } => {
                self.set(k.result(op), k.call.grid.get(*axis as usize).map(|g| g.extent as i64))
            }
            OpData::Load { src, index } if scalar_result => {
                let loc = self.index_into(*src, index);
                let x = self.flat(&loc).and_then(|f| match self.prefetch.get(&loc.root) {
                    Some(values) => values.get(f as usize).copied(),
                    None => self.smem.get(&(loc.root, f)).copied(),
                });
                self.set(k.result(op), x);
            }
            OpData::Store { dst, index, value, .. } if matches!(k.ty(*value), Type::Scalar(_)) => {
                let loc = self.index_into(*dst, index);
                if let Some(f) = self.flat(&loc) {
                    match self.int(*value) {
                        Some(x) => self.smem.insert((loc.root, f), x),
                        None => self.smem.remove(&(loc.root, f)),
                    };
                }
            }
            OpData::DmaStart { src, dst, sem, remote: None, .. } => {
                let resource = if self.space_is_hbm(*src) || self.space_is_hbm(*dst) {
                    Resource::Hbm
                } else {
                    Resource::Local
                };
                let key = self.sem_key(op, *sem)?;
                let bytes = self.ref_bytes(*src);
                let id =
                    self.issue(resource, bytes, self.name(*src), self.name(*dst), short_loc(k, op));
                self.sems.entry(key).or_default().pending.push((id, bytes as f64));
            }
            OpData::DmaStart { src, dst, sem, remote: Some(remote), .. } => {
                let to = self.int(remote.device_id).ok_or_else(|| {
                    self.unsupported(Some(op), "the target device depends on run-time data")
                })?;
                if self.space_is_hbm(*src) || self.space_is_hbm(*dst) {
                    *self.assumptions.entry(format!("remote copy at {} touches HBM: its bytes are charged to the ICI link only, not to the HBM bandwidth", short_loc(k, op))).or_default() += 1;
                }
                // By symmetry the copy this device receives (on `sem`) lands when its own
                // outgoing copy has left (on the send semaphore): one transfer signals both.
                let (recv, send) = (self.sem_key(op, *sem)?, self.sem_key(op, remote.send_sem)?);
                let bytes = self.ref_bytes(*src);
                let id = self.issue_remote(
                    op,
                    to,
                    bytes,
                    self.name(*src),
                    format!("{} on device {to}", self.name(*dst)),
                )?;
                for key in [send, recv] {
                    self.sems.entry(key).or_default().pending.push((id, bytes as f64));
                }
            }
            OpData::DmaWait { dst, sem, .. } => {
                // Local, send and receive sides alike: `sem` counts the copy's bytes.
                let key = self.sem_key(op, *sem)?;
                self.acquire(op, key, self.ref_bytes(*dst) as f64, *sem, "bytes")?;
            }
            OpData::SemSignal { sem, amount, device_id } => {
                let key = self.sem_key(op, *sem)?;
                let n = self.int(*amount).ok_or_else(|| {
                    self.unsupported(Some(op), "the signal amount depends on run-time data")
                })? as f64;
                match device_id {
                    None => self.sems.entry(key).or_default().count += n,
                    Some(d) => {
                        // By symmetry this device receives the same signal when its own lands.
                        let to = self.int(*d).ok_or_else(|| {
                            self.unsupported(
                                Some(op),
                                "the signalled device depends on run-time data",
                            )
                        })?;
                        let id = self.issue_remote(
                            op,
                            to,
                            0,
                            format!("signal {}", self.name(*sem)),
                            format!("{} on device {to}", self.name(*sem)),
                        )?;
                        self.sems.entry(key).or_default().pending.push((id, n));
                    }
                }
            }
            OpData::SemWait { sem, amount } => {
                let key = self.sem_key(op, *sem)?;
                let n = self.int(*amount).ok_or_else(|| {
                    self.unsupported(Some(op), "the wait amount depends on run-time data")
                })? as f64;
                self.acquire(op, key, n, *sem, "signals")?;
            }
            // Device 0 of the mesh is profiled (see the crate doc).
            OpData::DeviceId => self.set(k.result(op), Some(0)),
            OpData::If { cond, then_block, else_block } => {
                let taken = match self.int(*cond) {
                    Some(c) => c != 0,
                    None => {
                        *self
                            .assumptions
                            .entry(format!(
                                "`if` at {} on run-time data: assumed taken",
                                short_loc(k, op)
                            ))
                            .or_default() += 1;
                        true
                    }
                };
                let values = self.run_block(if taken { *then_block } else { *else_block })?;
                self.bind_results(op, &values);
            }
            OpData::For { lower, upper, step, init, body } => {
                let bound = |v: Value, what: &str| {
                    self.int(v).ok_or_else(|| self.unsupported(Some(op), format!("the loop's {what} depends on run-time data; give it (e.g. the scalar-prefetch values) or use a static-bound variant")))
                };
                let (lo, hi, st) = (
                    bound(*lower, "lower bound")?,
                    bound(*upper, "upper bound")?,
                    bound(*step, "step")?,
                );
                if st <= 0 {
                    return Err(self.unsupported(Some(op), format!("loop step {st}")));
                }
                let params = k.blocks[*body].params.clone();
                let mut carried: Vec<Option<i64>> = init.iter().map(|&v| self.int(v)).collect();
                let outermost = self.loops.is_empty()
                    && k.call.grid.iter().map(|g| g.extent).product::<u64>() <= 1;
                let mut i = lo;
                while i < hi {
                    let start = self.now;
                    self.set(params[0], Some(i));
                    for (p, x) in params[1..].iter().zip(&carried) {
                        self.set(*p, *x);
                    }
                    self.loops.push((op, i));
                    let r = self.run_block(*body);
                    self.loops.pop();
                    carried = r?;
                    self.spend(Some(op), Unit::Scalar, self.c.scalar_cycles);
                    if outermost && !self.silent {
                        self.flush();
                        self.sections.push(Section {
                            start,
                            end: self.now,
                            label: format!("{} i={i}", short_loc(k, op)),
                        });
                    }
                    i += st;
                }
                self.bind_results(op, &carried);
            }
            OpData::While { init, cond, body } => {
                let mut carried: Vec<Option<i64>> = init.iter().map(|&v| self.int(v)).collect();
                loop {
                    for (p, x) in k.blocks[*cond].params.clone().iter().zip(&carried) {
                        self.set(*p, *x);
                    }
                    let c = self.run_block(*cond)?;
                    match c.first().copied().flatten() {
                        Some(0) => break,
                        Some(_) => {}
                        None => {
                            return Err(self.unsupported(
                                Some(op),
                                "the while loop's condition depends on run-time data",
                            ));
                        }
                    }
                    for (p, x) in k.blocks[*body].params.clone().iter().zip(&carried) {
                        self.set(*p, *x);
                    }
                    carried = self.run_block(*body)?;
                }
                self.bind_results(op, &carried);
            }
            OpData::RunScoped { body } => {
                let values = self.run_block(*body)?;
                self.bind_results(op, &values);
            }
            OpData::Alloc { .. } | OpData::SemAlloc { .. } => {
                let root = k.result(op);
                self.sems.retain(|key, _| key.0 != root);
                self.smem.retain(|key, _| key.0 != root);
            }
            _ => {
                if let Some(r) = result {
                    self.ints.remove(&r);
                }
            }
        }
        Ok(())
    }
}
