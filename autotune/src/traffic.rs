//! The static pipeline traffic model: what the Pallas grid pipeline moves between HBM and
//! VMEM for one kernel, computed from the call spec and the traced index maps alone.
//!
//! Pallas runs the grid as nested loops (lexicographic order, last dim fastest). Before each
//! step the pipeline evaluates every windowed operand's index map; an input block is
//! DMA'd HBM→VMEM only when its block index differs from the previous step's (the first step
//! always fetches), and an output block is written back VMEM→HBM when the next step moves to
//! another block index (and once more after the last step). That is what makes block sizes
//! matter: in the tiled matmul, `x`'s index `(i, kk)` changes at every step, so `x` is read
//! once per `j`, i.e. `n / bn` times over.
//!
//! This module reproduces that rule exactly, evaluating the index maps with a small
//! interpreter for the scalar `i32` ops index maps are made of. It also reports the VMEM
//! footprint (the verifier's accounting: padded tiles, windowed blocks double-buffered) and
//! the MXU flops of the `dot`s in the body. Anything it cannot evaluate exactly is an error
//! ([`TrafficError`]) rather than a guess; the few things it deliberately does not model
//! (manual DMAs on HBM/ANY operands, `dot`s under `if`) are listed in [`Traffic::notes`].

use indexmap::IndexMap;
use palladium_dsl::Kernel;
use palladium_dsl::ir::{
    BinaryOp, Block, DType, Index, Literal, MemorySpace, Offset, OpData, Type, Value,
    padded_vmem_bytes,
};
use palladium_dsl::spec::{BlockDim, OperandRole, OperandSpec};
use serde::Serialize;
use std::collections::HashMap;

/// Why the traffic of a kernel could not be modelled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrafficError {
    /// An index map uses an op the evaluator does not know. Index maps are expected to be
    /// small scalar `i32` programs; anything else is reported, not approximated.
    #[error("index map of `{operand}`: op `{op}` is not supported by the index-map evaluator")]
    UnsupportedOp { operand: String, op: String },
    #[error("index map of `{operand}`: {message}")]
    BadIndexMap { operand: String, message: String },
    #[error("index map of `{operand}` at grid point {point:?}: {message}")]
    Eval { operand: String, point: Vec<i64>, message: String },
    #[error("prefetch contents for `{name}`: {message}")]
    BadPrefetch { name: String, message: String },
    #[error("body: {0}")]
    Body(String),
}

/// Concrete contents of the scalar-prefetch arrays, which index maps may read (block-sparse
/// and gather kernels pick their blocks through them). An array without explicit contents
/// gets the default `a[i] = i % len` (row-major flat index `i`, `len` its element count):
/// an identity-like table that keeps every id in range.
#[derive(Clone, Debug, Default)]
pub struct Prefetch {
    contents: IndexMap<String, Vec<i32>>,
}

impl Prefetch {
    pub fn new() -> Prefetch {
        Prefetch::default()
    }

    /// Use `values` (row-major) for the prefetch operand `name`.
    pub fn with(mut self, name: impl Into<String>, values: Vec<i32>) -> Prefetch {
        self.contents.insert(name.into(), values);
        self
    }

    fn contents_for(&self, o: &OperandSpec) -> Result<Vec<i32>, TrafficError> {
        let len = o.shape.num_elements();
        match self.contents.get(&o.name) {
            Some(v) if v.len() as u64 == len => Ok(v.clone()),
            Some(v) => Err(TrafficError::BadPrefetch {
                name: o.name.clone(),
                message: format!("{} values given, the array {} has {len}", v.len(), o.shape),
            }),
            None => {
                let len = i64::try_from(len).unwrap_or(i64::MAX).max(1);
                Ok((0..len).map(|i| (i % len) as i32).collect())
            }
        }
    }
}

/// The traffic of one windowed operand over the whole grid.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperandTraffic {
    pub name: String,
    /// `input` or `output`.
    pub role: &'static str,
    /// Bytes of one full block in HBM (unpadded).
    pub block_bytes: u64,
    /// Number of block DMAs (fetches for inputs, write-backs for outputs).
    pub dmas: u64,
    /// Bytes moved by those DMAs (edge blocks clipped to the array).
    pub bytes: u64,
}

