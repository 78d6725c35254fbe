//! Test helpers: build kernels with the low-level `Kernel` API, and run the TPU oracle.
#![allow(dead_code)]

use palladium_dsl::ir::infer::result_types;
use palladium_dsl::ir::{
    Block, BufOrigin, DType, Index, Kernel, Literal, MemorySpace, OpData, Offset, SemKind, Shape, SrcLoc, Type, Value,
};
use palladium_dsl::spec::{BlockDim, GridDim, OperandRole, OperandSpec, ScratchSpec, Semantics};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A kernel under construction.
pub struct K {
    pub k: Kernel,
}

pub fn shape(d: &[u64]) -> Shape {
    Shape::new(d.to_vec())
}

/// A whole-dim slice `0:+n` for each dim.
pub fn full(dims: &[u64]) -> Vec<Index> {
    dims.iter().map(|&n| Index::Slice { start: Offset::Static(0), size: n }).collect()
}

impl K {
    #[track_caller]
    pub fn new(name: &str) -> K {
        let mut k = Kernel::new(name);
        k.loc = Some(SrcLoc::caller());
        K { k }
    }

    pub fn entry(&self) -> Block {
        self.k.entry
    }

    /// Append an op typed by the shared typing rules; panics (in tests) if ill typed.
    #[track_caller]
    pub fn ops(&mut self, block: Block, data: OpData) -> Vec<Value> {
        let tys = result_types(&self.k, &data).unwrap_or_else(|e| panic!("ill-typed {data:?}: {e}"));
        let op = self.k.append_op(block, data, tys.into_vec(), Some(SrcLoc::caller()));
        self.k.ops[op].results.to_vec()
    }

    #[track_caller]
    pub fn op(&mut self, block: Block, data: OpData) -> Value {
        self.ops(block, data)[0]
    }

    #[track_caller]
    pub fn op0(&mut self, block: Block, data: OpData) {
        self.ops(block, data);
    }

    #[track_caller]
    pub fn c(&mut self, block: Block, value: Literal, ty: Type) -> Value {
        self.op(block, OpData::Constant { value, ty })
    }

    #[track_caller]
    pub fn i32(&mut self, block: Block, v: i64) -> Value {
        self.c(block, Literal::Int(v), Type::Scalar(DType::I32))
    }

    #[track_caller]
    pub fn yield_(&mut self, block: Block, values: &[Value]) {
        self.op0(block, OpData::Yield { values: values.iter().copied().collect() });
    }

    pub fn grid(&mut self, dims: &[(u64, Semantics)]) -> Vec<Value> {
        self.k.call.grid = dims.iter().map(|&(extent, semantics)| GridDim { extent, semantics }).collect();
        let entry = self.k.entry;
        dims.iter().map(|_| self.k.add_block_param(entry, Type::Scalar(DType::I32))).collect()
    }

    /// Add an operand (prefetch/input/output) and its entry parameter; returns the ref.
    pub fn operand(&mut self, name: &str, role: OperandRole, dtype: DType, array: &[u64], space: MemorySpace, block: Option<Vec<BlockDim>>) -> Value {
        let spec = OperandSpec { name: name.into(), role, dtype, shape: shape(array), space, block, index_map: None };
        let window = spec.window_shape();
        let i = self.k.call.operands.len();
        self.k.call.operands.push(spec);
        let entry = self.k.entry;
        let ty = Type::Ref(palladium_dsl::ir::RefType { space, dtype, shape: window.clone() });
        let v = self.k.add_block_param(entry, ty);
        self.k.declare_buf(name.into(), BufOrigin::Operand(i), space, dtype, window, v);
        v
    }

    /// Give operand `i` an index map: `f(kernel, block, grid params, prefetch params)` returns
    /// the block indices.
    pub fn index_map(&mut self, i: usize, f: impl FnOnce(&mut K, Block, &[Value], &[Value]) -> Vec<Value>) {
        let b = self.k.new_block();
        let grid: Vec<Value> = (0..self.k.call.grid.len()).map(|_| self.k.add_block_param(b, Type::Scalar(DType::I32))).collect();
        let prefetch: Vec<(DType, Shape, MemorySpace)> =
            self.k.call.operands_of(OperandRole::Prefetch).map(|o| (o.dtype, o.shape.clone(), o.space)).collect();
        let pf: Vec<Value> = prefetch
            .into_iter()
            .map(|(dtype, shape, space)| self.k.add_block_param(b, Type::Ref(palladium_dsl::ir::RefType { space, dtype, shape })))
            .collect();
        let out = f(self, b, &grid, &pf);
        self.yield_(b, &out);
        self.k.call.operands[i].index_map = Some(b);
    }

