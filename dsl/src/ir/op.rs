//! The operations of the kernel IR: one variant per primitive, declared once in the op
//! table below, grouped in families. Each family has its type rules
//! (`dsl/src/ir/infer/<family>.rs`), its lowering rules (`lowering/src/rules/<family>.rs`)
//! and, for the Mosaic ops it lowers to, its interpreter rules
//! (`interpret/src/rules/<family>.rs`); `docs/contributing.md` lists what a new op touches.

use super::{Block, Buf, DType, Sem, Shape, Type, Value};
use smallvec::SmallVec;
use std::fmt;

/// A constant's value. Float constants keep the f64 they were written as; the dtype of the
/// result decides how they round.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Literal {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Int(i) => write!(f, "{i}"),
            // `{:?}` keeps a decimal point on whole numbers and is exact for round trips.
            Literal::Float(x) => write!(f, "{x:?}"),
            Literal::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// An offset into a ref dimension: known at trace time or an i32 value.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Offset {
    Static(i64),
    Dynamic(Value),
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Offset::Static(i) => write!(f, "{i}"),
            Offset::Dynamic(v) => write!(f, "{v}"),
        }
    }
}

/// How one ref dimension is indexed: a single position (the dim is dropped from the
/// result) or a slice of static size and static stride (`pl.ds(start, size, stride)`;
/// strides other than 1 only in VMEM loads and stores, as in Pallas).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    Point(Offset),
    Slice { start: Offset, size: u64, stride: u64 },
}

impl Index {
    pub fn offset(&self) -> Offset {
        match *self {
            Index::Point(o) | Index::Slice { start: o, .. } => o,
        }
    }
    pub fn size(&self) -> u64 {
        match *self {
            Index::Point(_) => 1,
            Index::Slice { size, .. } => size,
        }
    }
    pub fn stride(&self) -> u64 {
        match *self {
            Index::Point(_) => 1,
            Index::Slice { stride, .. } => stride,
        }
    }
    /// How far along the dim the index reaches from its start: `(size - 1) * stride + 1`.
    pub fn span(&self) -> u64 {
        self.size().saturating_sub(1).saturating_mul(self.stride()).saturating_add(1)
    }
    /// A contiguous slice of `size` from `start`.
    pub fn slice(start: Offset, size: u64) -> Index {
        Index::Slice { start, size, stride: 1 }
    }
}

/// Whether any dim of `index` is strided (a `tpu.strided_load` / `tpu.strided_store`).
pub fn is_strided(index: &[Index]) -> bool {
    index.iter().any(|i| i.stride() != 1)
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Index::Point(o) => write!(f, "{o}"),
            Index::Slice { start, size, stride: 1 } => write!(f, "{start}:+{size}"),
            Index::Slice { start, size, stride } => write!(f, "{start}:+{size}:{stride}"),
        }
    }
}

macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            pub fn name(self) -> &'static str { match self { $($name::$v => $s),* } }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
    };
}

op_enum!(
    /// Elementwise unary math.
    UnaryOp {
        Neg => "neg", Abs => "abs", Exp => "exp", Exp2 => "exp2", Log => "log", Log1p => "log1p",
        Sqrt => "sqrt", Rsqrt => "rsqrt", Tanh => "tanh", Sin => "sin", Cos => "cos",
        Floor => "floor", Ceil => "ceil", Round => "round", Erf => "erf",
        /// `1 / (1 + exp(-x))`.
        Logistic => "logistic",
        /// Bitwise (ints) or logical (bool) not.
        Not => "not",
        /// `1 / x` on the EUP (`pl.reciprocal(x, approx=False)`; f32 only).
        Reciprocal => "reciprocal",
        /// The EUP's approximate `1 / x` (`pl.reciprocal(x, approx=True)`; f32 only).
        ReciprocalApprox => "reciprocal_approx",
    }
);

op_enum!(
    /// Elementwise binary arithmetic and bitwise ops. Integer ops are signed.
    BinaryOp {
        Add => "add", Sub => "sub", Mul => "mul", Div => "div", Rem => "rem",
        Max => "max", Min => "min", Pow => "pow",
        And => "and", Or => "or", Xor => "xor", Shl => "shl", Shr => "shr",
    }
);