/// What the grid pipeline of one kernel moves and computes, per the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Traffic {
    /// Product of the grid extents (1 for a grid-less kernel).
    pub grid_steps: u64,
    /// HBM→VMEM bytes: input block fetches plus the scalar-prefetch arrays (read once).
    pub hbm_read_bytes: u64,
    /// VMEM→HBM bytes: output block write-backs.
    pub hbm_write_bytes: u64,
    /// Bytes of the scalar-prefetch arrays (included in `hbm_read_bytes`).
    pub prefetch_bytes: u64,
    /// One entry per windowed input/output, in call order.
    pub operands: Vec<OperandTraffic>,
    /// VMEM the kernel holds: windowed VMEM blocks ×2 (double buffering) plus scratch and
    /// scoped VMEM, each padded to the native tile ([`padded_vmem_bytes`]).
    pub vmem_bytes: u64,
    /// MXU flops (2 per multiply-add) of the `dot`s one grid step executes.
    pub mxu_flops_per_step: u64,
    /// `mxu_flops_per_step * grid_steps`.
    pub mxu_flops: u64,
    /// What the model knowingly left out or bounded.
    pub notes: Vec<String>,
}

impl Traffic {
    pub fn hbm_bytes(&self) -> u64 {
        self.hbm_read_bytes + self.hbm_write_bytes
    }
}

/// Model the pipeline traffic of `kernel` with the given prefetch contents.
pub fn analyze(kernel: &Kernel, prefetch: &Prefetch) -> Result<Traffic, TrafficError> {
    let call = &kernel.call;
    let extents: Vec<u64> = call.grid.iter().map(|g| g.extent).collect();
    let grid_steps: u64 = extents.iter().product();
    let mut notes = Vec::new();

    // Scalar prefetch: copied to SMEM once, before the grid starts.
    let prefetch_ops: Vec<&OperandSpec> = call.operands_of(OperandRole::Prefetch).collect();
    let tables: Vec<Vec<i32>> =
        prefetch_ops.iter().map(|o| prefetch.contents_for(o)).collect::<Result<_, _>>()?;
    let prefetch_bytes: u64 =
        prefetch_ops.iter().map(|o| array_bytes(o.dtype, o.shape.num_elements())).sum();

    // One tracker per windowed operand.
    let mut trackers = Vec::new();
    for o in &call.operands {
        if o.role == OperandRole::Prefetch {
            continue;
        }
        if !o.is_windowed() {
            notes.push(format!(
                "`{}` is in {} and moved by manual DMAs in the body: its traffic is not modelled",
                o.name, o.space
            ));
            continue;
        }
        let program = match o.index_map {
            Some(map) if !extents.is_empty() => Some(MapProgram::compile(kernel, o, map)?),
            // Grid-less kernels (or whole-array operands): one block, the whole array.
            _ => None,
        };
        trackers.push(Tracker { spec: o, program, prev: None, dmas: 0, bytes: 0 });
    }

    // Walk the grid in Pallas order: lexicographic, last dim fastest.
    let mut point = vec![0i64; extents.len()];
    let mut scratch = Vec::new();
    let mut idx = Vec::new();
    for step in 0..grid_steps {
        for t in &mut trackers {
            idx.clear();
            match &t.program {
                Some(p) => p.eval(&point, &tables, &mut scratch, &mut idx).map_err(|message| {
                    TrafficError::Eval {
                        operand: t.spec.name.clone(),
                        point: point.clone(),
                        message,
                    }
                })?,
                None => idx.resize(t.spec.shape.rank(), 0),
            }
            let changed = t.prev.as_deref() != Some(idx.as_slice());
            if changed {
                let bytes = block_bytes(t.spec, &idx).map_err(|message| TrafficError::Eval {
                    operand: t.spec.name.clone(),
                    point: point.clone(),
                    message,
                })?;
                match t.spec.role {
                    // Inputs: fetch the new block.
                    OperandRole::Input => {
                        t.dmas += 1;
                        t.bytes += bytes;
                    }
                    // Outputs: the block just left is written back.
                    _ => {
                        if let Some(prev) = &t.prev {
                            t.dmas += 1;
                            t.bytes +=
                                block_bytes(t.spec, prev).expect("checked when it was entered");
                        }
                    }
                }
                t.prev = Some(idx.clone());
            }
        }
        if step + 1 < grid_steps {
            advance(&mut point, &extents);
        }
    }
    // After the last step every output writes back the block it holds.
    for t in &mut trackers {
        if t.spec.role == OperandRole::Output
            && let Some(prev) = &t.prev
        {
            t.dmas += 1;
            t.bytes += block_bytes(t.spec, prev).expect("checked when it was entered");
        }
    }

    let operands: Vec<OperandTraffic> = trackers
        .iter()
        .map(|t| OperandTraffic {
            name: t.spec.name.clone(),
            role: if t.spec.role == OperandRole::Input { "input" } else { "output" },
            block_bytes: array_bytes(t.spec.dtype, t.spec.window_shape().num_elements()),
            dmas: t.dmas,
            bytes: t.bytes,
        })
        .collect();
    let read: u64 = operands.iter().filter(|o| o.role == "input").map(|o| o.bytes).sum();
    let write: u64 = operands.iter().filter(|o| o.role == "output").map(|o| o.bytes).sum();

    let mxu_flops_per_step = body_dot_flops(kernel, kernel.entry, 1, &mut notes)?;
    Ok(Traffic {
        grid_steps,
        hbm_read_bytes: read + prefetch_bytes,
        hbm_write_bytes: write,
        prefetch_bytes,
        operands,
        vmem_bytes: vmem_footprint(kernel),
        mxu_flops_per_step,
        mxu_flops: mxu_flops_per_step * grid_steps,
        notes,
    })
}