    pub fn scratch_buf(&mut self, name: &str, space: MemorySpace, dtype: DType, dims: &[u64]) -> Value {
        let i = self.k.call.scratch.len();
        self.k.call.scratch.push(ScratchSpec::Buffer { name: name.into(), space, dtype, shape: shape(dims) });
        let entry = self.k.entry;
        let v = self.k.add_block_param(entry, Type::Ref(palladium_dsl::ir::RefType { space, dtype, shape: shape(dims) }));
        self.k.declare_buf(name.into(), BufOrigin::Scratch(i), space, dtype, shape(dims), v);
        v
    }

    pub fn scratch_sem(&mut self, name: &str, kind: SemKind, dims: &[u64]) -> Value {
        let i = self.k.call.scratch.len();
        self.k.call.scratch.push(ScratchSpec::Semaphore { name: name.into(), kind, shape: shape(dims) });
        let entry = self.k.entry;
        let v = self.k.add_block_param(entry, Type::Sem(kind, shape(dims)));
        self.k.declare_sem(name.into(), BufOrigin::Scratch(i), kind, shape(dims), v);
        v
    }
}

// --- the kernels of the tests ------------------------------------------------------------------

/// Pallas's reference tiled matmul (`oracle.py pallas matmul`): bf16 1024x2048 @ 2048x1024,
/// blocks 256x512x256, f32 VMEM accumulator, grid (4,4,4) parallel/parallel/arbitrary.
pub fn matmul_kernel() -> Kernel {
    use palladium_dsl::ir::{BinaryOp, CmpPred, DotDims, Precision};
    let (bm, bk, bn) = (256, 512, 256);
    let mut b = K::new("matmul_kernel");
    let g = b.grid(&[(4, Semantics::Parallel), (4, Semantics::Parallel), (4, Semantics::Arbitrary)]);
    let x = b.operand("x", OperandRole::Input, DType::Bf16, &[1024, 2048], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bk)]));
    let y = b.operand("y", OperandRole::Input, DType::Bf16, &[2048, 1024], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bk), BlockDim::Blocked(bn)]));
    let o = b.operand("o", OperandRole::Output, DType::Bf16, &[1024, 1024], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bn)]));
    let acc = b.scratch_buf("acc", MemorySpace::Vmem, DType::F32, &[bm, bn]);
    b.index_map(0, |_, _, g, _| vec![g[0], g[2]]);
    b.index_map(1, |_, _, g, _| vec![g[2], g[1]]);
    b.index_map(2, |_, _, g, _| vec![g[0], g[1]]);
    let e = b.entry();
    let _ = g;

    // @pl.when(pl.program_id(2) == 0): acc[...] = zeros
    let pid = b.op(e, OpData::ProgramId { axis: 2 });
    let zero = b.i32(e, 0);
    let first = b.op(e, OpData::Compare { pred: CmpPred::Eq, lhs: pid, rhs: zero });
    let (t, f) = (b.k.new_block(), b.k.new_block());
    let z = b.c(t, Literal::Float(0.0), Type::Scalar(DType::F32));
    let zb = b.op(t, OpData::Broadcast { x: z, shape: shape(&[bm, bn]) });
    b.op0(t, OpData::Store { dst: acc, index: full(&[bm, bn]), value: zb, mask: None });
    b.yield_(t, &[]);
    b.yield_(f, &[]);
    b.op0(e, OpData::If { cond: first, then_block: t, else_block: f });

    // acc[...] += x @ y
    let a = b.op(e, OpData::Load { src: acc, index: full(&[bm, bn]) });
    let xv = b.op(e, OpData::Load { src: x, index: full(&[bm, bk]) });
    let yv = b.op(e, OpData::Load { src: y, index: full(&[bk, bn]) });
    let d = b.op(e, OpData::Dot { lhs: xv, rhs: yv, dims: DotDims::matmul(), precision: Precision::Default, out: DType::F32 });
    let s = b.op(e, OpData::Binary { op: BinaryOp::Add, lhs: a, rhs: d });
    b.op0(e, OpData::Store { dst: acc, index: full(&[bm, bn]), value: s, mask: None });

    // @pl.when(pl.program_id(2) == pl.num_programs(2) - 1): o[...] = acc.astype(bf16)
    // (Pallas folds `num_programs(2) - 1` to 3 at trace time; so does this kernel.)
    let last_k = b.i32(e, 3);
    let last = b.op(e, OpData::Compare { pred: CmpPred::Eq, lhs: pid, rhs: last_k });
    let (t, f) = (b.k.new_block(), b.k.new_block());
    let a = b.op(t, OpData::Load { src: acc, index: full(&[bm, bn]) });
    let c = b.op(t, OpData::Cast { x: a, to: DType::Bf16 });
    b.op0(t, OpData::Store { dst: o, index: full(&[bm, bn]), value: c, mask: None });
    b.yield_(t, &[]);
    b.yield_(f, &[]);
    b.op0(e, OpData::If { cond: last, then_block: t, else_block: f });
    b.k
}

