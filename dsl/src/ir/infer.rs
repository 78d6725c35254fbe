//! Typing rules: the result types of an op from its operands and attributes.
//!
//! One function serves both sides: the tracing builder calls it to type a new op (and turns
//! an `Err` into a build error at the user's source line), and the verifier calls it to
//! check that a kernel built by any other means (the fusion pass, tests) is well typed.

use super::BinaryOp;
use super::{
    DType, Index, Kernel, MemorySpace, Offset, OpData, SemKind, Shape, Type, UnaryOp, Value,
    WaitSide,
};
use smallvec::{SmallVec, smallvec};

pub type Types = SmallVec<[Type; 1]>;

fn array_of(k: &Kernel, v: Value, what: &str) -> Result<(Shape, DType), String> {
    match k.ty(v) {
        Type::Scalar(d) => Ok((Shape::default(), *d)),
        Type::Vector(s, d) => Ok((s.clone(), *d)),
        t => Err(format!("{what} must be a scalar or vector, got {t}")),
    }
}

fn scalar_i32(k: &Kernel, v: Value, what: &str) -> Result<(), String> {
    match k.ty(v) {
        Type::Scalar(DType::I32) => Ok(()),
        t => Err(format!("{what} must be an i32 scalar, got {t}")),
    }
}

/// The shape that indexing a ref of `shape` with `index` selects: slices keep their size,
/// points drop their dim. Checks static bounds.
pub fn indexed_shape(k: &Kernel, shape: &Shape, index: &[Index]) -> Result<Shape, String> {
    if index.len() != shape.rank() {
        return Err(format!(
            "{} indices for a ref of rank {} ({shape})",
            index.len(),
            shape.rank()
        ));
    }
    let mut out = Vec::new();
    for (d, (i, &extent)) in index.iter().zip(shape.dims()).enumerate() {
        if let Offset::Dynamic(v) = i.offset() {
            scalar_i32(k, v, &format!("index of dim {d}"))?;
        }
        if i.stride() != 1 && d + 1 == shape.rank() {
            return Err(format!(
                "a stride along the last (lane) dim of {shape}: Mosaic strides loads and stores along the leading dims only"
            ));
        }
        let (size, span) = (i.size(), i.span());
        if size == 0 || span > extent {
            return Err(format!(
                "slice of size {size}{} along dim {d} of {shape}",
                if i.stride() == 1 { String::new() } else { format!(" and stride {}", i.stride()) }
            ));
        }
        if let Offset::Static(o) = i.offset()
            && (o < 0 || o as u64 + span > extent)
        {
            return Err(format!("index {i} is out of bounds along dim {d} (extent {extent})"));
        }
        if let Index::Slice { size, .. } = i {
            out.push(*size);
        }
    }
    Ok(Shape(out))
}

/// numpy broadcasting of `from` to `to` (trailing-aligned, size-1 dims stretch).
pub fn broadcastable(from: &Shape, to: &Shape) -> bool {
    from.rank() <= to.rank()
        && from.dims().iter().rev().zip(to.dims().iter().rev()).all(|(&a, &b)| a == b || a == 1)
}

fn float_only(op: UnaryOp) -> bool {
    !matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
}

