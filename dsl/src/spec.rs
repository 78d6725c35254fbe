//! The call spec: what `pallas_call` is told besides the kernel body.
//!
//! Grid, dimension semantics, one [`OperandSpec`] per scalar-prefetch array, input and
//! output (array type + block spec), scratch shapes, input/output aliases, the VMEM limit
//! and a cost estimate. Index maps are traced into the kernel's IR as blocks, so they live in
//! [`Kernel`](crate::ir::Kernel), not here.

use crate::ir::{Block, DType, MemorySpace, SemKind, Shape, SrcLoc};
use std::fmt;

/// How the grid may iterate a dimension (`dimension_semantics`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Iterations are independent: may be split across `TensorCores`.
    Parallel,
    /// Iterations run in order (reductions, carried state).
    Arbitrary,
}

impl Semantics {
    pub fn name(self) -> &'static str {
        match self {
            Semantics::Parallel => "parallel",
            Semantics::Arbitrary => "arbitrary",
        }
    }
}

/// One grid dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridDim {
    pub extent: u64,
    pub semantics: Semantics,
}

/// One dimension of a block: a blocked extent, a squeezed (`None` / `pl.Squeezed()`) dim
/// that the kernel sees without (the memref keeps it as size 1, as Pallas does), or an
/// element-indexed extent (`Element(n)` / `pl.Element(n, (lo, hi))`): the index map returns
/// the window's first element (in the array padded by `lo` before and `hi` after) instead of
/// a block index, so windows may overlap. As in Pallas (jax 0.10.2), an operand with one
/// element dim has no blocked ones.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockDim {
    Blocked(u64),
    Squeezed,
    Element { size: u64, pad: (u64, u64) },
}

impl BlockDim {
    /// The extent in the window memref (squeezed dims are 1).
    pub fn extent(self) -> u64 {
        match self {
            BlockDim::Blocked(n) | BlockDim::Element { size: n, .. } => n,
            BlockDim::Squeezed => 1,
        }
    }

    /// The padding `(before, after)` of an element dim; none for the others.
    pub fn padding(self) -> (u64, u64) {
        match self {
            BlockDim::Element { pad, .. } => pad,
            BlockDim::Blocked(_) | BlockDim::Squeezed => (0, 0),
        }
    }
}

impl fmt::Display for BlockDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockDim::Blocked(n) => write!(f, "{n}"),
            BlockDim::Squeezed => f.write_str("squeezed"),
            BlockDim::Element { size, pad: (0, 0) } => write!(f, "Element({size})"),
            BlockDim::Element { size, pad: (lo, hi) } => write!(f, "Element({size}, ({lo}, {hi}))"),
        }
    }
}

/// The role of an operand of the call.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum OperandRole {
    /// Scalar prefetch: a whole i32 array in SMEM, visible to the index maps.
    Prefetch,
    Input,
    Output,
}

/// An array passed to (or returned from) the call, and how the kernel sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperandSpec {
    pub name: String,
    pub role: OperandRole,
    pub dtype: DType,
    /// The full array shape.
    pub shape: Shape,
    pub space: MemorySpace,
    /// The block (window) shape; `None` means the whole array (HBM/ANY refs, prefetch,
    /// grid-less kernels).
    pub block: Option<Vec<BlockDim>>,
    /// The traced index map: a block whose parameters are the grid indices and the
    /// prefetch refs, ending in a `yield` of one i32 block index per array dim (an element offset for an
    /// element-indexed block).
    pub index_map: Option<Block>,
    /// Where it is declared (its `#[input(..)]`/`#[output(..)]`/`#[prefetch(..)]` attribute):
    /// call-spec errors about it point there.
    pub loc: Option<SrcLoc>,
    /// `pipeline_mode = Buffered(n)` (Pallas's `BlockSpec(pipeline_mode=pl.Buffered(n))`);
    /// `None` leaves the buffering to Mosaic's default (double buffering, no attribute).
    pub pipeline_mode: Option<PipelineMode>,
    /// The values a scalar-prefetch operand may hold (`#[prefetch(i32[n], range = lo..=hi)]`):
    /// a kernel that derives DMA offsets or loop trip counts from them reaches only memory
    /// inside its arrays for values in range. Checked wherever prefetch values enter
    /// ([`OperandSpec::check_values`]), and enforced in the kernel: every scalar read from
    /// the operand (in the body or an index map) is clamped into the range, so a value the
    /// host did not check (a serving engine's) cannot address memory outside an array.
    /// `None`: any i32.
    pub values: Option<ValueRange>,
}

/// The values a scalar-prefetch operand may hold, both ends included.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueRange {
    pub min: u64,
    pub max: u64,
}

impl fmt::Display for ValueRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// How the grid pipeline buffers a windowed operand. Pallas TPU (jax 0.10.2) lowers
/// `Buffered(1)` to `#tpu.pipeline_mode<synchronous>` (one buffer: each block is copied in
/// before, or out after, its step, with no overlap) and `Buffered(2)` to `<double_buffered>`;
/// it refuses other counts, and so does our verifier.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PipelineMode {
    Buffered(u64),
}

impl PipelineMode {
    /// The buffer counts Mosaic has a pipeline mode for.
    pub const SUPPORTED_BUFFERS: [u64; 2] = [1, 2];

    /// How many VMEM buffers the window takes.
    pub fn buffers(self) -> u64 {
        match self {
            PipelineMode::Buffered(n) => n,
        }
    }
}

impl fmt::Display for PipelineMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipelineMode::Buffered(n) => write!(f, "Buffered({n})"),
        }
    }
}

