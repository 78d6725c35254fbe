//! Planted faults in emitted body text must be reported (or give a wrong answer the
//! reference catches), never hang or pass silently.

#![allow(clippy::result_large_err)]

use crate::common;

use common::*;
use palladium_interpret::{CallSpec, ErrorKind, HostArray, Module};

fn gather() -> (String, [HostArray; 2]) {
    let (body, _) = library_body("gather_rows", &[]);
    let mut rng = Rng::new(11);
    let mut ids = rng.permutation(64);
    ids.truncate(8);
    let table = rng.bf16s(64 * 16 * 256);
    (body, [HostArray::from_i32(&[8], &ids), HostArray::bf16_from_f32(&[64, 16, 256], &table)])
}

/// `kernels/src/gather.rs:LINE:` of the one line of the gather kernel's source containing
/// `needle`: errors name the Rust line that traced the faulty op (from the body's `loc(...)`).
fn gather_line(needle: &str) -> String {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/src/gather.rs"))
            .unwrap();
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lines.len(), 1, "`{needle}` must name one line of gather.rs");
    format!("at kernels/src/gather.rs:{}:", lines[0])
}

#[test]
fn missing_dma_wait_is_a_race() {
    let (body, inputs) = gather();
    let bad = delete_line(&body, "tpu.wait_dma2");
    let text = expect_err(run(&bad, &inputs), ErrorKind::DmaRace);
    assert!(text.contains("vector.load"), "{text}");
    assert!(text.contains("grid point (0)"), "{text}");
    assert!(text.contains("scratch0[0, 0..16, 0..256]"), "{text}");
    assert!(text.contains("tpu.enqueue_dma"), "names the DMA: {text}");
    assert!(text.contains(&gather_line("buf[slot]")), "names the Rust line of the load: {text}");
}

#[test]
fn wait_nobody_signals_is_a_deadlock() {
    let (body, inputs) = gather();
    // Drop step 0's own fetch: its wait can never be satisfied.
    let first = body.lines().find(|l| l.contains("tpu.enqueue_dma")).unwrap().to_string();
    let bad = body.replacen(&format!("{first}\n"), "", 1);
    let text = expect_err(run(&bad, &inputs), ErrorKind::Deadlock);
    assert!(text.contains("tpu.wait_dma2"), "{text}");
    assert!(text.contains("scratch1[0]"), "names the semaphore: {text}");
    assert!(text.contains("grid point (0)"), "{text}");
    assert!(
        text.contains(&gather_line("fetch(step, slot).wait()")),
        "names the Rust line of the wait: {text}"
    );
}

#[test]
fn dma_into_busy_buffer() {
    let (body, inputs) = gather();
    // Prefetch into the current slot instead of `1 - slot`.
    let bad = edit(&body, "\"stable_mosaic.arith.subi\"", "\"stable_mosaic.arith.muli\"");
    let text = expect_err(run(&bad, &inputs), ErrorKind::DoubleDma);
    assert!(text.contains("tpu.enqueue_dma"), "{text}");
    assert!(text.contains("still in flight"), "{text}");
}

#[test]
fn out_of_bounds_slice() {
    let (body, inputs) = gather();
    // slot = step % 3: at step 2 the double buffer (2 slots) is indexed out of bounds.
    let bad = edit(&body, "{value = 2 : i32}", "{value = 3 : i32}");
    let text = expect_err(run(&bad, &inputs), ErrorKind::OutOfBounds);
    assert!(text.contains("tpu.memref_slice"), "{text}");
    // The copy slices its refs where it starts (as in Pallas), not where `fetch` describes it.
    assert!(
        text.contains(&gather_line("fetch(step + 1, 1 - slot).start()")),
        "names the Rust line of the slice: {text}"
    );
}

/// An id past the table read from scalar prefetch cannot leave it: `ids` declares its range
/// (`0..=table_rows - 1`), and the kernel clamps every scalar it reads from it, so an id of
/// 64 (or -7) fetches row 63 (or 0) instead of faulting the chip; the interpreter's bounds
/// check (above, a slot past the double buffer) would name any access that escaped.
#[test]
fn an_id_from_scalar_prefetch_is_clamped_into_its_declared_range() {
    let (body, mut inputs) = gather();
    let table = inputs[1].to_f32();
    let row = |r: usize| table[r * 16 * 256..(r + 1) * 16 * 256].to_vec();
    for (bad, fetched) in [(64, 63), (-7, 0), (i32::MAX, 63), (i32::MIN, 0)] {
        let mut ids = inputs[0].to_i32();
        ids[3] = bad;
        inputs[0] = HostArray::from_i32(&[8], &ids);
        let out = run(&body, &inputs).unwrap_or_else(|e| panic!("id {bad}: {e}"));
        let got = &out[0].to_f32()[3 * 16 * 256..4 * 16 * 256];
        let want: Vec<f32> = row(fetched).iter().map(|v| v * 2.0).collect();
        assert_eq!(got, &want[..], "id {bad} fetches row {fetched}");
    }
}

