//! The grid driver: what Mosaic's pipeline does around the kernel body. The grid is walked
//! as [`palladium_array::pipeline`] says (THE model of Pallas's pipeline, shared with the
//! profile and autotune): for every windowed operand the `transform_N` function gives the
//! block index; an input window is copied HBM→VMEM only when its block index changes, an
//! output window is written back when its block index is about to change (and at the end),
//! so a revisited output block stays resident across consecutive steps.

use crate::devices::{Fabric, Link};
use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::exec::Machine;
use crate::host::{CallSpec, from_data, interpreter_dtype, to_data};
use crate::memory::{Memory, Space, join};
use crate::prepare::{Program, memref_info};
use crate::value::{DType, Data, Val};
use crate::view::View;
use palladium_array::HostArray;
use palladium_array::pipeline::{GridOrder, Pipeline, Role, Step};
use rayon::prelude::*;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::Arc;

/// How one input/output operand reaches the kernel.
#[derive(Clone)]
struct Operand {
    /// The full array (HBM).
    hbm: usize,
    /// The window buffer and its shape, for windowed operands.
    window: Option<(usize, Vec<usize>)>,
    /// Element windows' per-dim `(before, after)` padding (the transform's results are
    /// element offsets into the padded array).
    element_pads: Option<Vec<(usize, usize)>>,
    transform: Option<usize>,
    is_output: bool,
    label: String,
}

fn with_point(mut e: InterpError, point: &[i64]) -> InterpError {
    if e.grid_point.is_none() && !point.is_empty() {
        e.grid_point = Some(point.to_vec());
    }
    e
}

