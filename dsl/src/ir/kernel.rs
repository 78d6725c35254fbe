//! The kernel: arenas of values, ops, blocks, buffers and semaphores, plus its call spec.

use super::{
    Block, Buf, DType, MemorySpace, Op, OpData, RefType, Sem, SemKind, Shape, Type, Value,
};
use crate::spec::CallSpec;
use cranelift_entity::{PrimaryMap, packed_option::PackedOption};
use smallvec::SmallVec;
use std::fmt;

/// Where in the user's Rust source an op was traced.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SrcLoc {
    pub file: &'static str,
    pub line: u32,
    pub col: u32,
}

impl SrcLoc {
    /// The location of the caller of a `#[track_caller]` function: user kernel code.
    #[track_caller]
    pub fn caller() -> SrcLoc {
        let l = std::panic::Location::caller();
        SrcLoc { file: l.file(), line: l.line(), col: l.column() }
    }
}

impl fmt::Display for SrcLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// How a value comes to be.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The `index`-th result of an op.
    Result(Op, u32),
    /// The `index`-th parameter of a block.
    Param(Block, u32),
}

#[derive(Clone, Debug)]
pub struct ValueData {
    pub ty: Type,
    pub def: ValueDef,
}

#[derive(Clone, Debug)]
pub struct OpNode {
    pub data: OpData,
    pub results: SmallVec<[Value; 1]>,
    pub block: Block,
    pub loc: Option<SrcLoc>,
}

#[derive(Clone, Debug, Default)]
pub struct BlockData {
    pub params: Vec<Value>,
    pub ops: Vec<Op>,
    /// The op that owns this block as a region; `None` for the kernel entry and index maps.
    pub parent: PackedOption<Op>,
}

/// What a buffer is: which slot of the call it comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BufOrigin {
    /// `call.operands[i]` (prefetch, input or output window).
    Operand(usize),
    /// `call.scratch[i]`.
    Scratch(usize),
    /// Allocated by an `Alloc` op inside `run_scoped`.
    Scoped(Op),
}

#[derive(Clone, Debug)]
pub struct BufData {
    pub name: String,
    pub origin: BufOrigin,
    pub ty: RefType,
    /// The ref value that names this buffer in the body.
    pub value: Value,
}

#[derive(Clone, Debug)]
pub struct SemData {
    pub name: String,
    pub origin: BufOrigin,
    pub kind: SemKind,
    pub shape: Shape,
    pub value: Value,
}

/// A traced kernel: the body, its index maps and the call spec.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    pub call: CallSpec,
    /// Parameters: one i32 per grid dim, then one ref per call operand (prefetch, inputs,
    /// outputs), then one per scratch entry, in Pallas's order.
    pub entry: Block,
    pub ops: PrimaryMap<Op, OpNode>,
    pub values: PrimaryMap<Value, ValueData>,
    pub blocks: PrimaryMap<Block, BlockData>,
    pub bufs: PrimaryMap<Buf, BufData>,
    pub sems: PrimaryMap<Sem, SemData>,
    /// Where the kernel function itself was written.
    pub loc: Option<SrcLoc>,
}

impl Kernel {
    /// An empty kernel with an empty entry block.
    pub fn new(name: impl Into<String>) -> Kernel {
        let mut blocks = PrimaryMap::new();
        let entry = blocks.push(BlockData::default());
        Kernel {
            name: name.into(),
            call: CallSpec::default(),
            entry,
            ops: PrimaryMap::new(),
            values: PrimaryMap::new(),
            blocks,
            bufs: PrimaryMap::new(),
            sems: PrimaryMap::new(),
            loc: None,
        }
    }

    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v].ty
    }

    pub fn new_block(&mut self) -> Block {
        self.blocks.push(BlockData::default())
    }

    pub fn add_block_param(&mut self, block: Block, ty: Type) -> Value {
        let index = self.blocks[block].params.len() as u32;
        let v = self.values.push(ValueData { ty, def: ValueDef::Param(block, index) });
        self.blocks[block].params.push(v);
        v
    }

    /// Append an op to `block`, creating one result per type.
    pub fn append_op(
        &mut self,
        block: Block,
        data: OpData,
        result_types: Vec<Type>,
        loc: Option<SrcLoc>,
    ) -> Op {
        let owned = data.blocks();
        let op = self.ops.push(OpNode { data, results: SmallVec::new(), block, loc });
        for (i, ty) in result_types.into_iter().enumerate() {
            let v = self.values.push(ValueData { ty, def: ValueDef::Result(op, i as u32) });
            self.ops[op].results.push(v);
        }
        for b in owned {
            self.blocks[b].parent = op.into();
        }
        self.blocks[block].ops.push(op);
        op
    }

    pub fn result(&self, op: Op) -> Value {
        self.ops[op].results[0]
    }

    /// The grid-index parameters of the entry block.
    pub fn grid_params(&self) -> &[Value] {
        &self.blocks[self.entry].params[..self.call.grid.len()]
    }

    /// Declare a buffer and its ref value (an entry-block parameter for operands and
    /// scratch; the caller makes the `Alloc` op for scoped ones).
    pub fn declare_buf(
        &mut self,
        name: String,
        origin: BufOrigin,
        space: MemorySpace,
        dtype: DType,
        shape: Shape,
        value: Value,
    ) -> Buf {
        self.bufs.push(BufData { name, origin, ty: RefType { space, dtype, shape }, value })
    }

    pub fn declare_sem(
        &mut self,
        name: String,
        origin: BufOrigin,
        kind: SemKind,
        shape: Shape,
        value: Value,
    ) -> Sem {
        self.sems.push(SemData { name, origin, kind, shape, value })
    }

    /// The op that defines `v`, if it is an op result.
    pub fn def_op(&self, v: Value) -> Option<Op> {
        match self.values[v].def {
            ValueDef::Result(op, _) => Some(op),
            ValueDef::Param(..) => None,
        }
    }

    /// The buffer or semaphore a ref value names directly (not through a slice).
    pub fn buf_of(&self, v: Value) -> Option<Buf> {
        self.bufs.iter().find(|(_, b)| b.value == v).map(|(id, _)| id)
    }

    pub fn sem_of(&self, v: Value) -> Option<Sem> {
        self.sems.iter().find(|(_, s)| s.value == v).map(|(id, _)| id)
    }

    /// A short human name for a value: the buffer name for refs, else its id.
    pub fn value_name(&self, v: Value) -> String {
        if let Some(b) = self.buf_of(v) {
            return format!("{v} ({})", self.bufs[b].name);
        }
        if let Some(s) = self.sem_of(v) {
            return format!("{v} ({})", self.sems[s].name);
        }
        v.to_string()
    }

    /// Every op in program order, recursing into regions (pre-order).
    pub fn walk(&self, block: Block, f: &mut dyn FnMut(Op)) {
        for &op in &self.blocks[block].ops {
            f(op);
            for b in self.ops[op].data.blocks() {
                self.walk(b, f);
            }
        }
    }
}
