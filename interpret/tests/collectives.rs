//! The library collectives on N virtual devices (`Program::run_devices`) against plain
//! references, and planted faults: a deadlock, a race on a remote write, barrier misuse and
//! a missing barrier, each reported with the device, op and kernel line.

#![allow(clippy::result_large_err)]

use crate::common;

use common::*;
use palladium_dsl::spec::Chip;
use palladium_interpret::{ErrorKind, HostArray, InterpError, Module};
use palladium_lowering::{LowerOptions, lower};

fn body(kernel: Result<palladium_dsl::Kernel, palladium_dsl::BuildErrors>) -> String {
    let k = kernel.unwrap_or_else(|e| panic!("{e}"));
    lower(&k, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}")).body
}

fn run_devices(body: &str, inputs: &[Vec<HostArray>]) -> Result<Vec<Vec<HostArray>>, InterpError> {
    Module::parse(body)
        .unwrap_or_else(|e| panic!("{e}"))
        .prepare()
        .unwrap_or_else(|e| panic!("{e}"))
        .run_devices(inputs, None)
}

/// Per device, `rows x cols` bf16-representable values.
fn shards(n: usize, rows: usize, cols: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.bf16s(rows * cols)).collect()
}

#[test]
fn permute_shifts_round_the_ring() {
    for (n, shift) in [(2, 1), (4, 1), (4, 3), (8, 5)] {
        let b = body(palladium_kernels::permute::build(&palladium_kernels::permute::Params {
            n,
            shift,
            rows: 8,
            cols: 128,
        }));
        let xs = shards(n, 8, 128, n as u64);
        let inputs: Vec<Vec<HostArray>> =
            xs.iter().map(|x| vec![HostArray::from_f32(&[8, 128], x)]).collect();
        let out = run_devices(&b, &inputs).unwrap_or_else(|e| panic!("n={n}: {e}"));
        for d in 0..n {
            assert_eq!(
                out[d][0].to_f32(),
                xs[(d + n - shift) % n],
                "permute n={n} shift={shift}: device {d}"
            );
        }
    }
}

#[test]
fn all_gather_stacks_every_shard() {
    for n in [2, 4, 8] {
        let b =
            body(palladium_kernels::all_gather::build(&palladium_kernels::all_gather::Params {
                n,
                rows: 16,
                cols: 128,
            }));
        let xs = shards(n, 16, 128, 10 + n as u64);
        let inputs: Vec<Vec<HostArray>> =
            xs.iter().map(|x| vec![HostArray::bf16_from_f32(&[16, 128], x)]).collect();
        let out = run_devices(&b, &inputs).unwrap_or_else(|e| panic!("n={n}: {e}"));
        let want: Vec<f32> = xs.concat();
        for (d, got) in out.iter().enumerate() {
            assert_eq!(got[0].shape, vec![n * 16, 128]);
            assert_eq!(got[0].to_f32(), want, "all_gather n={n}: device {d}");
        }
    }
}

/// The f32 sum over devices of `xs` (each `n * rows x cols`).
fn sum(xs: &[Vec<f32>]) -> Vec<f32> {
    (0..xs[0].len()).map(|i| xs.iter().map(|x| x[i]).sum()).collect()
}

#[test]
fn reduce_scatter_gives_each_device_its_block_of_the_sum() {
    for n in [2, 4, 8] {
        let (rows, cols) = (16, 128);
        let b = body(palladium_kernels::reduce_scatter::build(
            &palladium_kernels::reduce_scatter::Params { n, rows, cols },
        ));
        let xs = shards(n, n * rows, cols, 20 + n as u64);
        let inputs: Vec<Vec<HostArray>> =
            xs.iter().map(|x| vec![HostArray::bf16_from_f32(&[n * rows, cols], x)]).collect();
        let out = run_devices(&b, &inputs).unwrap_or_else(|e| panic!("n={n}: {e}"));
        let total = sum(&xs);
        for d in 0..n {
            let want = &total[d * rows * cols..(d + 1) * rows * cols];
            // bf16 on the wire: every hop rounds the partial sum.
            assert_close(
                &out[d][0].to_f32(),
                want,
                3e-2,
                1.0,
                &format!("reduce_scatter n={n}: device {d}"),
            );
        }
    }
}

