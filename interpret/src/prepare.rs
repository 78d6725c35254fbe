//! Prepare once: translate the parsed module into numbered value slots and typed
//! instructions (whole vector tiles per instruction), resolving every attribute, type and
//! shape up front so running does no name lookups or attribute parsing.

use crate::error::{ErrorKind, InterpError, OpSite, Result, bail};
use crate::memory::Space;
use crate::parse::{Attr, Block, ModuleAst, Operation, Pos, Type};
use crate::rules::{self, At, Kind};
use crate::value::{DType, Shape};
use smallvec::SmallVec;
use std::collections::HashMap;

pub(crate) type Slot = u32;

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

pub(crate) struct Cx<'a> {
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

    pub(crate) fn region_block(
        &mut self,
        op: &Operation,
        k: usize,
        args: Option<usize>,
    ) -> Result<CBlock> {
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
        let at = At { op, o: self.operands(op)? };
        rules::prepare(self, &at)
    }
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
