//! Element-indexed block dims (Pallas's `pl.Element(n, (before, after))`): carried typed in
//! the call spec, printed, and checked by the verifier with the index map's results as
//! element offsets (bounds in the padded array; an output's windows must cover it).
use crate::common;
use common::line_of;
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;
use palladium_dsl::spec::BlockDim;

/// This file's text: error locations are checked against its declarations.
const SOURCE: &str = include_str!("element_windows.rs");

#[kernel(grid = (4,), semantics = (parallel,))]
fn overlapping(
    #[default(8)] pad_after: usize,
    #[default(8)] out_rows: usize,
    #[default(8)] out_step: i32,
    #[input(f32[32, 128], block = [Element(16, (0, pad_after)), Element(128)], map = |i| (i * 8, 0))]
    x: Ref,
    #[output(f32[32, 128], block = [Element(out_rows), Element(128)], map = |i| (i * out_step, 0))]
    o: Ref,
) {
    o[..] = x[(0..8, ..)];
}

/// Without padding, the last window (rows 24..40) runs past the 32 rows.
#[kernel(grid = (4,), semantics = (parallel,))]
fn unpadded(
    #[input(f32[32, 128], block = [Element(16), Element(128)], map = |i| (i * 8, 0))] x: Ref,
    #[output(f32[32, 128], block = [Element(8), Element(128)], map = |i| (i * 8, 0))] o: Ref,
) {
    o[..] = x[(0..8, ..)];
}

/// Padding before (Pallas emits it; libtpu refuses it) and a padded output.
#[kernel(grid = (4,), semantics = (parallel,))]
fn padded_wrongly(
    #[input(f32[32, 128], block = [Element(16, (8, 0)), Element(128)], map = |i| (i * 8, 0))]
    x: Ref,
    #[output(f32[32, 128], block = [Element(8, (0, 8)), Element(128)], map = |i| (i * 8, 0))]
    o: Ref,
) {
    o[..] = x[(0..8, ..)];
}

#[test]
fn element_dims_reach_the_call_spec_and_the_printer() {
    let k = overlapping::build(&Default::default()).unwrap_or_else(|e| panic!("{e}"));
    let blocks: Vec<_> = k.call.operands.iter().map(|o| o.block.clone().unwrap()).collect();
    assert_eq!(
        blocks[0],
        [BlockDim::Element { size: 16, pad: (0, 8) }, BlockDim::Element { size: 128, pad: (0, 0) }]
    );
    assert_eq!(
        blocks[1],
        [BlockDim::Element { size: 8, pad: (0, 0) }, BlockDim::Element { size: 128, pad: (0, 0) }]
    );
    let text = print_kernel(&k, PrintOptions::default());
    assert!(
        text.contains("in x: f32[32,128] vmem block [Element(16, (0, 8)),Element(128)]"),
        "{text}"
    );
}

#[test]
fn windows_past_the_padded_array_are_refused() {
    let text = unpadded::build(&Default::default()).unwrap_err().to_string();
    let at = format!(
        "index map of x at {}:{}:13: reaches element offset 24 along dim 0: its window of 16 ends at 40, outside the array's 32 elements (dim 32 of [32,128])",
        file!(),
        line_of(SOURCE, "block = [Element(16), Element(128)], map = |i| (i * 8, 0))] x")
    );
    assert!(text.contains(&at), "{text}");
    // Padded by 8 after, the same windows fit.
    assert!(overlapping::build(&Default::default()).is_ok());
}

#[test]
fn an_output_must_be_covered_by_its_windows() {
    // Windows of 8 rows every 10: rows 8..10 are never written (and the last one runs past).
    let text = overlapping::build(&overlapping::Params { out_step: 10, ..Default::default() })
        .unwrap_err()
        .to_string();
    assert!(text.contains("elements 8..10 of dim 0 (size 32) are never written: the grid (4) places its windows of 8 at element offsets 0, 10, ..., 30"), "{text}");
    assert!(text.contains("reaches element offset 30 along dim 0"), "{text}");
    // Overlapping output windows of 16 every 8 (the last past the end: refused) vs 8 every 8.
    let text = overlapping::build(&overlapping::Params {
        out_rows: 16,
        out_step: 4,
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(text.contains("elements 28..32 of dim 0 (size 32) are never written"), "{text}");
}

#[test]
fn padding_before_and_padded_outputs_are_refused() {
    let text = padded_wrongly::build(&Default::default()).unwrap_err().to_string();
    let at = format!(
        "operand x at {}:{}:13: element block dim 0 is padded by 8 before: libtpu (0.0.42.1) refuses it",
        file!(),
        line_of(SOURCE, "block = [Element(16, (8, 0)), Element(128)]")
    );
    assert!(text.contains(&at), "{text}");
    let at = format!(
        "operand o at {}:{}:14: element block dim 0 of an output is padded (0, 8): padding only applies to inputs",
        file!(),
        line_of(SOURCE, "block = [Element(8, (0, 8)), Element(128)]")
    );
    assert!(text.contains(&at), "{text}");
}
