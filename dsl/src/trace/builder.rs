//! [`KernelBuilder`]: declares the call spec, traces index maps and the body.
//!
//! The `#[kernel]` macro emits one declaration per ref parameter (in the user's order), then
//! [`KernelBuilder::seal`], which lays out the entry block in Pallas's operand order (grid
//! indices, scalar prefetch, inputs, outputs, scratch) and traces every index map, then the
//! body, then [`KernelBuilder::finish`], which verifies.

use super::refs::{Ref, SemRef};
use super::val::{Val, constant};
use super::{BuildError, BuildErrors, Tracer, in_block, install, uninstall, with};
use crate::ir::{
    BufOrigin, DType, ErrorSite, Kernel, Literal, MemorySpace, OpData, RefType, SemKind, Shape,
    SrcLoc, Type, Value, VerifyOptions,
};
use crate::spec::{
    BlockDim, CostEstimate, GridDim, Mesh, MeshAxis, OperandRole, OperandSpec, PipelineMode,
    ScratchSpec, Semantics, ValueRange,
};
use cranelift_entity::SecondaryMap;
use smallvec::SmallVec;

/// An index map: traced with the grid indices and the prefetch refs, returns block indices.
type IndexMapFn<'a> = Box<dyn FnOnce(&[Val], &[Ref]) -> Vec<Val> + 'a>;

/// An index-map closure as the macro passes it, returning a tuple of block indices.
pub type UserIndexMap<'a, M> = Box<dyn FnOnce(&[Val], &[Ref]) -> M + 'a>;

/// What an index-map closure may return: a tuple of block indices, each a traced i32 or a
/// Rust integer.
pub trait IndexMapOut {
    fn indices(self, loc: SrcLoc) -> Vec<Val>;
}

/// One block index.
pub trait BlockIndex {
    fn index(self, loc: SrcLoc) -> Val;
}

impl BlockIndex for Val {
    fn index(self, _: SrcLoc) -> Val {
        self
    }
}

macro_rules! int_block_index {
    ($($t:ty),*) => {$(
        impl BlockIndex for $t {
            fn index(self, loc: SrcLoc) -> Val { constant(Literal::Int(self as i64), Type::Scalar(DType::I32), loc) }
        }
    )*};
}
int_block_index!(i32, i64, u32, u64, usize);

impl<T: BlockIndex> IndexMapOut for T {
    fn indices(self, loc: SrcLoc) -> Vec<Val> {
        vec![self.index(loc)]
    }
}

macro_rules! tuple_map_out {
    ($($n:ident),*) => {
        impl<$($n: BlockIndex),*> IndexMapOut for ($($n,)*) {
            #[allow(non_snake_case)]
            fn indices(self, loc: SrcLoc) -> Vec<Val> {
                let ($($n,)*) = self;
                vec![$($n.index(loc)),*]
            }
        }
    };
}
tuple_map_out!(A);
tuple_map_out!(A, B);
tuple_map_out!(A, B, C);
tuple_map_out!(A, B, C, D);
tuple_map_out!(A, B, C, D, E);

/// A declared operand or scratch entry, turned into a handle by [`KernelBuilder::seal`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    Operand(usize),
    Scratch(usize),
}

/// The handles of a sealed kernel, in declaration order.
#[derive(Clone, Debug)]
pub enum Handle {
    Ref(Ref),
    Sem(SemRef),
}

impl Handle {
    /// The ref handle (the macro only asks for it on ref parameters).
    pub fn into_ref(self) -> Ref {
        match self {
            Handle::Ref(r) => r,
            Handle::Sem(s) => Ref(s.0),
        }
    }
    pub fn into_sem(self) -> SemRef {
        match self {
            Handle::Sem(s) => s,
            Handle::Ref(r) => SemRef(r.0),
        }
    }
}

/// A bad `--set NAME=VALUE` or unknown parameter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("kernel `{kernel}` has no parameter `{name}` (parameters: {known})")]
    Unknown { kernel: String, name: String, known: String },
    #[error("parameter `{name}` of kernel `{kernel}`: cannot parse `{value}` as {ty}")]
    BadValue { kernel: String, name: String, value: String, ty: String },
}

