//! Prepare once: translate the parsed module into numbered value slots and typed
//! instructions (whole vector tiles per instruction), resolving every attribute, type and
//! shape up front so running does no name lookups or attribute parsing.

use crate::error::{ErrorKind, InterpError, OpSite, Result, bail};
use crate::memory::Space;
use crate::parse::{Attr, Block, DenseElem, DotDims, ModuleAst, Operation, Pos, Type};
use crate::value::{Bin, Cast, DType, Data, Shape, Tile, Un, Val, round_f, wrap_i};
use smallvec::SmallVec;
use std::collections::HashMap;

pub(crate) type Slot = u32;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RKind {
    Add,
    Mul,
    MaxF,
    MinF,
    MaxNumF,
    MinNumF,
    MaxSI,
    MinSI,
    MaxUI,
    MinUI,
    And,
    Or,
    Xor,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// No attribute: f32 operands are rounded to bf16 on the MXU (pallas-mosaic.md §4.3).
    Default,
    Bf16,
    Bf16x3,
    Fp32,
}

#[derive(Debug)]
pub(crate) enum Kind {
    Const(Val),
    Bin {
        op: Bin,
        dt: DType,
        a: Slot,
        b: Slot,
    },
    Un {
        op: Un,
        dt: DType,
        a: Slot,
    },
    Cmp {
        float: bool,
        pred: i64,
        dt: DType,
        a: Slot,
        b: Slot,
    },
    Select {
        c: Slot,
        t: Slot,
        f: Slot,
    },
    Cast {
        op: Cast,
        from: DType,
        to: DType,
        a: Slot,
    },
    Broadcast {
        a: Slot,
        dt: DType,
        shape: Shape,
    },
    ShapeCast {
        a: Slot,
        shape: Shape,
    },
    /// `steps`: the element stride per dim of `tpu.strided_load` (empty: contiguous).
    VLoad {
        base: Slot,
        idx: Vec<Slot>,
        shape: Shape,
        dt: DType,
        steps: Vec<usize>,
    },
    /// `steps` as in `VLoad` (`tpu.strided_store`).
    VStore {
        val: Slot,
        base: Slot,
        idx: Vec<Slot>,
        mask: Option<Slot>,
        add: bool,
        steps: Vec<usize>,
    },
    MLoad {
        base: Slot,
        idx: Vec<Slot>,
    },
    MStore {
        val: Slot,
        base: Slot,
        idx: Vec<Slot>,
    },
    Reduce {
        kind: RKind,
        dt: DType,
        a: Slot,
        acc: Slot,
        dims: Vec<usize>,
    },
    Extract {
        a: Slot,
        pos: Vec<i64>,
        dyn_pos: Vec<Slot>,
    },
    ExtractSS {
        a: Slot,
        offsets: Vec<usize>,
        sizes: Vec<usize>,
        strides: Vec<usize>,
    },
    Matmul {
        lhs: Slot,
        rhs: Slot,
        acc: Slot,
        dims: DotDims,
        precision: Precision,
        out: DType,
        shape: Shape,
    },
    Transpose {
        a: Slot,
        perm: Vec<usize>,
    },
    Iota {
        shape: Shape,
        dim: usize,
    },
    Concat {
        xs: Vec<Slot>,
        dim: usize,
    },
    Rotate {
        a: Slot,
        shift: Slot,
        dim: usize,
    },
    /// `tpu.log`: print `tag` (its `$k` replaced by scalar `k` when formatted).
    Log {
        tag: String,
        formatted: bool,
        args: Vec<Slot>,
    },
    ReduceIndex {
        a: Slot,
        dim: usize,
        max: bool,
    },
    Slice {
        base: Slot,
        offs: Vec<Slot>,
        sizes: Shape,
    },
    Squeeze {
        base: Slot,
        shape: Shape,
    },
    /// `remote`: the send semaphore and the target device of a remote copy.
    Dma {
        src: Slot,
        dst: Slot,
        sem: Slot,
        remote: Option<(Slot, Slot)>,
    },
    DmaWait {
        sem: Slot,
        dst: Slot,
    },
    /// `device`: the device whose semaphore a remote signal increments.
    SemSignal {
        sem: Slot,
        amount: Slot,
        device: Option<Slot>,
    },
    /// `tpu.device_id`: this device's logical id in the mesh.
    DeviceId,
    /// `tpu.sem_barrier`: the collective's barrier semaphore.
    BarrierSemaphore,
    SemWait {
        sem: Slot,
        amount: Slot,
    },
    SemRead {
        sem: Slot,
    },
    Alloca {
        dt: DType,
        shape: Shape,
        space: Space,
    },
    AssumeMultiple {
        a: Slot,
        m: i64,
    },
    Assert {
        c: Slot,
        msg: String,
    },
    IterationBound {
        dim: usize,
    },
    If {
        c: Slot,
        then: CBlock,
        els: CBlock,
    },
    For {
        lb: Slot,
        ub: Slot,
        step: Slot,
        inits: Vec<Slot>,
        body: CBlock,
    },
    While {
        inits: Vec<Slot>,
        before: CBlock,
        after: CBlock,
    },
    Region {
        body: CBlock,
    },
    Nop,
}

#[derive(Debug)]
pub(crate) struct Instr {
    pub kind: Kind,
    pub res: SmallVec<[Slot; 2]>,
    pub site: u32,
}

#[derive(Debug, Default)]
pub(crate) enum Term {
    #[default]
    None,
    Yield(Vec<Slot>),
    Condition(Slot, Vec<Slot>),
}

#[derive(Debug, Default)]
pub(crate) struct CBlock {
    pub args: Vec<Slot>,
    pub instrs: Vec<Instr>,
    pub term: Term,
}

#[derive(Debug)]
pub(crate) struct Func {
    pub name: String,
    pub nslots: usize,
    pub body: CBlock,
    pub arg_types: Vec<Type>,
    #[allow(dead_code)]
    pub result_types: Vec<Type>,
}