impl Program {
    /// Run the kernel on `inputs` (scalar-prefetch arrays, then inputs, as in the call spec);
    /// returns the outputs in order. Output shapes are inferred (whole operands from their
    /// memref type; windowed ones from the largest block index the grid visits).
    pub fn run(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>> {
        self.run_impl(inputs, None)
    }

    /// [`Program::run`] with explicit output shapes and input/output aliases.
    pub fn run_with(&self, inputs: &[HostArray], spec: &CallSpec) -> Result<Vec<HostArray>> {
        self.run_impl(inputs, Some(spec))
    }

    /// Run a multi-device kernel on `inputs.len()` virtual devices of a mesh (device `d`
    /// gets `inputs[d]`, the call's per-device operands, and returns its outputs), as
    /// `jax.shard_map` runs a Pallas kernel: see the `devices` module. An error names the
    /// device (the lowest one whose error is not a consequence of another's).
    pub fn run_devices(
        &self,
        inputs: &[Vec<HostArray>],
        spec: Option<&CallSpec>,
    ) -> Result<Vec<Vec<HostArray>>> {
        let n = inputs.len();
        if n == 0 {
            bail!(BadInput, "a multi-device run needs at least one device's inputs");
        }
        let fabric = Arc::new(Fabric::new(n));
        let results: Vec<Result<Vec<HostArray>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = inputs
                .iter()
                .enumerate()
                .map(|(me, ins)| {
                    let fabric = fabric.clone();
                    scope.spawn(move || {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.run_device(ins, spec, &fabric, me)
                        }));
                        // Finished, failed or panicked: the others no longer wait for this device.
                        let _ = fabric.hand_over(me, None, true);
                        r.unwrap_or_else(|_| {
                            Err(InterpError::new(
                                ErrorKind::Malformed,
                                "the interpreter panicked on this device (a bug: please report it)",
                            ))
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(InterpError::new(
                            ErrorKind::Malformed,
                            "a device thread panicked (a bug: please report it)",
                        ))
                    })
                })
                .collect()
        });
        // A device's own error first; deadlocks are the others' consequence.
        let on_device = |d: usize, mut e: InterpError| {
            e.message = format!("device {d} of {n}: {}", e.message);
            e
        };
        let mut deadlock = None;
        let mut outputs = Vec::new();
        for (d, r) in results.into_iter().enumerate() {
            match r {
                Ok(o) => outputs.push(o),
                Err(e) if e.kind == ErrorKind::Deadlock => {
                    deadlock = deadlock.or(Some(on_device(d, e)))
                }
                Err(e) => return Err(on_device(d, e)),
            }
        }
        if let Some(e) = deadlock {
            return Err(e);
        }
        if let Some(late) = fabric.late_deliveries().first() {
            bail!(DmaRace, "{late}");
        }
        Ok(outputs)
    }

    /// One device of [`Program::run_devices`]: its turn first, its barrier semaphore, then
    /// the grid in order (a device's parallel grid runs on its own core, in order here).
    fn run_device(
        &self,
        inputs: &[HostArray],
        spec: Option<&CallSpec>,
        fabric: &Arc<Fabric>,
        me: usize,
    ) -> Result<Vec<HostArray>> {
        let first = fabric.wait_turn(me)?;
        let mut mem = Memory::default();
        let barrier = mem.alloc(DType::Sem, &[], Space::Semaphore, "barrier semaphore".into());
        let link = Link { fabric: fabric.clone(), me, barrier };
        let mut m = Machine { prog: self, mem, point: Vec::new(), link: Some(link) };
        m.receive(first)?;
        self.run_on(&mut m, inputs, spec)
    }

    fn transform(
        &self,
        m: &mut Machine<'_>,
        f: usize,
        point: &[i64],
        prefetch: &[Val],
    ) -> Result<Vec<i64>> {
        let func = &self.funcs[f];
        let mut args: Vec<Val> = point.iter().map(|&x| Val::Int(x)).collect();
        args.extend(prefetch.iter().cloned());
        let r = m.call(func, args).map_err(|e| with_point(e, point))?;
        r.iter().map(Val::int).collect::<Result<Vec<_>>>().map_err(|e| with_point(e, point))
    }

    /// `e` located at the last op of transform `f`: the kernel source line of the index map.
    fn at_transform(&self, mut e: InterpError, f: usize) -> InterpError {
        if e.site.is_none()
            && let Some(ins) = self.funcs[f].body.instrs.last()
        {
            e.site = Some(self.sites[ins.site as usize].clone());
        }
        e
    }

    fn run_impl(&self, inputs: &[HostArray], spec: Option<&CallSpec>) -> Result<Vec<HostArray>> {
        let mut m = Machine { prog: self, mem: Memory::default(), point: Vec::new(), link: None };
        self.run_on(&mut m, inputs, spec)
    }

    fn run_on(
        &self,
        m: &mut Machine<'_>,
        inputs: &[HostArray],
        spec: Option<&CallSpec>,
    ) -> Result<Vec<HostArray>> {
        let k = &self.kernel;
        let g = self.grid.len();
        let p = self.scalar_prefetch;
        let nargs = k.arg_types.len();
        let n_io = nargs - g - p - self.scratch;
        if inputs.len() < p || inputs.len() - p > n_io {
            bail!(
                BadInput,
                "@{} takes {p} scalar-prefetch arrays and at most {} inputs ({} operands incl. outputs), got {} arrays",
                k.name,
                n_io,
                n_io,
                inputs.len()
            );
        }
        let n_in = inputs.len() - p;
        let n_out = n_io - n_in;
        if let Some(s) = spec
            && (s.outputs.len() != n_out || s.inputs.len() != inputs.len())
        {
            bail!(
                BadInput,
                "call spec has {} inputs / {} outputs, the kernel call has {} / {n_out}",
                s.inputs.len(),
                s.outputs.len(),
                inputs.len()
            );
        }

        // Scalar prefetch: whole SMEM arrays.
        let mut prefetch = Vec::new();
        for (i, host) in inputs.iter().take(p).enumerate() {
            let t = &k.arg_types[g + i];
            let Some((shape, dt, _)) = memref_info(t) else {
                bail!(Malformed, "scalar prefetch {i} has type {t}")
            };
            let id = load_host(
                self,
                &mut m.mem,
                i,
                host,
                dt,
                Space::Smem,
                format!("scalar_prefetch{i}"),
            )?;
            if host.shape != shape.as_slice() {
                bail!(
                    BadInput,
                    "scalar prefetch {i}: shape {:?}, the kernel expects {t}",
                    host.shape
                );
            }
            prefetch.push(Val::Ref(Arc::new(m.mem.whole(id))));
        }

        // Inputs and outputs.
        let mut ops: Vec<Operand> = Vec::new();
        for j in 0..n_io {
            let t = &k.arg_types[g + p + j];
            let Some((wshape, dt, space)) = memref_info(t) else {
                bail!(Malformed, "operand {j} has type {t}")
            };
            let wp = self.windows.as_ref().map(|w| w[j].clone());
            let transform = wp.as_ref().and_then(|w| w.transform);
            if let Some(b) = wp.as_ref().and_then(|w| w.bounds.clone())
                && b != wshape.as_slice()
            {
                bail!(Malformed, "operand {j}: window_bounds {b:?} but the kernel argument is {t}");
            }
            let is_output = j >= n_in;
            let label = if is_output { format!("output{}", j - n_in) } else { format!("input{j}") };
            let hbm = if !is_output {
                let host = &inputs[p + j];
                let id = load_host(self, &mut m.mem, p + j, host, dt, Space::Hbm, label.clone())?;
                if transform.is_none() && host.shape != wshape.as_slice() {
                    bail!(
                        BadInput,
                        "{label}: shape {:?}, the kernel takes it whole as {t}",
                        host.shape
                    );
                }
                if transform.is_some() && host.shape.len() != wshape.len() {
                    bail!(
                        BadInput,
                        "{label}: rank-{} array for a rank-{} window {t}",
                        host.shape.len(),
                        wshape.len()
                    );
                }
                id
            } else {
                let o = j - n_in;
                let shape: Vec<usize> = match (spec, transform) {
                    (Some(s), _) => {
                        if interpreter_dtype(s.outputs[o].0) != Some(dt) {
                            bail!(
                                BadInput,
                                "{label}: call spec says {}, the kernel writes {dt}",
                                s.outputs[o].0
                            );
                        }
                        s.outputs[o].1.clone()
                    }
                    (None, None) => wshape.to_vec(),
                    (None, Some(f)) => {
                        let mut hi = vec![0i64; wshape.len()];
                        for pt in GridOrder::new(&self.grid) {
                            let idx = self.transform(m, f, &pt, &prefetch)?;
                            for (h, x) in hi.iter_mut().zip(&idx) {
                                *h = (*h).max(*x);
                            }
                        }
                        match wp.as_ref().and_then(|w| w.element_pads.as_ref()) {
                            Some(pads) => hi
                                .iter()
                                .zip(&wshape)
                                .zip(pads)
                                .map(|((h, w), (lo, _))| (*h as usize + w).saturating_sub(*lo))
                                .collect(),
                            None => {
                                hi.iter().zip(&wshape).map(|(h, w)| (*h as usize + 1) * w).collect()
                            }
                        }
                    }
                };
                let id = m.mem.alloc(dt, &shape, Space::Hbm, label.clone());
                if let Some(s) = spec
                    && let Some(&(a, _)) = s.aliases.iter().find(|(_, oo)| *oo == o)
                {
                    let Some(src) = inputs.get(a) else {
                        bail!(BadInput, "alias of operand {a}, which does not exist")
                    };
                    if src.shape != shape || interpreter_dtype(src.dtype) != Some(dt) {
                        bail!(BadInput, "{label} aliases operand {a} of a different type");
                    }
                    m.mem.replace(id, Arc::new(to_data(src)));
                }
                id
            };
            let windowed = match &self.windows {
                Some(_) => transform.is_some(),
                None => space != Space::Hbm,
            };
            let window = if windowed {
                let wid = m.mem.alloc(dt, &wshape, space, format!("{label}_window"));
                Some((wid, wshape.to_vec()))
            } else {
                if m.mem.bufs[hbm].shape.as_slice() != wshape.as_slice() {
                    bail!(
                        BadInput,
                        "{label}: array shape [{}] differs from the whole-array operand {t}",
                        join(&m.mem.bufs[hbm].shape)
                    );
                }
                None
            };
            let element_pads = wp.and_then(|w| w.element_pads);
            ops.push(Operand { hbm, window, element_pads, transform, is_output, label });
        }

        // Scratch (lives for the whole kernel).
        let mut scratch = Vec::new();
        for s in 0..self.scratch {
            let t = &k.arg_types[g + p + n_io + s];
            let Some((shape, dt, space)) = memref_info(t) else {
                bail!(Malformed, "scratch {s} has type {t}")
            };
            let id = m.mem.alloc(dt, &shape, space, format!("scratch{s}"));
            scratch.push(id);
        }

        let prefetch = &prefetch[..];
        let outer = self.parallel.iter().take_while(|&&p| p).count();
        let all_outputs_windowed = ops.iter().all(|o| !o.is_output || o.window.is_some());
        if outer > 0
            && all_outputs_windowed
            && m.link.is_none()
            && self.grid[..outer].iter().product::<i64>() > 1
        {
            self.walk_parallel(m, &ops, outer, prefetch, &scratch)?;
        } else {
            self.walk(m, &ops, &[], prefetch, &scratch, None)?;
        }
        let outputs = ops
            .iter()
            .filter(|o| o.is_output)
            .map(|o| {
                let data = m.mem.settled(o.hbm).clone();
                let b = &m.mem.bufs[o.hbm];
                from_data(b.dt, &b.shape, &data)
            })
            .collect();
        if let Some(link) = &m.link {
            let value = m.mem.sem_value((link.barrier, 0));
            if value != 0 {
                bail!(
                    Leak,
                    "the barrier semaphore is {value} at the end of the kernel: barrier signals and waits do not balance (each device must wait for as many signals as its peers send it)"
                );
            }
        }
        std::mem::take(&mut m.mem).recycle();
        outputs
    }

    /// Run the grid steps whose leading indices are `head` (all of them for an empty head)
    /// in order, moving the windows as the pipeline says, then write back the outputs still
    /// resident and check that every DMA was waited on and every scratch semaphore is back
    /// at zero. Write-backs go into the arrays, or into `record` (a task of a parallel grid).
    fn walk(
        &self,
        m: &mut Machine<'_>,
        ops: &[Operand],
        head: &[i64],
        prefetch: &[Val],
        scratch: &[usize],
        mut record: Option<&mut Vec<WriteBack>>,
    ) -> Result<()> {
        // The windowed operands, in operand order, are the pipeline's.
        let windowed: Vec<usize> = (0..ops.len()).filter(|&j| ops[j].window.is_some()).collect();
        let roles = windowed
            .iter()
            .map(|&j| if ops[j].is_output { Role::Output } else { Role::Input })
            .collect();
        let mut pipeline = Pipeline::within(&self.grid, head, roles);
        let mut step = Step::default();
        while pipeline.next_step(&mut step, |i, pt, at: &mut Vec<i64>| {
            let o = &ops[windowed[i]];
            m.point.clear();
            m.point.extend_from_slice(pt);
            match (&o.window, o.transform) {
                (_, Some(f)) => {
                    *at = self.transform(m, f, pt, prefetch)?;
                    block_in_bounds(&m.mem, o, at)
                        .map_err(|e| with_point(self.at_transform(e, f), pt))
                }
                (Some((_, w)), None) => {
                    at.clear();
                    at.resize(w.len(), 0);
                    Ok(())
                }
                (None, None) => unreachable!("only windowed operands are in the pipeline"),
            }
        })? {
            let pt = &step.point;
            m.point.clone_from(pt);
            for c in &step.changes {
                let j = windowed[c.operand];
                let o = &ops[j];
                if c.role == Role::Input {
                    window_copy(&mut m.mem, o, &c.block, true).map_err(|e| with_point(e, pt))?;
                    continue;
                }
                if let Some(old) = &c.left {
                    write_back(&mut m.mem, j, o, old, record.as_deref_mut())
                        .map_err(|e| with_point(e, pt))?;
                }
                if let Some((w, _)) = o.window {
                    m.mem
                        .check_access(&m.mem.whole(w), true, "fresh output window")
                        .map_err(|e| with_point(e, pt))?;
                    m.mem.fill_poison(w);
                }
                block_in_bounds(&m.mem, o, &c.block).map_err(|e| with_point(e, pt))?;
            }
            let mut args: Vec<Val> = pt.iter().map(|&x| Val::Int(x)).collect();
            args.extend(prefetch.iter().cloned());
            for o in ops.iter() {
                let buf = o.window.as_ref().map(|w| w.0).unwrap_or(o.hbm);
                args.push(Val::Ref(Arc::new(m.mem.whole(buf))));
            }
            for &s in scratch {
                args.push(Val::Ref(Arc::new(m.mem.whole(s))));
            }
            m.call(&self.kernel, args).map_err(|e| with_point(e, pt))?;
        }
        let last = std::mem::take(&mut m.point);
        for (i, old) in pipeline.finish() {
            let j = windowed[i];
            write_back(&mut m.mem, j, &ops[j], &old, record.as_deref_mut())?;
        }
        // Everything in flight must have been waited on; semaphores must be back at zero.
        let at = if record.is_some() {
            format!("the end of parallel grid point ({})", join(&last))
        } else {
            "the end of the kernel".to_string()
        };
        if let Some(d) = m.mem.dmas.first() {
            bail!(
                Leak,
                "DMA {} → {} (started by {}) is still in flight at {at}; it was never waited on",
                m.mem.describe(&d.src),
                m.mem.describe(&d.dst),
                d.started
            );
        }
        for &s in scratch {
            m.mem.check_released(s, &at)?;
        }
        Ok(())
    }

    /// The grid with `outer` leading `parallel` dims: each point of those dims runs its
    /// sub-grid (the remaining dims, in order) as one rayon task on its own copy of the
    /// windows and scratch (fresh poison, as on another core), reading the shared input
    /// arrays. Output blocks are recorded and written back in grid order afterwards, so the
    /// result does not depend on the thread count; two points writing the same output block,
    /// or a point writing an input, is reported as a [`ErrorKind::ParallelRace`].
    fn walk_parallel(
        &self,
        m: &mut Machine<'_>,
        ops: &[Operand],
        outer: usize,
        prefetch: &[Val],
        scratch: &[usize],
    ) -> Result<()> {
        let heads: Vec<Vec<i64>> = GridOrder::new(&self.grid[..outer]).collect();
        let base = &m.mem;
        let tasks: Vec<Result<Vec<WriteBack>>> = heads
            .par_iter()
            .map(|head| {
                let mut tm = Machine { prog: self, mem: base.clone(), point: Vec::new(), link: None };
                let mut record = Vec::new();
                self.walk(&mut tm, ops, head, prefetch, scratch, Some(&mut record))?;
                let wrote_input = ops.iter().find(|o| !o.is_output && !Arc::ptr_eq(&tm.mem.bufs[o.hbm].data, &base.bufs[o.hbm].data));
                tm.mem.recycle();
                if let Some(o) = wrote_input {
                    return Err(with_point(
                        InterpError::new(ErrorKind::ParallelRace, format!("writes {}, which every point of the parallel grid dimensions reads; mark the dimensions `arbitrary` or write an output", o.label)),
                        head,
                    ));
                }
                Ok(record)
            })
            .collect();
        let mut owner: HashMap<(usize, Vec<i64>), &[i64]> = HashMap::new();
        for (head, task) in heads.iter().zip(tasks) {
            for wb in task? {
                let o = &ops[wb.operand];
                if let Some(first) = owner.insert((wb.operand, wb.block.clone()), head)
                    && first != head.as_slice()
                {
                    return Err(with_point(
                        InterpError::new(
                            ErrorKind::ParallelRace,
                            format!(
                                "writes block ({}) of {}, which grid point ({}) also writes, along `parallel` grid dimensions: the result would depend on which runs last; mark the dimension `arbitrary`",
                                join(&wb.block),
                                o.label,
                                join(first)
                            ),
                        ),
                        head,
                    ));
                }
                let (w, _) = o.window.as_ref().expect("outputs of a parallel grid are windowed");
                m.mem.replace(*w, wb.window);
                window_copy(&mut m.mem, o, &wb.block, false)?;
            }
        }
        Ok(())
    }
}