/// Builds one kernel: declarations, then tracing, then verification.
pub struct KernelBuilder<'a> {
    loc: SrcLoc,
    name: String,
    grid: Vec<GridDim>,
    slots: Vec<Slot>,
    operands: Vec<OperandSpec>,
    index_maps: Vec<Option<(IndexMapFn<'a>, SrcLoc)>>,
    scratch: Vec<ScratchSpec>,
    aliases: Vec<(usize, usize)>,
    vmem_limit_bytes: Option<u64>,
    cost: Option<CostEstimate>,
    mesh: Option<Mesh>,
    collective_id: Option<u32>,
    errors: Vec<BuildError>,
}

impl std::fmt::Debug for KernelBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBuilder").field("name", &self.name).finish_non_exhaustive()
    }
}

fn to_u64(x: impl TryInto<u64>, what: &str, loc: SrcLoc, errors: &mut Vec<BuildError>) -> u64 {
    x.try_into().unwrap_or_else(|_| {
        errors.push(BuildError {
            loc: Some(loc),
            message: format!("{what} must be a non-negative integer"),
        });
        1
    })
}

impl<'a> KernelBuilder<'a> {
    #[track_caller]
    pub fn new(name: &str) -> Self {
        KernelBuilder {
            loc: SrcLoc::caller(),
            name: name.to_string(),
            grid: Vec::new(),
            slots: Vec::new(),
            operands: Vec::new(),
            index_maps: Vec::new(),
            scratch: Vec::new(),
            aliases: Vec::new(),
            vmem_limit_bytes: None,
            cost: None,
            mesh: None,
            collective_id: None,
            errors: Vec::new(),
        }
    }

    /// Add a grid dimension.
    #[track_caller]
    pub fn grid_dim(&mut self, extent: impl TryInto<u64>, semantics: Semantics) -> &mut Self {
        let extent = to_u64(extent, "a grid extent", SrcLoc::caller(), &mut self.errors);
        self.grid.push(GridDim { extent, semantics });
        self
    }

    #[track_caller]
    pub fn vmem_limit_bytes(&mut self, bytes: impl TryInto<u64>) -> &mut Self {
        self.vmem_limit_bytes =
            Some(to_u64(bytes, "vmem_limit_bytes", SrcLoc::caller(), &mut self.errors));
        self
    }

    /// The device mesh the kernel runs on (axis name and size, major to minor): what
    /// `jax.shard_map` gives a Pallas kernel; remote DMAs and signals name its devices.
    #[track_caller]
    pub fn mesh(&mut self, axes: &[(&str, u64)]) -> &mut Self {
        let loc = SrcLoc::caller();
        let mut bad = |message: String| self.errors.push(BuildError { loc: Some(loc), message });
        if axes.is_empty() {
            bad("a mesh needs at least one axis, e.g. mesh = [x = 4]".into());
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            if *size == 0 {
                bad(format!("mesh axis `{name}` has size 0"));
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                bad(format!("mesh axis `{name}` appears twice"));
            }
        }
        self.mesh = Some(Mesh {
            axes: axes
                .iter()
                .map(|(name, size)| MeshAxis { name: name.to_string(), size: *size })
                .collect(),
        });
        self
    }

    /// `CompilerParams(collective_id=..)`: the id of the barrier semaphore this kernel uses.
    pub fn collective_id(&mut self, id: u32) -> &mut Self {
        self.collective_id = Some(id);
        self
    }

    pub fn cost_estimate(
        &mut self,
        flops: u64,
        transcendentals: u64,
        bytes_accessed: u64,
    ) -> &mut Self {
        self.cost = Some(CostEstimate { flops, transcendentals, bytes_accessed });
        self
    }

