//! Op-coverage kernels: small kernels that exist to exercise the parts of the op vocabulary
//! no library kernel uses (traced control flow, masked stores, transposes, casts, SMEM
//! scalars, scoped DMAs and semaphores, NT and int8 matmuls, the array ops on values). They
//! are not in the registry: the lowering tests snapshot them and compile them with libtpu, and the interpreter tests
//! run them against hand-written expectations and plant faults in their bodies.

use palladium_dsl::prelude::*;
use palladium_dsl::{BuildErrors, Kernel};

/// Builds one coverage kernel.
pub type Build = fn() -> Result<Kernel, BuildErrors>;

/// Every coverage kernel by name, for suites that treat them alike.
pub const ALL: &[(&str, Build)] = &[
    ("loops", || loops::build(&Default::default())),
    ("misc", || misc::build(&Default::default())),
    ("masked_store", || masked_store::build(&Default::default())),
    ("transpose", || transpose::build(&Default::default())),
    ("semaphores", || semaphores::build(&Default::default())),
    ("dynamic_dma", || dynamic_dma::build(&Default::default())),
    ("casts", || casts::build(&Default::default())),
    ("softmax_t", || softmax_t::build(&Default::default())),
    ("int8_dot", || int8_dot::build(&Default::default())),
    ("array_ops", || array_ops::build(&Default::default())),
    ("switch_branches", || switch_branches::build(&Default::default())),
    ("nested_pipeline", || nested_pipeline::build(&Default::default())),
    ("strided", || strided::build(&Default::default())),
    ("element_windows", || element_windows::build(&Default::default())),
];

/// Traced control flow: an `scf.for` over `0..program_id(0)` carrying a vector and an i32,
/// an `scf.while` counting to 5, and an `scf.if` on both.
#[kernel(grid = (4,), semantics = (arbitrary,))]
pub fn loops(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let mut acc = x[..];
    let mut steps = scalar(0);
    for i in fori(0, program_id(0)) {
        acc = acc + 1.0;
        steps = steps + i;
    }
    let mut n = scalar(0);
    while n < 5 {
        n = n + 1;
    }
    if steps >= 1 && n == 5 {
        acc = -acc;
    }
    o[..] = acc;
}

/// A grid-less kernel: iota, compare, select, a traced `for` carrying a vector, a traced
/// `while`, a reduction to a scalar stored to SMEM, an i32 → f32 scalar cast, and
/// `run_scoped` with a scoped VMEM buffer and DMA semaphore copying to an ANY output.
#[kernel]
pub fn misc(
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[output(f32[2], space = smem)] s: Ref,
    #[output(f32[8, 128], space = any)] o2: Ref,
) {
    let v = x[..];
    let lanes = iota([8, 128], 1);
    let kept = select(lanes < 100, v, 0.0);
    let mut acc = kept;
    for _i in fori(0, scalar(4)) {
        acc = acc + v;
    }
    s[0] = acc.sum_all();
    let mut n = scalar(0);
    while n < 3 {
        n = n + 1;
    }
    s[1] = n.cast(f32);
    o[..] = acc;
    run_scoped(|scope| {
        let buf = scope.vmem([8, 128], f32);
        let sem = scope.dma_sem();
        buf[..] = acc;
        let copy = async_copy(buf, o2, sem);
        copy.start();
        copy.wait();
    });
}

/// A masked f32 store: zero the block, then write only its first 64 lanes.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn masked_store(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = 0.0;
    let lanes = iota([8, 128], 1);
    o.store_masked(.., x[..] * 2.0, lanes < 64);
}

/// `.t()` of a 128x128 f32 block: `o = x^T`, block by block.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn transpose(
    #[input(f32[256, 128], block = [128, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[128, 256], block = [128, 128], map = |i| (0, i))] o: Ref,
) {
    o[..] = x[..].t();
}

/// A regular semaphore allocated in a scoped region: signalled by 2, waited by 1, then by
/// what `sem_read` says is left.
#[kernel(grid = (2,), semantics = (arbitrary,))]
pub fn semaphores(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    run_scoped(|scope| {
        let sem = scope.sem();
        sem.signal(2);
        sem.wait(1);
        let left = sem.read();
        sem.wait(left);
    });
    o[..] = x[..] + 1.0;
}

/// A DMA from HBM at a dynamic row offset promised to be a multiple of 16 (`multiple_of`).
#[kernel(grid = (4,), semantics = (arbitrary,))]
pub fn dynamic_dma(
    #[input(f32[64, 128], space = any)] src: Ref,
    #[output(f32[64, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(vmem, f32[16, 128])] buf: Ref,
    #[scratch(dma_sem[1])] sems: SemRef,
) {
    let start = (program_id(0) * 16).multiple_of(16);
    let copy = async_copy(src.at(ds(start, 16)), buf, sems.at(0));
    copy.start();
    copy.wait();
    o[..] = buf[..] * 3.0;
}

