//! Running prepared functions: one `match` per instruction, whole tiles per op.

use crate::devices::{Delivery, Link};
use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::gemm::{BLayout, Products, gemm_f32};
use crate::memory::{Memory, join};
use crate::prepare::{CBlock, Func, Instr, Kind, Precision, Program, RKind, Slot, Term};
use crate::value::{
    self, DType, Data, Shape, Tile, Val, gather, permute, round_slice, scatter, strides_of,
    walk_rows,
};
use smallvec::SmallVec;
use std::sync::Arc;

/// Loops that run longer than this are reported instead of hanging.
const MAX_WHILE_ITERATIONS: u64 = 50_000_000;

pub(crate) struct Machine<'p> {
    pub prog: &'p Program,
    pub mem: Memory,
    pub point: Vec<i64>,
    /// The other devices of a multi-device run.
    pub link: Option<Link>,
}

impl<'p> Machine<'p> {
    pub fn call(&mut self, f: &Func, args: Vec<Val>) -> Result<Vec<Val>> {
        let mut fr = vec![Val::Undef; f.nslots];
        if args.len() != f.body.args.len() {
            bail!(
                Malformed,
                "@{} called with {} arguments, expects {}",
                f.name,
                args.len(),
                f.body.args.len()
            );
        }
        for (s, a) in f.body.args.iter().zip(args) {
            fr[*s as usize] = a;
        }
        self.block(&f.body, &mut fr)?;
        Ok(match &f.body.term {
            Term::Yield(v) => v.iter().map(|s| fr[*s as usize].clone()).collect(),
            _ => Vec::new(),
        })
    }