// --- the oracle ---------------------------------------------------------------------------------

/// `../shared/tpu-oracle/oracle.py` relative to the repository root.
pub fn oracle_script() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tpu-oracle/oracle.py");
    assert!(p.is_file(), "the TPU oracle is missing: expected {} (a checkout of shared/ beside the repository)", p.display());
    p
}

/// The oracle's Python: `$PALLADIUM_TPU_VENV/bin/python`, default `~/.cache/palladium/venv-tpu`.
pub fn oracle_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is not set");
        Path::new(&home).join(".cache/palladium/venv-tpu")
    });
    let py = venv.join("bin/python");
    assert!(py.is_file(), "the TPU oracle venv is missing: expected {} (set PALLADIUM_TPU_VENV)", py.display());
    py
}

/// Run `oracle.py ARGS…` in `dir`; returns (success, stdout).
pub fn oracle(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(oracle_python())
        .arg(oracle_script())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("cannot run the oracle");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A fresh scratch directory under the target dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("cannot create a scratch dir");
    d
}

/// Scalar prefetch + manual DMA: `idx: i32[4]` (SMEM prefetch) picks which row block of `y`
/// each grid step sees (index map reads SMEM); the kernel reads `idx[i]` itself, copies
/// `table[idx[i]]` (an ANY ref) into slot 0 of a VMEM scratch with DMA semaphore 0 of a
/// semaphore array, waits, and writes `table_block + y_block + idx[i]`.
pub fn dma_prefetch_kernel() -> Kernel {
    use palladium_dsl::ir::{BinaryOp};
    let mut b = K::new("dma_prefetch_kernel");
    b.grid(&[(4, Semantics::Arbitrary)]);
    let idx = b.operand("idx", OperandRole::Prefetch, DType::I32, &[4], MemorySpace::Smem, None);
    let table = b.operand("table", OperandRole::Input, DType::F32, &[8, 16, 128], MemorySpace::Any, None);
    let y = b.operand("y", OperandRole::Input, DType::F32, &[64, 128], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(16), BlockDim::Blocked(128)]));
    let o = b.operand("o", OperandRole::Output, DType::F32, &[64, 128], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(16), BlockDim::Blocked(128)]));
    let buf = b.scratch_buf("buf", MemorySpace::Vmem, DType::F32, &[2, 16, 128]);
    let sems = b.scratch_sem("sems", SemKind::Dma, &[2]);
    b.index_map(2, |b, m, g, pf| {
        let row = b.op(m, OpData::Load { src: pf[0], index: vec![Index::Point(Offset::Dynamic(g[0]))] });
        let zero = b.i32(m, 0);
        vec![row, zero]
    });
    b.index_map(3, |b, m, g, _| {
        let zero = b.i32(m, 0);
        vec![g[0], zero]
    });
    let e = b.entry();
    let i = b.op(e, OpData::ProgramId { axis: 0 });
    let r = b.op(e, OpData::Load { src: idx, index: vec![Index::Point(Offset::Dynamic(i))] });
    let slice = |n| Index::Slice { start: Offset::Static(0), size: n };
    let src = b.op(e, OpData::RefSlice { base: table, index: vec![Index::Point(Offset::Dynamic(r)), slice(16), slice(128)] });
    let dst = b.op(e, OpData::RefSlice { base: buf, index: vec![Index::Point(Offset::Static(0)), slice(16), slice(128)] });
    let sem = b.op(e, OpData::RefSlice { base: sems, index: vec![Index::Point(Offset::Static(0))] });
    b.op0(e, OpData::DmaStart { src, dst, sem, remote: None, priority: 0 });
    // Pallas re-derives the refs at `.wait()`; so does this kernel.
    let src = b.op(e, OpData::RefSlice { base: table, index: vec![Index::Point(Offset::Dynamic(r)), slice(16), slice(128)] });
    let dst = b.op(e, OpData::RefSlice { base: buf, index: vec![Index::Point(Offset::Static(0)), slice(16), slice(128)] });
    let sem = b.op(e, OpData::RefSlice { base: sems, index: vec![Index::Point(Offset::Static(0))] });
    b.op0(e, OpData::DmaWait { src, dst, sem, device_id: None });
    let t = b.op(e, OpData::Load { src: buf, index: vec![Index::Point(Offset::Static(0)), slice(16), slice(128)] });
    let yv = b.op(e, OpData::Load { src: y, index: full(&[16, 128]) });
    let s = b.op(e, OpData::Binary { op: BinaryOp::Add, lhs: t, rhs: yv });
    let rf = b.op(e, OpData::Cast { x: r, to: DType::F32 });
    let rb = b.op(e, OpData::Broadcast { x: rf, shape: shape(&[16, 128]) });
    let s = b.op(e, OpData::Binary { op: BinaryOp::Add, lhs: s, rhs: rb });
    b.op0(e, OpData::Store { dst: o, index: full(&[16, 128]), value: s, mask: None });
    b.k
}