impl OperandSpec {
    /// The memref shape the kernel body sees: the block (squeezed dims as 1) or the array.
    pub fn window_shape(&self) -> Shape {
        match &self.block {
            Some(b) => Shape(b.iter().map(|d| d.extent()).collect()),
            None => self.shape.clone(),
        }
    }

    /// Whether the block is element-indexed (Pallas's `window_kind = #tpu.element_window`):
    /// its index map returns element offsets.
    pub fn has_element_window(&self) -> bool {
        self.block.as_ref().is_some_and(|b| b.iter().any(|d| matches!(d, BlockDim::Element { .. })))
    }

    /// Whether the grid windows this operand (it gets a `transform_N` function).
    pub fn is_windowed(&self) -> bool {
        self.role != OperandRole::Prefetch && !self.space.is_hbm_like()
    }

    /// `values` as this scalar-prefetch operand may hold them: each an i32 inside the declared
    /// range ([`Self::values`]). The error names the first value out of range, its index and
    /// the bound.
    pub fn check_values(&self, values: &[i64]) -> Result<(), String> {
        let (min, max) = match self.values {
            Some(r) => (r.min as i64, (r.max as i64).min(i32::MAX as i64)),
            None => (i32::MIN as i64, i32::MAX as i64),
        };
        let Some((i, &v)) = values.iter().enumerate().find(|(_, v)| !(min..=max).contains(*v))
        else {
            return Ok(());
        };
        let bound = match self.values {
            Some(r) => format!("the range {r} the kernel declares for it"),
            None => "an i32".to_string(),
        };
        Err(format!("value {i} is {v}, outside {bound}"))
    }

    /// How many copies of the window the grid pipeline keeps in VMEM: the pipeline mode's
    /// count, else two (Mosaic double-buffers windows by default).
    pub fn window_buffers(&self) -> u64 {
        self.pipeline_mode.map_or(2, PipelineMode::buffers)
    }
}

/// A scratch buffer or semaphore array, allocated for the whole kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScratchSpec {
    Buffer { name: String, space: MemorySpace, dtype: DType, shape: Shape },
    Semaphore { name: String, kind: SemKind, shape: Shape },
}

impl ScratchSpec {
    pub fn name(&self) -> &str {
        match self {
            ScratchSpec::Buffer { name, .. } | ScratchSpec::Semaphore { name, .. } => name,
        }
    }
}

/// Pallas's `pl.CostEstimate`, passed through to XLA's scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CostEstimate {
    pub flops: u64,
    pub transcendentals: u64,
    pub bytes_accessed: u64,
}

/// One named axis of a device mesh (`jax.sharding.Mesh` axis name and size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshAxis {
    pub name: String,
    pub size: u64,
}

/// The devices a multi-device kernel runs on (`jax.shard_map` over a `Mesh`): named axes,
/// major to minor. A device's logical id is its row-major position in the mesh, what
/// `tpu.device_id` returns and what remote DMAs and signals name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub axes: Vec<MeshAxis>,
}

impl Mesh {
    /// The number of devices.
    pub fn devices(&self) -> u64 {
        self.axes.iter().map(|a| a.size).product()
    }

    /// The axis called `name`: its position, its size and the product of the sizes after it
    /// (what the device id is divided by before reducing modulo the size).
    pub fn axis(&self, name: &str) -> Option<(usize, u64, u64)> {
        let i = self.axes.iter().position(|a| a.name == name)?;
        Some((i, self.axes[i].size, self.axes[i + 1..].iter().map(|a| a.size).product()))
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> =
            self.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
        write!(f, "[{}]", axes.join(", "))
    }
}

/// Everything `pallas_call` needs besides the body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallSpec {
    pub grid: Vec<GridDim>,
    /// Scalar-prefetch operands, inputs, then outputs (Pallas operand order).
    pub operands: Vec<OperandSpec>,
    pub scratch: Vec<ScratchSpec>,
    /// `(input index, output index)`: the output reuses the input's buffer.
    pub aliases: Vec<(usize, usize)>,
    pub vmem_limit_bytes: Option<u64>,
    pub cost: Option<CostEstimate>,
    /// The devices of a multi-device kernel (`None`: one device, no communication).
    pub mesh: Option<Mesh>,
    /// `CompilerParams(collective_id=..)`: names the barrier semaphore kernels share.
    pub collective_id: Option<u32>,
}

impl CallSpec {
    pub fn operands_of(&self, role: OperandRole) -> impl Iterator<Item = &OperandSpec> {
        self.operands.iter().filter(move |o| o.role == role)
    }

    /// The number of devices the call runs on (1 without a mesh).
    pub fn devices(&self) -> u64 {
        self.mesh.as_ref().map_or(1, Mesh::devices)
    }
}

/// TPU generations Palladium targets; their hardware figures are [`Chip::target`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Chip {
    V4,
    V5e,
    V5p,
    V6e,
    V7x,
}

impl Chip {
    pub const ALL: [Chip; 5] = [Chip::V4, Chip::V5e, Chip::V5p, Chip::V6e, Chip::V7x];

    pub fn name(self) -> &'static str {
        match self {
            Chip::V4 => "v4",
            Chip::V5e => "v5e",
            Chip::V5p => "v5p",
            Chip::V6e => "v6e",
            Chip::V7x => "v7x",
        }
    }
}

impl fmt::Display for Chip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Chip {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Chip::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| {
            let known: Vec<_> = Chip::ALL.iter().map(|c| c.name()).collect();
            format!("unknown chip `{s}` (known: {})", known.join(", "))
        })
    }
}