/// One windowed (or whole, `{}`) input/output operand of a gridded kernel.
#[derive(Debug, Clone)]
pub(crate) struct WindowParam {
    /// Index into `Program::funcs` of its `transform_N`.
    pub transform: Option<usize>,
    pub bounds: Option<Vec<usize>>,
    /// `window_kind = #tpu.element_window<[before..], [after..]>`: the transform returns
    /// element offsets into the array padded by these, not block indices.
    pub element_pads: Option<Vec<(usize, usize)>>,
}

/// A prepared kernel, ready to run any number of times.
#[derive(Debug)]
pub struct Program {
    pub(crate) kernel: Func,
    pub(crate) funcs: Vec<Func>,
    pub(crate) sites: Vec<OpSite>,
    pub(crate) grid: Vec<i64>,
    /// Per grid dim: `parallel` (points may run concurrently) or `arbitrary` (in order).
    pub(crate) parallel: Vec<bool>,
    pub(crate) scalar_prefetch: usize,
    pub(crate) scratch: usize,
    /// `None` for a kernel without a grid (every operand passed whole).
    pub(crate) windows: Option<Vec<WindowParam>>,
    pub(crate) widened: crate::host::WidenedInputs,
}

impl Program {
    /// The kernel function's name.
    pub fn name(&self) -> &str {
        &self.kernel.name
    }
    /// The grid (`iteration_bounds`; empty without a grid).
    pub fn grid(&self) -> &[i64] {
        &self.grid
    }
}

/// The most elements of a vector, or of an on-chip buffer (VMEM, SMEM, semaphores), the
/// interpreter materializes: 2^26 (256 MiB as f32), twice the largest VMEM. Only a
/// malformed body has larger ones; they are refused instead of allocated.
pub(crate) const MAX_ON_CHIP_ELEMENTS: usize = 1 << 26;

/// The element count of a shape (`None`: a negative dim or an overflow).
fn elements(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// Shape and element type of a scalar or vector type.
pub(crate) fn shape_dt(t: &Type) -> Option<(Shape, DType)> {
    match t {
        Type::Vector { shape, elem } => {
            if elements(shape)? > MAX_ON_CHIP_ELEMENTS {
                return None;
            }
            Some((shape.iter().map(|&d| d as usize).collect(), DType::from_type(elem)?))
        }
        t => Some((Shape::new(), DType::from_type(t)?)),
    }
}

/// Shape, element type and memory space of a memref type.
pub(crate) fn memref_info(t: &Type) -> Option<(Shape, DType, Space)> {
    match t {
        Type::MemRef { shape, elem, .. } => {
            let n = elements(shape)?;
            let space = Space::parse(t.memory_space());
            if space != Space::Hbm && n > MAX_ON_CHIP_ELEMENTS {
                return None;
            }
            Some((shape.iter().map(|&d| d as usize).collect(), DType::from_type(elem)?, space))
        }
        _ => None,
    }
}

struct Cx<'a> {
    lines: Vec<&'a str>,
    sites: Vec<OpSite>,
    func: String,
    scopes: Vec<HashMap<String, Slot>>,
    next: Slot,
}

fn err_at(kind: ErrorKind, site: &OpSite, msg: String) -> InterpError {
    InterpError { kind, message: msg, site: Some(site.clone()), grid_point: None }
}

impl<'a> Cx<'a> {
    fn site(&mut self, name: &str, pos: Pos, src: Option<&str>) -> u32 {
        let text =
            self.lines.get(pos.line.saturating_sub(1) as usize).map(|l| l.trim()).unwrap_or("");
        let text = if text.len() > 240 {
            format!(
                "{}…",
                &text[..text
                    .char_indices()
                    .take_while(|(i, _)| *i < 240)
                    .last()
                    .map(|(i, c)| i + c.len_utf8())
                    .unwrap_or(0)]
            )
        } else {
            text.to_string()
        };
        self.sites.push(OpSite {
            name: name.to_string(),
            pos,
            src: src.map(str::to_string),
            text,
            func: self.func.clone(),
        });
        (self.sites.len() - 1) as u32
    }

    fn define(&mut self, name: &str) -> Slot {
        let s = self.next;
        self.next += 1;
        if let Some(m) = self.scopes.last_mut() {
            m.insert(name.to_string(), s);
        }
        s
    }

    fn lookup(&self, name: &str) -> Option<Slot> {
        self.scopes.iter().rev().find_map(|m| m.get(name).copied())
    }

    fn block(&mut self, b: &Block, expect_args: Option<usize>) -> Result<CBlock> {
        self.scopes.push(HashMap::new());
        let r = self.block_inner(b, expect_args);
        self.scopes.pop();
        r
    }

    fn block_inner(&mut self, b: &Block, expect_args: Option<usize>) -> Result<CBlock> {
        let args: Vec<Slot> = b.args.iter().map(|(n, _)| self.define(n)).collect();
        if let Some(n) = expect_args
            && n != args.len()
        {
            bail!(
                Malformed,
                "block `{}` has {} arguments, expected {n}",
                b.label.as_deref().unwrap_or("entry"),
                args.len()
            );
        }
        let mut out = CBlock { args, instrs: Vec::new(), term: Term::None };
        for op in &b.ops {
            match op.name.as_str() {
                "scf.yield" | "tpu.yield" | "func.return" => {
                    out.term = Term::Yield(self.operands(op)?);
                }
                "scf.condition" => {
                    let ops = self.operands(op)?;
                    out.term = Term::Condition(ops[0], ops[1..].to_vec());
                }
                _ => {
                    let i = self.op(op)?;
                    out.instrs.push(i);
                }
            }
        }
        Ok(out)
    }

    fn region_block(&mut self, op: &Operation, k: usize, args: Option<usize>) -> Result<CBlock> {
        let Some(r) = op.regions.get(k) else {
            bail!(Malformed, "`{}` is missing region {k}", op.name)
        };
        match r.blocks.len() {
            0 => Ok(CBlock::default()),
            1 => self.block(&r.blocks[0], args),
            _ => bail!(
                Unsupported,
                "`{}`: regions with several blocks (unstructured control flow) are not supported",
                op.name
            ),
        }
    }

