//! [`Ref`] and [`SemRef`]: traced memory windows and semaphores; indexing and DMAs.

use super::val::{IntoVal, Val};
use super::with;
use crate::ir::{
    BinaryOp, CmpPred, DType, Index, Literal, Offset, OpData, Remote, SemKind, Shape, SrcLoc, Type,
    Value, ValueDef, WaitSide,
};

/// A traced ref: a window of VMEM/SMEM, an HBM array or a sub-ref of one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Ref(pub(crate) Value);

/// A traced semaphore or semaphore array.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SemRef(pub(crate) Value);

/// `pl.ds(start, size)`: a slice of static `size` at a (possibly traced) `start`;
/// `ds(start, size).stride(n)` is `pl.ds(start, size, n)`.
#[derive(Copy, Clone, Debug)]
pub struct Ds {
    start: Offset,
    size: u64,
    stride: u64,
}

/// `pl.ds(start, size)`.
pub fn ds(start: impl IntoOffset, size: u64) -> Ds {
    Ds { start: start.offset(), size, stride: 1 }
}

impl Ds {
    /// Every `stride`-th element (`pl.ds(start, size, stride)`): `size` elements spanning
    /// `(size - 1) * stride + 1`. Loads and stores of VMEM refs take it (Mosaic's
    /// `tpu.strided_load` / `tpu.strided_store`); `.at()`, DMAs and value slices do not, as in
    /// Pallas.
    pub fn stride(self, stride: u64) -> Ds {
        Ds { stride, ..self }
    }
}

/// A slice start: a Rust integer or a traced i32.
pub trait IntoOffset {
    fn offset(self) -> Offset;
}

impl IntoOffset for Val {
    fn offset(self) -> Offset {
        Offset::Dynamic(self.0)
    }
}

/// One dimension's index before the extent is known.
#[derive(Copy, Clone, Debug)]
pub enum IndexItem {
    Full,
    Range(u64, u64),
    From(u64),
    Point(Offset),
    /// start, size, stride
    Slice(Offset, u64, u64),
}

/// Something that indexes one dimension: `..`, `a..b`, `a..`, an integer, a traced i32,
/// or [`ds`].
pub trait IndexElem {
    fn item(self) -> IndexItem;
}

impl IndexElem for std::ops::RangeFull {
    fn item(self) -> IndexItem {
        IndexItem::Full
    }
}
impl IndexElem for std::ops::Range<u64> {
    fn item(self) -> IndexItem {
        IndexItem::Range(self.start, self.end)
    }
}
impl IndexElem for std::ops::Range<usize> {
    fn item(self) -> IndexItem {
        IndexItem::Range(self.start as u64, self.end as u64)
    }
}
impl IndexElem for std::ops::Range<i32> {
    fn item(self) -> IndexItem {
        IndexItem::Range(self.start.max(0) as u64, self.end.max(0) as u64)
    }
}
impl IndexElem for std::ops::RangeFrom<usize> {
    fn item(self) -> IndexItem {
        IndexItem::From(self.start as u64)
    }
}
impl IndexElem for Val {
    fn item(self) -> IndexItem {
        IndexItem::Point(Offset::Dynamic(self.0))
    }
}
impl IndexElem for Ds {
    fn item(self) -> IndexItem {
        IndexItem::Slice(self.start, self.size, self.stride)
    }
}
macro_rules! int_index {
    ($($t:ty),*) => {$(
        impl IndexElem for $t {
            fn item(self) -> IndexItem { IndexItem::Point(Offset::Static(self as i64)) }
        }
        impl IntoOffset for $t {
            fn offset(self) -> Offset { Offset::Static(self as i64) }
        }
    )*};
}
int_index!(i32, i64, u32, u64, usize);

/// A whole index: one element, or a tuple of them (missing trailing dims are taken whole,
/// as in numpy).
pub trait IntoIndex {
    fn items(self) -> Vec<IndexItem>;
}

impl<T: IndexElem> IntoIndex for T {
    fn items(self) -> Vec<IndexItem> {
        vec![self.item()]
    }
}