/// An output block a task of a parallel grid finished: the window's contents.
struct WriteBack {
    operand: usize,
    block: Vec<i64>,
    window: Arc<Data>,
}

/// Write output window `o` back as `block`: into the array, or (`record`) into the list.
fn write_back(
    mem: &mut Memory,
    operand: usize,
    o: &Operand,
    block: &[i64],
    record: Option<&mut Vec<WriteBack>>,
) -> Result<()> {
    let Some(r) = record else { return window_copy(mem, o, block, false) };
    let Some((w, _)) = &o.window else { return Ok(()) };
    block_in_bounds(mem, o, block)?;
    mem.check_access(
        &mem.whole(*w),
        false,
        &format!("write-back of {} block ({}) from", o.label, join(block)),
    )?;
    r.push(WriteBack { operand, block: block.to_vec(), window: mem.settled(*w).clone() });
    Ok(())
}

/// Input `position` of the call as a buffer (widened once for as long as its bytes stay the
/// same: [`crate::host::WidenedInputs`]).
fn load_host(
    prog: &Program,
    mem: &mut Memory,
    position: usize,
    host: &HostArray,
    dt: DType,
    space: Space,
    name: String,
) -> Result<usize> {
    if let Err(e) = host.validate() {
        bail!(BadInput, "{name}: {e}");
    }
    if interpreter_dtype(host.dtype) != Some(dt) {
        bail!(BadInput, "{name}: got a {} array, the kernel expects {dt}", host.dtype);
    }
    Ok(mem.adopt(dt, &host.shape, space, name, prog.widened.get(position, host)))
}