    fn operands(&self, op: &Operation) -> Result<Vec<Slot>> {
        op.operands
            .iter()
            .map(|n| {
                self.lookup(n).ok_or_else(|| {
                    InterpError::new(ErrorKind::Malformed, format!("use of undefined value %{n}"))
                })
            })
            .collect()
    }

    fn op(&mut self, op: &Operation) -> Result<Instr> {
        let site = self.site(&op.name, op.pos, op.src.as_deref());
        let s = self.sites[site as usize].clone();
        let kind = self.kind(op).map_err(|mut e| {
            if e.site.is_none() {
                e.site = Some(s.clone());
            }
            e
        })?;
        let res = op.results.iter().map(|n| self.define(n)).collect();
        Ok(Instr { kind, res, site })
    }

    fn kind(&mut self, op: &Operation) -> Result<Kind> {
        let o = self.operands(op)?;
        let name = op.name.as_str();
        let rt = op.result_types.first();
        let res_sd = || {
            rt.and_then(shape_dt).ok_or_else(|| {
                InterpError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "unsupported result type {}",
                        rt.map(|t| t.to_string()).unwrap_or_default()
                    ),
                )
            })
        };
        let opnd_sd = |k: usize| {
            op.operand_types.get(k).and_then(shape_dt).ok_or_else(|| {
                InterpError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "unsupported operand type {}",
                        op.operand_types.get(k).map(|t| t.to_string()).unwrap_or_default()
                    ),
                )
            })
        };
        let arity = |n: usize| -> Result<()> {
            if o.len() < n {
                bail!(Malformed, "`{name}` needs {n} operands, has {}", o.len());
            }
            Ok(())
        };
        if let Some(b) = Bin::from_name(name) {
            arity(2)?;
            let (_, dt) = res_sd()?;
            return Ok(Kind::Bin { op: b, dt, a: o[0], b: o[1] });
        }
        if let Some(u) = Un::from_name(name) {
            arity(1)?;
            let (_, dt) = res_sd()?;
            return Ok(Kind::Un { op: u, dt, a: o[0] });
        }
        if let Some(c) = Cast::from_name(name) {
            arity(1)?;
            let (_, from) = opnd_sd(0)?;
            let (_, to) = res_sd()?;
            return Ok(Kind::Cast { op: c, from, to, a: o[0] });
        }
        Ok(match name {
            "arith.constant" => {
                let (shape, dt) = res_sd()?;
                let Some(v) = op.attr("value") else {
                    bail!(Malformed, "arith.constant without a value")
                };
                Kind::Const(constant(v, dt, &shape)?)
            }
            "arith.cmpi" | "arith.cmpf" => {
                arity(2)?;
                let (_, dt) = opnd_sd(0)?;
                let pred = match op.attr("predicate") {
                    Some(a) => match a.as_int() {
                        Some(p) => p,
                        None => bail!(Unsupported, "predicate {a}"),
                    },
                    None => bail!(Malformed, "missing predicate"),
                };
                Kind::Cmp { float: name == "arith.cmpf", pred, dt, a: o[0], b: o[1] }
            }
            "arith.select" => {
                arity(3)?;
                Kind::Select { c: o[0], t: o[1], f: o[2] }
            }
            "vector.broadcast" => {
                arity(1)?;
                let (shape, dt) = res_sd()?;
                let (from, _) = opnd_sd(0)?;
                if from.len() > shape.len() {
                    bail!(Malformed, "broadcast to a lower rank");
                }
                let pad = shape.len() - from.len();
                for (k, &d) in from.iter().enumerate() {
                    if d != 1 && d != shape[pad + k] {
                        bail!(
                            Malformed,
                            "cannot broadcast [{}] to [{}]",
                            crate::memory::join(&from),
                            crate::memory::join(&shape)
                        );
                    }
                }
                Kind::Broadcast { a: o[0], dt, shape }
            }
            "vector.shape_cast" => {
                arity(1)?;
                let (shape, _) = res_sd()?;
                let (from, _) = opnd_sd(0)?;
                if from.iter().product::<usize>() != shape.iter().product::<usize>() {
                    bail!(Malformed, "shape_cast changes the element count");
                }
                Kind::ShapeCast { a: o[0], shape }
            }
            "vector.load" | "tpu.load" => {
                arity(1)?;
                let (shape, dt) = res_sd()?;
                Kind::VLoad { base: o[0], idx: o[1..].to_vec(), shape, dt, steps: Vec::new() }
            }
            "tpu.strided_load" => {
                arity(1)?;
                let (shape, dt) = res_sd()?;
                let steps = positive_strides(op, o.len() - 1, name)?;
                Kind::VLoad { base: o[0], idx: o[1..].to_vec(), shape, dt, steps }
            }
            "tpu.strided_store" => {
                arity(2)?;
                let steps = positive_strides(op, o.len() - 2, name)?;
                Kind::VStore {
                    val: o[0],
                    base: o[1],
                    idx: o[2..].to_vec(),
                    mask: None,
                    add: false,
                    steps,
                }
            }
            "tpu.vector_store" => {
                let seg = segments(op, &[1, 1, 0, 0])?;
                let parts = split(&o, &seg, name)?;
                if let Some(st) = op.attr("strides").and_then(Attr::as_i64_list)
                    && !st.is_empty()
                    && st.iter().any(|&s| s != 1)
                {
                    bail!(Unsupported, "tpu.vector_store with strides {st:?}");
                }
                let add = op.attr("add").and_then(Attr::as_bool).unwrap_or(false);
                Kind::VStore {
                    val: parts[0][0],
                    base: parts[1][0],
                    idx: parts[2].to_vec(),
                    mask: parts[3].first().copied(),
                    add,
                    steps: Vec::new(),
                }
            }
            "vector.store" => {
                arity(2)?;
                Kind::VStore {
                    val: o[0],
                    base: o[1],
                    idx: o[2..].to_vec(),
                    mask: None,
                    add: false,
                    steps: Vec::new(),
                }
            }
            "memref.load" => {
                arity(1)?;
                Kind::MLoad { base: o[0], idx: o[1..].to_vec() }
            }
            "memref.store" => {
                arity(2)?;
                Kind::MStore { val: o[0], base: o[1], idx: o[2..].to_vec() }
            }
            "vector.multi_reduction" => {
                arity(2)?;
                let (_, dt) = res_sd()?;
                let kind = match op.attr("kind").and_then(|a| a.dialect("vector.kind")) {
                    Some("add") => RKind::Add,
                    Some("mul") => RKind::Mul,
                    Some("maximumf") => RKind::MaxF,
                    Some("minimumf") => RKind::MinF,
                    Some("maxnumf") => RKind::MaxNumF,
                    Some("minnumf") => RKind::MinNumF,
                    Some("maxsi") => RKind::MaxSI,
                    Some("minsi") => RKind::MinSI,
                    Some("maxui") => RKind::MaxUI,
                    Some("minui") => RKind::MinUI,
                    Some("and") => RKind::And,
                    Some("or") => RKind::Or,
                    Some("xor") => RKind::Xor,
                    k => bail!(Unsupported, "reduction kind {k:?}"),
                };
                let Some(dims) = op.attr("reduction_dims").and_then(Attr::as_i64_list) else {
                    bail!(Malformed, "missing reduction_dims")
                };
                Kind::Reduce {
                    kind,
                    dt,
                    a: o[0],
                    acc: o[1],
                    dims: dims.into_iter().map(|d| d as usize).collect(),
                }
            }
            "vector.extract" => {
                arity(1)?;
                let pos =
                    op.attr("static_position").and_then(Attr::as_i64_list).unwrap_or_default();
                Kind::Extract { a: o[0], pos, dyn_pos: o[1..].to_vec() }
            }
            "vector.extract_strided_slice" => {
                arity(1)?;
                let list = |k: &str| -> Result<Vec<usize>> {
                    op.attr(k)
                        .and_then(Attr::as_i64_list)
                        .map(|v| v.into_iter().map(|x| x as usize).collect())
                        .ok_or_else(|| {
                            InterpError::new(ErrorKind::Malformed, format!("missing {k}"))
                        })
                };
                Kind::ExtractSS {
                    a: o[0],
                    offsets: list("offsets")?,
                    sizes: list("sizes")?,
                    strides: list("strides")?,
                }
            }
            "tpu.matmul" => {
                arity(3)?;
                let (shape, out) = res_sd()?;
                let (ls, _) = opnd_sd(0)?;
                let (rs, _) = opnd_sd(1)?;
                let dims = match op.attr("dimension_numbers") {
                    Some(Attr::DotDims(d)) => d.clone(),
                    Some(a) => bail!(Malformed, "bad dimension_numbers {a}"),
                    None => {
                        // Old form: transpose_lhs / transpose_rhs on 2-D operands.
                        if ls.len() != 2 || rs.len() != 2 {
                            bail!(
                                Unsupported,
                                "tpu.matmul without dimension_numbers on rank-{} operands",
                                ls.len()
                            );
                        }
                        let tl = op.attr("transpose_lhs").and_then(Attr::as_bool).unwrap_or(false);
                        let tr = op.attr("transpose_rhs").and_then(Attr::as_bool).unwrap_or(false);
                        DotDims {
                            lhs_contract: vec![if tl { 0 } else { 1 }],
                            rhs_contract: vec![if tr { 1 } else { 0 }],
                            lhs_noncontract: vec![if tl { 1 } else { 0 }],
                            rhs_noncontract: vec![if tr { 0 } else { 1 }],
                            output_dim_order: vec![
                                0,
                                if tl { 1 } else { 0 },
                                1,
                                if tr { 0 } else { 1 },
                            ],
                            lhs_batch: vec![],
                            rhs_batch: vec![],
                        }
                    }
                };
                check_dot(&dims, &ls, &rs, &shape)?;
                let precision =
                    match op.attr("precision").and_then(|a| a.dialect("tpu.contract_precision")) {
                        None => Precision::Default,
                        Some("fp32") => Precision::Fp32,
                        Some("bf16x3") => Precision::Bf16x3,
                        Some("bf16") => Precision::Bf16,
                        Some(p) => bail!(Unsupported, "contract precision {p}"),
                    };
                Kind::Matmul { lhs: o[0], rhs: o[1], acc: o[2], dims, precision, out, shape }
            }
            "tpu.transpose" | "vector.transpose" => {
                arity(1)?;
                let Some(perm) = op.attr("permutation").and_then(Attr::as_i64_list) else {
                    bail!(Malformed, "missing permutation")
                };
                Kind::Transpose { a: o[0], perm: perm.into_iter().map(|p| p as usize).collect() }
            }
            "tpu.iota" => {
                let (shape, _) = res_sd()?;
                let dims = op
                    .attr("dimensions")
                    .and_then(Attr::as_i64_list)
                    .or_else(|| op.attr("dimension").and_then(Attr::as_int).map(|d| vec![d]))
                    .unwrap_or_default();
                match dims.as_slice() {
                    [d] if (*d as usize) < shape.len() => Kind::Iota { shape, dim: *d as usize },
                    _ => bail!(
                        Unsupported,
                        "tpu.iota with dimensions {dims:?} on shape [{}]",
                        crate::memory::join(&shape)
                    ),
                }
            }
            "tpu.concatenate" => {
                let Some(dim) = op.attr("dimension").and_then(Attr::as_int) else {
                    bail!(Malformed, "missing dimension")
                };
                Kind::Concat { xs: o.clone(), dim: dim as usize }
            }
            "tpu.log" => {
                let tag = match op.attr("tag") {
                    Some(Attr::String(s)) => s.clone(),
                    _ => bail!(Malformed, "tpu.log without a tag"),
                };
                let formatted = op.attr("formatted").and_then(Attr::as_bool).unwrap_or(false);
                Kind::Log { tag, formatted, args: o.clone() }
            }
            "tpu.dynamic_rotate" => {
                arity(2)?;
                let (shape, _) = opnd_sd(0)?;
                let dim = op.attr("dimension").and_then(Attr::as_int).unwrap_or(-1);
                if op.attr("stride").is_some() {
                    bail!(Unsupported, "tpu.dynamic_rotate with a stride");
                }
                match usize::try_from(dim) {
                    Ok(d) if d < shape.len() => Kind::Rotate { a: o[0], shift: o[1], dim: d },
                    _ => bail!(
                        Malformed,
                        "tpu.dynamic_rotate dimension {dim} for a rank-{} vector",
                        shape.len()
                    ),
                }
            }
            "tpu.reduce_index" => {
                arity(1)?;
                let (shape, dt) = opnd_sd(0)?;
                let axis = op.attr("axis").and_then(Attr::as_int).unwrap_or(-1);
                let max = match op.attr("kind").and_then(|a| a.dialect("tpu.reduction_kind")) {
                    Some("arg_max") => true,
                    Some("arg_min") => false,
                    k => bail!(Unsupported, "tpu.reduce_index kind {k:?}"),
                };
                if !dt.is_float() {
                    bail!(Unsupported, "tpu.reduce_index of {}", dt.name());
                }
                match usize::try_from(axis) {
                    Ok(d) if d < shape.len() => Kind::ReduceIndex { a: o[0], dim: d, max },
                    _ => bail!(
                        Malformed,
                        "tpu.reduce_index axis {axis} for a rank-{} vector",
                        shape.len()
                    ),
                }
            }
            "tpu.memref_slice" => {
                let seg = segments(op, &[1, (o.len() as i64 - 1).max(0), 0])?;
                let parts = split(&o, &seg, name)?;
                if !parts[2].is_empty() {
                    bail!(Unsupported, "tpu.memref_slice with dynamic sizes");
                }
                let Some((sizes, _, _)) = rt.and_then(memref_info) else {
                    bail!(Unsupported, "memref_slice result type")
                };
                Kind::Slice { base: parts[0][0], offs: parts[1].to_vec(), sizes }
            }
            "tpu.memref_squeeze" => {
                arity(1)?;
                let Some((shape, _, _)) = rt.and_then(memref_info) else {
                    bail!(Unsupported, "memref_squeeze result type")
                };
                Kind::Squeeze { base: o[0], shape }
            }
            "tpu.enqueue_dma" => {
                let names: &[&str] = match op
                    .attr("operandSegmentSizes")
                    .and_then(Attr::as_i64_list)
                    .map(|v| v.len())
                {
                    Some(7) | None => &[
                        "source",
                        "source_semaphore",
                        "target",
                        "target_semaphore",
                        "device_id",
                        "core_id",
                        "subcore_id",
                    ],
                    Some(6) => &[
                        "source",
                        "source_semaphore",
                        "target",
                        "target_semaphore",
                        "device_id",
                        "core_id",
                    ],
                    Some(n) => bail!(Unsupported, "tpu.enqueue_dma with {n} operand segments"),
                };
                let seg = segments(op, &[1, 0, 1, 1, 0, 0, 0][..names.len()])?;
                let parts = split(&o, &seg, name)?;
                let get = |n: &str| {
                    names.iter().position(|x| *x == n).and_then(|k| parts[k].first().copied())
                };
                if get("core_id").is_some() || get("subcore_id").is_some() {
                    bail!(
                        Unsupported,
                        "DMAs to another core (core_id/subcore_id): the interpreter models devices of a mesh, one core each"
                    );
                }
                let (Some(src), Some(dst)) = (get("source"), get("target")) else {
                    bail!(Malformed, "DMA without source/target")
                };
                let Some(sem) = get("target_semaphore") else {
                    bail!(Malformed, "tpu.enqueue_dma without a target_semaphore")
                };
                let remote = match (get("device_id"), get("source_semaphore")) {
                    (Some(device), Some(send)) => Some((send, device)),
                    (Some(_), None) => bail!(
                        Malformed,
                        "a remote tpu.enqueue_dma (device_id) without a source_semaphore"
                    ),
                    (None, _) => None,
                };
                Kind::Dma { src, dst, sem, remote }
            }
            "tpu.wait_dma2" => {
                // A remote copy's waits name a device (the receive) or device 0 core 0 (the
                // send, as Pallas writes it); either way the wait is on the semaphore.
                let seg = segments(op, &[1, 1, 1, 0, 0])?;
                let parts = split(&o, &seg, name)?;
                Kind::DmaWait { sem: parts[0][0], dst: parts[2][0] }
            }
            "tpu.wait_dma" => {
                arity(2)?;
                Kind::DmaWait { sem: o[0], dst: o[1] }
            }
            "tpu.sem_signal" => {
                let seg = segments(op, &[1, 1, 0, 0, 0])?;
                let parts = split(&o, &seg, name)?;
                if parts.len() > 3 && parts[3..].iter().any(|p| !p.is_empty()) {
                    bail!(
                        Unsupported,
                        "semaphore signals to another core (core_id/subcore_id): the interpreter models devices of a mesh, one core each"
                    );
                }
                Kind::SemSignal {
                    sem: parts[0][0],
                    amount: parts[1][0],
                    device: parts.get(2).and_then(|p| p.first().copied()),
                }
            }
            "tpu.sem_wait" => {
                arity(2)?;
                Kind::SemWait { sem: o[0], amount: o[1] }
            }
            "tpu.sem_read" => {
                arity(1)?;
                Kind::SemRead { sem: o[0] }
            }
            "tpu.sem_alloc" | "memref.alloca" | "memref.alloc" => {
                let Some((shape, dt, space)) = rt.and_then(memref_info) else {
                    bail!(
                        Unsupported,
                        "allocation of {}",
                        rt.map(|t| t.to_string()).unwrap_or_default()
                    )
                };
                Kind::Alloca { dt, shape, space }
            }
            "tpu.assume_multiple" => {
                arity(1)?;
                let m = op.attr("multiple").and_then(Attr::as_int).unwrap_or(1);
                Kind::AssumeMultiple { a: o[0], m }
            }
            "cf.assert" => {
                arity(1)?;
                let msg = match op.attr("msg") {
                    Some(Attr::String(s)) => s.clone(),
                    _ => "assertion failed".into(),
                };
                Kind::Assert { c: o[0], msg }
            }
            "tpu.iteration_bound" => {
                let dim = op.attr("dim").and_then(Attr::as_int).unwrap_or(0) as usize;
                Kind::IterationBound { dim }
            }
            "tpu.device_id" => Kind::DeviceId,
            "tpu.sem_barrier" => Kind::BarrierSemaphore,
            "tpu.core_id" => Kind::Const(Val::Int(0)),
            "tpu.trace_start" | "tpu.trace_stop" | "tpu.delay" | "tpu.log_buffer"
            | "tpu.trace_value" => Kind::Nop,
            "scf.if" => {
                arity(1)?;
                let then = self.region_block(op, 0, Some(0))?;
                let els = if op.regions.len() > 1 {
                    self.region_block(op, 1, Some(0))?
                } else {
                    CBlock::default()
                };
                Kind::If { c: o[0], then, els }
            }
            "scf.for" => {
                arity(3)?;
                let inits = o[3..].to_vec();
                let body = self.region_block(op, 0, Some(1 + inits.len()))?;
                Kind::For { lb: o[0], ub: o[1], step: o[2], inits, body }
            }
            "scf.while" => {
                let before = self.region_block(op, 0, Some(o.len()))?;
                let after = self.region_block(op, 1, None)?;
                Kind::While { inits: o.clone(), before, after }
            }
            "tpu.region" => Kind::Region { body: self.region_block(op, 0, Some(0))? },
            "func.func" => bail!(Malformed, "nested func.func"),
            _ => bail!(Unsupported, "op `{name}` is not implemented by the interpreter"),
        })
    }
}

