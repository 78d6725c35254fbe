//! Entity references of the kernel IR.
//!
//! Everything in a [`Kernel`](super::Kernel) lives in a `cranelift_entity::PrimaryMap` arena
//! and is named by a 4-byte id, as in Cranelift: ids are `Copy`, compare cheaply, index dense
//! side tables (`SecondaryMap`) and print as `v3`, `op7`, `bb2`, so the printed IR names the
//! same thing the verifier and the lowering talk about.

use cranelift_entity::entity_impl;

/// An SSA value: a scalar, a vector, a ref (memory window) or a semaphore ref.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);
entity_impl!(Value, "v");

/// An operation.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op(u32);
entity_impl!(Op, "op");

/// A block: an ordered list of ops with parameters. Regions of structured control flow
/// (`if`, `for`, `while`, `run_scoped`) and index-map functions are blocks.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block(u32);
entity_impl!(Block, "bb");

/// A memory buffer: a kernel operand window, a scratch buffer or a scoped allocation.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Buf(u32);
entity_impl!(Buf, "buf");

/// A semaphore (or array of semaphores): scratch or scoped.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sem(u32);
entity_impl!(Sem, "sem");