/// VMEM footprint with the verifier's accounting (`palladium_dsl::ir::verify`'s budget
/// check): windowed VMEM operands are double-buffered by the pipeline, whole-array VMEM
/// operands and scratch/scoped VMEM buffers are held once; all padded to the native tile.
pub fn vmem_footprint(kernel: &Kernel) -> u64 {
    use palladium_dsl::ir::BufOrigin;
    let gridded = !kernel.call.grid.is_empty();
    let operands: u64 = kernel
        .call
        .operands
        .iter()
        .filter(|o| o.space == MemorySpace::Vmem)
        .map(|o| {
            let buffers = if gridded && o.block.is_some() { 2 } else { 1 };
            buffers * padded_vmem_bytes(o.dtype, &o.window_shape())
        })
        .sum();
    let scratch: u64 = kernel
        .bufs
        .values()
        .filter(|b| {
            matches!(b.origin, BufOrigin::Scratch(_) | BufOrigin::Scoped(_))
                && b.ty.space == MemorySpace::Vmem
        })
        .map(|b| padded_vmem_bytes(b.ty.dtype, &b.ty.shape))
        .sum();
    operands + scratch
}

struct Tracker<'a> {
    spec: &'a OperandSpec,
    program: Option<MapProgram>,
    prev: Option<Vec<i64>>,
    dmas: u64,
    bytes: u64,
}

fn array_bytes(dtype: DType, elements: u64) -> u64 {
    (elements * u64::from(dtype.memory_bits())).div_ceil(8)
}

/// Next grid point in lexicographic order (last dim fastest).
fn advance(point: &mut [i64], extents: &[u64]) {
    for d in (0..point.len()).rev() {
        point[d] += 1;
        if (point[d] as u64) < extents[d] {
            return;
        }
        point[d] = 0;
    }
}