/// `RMSNorm` over rows of 1024: `x * rsqrt(mean(x^2) + eps) * w`, f32, 8-row blocks.
pub fn rmsnorm_kernel() -> Kernel {
    use palladium_dsl::ir::{BinaryOp, ReduceOp, UnaryOp};
    let (rows, d, bm) = (256, 1024, 8);
    let mut b = K::new("rmsnorm_kernel");
    b.grid(&[(rows / bm, Semantics::Parallel)]);
    let x = b.operand("x", OperandRole::Input, DType::F32, &[rows, d], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(d)]));
    let w = b.operand("w", OperandRole::Input, DType::F32, &[1, d], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(1), BlockDim::Blocked(d)]));
    let o = b.operand("o", OperandRole::Output, DType::F32, &[rows, d], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(d)]));
    b.index_map(0, |b, m, g, _| {
        let z = b.i32(m, 0);
        vec![g[0], z]
    });
    b.index_map(1, |b, m, _, _| {
        let z = b.i32(m, 0);
        let z2 = b.i32(m, 0);
        vec![z, z2]
    });
    b.index_map(2, |b, m, g, _| {
        let z = b.i32(m, 0);
        vec![g[0], z]
    });
    let e = b.entry();
    let xv = b.op(e, OpData::Load { src: x, index: full(&[bm, d]) });
    let sq = b.op(e, OpData::Binary { op: BinaryOp::Mul, lhs: xv, rhs: xv });
    let ss = b.op(e, OpData::Reduce { op: ReduceOp::Sum, x: sq, axes: vec![1] });
    let ss = b.op(e, OpData::Reshape { x: ss, shape: shape(&[bm, 1]) });
    let inv_d = b.c(e, Literal::Float(1.0 / d as f64), Type::Vector(shape(&[bm, 1]), DType::F32));
    let mean = b.op(e, OpData::Binary { op: BinaryOp::Mul, lhs: ss, rhs: inv_d });
    let eps = b.c(e, Literal::Float(1e-6), Type::Scalar(DType::F32));
    let eps = b.op(e, OpData::Broadcast { x: eps, shape: shape(&[bm, 1]) });
    let m = b.op(e, OpData::Binary { op: BinaryOp::Add, lhs: mean, rhs: eps });
    let r = b.op(e, OpData::Unary { op: UnaryOp::Rsqrt, x: m });
    let rb = b.op(e, OpData::Broadcast { x: r, shape: shape(&[bm, d]) });
    let y = b.op(e, OpData::Binary { op: BinaryOp::Mul, lhs: xv, rhs: rb });
    let wv = b.op(e, OpData::Load { src: w, index: full(&[1, d]) });
    let wb = b.op(e, OpData::Broadcast { x: wv, shape: shape(&[bm, d]) });
    let out = b.op(e, OpData::Binary { op: BinaryOp::Mul, lhs: y, rhs: wb });
    b.op0(e, OpData::Store { dst: o, index: full(&[bm, d]), value: out, mask: None });
    b.k
}