macro_rules! tuple_index {
    ($($n:ident),*) => {
        impl<$($n: IndexElem),*> IntoIndex for ($($n,)*) {
            #[allow(non_snake_case)]
            fn items(self) -> Vec<IndexItem> {
                let ($($n,)*) = self;
                vec![$($n.item()),*]
            }
        }
    };
}
tuple_index!(A);
tuple_index!(A, B);
tuple_index!(A, B, C);
tuple_index!(A, B, C, D);
tuple_index!(A, B, C, D, E);

/// Resolve index items against a shape; an error names the offending dim.
pub(crate) fn resolve(items: Vec<IndexItem>, shape: &Shape) -> Result<Vec<Index>, String> {
    if items.len() > shape.rank() {
        return Err(format!("{} indices for rank {} ({shape})", items.len(), shape.rank()));
    }
    let mut out = Vec::with_capacity(shape.rank());
    for (d, &extent) in shape.dims().iter().enumerate() {
        let item = items.get(d).copied().unwrap_or(IndexItem::Full);
        out.push(match item {
            IndexItem::Full => Index::slice(Offset::Static(0), extent),
            IndexItem::Range(lo, hi) if lo >= hi => {
                return Err(format!("empty range {lo}..{hi} along dim {d}"));
            }
            IndexItem::Range(lo, hi) => {
                Index::slice(Offset::Static(lo as i64), hi.saturating_sub(lo))
            }
            IndexItem::From(lo) => {
                Index::slice(Offset::Static(lo as i64), extent.saturating_sub(lo))
            }
            IndexItem::Point(o) => Index::Point(o),
            IndexItem::Slice(_, _, 0) => {
                return Err(format!("ds stride 0 along dim {d}: strides are at least 1"));
            }
            IndexItem::Slice(start, size, stride) => Index::Slice { start, size, stride },
        });
    }
    Ok(out)
}

fn shape_of(v: Value) -> Shape {
    with(|t| match t.kernel.ty(v) {
        Type::Ref(r) => r.shape.clone(),
        Type::Sem(_, s) => s.clone(),
        other => other.value_shape().unwrap_or_default(),
    })
}

/// Resolve an index or record the error at `loc` (then index everything whole).
fn index_for(v: Value, idx: impl IntoIndex, loc: SrcLoc) -> Vec<Index> {
    let shape = shape_of(v);
    resolve(idx.items(), &shape).unwrap_or_else(|m| {
        with(|t| t.error(loc, m));
        shape.dims().iter().map(|&n| Index::slice(Offset::Static(0), n)).collect()
    })
}

fn slice_of(base: Value, index: Vec<Index>, loc: SrcLoc) -> Value {
    let fallback = with(|t| t.kernel.ty(base).clone());
    with(|t| t.emit1(OpData::RefSlice { base, index }, loc, fallback))
}

/// `v` sliced again at `loc` when it is a `ref.at(..)` (a chain of them: base first): as
/// Pallas does, a DMA slices its refs where it starts and where it is waited for, not where
/// it is described. The slices `.at(..)` made and nothing else uses are dropped when the
/// trace finishes ([`super::Tracer::drop_unused_slices`]). A poisoned slice (its error
/// reported already) is kept as is.
fn sliced_here(v: Value, loc: SrcLoc) -> Value {
    let slice = with(|t| match t.kernel.values[v].def {
        ValueDef::Result(op, _) if !t.poisoned[v] => match &t.kernel.ops[op].data {
            OpData::RefSlice { base, index } => Some((*base, index.clone())),
            _ => None,
        },
        _ => None,
    });
    match slice {
        Some((base, index)) => slice_of(sliced_here(base, loc), index, loc),
        None => v,
    }
}

impl Ref {
    pub fn value(self) -> Value {
        self.0
    }

    pub fn shape(self) -> Shape {
        shape_of(self.0)
    }

    pub fn dtype(self) -> DType {
        with(|t| t.kernel.ty(self.0).dtype().unwrap_or(DType::Bool))
    }