/// HBM bytes of the block at block index `idx` (element offsets for element windows): each
/// dim's window clipped to the array (a partial edge block, or an element window's padding,
/// moves only its in-bounds part). Out-of-range indices are errors.
fn block_bytes(o: &OperandSpec, idx: &[i64]) -> Result<u64, String> {
    let dims: Vec<BlockDim> = match &o.block {
        Some(b) => b.clone(),
        None => o.shape.dims().iter().map(|&n| BlockDim::Blocked(n)).collect(),
    };
    if idx.len() != dims.len() {
        return Err(format!("{} block indices for a rank-{} array", idx.len(), dims.len()));
    }
    let mut elements = 1u64;
    for (d, ((&i, b), &n)) in idx.iter().zip(&dims).zip(o.shape.dims()).enumerate() {
        if let BlockDim::Element { size, pad: (lo, hi) } = *b {
            let Some(first) = u64::try_from(i).ok().filter(|&s| s + size <= n + lo + hi) else {
                return Err(format!(
                    "element offset {i} in dim {d}: its window of {size} is outside the array (dim {n}, padded by {lo} and {hi})"
                ));
            };
            elements *= (first + size).min(n + lo).saturating_sub(first.max(lo));
            continue;
        }
        let b = b.extent();
        let start = u64::try_from(i).ok().and_then(|i| i.checked_mul(b)).filter(|&s| s < n);
        let Some(start) = start else {
            return Err(format!(
                "block index {i} in dim {d} is outside the array (dim {n}, block {b})"
            ));
        };
        elements *= b.min(n - start);
    }
    Ok(array_bytes(o.dtype, elements))
}

// --- the index-map evaluator ----------------------------------------------------------------

/// Where an index-map operand comes from.
#[derive(Copy, Clone, Debug)]
enum Arg {
    Slot(usize),
    Imm(i64),
}

#[derive(Clone, Debug)]
enum Instr {
    Const(i64),
    Copy(Arg),
    Binary(BinaryOp, Arg, Arg),
    /// A scalar load from prefetch array `table` (row-major, `dims`).
    Load {
        table: usize,
        offsets: Vec<Arg>,
        dims: Vec<u64>,
    },
}

/// An index map compiled to straight-line code over `i32` slots: slots `0..rank` are the
/// grid indices, each instruction writes the next slot, `outputs` are the yielded slots.
#[derive(Clone, Debug)]
struct MapProgram {
    grid_rank: usize,
    instrs: Vec<Instr>,
    outputs: Vec<Arg>,
}

/// What an index-map value is during compilation.
#[derive(Copy, Clone)]
enum Bound {
    Scalar(usize),
    Prefetch(usize),
}

