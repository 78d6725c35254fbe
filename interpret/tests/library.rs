//! The library kernels, lowered by `palladium_lowering` and run from their serialized body
//! text, against plain-Rust references on seeded random inputs.

#![allow(clippy::result_large_err)]

use crate::common;

use common::*;
use palladium_interpret::{CallSpec, HostArray, Module};
use palladium_kernels::moe_reference;

fn run_matmul(m: usize, k: usize, n: usize, bm: usize, bk: usize, bn: usize, seed: u64) {
    let s = |v: usize| v.to_string();
    let (body, call) = library_body(
        "matmul",
        &[("m", &s(m)), ("k", &s(k)), ("n", &s(n)), ("bm", &s(bm)), ("bk", &s(bk)), ("bn", &s(bn))],
    );
    let mut rng = Rng::new(seed);
    let (x, y) = (rng.bf16s(m * k), rng.bf16s(k * n));
    let inputs = [HostArray::bf16_from_f32(&[m, k], &x), HostArray::bf16_from_f32(&[k, n], &y)];
    let program = prepare(&body);
    let out = program.run(&inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].shape, vec![m, n]);
    assert_eq!(out[0].dtype, palladium_array::DType::Bf16);
    let want = matmul_ref(&x, &y, m, k, n);
    assert_close(
        &out[0].to_f32(),
        &want,
        1e-2,
        1e-1,
        &format!("matmul {m}x{k}x{n} blocks {bm}x{bk}x{bn}"),
    );
    // The call spec gives the same answer.
    let spec = CallSpec::from_json(&call).unwrap();
    assert_eq!(program.run_with(&inputs, &spec).unwrap(), out);
}

#[test]
fn matmul_small() {
    run_matmul(64, 256, 128, 16, 128, 128, 1);
}

#[test]
fn matmul_rectangular_grid() {
    run_matmul(128, 512, 256, 32, 256, 128, 2);
}

#[test]
fn matmul_single_k_step() {
    run_matmul(32, 128, 256, 16, 128, 128, 3);
}

use palladium_kernels::reference::{gather_rows as gather_ref, rmsnorm as rmsnorm_ref};

fn run_rmsnorm(rows: usize, hidden: usize, block_rows: usize, seed: u64) {
    let s = |v: usize| v.to_string();
    let (body, _) = library_body(
        "rmsnorm",
        &[("rows", &s(rows)), ("hidden", &s(hidden)), ("block_rows", &s(block_rows))],
    );
    let mut rng = Rng::new(seed);
    let (x, w) = (rng.bf16s(rows * hidden), rng.bf16s(hidden));
    let out = run(
        &body,
        &[
            HostArray::bf16_from_f32(&[rows, hidden], &x),
            HostArray::bf16_from_f32(&[1, hidden], &w),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].shape, vec![rows, hidden]);
    assert_close(&out[0].to_f32(), &rmsnorm_ref(&x, &w, rows, hidden, 1e-6), 1e-2, 1e-2, "rmsnorm");
}

#[test]
fn rmsnorm_small() {
    run_rmsnorm(64, 256, 16, 4);
}

#[test]
fn rmsnorm_one_block() {
    run_rmsnorm(32, 512, 32, 5);
}

fn gather_inputs(
    n: usize,
    table_rows: usize,
    r: usize,
    d: usize,
    seed: u64,
) -> (Vec<i32>, Vec<f32>, [HostArray; 2]) {
    let mut rng = Rng::new(seed);
    let mut ids = rng.permutation(table_rows);
    ids.truncate(n);
    let table = rng.bf16s(table_rows * r * d);
    let inputs =
        [HostArray::from_i32(&[n], &ids), HostArray::bf16_from_f32(&[table_rows, r, d], &table)];
    (ids, table, inputs)
}