    /// Read `ref[idx]`: a vector from VMEM or a scalar from SMEM.
    #[track_caller]
    pub fn load(self, idx: impl IntoIndex) -> Val {
        let loc = SrcLoc::caller();
        let index = index_for(self.0, idx, loc);
        let kept: Vec<u64> = index
            .iter()
            .filter_map(|i| if let Index::Slice { size, .. } = i { Some(*size) } else { None })
            .collect();
        let scalar_i32 = kept.is_empty() && self.dtype() == DType::I32;
        let fallback = Type::array(Shape(kept), self.dtype());
        let value = Val(with(|t| t.emit1(OpData::Load { src: self.0, index }, loc, fallback)));
        match with(|t| t.value_ranges.get(self.0).copied().flatten()) {
            Some(range) if scalar_i32 => clamp_into(value, range, loc),
            _ => value,
        }
    }

    /// Write `ref[idx] = value` (a Rust number is splatted to the window).
    #[track_caller]
    pub fn store(self, idx: impl IntoIndex, value: impl IntoVal) {
        self.store_impl(idx, value, None);
    }

    /// Write only where `mask` is true (32-bit data only).
    #[track_caller]
    pub fn store_masked(self, idx: impl IntoIndex, value: impl IntoVal, mask: Val) {
        self.store_impl(idx, value, Some(mask));
    }

    #[track_caller]
    fn store_impl(self, idx: impl IntoIndex, value: impl IntoVal, mask: Option<Val>) {
        let loc = SrcLoc::caller();
        let index = index_for(self.0, idx, loc);
        let window: Vec<u64> = index
            .iter()
            .filter_map(|i| if let Index::Slice { size, .. } = i { Some(*size) } else { None })
            .collect();
        let dtype = self.dtype();
        let value = match value.as_val() {
            Some(v) if v.shape().rank() == 0 && !window.is_empty() => v.broadcast_to(&window),
            Some(v) => v,
            None => value.into_val_shaped(dtype, &Shape(window)),
        };
        with(|t| {
            t.emit(
                OpData::Store { dst: self.0, index, value: value.0, mask: mask.map(|m| m.0) },
                loc,
                &[],
            )
        });
    }

    /// `ref.at[idx]`: a sub-ref, for DMAs and nested views.
    #[track_caller]
    pub fn at(self, idx: impl IntoIndex) -> Ref {
        let loc = SrcLoc::caller();
        let index = index_for(self.0, idx, loc);
        Ref(slice_of(self.0, index, loc))
    }
}

impl SemRef {
    pub fn value(self) -> Value {
        self.0
    }

    /// One semaphore of an array.
    #[track_caller]
    pub fn at(self, idx: impl IntoIndex) -> SemRef {
        let loc = SrcLoc::caller();
        let index = index_for(self.0, idx, loc);
        SemRef(slice_of(self.0, index, loc))
    }

    /// Add `amount` to a regular semaphore (on `device`, when given).
    #[track_caller]
    pub fn signal(self, amount: impl IntoVal) {
        let loc = SrcLoc::caller();
        let amount = i32_val(amount);
        with(|t| {
            t.emit(OpData::SemSignal { sem: self.0, amount: amount.0, device_id: None }, loc, &[])
        });
    }

    /// Signal the same semaphore on another device.
    #[track_caller]
    pub fn signal_remote(self, amount: impl IntoVal, device_id: impl IntoVal) {
        let loc = SrcLoc::caller();
        let (amount, device) = (i32_val(amount), i32_val(device_id));
        with(|t| {
            t.emit(
                OpData::SemSignal { sem: self.0, amount: amount.0, device_id: Some(device.0) },
                loc,
                &[],
            )
        });
    }

    /// Block until the semaphore reaches `amount`, then subtract it.
    #[track_caller]
    pub fn wait(self, amount: impl IntoVal) {
        let loc = SrcLoc::caller();
        let amount = i32_val(amount);
        with(|t| t.emit(OpData::SemWait { sem: self.0, amount: amount.0 }, loc, &[]));
    }

