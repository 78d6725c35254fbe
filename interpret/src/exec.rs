//! Running prepared functions: each instruction through its family's rule
//! (`rules/<family>.rs`), whole tiles per op.

use crate::devices::{Delivery, Link};
use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::memory::{Memory, join};
use crate::prepare::{CBlock, Func, Instr, Program, Term};
use crate::rules::{Kind, constant, control, debug, dma, elementwise, matmul, memory, shape};
use crate::value::Val;

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

    pub(crate) fn block(&mut self, b: &CBlock, fr: &mut [Val]) -> Result<()> {
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

    pub(crate) fn yielded(b: &CBlock, fr: &[Val]) -> Vec<Val> {
        match &b.term {
            Term::Yield(v) => v.iter().map(|s| fr[*s as usize].clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// The fabric, for an op that needs other devices.
    pub(crate) fn link(&self, what: &str) -> Result<Link> {
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

    pub(crate) fn wait_for_others(&mut self, why: String) -> Result<()> {
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
    pub(crate) fn source_text(&self, ins: &Instr) -> String {
        let s = &self.prog.sites[ins.site as usize];
        let Some(src) = &s.src else { return self.site_text(ins) };
        let g = if self.point.is_empty() {
            String::new()
        } else {
            format!(", grid point ({})", join(&self.point))
        };
        format!("`{}` at {src}{g}", s.name)
    }

    pub(crate) fn site_text(&self, ins: &Instr) -> String {
        let s = &self.prog.sites[ins.site as usize];
        let g = if self.point.is_empty() {
            String::new()
        } else {
            format!(", grid point ({})", join(&self.point))
        };
        format!("`{}` at line {} in @{}{g}", s.name, s.pos, s.func)
    }

    fn instr(&mut self, ins: &Instr, fr: &mut [Val]) -> Result<()> {
        let out = match &ins.kind {
            Kind::Constant(k) => constant::exec(self, ins, k, fr)?,
            Kind::Elementwise(k) => elementwise::exec(self, ins, k, fr)?,
            Kind::Shape(k) => shape::exec(self, ins, k, fr)?,
            Kind::Matmul(k) => matmul::exec(self, ins, k, fr)?,
            Kind::Memory(k) => memory::exec(self, ins, k, fr)?,
            Kind::Dma(k) => dma::exec(self, ins, k, fr)?,
            Kind::Debug(k) => debug::exec(self, ins, k, fr)?,
            Kind::Control(k) => return control::exec(self, ins, k, fr),
        };
        if let Some(&r) = ins.res.first() {
            fr[r as usize] = out;
        }
        Ok(())
    }
}

#[allow(dead_code)]
pub(crate) fn internal(m: &str) -> InterpError {
    InterpError::new(ErrorKind::Malformed, m.to_string())
}