/// The window's first element along each dim in array coordinates (negative or past the end
/// in an element window's padding), or an error if the block is out of bounds: a block index
/// must be non-negative with at least one element inside the array (Pallas's rule for partial
/// blocks); an element window must lie inside the padded array.
fn window_start(mem: &Memory, o: &Operand, block: &[i64]) -> Result<Vec<i64>> {
    let Some((_, w)) = &o.window else { return Ok(Vec::new()) };
    let shape = &mem.bufs[o.hbm].shape;
    let mut start = Vec::with_capacity(w.len());
    for d in 0..w.len() {
        let (n, size) = (shape[d] as i64, w[d] as i64);
        let (s, inside) = match &o.element_pads {
            Some(pads) => {
                let (lo, hi) = (pads[d].0 as i64, pads[d].1 as i64);
                (block[d] - lo, block[d] >= 0 && block[d] + size <= n + lo + hi)
            }
            None => (block[d] * size, block[d] >= 0 && block[d] * size < n),
        };
        if !inside {
            let what = match &o.element_pads {
                Some(pads) => format!(
                    "element window at ({}) of {} (window [{}], padding {pads:?})",
                    join(block),
                    o.label,
                    join(w)
                ),
                None => {
                    format!("block index ({}) of {} (window [{}])", join(block), o.label, join(w))
                }
            };
            return Err(InterpError::new(
                ErrorKind::OutOfBounds,
                format!("{what} is outside the array [{}]", join(shape)),
            ));
        }
        start.push(s);
    }
    Ok(start)
}