/// A grid-less kernel exercising the remaining rules: iota, compare, select, `scf.for` with
/// a carried vector, `scf.while`, a reduction to a scalar stored to SMEM, and `run_scoped`
/// with a scoped VMEM buffer and DMA semaphore copying to an ANY output.
pub fn misc_kernel() -> Kernel {
    use palladium_dsl::ir::{BinaryOp, CmpPred, ReduceOp};
    let mut b = K::new("misc_kernel");
    let x = b.operand("x", OperandRole::Input, DType::F32, &[8, 128], MemorySpace::Vmem, None);
    let o = b.operand("o", OperandRole::Output, DType::F32, &[8, 128], MemorySpace::Vmem, None);
    let s = b.operand("s", OperandRole::Output, DType::F32, &[2], MemorySpace::Smem, None);
    let o2 = b.operand("o2", OperandRole::Output, DType::F32, &[8, 128], MemorySpace::Any, None);
    let e = b.entry();
    let v8 = |d| Type::Vector(shape(&[8, 128]), d);
    let xv = b.op(e, OpData::Load { src: x, index: full(&[8, 128]) });
    let io = b.op(e, OpData::Iota { shape: shape(&[8, 128]), dim: 1 });
    let lim = b.c(e, Literal::Int(100), v8(DType::I32));
    let m = b.op(e, OpData::Compare { pred: CmpPred::Lt, lhs: io, rhs: lim });
    let zero = b.c(e, Literal::Float(0.0), v8(DType::F32));
    let sel = b.op(e, OpData::Select { cond: m, on_true: xv, on_false: zero });
    // for i in 0..4 { acc += x }
    let (lo, hi, st) = (b.i32(e, 0), b.i32(e, 4), b.i32(e, 1));
    let body = b.k.new_block();
    let _iv = b.k.add_block_param(body, Type::Scalar(DType::I32));
    let acc = b.k.add_block_param(body, v8(DType::F32));
    let acc2 = b.op(body, OpData::Binary { op: BinaryOp::Add, lhs: acc, rhs: xv });
    b.yield_(body, &[acc2]);
    let r = b.op(e, OpData::For { lower: lo, upper: hi, step: st, init: vec![sel], body });
    // total = sum(r) -> s[0]
    let total = b.op(e, OpData::Reduce { op: ReduceOp::Sum, x: r, axes: vec![0, 1] });
    b.op0(e, OpData::Store { dst: s, index: vec![Index::Point(Offset::Static(0))], value: total, mask: None });
    // n = while n < 3 { n + 1 } -> s[1]
    let n0 = b.i32(e, 0);
    let (cond, wbody) = (b.k.new_block(), b.k.new_block());
    let cn = b.k.add_block_param(cond, Type::Scalar(DType::I32));
    let three = b.i32(cond, 3);
    let lt = b.op(cond, OpData::Compare { pred: CmpPred::Lt, lhs: cn, rhs: three });
    b.yield_(cond, &[lt]);
    let bn = b.k.add_block_param(wbody, Type::Scalar(DType::I32));
    let one = b.i32(wbody, 1);
    let bn1 = b.op(wbody, OpData::Binary { op: BinaryOp::Add, lhs: bn, rhs: one });
    b.yield_(wbody, &[bn1]);
    let n = b.op(e, OpData::While { init: vec![n0], cond, body: wbody });
    let nf = b.op(e, OpData::Cast { x: n, to: DType::F32 });
    b.op0(e, OpData::Store { dst: s, index: vec![Index::Point(Offset::Static(1))], value: nf, mask: None });
    b.op0(e, OpData::Store { dst: o, index: full(&[8, 128]), value: r, mask: None });
    // run_scoped: buf = VMEM scratch, sem = DMA semaphore; buf = r; copy buf -> o2.
    let scope = b.k.new_block();
    let placeholder = r;
    let buf = b.k.declare_buf("tmp".into(), BufOrigin::Scratch(usize::MAX), MemorySpace::Vmem, DType::F32, shape(&[8, 128]), placeholder);
    let a = b.op(scope, OpData::Alloc { buf });
    b.k.bufs[buf].value = a;
    b.k.bufs[buf].origin = BufOrigin::Scoped(b.k.def_op(a).unwrap());
    let sem = b.k.declare_sem("tmp_sem".into(), BufOrigin::Scratch(usize::MAX), SemKind::Dma, shape(&[]), placeholder);
    let sv = b.op(scope, OpData::SemAlloc { sem });
    b.k.sems[sem].value = sv;
    b.k.sems[sem].origin = BufOrigin::Scoped(b.k.def_op(sv).unwrap());
    b.op0(scope, OpData::Store { dst: a, index: full(&[8, 128]), value: r, mask: None });
    b.op0(scope, OpData::DmaStart { src: a, dst: o2, sem: sv, remote: None, priority: 0 });
    b.op0(scope, OpData::DmaWait { src: a, dst: o2, sem: sv, device_id: None });
    b.yield_(scope, &[]);
    b.op0(e, OpData::RunScoped { body: scope });
    b.k
}