/// Result types of `data` in `kernel`, or why the op is ill typed.
pub fn result_types(k: &Kernel, data: &OpData) -> Result<Types, String> {
    Ok(match data {
        OpData::Constant { value, ty } => {
            let d = ty.dtype().filter(|_| matches!(ty, Type::Scalar(_) | Type::Vector(..)));
            let Some(d) = d else {
                return Err(format!("constants must be scalars or vectors, not {ty}"));
            };
            let ok = match value {
                super::Literal::Int(_) => d.is_int() || d.is_float(),
                super::Literal::Float(_) => d.is_float(),
                super::Literal::Bool(_) => d == DType::Bool,
            };
            if !ok {
                return Err(format!("literal {value} does not fit dtype {d}"));
            }
            smallvec![ty.clone()]
        }
        OpData::ProgramId { axis } | OpData::NumPrograms { axis } => {
            let rank = k.call.grid.len();
            if *axis as usize >= rank {
                return Err(format!("grid axis {axis} out of range: the grid has {rank} dims"));
            }
            smallvec![Type::Scalar(DType::I32)]
        }
        OpData::Iota { shape, dim } => {
            if *dim as usize >= shape.rank() {
                return Err(format!("iota dim {dim} out of range for shape {shape}"));
            }
            smallvec![Type::Vector(shape.clone(), DType::I32)]
        }
        OpData::Unary { op, x } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if float_only(*op) && !d.is_float() {
                return Err(format!("{op} needs a float operand, got {d}"));
            }
            if *op == UnaryOp::Not && d.is_float() {
                return Err(format!("not needs an integer or bool operand, got {d}"));
            }
            if matches!(op, UnaryOp::Reciprocal | UnaryOp::ReciprocalApprox)
                && (d != DType::F32 || s.rank() == 0)
            {
                return Err(format!(
                    "{op} takes an f32 vector (as tpu.reciprocal), got {}",
                    k.ty(*x)
                ));
            }
            smallvec![Type::array(s, d)]
        }
        OpData::Binary { op, lhs, rhs } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            if ls != rs || ld != rd {
                return Err(format!("operand types differ: {} vs {}", k.ty(*lhs), k.ty(*rhs)));
            }
            let bitwise = matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor);
            let shift = matches!(op, BinaryOp::Shl | BinaryOp::Shr);
            if (bitwise && ld.is_float()) || (shift && !ld.is_int()) {
                return Err(format!("{op} is not defined on {ld}"));
            }
            if *op == BinaryOp::Pow && !ld.is_float() {
                return Err(format!("pow needs float operands, got {ld}"));
            }
            if !bitwise && ld == DType::Bool {
                return Err(format!("{op} is not defined on bool"));
            }
            smallvec![Type::array(ls, ld)]
        }
        OpData::Compare { lhs, rhs, .. } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            if ls != rs || ld != rd {
                return Err(format!("operand types differ: {} vs {}", k.ty(*lhs), k.ty(*rhs)));
            }
            smallvec![Type::array(ls, DType::Bool)]
        }
        OpData::Select { cond, on_true, on_false } => {
            let (cs, cd) = array_of(k, *cond, "condition")?;
            let (ts, td) = array_of(k, *on_true, "true value")?;
            if k.ty(*on_true) != k.ty(*on_false) {
                return Err(format!(
                    "branch types differ: {} vs {}",
                    k.ty(*on_true),
                    k.ty(*on_false)
                ));
            }
            if cd != DType::Bool || (cs != ts && cs.rank() != 0) {
                return Err(format!(
                    "condition must be bool of shape {ts} (or a scalar), got {}",
                    k.ty(*cond)
                ));
            }
            smallvec![Type::array(ts, td)]
        }
        OpData::Cast { x, to } => {
            let (s, _) = array_of(k, *x, "operand")?;
            smallvec![Type::array(s, *to)]
        }
        OpData::Broadcast { x, shape } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if !broadcastable(&s, shape) || shape.rank() == 0 {
                return Err(format!("cannot broadcast {s} to {shape}"));
            }
            smallvec![Type::Vector(shape.clone(), d)]
        }
        OpData::Reshape { x, shape } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if s.num_elements() != shape.num_elements() {
                return Err(format!(
                    "cannot reshape {s} ({} elements) to {shape}",
                    s.num_elements()
                ));
            }
            smallvec![Type::array(shape.clone(), d)]
        }
        OpData::Transpose { x, perm } => {
            let (s, d) = array_of(k, *x, "operand")?;
            let mut seen = vec![false; s.rank()];
            for &p in perm {
                match seen.get_mut(p as usize) {
                    Some(slot) if !*slot => *slot = true,
                    _ => return Err(format!("{perm:?} is not a permutation of rank {}", s.rank())),
                }
            }
            if perm.len() != s.rank() {
                return Err(format!("{perm:?} is not a permutation of rank {}", s.rank()));
            }
            smallvec![Type::array(Shape(perm.iter().map(|&p| s.dims()[p as usize]).collect()), d)]
        }
        OpData::Reduce { op, x, axes } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if !(d.is_float() || d == DType::I32) {
                return Err(format!("reduce.{op} supports float and i32 operands, got {d}"));
            }
            let mut keep = vec![true; s.rank()];
            for &a in axes {
                match keep.get_mut(a as usize) {
                    Some(slot) if *slot => *slot = false,
                    _ => return Err(format!("bad reduction axes {axes:?} for shape {s}")),
                }
            }
            let dims: Vec<u64> =
                s.dims().iter().zip(&keep).filter(|(_, k)| **k).map(|(d, _)| *d).collect();
            smallvec![Type::array(Shape(dims), d)]
        }
        OpData::ArgReduce { op, x, axis } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if d != DType::F32 || s.rank() == 0 {
                return Err(format!(
                    "{op} takes an f32 vector (as tpu.reduce_index), got {}",
                    k.ty(*x)
                ));
            }
            if *axis as usize >= s.rank() {
                return Err(format!("axis {axis} is out of range for {s}"));
            }
            let mut dims = s.dims().to_vec();
            dims.remove(*axis as usize);
            smallvec![Type::array(Shape(dims), DType::I32)]
        }
        OpData::Slice { x, start, size } => {
            let (s, d) = array_of(k, *x, "operand")?;
            if s.rank() == 0 || start.len() != s.rank() || size.len() != s.rank() {
                return Err(format!("a slice of {} needs one range per dim", k.ty(*x)));
            }
            for (dim, ((&lo, &n), &extent)) in start.iter().zip(size).zip(s.dims()).enumerate() {
                if n == 0 || lo.checked_add(n).is_none_or(|hi| hi > extent) {
                    return Err(format!(
                        "range {lo}..{} is out of bounds along dim {dim} (extent {extent})",
                        lo.saturating_add(n)
                    ));
                }
            }
            smallvec![Type::Vector(Shape(size.clone()), d)]
        }
        OpData::Concat { xs, axis } => {
            let Some(&first) = xs.first() else {
                return Err("concatenate needs at least one value".into());
            };
            let (s0, d0) = array_of(k, first, "operand")?;
            if *axis as usize >= s0.rank() {
                return Err(format!("axis {axis} is out of range for {s0}"));
            }
            let mut dims = s0.dims().to_vec();
            for &x in &xs[1..] {
                let (s, d) = array_of(k, x, "operand")?;
                let others_agree = s.rank() == s0.rank()
                    && s.dims()
                        .iter()
                        .zip(s0.dims())
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis as usize || a == b);
                if d != d0 || !others_agree {
                    return Err(format!(
                        "cannot concatenate {} and {} along axis {axis}",
                        k.ty(first),
                        k.ty(x)
                    ));
                }
                dims[*axis as usize] += s.dims()[*axis as usize];
            }
            smallvec![Type::Vector(Shape(dims), d0)]
        }
        OpData::Roll { x, shift, axis } => {
            let (s, d) = array_of(k, *x, "operand")?;
            scalar_i32(k, *shift, "roll shift")?;
            if *axis as usize >= s.rank() {
                return Err(format!("axis {axis} is out of range for {}", k.ty(*x)));
            }
            smallvec![Type::Vector(s, d)]
        }
        OpData::Dot { lhs, rhs, dims, out, .. } => {
            let (ls, ld) = array_of(k, *lhs, "lhs")?;
            let (rs, rd) = array_of(k, *rhs, "rhs")?;
            // bf16 activations against 8/4-bit weights: libtpu takes the mixed `tpu.matmul`
            // directly on v6e and v7x (the weight converted on its way into the MXU).
            let quantized_rhs =
                ld == DType::Bf16 && matches!(rd, DType::I8 | DType::I4 | DType::F8E4M3);
            if ld != rd && !quantized_rhs {
                return Err(format!(
                    "dot operands have different dtypes: {ld} vs {rd} (a bf16 lhs may meet an i8, i4 or f8e4m3fn rhs)"
                ));
            }
            if out.bits() != 32 || out.is_float() != ld.is_float() {
                return Err(format!(
                    "dot of {ld} must accumulate in a 32-bit {} type, not {out}",
                    if ld.is_float() { "float" } else { "integer" }
                ));
            }
            if dims.lhs_contract.len() != dims.rhs_contract.len()
                || dims.lhs_batch.len() != dims.rhs_batch.len()
            {
                return Err("dot dimension numbers pair up unequal lists".into());
            }
            let dim = |s: &Shape, i: u32, side: &str| {
                s.dims()
                    .get(i as usize)
                    .copied()
                    .ok_or_else(|| format!("{side} dim {i} out of range for {s}"))
            };
            for (&a, &b) in dims
                .lhs_contract
                .iter()
                .zip(&dims.rhs_contract)
                .chain(dims.lhs_batch.iter().zip(&dims.rhs_batch))
            {
                let (x, y) = (dim(&ls, a, "lhs")?, dim(&rs, b, "rhs")?);
                if x != y {
                    return Err(format!(
                        "dot contracts lhs dim {a} ({x}) with rhs dim {b} ({y}): sizes differ"
                    ));
                }
            }
            let free = |s: &Shape, used: &[u32]| -> Vec<u64> {
                (0..s.rank() as u32)
                    .filter(|i| !used.contains(i))
                    .map(|i| s.dims()[i as usize])
                    .collect()
            };
            let lhs_used: Vec<u32> =
                dims.lhs_contract.iter().chain(&dims.lhs_batch).copied().collect();
            let rhs_used: Vec<u32> =
                dims.rhs_contract.iter().chain(&dims.rhs_batch).copied().collect();
            let mut shape: Vec<u64> =
                dims.lhs_batch.iter().map(|&b| ls.dims()[b as usize]).collect();
            shape.extend(free(&ls, &lhs_used));
            shape.extend(free(&rs, &rhs_used));
            smallvec![Type::array(Shape(shape), *out)]
        }
        OpData::AssumeMultiple { x, .. } => {
            scalar_i32(k, *x, "operand")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        OpData::Load { src, index } => {
            let Type::Ref(r) = k.ty(*src) else {
                return Err(format!("load from a non-ref {}", k.ty(*src)));
            };
            let shape = indexed_shape(k, &r.shape, index)?;
            match r.space {
                MemorySpace::Vmem => {
                    if shape.rank() == 0 {
                        return Err(
                            "a VMEM load must keep at least one dim (index with a slice)".into()
                        );
                    }
                    smallvec![Type::Vector(shape, r.dtype)]
                }
                MemorySpace::Smem => {
                    if shape.rank() != 0 {
                        return Err(format!(
                            "SMEM holds scalars: index every dim with a point, not a slice of {shape}"
                        ));
                    }
                    smallvec![Type::Scalar(r.dtype)]
                }
                s => {
                    return Err(format!(
                        "{s} refs can only be accessed by DMA (load from {})",
                        k.value_name(*src)
                    ));
                }
            }
        }
        OpData::Store { dst, index, value, mask } => {
            let Type::Ref(r) = k.ty(*dst) else {
                return Err(format!("store to a non-ref {}", k.ty(*dst)));
            };
            let shape = indexed_shape(k, &r.shape, index)?;
            let want = match r.space {
                MemorySpace::Vmem if shape.rank() > 0 => Type::Vector(shape.clone(), r.dtype),
                MemorySpace::Smem if shape.rank() == 0 => Type::Scalar(r.dtype),
                MemorySpace::Vmem | MemorySpace::Smem => {
                    return Err(format!(
                        "the indexed window {shape} does not fit {} refs",
                        r.space
                    ));
                }
                s => {
                    return Err(format!(
                        "{s} refs can only be accessed by DMA (store to {})",
                        k.value_name(*dst)
                    ));
                }
            };
            if *k.ty(*value) != want {
                return Err(format!("stored value is {}, the window is {want}", k.ty(*value)));
            }
            if let Some(m) = mask {
                if super::is_strided(index) {
                    return Err(
                        "a strided store cannot be masked (Mosaic's tpu.strided_store has no mask)"
                            .into(),
                    );
                }
                if r.dtype.bits() != 32 {
                    return Err(format!("masked stores need 32-bit data, got {}", r.dtype));
                }
                if *k.ty(*m) != Type::array(shape.clone(), DType::Bool) {
                    return Err(format!("mask must be bool{shape}, got {}", k.ty(*m)));
                }
            }
            SmallVec::new()
        }
        OpData::RefSlice { index, .. } if super::is_strided(index) => {
            return Err("a strided ds cannot make a sub-ref (`.at()`, DMAs): only loads and stores take strides, as in Pallas".into());
        }
        OpData::RefSlice { base, index } => match k.ty(*base) {
            Type::Ref(r) => {
                let shape = indexed_shape(k, &r.shape, index)?;
                smallvec![Type::Ref(super::RefType { space: r.space, dtype: r.dtype, shape })]
            }
            Type::Sem(kind, s) => {
                let shape = indexed_shape(k, s, index)?;
                smallvec![Type::Sem(*kind, shape)]
            }
            t => return Err(format!("cannot slice a {t}")),
        },
        OpData::DmaStart { src, dst, sem, remote, priority } => {
            dma_operands(k, *src, *dst, *sem)?;
            if *priority > 1 {
                return Err(format!("DMA priority must be 0 or 1, got {priority}"));
            }
            if let Some(r) = remote {
                needs_mesh(k, "a remote DMA")?;
                scalar_i32(k, r.device_id, "device id")?;
                sem_scalar(k, r.send_sem, Some(SemKind::Dma), "send semaphore")?;
                if *priority != 0 {
                    return Err("remote DMAs must use priority 0".into());
                }
            }
            SmallVec::new()
        }
        OpData::DmaWait { src, dst, sem, side } => {
            dma_operands(k, *src, *dst, *sem)?;
            if let WaitSide::Recv { device_id } = side {
                scalar_i32(k, *device_id, "device id")?;
            }
            if *side != WaitSide::Local {
                needs_mesh(k, "a remote DMA wait")?;
            }
            SmallVec::new()
        }
        OpData::SemSignal { sem, amount, device_id } => {
            sem_scalar(k, *sem, Some(SemKind::Regular), "semaphore")?;
            scalar_i32(k, *amount, "amount")?;
            if let Some(d) = device_id {
                needs_mesh(k, "a remote semaphore signal")?;
                scalar_i32(k, *d, "device id")?;
            }
            SmallVec::new()
        }
        OpData::SemWait { sem, amount } => {
            sem_scalar(k, *sem, Some(SemKind::Regular), "semaphore")?;
            scalar_i32(k, *amount, "amount")?;
            SmallVec::new()
        }
        OpData::SemRead { sem } => {
            sem_scalar(k, *sem, None, "semaphore")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        OpData::DeviceId => {
            needs_mesh(k, "device_id()")?;
            smallvec![Type::Scalar(DType::I32)]
        }
        OpData::BarrierSemaphore => {
            needs_mesh(k, "the barrier semaphore")?;
            if k.call.collective_id.is_none() {
                return Err("the barrier semaphore needs a collective id: #[kernel(collective_id = 0, ..)] (Pallas: CompilerParams(collective_id=0))".into());
            }
            smallvec![Type::Sem(SemKind::Regular, Shape::default())]
        }
        OpData::DebugPrint { format, args } => {
            let placeholders = format.matches("{}").count();
            if placeholders != args.len() {
                return Err(format!(
                    "the format {format:?} has {placeholders} `{{}}` placeholders for {} values",
                    args.len()
                ));
            }
            for (i, &a) in args.iter().enumerate() {
                scalar_i32(k, a, &format!("debug_print value {i} (TPU logs print i32 scalars)"))?;
            }
            SmallVec::new()
        }
        OpData::If { cond, then_block, else_block } => {
            if *k.ty(*cond) != Type::Scalar(DType::Bool) {
                return Err(format!("if condition must be a bool scalar, got {}", k.ty(*cond)));
            }
            let t = yield_types(k, *then_block)?;
            let e = yield_types(k, *else_block)?;
            if t != e {
                return Err(format!(
                    "if branches yield different types: ({}) vs ({})",
                    list(&t),
                    list(&e)
                ));
            }
            t
        }
        OpData::For { lower, upper, step, init, body } => {
            scalar_i32(k, *lower, "loop lower bound")?;
            scalar_i32(k, *upper, "loop upper bound")?;
            scalar_i32(k, *step, "loop step")?;
            let carried: Types = init.iter().map(|&v| k.ty(v).clone()).collect();
            let params: Types = k.blocks[*body].params.iter().map(|&v| k.ty(v).clone()).collect();
            if params.first() != Some(&Type::Scalar(DType::I32)) || params[1..] != carried[..] {
                return Err(format!(
                    "loop body takes ({}), expected (i32, {})",
                    list(&params),
                    list(&carried)
                ));
            }
            let y = yield_types(k, *body)?;
            if y != carried {
                return Err(format!(
                    "loop body yields ({}), the carried values are ({})",
                    list(&y),
                    list(&carried)
                ));
            }
            carried
        }
        OpData::While { init, cond, body } => {
            let carried: Types = init.iter().map(|&v| k.ty(v).clone()).collect();
            for (b, what) in [(*cond, "condition"), (*body, "body")] {
                let params: Types = k.blocks[b].params.iter().map(|&v| k.ty(v).clone()).collect();
                if params != carried {
                    return Err(format!(
                        "while {what} takes ({}), the carried values are ({})",
                        list(&params),
                        list(&carried)
                    ));
                }
            }
            let c = yield_types(k, *cond)?;
            if c[..] != [Type::Scalar(DType::Bool)] {
                return Err(format!("while condition must yield one bool, yields ({})", list(&c)));
            }
            let y = yield_types(k, *body)?;
            if y != carried {
                return Err(format!(
                    "while body yields ({}), the carried values are ({})",
                    list(&y),
                    list(&carried)
                ));
            }
            carried
        }
        OpData::RunScoped { body } => yield_types(k, *body)?,
        OpData::Alloc { buf } => smallvec![Type::Ref(k.bufs[*buf].ty.clone())],
        OpData::SemAlloc { sem } => {
            let s = &k.sems[*sem];
            smallvec![Type::Sem(s.kind, s.shape.clone())]
        }
        OpData::Yield { .. } => SmallVec::new(),
    })
}