fn block_in_bounds(mem: &Memory, o: &Operand, block: &[i64]) -> Result<()> {
    window_start(mem, o, block).map(drop)
}

/// Copy a block between the array and the window: `into_window` (input copy-in, the part
/// outside the array is poison) or back (output write-back, clipped to the array).
fn window_copy(mem: &mut Memory, o: &Operand, block: &[i64], into_window: bool) -> Result<()> {
    let Some((w, wshape)) = &o.window else { return Ok(()) };
    let first = window_start(mem, o, block)?;
    let shape = mem.bufs[o.hbm].shape.clone();
    // The part of the window inside the array: from `start` in the array, `skip` in the window.
    let mut start: SmallVec<[usize; 4]> = SmallVec::new();
    let mut skip: SmallVec<[usize; 4]> = SmallVec::new();
    let mut size: SmallVec<[usize; 4]> = SmallVec::new();
    for d in 0..wshape.len() {
        let n = shape[d] as i64;
        let lo = first[d].clamp(0, n);
        let hi = (first[d] + wshape[d] as i64).min(n).max(lo);
        start.push(lo as usize);
        skip.push(if hi > lo { (lo - first[d]) as usize } else { 0 });
        size.push((hi - lo) as usize);
    }
    let rank = wshape.len() as u8;
    let arr = View { buf: o.hbm, start, size: size.clone(), dims: (0..rank).collect() };
    let win = View { buf: *w, start: skip, size, dims: (0..rank).collect() };
    if into_window {
        mem.check_access(
            &mem.whole(*w),
            true,
            &format!("copy-in of {} block ({}) into", o.label, join(block)),
        )?;
        if win.size.as_slice() != wshape.as_slice() {
            mem.fill_poison(*w);
        }
        mem.copy(&arr, &win)
    } else {
        mem.check_access(
            &win,
            false,
            &format!("write-back of {} block ({}) from", o.label, join(block)),
        )?;
        mem.copy(&win, &arr)
    }
}