    /// `input_output_aliases={input: output}` by operand name.
    #[track_caller]
    pub fn alias(&mut self, input: &str, output: &str) -> &mut Self {
        let loc = SrcLoc::caller();
        let pos = |role: OperandRole, name: &str| {
            self.operands.iter().filter(|o| o.role == role).position(|o| o.name == name)
        };
        match (pos(OperandRole::Input, input), pos(OperandRole::Output, output)) {
            (Some(i), Some(o)) => self.aliases.push((i, o)),
            _ => self.errors.push(BuildError {
                loc: Some(loc),
                message: format!(
                    "alias {input} -> {output}: `{input}` must be an input and `{output}` an output"
                ),
            }),
        }
        self
    }

    /// Declare an operand: a scalar-prefetch array, an input or an output.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn operand<M: IndexMapOut + 'a>(
        &mut self,
        name: &str,
        role: OperandRole,
        dtype: DType,
        shape: &[u64],
        space: MemorySpace,
        block: Option<Vec<BlockDim>>,
        index_map: Option<UserIndexMap<'a, M>>,
    ) -> Slot {
        let loc = SrcLoc::caller();
        let index = self.operands.len();
        self.operands.push(OperandSpec {
            name: name.to_string(),
            role,
            dtype,
            shape: Shape::new(shape.to_vec()),
            space,
            block,
            index_map: None,
            loc: Some(loc),
            pipeline_mode: None,
            values: None,
        });
        self.index_maps.push(index_map.map(|f| -> (IndexMapFn<'a>, SrcLoc) {
            (Box::new(move |g: &[Val], p: &[Ref]| f(g, p).indices(loc)), loc)
        }));
        let slot = Slot::Operand(index);
        self.slots.push(slot);
        slot
    }

    /// `pipeline_mode = Buffered(n)` on a declared operand (the verifier checks that the
    /// operand is windowed and that Mosaic has a mode for `n`).
    #[track_caller]
    pub fn pipeline_mode(&mut self, operand: Slot, mode: PipelineMode) -> &mut Self {
        match operand {
            Slot::Operand(i) => self.operands[i].pipeline_mode = Some(mode),
            Slot::Scratch(_) => self.errors.push(BuildError {
                loc: Some(SrcLoc::caller()),
                message: format!("{mode}: scratch buffers are not pipelined"),
            }),
        }
        self
    }

    /// The values a declared scalar-prefetch operand may hold, `min..=max`
    /// ([`OperandSpec::values`]).
    #[track_caller]
    pub fn value_range(&mut self, operand: Slot, min: u64, max: u64) -> &mut Self {
        let why = match operand {
            Slot::Operand(i) if self.operands[i].role != OperandRole::Prefetch => {
                Some(format!("`{}` is not scalar prefetch", self.operands[i].name))
            }
            Slot::Operand(_) if min > max => Some("the range is empty".to_string()),
            Slot::Operand(i) => {
                self.operands[i].values = Some(ValueRange { min, max });
                None
            }
            Slot::Scratch(_) => Some("scratch holds no prefetch values".to_string()),
        };
        if let Some(why) = why {
            self.errors.push(BuildError {
                loc: Some(SrcLoc::caller()),
                message: format!("value range {min}..={max}: {why}"),
            });
        }
        self
    }

    pub fn scratch_buffer(
        &mut self,
        name: &str,
        space: MemorySpace,
        dtype: DType,
        shape: &[u64],
    ) -> Slot {
        self.scratch.push(ScratchSpec::Buffer {
            name: name.to_string(),
            space,
            dtype,
            shape: Shape::new(shape.to_vec()),
        });
        let slot = Slot::Scratch(self.scratch.len() - 1);
        self.slots.push(slot);
        slot
    }

    pub fn scratch_semaphores(&mut self, name: &str, kind: SemKind, shape: &[u64]) -> Slot {
        self.scratch.push(ScratchSpec::Semaphore {
            name: name.to_string(),
            kind,
            shape: Shape::new(shape.to_vec()),
        });
        let slot = Slot::Scratch(self.scratch.len() - 1);
        self.slots.push(slot);
        slot
    }

    /// Lay out the entry block, trace the index maps and start tracing the body. Returns the
    /// handles in declaration order and a guard whose [`Sealed::finish`] ends the trace.
    pub fn seal(mut self) -> Result<Sealed, BuildErrors> {
        // Pallas order: prefetch, inputs, outputs (stable within each role).
        let mut order: Vec<usize> = (0..self.operands.len()).collect();
        order.sort_by_key(|&i| match self.operands[i].role {
            OperandRole::Prefetch => 0,
            OperandRole::Input => 1,
            OperandRole::Output => 2,
        });
        let mut kernel = Kernel::new(self.name.clone());
        kernel.loc = Some(self.loc);
        let entry = kernel.entry;
        for _ in &self.grid {
            kernel.add_block_param(entry, Type::Scalar(DType::I32));
        }
        let mut operand_values = vec![Value::from_u32(0); self.operands.len()];
        let mut maps = std::mem::take(&mut self.index_maps);
        let mut sorted_maps = Vec::new();
        let mut operands = Vec::new();
        for (new_index, &i) in order.iter().enumerate() {
            let o = self.operands[i].clone();
            let ty = RefType { space: o.space, dtype: o.dtype, shape: o.window_shape() };
            let v = kernel.add_block_param(entry, Type::Ref(ty.clone()));
            kernel.declare_buf(
                o.name.clone(),
                BufOrigin::Operand(new_index),
                ty.space,
                ty.dtype,
                ty.shape,
                v,
            );
            operand_values[i] = v;
            sorted_maps.push(maps[i].take());
            operands.push(o);
        }
        let mut scratch_values = Vec::new();
        for (i, s) in self.scratch.iter().enumerate() {
            let v = match s {
                ScratchSpec::Buffer { name, space, dtype, shape } => {
                    let v = kernel.add_block_param(
                        entry,
                        Type::Ref(RefType { space: *space, dtype: *dtype, shape: shape.clone() }),
                    );
                    kernel.declare_buf(
                        name.clone(),
                        BufOrigin::Scratch(i),
                        *space,
                        *dtype,
                        shape.clone(),
                        v,
                    );
                    v
                }
                ScratchSpec::Semaphore { name, kind, shape } => {
                    let v = kernel.add_block_param(entry, Type::Sem(*kind, shape.clone()));
                    kernel.declare_sem(
                        name.clone(),
                        BufOrigin::Scratch(i),
                        *kind,
                        shape.clone(),
                        v,
                    );
                    v
                }
            };
            scratch_values.push(v);
        }
        kernel.call = crate::spec::CallSpec {
            grid: self.grid.clone(),
            operands,
            scratch: self.scratch.clone(),
            aliases: Vec::new(),
            vmem_limit_bytes: self.vmem_limit_bytes,
            cost: self.cost.clone(),
            mesh: self.mesh.clone(),
            collective_id: self.collective_id,
        };
        // Aliases were recorded by position among inputs/outputs, which sorting preserves.
        kernel.call.aliases = self.aliases.clone();
        let tracer = Tracer {
            kernel,
            blocks: vec![entry],
            errors: std::mem::take(&mut self.errors),
            poisoned: SecondaryMap::new(),
            ill_typed: SecondaryMap::new(),
            value_ranges: SecondaryMap::new(),
        };
        if !install(tracer) {
            return Err(BuildErrors(vec![BuildError {
                loc: Some(self.loc),
                message: "a kernel cannot be traced while another is being traced".into(),
            }]));
        }
        let guard = Sealed { handles: Vec::new(), slots: self.slots.clone() };
        with(|t| {
            for (o, &v) in self.operands.iter().zip(&operand_values) {
                if o.role == OperandRole::Prefetch {
                    t.value_ranges.insert(v, o.values);
                }
            }
        });
        // Index maps: one block each, taking the grid indices and the prefetch refs.
        let (prefetch, ranges): (Vec<RefType>, Vec<_>) = with(|t| {
            t.kernel
                .call
                .operands_of(OperandRole::Prefetch)
                .map(|p| {
                    (RefType { space: p.space, dtype: p.dtype, shape: p.shape.clone() }, p.values)
                })
                .unzip()
        });
        for (i, map) in sorted_maps.into_iter().enumerate() {
            let Some((f, loc)) = map else { continue };
            let mut types: Vec<Type> = self.grid.iter().map(|_| Type::Scalar(DType::I32)).collect();
            types.extend(prefetch.iter().cloned().map(Type::Ref));
            let (block, params) = with(|t| {
                let (block, params) = t.new_block(&types);
                for (&v, &range) in params[self.grid.len()..].iter().zip(&ranges) {
                    t.value_ranges.insert(v, range);
                }
                (block, params)
            });
            let g: Vec<Val> = params[..self.grid.len()].iter().map(|&v| Val(v)).collect();
            let p: Vec<Ref> = params[self.grid.len()..].iter().map(|&v| Ref(v)).collect();
            in_block(block, || {
                let out = f(&g, &p);
                let values: SmallVec<[Value; 4]> = out.iter().map(|v| v.0).collect();
                with(|t| t.emit(OpData::Yield { values }, loc, &[]));
            });
            with(|t| t.kernel.call.operands[i].index_map = Some(block));
        }
        let mut guard = guard;
        for slot in &self.slots {
            guard.handles.push(match *slot {
                Slot::Operand(i) => Handle::Ref(Ref(operand_values[i])),
                Slot::Scratch(i) => match &self.scratch[i] {
                    ScratchSpec::Buffer { .. } => Handle::Ref(Ref(scratch_values[i])),
                    ScratchSpec::Semaphore { .. } => Handle::Sem(SemRef(scratch_values[i])),
                },
            });
        }
        Ok(guard)
    }
}