    #[track_caller]
    pub fn read(self) -> Val {
        let loc = SrcLoc::caller();
        Val(with(|t| t.emit1(OpData::SemRead { sem: self.0 }, loc, Type::Scalar(DType::I32))))
    }
}

#[track_caller]
fn i32_val(x: impl IntoVal) -> Val {
    x.into_val_shaped(DType::I32, &Shape::default())
}

/// An async copy descriptor (`pltpu.make_async_copy` / `make_async_remote_copy`); `start`
/// and the waits emit the ops, each slicing the refs it names (`.at(..)`) again where it is,
/// as Pallas does.
#[derive(Copy, Clone, Debug)]
pub struct Dma {
    src: Ref,
    dst: Ref,
    sem: SemRef,
    remote: Option<(Val, SemRef)>,
    priority: u8,
}

/// `pltpu.make_async_copy(src, dst, sem)`.
pub fn async_copy(src: Ref, dst: Ref, sem: SemRef) -> Dma {
    Dma { src, dst, sem, remote: None, priority: 0 }
}

/// `pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=(device,),
/// device_id_type=MESH)`: copy `src` here into `dst` on mesh device `device` (the same ref
/// there); `send_sem` here counts the bytes that left, `recv_sem` there the bytes that
/// arrived.
pub fn remote_copy(
    src: Ref,
    dst: Ref,
    send_sem: SemRef,
    recv_sem: SemRef,
    device: impl IntoVal,
) -> Dma {
    let device = i32_val(device);
    Dma { src, dst, sem: recv_sem, remote: Some((device, send_sem)), priority: 0 }
}

impl Dma {
    pub fn priority(self, priority: u8) -> Dma {
        Dma { priority, ..self }
    }

    #[track_caller]
    pub fn start(self) {
        let loc = SrcLoc::caller();
        // Pallas's order: the last operand's slices first.
        let remote =
            self.remote.map(|(d, s)| Remote { device_id: d.0, send_sem: sliced_here(s.0, loc) });
        let sem = sliced_here(self.sem.0, loc);
        let dst = sliced_here(self.dst.0, loc);
        let src = sliced_here(self.src.0, loc);
        with(|t| {
            t.emit(OpData::DmaStart { src, dst, sem, remote, priority: self.priority }, loc, &[])
        });
    }

    /// Wait for the copy to complete; for a remote copy, as Pallas, first for its data to
    /// have left ([`Dma::wait_send`]), then for this device's incoming copy of the same
    /// descriptor to have arrived ([`Dma::wait_recv`]).
    #[track_caller]
    pub fn wait(self) {
        let loc = SrcLoc::caller();
        match self.remote {
            None => self.emit_wait(self.src, self.dst, self.sem, WaitSide::Local, loc),
            Some((device, send)) => {
                self.emit_wait(self.dst, self.src, send, WaitSide::Send, loc);
                self.emit_wait(
                    self.src,
                    self.dst,
                    self.sem,
                    WaitSide::Recv { device_id: device.0 },
                    loc,
                );
            }
        }
    }

    /// For a remote copy: wait until its data has left this device (the send semaphore).
    #[track_caller]
    pub fn wait_send(self) {
        let loc = SrcLoc::caller();
        match self.remote {
            Some((_, send)) => self.emit_wait(self.dst, self.src, send, WaitSide::Send, loc),
            None => with(|t| t.error(loc, "wait_send is for remote copies (remote_copy(..))")),
        }
    }

    /// For a remote copy: wait until the copy another device started into `dst` here (with
    /// `recv_sem`) has arrived.
    #[track_caller]
    pub fn wait_recv(self) {
        let loc = SrcLoc::caller();
        match self.remote {
            Some((device, _)) => self.emit_wait(
                self.src,
                self.dst,
                self.sem,
                WaitSide::Recv { device_id: device.0 },
                loc,
            ),
            None => with(|t| {
                t.error(loc, "wait_recv is for remote copies (remote_copy(..)); a local copy waits with .wait()")
            }),
        }
    }

