//! Element types, shapes, memory spaces and value types.

use std::fmt;

/// Element types a kernel can hold. Integers are signless (as in Mosaic); the op chooses
/// signed or unsigned semantics.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DType {
    Bf16,
    F16,
    F32,
    /// 8-bit float, e4m3 with finite values only (`f8E4M3FN`).
    F8E4M3,
    /// 8-bit float, e5m2 (`f8E5M2`).
    F8E5M2,
    I32,
    I16,
    I8,
    I4,
    Bool,
}

impl DType {
    pub const ALL: [DType; 10] = [
        DType::Bf16,
        DType::F16,
        DType::F32,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::I4,
        DType::Bool,
    ];

    /// Bits of one element as the TPU stores it in vregs. Bool is 32 bits in memory
    /// (Mosaic stores bools as i32), see [`DType::memory_bits`].
    pub fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::Bf16 | DType::F16 | DType::I16 => 16,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 => 8,
            DType::I4 => 4,
            DType::Bool => 1,
        }
    }

    /// Bits of one element in a memref (bools are widened to i32 at the kernel boundary).
    pub fn memory_bits(self) -> u32 {
        if self == DType::Bool { 32 } else { self.bits() }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::Bf16 | DType::F16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I16 | DType::I8 | DType::I4)
    }

    /// Native (sublane, lane) tile of a 2-D block in VMEM: (8,128) for 32-bit, (16,128) for
    /// 16-bit, (32,128) for 8-bit, (64,128) for 4-bit types.
    pub fn native_tile(self) -> (u64, u64) {
        let bits = u64::from(self.memory_bits());
        (8 * 32 / bits, 128)
    }

    /// The spelling used in our IR text, in CLI `--set` values and in oracle call specs.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::I4 => "i4",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            let known: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype `{s}` (known: {})", known.join(", "))
        })
    }
}

/// A static shape. Rank 0 is a scalar.
#[derive(Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Shape(pub Vec<u64>);

impl Shape {
    pub fn new(dims: impl Into<Vec<u64>>) -> Shape {
        Shape(dims.into())
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn dims(&self) -> &[u64] {
        &self.0
    }
    pub fn num_elements(&self) -> u64 {
        self.0.iter().product()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Where a ref lives. `Any` is Pallas's `pl.ANY` (in practice HBM): reachable only by DMA.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum MemorySpace {
    Vmem,
    Smem,
    Hbm,
    Any,
    Semaphore,
}

impl MemorySpace {
    pub fn name(self) -> &'static str {
        match self {
            MemorySpace::Vmem => "vmem",
            MemorySpace::Smem => "smem",
            MemorySpace::Hbm => "hbm",
            MemorySpace::Any => "any",
            MemorySpace::Semaphore => "semaphore_mem",
        }
    }

    /// HBM-like spaces are not windowed by the grid and can only be touched by DMAs.
    pub fn is_hbm_like(self) -> bool {
        matches!(self, MemorySpace::Hbm | MemorySpace::Any)
    }
}

impl fmt::Display for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The two semaphore kinds of the TPU: DMA semaphores count bytes, regular ones count signals.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum SemKind {
    Dma,
    Regular,
}

impl fmt::Display for SemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SemKind::Dma => "dma_sem",
            SemKind::Regular => "sem",
        })
    }
}

/// The type of a ref: a memory window of `shape` elements of `dtype` in `space`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefType {
    pub space: MemorySpace,
    pub dtype: DType,
    pub shape: Shape,
}

impl RefType {
    pub fn bytes(&self) -> u64 {
        (self.shape.num_elements() * u64::from(self.dtype.memory_bits())).div_ceil(8)
    }
}

/// The type of an SSA value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// A scalar in a scalar register (rank 0).
    Scalar(DType),
    /// A vector value (rank >= 1), held in vregs.
    Vector(Shape, DType),
    /// A memory window.
    Ref(RefType),
    /// A semaphore (rank 0) or an array of semaphores.
    Sem(SemKind, Shape),
}

impl Type {
    pub fn dtype(&self) -> Option<DType> {
        match self {
            Type::Scalar(d) | Type::Vector(_, d) => Some(*d),
            Type::Ref(r) => Some(r.dtype),
            Type::Sem(..) => None,
        }
    }

    /// Shape of a scalar or vector value (scalars have rank 0).
    pub fn value_shape(&self) -> Option<Shape> {
        match self {
            Type::Scalar(_) => Some(Shape::default()),
            Type::Vector(s, _) => Some(s.clone()),
            Type::Ref(_) | Type::Sem(..) => None,
        }
    }

    /// A scalar or vector of `dtype` with `shape` (rank 0 gives a scalar).
    pub fn array(shape: Shape, dtype: DType) -> Type {
        if shape.rank() == 0 { Type::Scalar(dtype) } else { Type::Vector(shape, dtype) }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Vector(s, d) => write!(f, "{d}{s}"),
            Type::Ref(r) => write!(f, "ref<{}, {}{}>", r.space, r.dtype, r.shape),
            Type::Sem(k, s) if s.rank() == 0 => write!(f, "{k}"),
            Type::Sem(k, s) => write!(f, "{k}{s}"),
        }
    }
}
