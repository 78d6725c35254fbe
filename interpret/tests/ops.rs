//! DSL kernels covering more of the lowering's op vocabulary (control flow, masks,
//! transposes, casts, reductions, SMEM, scoped DMAs, semaphores), run from their lowered
//! bodies against references, plus misuse the interpreter must report.

#![allow(clippy::result_large_err)]

mod common;

use common::*;
use half::bf16;
use palladium_dsl::prelude::*;
use palladium_interpret::{ErrorKind, HostArray};

#[kernel(grid = (4,), semantics = (arbitrary,))]
fn loops(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let mut acc = x[..];
    let mut steps = scalar(0);
    for i in 0..program_id(0) {
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

#[test]
fn for_while_if() {
    let body = body_of(&loops().unwrap());
    let x = Rng::new(21).f32s(32 * 128);
    let out = run(&body, &[HostArray::from_f32(&[32, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
    let want: Vec<f32> = (0..32 * 128)
        .map(|k| {
            let pid = (k / (8 * 128)) as i32;
            let steps: i32 = (0..pid).sum();
            let v = x[k] + pid as f32;
            if steps >= 1 { -v } else { v }
        })
        .collect();
    assert_eq!(out[0].to_f32(), want);
}

#[kernel(grid = (2,), semantics = (parallel,))]
fn masked_store(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = 0.0;
    let lanes = iota([8, 128], 1);
    o.store_masked(.., x[..] * 2.0, lanes < 64);
}

#[test]
fn masked_stores() {
    let body = body_of(&masked_store().unwrap());
    let x = Rng::new(22).f32s(16 * 128);
    let out = run(&body, &[HostArray::from_f32(&[16, 128], &x)]).unwrap();
    let want: Vec<f32> = (0..16 * 128).map(|k| if k % 128 < 64 { x[k] * 2.0 } else { 0.0 }).collect();
    assert_eq!(out[0].to_f32(), want);
}

#[kernel(grid = (2,), semantics = (parallel,))]
fn transpose(
    #[input(f32[256, 128], block = [128, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[128, 256], block = [128, 128], map = |i| (0, i))] o: Ref,
) {
    o[..] = x[..].t();
}

#[test]
fn transposes() {
    let body = body_of(&transpose().unwrap());
    let x = Rng::new(23).f32s(256 * 128);
    let out = run(&body, &[HostArray::from_f32(&[256, 128], &x)]).unwrap();
    assert_eq!(out[0].shape, vec![128, 256]);
    let got = out[0].to_f32();
    for r in 0..128 {
        for c in 0..256 {
            assert_eq!(got[r * 256 + c], x[c * 128 + r]);
        }
    }
}

#[kernel(grid = (2,), semantics = (parallel,))]
fn casts(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[input(i32[32, 128], block = [16, 128], map = |i| (i, 0))] n: Ref,
    #[output(bf16[32, 128], block = [16, 128], map = |i| (i, 0))] h: Ref,
    #[output(f32[32, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
) {
    h[..] = x[..].cast(bf16);
    o[..] = n[..].cast(f32) + x[..].cast(bf16).cast(f32);
}

#[test]
fn casts_round_to_nearest_even() {
    let body = body_of(&casts().unwrap());
    let mut rng = Rng::new(24);
    let mut x = rng.f32s(32 * 128);
    // Exact ties: 1 + 2^-8 rounds down to 1 (even), 1 + 3*2^-8 rounds up.
    x[0] = 1.0 + 1.0 / 256.0;
    x[1] = 1.0 + 3.0 / 256.0;
    let n: Vec<i32> = (0..32 * 128).map(|k| (k as i32 % 97) - 48).collect();
    let out = run(&body, &[HostArray::from_f32(&[32, 128], &x), HostArray::from_i32(&[32, 128], &n)]).unwrap();
    let hb = out[0].to_bf16();
    assert_eq!(hb[0], bf16::from_f32(1.0));
    assert_eq!(hb[1].to_f32(), 1.0 + 4.0 / 256.0);
    let want_h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(hb, want_h);
    let want_o: Vec<f32> = x.iter().zip(&n).map(|(v, i)| *i as f32 + bf16::from_f32(*v).to_f32()).collect();
    assert_eq!(out[1].to_f32(), want_o);
}

#[kernel(grid = (2,), semantics = (parallel,))]
fn softmax_t(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[input(f32[128, 128], block = [128, 128], map = |_i| (0, 0))] w: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let s = dot_t(x[..], w[..]);
    let m = s.max_keepdims(1);
    let e = (s - m).exp();
    o[..] = e / e.sum_keepdims(1);
}

#[test]
fn nt_matmul_and_softmax() {
    let body = body_of(&softmax_t().unwrap());
    assert!(body.contains("<[1], [1], [0], [0], [0, 0, 1, 0], [], []>"), "an NT matmul");
    let mut rng = Rng::new(25);
    let (x, w) = (rng.bf16s(16 * 128), rng.bf16s(128 * 128));
    let out = run(&body, &[HostArray::from_f32(&[16, 128], &x), HostArray::from_f32(&[128, 128], &w)]).unwrap();
    let mut want = vec![0f32; 16 * 128];
    for r in 0..16 {
        let s: Vec<f32> = (0..128).map(|c| (0..128).map(|k| x[r * 128 + k] * w[c * 128 + k]).sum()).collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for c in 0..128 {
            want[r * 128 + c] = e[c] / z;
        }
    }
    assert_close(&out[0].to_f32(), &want, 1e-4, 1e-3, "softmax(x w^T)");
}

#[kernel]
fn misc(
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[output(f32[2], space = smem)] s: Ref,
    #[output(f32[8, 128], space = any)] o2: Ref,
) {
    let v = x[..];
    let lanes = iota([8, 128], 1);
    let kept = select(lanes < 100, v, 0.0);
    let mut acc = kept;
    for _i in 0..scalar(4) {
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

#[test]
fn no_grid_smem_reduction_scoped_dma() {
    let body = body_of(&misc().unwrap());
    let x = Rng::new(26).f32s(8 * 128);
    let out = run(&body, &[HostArray::from_f32(&[8, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
    let acc2: Vec<f32> = (0..8 * 128)
        .map(|k| {
            let mut a = if k % 128 < 100 { x[k] } else { 0.0 };
            for _ in 0..4 {
                a += x[k];
            }
            a
        })
        .collect();
    assert_eq!(out[0].to_f32(), acc2);
    assert_eq!(out[2].to_f32(), acc2, "o2 via the scoped DMA");
    let s = out[1].to_f32();
    assert_close(&[s[0]], &[acc2.iter().sum()], 1e-4, 1.0, "sum_all");
    assert_eq!(s[1], 3.0);
}

#[kernel(grid = (4,), semantics = (arbitrary,))]
fn dynamic_dma(
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

#[test]
fn dynamic_offset_dma() {
    let body = body_of(&dynamic_dma().unwrap());
    let x = Rng::new(27).f32s(64 * 128);
    let out = run(&body, &[HostArray::from_f32(&[64, 128], &x)]).unwrap();
    assert_eq!(out[0].to_f32(), x.iter().map(|v| v * 3.0).collect::<Vec<_>>());
    // A wrong `multiple_of` promise is caught.
    let bad = edit(&body, "{multiple = 16 : i32}", "{multiple = 32 : i32}");
    let text = expect_err(run(&bad, &[HostArray::from_f32(&[64, 128], &x)]), ErrorKind::Misaligned);
    assert!(text.contains("tpu.assume_multiple") && text.contains("grid point (1)"), "{text}");
    // A DMA whose wait is gone is still in flight at the end.
    let bad = delete_line(&body, "tpu.wait_dma2");
    let text = expect_err(run(&bad, &[HostArray::from_f32(&[64, 128], &x)]), ErrorKind::DmaRace);
    assert!(text.contains("vector.load"), "{text}");
}

#[kernel(grid = (2,), semantics = (arbitrary,))]
fn semaphores(
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

#[test]
fn semaphore_signal_wait_read() {
    let body = body_of(&semaphores().unwrap());
    let x = Rng::new(28).f32s(16 * 128);
    let inputs = [HostArray::from_f32(&[16, 128], &x)];
    let out = run(&body, &inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].to_f32(), x.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    // Nobody signals: a deadlock, reported instead of hanging.
    let bad = delete_line(&body, "tpu.sem_signal");
    let text = expect_err(run(&bad, &inputs), ErrorKind::Deadlock);
    assert!(text.contains("tpu.sem_wait") && text.contains("sem_alloc@"), "{text}");
}

#[kernel(grid = (2,), semantics = (arbitrary,))]
fn over_signal(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    run_scoped(|scope| {
        let sem = scope.sem();
        sem.signal(2);
        sem.wait(1);
    });
    o[..] = x[..];
}

#[test]
fn unbalanced_semaphore_is_a_leak() {
    let body = body_of(&over_signal().unwrap());
    let x = Rng::new(30).f32s(16 * 128);
    let text = expect_err(run(&body, &[HostArray::from_f32(&[16, 128], &x)]), ErrorKind::Leak);
    assert!(text.contains("tpu.region") && text.contains("has value 1"), "{text}");
}

#[kernel(grid = (2,), semantics = (parallel,))]
fn int8_dot(
    #[input(i8[64, 128], block = [32, 128], map = |i| (i, 0))] a: Ref,
    #[input(i8[128, 128], block = [128, 128], map = |_i| (0, 0))] b: Ref,
    #[output(i32[64, 128], block = [32, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = dot_general(a[..], b[..], DotDims::matmul(), i32, Precision::Default);
}

#[test]
fn int8_matmul_accumulates_in_i32() {
    let body = body_of(&int8_dot().unwrap_or_else(|e| panic!("{e}")));
    let mut rng = Rng::new(29);
    let a: Vec<i8> = (0..64 * 128).map(|_| (rng.next_u64() % 255) as i8).collect();
    let b: Vec<i8> = (0..128 * 128).map(|_| (rng.next_u64() % 255) as i8).collect();
    let out = run(&body, &[HostArray::from_i8(&[64, 128], &a), HostArray::from_i8(&[128, 128], &b)]).unwrap_or_else(|e| panic!("{e}"));
    let got = out[0].to_i32();
    for i in 0..64 {
        for j in 0..128 {
            let want: i32 = (0..128).map(|k| i32::from(a[i * 128 + k]) * i32::from(b[k * 128 + j])).sum();
            assert_eq!(got[i * 128 + j], want);
        }
    }
}