fn check_dot(d: &DotDims, ls: &[usize], rs: &[usize], out: &[usize]) -> Result<()> {
    let ok = |xs: &[i64], r: usize| xs.iter().all(|&x| (x as usize) < r);
    if !ok(&d.lhs_contract, ls.len())
        || !ok(&d.lhs_noncontract, ls.len())
        || !ok(&d.lhs_batch, ls.len())
        || !ok(&d.rhs_contract, rs.len())
        || !ok(&d.rhs_noncontract, rs.len())
        || !ok(&d.rhs_batch, rs.len())
    {
        bail!(
            Malformed,
            "dimension numbers {d:?} out of range for operands [{}] and [{}]",
            crate::memory::join(ls),
            crate::memory::join(rs)
        );
    }
    if d.lhs_contract.len() != d.rhs_contract.len() || d.lhs_batch.len() != d.rhs_batch.len() {
        bail!(Malformed, "dimension numbers {d:?}: contracting/batch lists differ in length");
    }
    for (a, b) in
        d.lhs_contract.iter().zip(&d.rhs_contract).chain(d.lhs_batch.iter().zip(&d.rhs_batch))
    {
        if ls[*a as usize] != rs[*b as usize] {
            bail!(
                Mismatch,
                "contracted/batch dims differ: lhs dim {a} is {}, rhs dim {b} is {}",
                ls[*a as usize],
                rs[*b as usize]
            );
        }
    }
    if d.output_dim_order.len() != 2 * out.len() {
        bail!(
            Malformed,
            "output_dim_order {:?} does not match a rank-{} result",
            d.output_dim_order,
            out.len()
        );
    }
    for (k, pair) in d.output_dim_order.chunks(2).enumerate() {
        let n = if pair[0] == 0 { ls.get(pair[1] as usize) } else { rs.get(pair[1] as usize) };
        if n != Some(&out[k]) {
            bail!(
                Mismatch,
                "result dim {k} is {} but output_dim_order names operand {} dim {} ({:?})",
                out[k],
                pair[0],
                pair[1],
                n
            );
        }
    }
    Ok(())
}

