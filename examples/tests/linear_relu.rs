//! The tiled `relu(x @ w + b)` through the entry crate alone: interpreted against its
//! reference at two blockings, its IR snapshotted (`tests/snapshots/`) and compiled by libtpu
//! for v6e (the TPU venv's libtpu, required as by every libtpu test here).

use palladium::dsl::ir::{PrintOptions, print_kernel};
use palladium::lowering::{LowerOptions, lower};
use palladium::{Chip, Kernel};
use palladium_examples::{linear_relu, linear_relu_inputs, linear_relu_reference};

fn build(p: &linear_relu::Params) -> Kernel {
    linear_relu::build(p).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn linear_relu_interprets_within_tolerance_of_its_reference() {
    // The defaults (two contraction steps per block), then one step over the whole of k.
    let whole_k = linear_relu::Params { bm: 64, bk: 512, bn: 256, ..Default::default() };
    for p in [linear_relu::Params::default(), whole_k] {
        let kernel = build(&p);
        let inputs = linear_relu_inputs(&p, 3);
        let want = [linear_relu_reference(&p, &inputs[0], &inputs[1], &inputs[2])];
        let zeros = want[0].to_f32().iter().filter(|v| **v == 0.0).count();
        assert!(zeros > 0 && zeros < p.m * p.n, "the ReLU clips some outputs, not all: {zeros}");
        let result = palladium::interpret_against(&kernel, Chip::V6e, &inputs, &want, None)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{result}");
        assert!(result.passed(), "{p:?}:\n{result}");
    }
}

#[test]
fn linear_relu_ir_snapshot() {
    let kernel = build(&linear_relu::Params::default());
    insta::assert_snapshot!("linear_relu.ir", print_kernel(&kernel, PrintOptions::default()));
    let lowered = lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap();
    insta::assert_snapshot!("linear_relu.mosaic", lowered.module);
}

#[test]
fn linear_relu_compiles_for_v6e_with_libtpu() {
    let kernel = build(&linear_relu::Params::default());
    let report = palladium::compile_for(&kernel, Chip::V6e).unwrap_or_else(|e| panic!("{e}"));
    eprint!("{}", report.text());
    assert!(report.compiled.code_size_bytes > 0, "{report:?}");
    let cycles = report.compiled.estimated_cycles;
    assert!(cycles.is_some_and(|c| c > 0), "no estimate: {:?}", report.compiled.estimate_note);
}
