//! The verifier: checks a kernel and collects *every* error, each tied to the op (and its
//! source line) or the call-spec field it concerns, in the manner of Cranelift's verifier.
//!
//! Besides typing (shared with the builder through [`super::infer`]) and SSA scoping it
//! enforces the TPU rules libtpu would otherwise report much later: block shapes must tile
//! the hardware's native (sublane, lane) tiles, index maps must return one i32 per array
//! dim, and everything resident in VMEM must fit the chip's budget. Grid extents are i32
//! (program ids), and where index maps are affine in the grid indices (no scalar
//! prefetch), every block they reach is inside its array and every element of every output
//! is written ([`super::coverage`]).
//!
//! Whether the operands fit a chip's HBM is a property of the call, not of the kernel:
//! [`check_hbm`], which the CLI runs for `ir`, `emit` and `interpret` (the megakernel
//! planner has its own, per layer; lowering does not check, so a kernel larger than any
//! chip can still be emitted to time its compilation).

use super::coverage;
use super::infer::{result_types, yield_types};
use super::{Block, BufOrigin, DType, Kernel, MemorySpace, Op, OpData, SrcLoc, Type, Value};
use crate::spec::{BlockDim, Chip, OperandRole, OperandSpec, PipelineMode, ScratchSpec};
use cranelift_entity::SecondaryMap;
use std::fmt;

#[derive(Copy, Clone, Debug, Default)]
pub struct VerifyOptions {
    /// Check the VMEM budget against this chip (else only against `vmem_limit_bytes`, if set).
    pub chip: Option<Chip>,
}