/// `operandSegmentSizes`, or `default` with the last variable segment absorbing the rest.
/// The `strides` of a strided load or store: one positive stride per index.
fn positive_strides(op: &Operation, rank: usize, name: &str) -> Result<Vec<usize>> {
    let Some(st) = op.attr("strides").and_then(Attr::as_i64_list) else {
        bail!(Malformed, "{name} without strides")
    };
    if st.len() != rank || st.iter().any(|&s| s < 1) {
        bail!(
            Malformed,
            "{name} strides {st:?} for {rank} indices (one positive stride per index)"
        );
    }
    Ok(st.into_iter().map(|s| s as usize).collect())
}

fn segments(op: &Operation, default: &[i64]) -> Result<Vec<i64>> {
    if let Some(s) = op.attr("operandSegmentSizes").and_then(Attr::as_i64_list) {
        let total = s.iter().try_fold(0usize, |t, &n| t.checked_add(usize::try_from(n).ok()?));
        if total != Some(op.operands.len()) {
            bail!(
                Malformed,
                "operandSegmentSizes {s:?} does not add up to {} operands",
                op.operands.len()
            );
        }
        return Ok(s);
    }
    let mut d = default.to_vec();
    let fixed: i64 = d.iter().sum();
    if let Some(k) = d.iter().position(|&x| x == 0) {
        d[k] = op.operands.len() as i64 - fixed;
    }
    Ok(d)
}