fn list(ts: &[Type]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// The types a region yields (its last op must be a `yield`).
pub fn yield_types(k: &Kernel, block: super::Block) -> Result<Types, String> {
    match k.blocks[block].ops.last().map(|&op| &k.ops[op].data) {
        Some(OpData::Yield { values }) => Ok(values.iter().map(|&v| k.ty(v).clone()).collect()),
        _ => Err(format!("region {block} does not end with a yield")),
    }
}

/// Device ids name devices of the call's mesh: without one there is nothing to name.
fn needs_mesh(k: &Kernel, what: &str) -> Result<(), String> {
    if k.call.mesh.is_none() {
        return Err(format!(
            "{what} needs the devices of a mesh: declare it, #[kernel(mesh = [x = 4], ..)] (Pallas: the kernel under jax.shard_map over a Mesh)"
        ));
    }
    Ok(())
}

fn sem_scalar(k: &Kernel, v: Value, kind: Option<SemKind>, what: &str) -> Result<(), String> {
    match k.ty(v) {
        Type::Sem(got, s) if s.rank() == 0 && kind.is_none_or(|want| want == *got) => Ok(()),
        Type::Sem(got, s) if s.rank() != 0 => {
            Err(format!("{what} must be a single semaphore, got an array {got}{s} (index it)"))
        }
        t => Err(format!(
            "{what} must be a {}, got {t}",
            kind.map_or("semaphore".to_string(), |k| k.to_string())
        )),
    }
}

fn dma_operands(k: &Kernel, src: Value, dst: Value, sem: Value) -> Result<(), String> {
    let (Type::Ref(s), Type::Ref(d)) = (k.ty(src), k.ty(dst)) else {
        return Err(format!("DMA copies between refs, got {} -> {}", k.ty(src), k.ty(dst)));
    };
    if s.dtype != d.dtype || s.shape != d.shape {
        return Err(format!(
            "DMA source {}{} and destination {}{} differ (they must have the same dtype and shape)",
            s.dtype, s.shape, d.dtype, d.shape
        ));
    }
    sem_scalar(k, sem, Some(SemKind::Dma), "DMA semaphore")
}
