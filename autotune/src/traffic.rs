//! The static pipeline traffic model: what the Pallas grid pipeline moves between HBM and
//! VMEM for one kernel, computed from the call spec and the traced index maps alone.
//!
//! The grid pipeline is [`palladium_array::pipeline`], THE model of Pallas's rule (an input
//! block is fetched when its block index differs from the previous step's, an output block
//! is written back when its index is about to change and after the last step), walked with
//! the index maps evaluated by [`palladium_dsl::ir::CompiledIndexMap`]. That is what makes
//! block sizes matter: in the tiled matmul, `x`'s index `(i, kk)` changes at every step, so
//! `x` is read once per `j`, i.e. `n / bn` times over.
//!
//! This module counts the bytes of those moves (edge blocks clipped to the array). It also
//! reports the VMEM footprint (the verifier's accounting: padded tiles, windowed blocks
//! double-buffered) and the MXU flops of the `dot`s in the body. Anything it cannot evaluate exactly is an error
//! ([`TrafficError`]) rather than a guess; the few things it deliberately does not model
//! (manual DMAs on HBM/ANY operands, `dot`s under `if`) are listed in [`Traffic::notes`].

use indexmap::IndexMap;
use palladium_array::pipeline::{Pipeline, Role, Step};
use palladium_dsl::Kernel;
use palladium_dsl::ir::{
    Block, CompiledIndexMap, DType, IndexMapError, Literal, MemorySpace, OpData, Value,
    padded_vmem_bytes,
};
use palladium_dsl::spec::{BlockDim, OperandRole, OperandSpec};
use serde::Serialize;

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

    // The windowed operands, walked through the grid pipeline.
    let tables: Vec<Option<Vec<i64>>> =
        tables.iter().map(|t| Some(t.iter().map(|&x| i64::from(x)).collect())).collect();
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
        let map = match o.index_map {
            Some(map) if !extents.is_empty() => {
                Some(CompiledIndexMap::compile(kernel, o, map).map_err(|e| match e {
                    IndexMapError::UnsupportedOp(op) => {
                        TrafficError::UnsupportedOp { operand: o.name.clone(), op }
                    }
                    IndexMapError::Malformed(message) => {
                        TrafficError::BadIndexMap { operand: o.name.clone(), message }
                    }
                })?)
            }
            // Grid-less kernels (or whole-array operands): one block, the whole array.
            _ => None,
        };
        trackers.push(Tracker { spec: o, map, dmas: 0, bytes: 0 });
    }
    let roles = trackers
        .iter()
        .map(|t| if t.spec.role == OperandRole::Input { Role::Input } else { Role::Output })
        .collect();
    let grid: Vec<i64> = extents.iter().map(|&e| e as i64).collect();
    let mut pipeline = Pipeline::new(&grid, roles);
    let mut step = Step::default();
    let mut slots = Vec::new();
    let eval_error = |t: &Tracker, point: &[i64], message| TrafficError::Eval {
        operand: t.spec.name.clone(),
        point: point.to_vec(),
        message,
    };
    while pipeline.next_step(&mut step, |i, point, idx| {
        let t = &trackers[i];
        match &t.map {
            Some(map) => {
                let known = map.eval(point, &tables, &mut slots, idx);
                assert!(known.map_err(|m| eval_error(t, point, m))?, "every table is known");
            }
            None => idx.resize(t.spec.shape.rank(), 0),
        }
        Ok(())
    })? {
        for c in &step.changes {
            let t = &mut trackers[c.operand];
            // Checked as the block is entered, so that its write-back is known to be in bounds.
            let bytes = block_bytes(t.spec, &c.block).map_err(|m| eval_error(t, &step.point, m))?;
            // Inputs fetch the new block; outputs write back the one just left.
            match c.role {
                Role::Input => {
                    t.dmas += 1;
                    t.bytes += bytes;
                }
                Role::Output => {
                    if let Some(left) = &c.left {
                        t.dmas += 1;
                        t.bytes += block_bytes(t.spec, left).expect("checked when it was entered");
                    }
                }
            }
        }
    }
    // After the last step every output writes back the block it holds.
    for (i, block) in pipeline.finish() {
        let t = &mut trackers[i];
        t.dmas += 1;
        t.bytes += block_bytes(t.spec, &block).expect("checked when it was entered");
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
    map: Option<CompiledIndexMap>,
    dmas: u64,
    bytes: u64,
}

fn array_bytes(dtype: DType, elements: u64) -> u64 {
    (elements * u64::from(dtype.memory_bits())).div_ceil(8)
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