fn split<'s>(o: &'s [Slot], seg: &[i64], name: &str) -> Result<Vec<&'s [Slot]>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for &n in seg {
        let n = n.max(0) as usize;
        if at + n > o.len() {
            bail!(Malformed, "`{name}`: operand segments {seg:?} exceed its {} operands", o.len());
        }
        out.push(&o[at..at + n]);
        at += n;
    }
    if out.first().is_some_and(|s| s.is_empty()) || out.len() < 2 {
        bail!(Malformed, "`{name}`: bad operand segments {seg:?}");
    }
    Ok(out)
}

fn elem_f(e: DenseElem, dt: DType) -> f64 {
    match e {
        DenseElem::Int(i) => i as f64,
        DenseElem::Bits(b) => match dt {
            DType::F32 => f64::from(f32::from_bits(b as u32)),
            DType::Bf16 => f64::from(half::bf16::from_bits(b as u16).to_f32()),
            DType::F16 => f64::from(half::f16::from_bits(b as u16).to_f32()),
            _ => f64::from_bits(b as u64),
        },
        DenseElem::Float(f) => f,
        DenseElem::Bool(b) => f64::from(u8::from(b)),
    }
}

fn elem_i(e: DenseElem) -> i64 {
    match e {
        DenseElem::Int(i) => i as i64,
        DenseElem::Bits(b) => b as i64,
        DenseElem::Float(f) => f as i64,
        DenseElem::Bool(b) => i64::from(b),
    }
}