/// What an error is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorSite {
    Op(Op),
    /// A part of the call spec, e.g. `operand x` or `vmem`.
    Call(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifierError {
    pub site: ErrorSite,
    /// The op as printed, for context.
    pub op_text: Option<String>,
    pub loc: Option<SrcLoc>,
    pub message: String,
}

impl fmt::Display for VerifierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.site {
            ErrorSite::Op(op) => write!(f, "{op}")?,
            ErrorSite::Call(what) => f.write_str(what)?,
        }
        if let Some(text) = &self.op_text {
            write!(f, " ({text})")?;
        }
        if let Some(loc) = &self.loc {
            write!(f, " at {loc}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// All errors found in one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifierErrors(pub Vec<VerifierError>);

impl fmt::Display for VerifierErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifierErrors {}

/// Verify `kernel`; `Ok` only if no rule is broken.
pub fn verify(kernel: &Kernel, options: VerifyOptions) -> Result<(), VerifierErrors> {
    let mut v = Verifier { k: kernel, errors: Vec::new(), visible: SecondaryMap::new() };
    v.call_spec();
    v.entry_signature();
    v.region(kernel.entry, false);
    for o in &kernel.call.operands {
        if let Some(map) = o.index_map {
            v.index_map(o, map);
        }
    }
    v.vmem_budget(options.chip);
    for e in coverage::check(kernel) {
        v.errors.push(VerifierError {
            site: ErrorSite::Call(e.what),
            op_text: None,
            loc: e.loc.or(kernel.loc),
            message: e.message,
        });
    }
    if v.errors.is_empty() { Ok(()) } else { Err(VerifierErrors(v.errors)) }
}

struct Verifier<'a> {
    k: &'a Kernel,
    errors: Vec<VerifierError>,
    visible: SecondaryMap<Value, bool>,
}

impl Verifier<'_> {
    fn call_error(&mut self, what: impl Into<String>, message: impl Into<String>) {
        self.errors.push(VerifierError {
            site: ErrorSite::Call(what.into()),
            op_text: None,
            loc: self.k.loc,
            message: message.into(),
        });
    }

    /// A call-spec error about operand `o`, at its declaration.
    fn operand_error(
        &mut self,
        o: &OperandSpec,
        what: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(VerifierError {
            site: ErrorSite::Call(what.into()),
            op_text: None,
            loc: o.loc.or(self.k.loc),
            message: message.into(),
        });
    }

    fn op_error(&mut self, op: Op, message: impl Into<String>) {
        let text = op_line(self.k, op);
        self.errors.push(VerifierError {
            site: ErrorSite::Op(op),
            op_text: Some(text),
            loc: self.k.ops[op].loc,
            message: message.into(),
        });
    }

    fn call_spec(&mut self) {
        let c = &self.k.call;
        for (i, g) in c.grid.iter().enumerate() {
            if g.extent == 0 {
                self.call_error(format!("grid dim {i}"), "grid extents must be at least 1");
            } else if g.extent > i32::MAX as u64 {
                self.call_error(
                    format!("grid dim {i}"),
                    format!("grid extent {} exceeds {} (program ids are i32)", g.extent, i32::MAX),
                );
            }
        }
        for o in &c.operands {
            self.operand(o);
        }
        let ins: Vec<&OperandSpec> = c.operands_of(OperandRole::Input).collect();
        let outs: Vec<&OperandSpec> = c.operands_of(OperandRole::Output).collect();
        for &(i, o) in &c.aliases {
            match (ins.get(i), outs.get(o)) {
                (Some(a), Some(b)) if a.dtype == b.dtype && a.shape == b.shape => {}
                (Some(a), Some(b)) => self.call_error(
                    format!("alias in{i} -> out{o}"),
                    format!(
                        "aliased arrays must match: {} is {}{}, {} is {}{}",
                        a.name, a.dtype, a.shape, b.name, b.dtype, b.shape
                    ),
                ),
                _ => self.call_error(
                    format!("alias in{i} -> out{o}"),
                    format!("no such input/output ({} inputs, {} outputs)", ins.len(), outs.len()),
                ),
            }
        }
        if outs.is_empty() {
            self.call_error("outputs", "a kernel needs at least one output");
        }
    }

    fn operand(&mut self, o: &OperandSpec) {
        let what = format!("operand {}", o.name);
        if o.role == OperandRole::Prefetch
            && (o.dtype != DType::I32 || o.space != MemorySpace::Smem)
        {
            self.operand_error(
                o,
                &what,
                format!(
                    "scalar prefetch must be an i32 array in SMEM, got {}{} in {}",
                    o.dtype, o.shape, o.space
                ),
            );
        }
        if o.space == MemorySpace::Semaphore {
            self.operand_error(o, &what, "arrays cannot live in semaphore memory");
        }
        if let Some(mode) = o.pipeline_mode {
            if !PipelineMode::SUPPORTED_BUFFERS.contains(&mode.buffers()) {
                self.operand_error(o, &what, format!("pipeline_mode = {mode}: Mosaic pipelines a window with 1 (synchronous) or 2 (double-buffered) buffers"));
            }
            if !(o.is_windowed() && o.block.is_some() && !self.k.call.grid.is_empty()) {
                self.operand_error(o, &what, format!("pipeline_mode = {mode} needs a windowed operand of a gridded kernel (a VMEM block with an index map)"));
            }
        }
        let Some(block) = &o.block else {
            if o.is_windowed() && !self.k.call.grid.is_empty() && o.index_map.is_none() {
                self.operand_error(
                    o,
                    &what,
                    "a windowed operand of a gridded kernel needs a block shape and an index map",
                );
            }
            return;
        };
        if o.space.is_hbm_like() {
            self.operand_error(o, &what, format!("{} operands are not windowed: drop the block shape and copy from them with DMAs", o.space));
            return;
        }
        if block.len() != o.shape.rank() {
            self.operand_error(
                o,
                &what,
                format!(
                    "block rank {} differs from array rank {} ({})",
                    block.len(),
                    o.shape.rank(),
                    o.shape
                ),
            );
            return;
        }
        if o.index_map.is_none() {
            self.operand_error(o, &what, "a block shape needs an index map");
        }
        for (d, (b, &n)) in block.iter().zip(o.shape.dims()).enumerate() {
            match *b {
                BlockDim::Blocked(b) if b == 0 || b > n => self.operand_error(
                    o,
                    &what,
                    format!("block dim {d} is {b}, the array dim is {n}"),
                ),
                BlockDim::Element { size, pad: (lo, hi) } if size == 0 || size > n + lo + hi => {
                    self.operand_error(o, &what, format!("element block dim {d} is {size}, the array dim is {n} (padded by {lo} and {hi})"));
                }
                BlockDim::Element { pad: (lo, _), .. } if lo > 0 => {
                    self.operand_error(o, &what, format!("element block dim {d} is padded by {lo} before: libtpu (0.0.42.1) refuses it (\"Low padding not supported yet\"); pad after only"));
                }
                BlockDim::Element { pad, .. } if pad != (0, 0) && o.role == OperandRole::Output => {
                    self.operand_error(o, &what, format!("element block dim {d} of an output is padded {pad:?}: padding only applies to inputs (an output window writes array elements)"));
                }
                _ => {}
            }
        }
        if o.has_element_window() && block.iter().any(|b| matches!(b, BlockDim::Blocked(_))) {
            self.operand_error(
                o,
                &what,
                "a block with an `Element` dim cannot have blocked dims (Pallas refuses the mix)",
            );
        }
        if o.space == MemorySpace::Vmem
            && let Err(m) = block_tiling_rule(o.dtype, block, &o.shape)
        {
            self.operand_error(o, &what, m);
        }
    }

    fn entry_signature(&mut self) {
        let k = self.k;
        let params = &k.blocks[k.entry].params;
        let mut want: Vec<Type> = k.call.grid.iter().map(|_| Type::Scalar(DType::I32)).collect();
        for o in &k.call.operands {
            want.push(Type::Ref(super::RefType {
                space: o.space,
                dtype: o.dtype,
                shape: o.window_shape(),
            }));
        }
        for s in &k.call.scratch {
            want.push(match s {
                ScratchSpec::Buffer { space, dtype, shape, .. } => {
                    Type::Ref(super::RefType { space: *space, dtype: *dtype, shape: shape.clone() })
                }
                ScratchSpec::Semaphore { kind, shape, .. } => Type::Sem(*kind, shape.clone()),
            });
        }
        let got: Vec<Type> = params.iter().map(|&p| k.ty(p).clone()).collect();
        if got != want {
            let show =
                |ts: &[Type]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
            self.call_error(
                "kernel signature",
                format!(
                    "entry block takes ({}), the call spec implies ({})",
                    show(&got),
                    show(&want)
                ),
            );
        }
    }

    /// Check a region: ops typed and scoped, and a `yield` exactly at the end of nested
    /// regions and index maps (`must_yield`), nowhere else.
    fn region(&mut self, block: Block, must_yield: bool) {
        let k = self.k;
        for &p in &k.blocks[block].params {
            self.visible[p] = true;
        }
        let ops = &k.blocks[block].ops;
        for (i, &op) in ops.iter().enumerate() {
            let node = &k.ops[op];
            let mut operands = node.data.operands();
            operands.dedup();
            for v in operands {
                if !self.visible[v] {
                    self.op_error(
                        op,
                        format!("uses {v}, which is not defined before it in an enclosing scope"),
                    );
                }
            }
            let is_last = i + 1 == ops.len();
            match &node.data {
                OpData::Yield { .. } if !(must_yield && is_last) => {
                    self.op_error(op, "yield must be the last op of a nested region");
                }
                OpData::Alloc { .. } | OpData::SemAlloc { .. } => {
                    let parent = k.blocks[block].parent.expand();
                    if !parent.is_some_and(|p| matches!(k.ops[p].data, OpData::RunScoped { .. })) {
                        self.op_error(op, "scoped allocations belong directly inside run_scoped");
                    }
                }
                _ => {}
            }
            for b in node.data.blocks() {
                self.region(b, true);
            }
            match result_types(k, &node.data) {
                Ok(types) => {
                    let got: Vec<&Type> = node.results.iter().map(|&r| k.ty(r)).collect();
                    if got != types.iter().collect::<Vec<_>>() {
                        let show = |ts: Vec<String>| ts.join(", ");
                        self.op_error(
                            op,
                            format!(
                                "results are typed ({}), the operands imply ({})",
                                show(got.iter().map(|t| t.to_string()).collect()),
                                show(types.iter().map(|t| t.to_string()).collect())
                            ),
                        );
                    }
                }
                Err(m) => self.op_error(op, m),
            }
            for &r in &node.results {
                self.visible[r] = true;
            }
        }
        // A region of an op is reported by the op's typing rule; an index map has no op.
        let ends_in_yield =
            matches!(ops.last().map(|&o| &k.ops[o].data), Some(OpData::Yield { .. }));
        if must_yield && !ends_in_yield && k.blocks[block].parent.is_none() {
            self.call_error(format!("index map {block}"), "does not end with a yield");
        }
        // Leaving the region: its values go out of scope.
        for &p in &k.blocks[block].params {
            self.visible[p] = false;
        }
        for &op in ops {
            for &r in &k.ops[op].results {
                self.visible[r] = false;
            }
        }
    }

    fn index_map(&mut self, o: &OperandSpec, map: Block) {
        let k = self.k;
        let what = format!("index map of {}", o.name);
        let mut want: Vec<Type> = k.call.grid.iter().map(|_| Type::Scalar(DType::I32)).collect();
        for p in k.call.operands_of(OperandRole::Prefetch) {
            want.push(Type::Ref(super::RefType {
                space: p.space,
                dtype: p.dtype,
                shape: p.shape.clone(),
            }));
        }
        let got: Vec<Type> = k.blocks[map].params.iter().map(|&p| k.ty(p).clone()).collect();
        if got != want {
            self.operand_error(
                o,
                &what,
                format!(
                    "takes {} parameters, expected the {} grid indices and {} prefetch refs",
                    got.len(),
                    k.call.grid.len(),
                    want.len() - k.call.grid.len()
                ),
            );
        }
        // Index maps may not touch the kernel body's values.
        let saved = std::mem::take(&mut self.visible);
        self.region(map, true);
        self.visible = saved;
        if let Ok(ys) = yield_types(k, map)
            && (ys.len() != o.shape.rank() || ys.iter().any(|t| *t != Type::Scalar(DType::I32)))
        {
            let shown: Vec<String> = ys.iter().map(|t| t.to_string()).collect();
            self.operand_error(
                o,
                &what,
                format!(
                    "returns ({}), expected one i32 block index per array dim ({} dims)",
                    shown.join(", "),
                    o.shape.rank()
                ),
            );
        }
    }

    fn vmem_budget(&mut self, chip: Option<Chip>) {
        let k = self.k;
        let gridded = !k.call.grid.is_empty();
        let mut lines = Vec::new();
        let mut total = 0u64;
        // The operand taking the most VMEM: an exceeded budget is reported at its declaration.
        let mut largest: Option<(u64, &OperandSpec)> = None;
        for o in &k.call.operands {
            if o.space != MemorySpace::Vmem {
                continue;
            }
            // Windowed blocks take the grid pipeline's buffers (two unless `Buffered(n)`).
            let buffers = if gridded && o.block.is_some() { o.window_buffers() } else { 1 };
            let bytes = padded_vmem_bytes(o.dtype, &o.window_shape());
            lines.push(format!("{} {}x{}", o.name, buffers, bytes));
            let taken = bytes.saturating_mul(buffers);
            total = total.saturating_add(taken);
            if largest.is_none_or(|(most, _)| taken > most) {
                largest = Some((taken, o));
            }
        }
        for b in k.bufs.values() {
            let scratch_or_scoped =
                matches!(b.origin, BufOrigin::Scratch(_) | BufOrigin::Scoped(_));
            if scratch_or_scoped && b.ty.space == MemorySpace::Vmem {
                let bytes = padded_vmem_bytes(b.ty.dtype, &b.ty.shape);
                lines.push(format!("{} {bytes}", b.name));
                total = total.saturating_add(bytes);
            }
        }
        let limit = k.call.vmem_limit_bytes.or(chip.map(|c| c.target().default_scoped_vmem_bytes));
        if let (Some(limit), Some(chip)) = (k.call.vmem_limit_bytes, chip)
            && limit > chip.target().vmem_bytes
        {
            self.call_error(
                "vmem_limit",
                format!(
                    "vmem_limit_bytes {limit} exceeds the {} MiB of VMEM per TensorCore on {chip}",
                    chip.target().vmem_bytes >> 20
                ),
            );
        }
        if let Some(limit) = limit
            && total > limit
        {
            let message = format!(
                "VMEM budget exceeded: {total} bytes needed ({}), limit {limit} bytes{}",
                lines.join(" + "),
                chip.map(|c| format!(" on {c}")).unwrap_or_default()
            );
            match largest {
                Some((_, o)) => self.operand_error(o, "vmem", message),
                None => self.call_error("vmem", message),
            }
        }
    }
}

/// All operands of a call live in the chip's HBM at once (an aliased output is its input's
/// buffer): `Err` with the numbers when they do not fit.
pub fn check_hbm(k: &Kernel, chip: Chip) -> Result<(), String> {
    let aliased_outputs: Vec<usize> = k.call.aliases.iter().map(|&(_, o)| o).collect();
    let mut lines: Vec<(&str, u64)> = Vec::new();
    for (i, o) in k.call.operands_of(OperandRole::Output).enumerate() {
        if !aliased_outputs.contains(&i) {
            lines.push((&o.name, array_bytes(o.dtype, &o.shape)));
        }
    }
    for o in k.call.operands.iter().filter(|o| o.role != OperandRole::Output) {
        lines.push((&o.name, array_bytes(o.dtype, &o.shape)));
    }
    let total = lines.iter().fold(0u64, |t, (_, b)| t.saturating_add(*b));
    let limit = chip.target().hbm_bytes_per_device();
    if total <= limit {
        return Ok(());
    }
    lines.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let detail: Vec<String> =
        lines.iter().take(4).map(|(n, b)| format!("{n} {}", gib(*b))).collect();
    Err(format!(
        "the operands of `{}` need {} ({total} bytes: {}), more than the {} of HBM per device on {chip}",
        k.name,
        gib(total),
        detail.join(", "),
        gib(limit)
    ))
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Bytes of a dense array in HBM (saturating: an absurd shape is simply too big).
pub fn array_bytes(dtype: DType, shape: &super::Shape) -> u64 {
    let elems = shape.dims().iter().fold(1u64, |n, &d| n.saturating_mul(d));
    elems.saturating_mul(u64::from(dtype.memory_bits())).div_ceil(8)
}

/// Bytes a VMEM buffer really occupies: the two minor dims are padded to the native tile
/// (saturating, like [`array_bytes`]).
pub fn padded_vmem_bytes(dtype: DType, shape: &super::Shape) -> u64 {
    let (sub, lane) = dtype.native_tile();
    let d = shape.dims();
    let up = |x: u64, m: u64| x.checked_next_multiple_of(m).unwrap_or(u64::MAX);
    let padded: u64 = match d.len() {
        0 => 1,
        1 => up(d[0], sub * lane),
        n => d[..n - 2]
            .iter()
            .fold(1u64, |p, &x| p.saturating_mul(x))
            .saturating_mul(up(d[n - 2], sub))
            .saturating_mul(up(d[n - 1], lane)),
    };
    padded.saturating_mul(u64::from(dtype.memory_bits())).div_ceil(8)
}

/// The TPU block-shape rule (Pallas's `_check_block_mappings`, tightened to the native tile
/// of the dtype so that packed types do not waste or misalign vregs).
pub fn block_tiling_rule(
    dtype: DType,
    block: &[BlockDim],
    array: &super::Shape,
) -> Result<(), String> {
    let (sub, lane) = dtype.native_tile();
    let a = array.dims();
    let n = block.len();
    let dims: Vec<u64> = block.iter().map(|b| b.extent()).collect();
    let squeezed = |i: usize| block[i] == BlockDim::Squeezed;
    if n == 1 {
        let (b, full) = (dims[0], a[0]);
        let min_pow2 = 128 * 32 / u64::from(dtype.memory_bits());
        if b == full || b % 1024 == 0 || (b.is_power_of_two() && b >= min_pow2) {
            return Ok(());
        }
        return Err(format!(
            "TPU block rule: a 1-D block of {dtype} must be the whole array ({full}), a multiple of 1024, or a power of two >= {min_pow2}; got {b}"
        ));
    }
    let mut problems = Vec::new();
    if !squeezed(n - 1) && dims[n - 1] != a[n - 1] && !dims[n - 1].is_multiple_of(lane) {
        problems.push(format!("the last block dim ({}) must be a multiple of {lane} lanes or equal the array dim ({})", dims[n - 1], a[n - 1]));
    }
    if !squeezed(n - 2) && dims[n - 2] != a[n - 2] && !dims[n - 2].is_multiple_of(sub) {
        problems.push(format!(
            "the second-minor block dim ({}) must be a multiple of {sub} (native {dtype} tile ({sub},{lane})) or equal the array dim ({})",
            dims[n - 2], a[n - 2]
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("TPU block rule: {}", problems.join("; ")))
    }
}

/// One op's line of text, without nested regions.
fn op_line(k: &Kernel, op: Op) -> String {
    let node = &k.ops[op];
    let results: Vec<String> = node.results.iter().map(|r| r.to_string()).collect();
    let operands: Vec<String> = node.data.operands().iter().map(|v| k.value_name(*v)).collect();
    let head =
        if results.is_empty() { String::new() } else { format!("{} = ", results.join(", ")) };
    format!("{head}{} {}", node.data.mnemonic(), operands.join(", ")).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Literal, Shape};
    use crate::spec::OperandSpec;
    use smallvec::smallvec;

    /// A gridless kernel with one f32[8,128] VMEM output, built through the raw IR API.
    fn kernel_with_output() -> (Kernel, Value) {
        let mut k = Kernel::new("raw");
        k.call.operands.push(OperandSpec {
            name: "o".into(),
            role: OperandRole::Output,
            dtype: DType::F32,
            shape: Shape::new([8, 128]),
            space: MemorySpace::Vmem,
            block: None,
            index_map: None,
            loc: None,
            pipeline_mode: None,
            values: None,
        });
        let ty = super::super::RefType {
            space: MemorySpace::Vmem,
            dtype: DType::F32,
            shape: Shape::new([8, 128]),
        };
        let o = k.add_block_param(k.entry, Type::Ref(ty.clone()));
        k.declare_buf("o".into(), BufOrigin::Operand(0), ty.space, ty.dtype, ty.shape, o);
        (k, o)
    }

    #[test]
    fn collects_scoping_typing_and_yield_errors_together() {
        let (mut k, _) = kernel_with_output();
        let entry = k.entry;
        // A value defined inside an `if` region, used after it: out of scope.
        let then_b = k.new_block();
        let else_b = k.new_block();
        let c = k.append_op(
            then_b,
            OpData::Constant { value: Literal::Int(1), ty: Type::Scalar(DType::I32) },
            vec![Type::Scalar(DType::I32)],
            None,
        );
        let inner = k.result(c);
        k.append_op(then_b, OpData::Yield { values: smallvec![] }, vec![], None);
        // The else region lacks its yield.
        let t = k.append_op(
            entry,
            OpData::Constant { value: Literal::Bool(true), ty: Type::Scalar(DType::Bool) },
            vec![Type::Scalar(DType::Bool)],
            None,
        );
        let cond = k.result(t);
        let if_op = k.append_op(
            entry,
            OpData::If { cond, then_block: then_b, else_block: else_b },
            vec![],
            None,
        );
        // Result typed wrongly: i32 + i32 claimed to be f32.
        let add = k.append_op(
            entry,
            OpData::Binary { op: super::super::BinaryOp::Add, lhs: inner, rhs: inner },
            vec![Type::Scalar(DType::F32)],
            None,
        );
        let errs = verify(&k, VerifyOptions::default()).unwrap_err();
        let text = errs.to_string();
        assert_eq!(errs.0.len(), 3, "{text}");
        assert!(
            text.contains(&format!("{if_op} (if v2): region bb2 does not end with a yield")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{add} (v3 = add v1, v1): uses v1, which is not defined before it"
            )),
            "{text}"
        );
        assert!(text.contains("results are typed (f32), the operands imply (i32)"), "{text}");
    }

    #[test]
    fn block_rule_covers_full_dims_squeezed_dims_and_1d_blocks() {
        let s = |d: &[u64]| Shape::new(d.to_vec());
        let b = |d: &[u64]| d.iter().map(|&x| BlockDim::Blocked(x)).collect::<Vec<_>>();
        assert!(block_tiling_rule(DType::F32, &b(&[8, 128]), &s(&[64, 256])).is_ok());
        assert!(
            block_tiling_rule(DType::F32, &b(&[3, 100]), &s(&[3, 100])).is_ok(),
            "whole-array blocks are always fine"
        );
        assert!(
            block_tiling_rule(DType::Bf16, &b(&[8, 128]), &s(&[64, 256]))
                .unwrap_err()
                .contains("multiple of 16")
        );
        assert!(block_tiling_rule(DType::I8, &b(&[32, 256]), &s(&[64, 256])).is_ok());
        let squeezed = vec![BlockDim::Squeezed, BlockDim::Blocked(16), BlockDim::Blocked(128)];
        assert!(block_tiling_rule(DType::Bf16, &squeezed, &s(&[4, 64, 256])).is_ok());
        assert!(block_tiling_rule(DType::F32, &b(&[1024]), &s(&[4096])).is_ok());
        assert!(
            block_tiling_rule(DType::F32, &b(&[96]), &s(&[4096]))
                .unwrap_err()
                .contains("1-D block")
        );
    }

    #[test]
    fn padded_bytes_round_minor_dims_up_to_the_native_tile() {
        assert_eq!(padded_vmem_bytes(DType::F32, &Shape::new([8, 128])), 4096);
        assert_eq!(padded_vmem_bytes(DType::F32, &Shape::new([1, 100])), 4096);
        assert_eq!(padded_vmem_bytes(DType::Bf16, &Shape::new([2, 8, 128])), 2 * 16 * 128 * 2);
    }
}