/// Vector casts: f32 → bf16, bf16 → f32 and i32 → f32.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn casts(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[input(i32[32, 128], block = [16, 128], map = |i| (i, 0))] n: Ref,
    #[output(bf16[32, 128], block = [16, 128], map = |i| (i, 0))] h: Ref,
    #[output(f32[32, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
) {
    h[..] = x[..].cast(bf16);
    o[..] = n[..].cast(f32) + x[..].cast(bf16).cast(f32);
}

/// An NT matmul (`x @ w^T`) followed by a row softmax.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn softmax_t(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[input(f32[128, 128], block = [128, 128], map = |_i| (0, 0))] w: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let s = dot_t(x[..], w[..]);
    let m = s.max_keepdims(1);
    let e = (s - m).exp();
    o[..] = e / e.sum_keepdims(1);
}

/// An int8 × int8 matmul accumulating in i32.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn int8_dot(
    #[input(i8[64, 128], block = [32, 128], map = |i| (i, 0))] a: Ref,
    #[input(i8[128, 128], block = [128, 128], map = |_i| (0, 0))] b: Ref,
    #[output(i32[64, 128], block = [32, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = dot_general(a[..], b[..], DotDims::matmul(), i32, Precision::Default);
}

/// The array ops on values: static slicing, `concatenate`, `roll` by a static and by a
/// traced (scalar-prefetched) shift, `repeat`, `mean`, `max`/`min` over an axis (a negative
/// one too), elementwise `maximum`/`minimum`, `argmax`/`argmin`, the approximate reciprocal
/// and a `dot_general` contraction spec (an NT matmul).
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn array_ops(
    #[prefetch(i32[1])] shift: Ref,
    #[input(f32[16, 256], block = [8, 256], map = |i, _s| (i, 0))] x: Ref,
    #[input(f32[128, 128], block = [128, 128], map = |_i, _s| (0, 0))] w: Ref,
    #[output(f32[16, 256], block = [8, 256], map = |i, _s| (i, 0))] o: Ref,
    #[output(i32[16, 128], block = [8, 128], map = |i, _s| (i, 0))] idx: Ref,
) {
    let v = x[..];
    let left = v[(.., 0..128)];
    let swapped = concatenate(&[v[(.., 128..256)], left], 1);
    let rolled = v.roll(3, 1) + v.roll(shift[0], 0);
    let stats = v[(.., 0..1)] + v.mean_keepdims(1) + v.max_keepdims(-1) - v.min(1).reshape([8, 1]);
    let spread = left[(.., 0..64)].repeat(4, 1).maximum(0.0);
    let p = dot_general(left, w[..], "mk,nk->mn", f32, Precision::Default);
    let r = (p * p + 1.0).reciprocal(true);
    o[..] = swapped + rolled + stats + spread + concatenate(&[r, r.minimum(0.5)], 1);
    idx[..] = v.argmax(1).reshape([8, 1]) * 1000 + left.argmin(0);
}

/// A three-way `switch` on a scalar-prefetched index per grid step (clamped into range;
/// nested `scf.if`s, as Pallas lowers `lax.switch`), and a `debug_print` of the index.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn switch_branches(
    #[prefetch(i32[2])] which: Ref,
    #[input(f32[16, 128], block = [8, 128], map = |i, _w| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i, _w| (i, 0))] o: Ref,
) {
    let v = x[..];
    let index = which[program_id(0)];
    debug_print("step {} takes branch {}", &[program_id(0), index]);
    o[..] = switch(index, [&|| v * 2.0, &|| v + 1.0, &|| v.maximum(0.0)]);
}