fn run_gather(n: usize, table_rows: usize, r: usize, d: usize, scale: f32, seed: u64) {
    let s = |v: usize| v.to_string();
    let (body, _) = library_body(
        "gather_rows",
        &[
            ("n", &s(n)),
            ("table_rows", &s(table_rows)),
            ("r", &s(r)),
            ("d", &s(d)),
            ("scale", &scale.to_string()),
        ],
    );
    let (ids, table, inputs) = gather_inputs(n, table_rows, r, d, seed);
    let out = run(&body, &inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].shape, vec![n, r, d]);
    assert_eq!(out[0].to_f32(), gather_ref(&ids, &table, r, d, scale), "gather_rows must be exact");
}

#[test]
fn gather_rows_default() {
    run_gather(8, 64, 16, 256, 2.0, 6);
}

#[test]
fn gather_rows_small() {
    run_gather(5, 16, 8, 128, 0.5, 7);
}

#[test]
fn module_facts() {
    let (body, _) = library_body("gather_rows", &[]);
    let m = Module::parse(&body).unwrap();
    assert_eq!(m.version(), Some(15));
    assert!(m.ast.serialized);
    let p = m.prepare().unwrap();
    assert_eq!(p.name(), "gather_rows");
    assert_eq!(p.grid(), &[8]);
}

/// `moe_router` on rows whose logits are not finite (a NaN row, an infinite one, one whose
/// products overflow, with and without the padded experts' columns): every row still gets
/// `top_k` distinct expert ids in range (a fetch by id stays in bounds), the ones the
/// reference (the model crate's routing) picks, the bad rows' weights are all NaN (the
/// poison reaches the output), and the finite rows route and weigh bit for bit as they do
/// beside finite rows.
#[test]
fn moe_router_keeps_ids_distinct_and_in_range_for_non_finite_logits() {
    let (tokens, hidden, top_k) = (8, 256, 4);
    for experts in [128usize, 100] {
        let s = |v: usize| v.to_string();
        let (body, _) = library_body(
            "moe_router",
            &[
                ("tokens", &s(tokens)),
                ("hidden", &s(hidden)),
                ("experts", &s(experts)),
                ("top_k", &s(top_k)),
            ],
        );
        let program = prepare(&body);
        let mut rng = Rng::new(8);
        let (x, w) = (rng.bf16s(tokens * hidden), rng.bf16s(hidden * experts));
        let mut bad = x.clone();
        bad[..hidden].fill(f32::NAN);
        bad[hidden..2 * hidden].fill(f32::INFINITY);
        bad[2 * hidden..3 * hidden].fill(3e38);
        let route = |x: &[f32]| {
            let inputs = [
                HostArray::bf16_from_f32(&[tokens, hidden], x),
                HostArray::bf16_from_f32(&[hidden, experts], &w),
            ];
            let out = program.run(&inputs).unwrap_or_else(|e| panic!("{experts} experts: {e}"));
            (out[0].to_i32(), out[1].to_f32())
        };
        let (ids, weights) = route(&bad);
        let (good_ids, good_weights) = route(&x);
        let (want_ids, _) = moe_reference::moe_router(
            &bad,
            &w,
            tokens,
            hidden,
            experts,
            top_k,
            moe_reference::RouterScoring::Softmax,
            moe_reference::TopKWeights::Renormalized,
        );
        assert_eq!(ids, want_ids, "{experts} experts: the reference's ids");
        for r in 0..tokens {
            let row = &ids[r * top_k..(r + 1) * top_k];
            let mut distinct = row.to_vec();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), top_k, "{experts} experts, row {r}: ids {row:?}");
            assert!(row.iter().all(|&e| (0..experts as i32).contains(&e)), "row {r}: {row:?}");
            let (w, good_w) =
                (&weights[r * top_k..(r + 1) * top_k], &good_weights[r * top_k..(r + 1) * top_k]);
            if r < 3 {
                assert!(w.iter().all(|v| v.is_nan()), "{experts} experts, row {r}: weights {w:?}");
            } else {
                assert_eq!(row, &good_ids[r * top_k..(r + 1) * top_k], "row {r}");
                assert!(w.iter().zip(good_w).all(|(a, b)| a.to_bits() == b.to_bits()), "row {r}");
            }
        }
    }
}
