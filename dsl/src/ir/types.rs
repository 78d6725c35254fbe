//! Element types, shapes, memory spaces and value types.

use std::fmt;

pub use palladium_array::DType;

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