op_enum!(
    /// Comparison predicates (ordered for floats, signed for ints).
    CmpPred { Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge" }
);

op_enum!(
    /// Reductions over vector axes.
    ReduceOp { Sum => "sum", Max => "max", Min => "min" }
);

op_enum!(
    /// Reductions to the index of the extreme element (`jnp.argmax` / `jnp.argmin`; the
    /// first such index on ties).
    ArgReduceOp { ArgMax => "argmax", ArgMin => "argmin" }
);

op_enum!(
    /// MXU precision for f32 operands (`None` in Pallas = the default, bf16 passes).
    Precision { Default => "default", Bf16x3 => "bf16x3", Fp32 => "fp32" }
);

/// Dimension numbers of a `dot_general`: contracting and batch dims of each side. The
/// result is ordered batch dims, lhs free dims, rhs free dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotDims {
    pub lhs_contract: Vec<u32>,
    pub rhs_contract: Vec<u32>,
    pub lhs_batch: Vec<u32>,
    pub rhs_batch: Vec<u32>,
}

impl DotDims {
    /// `lhs @ rhs` for 2-D operands.
    pub fn matmul() -> DotDims {
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            lhs_batch: vec![],
            rhs_batch: vec![],
        }
    }
    /// Dimension numbers from an einsum-style spec, `"mk,kn->mn"`, for operands of the given
    /// ranks. A letter in both operands and the result is a batch dim, in both operands only
    /// a contracted dim; the result must list batch dims, then lhs free dims, then rhs free
    /// dims, each in operand order (what `tpu.matmul` produces; transpose after otherwise).
    pub fn parse(spec: &str, lhs_rank: usize, rhs_rank: usize) -> Result<DotDims, String> {
        let bad = |why: String| format!("contraction spec `{spec}`: {why}");
        let (operands, result) = spec
            .split_once("->")
            .ok_or_else(|| bad("expected `lhs,rhs->result`, e.g. `mk,kn->mn`".into()))?;
        let (lhs, rhs) = operands
            .split_once(',')
            .ok_or_else(|| bad("expected two operands separated by `,`".into()))?;
        let letters = |s: &str, what: &str, rank: Option<usize>| -> Result<Vec<char>, String> {
            let l: Vec<char> = s.trim().chars().collect();
            if let Some(c) = l.iter().find(|c| !c.is_ascii_alphabetic()) {
                return Err(bad(format!("`{c}` in the {what} is not a dim letter")));
            }
            if let Some((i, c)) = l.iter().enumerate().find(|(i, c)| l[..*i].contains(c)) {
                return Err(bad(format!("`{c}` appears twice in the {what} (at {i})")));
            }
            match rank {
                Some(r) if r != l.len() => {
                    Err(bad(format!("the {what} names {} dims, it has rank {r}", l.len())))
                }
                _ => Ok(l),
            }
        };
        let (l, r, o) = (
            letters(lhs, "lhs", Some(lhs_rank))?,
            letters(rhs, "rhs", Some(rhs_rank))?,
            letters(result, "result", None)?,
        );
        let pos = |s: &[char], c: char| s.iter().position(|&x| x == c).map(|p| p as u32);
        let mut dims = DotDims {
            lhs_contract: vec![],
            rhs_contract: vec![],
            lhs_batch: vec![],
            rhs_batch: vec![],
        };
        let mut expected = Vec::new();
        for &c in &l {
            match (pos(&r, c), o.contains(&c)) {
                (Some(rp), true) => {
                    dims.lhs_batch.push(pos(&l, c).unwrap_or(0));
                    dims.rhs_batch.push(rp);
                    expected.push(c);
                }
                (Some(rp), false) => {
                    dims.lhs_contract.push(pos(&l, c).unwrap_or(0));
                    dims.rhs_contract.push(rp);
                }
                (None, true) => {}
                (None, false) => {
                    return Err(bad(format!(
                        "lhs dim `{c}` is neither contracted nor in the result (sum it first)"
                    )));
                }
            }
        }
        expected.extend(l.iter().filter(|c| !r.contains(c)));
        for &c in &r {
            if !l.contains(&c) {
                if !o.contains(&c) {
                    return Err(bad(format!(
                        "rhs dim `{c}` is neither contracted nor in the result (sum it first)"
                    )));
                }
                expected.push(c);
            }
        }
        if o != expected {
            let want: String = expected.iter().collect();
            return Err(bad(format!(
                "the result must be `{want}` (batch dims, then lhs free, then rhs free dims, as tpu.matmul orders them); transpose the result after"
            )));
        }
        Ok(dims)
    }

    /// `lhs @ rhs.T` for 2-D operands (contract both minor dims).
    pub fn matmul_transposed_rhs() -> DotDims {
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![1],
            lhs_batch: vec![],
            rhs_batch: vec![],
        }
    }
}