#[test]
fn all_reduce_ring_and_bidirectional() {
    for n in [2, 4, 8] {
        for bidirectional in [false, true] {
            let (rows, cols) = (16, 256);
            let b = body(palladium_kernels::all_reduce::build(
                &palladium_kernels::all_reduce::Params { n, rows, cols, bidirectional },
            ));
            let xs = shards(n, n * rows, cols, 30 + n as u64);
            let inputs: Vec<Vec<HostArray>> =
                xs.iter().map(|x| vec![HostArray::bf16_from_f32(&[n * rows, cols], x)]).collect();
            let out = run_devices(&b, &inputs)
                .unwrap_or_else(|e| panic!("n={n} bidirectional={bidirectional}: {e}"));
            let total = sum(&xs);
            for d in 0..n {
                assert_close(
                    &out[d][0].to_f32(),
                    &total,
                    3e-2,
                    1.0,
                    &format!("all_reduce n={n} bidirectional={bidirectional}: device {d}"),
                );
                // Every device ends with the same bits.
                assert_eq!(
                    out[d][0], out[0][0],
                    "all_reduce n={n}: device {d} differs from device 0"
                );
            }
        }
    }
}

fn permute_inputs(n: usize) -> Vec<Vec<HostArray>> {
    shards(n, 8, 128, 1).iter().map(|x| vec![HostArray::from_f32(&[8, 128], x)]).collect()
}

fn expect_devices_err(r: Result<Vec<Vec<HostArray>>, InterpError>, kind: ErrorKind) -> String {
    match r {
        Ok(_) => panic!("expected a {kind:?} error, but the kernel ran"),
        Err(e) => {
            assert_eq!(e.kind, kind, "wrong error kind: {e}");
            e.to_string()
        }
    }
}

#[test]
fn a_wait_no_device_satisfies_is_a_deadlock_naming_device_op_and_line() {
    let b = body(palladium_kernels::permute::build(&palladium_kernels::permute::Params {
        n: 4,
        shift: 1,
        rows: 8,
        cols: 128,
    }));
    // Each device waits for three barrier signals; its two neighbours send two.
    let planted = edit(&b, "{value = 2 : i32}", "{value = 3 : i32}");
    let e = expect_devices_err(run_devices(&planted, &permute_inputs(4)), ErrorKind::Deadlock);
    assert!(e.contains("device 0 of 4"), "{e}");
    assert!(e.contains("`tpu.sem_wait` at kernels/src/body/collective.rs:"), "{e}");
    for d in 0..4 {
        assert!(
            e.contains(&format!("device {d} at `tpu.sem_wait` at kernels/src/body/collective.rs:")),
            "device {d} missing: {e}"
        );
    }
    assert!(e.contains("for 3 on semaphore barrier semaphore (value 2)"), "{e}");
}

#[test]
fn reading_a_remote_write_before_its_wait_is_a_race() {
    let b = body(palladium_kernels::all_gather::build(&palladium_kernels::all_gather::Params {
        n: 4,
        rows: 16,
        cols: 128,
    }));
    // Drop the first hop's receive wait: the next hop sends the block still landing.
    let recv_wait = b
        .lines()
        .find(|l| l.contains("tpu.wait_dma2") && l.contains("array<i32: 1, 1, 1, 1, 0>"))
        .expect("a receive wait")
        .to_string();
    let planted = edit(&b, &format!("{recv_wait}\n"), "");
    let e = expect_devices_err(
        run_devices(
            &planted,
            &vec![vec![HostArray::bf16_from_f32(&[16, 128], &[1.0; 16 * 128])]; 4],
        ),
        ErrorKind::DmaRace,
    );
    assert!(
        e.contains("the destination of a DMA still in flight") && e.contains("on device"),
        "{e}"
    );
}

#[test]
fn unbalanced_barrier_is_reported() {
    let b = body(palladium_kernels::permute::build(&palladium_kernels::permute::Params {
        n: 4,
        shift: 1,
        rows: 8,
        cols: 128,
    }));
    // Each device waits for one barrier signal of the two it gets.
    let planted = edit(&b, "{value = 2 : i32}", "{value = 1 : i32}");
    let e = expect_devices_err(run_devices(&planted, &permute_inputs(4)), ErrorKind::Leak);
    assert!(e.contains("the barrier semaphore is 1 at the end of the kernel"), "{e}");
}

#[test]
fn a_remote_write_without_a_barrier_is_reported() {
    let b = body(palladium_kernels::permute::build(&palladium_kernels::permute::Params {
        n: 4,
        shift: 1,
        rows: 8,
        cols: 128,
    }));
    let lines: Vec<&str> =
        b.lines().filter(|l| !l.contains("sem_signal") && !l.contains("tpu.sem_wait")).collect();
    let e =
        expect_devices_err(run_devices(&lines.join("\n"), &permute_inputs(4)), ErrorKind::DmaRace);
    assert!(
        e.contains("before it had allocated its target") && e.contains("start with a barrier"),
        "{e}"
    );
}