/// The value of an `arith.constant`.
fn constant(v: &Attr, dt: DType, shape: &Shape) -> Result<Val> {
    let n: usize = shape.iter().product();
    let scalar = |a: &Attr| -> Result<Val> {
        Ok(match a {
            Attr::Int { value, .. } if dt.is_float() => {
                Val::Float(f64::from(round_f(dt, *value as f32)))
            }
            Attr::Int { value, .. } => Val::Int(wrap_i(dt, *value as i64)),
            Attr::Float { value, .. } if dt.is_float() => {
                Val::Float(f64::from(round_f(dt, *value as f32)))
            }
            Attr::Bool(b) => Val::Int(i64::from(*b)),
            other => bail!(Unsupported, "constant {other}"),
        })
    };
    if shape.is_empty() && !matches!(v, Attr::Dense { .. } | Attr::DenseHex { .. }) {
        return scalar(v);
    }
    let data = match v {
        Attr::Dense { elems, splat, .. } => {
            if !*splat && elems.len() != n {
                bail!(Malformed, "dense constant has {} elements for {n}", elems.len());
            }
            let get = |k: usize| elems[if *splat { 0 } else { k }];
            if dt.is_float() {
                Data::F((0..n).map(|k| round_f(dt, elem_f(get(k), dt) as f32)).collect())
            } else {
                Data::I((0..n).map(|k| wrap_i(dt, elem_i(get(k))) as i32).collect())
            }
        }
        Attr::DenseHex { bytes, .. } => {
            let w = dt.size();
            let count = bytes.len() / w.max(1);
            if count != 1 && count != n {
                bail!(Malformed, "dense hex constant has {count} elements for {n}");
            }
            let at = |k: usize| -> u64 {
                let k = if count == 1 { 0 } else { k };
                let mut x = 0u64;
                for b in 0..w {
                    x |= u64::from(bytes[k * w + b]) << (8 * b);
                }
                x
            };
            match dt {
                DType::F32 => Data::F((0..n).map(|k| f32::from_bits(at(k) as u32)).collect()),
                DType::Bf16 => {
                    Data::F((0..n).map(|k| half::bf16::from_bits(at(k) as u16).to_f32()).collect())
                }
                DType::F16 => {
                    Data::F((0..n).map(|k| half::f16::from_bits(at(k) as u16).to_f32()).collect())
                }
                DType::Bool => Data::I((0..n).map(|k| i32::from(at(k) != 0)).collect()),
                d if !d.is_float() => {
                    Data::I((0..n).map(|k| wrap_i(d, at(k) as i64) as i32).collect())
                }
                d => bail!(Unsupported, "dense hex constant of {d}"),
            }
        }
        other => {
            let s = scalar(other)?;
            return Ok(if shape.is_empty() {
                s
            } else {
                Val::Tile(Tile::splat(dt, shape.clone(), &s))
            });
        }
    };
    if shape.is_empty() {
        return Ok(Tile::new(dt, Shape::from_elem(1, 1), data).get(0));
    }
    Ok(Val::Tile(Tile::new(dt, shape.clone(), data)))
}

fn func_attrs(op: &Operation) -> Result<(String, Vec<Type>, Vec<Type>)> {
    let name = match op.attr("sym_name") {
        Some(Attr::String(s)) => s.clone(),
        _ => bail!(Malformed, "func.func without sym_name"),
    };
    let (ins, outs) = match op.attr("function_type") {
        Some(Attr::Type(Type::Function { inputs, results })) => (inputs.clone(), results.clone()),
        _ => bail!(Malformed, "func.func @{name} without function_type"),
    };
    Ok((name, ins, outs))
}

