//! Parallel grid execution: points of `parallel` dimensions run on the rayon pool, with
//! results that do not depend on the thread count, and conflicting writes reported.

#![allow(clippy::result_large_err)]

use crate::common;

use common::*;
use palladium_interpret::{ErrorKind, HostArray};

const PARALLEL: &str = "#tpu.dimension_semantics<parallel>";
const ARBITRARY: &str = "#tpu.dimension_semantics<arbitrary>";

/// The library matmul (grid: parallel, parallel, arbitrary) and its inputs.
fn matmul() -> (String, Vec<HostArray>) {
    let (m, k, n) = (128, 512, 256);
    let (body, _) = library_body(
        "matmul",
        &[("m", "128"), ("k", "512"), ("n", "256"), ("bm", "32"), ("bk", "128"), ("bn", "128")],
    );
    let mut rng = Rng::new(7);
    let inputs = vec![
        HostArray::bf16_from_f32(&[m, k], &rng.bf16s(m * k)),
        HostArray::bf16_from_f32(&[k, n], &rng.bf16s(k * n)),
    ];
    (body, inputs)
}

fn run_on(
    threads: usize,
    body: &str,
    inputs: &[HostArray],
) -> Result<Vec<HostArray>, palladium_interpret::InterpError> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let program = prepare(body);
    pool.install(|| program.run(inputs))
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (body, inputs) = matmul();
    assert_eq!(
        body.matches(PARALLEL).count(),
        2,
        "the matmul's grid is (parallel, parallel, arbitrary)"
    );
    // Every dim arbitrary: the grid runs in order on one thread.
    let sequential =
        run_on(1, &body.replace(PARALLEL, ARBITRARY), &inputs).unwrap_or_else(|e| panic!("{e}"));
    for threads in [1, 2, 4] {
        let got = run_on(threads, &body, &inputs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, sequential, "{threads} threads: the bytes differ from the in-order run");
    }
}

#[test]
fn two_parallel_points_writing_one_output_block_is_an_error() {
    // Marking the reduction dim parallel: points (i, j, 0..) all write output block (i, j).
    let (body, inputs) = matmul();
    let body = edit(&body, ARBITRARY, PARALLEL);
    for threads in [1, 3] {
        let text = expect_err(run_on(threads, &body, &inputs), ErrorKind::ParallelRace);
        assert!(
            text.contains("grid point (0, 0, 1)")
                && text.contains(
                    "writes block (0, 0) of output0, which grid point (0, 0, 0) also writes"
                ),
            "{text}"
        );
    }
}
