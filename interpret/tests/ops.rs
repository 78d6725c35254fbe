//! DSL kernels covering more of the lowering's op vocabulary (control flow, masks,
//! transposes, casts, reductions, SMEM, scoped DMAs, semaphores), run from their lowered
//! bodies against references, plus misuse the interpreter must report.

#![allow(clippy::result_large_err)]

use crate::common;

use common::*;
use half::bf16;
use palladium_dsl::prelude::*;
use palladium_interpret::{ErrorKind, HostArray};
use palladium_kernels::coverage::{
    array_ops, casts, dynamic_dma, element_windows, int8_dot, loops, masked_store, misc,
    nested_pipeline, semaphores, softmax_t, strided, switch_branches, transpose,
};

#[test]
fn for_while_if() {
    let body = body_of(&loops::build(&Default::default()).unwrap());
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

/// `array_ops` against a plain reference: slices, concatenate, both rolls (`jnp.roll`
/// direction), repeat, mean, max/min over axes, maximum/minimum, the NT contraction spec,
/// the reciprocal, argmax/argmin.
#[test]
fn strided_loads_and_stores() {
    let body = body_of(&strided::build(&Default::default()).unwrap());
    for op in ["tpu.strided_load", "tpu.strided_store"] {
        assert!(body.contains(op), "the body has no {op}");
    }
    let x = Rng::new(31).f32s(32 * 128);
    let out = run(&body, &[HostArray::from_f32(&[32, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
    // Rows swap pairwise (plus one); thirds: a block's first 8 rows, doubled, through rows
    // 2, 5, .., 23 of the scratch.
    let want_o: Vec<f32> =
        (0..32 * 128).map(|k| x[((k / 128) ^ 1) * 128 + k % 128] + 1.0).collect();
    let want_thirds: Vec<f32> =
        (0..16 * 128).map(|k| x[(k / 1024) * 16 * 128 + k % 1024] * 2.0).collect();
    assert_eq!(out[0].to_f32(), want_o);
    assert_eq!(out[1].to_f32(), want_thirds);
}

#[test]
fn array_ops_match_a_plain_reference() {
    let body = body_of(&array_ops::build(&Default::default()).unwrap());
    for op in [
        "vector.extract_strided_slice",
        "tpu.concatenate",
        "tpu.dynamic_rotate",
        "tpu.reduce_index",
        "tpu.reciprocal",
    ] {
        assert!(body.contains(op), "the body has no {op}");
    }
    let mut rng = Rng::new(27);
    let (x, w) = (rng.bf16s(16 * 256), rng.bf16s(128 * 128));
    let shift = 5;
    let inputs = [
        HostArray::from_i32(&[1], &[shift]),
        HostArray::from_f32(&[16, 256], &x),
        HostArray::from_f32(&[128, 128], &w),
    ];
    let out = run(&body, &inputs).unwrap_or_else(|e| panic!("{e}"));
    let (mut want_o, mut want_idx) = (vec![0f32; 16 * 256], vec![0i32; 16 * 128]);
    for b in 0..2 {
        let v = |r: usize, c: usize| x[(b * 8 + r) * 256 + c];
        let argmin0: Vec<i32> = (0..128)
            .map(|c| (0..8).fold(0, |best, r| if v(r, c) < v(best, c) { r } else { best }) as i32)
            .collect();
        for r in 0..8 {
            let row: Vec<f32> = (0..256).map(|c| v(r, c)).collect();
            let (max, min) = (
                row.iter().copied().fold(f32::MIN, f32::max),
                row.iter().copied().fold(f32::MAX, f32::min),
            );
            let mean = row.iter().sum::<f32>() / 256.0;
            // The first index on ties (bf16 inputs tie), as jnp.argmax.
            let argmax =
                (0..256).fold(0, |best, c| if row[c] > row[best] { c } else { best }) as i32;
            let p: Vec<f32> =
                (0..128).map(|n| (0..128).map(|k| v(r, k) * w[n * 128 + k]).sum()).collect();
            for c in 0..256 {
                let swapped = v(r, (c + 128) % 256);
                let rolled = v(r, (c + 256 - 3) % 256) + v((r + 8 - shift as usize % 8) % 8, c);
                let spread = v(r, (c % 256) / 4).max(0.0);
                let rec = 1.0 / (p[c % 128] * p[c % 128] + 1.0);
                let tail = if c < 128 { rec } else { rec.min(0.5) };
                want_o[(b * 8 + r) * 256 + c] =
                    swapped + rolled + (v(r, 0) + mean + max - min) + spread + tail;
            }
            for c in 0..128 {
                want_idx[(b * 8 + r) * 128 + c] = argmax * 1000 + argmin0[c];
            }
        }
    }
    assert_close(&out[0].to_f32(), &want_o, 1e-5, 1.0, "array_ops o");
    let wrong = out[1].to_i32().iter().zip(&want_idx).filter(|(g, w)| g != w).count();
    assert_eq!(wrong, 0, "argmax * 1000 + argmin: {wrong} elements differ");
}

/// `switch` picks the branch of each grid step's index, clamped into range as `lax.switch`
/// (the kernel's `debug_print` runs too: it prints a line per step).
#[test]
fn switch_runs_the_indexed_branch() {
    let body = body_of(&switch_branches::build(&Default::default()).unwrap());
    assert_eq!(body.matches("scf.if").count(), 2, "three branches are two nested scf.ifs");
    assert!(
        body.contains(r#"{formatted = true, tag = "step $0 takes branch $1"}"#),
        "debug_print is a tpu.log:\n{body}"
    );
    let x = Rng::new(28).f32s(16 * 128);
    let branch = |b: i32, v: f32| match b.clamp(0, 2) {
        0 => v * 2.0,
        1 => v + 1.0,
        _ => v.max(0.0),
    };
    for which in [[0, 1], [2, 7], [-3, 1]] {
        let out =
            run(&body, &[HostArray::from_i32(&[2], &which), HostArray::from_f32(&[16, 128], &x)])
                .unwrap_or_else(|e| panic!("{e}"));
        let want: Vec<f32> = (0..16 * 128).map(|k| branch(which[k / (8 * 128)], x[k])).collect();
        assert_eq!(out[0].to_f32(), want, "indices {which:?}");
    }
}

#[test]
fn masked_stores() {
    let body = body_of(&masked_store::build(&Default::default()).unwrap());
    let x = Rng::new(22).f32s(16 * 128);
    let out = run(&body, &[HostArray::from_f32(&[16, 128], &x)]).unwrap();
    let want: Vec<f32> =
        (0..16 * 128).map(|k| if k % 128 < 64 { x[k] * 2.0 } else { 0.0 }).collect();
    assert_eq!(out[0].to_f32(), want);
}

#[test]
fn transposes() {
    let body = body_of(&transpose::build(&Default::default()).unwrap());
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

#[test]
fn casts_round_to_nearest_even() {
    let body = body_of(&casts::build(&Default::default()).unwrap());
    let mut rng = Rng::new(24);
    let mut x = rng.f32s(32 * 128);
    // Exact ties: 1 + 2^-8 rounds down to 1 (even), 1 + 3*2^-8 rounds up.
    x[0] = 1.0 + 1.0 / 256.0;
    x[1] = 1.0 + 3.0 / 256.0;
    let n: Vec<i32> = (0..32 * 128).map(|k| (k % 97) - 48).collect();
    let out =
        run(&body, &[HostArray::from_f32(&[32, 128], &x), HostArray::from_i32(&[32, 128], &n)])
            .unwrap();
    let hb = out[0].to_bf16();
    assert_eq!(hb[0], bf16::from_f32(1.0));
    assert_eq!(hb[1].to_f32(), 1.0 + 4.0 / 256.0);
    let want_h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(hb, want_h);
    let want_o: Vec<f32> =
        x.iter().zip(&n).map(|(v, i)| *i as f32 + bf16::from_f32(*v).to_f32()).collect();
    assert_eq!(out[1].to_f32(), want_o);
}

#[test]
fn nt_matmul_and_softmax() {
    let body = body_of(&softmax_t::build(&Default::default()).unwrap());
    assert!(body.contains("<[1], [1], [0], [0], [0, 0, 1, 0], [], []>"), "an NT matmul");
    let mut rng = Rng::new(25);
    let (x, w) = (rng.bf16s(16 * 128), rng.bf16s(128 * 128));
    let out =
        run(&body, &[HostArray::from_f32(&[16, 128], &x), HostArray::from_f32(&[128, 128], &w)])
            .unwrap();
    let mut want = vec![0f32; 16 * 128];
    for r in 0..16 {
        let s: Vec<f32> =
            (0..128).map(|c| (0..128).map(|k| x[r * 128 + k] * w[c * 128 + k]).sum()).collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for c in 0..128 {
            want[r * 128 + c] = e[c] / z;
        }
    }
    assert_close(&out[0].to_f32(), &want, 1e-4, 1e-3, "softmax(x w^T)");
}

#[test]
fn no_grid_smem_reduction_scoped_dma() {
    let body = body_of(&misc::build(&Default::default()).unwrap());
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

#[test]
fn dynamic_offset_dma() {
    let body = body_of(&dynamic_dma::build(&Default::default()).unwrap());
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

#[test]
fn semaphore_signal_wait_read() {
    let body = body_of(&semaphores::build(&Default::default()).unwrap());
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
    let body = body_of(&over_signal::build(&Default::default()).unwrap());
    let x = Rng::new(30).f32s(16 * 128);
    let text = expect_err(run(&body, &[HostArray::from_f32(&[16, 128], &x)]), ErrorKind::Leak);
    assert!(text.contains("tpu.region") && text.contains("has value 1"), "{text}");
}

#[test]
fn int8_matmul_accumulates_in_i32() {
    let body = body_of(&int8_dot::build(&Default::default()).unwrap_or_else(|e| panic!("{e}")));
    let mut rng = Rng::new(29);
    let a: Vec<i8> = (0..64 * 128).map(|_| (rng.next_u64() % 255) as i8).collect();
    let b: Vec<i8> = (0..128 * 128).map(|_| (rng.next_u64() % 255) as i8).collect();
    let out =
        run(&body, &[HostArray::from_i8(&[64, 128], &a), HostArray::from_i8(&[128, 128], &b)])
            .unwrap_or_else(|e| panic!("{e}"));
    let got = out[0].to_i32();
    for i in 0..64 {
        for j in 0..128 {
            let want: i32 =
                (0..128).map(|k| i32::from(a[i * 128 + k]) * i32::from(b[k * 128 + j])).sum();
            assert_eq!(got[i * 128 + j], want);
        }
    }
}

/// A `#[kernel]` body's nested pipeline (`pipeline`): every chunk streamed from HBM through
/// the ring is added once, whatever the chunk count; a chunk consumed before its wait races.
#[test]
fn nested_pipeline_sums_every_streamed_chunk() {
    for chunks in [2usize, 6] {
        let (rows, cols) = (16, 128);
        let body = body_of(
            &nested_pipeline::build(&nested_pipeline::Params { chunks, rows })
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let x = Rng::new(31).f32s(2 * chunks * rows * cols);
        let inputs = [HostArray::from_f32(&[2, chunks * rows, cols], &x)];
        let out = run(&body, &inputs).unwrap_or_else(|e| panic!("{e}"));
        let want: Vec<f32> = (0..2 * rows * cols)
            .map(|k| {
                let (b, rc) = (k / (rows * cols), k % (rows * cols));
                (0..chunks).fold(0.0, |acc, c| acc + x[(b * chunks + c) * rows * cols + rc])
            })
            .collect();
        assert_eq!(out[0].to_f32(), want, "chunks = {chunks}");
        if chunks == 6 {
            assert_eq!(
                body.matches("scf.for").count(),
                1,
                "one traced main loop, the last chunk peeled"
            );
            assert_eq!(
                body.matches("tpu.wait_dma2").count(),
                2,
                "one wait in the main loop, one in the peeled drain"
            );
            let bad: String = body
                .lines()
                .filter(|l| !l.contains("tpu.wait_dma2"))
                .collect::<Vec<_>>()
                .join("\n");
            let text = expect_err(run(&bad, &inputs), ErrorKind::DmaRace);
            // Named by the Rust line that read the ring slot too early.
            let source = include_str!("../../kernels/src/coverage.rs");
            let (line, col) = source
                .lines()
                .enumerate()
                .find_map(|(n, l)| {
                    l.find("acc + ring[").map(|c| (n + 1, c + "acc + ring".len() + 1))
                })
                .expect("the consume line");
            assert!(
                text.starts_with(&format!(
                    "DmaRace: `vector.load` at kernels/src/coverage.rs:{line}:{col} "
                )),
                "{text}"
            );
        }
    }
}

/// `element_windows`: overlapping element-offset windows (one padded after) against a plain
/// reference; without its padding, the input's last window runs past the array, an error
/// naming the operand and the kernel's source line.
#[test]
fn element_windows_overlap_and_pad() {
    let body = body_of(&element_windows::build(&Default::default()).unwrap());
    let x = Rng::new(41).f32s(32 * 128);
    let out = run(&body, &[HostArray::from_f32(&[32, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
    let want: Vec<f32> =
        (0..32 * 128).map(|k| if k >= 24 * 128 { x[k] } else { x[k] + x[k + 8 * 128] }).collect();
    assert_eq!(out[0].to_f32(), want);

    let unpadded =
        edit(&body, "#tpu.element_window<[0, 0], [8, 0]>", "#tpu.element_window<[0, 0], [0, 0]>");
    let text =
        expect_err(run(&unpadded, &[HostArray::from_f32(&[32, 128], &x)]), ErrorKind::OutOfBounds);
    assert!(
        text.contains("element window at (24, 0) of input0") && text.contains("grid point (3)"),
        "{text}"
    );
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/src/coverage.rs"))
            .unwrap();
    let line = source.lines().position(|l| l.contains("Element(16, (0, 8))")).unwrap() + 1;
    assert!(
        text.contains(&format!("kernels/src/coverage.rs:{line}:")),
        "names the Rust line of the index map: {text}"
    );
}

/// The lagged stream (`pipeline_lagged`): every chunk is added once, whatever the chunk
/// count and the number in flight; a chunk added before its wait races.
#[test]
fn lagged_pipeline_sums_every_streamed_chunk() {
    use palladium_kernels::coverage::lagged_pipeline;
    let (rows, cols) = (16, 128);
    for slots in [1usize, 2, 3] {
        let ahead = slots - 1;
        for chunks in slots.max(2)..=6 {
            let body = body_of(
                &lagged_pipeline::build(&lagged_pipeline::Params { chunks, rows, slots })
                    .unwrap_or_else(|e| panic!("{e}")),
            );
            let x = Rng::new(37).f32s(2 * chunks * rows * cols);
            let inputs = [HostArray::from_f32(&[2, chunks * rows, cols], &x)];
            let out = run(&body, &inputs)
                .unwrap_or_else(|e| panic!("ahead {ahead}, chunks {chunks}: {e}"));
            let want: Vec<f32> = (0..2 * rows * cols)
                .map(|k| {
                    let (b, rc) = (k / (rows * cols), k % (rows * cols));
                    (0..chunks).fold(0.0, |acc, c| acc + x[(b * chunks + c) * rows * cols + rc])
                })
                .collect();
            assert_eq!(out[0].to_f32(), want, "ahead {ahead}, chunks {chunks}");
            // One wait in the main loop, one in the drain loop (none with nothing ahead), one
            // before the loops.
            assert_eq!(
                body.matches("tpu.wait_dma2").count(),
                if ahead == 0 { 2 } else { 3 },
                "ahead {ahead}"
            );
            let bad = edit(
                &body,
                body.lines().find(|l| l.contains("tpu.wait_dma2")).expect("a wait"),
                "",
            );
            expect_err(run(&bad, &inputs), ErrorKind::DmaRace);
        }
    }
}