pub(crate) fn prepare(m: &ModuleAst, text: &str) -> Result<Program> {
    let mut cx = Cx {
        lines: text.lines().collect(),
        sites: Vec::new(),
        func: String::new(),
        scopes: Vec::new(),
        next: 0,
    };
    // Find the functions.
    let mut funcs_ast = Vec::new();
    for op in &m.ops {
        if op.name == "func.func" {
            funcs_ast.push(op);
        } else {
            let e = InterpError::new(
                ErrorKind::Unsupported,
                format!("top-level op `{}` is not a func.func", op.name),
            );
            return Err(e);
        }
    }
    let is_kernel = |op: &&&Operation| {
        op.attr("tpu.core_type").and_then(|a| a.dialect("tpu.core_type")) == Some("tc")
    };
    let kernel_ast = funcs_ast.iter().find(is_kernel).or_else(|| {
        funcs_ast
            .iter()
            .find(|op| matches!(op.attr("sym_name"), Some(Attr::String(s)) if s == "main"))
    });
    let Some(kernel_ast) = kernel_ast.copied() else {
        bail!(
            Malformed,
            "no kernel: no func.func has tpu.core_type = #tpu.core_type<tc> (and none is named main)"
        )
    };

    let compile = |cx: &mut Cx<'_>, op: &Operation| -> Result<Func> {
        let (name, ins, outs) = func_attrs(op)?;
        cx.func = name.clone();
        cx.next = 0;
        cx.scopes.clear();
        let Some(region) = op.regions.first() else { bail!(Malformed, "@{name} has no body") };
        if region.blocks.len() != 1 {
            bail!(Unsupported, "@{name}: functions with several blocks are not supported");
        }
        let body = cx.block(&region.blocks[0], Some(ins.len()))?;
        Ok(Func { name, nslots: cx.next as usize, body, arg_types: ins, result_types: outs })
    };

    let kernel = compile(&mut cx, kernel_ast)?;
    let attr = |n: &str| kernel_ast.attr(n);
    let grid = attr("iteration_bounds").and_then(Attr::as_i64_list).unwrap_or_default();
    if grid.iter().any(|&g| g < 0) {
        bail!(Unsupported, "dynamic grid dimensions (iteration_bounds {grid:?})");
    }
    if grid.iter().try_fold(1i64, |n, &g| n.checked_mul(g)).is_none() {
        bail!(Malformed, "iteration_bounds {grid:?}: the grid has more than 2^63 steps");
    }
    let parallel = match attr("dimension_semantics") {
        None => vec![false; grid.len()],
        Some(Attr::Array(xs)) if xs.len() == grid.len() => xs
            .iter()
            .map(|x| match x.dialect("tpu.dimension_semantics") {
                Some("parallel" | "core_parallel") => Ok(true),
                Some("arbitrary") => Ok(false),
                _ => bail!(Unsupported, "dimension_semantics entry {x} (expected #tpu.dimension_semantics<parallel> or <arbitrary>)"),
            })
            .collect::<Result<_>>()?,
        Some(other) => bail!(Malformed, "dimension_semantics {other} for a grid of {} dims", grid.len()),
    };
    let count = |n: &str| -> Result<usize> {
        let v = attr(n).and_then(Attr::as_int).unwrap_or(0);
        usize::try_from(v).map_err(|_| InterpError::new(ErrorKind::Malformed, format!("{n} = {v}")))
    };
    let scalar_prefetch = count("scalar_prefetch")?;
    let scratch = count("scratch_operands")?;
    let mut funcs = Vec::new();
    let mut by_name = HashMap::new();
    for op in &funcs_ast {
        if std::ptr::eq(*op, kernel_ast) {
            continue;
        }
        let f = compile(&mut cx, op)?;
        by_name.insert(f.name.clone(), funcs.len());
        funcs.push(f);
    }
    let windows = match attr("window_params") {
        None => None,
        Some(Attr::Array(ws)) => {
            let mut out = Vec::new();
            for w in ws {
                let Attr::Dict(kv) = w else {
                    bail!(Malformed, "window_params entry {w} is not a dictionary")
                };
                let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v);
                let transform = match get("transform_indices") {
                    None => None,
                    Some(Attr::SymbolRef(s)) => match by_name.get(s) {
                        Some(&i) => Some(i),
                        None => bail!(Malformed, "window_params names @{s}, which is not defined"),
                    },
                    Some(other) => bail!(
                        Unsupported,
                        "transform_indices {other} (only symbol references are supported)"
                    ),
                };
                let element_pads = match get("window_kind") {
                    None => None,
                    Some(kind) => {
                        match kind.dialect("tpu.element_window").and_then(element_window_pads) {
                            Some(pads) => Some(pads),
                            None => bail!(
                                Unsupported,
                                "window_kind {kind} (expected #tpu.element_window<[before..], [after..]>)"
                            ),
                        }
                    }
                };
                // Here a window is copied in (or written back) at the step its block changes,
                // so one buffer or two compute the same: only the mode's spelling is checked.
                if let Some(mode) = get("pipeline_mode")
                    && !matches!(
                        mode.dialect("tpu.pipeline_mode"),
                        Some("synchronous" | "double_buffered")
                    )
                {
                    bail!(
                        Unsupported,
                        "pipeline_mode {mode} (expected #tpu.pipeline_mode<synchronous> or <double_buffered>)"
                    );
                }
                let bounds = match get("window_bounds").and_then(Attr::as_i64_list) {
                    Some(v) => Some(
                        v.into_iter()
                            .map(|x| {
                                usize::try_from(x).map_err(|_| {
                                    InterpError::new(
                                        ErrorKind::Malformed,
                                        format!("window_bounds {x}"),
                                    )
                                })
                            })
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                if let (Some(p), Some(b)) = (&element_pads, &bounds)
                    && p.len() != b.len()
                {
                    bail!(
                        Malformed,
                        "window_kind pads {} dims, window_bounds has {}",
                        p.len(),
                        b.len()
                    );
                }
                out.push(WindowParam { transform, bounds, element_pads });
            }
            Some(out)
        }
        Some(other) => bail!(Malformed, "window_params {other}"),
    };
    if windows.is_none() && !grid.is_empty() {
        bail!(Malformed, "a grid without window_params");
    }
    let g = grid.len();
    let nargs = kernel.arg_types.len();
    let nwin = windows.as_ref().map(Vec::len);
    let fixed =
        g.checked_add(scalar_prefetch).and_then(|n| n.checked_add(scratch)).filter(|&n| n <= nargs);
    if fixed.is_none() {
        bail!(
            Malformed,
            "@{}: {nargs} arguments, fewer than grid {g} + scalar_prefetch {scalar_prefetch} + scratch {scratch}",
            kernel.name
        );
    }
    if let Some(n) = nwin
        && g + scalar_prefetch + n + scratch != nargs
    {
        bail!(
            Malformed,
            "@{}: {nargs} arguments, but grid {g} + scalar_prefetch {scalar_prefetch} + window_params {n} + scratch {scratch}",
            kernel.name
        );
    }
    for (k, t) in kernel.arg_types.iter().enumerate() {
        if k < g {
            if *t != Type::Int(32) {
                bail!(Malformed, "@{}: grid argument {k} is {t}, expected i32", kernel.name);
            }
        } else if memref_info(t).is_none() {
            bail!(Unsupported, "@{}: argument {k} has unsupported type {t}", kernel.name);
        }
    }
    Ok(Program {
        kernel,
        funcs,
        sites: cx.sites,
        grid,
        parallel,
        scalar_prefetch,
        scratch,
        windows,
        widened: Default::default(),
    })
}

#[allow(dead_code)]
pub(crate) fn site_err(kind: ErrorKind, site: &OpSite, msg: String) -> InterpError {
    err_at(kind, site, msg)
}

/// The per-dim `(before, after)` paddings of an `element_window` body `[0, 0], [8, 0]`.
fn element_window_pads(body: &str) -> Option<Vec<(usize, usize)>> {
    let list = |t: &str| -> Option<Vec<usize>> {
        let inner = t.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
        if inner.is_empty() {
            Some(Vec::new())
        } else {
            inner.split(',').map(|x| x.trim().parse().ok()).collect()
        }
    };
    let (before, after) = body.split_once("],")?;
    let (before, after) = (list(&format!("{before}]"))?, list(after)?);
    (before.len() == after.len()).then(|| before.into_iter().zip(after).collect())
}
