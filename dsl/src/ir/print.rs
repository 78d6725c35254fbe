//! The deterministic text form of a kernel.
//!
//! Values are printed by id and ids are allocated in trace order, so the same kernel source
//! always prints byte-identically; snapshot tests rely on that. Source locations are off by
//! default so that editing a kernel file does not churn every snapshot.

use super::{Block, BufOrigin, Index, Kernel, Op, OpData, Value, WaitSide};
use crate::spec::{OperandRole, ScratchSpec};
use std::fmt::Write;

#[derive(Copy, Clone, Debug, Default)]
pub struct PrintOptions {
    /// Append `; file:line:col` to every op that has a location.
    pub locations: bool,
}

/// Print `kernel` as text.
pub fn print_kernel(kernel: &Kernel, options: PrintOptions) -> String {
    let mut p = Printer { k: kernel, out: String::new(), options };
    p.kernel();
    p.out
}

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
    options: PrintOptions,
}

impl Printer<'_> {
    fn kernel(&mut self) {
        let k = self.k;
        let c = &k.call;
        let _ = writeln!(self.out, "kernel @{}", k.name);
        if !c.grid.is_empty() {
            let dims: Vec<String> =
                c.grid.iter().map(|g| format!("{} {}", g.extent, g.semantics.name())).collect();
            let _ = writeln!(self.out, "  grid [{}]", dims.join(", "));
        }
        for o in &c.operands {
            let role = match o.role {
                OperandRole::Prefetch => "prefetch",
                OperandRole::Input => "in",
                OperandRole::Output => "out",
            };
            let _ = write!(self.out, "  {role} {}: {}{} {}", o.name, o.dtype, o.shape, o.space);
            if let Some(block) = &o.block {
                let dims: Vec<String> = block.iter().map(|d| d.to_string()).collect();
                let _ = write!(self.out, " block [{}]", dims.join(","));
            }
            if let Some(m) = o.index_map {
                let _ = write!(self.out, " map {m}");
            }
            if let Some(mode) = o.pipeline_mode {
                let _ = write!(self.out, " pipeline_mode {mode}");
            }
            self.out.push('\n');
        }
        for s in &c.scratch {
            let _ = match s {
                ScratchSpec::Buffer { name, space, dtype, shape } => {
                    writeln!(self.out, "  scratch {name}: {dtype}{shape} {space}")
                }
                ScratchSpec::Semaphore { name, kind, shape } => {
                    writeln!(self.out, "  scratch {name}: {kind}{shape}")
                }
            };
        }
        for (i, o) in &c.aliases {
            let _ = writeln!(self.out, "  alias in{i} -> out{o}");
        }
        if let Some(mesh) = &c.mesh {
            let _ = writeln!(self.out, "  mesh {mesh}");
        }
        if let Some(id) = c.collective_id {
            let _ = writeln!(self.out, "  collective_id {id}");
        }
        if let Some(limit) = c.vmem_limit_bytes {
            let _ = writeln!(self.out, "  vmem_limit {limit}");
        }
        if let Some(cost) = &c.cost {
            let _ = writeln!(
                self.out,
                "  cost flops={} transcendentals={} bytes={}",
                cost.flops, cost.transcendentals, cost.bytes_accessed
            );
        }
        self.out.push('\n');
        self.block(k.entry, 0);
        for o in &c.operands {
            if let Some(m) = o.index_map {
                let _ = writeln!(self.out, "\nmap {}:", o.name);
                self.block(m, 0);
            }
        }
    }

    fn block(&mut self, block: Block, depth: usize) {
        let indent = "  ".repeat(depth);
        let params: Vec<String> =
            self.k.blocks[block].params.iter().map(|&v| format!("{v}: {}", self.k.ty(v))).collect();
        let _ = writeln!(self.out, "{indent}{block}({}):", params.join(", "));
        for &op in &self.k.blocks[block].ops {
            self.op(op, depth + 1);
        }
    }

    fn vals(vs: &[Value]) -> String {
        vs.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
    }

    fn index(idx: &[Index]) -> String {
        idx.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    }

    fn op(&mut self, op: Op, depth: usize) {
        let k = self.k;
        let node = &k.ops[op];
        let indent = "  ".repeat(depth);
        let mut line = indent.clone();
        if !node.results.is_empty() {
            let _ = write!(line, "{} = ", Self::vals(&node.results));
        }
        line.push_str(&node.data.mnemonic());
        let body = match &node.data {
            OpData::Constant { value, .. } => format!(" {value}"),
            OpData::ProgramId { axis } | OpData::NumPrograms { axis } => format!(" {axis}"),
            OpData::DeviceId | OpData::BarrierSemaphore => String::new(),
            OpData::Iota { dim, .. } => format!(" dim={dim}"),
            OpData::Unary { x, .. }
            | OpData::Cast { x, .. }
            | OpData::Broadcast { x, .. }
            | OpData::Reshape { x, .. } => {
                format!(" {x}")
            }
            OpData::Binary { lhs, rhs, .. } | OpData::Compare { lhs, rhs, .. } => {
                format!(" {lhs}, {rhs}")
            }
            OpData::Select { cond, on_true, on_false } => format!(" {cond}, {on_true}, {on_false}"),
            OpData::Transpose { x, perm } => format!(" {x} perm={perm:?}"),
            OpData::Reduce { x, axes, .. } => format!(" {x} axes={axes:?}"),
            OpData::ArgReduce { x, axis, .. } => format!(" {x} axis={axis}"),
            OpData::Slice { x, start, size } => format!(" {x} start={start:?} size={size:?}"),
            OpData::Concat { xs, axis } => format!(" {} axis={axis}", Self::vals(xs)),
            OpData::Roll { x, shift, axis } => format!(" {x} by {shift} axis={axis}"),
            OpData::Dot { lhs, rhs, dims, precision, .. } => format!(
                " {lhs}, {rhs} contract={:?}x{:?} batch={:?}x{:?} precision={precision}",
                dims.lhs_contract, dims.rhs_contract, dims.lhs_batch, dims.rhs_batch
            ),
            OpData::AssumeMultiple { x, multiple } => format!(" {x}, {multiple}"),
            OpData::Load { src, index } => format!(" {src}[{}]", Self::index(index)),
            OpData::Store { dst, index, value, mask } => {
                let mut s = format!(" {dst}[{}], {value}", Self::index(index));
                if let Some(m) = mask {
                    let _ = write!(s, " mask {m}");
                }
                s
            }
            OpData::RefSlice { base, index } => format!(" {base}[{}]", Self::index(index)),
            OpData::DmaStart { src, dst, sem, remote, priority } => {
                let mut s = format!(" {src} -> {dst} sem {sem}");
                if let Some(r) = remote {
                    let _ = write!(s, " device {} send_sem {}", r.device_id, r.send_sem);
                }
                if *priority != 0 {
                    let _ = write!(s, " priority {priority}");
                }
                s
            }
            OpData::DmaWait { src, dst, sem, side } => {
                let mut s = format!(" {src} -> {dst} sem {sem}");
                match side {
                    WaitSide::Local => {}
                    WaitSide::Send => s.push_str(" send"),
                    WaitSide::Recv { device_id } => {
                        let _ = write!(s, " recv device {device_id}");
                    }
                }
                s
            }
            OpData::SemSignal { sem, amount, device_id } => {
                let mut s = format!(" {sem}, {amount}");
                if let Some(d) = device_id {
                    let _ = write!(s, " device {d}");
                }
                s
            }
            OpData::SemWait { sem, amount } => format!(" {sem}, {amount}"),
            OpData::SemRead { sem } => format!(" {sem}"),
            OpData::DebugPrint { format, args } => format!(" {format:?}({})", Self::vals(args)),
            OpData::If { cond, .. } => format!(" {cond}"),
            OpData::For { lower, upper, step, init, .. } => {
                format!(" {lower}..{upper} step {step} init({})", Self::vals(init))
            }
            OpData::While { init, .. } => format!(" init({})", Self::vals(init)),
            OpData::RunScoped { .. } => String::new(),
            OpData::Alloc { buf } => {
                let b = &k.bufs[*buf];
                debug_assert!(matches!(b.origin, BufOrigin::Scoped(_)));
                format!(" {}", b.name)
            }
            OpData::SemAlloc { sem } => format!(" {}", k.sems[*sem].name),
            OpData::Yield { values } => {
                if values.is_empty() {
                    String::new()
                } else {
                    format!(" {}", Self::vals(values))
                }
            }
        };
        line.push_str(&body);
        if !node.results.is_empty() {
            let tys: Vec<String> = node.results.iter().map(|&v| k.ty(v).to_string()).collect();
            let _ = write!(line, " : {}", tys.join(", "));
        }
        let blocks = node.data.blocks();
        if !blocks.is_empty() {
            line.push_str(" {");
        }
        if self.options.locations
            && let Some(loc) = node.loc
        {
            let _ = write!(line, "  ; {loc}");
        }
        self.out.push_str(&line);
        self.out.push('\n');
        let separator = if matches!(node.data, OpData::While { .. }) { "do" } else { "else" };
        for (i, b) in blocks.iter().enumerate() {
            if i > 0 {
                let _ = writeln!(self.out, "{indent}}} {separator} {{");
            }
            self.block(*b, depth + 1);
        }
        if !blocks.is_empty() {
            let _ = writeln!(self.out, "{indent}}}");
        }
    }
}