    fn emit_wait(self, src: Ref, dst: Ref, sem: SemRef, side: WaitSide, loc: SrcLoc) {
        // Pallas's order: the semaphore's slices first, then the destination's, the source's.
        let sem = sliced_here(sem.0, loc);
        let dst = sliced_here(dst.0, loc);
        let src = sliced_here(src.0, loc);
        with(|t| t.emit(OpData::DmaWait { src, dst, sem, side }, loc, &[]));
    }
}

/// This device's logical id in the kernel's mesh (row-major over its axes), i32: what
/// remote copies and signals name.
#[track_caller]
pub fn device_id() -> Val {
    let loc = SrcLoc::caller();
    Val(with(|t| t.emit1(OpData::DeviceId, loc, Type::Scalar(DType::I32))))
}

/// `lax.axis_index(name)`: this device's position along mesh axis `name`, computed from
/// [`device_id`] as Pallas does: `(device_id / (product of the later axes)) % size`.
#[track_caller]
pub fn axis_index(name: &str) -> Val {
    let loc = SrcLoc::caller();
    let axis = with(|t| t.kernel.call.mesh.as_ref().map(|m| (m.axis(name), m.to_string())));
    let (size, minor) = match axis {
        Some((Some((_, size, minor)), _)) => (size, minor),
        Some((None, mesh)) => {
            return Val(with(|t| {
                t.fail(
                    loc,
                    format!("axis_index: the mesh {mesh} has no axis `{name}`"),
                    Type::Scalar(DType::I32),
                )
            }));
        }
        None => {
            return Val(with(|t| {
                t.fail(loc, format!("axis_index(\"{name}\") needs the devices of a mesh: declare it, #[kernel(mesh = [{name} = 4], ..)]"), Type::Scalar(DType::I32))
            }));
        }
    };
    let id = Val(with(|t| t.emit1(OpData::DeviceId, loc, Type::Scalar(DType::I32))));
    let major = if minor == 1 { id } else { binary_at(BinaryOp::Div, id, minor, loc) };
    binary_at(BinaryOp::Rem, major, size, loc)
}

fn binary_at(op: BinaryOp, x: Val, c: u64, loc: SrcLoc) -> Val {
    let c = crate::trace::val::constant(Literal::Int(c as i64), Type::Scalar(DType::I32), loc);
    Val(with(|t| t.emit1(OpData::Binary { op, lhs: x.0, rhs: c.0 }, loc, Type::Scalar(DType::I32))))
}

/// `pltpu.get_barrier_semaphore()`: the semaphore every device of the collective
/// (`collective_id`) shares, for a barrier before the first remote write (signal each
/// peer, wait for as many signals).
#[track_caller]
pub fn barrier_semaphore() -> SemRef {
    let loc = SrcLoc::caller();
    SemRef(with(|t| {
        t.emit1(OpData::BarrierSemaphore, loc, Type::Sem(SemKind::Regular, Shape::default()))
    }))
}

/// `value` (a scalar read from a scalar-prefetch operand) clamped into its declared `range`:
/// two compares and two selects at the read's own location. In range the value is unchanged;
/// outside it no DMA offset or trip count derived from it can leave its array.
fn clamp_into(value: Val, range: crate::spec::ValueRange, loc: SrcLoc) -> Val {
    let i32_at = |x: u64| {
        let x = x.min(i32::MAX as u64) as i64;
        crate::trace::val::constant(Literal::Int(x), Type::Scalar(DType::I32), loc)
    };
    let pick = |pred: CmpPred, v: Val, bound: Val| {
        with(|t| {
            let past = t.emit1(
                OpData::Compare { pred, lhs: v.0, rhs: bound.0 },
                loc,
                Type::Scalar(DType::Bool),
            );
            let op = OpData::Select { cond: past, on_true: bound.0, on_false: v.0 };
            Val(t.emit1(op, loc, Type::Scalar(DType::I32)))
        })
    };
    let below_max = pick(CmpPred::Gt, value, i32_at(range.max));
    pick(CmpPred::Lt, below_max, i32_at(range.min))
}