    fn block(&mut self, b: &CBlock, fr: &mut [Val]) -> Result<()> {
        for ins in &b.instrs {
            if let Err(mut e) = self.instr(ins, fr) {
                if e.site.is_none() {
                    e.site = Some(self.prog.sites[ins.site as usize].clone());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn yielded(b: &CBlock, fr: &[Val]) -> Vec<Val> {
        match &b.term {
            Term::Yield(v) => v.iter().map(|s| fr[*s as usize].clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// The fabric, for an op that needs other devices.
    fn link(&self, what: &str) -> Result<Link> {
        match &self.link {
            Some(l) => Ok(l.clone()),
            None => bail!(
                Unsupported,
                "{what} needs the devices of a mesh: run the kernel with Program::run_devices"
            ),
        }
    }

    /// Let the other devices run (after a remote start or signal, or in a wait: `blocked`),
    /// then take in what they sent.
    pub fn hand_over(&mut self, link: &Link, blocked: Option<String>) -> Result<()> {
        let deliveries = link.fabric.hand_over(link.me, blocked, false)?;
        self.receive(deliveries)
    }

    fn wait_for_others(&mut self, why: String) -> Result<()> {
        let link = self.link("a wait on another device")?;
        self.hand_over(&link, Some(why))
    }

    /// Apply other devices' remote copies and signals to this device's memory.
    pub fn receive(&mut self, deliveries: Vec<Delivery>) -> Result<()> {
        for d in deliveries {
            let (buf, what) = match &d {
                Delivery::Dma { dst, started, .. } => {
                    (dst.buf, format!("a remote DMA ({started})"))
                }
                Delivery::Signal { sem, from, .. } => (sem.0, format!("a remote signal ({from})")),
            };
            if buf >= self.mem.bufs.len() {
                bail!(
                    DmaRace,
                    "{what} reached this device before it had allocated its target (it had not started the kernel): start with a barrier (signal every peer on the barrier semaphore, wait for their signals) before the first remote write"
                );
            }
            match d {
                Delivery::Dma { dst, data, sem, bytes, started } => {
                    self.mem.remote_receive(&dst, &data, sem, bytes, started)?
                }
                Delivery::Signal { sem, amount, from } => {
                    self.mem.remote_signal(sem, amount, &from)?
                }
            }
        }
        Ok(())
    }

    /// As [`Machine::site_text`], naming the kernel source line where the body has one (for
    /// what other devices report).
    fn source_text(&self, ins: &Instr) -> String {
        let s = &self.prog.sites[ins.site as usize];
        let Some(src) = &s.src else { return self.site_text(ins) };
        let g = if self.point.is_empty() {
            String::new()
        } else {
            format!(", grid point ({})", join(&self.point))
        };
        format!("`{}` at {src}{g}", s.name)
    }

    fn site_text(&self, ins: &Instr) -> String {
        let s = &self.prog.sites[ins.site as usize];
        let g = if self.point.is_empty() {
            String::new()
        } else {
            format!(", grid point ({})", join(&self.point))
        };
        format!("`{}` at line {} in @{}{g}", s.name, s.pos, s.func)
    }

    fn instr(&mut self, ins: &Instr, fr: &mut [Val]) -> Result<()> {
        let v = |s: &Slot| -> &Val { &fr[*s as usize] };
        let ints = |xs: &[Slot], fr: &[Val]| -> Result<Vec<i64>> {
            xs.iter().map(|s| fr[*s as usize].int()).collect()
        };
        let out: Val = match &ins.kind {
            Kind::Const(c) => c.clone(),
            Kind::Bin { op, dt, a, b } => value::binary(*op, *dt, v(a), v(b))?,
            Kind::Un { op, dt, a } => value::unary(*op, *dt, v(a))?,
            Kind::Cmp { float, pred, dt, a, b } => value::compare(*float, *pred, *dt, v(a), v(b))?,
            Kind::Select { c, t, f } => value::select(v(c), v(t), v(f))?,
            Kind::Cast { op, from, to, a } => value::cast(*op, *from, *to, v(a))?,
            Kind::Broadcast { a, dt, shape } => broadcast(v(a), *dt, shape)?,
            Kind::ShapeCast { a, shape } => {
                let t = v(a).tile()?;
                Val::Tile(Tile { dt: t.dt, shape: shape.clone(), data: t.data.clone() })
            }
            Kind::VLoad { base, idx, shape, dt, steps } => {
                let view = v(base).view()?.clone();
                let idx = ints(idx, fr)?;
                Val::Tile(self.mem.load(&view, &idx, shape, *dt, steps)?)
            }
            Kind::VStore { val, base, idx, mask, add, steps } => {
                let view = v(base).view()?.clone();
                let t = v(val).tile()?.clone();
                let m = match mask {
                    Some(m) => Some(v(m).tile()?.clone()),
                    None => None,
                };
                if let Some(m) = &m
                    && m.shape != t.shape
                {
                    bail!(
                        Mismatch,
                        "mask shape [{}] differs from value shape [{}]",
                        join(&m.shape),
                        join(&t.shape)
                    );
                }
                let idx = ints(idx, fr)?;
                self.mem.store(&view, &idx, &t, m.as_ref(), *add, steps)?;
                Val::Undef
            }
            Kind::MLoad { base, idx } => {
                let view = v(base).view()?.clone();
                let idx = ints(idx, fr)?;
                self.mem.load_scalar(&view, &idx)?
            }
            Kind::MStore { val, base, idx } => {
                let view = v(base).view()?.clone();
                let x = v(val).clone();
                let idx = ints(idx, fr)?;
                self.mem.store_scalar(&view, &idx, &x)?;
                Val::Undef
            }
            Kind::Reduce { kind, dt, a, acc, dims } => {
                reduce(*kind, *dt, v(a).tile()?, v(acc), dims)?
            }
            Kind::Extract { a, pos, dyn_pos } => {
                let t = v(a).tile()?;
                let mut dynv = ints(dyn_pos, fr)?.into_iter();
                let mut p = Vec::new();
                for &x in pos {
                    p.push(if x == i64::MIN { dynv.next().unwrap_or(0) } else { x });
                }
                extract(t, &p)?
            }
            Kind::ExtractSS { a, offsets, sizes, strides } => {
                extract_ss(v(a).tile()?, offsets, sizes, strides)?
            }
            Kind::Matmul { lhs, rhs, acc, dims, precision, out, shape } => matmul(
                v(lhs).tile()?,
                v(rhs).tile()?,
                v(acc).tile()?,
                dims,
                *precision,
                *out,
                shape,
            )?,
            Kind::Transpose { a, perm } => {
                let t = v(a).tile()?;
                if perm.len() != t.shape.len() {
                    bail!(Malformed, "permutation {perm:?} for a rank-{} vector", t.shape.len());
                }
                Val::Tile(permute(t, perm))
            }
            Kind::Iota { shape, dim } => {
                // Runs of `inner` equal values counting 0..shape[dim], repeated.
                let inner: usize = shape[*dim + 1..].iter().product();
                let outer: usize = shape[..*dim].iter().product();
                let mut data = Vec::with_capacity(outer * shape[*dim] * inner);
                for _ in 0..outer {
                    for i in 0..shape[*dim] {
                        data.extend(std::iter::repeat_n(i as i32, inner));
                    }
                }
                Val::Tile(Tile::new(DType::I32, shape.clone(), Data::I(data)))
            }
            Kind::Concat { xs, dim } => {
                let ts = xs
                    .iter()
                    .map(|s| fr[*s as usize].tile().cloned())
                    .collect::<Result<Vec<_>>>()?;
                concat(&ts, *dim)?
            }
            Kind::Log { tag, formatted, args } => {
                let values = ints(args, fr)?;
                println!("{}", log_line(tag, *formatted, &values));
                Val::Undef
            }
            Kind::Rotate { a, shift, dim } => rotate(v(a).tile()?, v(shift).int()?, *dim)?,
            Kind::ReduceIndex { a, dim, max } => reduce_index(v(a).tile()?, *dim, *max)?,
            Kind::Slice { base, offs, sizes } => {
                let view = v(base).view()?.clone();
                let offs = ints(offs, fr)?;
                Val::Ref(Arc::new(self.mem.slice(&view, &offs, sizes)?))
            }
            Kind::Squeeze { base, shape } => {
                let view = v(base).view()?.clone();
                Val::Ref(Arc::new(self.mem.squeeze(&view, shape)?))
            }
            Kind::Dma { src, dst, sem, remote: None } => {
                let (s, d, m) =
                    (v(src).view()?.clone(), v(dst).view()?.clone(), v(sem).view()?.clone());
                let started = self.site_text(ins);
                self.mem.dma_start(&s, &d, &m, started)?;
                Val::Undef
            }
            Kind::Dma { src, dst, sem, remote: Some((send, device)) } => {
                let (s, d, m, send, to) = (
                    v(src).view()?.clone(),
                    v(dst).view()?.clone(),
                    v(sem).view()?.clone(),
                    v(send).view()?.clone(),
                    v(device).int()?,
                );
                let link = self.link("a remote DMA")?;
                let started = format!("{} on device {}", self.source_text(ins), link.me);
                let recv = self.mem.sem(&m)?;
                let (data, bytes) = self.mem.remote_send(&s, &d, &send, started.clone())?;
                link.fabric.deliver(
                    link.me,
                    to,
                    Delivery::Dma { dst: (*d).clone(), data, sem: recv, bytes, started },
                )?;
                self.hand_over(&link, None)?;
                Val::Undef
            }
            Kind::DmaWait { sem, dst } => {
                let (m, d) = (v(sem).view()?.clone(), v(dst).view()?.clone());
                while !self.mem.dma_wait(&m, &d, self.link.is_some())? {
                    let why = format!(
                        "at {} for {} bytes on DMA semaphore {}",
                        self.source_text(ins),
                        d.elems() * self.mem.bufs[d.buf].dt.size(),
                        self.mem.sem_name(self.mem.sem(&m)?)
                    );
                    self.wait_for_others(why)?;
                }
                Val::Undef
            }
            Kind::SemSignal { sem, amount, device: None } => {
                let (m, a) = (v(sem).view()?.clone(), v(amount).int()?);
                self.mem.sem_signal(&m, a)?;
                Val::Undef
            }
            Kind::SemSignal { sem, amount, device: Some(device) } => {
                let (m, a, to) = (v(sem).view()?.clone(), v(amount).int()?, v(device).int()?);
                let link = self.link("a remote semaphore signal")?;
                let s = self.mem.sem(&m)?;
                let from = format!("{} on device {}", self.source_text(ins), link.me);
                link.fabric.deliver(link.me, to, Delivery::Signal { sem: s, amount: a, from })?;
                self.hand_over(&link, None)?;
                Val::Undef
            }
            Kind::SemWait { sem, amount } => {
                let (m, a) = (v(sem).view()?.clone(), v(amount).int()?);
                while !self.mem.sem_wait(&m, a, self.link.is_some())? {
                    let s = self.mem.sem(&m)?;
                    let why = format!(
                        "at {} for {a} on semaphore {} (value {})",
                        self.source_text(ins),
                        self.mem.sem_name(s),
                        self.mem.sem_value(s)
                    );
                    self.wait_for_others(why)?;
                }
                Val::Undef
            }
            Kind::DeviceId => Val::Int(self.link("tpu.device_id")?.me as i64),
            Kind::BarrierSemaphore => {
                let link = self.link("the barrier semaphore")?;
                Val::Ref(Arc::new(self.mem.whole(link.barrier)))
            }
            Kind::SemRead { sem } => {
                let m = v(sem).view()?.clone();
                let s = self.mem.sem(&m)?;
                Val::Int(self.mem.sem_value(s))
            }
            Kind::Alloca { dt, shape, space } => {
                let s = &self.prog.sites[ins.site as usize];
                let name =
                    format!("{}@{}", if dt.is_sem() { "sem_alloc" } else { "alloca" }, s.pos);
                let id = self.mem.alloc(*dt, shape, *space, name);
                Val::Ref(Arc::new(self.mem.whole(id)))
            }
            Kind::AssumeMultiple { a, m } => {
                let x = v(a).int()?;
                if *m != 0 && x % m != 0 {
                    bail!(
                        Misaligned,
                        "tpu.assume_multiple claims {x} is a multiple of {m}; on hardware the alignment would be wrong"
                    );
                }
                Val::Int(x)
            }
            Kind::Assert { c, msg } => {
                if v(c).int()? == 0 {
                    bail!(Undefined, "cf.assert failed: {msg}");
                }
                Val::Undef
            }
            Kind::IterationBound { dim } => {
                Val::Int(self.prog.grid.get(*dim).copied().unwrap_or(1))
            }
            Kind::Nop => Val::Undef,
            Kind::If { c, then, els } => {
                let b = if v(c).int()? != 0 { then } else { els };
                self.block(b, fr)?;
                let ys = Self::yielded(b, fr);
                return set_results(ins, fr, ys);
            }
            Kind::For { lb, ub, step, inits, body } => {
                let (lo, hi, st) = (v(lb).int()?, v(ub).int()?, v(step).int()?);
                if st <= 0 {
                    bail!(Undefined, "scf.for with step {st}");
                }
                let mut carried: Vec<Val> = inits.iter().map(|s| fr[*s as usize].clone()).collect();
                let mut i = lo;
                while i < hi {
                    fr[body.args[0] as usize] = Val::Int(i);
                    for (a, c) in body.args[1..].iter().zip(carried.drain(..)) {
                        fr[*a as usize] = c;
                    }
                    self.block(body, fr)?;
                    carried = Self::yielded(body, fr);
                    i += st;
                }
                return set_results(ins, fr, carried);
            }
            Kind::While { inits, before, after } => {
                let mut carried: Vec<Val> = inits.iter().map(|s| fr[*s as usize].clone()).collect();
                let mut n = 0u64;
                loop {
                    for (a, c) in before.args.iter().zip(carried.drain(..)) {
                        fr[*a as usize] = c;
                    }
                    self.block(before, fr)?;
                    let Term::Condition(c, args) = &before.term else {
                        bail!(Malformed, "scf.while without scf.condition")
                    };
                    let vals: Vec<Val> = args.iter().map(|s| fr[*s as usize].clone()).collect();
                    if fr[*c as usize].int()? == 0 {
                        return set_results(ins, fr, vals);
                    }
                    for (a, c) in after.args.iter().zip(vals) {
                        fr[*a as usize] = c;
                    }
                    self.block(after, fr)?;
                    carried = Self::yielded(after, fr);
                    n += 1;
                    if n > MAX_WHILE_ITERATIONS {
                        bail!(
                            Deadlock,
                            "scf.while did not terminate after {MAX_WHILE_ITERATIONS} iterations"
                        );
                    }
                }
            }
            Kind::Region { body } => {
                self.mem.push_scope();
                let r = self.block(body, fr);
                let ys = Self::yielded(body, fr);
                let end = self.mem.pop_scope();
                r?;
                end?;
                return set_results(ins, fr, ys);
            }
        };
        if let Some(&r) = ins.res.first() {
            fr[r as usize] = out;
        }
        Ok(())
    }
}

fn set_results(ins: &Instr, fr: &mut [Val], vals: Vec<Val>) -> Result<()> {
    if vals.len() < ins.res.len() {
        bail!(Malformed, "region yields {} values for {} results", vals.len(), ins.res.len());
    }
    for (r, x) in ins.res.iter().zip(vals) {
        fr[*r as usize] = x;
    }
    Ok(())
}

fn broadcast(a: &Val, dt: DType, shape: &Shape) -> Result<Val> {
    match a {
        Val::Tile(t) => {
            let pad = shape.len() - t.shape.len();
            let st = strides_of(&t.shape);
            let strides: SmallVec<[isize; 4]> = (0..shape.len())
                .map(|d| if d < pad || t.shape[d - pad] == 1 { 0 } else { st[d - pad] as isize })
                .collect();
            let data = match &*t.data {
                Data::F(v) => Data::F(gather(v, 0, &strides, shape)),
                Data::I(v) => Data::I(gather(v, 0, &strides, shape)),
            };
            Ok(Val::Tile(Tile::new(dt, shape.clone(), data)))
        }
        s @ (Val::Int(_) | Val::Float(_)) => Ok(Val::Tile(Tile::splat(dt, shape.clone(), s))),
        other => bail!(Mismatch, "cannot broadcast {}", other.kind()),
    }
}

fn extract(t: &Tile, pos: &[i64]) -> Result<Val> {
    if pos.len() > t.shape.len() {
        bail!(Malformed, "extract position {pos:?} for a rank-{} vector", t.shape.len());
    }
    let st = strides_of(&t.shape);
    let mut off = 0usize;
    for (d, &p) in pos.iter().enumerate() {
        if p < 0 || p as usize >= t.shape[d] {
            bail!(OutOfBounds, "extract position {pos:?} out of bounds of [{}]", join(&t.shape));
        }
        off += p as usize * st[d];
    }
    let rest: Shape = t.shape[pos.len()..].into();
    if rest.is_empty() {
        return Ok(t.get(off));
    }
    let n: usize = rest.iter().product();
    let data = match &*t.data {
        Data::F(v) => Data::F(v[off..off + n].to_vec()),
        Data::I(v) => Data::I(v[off..off + n].to_vec()),
    };
    Ok(Val::Tile(Tile::new(t.dt, rest, data)))
}

fn extract_ss(t: &Tile, offsets: &[usize], sizes: &[usize], strides: &[usize]) -> Result<Val> {
    let st = strides_of(&t.shape);
    let mut shape: Shape = t.shape.clone();
    let mut gs: SmallVec<[isize; 4]> = st.iter().map(|&s| s as isize).collect();
    let mut off = 0isize;
    for d in 0..offsets.len() {
        let step = strides.get(d).copied().unwrap_or(1);
        if offsets[d] + (sizes[d].max(1) - 1) * step >= t.shape[d] {
            bail!(
                OutOfBounds,
                "extract_strided_slice offsets {offsets:?} sizes {sizes:?} out of bounds of [{}]",
                join(&t.shape)
            );
        }
        off += (offsets[d] * st[d]) as isize;
        shape[d] = sizes[d];
        gs[d] *= step as isize;
    }
    let data = match &*t.data {
        Data::F(v) => Data::F(gather(v, off, &gs, &shape)),
        Data::I(v) => Data::I(gather(v, off, &gs, &shape)),
    };
    Ok(Val::Tile(Tile::new(t.dt, shape, data)))
}

fn concat(ts: &[Tile], dim: usize) -> Result<Val> {
    let Some(first) = ts.first() else { bail!(Malformed, "concatenate of nothing") };
    let mut shape = first.shape.clone();
    if dim >= shape.len() {
        bail!(Malformed, "concatenate along dim {dim} of rank {}", shape.len());
    }
    shape[dim] = ts.iter().map(|t| t.shape[dim]).sum();
    let st = strides_of(&shape);
    let ist: SmallVec<[isize; 4]> = st.iter().map(|&s| s as isize).collect();
    let n: usize = shape.iter().product();
    let mut data = Data::filled(first.dt, n, 0.0, 0);
    let mut at = 0usize;
    for t in ts {
        let off = (at * st[dim]) as isize;
        match (&mut data, &*t.data) {
            (Data::F(d), Data::F(s)) => scatter(d, off, &ist, &t.shape, s, None, false),
            (Data::I(d), Data::I(s)) => scatter(d, off, &ist, &t.shape, s, None, false),
            _ => bail!(Mismatch, "concatenate of different element kinds"),
        }
        at += t.shape[dim];
    }
    Ok(Val::Tile(Tile::new(first.dt, shape, data)))
}

/// A `tpu.log` line: `$k` in a formatted tag is scalar `k`; an unformatted tag is printed
/// followed by its values.
fn log_line(tag: &str, formatted: bool, values: &[i64]) -> String {
    if !formatted {
        return values.iter().fold(tag.to_string(), |s, v| format!("{s} {v}"));
    }
    let mut out = String::new();
    let mut rest = tag;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        match rest[at + 1..at + 1 + digits].parse::<usize>().ok().and_then(|k| values.get(k)) {
            Some(v) => out.push_str(&v.to_string()),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// `tpu.dynamic_rotate` (`jnp.roll`): element `i` along `dim` moves to `(i + shift) mod n`,
/// i.e. the last `shift` elements wrap to the front.
fn rotate(t: &Tile, shift: i64, dim: usize) -> Result<Val> {
    let n = t.shape[dim];
    let s = shift.rem_euclid(n as i64) as usize;
    if s == 0 {
        return Ok(Val::Tile(t.clone()));
    }
    let part = |from: usize, len: usize| -> Result<Tile> {
        let mut offsets = vec![0; t.shape.len()];
        offsets[dim] = from;
        let mut sizes = t.shape.to_vec();
        sizes[dim] = len;
        extract_ss(t, &offsets, &sizes, &[]).and_then(|v| v.tile().cloned())
    };
    concat(&[part(n - s, s)?, part(0, n - s)?], dim)
}

/// `tpu.reduce_index`: the i32 index of the max (min) along `dim`, the first on ties; a NaN
/// counts as the extreme (as `jnp.argmax`).
fn reduce_index(t: &Tile, dim: usize, max: bool) -> Result<Val> {
    let Data::F(x) = &*t.data else { bail!(Mismatch, "tpu.reduce_index of an integer vector") };
    let n = t.shape[dim];
    let inner: usize = t.shape[dim + 1..].iter().product();
    let outer: usize = t.shape[..dim].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * n + k) * inner + i];
            let mut best = 0;
            for k in 1..n {
                let (b, c) = (at(best), at(k));
                if b.is_nan() {
                    break;
                }
                if c.is_nan() || (max && c > b) || (!max && c < b) {
                    best = k;
                }
            }
            out.push(best as i32);
        }
    }
    let shape: Shape =
        t.shape.iter().enumerate().filter(|&(d, _)| d != dim).map(|(_, &s)| s).collect();
    if shape.is_empty() {
        return Ok(Val::Int(out[0].into()));
    }
    Ok(Val::Tile(Tile::new(DType::I32, shape, Data::I(out))))
}

/// Fold `src` (row-major over `shape`) into `out` at the positions `strides` map it to, in
/// `src`'s order. Generic over `f` so each reduction is its own loop: a row reduced into one
/// element (stride 0) is a plain fold, a row kept (stride 1) a zip the compiler vectorizes.
fn accumulate<T: Copy>(
    shape: &[usize],
    strides: &[isize],
    out: &mut [T],
    src: &[T],
    f: impl Fn(T, T) -> T,
) {
    let mut i = 0usize;
    walk_rows(shape, strides, 0, |o, len, s| {
        let row = &src[i..i + len];
        match s {
            0 => {
                let p = o as usize;
                out[p] = row.iter().fold(out[p], |a, &x| f(a, x));
            }
            1 => out[o as usize..o as usize + len]
                .iter_mut()
                .zip(row)
                .for_each(|(a, &x)| *a = f(*a, x)),
            _ => {
                for (j, &x) in row.iter().enumerate() {
                    let p = (o + j as isize * s) as usize;
                    out[p] = f(out[p], x);
                }
            }
        }
        i += len;
    });
}

fn reduce(kind: RKind, dt: DType, a: &Tile, acc: &Val, dims: &[usize]) -> Result<Val> {
    let rank = a.shape.len();
    if dims.iter().any(|&d| d >= rank) {
        bail!(Malformed, "reduction dims {dims:?} for a rank-{rank} vector");
    }
    let out_shape: Shape = (0..rank).filter(|d| !dims.contains(d)).map(|d| a.shape[d]).collect();
    let ost = strides_of(&out_shape);
    let mut k = 0;
    let strides: SmallVec<[isize; 4]> = (0..rank)
        .map(|d| {
            if dims.contains(&d) {
                0
            } else {
                let s = ost[k] as isize;
                k += 1;
                s
            }
        })
        .collect();
    let accv: Data = match acc {
        Val::Tile(t) => {
            if t.shape != out_shape {
                bail!(
                    Mismatch,
                    "reduction accumulator shape [{}], expected [{}]",
                    join(&t.shape),
                    join(&out_shape)
                );
            }
            (*t.data).clone()
        }
        Val::Float(f) => Data::F(vec![*f as f32]),
        Val::Int(i) => Data::I(vec![*i as i32]),
        other => bail!(Mismatch, "reduction accumulator is {}", other.kind()),
    };
    // Each reduction its own loop ([`accumulate`] is generic over it).
    macro_rules! fold {
        ($out:ident, $src:ident, $f:expr) => {
            accumulate(&a.shape, &strides, &mut $out, $src, $f)
        };
    }
    let data = match (accv, &*a.data) {
        (Data::F(mut out), Data::F(src)) => {
            match kind {
                RKind::Add => fold!(out, src, |x, y| x + y),
                RKind::Mul => fold!(out, src, |x, y| x * y),
                RKind::MaxF => fold!(out, src, |x, y| if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.max(y)
                }),
                RKind::MinF => fold!(out, src, |x, y| if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.min(y)
                }),
                RKind::MaxNumF => fold!(out, src, f32::max),
                RKind::MinNumF => fold!(out, src, f32::min),
                k => bail!(Malformed, "float reduction {k:?}"),
            }
            round_slice(dt, &mut out);
            Data::F(out)
        }
        (Data::I(mut out), Data::I(src)) => {
            match kind {
                RKind::Add => fold!(out, src, i32::wrapping_add),
                RKind::Mul => fold!(out, src, i32::wrapping_mul),
                RKind::MaxSI => fold!(out, src, i32::max),
                RKind::MinSI => fold!(out, src, i32::min),
                RKind::MaxUI => fold!(out, src, |x, y| (x as u32).max(y as u32) as i32),
                RKind::MinUI => fold!(out, src, |x, y| (x as u32).min(y as u32) as i32),
                RKind::And => fold!(out, src, |x, y| x & y),
                RKind::Or => fold!(out, src, |x, y| x | y),
                RKind::Xor => fold!(out, src, |x, y| x ^ y),
                k => bail!(Malformed, "integer reduction {k:?}"),
            }
            Data::I(out)
        }
        _ => bail!(Mismatch, "reduction of mixed element kinds"),
    };
    if out_shape.is_empty() {
        return Ok(Tile::new(dt, Shape::from_elem(1, 1), data).get(0));
    }
    Ok(Val::Tile(Tile::new(dt, out_shape, data)))
}

/// `tpu.matmul`: `acc + lhs · rhs` with Mosaic dimension numbers. Operands are brought to
/// `[batch, M, K]` and `[batch, K, N]`, multiplied with f32 (or i32) accumulation, and the
/// result permuted to `output_dim_order`.
fn matmul(
    lhs: &Tile,
    rhs: &Tile,
    acc: &Tile,
    d: &crate::parse::DotDims,
    precision: Precision,
    out: DType,
    shape: &Shape,
) -> Result<Val> {
    let u = |v: &[i64]| -> Vec<usize> { v.iter().map(|&x| x as usize).collect() };
    let (lb, lc, rb, rc) =
        (u(&d.lhs_batch), u(&d.lhs_contract), u(&d.rhs_batch), u(&d.rhs_contract));
    let free = |rank: usize, c: &[usize], b: &[usize]| -> Vec<usize> {
        (0..rank).filter(|x| !c.contains(x) && !b.contains(x)).collect()
    };
    let lf = free(lhs.shape.len(), &lc, &lb);
    let rf = free(rhs.shape.len(), &rc, &rb);
    let lperm: Vec<usize> = lb.iter().chain(&lf).chain(&lc).copied().collect();
    let rperm: Vec<usize> = rb.iter().chain(&rc).chain(&rf).copied().collect();
    let ident = |p: &[usize]| p.iter().enumerate().all(|(i, &x)| i == x);
    let lt = if ident(&lperm) { lhs.clone() } else { permute(lhs, &lperm) };
    // `[batch, N, K]` (free dims before contracted ones) is read as is: the kernel packs it.
    let rhs_nk: Vec<usize> = rb.iter().chain(&rf).chain(&rc).copied().collect();
    let (rt, layout) = if ident(&rperm) {
        (rhs.clone(), BLayout::RowMajor)
    } else if ident(&rhs_nk) {
        (rhs.clone(), BLayout::Transposed)
    } else {
        (permute(rhs, &rperm), BLayout::RowMajor)
    };
    let prod = |t: &Tile, ds: &[usize]| -> usize { ds.iter().map(|&x| t.shape[x]).product() };
    let (nb, m, k, n) = (prod(lhs, &lb), prod(lhs, &lf), prod(lhs, &lc), prod(rhs, &rf));
    let mut canon: Shape = lb.iter().map(|&x| lhs.shape[x]).collect();
    canon.extend(lf.iter().map(|&x| lhs.shape[x]));
    canon.extend(rf.iter().map(|&x| rhs.shape[x]));
    // Position of each output dim in the canonical (batch, lhs free, rhs free) order.
    let mut operm = Vec::new();
    for pair in d.output_dim_order.chunks(2) {
        let (opnd, dim) = (pair[0], pair[1] as usize);
        let p = if opnd == 0 {
            lb.iter()
                .position(|&x| x == dim)
                .or_else(|| lf.iter().position(|&x| x == dim).map(|p| lb.len() + p))
        } else {
            rb.iter()
                .position(|&x| x == dim)
                .or_else(|| rf.iter().position(|&x| x == dim).map(|p| lb.len() + lf.len() + p))
        };
        match p {
            Some(p) => operm.push(p),
            None => bail!(
                Malformed,
                "output_dim_order names operand {opnd} dim {dim}, which is contracted"
            ),
        }
    }
    // A bf16 lhs against quantized integer weights (`bf16 x i8/i4`): the weights enter the
    // MXU as their exact values, so the product is the float one on the widened weights.
    let widened;
    let rt_data = match (&*lt.data, &*rt.data) {
        (Data::F(_), Data::I(b)) => {
            widened = Data::F(b.iter().map(|&x| x as f32).collect());
            &widened
        }
        _ => &*rt.data,
    };
    let prod_data = match (&*lt.data, rt_data) {
        (Data::F(a), Data::F(b)) => {
            let round = precision == Precision::Bf16
                || (precision == Precision::Default
                    && (lhs.dt == DType::F32 || rhs.dt == DType::F32));
            let (a2, b2);
            let (a, b) = if round {
                (a2, b2) = (value::rounded(DType::Bf16, a), value::rounded(DType::Bf16, b));
                (&a2[..], &b2[..])
            } else {
                (&a[..], &b[..])
            };
            // Products of bf16/f16 values are exact in f32 (8 + 8 or up to 11 + 11 significand
            // bits, at most 24); bf16 pairs go through the pair rule (`gemm.rs`);
            // bf16 with i8, i4 or f8e4m3fn weights (exact code values) are exact products too.
            let bf16 = |dt: DType| round || dt == DType::Bf16;
            let short = |dt: DType| {
                bf16(dt) || matches!(dt, DType::F16 | DType::I8 | DType::I4 | DType::F8E4M3FN)
            };
            let products = if bf16(lhs.dt) && bf16(rhs.dt) {
                Products::Bf16Pairs
            } else if short(lhs.dt) && short(rhs.dt) {
                Products::Exact
            } else {
                Products::Rounded
            };
            let mut c = vec![0f32; nb * m * n];
            for bi in 0..nb {
                gemm_f32(
                    &a[bi * m * k..(bi + 1) * m * k],
                    &b[bi * k * n..(bi + 1) * k * n],
                    layout,
                    &mut c[bi * m * n..(bi + 1) * m * n],
                    m,
                    k,
                    n,
                    products,
                );
            }
            Data::F(c)
        }
        (Data::I(a), Data::I(b)) => {
            let mut c = vec![0i32; nb * m * n];
            for bi in 0..nb {
                let (a, b, c) = (&a[bi * m * k..], &b[bi * k * n..], &mut c[bi * m * n..]);
                for i in 0..m {
                    let (a, c) = (&a[i * k..(i + 1) * k], &mut c[i * n..(i + 1) * n]);
                    // Both orders walk `b` contiguously (the quantized megakernel's `x @ w.T`
                    // products are transposed); wrapping sums are order-independent.
                    match layout {
                        BLayout::RowMajor => {
                            for (kk, &x) in a.iter().enumerate() {
                                c.iter_mut()
                                    .zip(&b[kk * n..(kk + 1) * n])
                                    .for_each(|(c, &y)| *c = c.wrapping_add(x.wrapping_mul(y)));
                            }
                        }
                        BLayout::Transposed => {
                            for (j, c) in c.iter_mut().enumerate() {
                                *c = a
                                    .iter()
                                    .zip(&b[j * k..(j + 1) * k])
                                    .fold(0i32, |s, (&x, &y)| s.wrapping_add(x.wrapping_mul(y)));
                            }
                        }
                    }
                }
            }
            Data::I(c)
        }
        _ => bail!(Mismatch, "matmul of a float and an integer operand"),
    };
    let mut r = Tile::new(out, canon, prod_data);
    if !ident(&operm) {
        r = permute(&r, &operm);
    }
    if r.shape != *shape || acc.shape != *shape {
        bail!(
            Mismatch,
            "matmul result [{}] / accumulator [{}] do not match the result type [{}]",
            join(&r.shape),
            join(&acc.shape),
            join(shape)
        );
    }
    let mut data = Arc::try_unwrap(r.data).unwrap_or_else(|d| (*d).clone());
    match (&mut data, &*acc.data) {
        (Data::F(p), Data::F(q)) => {
            p.iter_mut().zip(q).for_each(|(x, y)| *x += y);
            round_slice(out, p);
        }
        (Data::I(p), Data::I(q)) => p.iter_mut().zip(q).for_each(|(x, y)| *x = x.wrapping_add(*y)),
        _ => bail!(Mismatch, "matmul accumulator of a different element kind"),
    }
    Ok(Val::Tile(Tile::new(out, shape.clone(), data)))
}

#[allow(dead_code)]
pub(crate) fn internal(m: &str) -> InterpError {
    InterpError::new(ErrorKind::Malformed, m.to_string())
}

#[cfg(test)]
mod tests {
    use super::{log_line, reduce};
    use crate::prepare::RKind;
    use crate::value::{DType, Data, Shape, Tile, Val};

    #[test]
    fn reductions_fold_each_output_in_the_order_of_the_source() {
        // Values whose f32 sums depend on the order (1e8 + 1 - 1e8), and NaN for the max.
        let shape: Shape = [3, 4, 5].into_iter().collect();
        let src: Vec<f32> = (0..60)
            .map(|i| match i % 7 {
                0 => 1e8,
                3 => -1e8,
                5 if i == 40 => f32::NAN,
                k => k as f32 * 0.37,
            })
            .collect();
        let t = Tile::new(DType::F32, shape.clone(), Data::F(src.clone()));
        for dims in [vec![2], vec![0], vec![1], vec![0, 2], vec![0, 1, 2]] {
            for (kind, f) in [
                (RKind::Add, (|a, b| a + b) as fn(f32, f32) -> f32),
                (
                    RKind::MaxF,
                    |a: f32, b: f32| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) },
                ),
            ] {
                let kept: Vec<usize> = (0..3).filter(|d| !dims.contains(d)).collect();
                let out_shape: Shape = kept.iter().map(|&d| shape[d]).collect();
                let n: usize = out_shape.iter().product();
                // Row-major over the source, each element folded into its output in turn.
                let mut want = vec![0.5f32; n];
                for (i, &x) in src.iter().enumerate() {
                    let idx = [i / 20, i / 5 % 4, i % 5];
                    let o = kept.iter().fold(0, |o, &d| o * shape[d] + idx[d]);
                    want[o] = f(want[o], x);
                }
                let acc = if n == 1 && kept.is_empty() {
                    Val::Float(0.5)
                } else {
                    Val::Tile(Tile::new(DType::F32, out_shape, Data::F(vec![0.5; n])))
                };
                let got: Vec<f32> = match reduce(kind, DType::F32, &t, &acc, &dims).unwrap() {
                    Val::Tile(r) => match &*r.data {
                        Data::F(v) => v.clone(),
                        Data::I(_) => panic!("floats"),
                    },
                    Val::Float(x) => vec![x as f32],
                    other => panic!("{}", other.kind()),
                };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kind:?} over {dims:?}");
            }
        }
    }

    #[test]
    fn log_lines_fill_placeholders_in_order() {
        assert_eq!(log_line("step $0 of $1: $0", true, &[3, 8]), "step 3 of 8: 3");
        assert_eq!(log_line("cost $5", true, &[1]), "cost $5");
        assert_eq!(log_line("done", false, &[]), "done");
        assert_eq!(log_line("values", false, &[4, -2]), "values 4 -2");
    }
}