impl MapProgram {
    fn compile(k: &Kernel, o: &OperandSpec, map: Block) -> Result<MapProgram, TrafficError> {
        let bad = |message: String| TrafficError::BadIndexMap { operand: o.name.clone(), message };
        let grid_rank = k.call.grid.len();
        let n_prefetch = k.call.operands_of(OperandRole::Prefetch).count();
        let params = &k.blocks[map].params;
        if params.len() != grid_rank + n_prefetch {
            return Err(bad(format!(
                "takes {} parameters, expected {grid_rank} grid indices and {n_prefetch} prefetch refs",
                params.len()
            )));
        }
        let mut env: HashMap<Value, Bound> = HashMap::new();
        for (i, &p) in params.iter().enumerate() {
            env.insert(
                p,
                if i < grid_rank { Bound::Scalar(i) } else { Bound::Prefetch(i - grid_rank) },
            );
        }
        let scalar = |env: &HashMap<Value, Bound>, v: Value| -> Result<Arg, TrafficError> {
            match env.get(&v) {
                Some(Bound::Scalar(s)) => Ok(Arg::Slot(*s)),
                Some(Bound::Prefetch(_)) => {
                    Err(bad(format!("{v} is a prefetch ref used as a scalar")))
                }
                None => Err(bad(format!("{v} is not defined inside the index map"))),
            }
        };
        let mut instrs = Vec::new();
        let mut outputs = None;
        for &op in &k.blocks[map].ops {
            let node = &k.ops[op];
            if outputs.is_some() {
                return Err(bad("ops after the yield".into()));
            }
            let instr = match &node.data {
                OpData::Constant { value: Literal::Int(v), ty: Type::Scalar(DType::I32) } => {
                    Instr::Const(i64::from(
                        i32::try_from(*v)
                            .map_err(|_| bad(format!("constant {v} does not fit in i32")))?,
                    ))
                }
                OpData::Constant { value, ty } => {
                    return Err(bad(format!(
                        "constant {value} of type {ty}: index maps compute in scalar i32"
                    )));
                }
                OpData::Binary { op: bop, lhs, rhs } => match bop {
                    BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Mul
                    | BinaryOp::Div
                    | BinaryOp::Rem
                    | BinaryOp::Min
                    | BinaryOp::Max => {
                        Instr::Binary(*bop, scalar(&env, *lhs)?, scalar(&env, *rhs)?)
                    }
                    _ => {
                        return Err(TrafficError::UnsupportedOp {
                            operand: o.name.clone(),
                            op: node.data.mnemonic(),
                        });
                    }
                },
                // A promise about divisibility: the value itself is unchanged.
                OpData::AssumeMultiple { x, .. } => Instr::Copy(scalar(&env, *x)?),
                OpData::Load { src, index } => {
                    let Some(Bound::Prefetch(table)) = env.get(src).copied() else {
                        return Err(bad(format!(
                            "load from {src}, which is not a scalar-prefetch ref"
                        )));
                    };
                    let dims = match k.ty(*src) {
                        Type::Ref(r) => r.shape.dims().to_vec(),
                        t => return Err(bad(format!("load from a {t}"))),
                    };
                    if index.len() != dims.len() {
                        return Err(bad(format!(
                            "load with {} indices from a rank-{} ref",
                            index.len(),
                            dims.len()
                        )));
                    }
                    let mut offsets = Vec::new();
                    for ix in index {
                        offsets.push(match ix {
                            Index::Point(Offset::Static(i)) => Arg::Imm(*i),
                            Index::Point(Offset::Dynamic(v)) => scalar(&env, *v)?,
                            Index::Slice { .. } => return Err(bad("vector loads in an index map (only scalar SMEM loads are evaluated)".into())),
                        });
                    }
                    Instr::Load { table, offsets, dims }
                }
                OpData::Yield { values } => {
                    outputs = Some(
                        values.iter().map(|&v| scalar(&env, v)).collect::<Result<Vec<_>, _>>()?,
                    );
                    continue;
                }
                _ => {
                    return Err(TrafficError::UnsupportedOp {
                        operand: o.name.clone(),
                        op: node.data.mnemonic(),
                    });
                }
            };
            let [result] = node.results.as_slice() else {
                return Err(bad(format!(
                    "op {} has {} results",
                    node.data.mnemonic(),
                    node.results.len()
                )));
            };
            env.insert(*result, Bound::Scalar(grid_rank + instrs.len()));
            instrs.push(instr);
        }
        let outputs = outputs.ok_or_else(|| bad("does not end with a yield".into()))?;
        if outputs.len() != o.shape.rank() {
            return Err(bad(format!(
                "yields {} block indices for a rank-{} array",
                outputs.len(),
                o.shape.rank()
            )));
        }
        Ok(MapProgram { grid_rank, instrs, outputs })
    }

