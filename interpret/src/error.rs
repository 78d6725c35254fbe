//! Interpreter errors: what went wrong, at which op (name, the kernel source line its
//! `loc(...)` names, body line:column and text) and at which grid point.

use crate::parse::Pos;
use std::fmt;

/// What kind of failure (stable, for tests and tools to match on).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The module uses something the interpreter does not implement.
    Unsupported,
    /// The module is malformed (types, arity, missing attributes, unknown values).
    Malformed,
    /// The host inputs do not match the kernel's operands.
    BadInput,
    /// A load/store/slice/DMA/block index outside its buffer.
    OutOfBounds,
    /// A read of (or write to) a buffer region whose incoming DMA has not been waited on,
    /// or a write to the source of a DMA in flight.
    DmaRace,
    /// A DMA started into a region that already has a DMA in flight into it.
    DoubleDma,
    /// A wait that nothing in flight can satisfy (on hardware: a hang).
    Deadlock,
    /// A DMA still in flight, or a semaphore not back at zero, when its scope or the kernel ends.
    Leak,
    /// `tpu.assume_multiple` whose operand is not a multiple.
    Misaligned,
    /// Integer division by zero or other undefined arithmetic.
    Undefined,
    /// Shapes/types disagree at run time (e.g. a DMA between different shapes).
    Mismatch,
    /// Points of `parallel` grid dimensions share writable state (two write the same output
    /// block, or one writes an input): on hardware their order is undefined.
    ParallelRace,
}

/// Where an error happened: the op and its source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSite {
    /// The op name without the `stable_mosaic.` prefix, e.g. `tpu.wait_dma2`.
    pub name: String,
    /// Its line:column in the body text.
    pub pos: Pos,
    /// The kernel source line that wrote it (`kernels/src/foo.rs:12:5`), from its `loc(...)`.
    pub src: Option<String>,
    /// The op's (first) body line, trimmed.
    pub text: String,
    /// The function it is in (`gather_rows`, `transform_1`, …).
    pub func: String,
}

/// An error from preparing or running a module.
#[derive(Clone, Debug)]
pub struct InterpError {
    pub kind: ErrorKind,
    pub message: String,
    pub site: Option<OpSite>,
    /// The grid point (program ids) being executed, if any.
    pub grid_point: Option<Vec<i64>>,
}

impl InterpError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        InterpError { kind, message: message.into(), site: None, grid_point: None }
    }
}

impl fmt::Display for InterpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: ", self.kind)?;
        if let Some(s) = &self.site {
            match &s.src {
                Some(src) => {
                    write!(f, "`{}` at {src} (body line {}) in @{}", s.name, s.pos, s.func)?
                }
                None => write!(f, "`{}` at line {} in @{}", s.name, s.pos, s.func)?,
            }
        }
        if let Some(g) = &self.grid_point {
            let g: Vec<String> = g.iter().map(|x| x.to_string()).collect();
            write!(
                f,
                "{}grid point ({})",
                if self.site.is_some() { ", " } else { "" },
                g.join(", ")
            )?;
        }
        if self.site.is_some() || self.grid_point.is_some() {
            write!(f, ": ")?;
        }
        write!(f, "{}", self.message)?;
        if let Some(s) = &self.site {
            write!(f, "\n  | {}", s.text)?;
        }
        Ok(())
    }
}

impl std::error::Error for InterpError {}

pub(crate) type Result<T, E = InterpError> = std::result::Result<T, E>;

/// `Err(InterpError)` with a formatted message.
macro_rules! bail {
    ($kind:ident, $($t:tt)*) => {
        return Err($crate::error::InterpError::new($crate::error::ErrorKind::$kind, format!($($t)*)))
    };
}
pub(crate) use bail;