/// A kernel whose body is being traced. Dropping it without [`Sealed::finish`] discards the
/// trace (e.g. when the kernel function panics).
#[derive(Debug)]
pub struct Sealed {
    pub handles: Vec<Handle>,
    /// The slot each handle was declared as (what the declaration returned).
    slots: Vec<Slot>,
}

impl Sealed {
    /// The handle of the operand or scratch entry whose declaration returned `slot`: code
    /// that declares from a list keeps the slots it was given instead of counting positions.
    pub fn handle(&self, slot: Slot) -> Handle {
        let i = self.slots.iter().position(|s| *s == slot);
        self.handles[i.expect("a slot this kernel's builder returned")].clone()
    }

    /// Stop tracing and verify. Returns every trace and verifier error together.
    pub fn finish(self) -> Result<Kernel, BuildErrors> {
        let tracer = uninstall();
        std::mem::forget(self);
        let Some(tracer) = tracer else {
            return Err(BuildErrors(vec![BuildError {
                loc: None,
                message: "kernel trace was lost".into(),
            }]));
        };
        let mut tracer = tracer;
        tracer.drop_unused_slices();
        let kernel = tracer.kernel;
        let mut errors = tracer.errors;
        let traced_cleanly = errors.is_empty();
        if let Err(found) = crate::ir::verify(&kernel, VerifyOptions::default()) {
            // After a trace error, the verifier's findings are reported too (all at once), but
            // not those about ops the error poisoned or about region ops (whose yields a
            // poisoned carry may have cut short): they would repeat the trace error.
            let independent = |e: &crate::ir::VerifierError| match e.site {
                ErrorSite::Call(_) => true,
                ErrorSite::Op(op) => {
                    let node = &kernel.ops[op];
                    node.data.blocks().is_empty()
                        && !tracer.ill_typed[op]
                        && !node
                            .data
                            .operands()
                            .iter()
                            .chain(&node.results)
                            .any(|&v| tracer.poisoned[v])
                }
            };
            errors.extend(
                found
                    .0
                    .into_iter()
                    .filter(|e| traced_cleanly || independent(e))
                    .map(|e| BuildError { loc: e.loc, message: e.to_string() }),
            );
        }
        if errors.is_empty() { Ok(kernel) } else { Err(BuildErrors(errors)) }
    }
}

impl Drop for Sealed {
    fn drop(&mut self) {
        uninstall();
    }
}