/// A nested pipeline in a kernel body (Pallas's `pltpu.emit_pipeline`): the column sums of
/// `chunks` row chunks streamed from HBM through a two-slot VMEM ring, chunk `i + 1` in
/// flight while chunk `i` is added (`pipeline`, the one implementation the library's
/// streams run on), the last chunk drained peeled.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn nested_pipeline(
    #[default(6)] chunks: usize,
    #[default(16)] rows: usize,
    #[input(f32[2, chunks * rows, 128], space = any)] x: Ref,
    #[output(f32[2, rows, 128], block = [None, rows, 128], map = |b| (b, 0, 0))] o: Ref,
    #[scratch(vmem, f32[2, rows, 128])] ring: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let b = program_id(0);
    let chunk = |i: Val, slot: Val| {
        async_copy(x.at((b, ds(i * rows as i32, rows as u64), ..)), ring.at(slot), sems.at(slot))
    };
    chunk(scalar(0), scalar(0)).start();
    let last = Drain::Peeled { start: scalar(chunks as i32 - 1), count: 1 };
    // The ring slot is carried, as in the library's streams: with a slot computed from the
    // induction variable (`i % 2`) libtpu's static profiler aborts.
    let (sum, _) = pipeline(
        fori(0, chunks - 1),
        last,
        1,
        (zeros([rows as u64, 128], f32), scalar(0)),
        |i, &(_, slot): &(Val, Val)| chunk(i, 1 - slot).start(),
        |i, (acc, slot), _| {
            chunk(i, slot).wait();
            (acc + ring[(slot, .., ..)], 1 - slot)
        },
    );
    o[(0, .., ..)] = sum;
}

/// Strided `ds` on refs (`pl.ds(start, size, stride)`: `tpu.strided_load` /
/// `tpu.strided_store`): a block's even and odd rows loaded with stride 2 and stored back
/// swapped (the even ones at a traced start), plus one, and a 3-row stride into scratch.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn strided(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] thirds: Ref,
    #[scratch(vmem, f32[24, 128])] spread: Ref,
) {
    let even = x[(ds(0, 8).stride(2), ..)];
    let odd = x[(ds(1, 8).stride(2), ..)];
    o[(ds(0, 8).stride(2), ..)] = odd + 1.0;
    o[(ds(program_id(0) - program_id(0) + 1, 8).stride(2), ..)] = even + 1.0;
    spread[(ds(2, 8).stride(3), ..)] = x[(0..8, ..)];
    thirds[..] = spread[(ds(2, 8).stride(3), ..)] * 2.0;
}

/// Element-indexed blocks (Pallas's `pl.Element`, `#tpu.element_window`): the index maps
/// return row offsets, so windows overlap. Step `i` reads rows `8i .. 8i + 16` of `x` padded
/// by 8 rows after (the last step's second half is padding, never used) and writes the 8
/// rows at offset `8i`: each row plus the row 8 below it (nothing below the last 8).
#[kernel(grid = (4,), semantics = (parallel,))]
pub fn element_windows(
    #[input(f32[32, 128], block = [Element(16, (0, 8)), Element(128)], map = |i| (i * 8, 0))]
    x: Ref,
    #[output(f32[32, 128], block = [Element(8), Element(128)], map = |i| (i * 8, 0))] o: Ref,
) {
    let here = x[(0..8, ..)];
    o[..] = here;
    if program_id(0) < num_programs(0) - 1 {
        o[..] = here + x[(8..16, ..)];
    }
}

/// The same stream with its adds lagging the waits by one chunk (`pipeline_lagged`, as the
/// megakernel's expert stream): `slots - 1` chunks stay in flight while a chunk is added
/// (one slot: each chunk fetched, then added). Run by the interpreter's tests only (not in
/// [`ALL`]).
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn lagged_pipeline(
    #[default(6)] chunks: usize,
    #[default(16)] rows: usize,
    #[default(3)] slots: usize,
    #[input(f32[2, chunks * rows, 128], space = any)] x: Ref,
    #[output(f32[2, rows, 128], block = [None, rows, 128], map = |b| (b, 0, 0))] o: Ref,
    #[scratch(vmem, f32[slots, rows, 128])] ring: Ref,
    #[scratch(dma_sem[slots])] sems: SemRef,
) {
    let b = program_id(0);
    let ahead = slots - 1;
    let chunk = |i: Val, slot: Val| {
        async_copy(x.at((b, ds(i * rows as i32, rows as u64), ..)), ring.at(slot), sems.at(slot))
    };
    // `(slot + k) mod slots` for `0 <= slot, k < slots`, without a division.
    let ring_add = |slot: Val, k: usize| {
        let t = slot + k as i32;
        select(palladium_dsl::build::ge(t, slots as i32), t - slots as i32, t)
    };
    for i in unrolled(0, ahead) {
        chunk(scalar(i as i32), scalar(i as i32)).start();
    }
    let (sum, _) = pipeline_lagged(
        scalar(chunks as i32),
        ahead as u64,
        (zeros([rows as u64, 128], f32), scalar(0)),
        |i, &(_, slot): &(Val, Val)| chunk(i, ring_add(slot, ahead)).start(),
        |i, &(_, slot): &(Val, Val)| chunk(i, slot).wait(),
        |_, (acc, slot)| (acc + ring[(slot, .., ..)], ring_add(slot, 1)),
    );
    o[(0, .., ..)] = sum;
}