fn square_matmul() -> (String, Vec<f32>, Vec<f32>, [HostArray; 2]) {
    let (body, _) = library_body(
        "matmul",
        &[("m", "256"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "128"), ("bn", "128")],
    );
    let mut rng = Rng::new(12);
    let (x, y) = (rng.bf16s(256 * 256), rng.bf16s(256 * 256));
    let inputs =
        [HostArray::bf16_from_f32(&[256, 256], &x), HostArray::bf16_from_f32(&[256, 256], &y)];
    (body, x, y, inputs)
}

#[test]
fn swapped_index_map_gives_a_wrong_answer() {
    let (body, x, y, inputs) = square_matmul();
    let want = matmul_ref(&x, &y, 256, 256, 256);
    let good = run(&body, &inputs).unwrap();
    assert_close(&good[0].to_f32(), &want, 1e-2, 1e-1, "unmodified");
    let bad = edit(
        &body,
        "\"stable_mosaic.func.return\"(%arg0, %arg2)",
        "\"stable_mosaic.func.return\"(%arg2, %arg0)",
    );
    let out = run(&bad, &inputs).unwrap();
    assert!(
        max_rel_err(&out[0].to_f32(), &want, 1e-1) > 0.5,
        "a swapped index map must change the result"
    );
}

#[test]
fn swapped_dimension_numbers_give_a_wrong_answer() {
    let (body, x, y, inputs) = square_matmul();
    let want = matmul_ref(&x, &y, 256, 256, 256);
    let bad = edit(
        &body,
        "<[1], [0], [0], [1], [0, 0, 1, 1], [], []>",
        "<[0], [0], [1], [1], [0, 1, 1, 1], [], []>",
    );
    let out = run(&bad, &inputs).unwrap();
    assert!(max_rel_err(&out[0].to_f32(), &want, 1e-1) > 0.5, "x^T y is not x y");
}

#[test]
fn block_index_out_of_bounds() {
    // Non-square: the swapped map indexes block (kk, i) of a 2x1-block array.
    let (body, _) = library_body(
        "matmul",
        &[("m", "64"), ("k", "256"), ("n", "128"), ("bm", "16"), ("bk", "128"), ("bn", "128")],
    );
    let mut rng = Rng::new(13);
    let inputs = [
        HostArray::bf16_from_f32(&[64, 256], &rng.bf16s(64 * 256)),
        HostArray::bf16_from_f32(&[256, 128], &rng.bf16s(256 * 128)),
    ];
    let bad = edit(
        &body,
        "\"stable_mosaic.func.return\"(%arg0, %arg2)",
        "\"stable_mosaic.func.return\"(%arg2, %arg0)",
    );
    let text = expect_err(run(&bad, &inputs), ErrorKind::OutOfBounds);
    assert!(text.contains("block index") && text.contains("input0"), "{text}");
}

#[test]
fn bad_inputs_are_rejected() {
    let (body, inputs) = gather();
    let (_, call) = library_body("gather_rows", &[]);
    let p = prepare(&body);
    // Without a call spec a missing input would be taken for an output; with one it is an error.
    let spec = CallSpec::from_json(&call).unwrap();
    let e = p.run_with(&inputs[..1], &spec).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    let wrong = [inputs[0].clone(), HostArray::from_f32(&[64, 16, 256], &vec![1.0; 64 * 16 * 256])];
    let e = p.run(&wrong).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadInput, "{e}");
    assert!(e.to_string().contains("expects bf16"), "{e}");
}

#[test]
fn parse_errors_name_line_and_column() {
    let (body, _) = library_body("rmsnorm", &[]);
    let bad = body.replacen("vector<64x2048xf32>", "vector<64x2048xq32>", 1);
    let e = Module::parse(&bad).unwrap_err();
    let line = bad.lines().position(|l| l.contains("xq32")).unwrap() as u32 + 1;
    assert_eq!(e.line, line, "{e}");
    assert!(e.message.contains("unknown type `q32`"), "{e}");
    assert!(e.to_string().starts_with(&format!("parse error at line {line}, column ")), "{e}");
    let e = Module::parse("module {\n  %0 = \"x.y\"(%1 : () -> i32\n}").unwrap_err();
    assert_eq!((e.line, e.col), (2, 17), "{e}");
}

#[test]
fn unknown_ops_are_reported_at_prepare() {
    let (body, _) = library_body("rmsnorm", &[]);
    let bad = body.replacen("stable_mosaic.math.rsqrt", "stable_mosaic.math.frobnicate", 1);
    let e = Module::parse(&bad).unwrap().prepare().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("math.frobnicate"), "{e}");
}