/// The remote side of a DMA or signal: the destination device and, for DMAs, the
/// semaphore the sender waits on.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Remote {
    pub device_id: Value,
    pub send_sem: Value,
}

/// Which side of a copy a `DmaWait` waits on (Pallas's `wait`, `wait_send`, `wait_recv`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum WaitSide {
    /// A local copy: its data has arrived.
    Local,
    /// A remote copy, on the sender: its data has left (the send semaphore counts it).
    Send,
    /// A remote copy, on the receiver: its data has arrived from the device that ran the
    /// same descriptor's `start` (the descriptor's `device_id` is carried, as Pallas does).
    Recv { device_id: Value },
}

/// Declares every op once: its variant of [`OpData`] with its fields, its family, its
/// mnemonic (an expression over the fields), and `effects` when it does more than compute
/// its results. From that one table come [`OpData`], the borrowed per-family views
/// ([`OpFamily`], [`ConstantOp`], ...) that the type rules and the lowering dispatch on (a
/// family's rules match its view exhaustively, so an op without a rule does not compile),
/// and [`OpData::mnemonic`], [`OpData::operands`], [`OpData::blocks`],
/// [`OpData::is_pure`]. Operands and blocks are the fields' own, in declaration order
/// (see [`Field`]), which is why `Store` lists `value` before `index`.
macro_rules! op_table {
    ($(
        $(#[$fam_meta:meta])*
        $fam:ident($Fam:ident) {
            $(
                $(#[$meta:meta])*
                $v:ident $({ $($f:ident : $t:ty),* $(,)? })? => $name:expr $(, $effects:ident)?;
            )*
        }
    )*) => {
        /// One operation. Regions are blocks owned by the op.
        #[derive(Clone, Debug, PartialEq)]
        pub enum OpData {
            $($(
                $(#[$meta])*
                $v $({ $($f: $t),* })?,
            )*)*
        }

        /// An op seen through its family: what each consumer matches first.
        #[derive(Copy, Clone, Debug)]
        pub enum OpFamily<'a> {
            $(
                $(#[$fam_meta])*
                $fam($Fam<'a>),
            )*
        }

        $(
            $(#[$fam_meta])*
            ///
            /// The fields of each op by reference (see [`OpData`] for what they mean).
            #[derive(Copy, Clone, Debug)]
            #[allow(missing_docs)]
            pub enum $Fam<'a> {
                $( $v $({ $($f: &'a $t),* })?, )*
            }
        )*

        impl OpData {
            /// The op through its family's view.
            pub fn family(&self) -> OpFamily<'_> {
                match self {
                    $($(
                        OpData::$v $({ $($f),* })? => OpFamily::$fam($Fam::$v $({ $($f),* })?),
                    )*)*
                }
            }

            /// The mnemonic used by the printer and in error messages.
            #[allow(unused_variables)]
            pub fn mnemonic(&self) -> String {
                match self {
                    $($( OpData::$v $({ $($f),* })? => ($name).into(), )*)*
                }
            }

            /// The SSA operands, in order (index offsets included).
            #[allow(unused_variables)]
            pub fn operands(&self) -> SmallVec<[Value; 4]> {
                let mut out = SmallVec::new();
                match self {
                    $($(
                        OpData::$v $({ $($f),* })? => { $($( Field::values($f, &mut out); )*)? }
                    )*)*
                }
                out
            }

            /// The blocks (regions) this op owns, in order.
            #[allow(unused_variables)]
            pub fn blocks(&self) -> SmallVec<[Block; 2]> {
                let mut out = SmallVec::new();
                match self {
                    $($(
                        OpData::$v $({ $($f),* })? => { $($( Field::blocks($f, &mut out); )*)? }
                    )*)*
                }
                out
            }

            /// Whether the op only computes its results (no memory or synchronisation
            /// effects).
            pub fn is_pure(&self) -> bool {
                match self {
                    $($( OpData::$v { .. } => op_table!(@pure $($effects)?), )*)*
                }
            }
        }
    };
    (@pure) => { true };
    (@pure effects) => { false };
}

/// What a field of an op contributes to [`OpData::operands`] and [`OpData::blocks`]:
/// values (and the dynamic offsets of indices) are operands, blocks are regions,
/// attributes are neither.
trait Field {
    fn values(&self, _out: &mut SmallVec<[Value; 4]>) {}
    fn blocks(&self, _out: &mut SmallVec<[Block; 2]>) {}
}

macro_rules! attribute_fields {
    ($($t:ty),*) => { $(impl Field for $t {})* };
}
attribute_fields!(
    Literal,
    Type,
    Shape,
    DType,
    u8,
    u32,
    Vec<u32>,
    Vec<u64>,
    String,
    UnaryOp,
    BinaryOp,
    CmpPred,
    ReduceOp,
    ArgReduceOp,
    DotDims,
    Precision,
    Buf,
    Sem
);

impl Field for Value {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        out.push(*self);
    }
}
impl Field for Option<Value> {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        out.extend(self.iter().copied());
    }
}
impl Field for Vec<Value> {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        out.extend(self.iter().copied());
    }
}
impl Field for SmallVec<[Value; 4]> {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        out.extend(self.iter().copied());
    }
}
impl Field for Vec<Index> {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        out.extend(self.iter().filter_map(|i| match i.offset() {
            Offset::Dynamic(v) => Some(v),
            Offset::Static(_) => None,
        }));
    }
}
impl Field for Option<Remote> {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        if let Some(r) = self {
            out.extend([r.device_id, r.send_sem]);
        }
    }
}
impl Field for WaitSide {
    fn values(&self, out: &mut SmallVec<[Value; 4]>) {
        if let WaitSide::Recv { device_id } = self {
            out.push(*device_id);
        }
    }
}
impl Field for Block {
    fn blocks(&self, out: &mut SmallVec<[Block; 2]>) {
        out.push(*self);
    }
}

op_table! {
    /// Constants and grid queries (`constant.rs` in each rule directory).
    Constant(ConstantOp) {
        /// A scalar constant, or a splat vector when the result type is a vector.
        Constant { value: Literal, ty: Type } => "const";
        /// `pl.program_id(axis)`: the i32 index of this grid step along `axis`.
        ProgramId { axis: u32 } => "program_id";
        /// `pl.num_programs(axis)`: the grid extent along `axis` (i32).
        NumPrograms { axis: u32 } => "num_programs";
        /// `broadcasted_iota(i32, shape, dim)`.
        Iota { shape: Shape, dim: u32 } => "iota";
    }

    /// Elementwise math, comparisons, selects and casts (`elementwise.rs`).
    Elementwise(ElementwiseOp) {
        Unary { op: UnaryOp, x: Value } => op.name();
        Binary { op: BinaryOp, lhs: Value, rhs: Value } => op.name();
        Compare { pred: CmpPred, lhs: Value, rhs: Value } => format!("cmp.{pred}");
        Select { cond: Value, on_true: Value, on_false: Value } => "select";
        Cast { x: Value, to: DType } => "cast";
    }

    /// Shapes, reductions and data movement inside vectors (`shape.rs`).
    Shape(ShapeOp) {
        /// Scalar to vector, or vector with size-1 dims to a larger vector (numpy rules).
        Broadcast { x: Value, shape: Shape } => "broadcast";
        /// Same elements, new shape (also `squeeze/expand_dims`; to rank 0 extracts the
        /// scalar).
        Reshape { x: Value, shape: Shape } => "reshape";
        Transpose { x: Value, perm: Vec<u32> } => "transpose";
        /// Reduce `axes` away (the result drops them).
        Reduce { op: ReduceOp, x: Value, axes: Vec<u32> } => format!("reduce.{op}");
        /// The i32 index of the max/min along `axis` (dropped from the result).
        ArgReduce { op: ArgReduceOp, x: Value, axis: u32 } => op.name();
        /// A static window of a vector (`x[a:b, c:d]`, `lax.slice`): unit strides, rank kept.
        Slice { x: Value, start: Vec<u64>, size: Vec<u64> } => "slice";
        /// Vectors joined along `axis` (`jnp.concatenate`); all other dims agree.
        Concat { xs: Vec<Value>, axis: u32 } => "concat";
        /// Rotate along `axis` by the i32 `shift` toward higher indices (`pltpu.roll`, as
        /// `jnp.roll`: element `i` moves to `(i + shift) mod n`).
        Roll { x: Value, shift: Value, axis: u32 } => "roll";
    }

    /// The MXU (`matmul.rs`).
    Matmul(MatmulOp) {
        /// Matrix multiply on the MXU with a 32-bit accumulator (the result dtype).
        Dot { lhs: Value, rhs: Value, dims: DotDims, precision: Precision, out: DType } => "dot";
    }

    /// Loads, stores, sub-refs and scoped buffers (`memory.rs`).
    Memory(MemoryOp) {
        /// Read a window of a VMEM ref into a vector, or one SMEM element into a scalar.
        Load { src: Value, index: Vec<Index> } => "load";
        /// Write a vector into a VMEM ref window (optionally masked), or a scalar into SMEM.
        Store { dst: Value, value: Value, index: Vec<Index>, mask: Option<Value> } => "store",
            effects;
        /// A sub-ref (`ref.at[...]`): point-indexed dims are dropped from the result.
        RefSlice { base: Value, index: Vec<Index> } => "ref_slice";
        /// Promise that an i32 is a multiple of `multiple` (lets tile-alignment checks pass).
        AssumeMultiple { x: Value, multiple: u32 } => "assume_multiple";
        /// A scoped VMEM/SMEM allocation (only directly inside a `RunScoped` body).
        Alloc { buf: Buf } => "alloc";
    }

    /// DMAs, semaphores and the devices of a mesh (`dma.rs`).
    Dma(DmaOp) {
        /// Start an async copy `src -> dst` signalling DMA semaphore `sem` on arrival.
        DmaStart { src: Value, dst: Value, sem: Value, remote: Option<Remote>, priority: u8 }
            => "dma_start", effects;
        /// Wait until the copy `src -> dst` has arrived (or, `Send`, left; `sem` counts its
        /// bytes).
        DmaWait { src: Value, dst: Value, sem: Value, side: WaitSide } => "dma_wait", effects;
        SemSignal { sem: Value, amount: Value, device_id: Option<Value> } => "sem_signal",
            effects;
        SemWait { sem: Value, amount: Value } => "sem_wait", effects;
        SemRead { sem: Value } => "sem_read";
        /// A scoped semaphore allocation (only directly inside a `RunScoped` body).
        SemAlloc { sem: Sem } => "sem_alloc";
        /// The i32 logical id of this device in the call's mesh (`tpu.device_id`; Pallas's
        /// `lax.axis_index` divides and reduces it per mesh axis).
        DeviceId => "device_id";
        /// The barrier semaphore of the call's collective (`pltpu.get_barrier_semaphore()`):
        /// a regular semaphore shared by every kernel with the same `collective_id`.
        BarrierSemaphore => "barrier_semaphore";
    }

    /// Debugging output (`debug.rs`).
    Debug(DebugOp) {
        /// `pl.debug_print(format, *args)`: `{}` placeholders take the i32 scalars in order.
        DebugPrint { format: String, args: Vec<Value> } => "debug_print", effects;
    }

    /// Structured control flow and scopes (`control.rs`).
    Control(ControlOp) {
        /// `pl.when` / `lax.cond`: both blocks yield the op's results.
        If { cond: Value, then_block: Block, else_block: Block } => "if", effects;
        /// `fori_loop`: `body` takes (iv: i32, carried...) and yields the next carried
        /// values.
        For { lower: Value, upper: Value, step: Value, init: Vec<Value>, body: Block }
            => "for", effects;
        /// `while_loop`: `cond` takes the carried values and yields one bool; `body` takes
        /// them and yields the next ones.
        While { init: Vec<Value>, cond: Block, body: Block } => "while", effects;
        /// `pl.run_scoped`: allocations inside `body` live until it ends.
        RunScoped { body: Block } => "run_scoped", effects;
        /// Ends a block, handing values to the enclosing op (or the index-map result).
        Yield { values: SmallVec<[Value; 4]> } => "yield", effects;
    }
}

#[cfg(test)]
mod tests {
    use super::{
        CmpPred, DotDims, Index, MemoryOp, Offset, OpData, OpFamily, ReduceOp, Remote, WaitSide,
    };
    use crate::ir::{Block, Value};
    use cranelift_entity::EntityRef;

    #[test]
    fn the_op_table_derives_operands_blocks_names_and_effects_from_the_fields() {
        let v = Value::new;
        let store = OpData::Store {
            dst: v(0),
            value: v(2),
            index: vec![Index::Point(Offset::Dynamic(v(1))), Index::slice(Offset::Static(0), 8)],
            mask: Some(v(3)),
        };
        assert_eq!(store.operands().as_slice(), [v(0), v(2), v(1), v(3)]);
        assert_eq!(store.mnemonic(), "store");
        assert!(!store.is_pure());
        assert!(matches!(store.family(), OpFamily::Memory(MemoryOp::Store { .. })));
        let remote = Some(Remote { device_id: v(3), send_sem: v(4) });
        let start = OpData::DmaStart { src: v(0), dst: v(1), sem: v(2), remote, priority: 0 };
        assert_eq!(start.operands().as_slice(), [v(0), v(1), v(2), v(3), v(4)]);
        let side = WaitSide::Recv { device_id: v(5) };
        let wait = OpData::DmaWait { src: v(0), dst: v(1), sem: v(2), side };
        assert_eq!(wait.operands().as_slice(), [v(0), v(1), v(2), v(5)]);
        let (cond, body) = (Block::new(1), Block::new(2));
        let w = OpData::While { init: vec![v(7)], cond, body };
        assert_eq!(w.operands().as_slice(), [v(7)]);
        assert_eq!(w.blocks().as_slice(), [cond, body]);
        let cmp = OpData::Compare { pred: CmpPred::Lt, lhs: v(0), rhs: v(1) };
        assert_eq!(cmp.mnemonic(), "cmp.lt");
        let sum = OpData::Reduce { op: ReduceOp::Max, x: v(0), axes: vec![1] };
        assert_eq!((sum.mnemonic().as_str(), sum.is_pure()), ("reduce.max", true));
        assert!(OpData::SemRead { sem: v(0) }.is_pure());
        assert!(OpData::DeviceId.operands().is_empty() && OpData::DeviceId.blocks().is_empty());
    }

    fn dims(lc: &[u32], rc: &[u32], lb: &[u32], rb: &[u32]) -> DotDims {
        DotDims {
            lhs_contract: lc.to_vec(),
            rhs_contract: rc.to_vec(),
            lhs_batch: lb.to_vec(),
            rhs_batch: rb.to_vec(),
        }
    }

    #[test]
    fn contraction_specs_give_the_dimension_numbers() {
        assert_eq!(DotDims::parse("mk,kn->mn", 2, 2), Ok(DotDims::matmul()));
        assert_eq!(DotDims::parse("mk,nk->mn", 2, 2), Ok(DotDims::matmul_transposed_rhs()));
        assert_eq!(DotDims::parse("bqd,bkd->bqk", 3, 3), Ok(dims(&[2], &[2], &[0], &[0])));
        assert_eq!(DotDims::parse(" km , kn -> mn ", 2, 2), Ok(dims(&[0], &[0], &[], &[])));
    }

    #[test]
    fn bad_contraction_specs_say_why() {
        let err = |spec: &str, l: usize, r: usize| DotDims::parse(spec, l, r).unwrap_err();
        assert!(err("mk,kn", 2, 2).contains("expected `lhs,rhs->result`"));
        assert!(err("mk,kn->nm", 2, 2).contains("the result must be `mn`"));
        assert!(err("mk,kn->mn", 3, 2).contains("the lhs names 2 dims, it has rank 3"));
        assert!(err("mkk,kn->mn", 3, 2).contains("`k` appears twice in the lhs"));
        assert!(
            err("mk,kn->m", 2, 2).contains("rhs dim `n` is neither contracted nor in the result")
        );
        assert!(err("m1,kn->mn", 2, 2).contains("`1` in the lhs is not a dim letter"));
    }
}