    /// Evaluate at grid point `point`, appending the block indices to `out`.
    fn eval(
        &self,
        point: &[i64],
        tables: &[Vec<i32>],
        slots: &mut Vec<i64>,
        out: &mut Vec<i64>,
    ) -> Result<(), String> {
        slots.clear();
        slots.extend_from_slice(&point[..self.grid_rank]);
        let get = |slots: &[i64], a: Arg| -> i32 {
            match a {
                Arg::Slot(s) => slots[s] as i32,
                Arg::Imm(v) => v as i32,
            }
        };
        for instr in &self.instrs {
            let v: i32 = match instr {
                Instr::Const(c) => *c as i32,
                Instr::Copy(a) => get(slots, *a),
                Instr::Binary(op, a, b) => {
                    let (a, b) = (get(slots, *a), get(slots, *b));
                    // i32 semantics as Mosaic's arith ops: wrapping, signed division truncating.
                    match op {
                        BinaryOp::Add => a.wrapping_add(b),
                        BinaryOp::Sub => a.wrapping_sub(b),
                        BinaryOp::Mul => a.wrapping_mul(b),
                        BinaryOp::Div | BinaryOp::Rem if b == 0 => {
                            return Err(format!("{op} by zero"));
                        }
                        BinaryOp::Div => a.wrapping_div(b),
                        BinaryOp::Rem => a.wrapping_rem(b),
                        BinaryOp::Min => a.min(b),
                        BinaryOp::Max => a.max(b),
                        _ => unreachable!("rejected at compile time"),
                    }
                }
                Instr::Load { table, offsets, dims } => {
                    let mut flat = 0i64;
                    for (d, (&a, &n)) in offsets.iter().zip(dims).enumerate() {
                        let i = i64::from(get(slots, a));
                        if i < 0 || i as u64 >= n {
                            return Err(format!(
                                "prefetch load index {i} out of bounds in dim {d} (size {n})"
                            ));
                        }
                        flat = flat * n as i64 + i;
                    }
                    tables[*table][flat as usize]
                }
            };
            slots.push(i64::from(v));
        }
        out.extend(self.outputs.iter().map(|&a| i64::from(get(slots, a))));
        Ok(())
    }
}

// --- MXU flops of the body ----------------------------------------------------------------

/// Flops of the `dot`s one grid step runs in `block`, each weighted by `mult` (the trip count
/// of enclosing constant-bound loops). A `dot` under `if` is counted as if always taken (an
/// upper bound, noted); under a loop with non-constant bounds or a `while` it is an error.
fn body_dot_flops(
    k: &Kernel,
    block: Block,
    mult: u64,
    notes: &mut Vec<String>,
) -> Result<u64, TrafficError> {
    let mut total = 0u64;
    for &op in &k.blocks[block].ops {
        let node = &k.ops[op];
        match &node.data {
            OpData::Dot { lhs, dims, .. } => {
                let out =
                    k.ty(node.results[0]).value_shape().map(|s| s.num_elements()).unwrap_or(1);
                let lhs_dims = k.ty(*lhs).value_shape().unwrap_or_default();
                let contract: u64 = dims
                    .lhs_contract
                    .iter()
                    .map(|&d| lhs_dims.dims().get(d as usize).copied().unwrap_or(1))
                    .product();
                total += 2 * out * contract * mult;
            }
            OpData::If { then_block, else_block, .. } => {
                let t = body_dot_flops(k, *then_block, mult, notes)?;
                let e = body_dot_flops(k, *else_block, mult, notes)?;
                if t + e > 0 {
                    notes.push(format!(
                        "{op}: dots under `if` counted as always taken (an upper bound)"
                    ));
                }
                total += t + e;
            }
            OpData::For { lower, upper, step, body, .. } => {
                let inner = body_dot_flops(k, *body, 1, notes)?;
                if inner > 0 {
                    let (Some(lo), Some(hi), Some(st)) =
                        (const_int(k, *lower), const_int(k, *upper), const_int(k, *step))
                    else {
                        return Err(TrafficError::Body(format!(
                            "{op}: a loop with dots has non-constant bounds; its trip count is unknown"
                        )));
                    };
                    if st <= 0 {
                        return Err(TrafficError::Body(format!(
                            "{op}: loop step {st} is not positive"
                        )));
                    }
                    let trips = if hi > lo { (hi - lo + st - 1) / st } else { 0 } as u64;
                    total += inner * trips * mult;
                }
            }
            OpData::While { cond, body, .. }
                if body_dot_flops(k, *body, 1, notes)? + body_dot_flops(k, *cond, 1, notes)?
                    > 0 =>
            {
                return Err(TrafficError::Body(format!(
                    "{op}: dots inside a while loop; its trip count is unknown"
                )));
            }
            OpData::RunScoped { body } => total += body_dot_flops(k, *body, mult, notes)?,
            _ => {}
        }
    }
    Ok(total)
}

fn const_int(k: &Kernel, v: Value) -> Option<i64> {
    let op = k.def_op(v)?;
    match k.ops[op].data {
        OpData::Constant { value: Literal::Int(i), .. } => Some(i),
        _ => None,
    }
}
