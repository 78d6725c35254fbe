//! Palladium's kernel IR.
//!
//! A [`Kernel`] is a structured, SSA program over scalars, vectors and refs, with
//! Pallas's call spec attached. It is the one IR of the compiler: the `#[kernel]` macro
//! traces into it, the verifier checks it, the printer writes it deterministically, and the
//! lowering translates it to Mosaic MLIR (an output format only).

mod coverage;
mod entities;
pub mod infer;
mod kernel;
mod op;
mod print;
mod scalar;
mod types;
mod verify;

pub use entities::{Block, Buf, Op, Sem, Value};
pub use kernel::{
    BlockData, BufData, BufOrigin, Kernel, OpNode, SemData, SrcLoc, ValueData, ValueDef,
};
pub use op::{
    ArgReduceOp, BinaryOp, CmpPred, ConstantOp, ControlOp, DebugOp, DmaOp, DotDims, ElementwiseOp,
    Index, Literal, MatmulOp, MemoryOp, Offset, OpData, OpFamily, Precision, ReduceOp, Remote,
    ShapeOp, UnaryOp, WaitSide, is_strided,
};
pub use print::{PrintOptions, print_kernel};
pub use scalar::{CompiledIndexMap, IndexMapError, ScalarOp};
pub use types::{DType, MemorySpace, RefType, SemKind, Shape, Type};
pub use verify::{
    ErrorSite, VerifierError, VerifierErrors, VerifyOptions, array_bytes, block_tiling_rule,
    check_hbm, padded_vmem_bytes, verify,
};
