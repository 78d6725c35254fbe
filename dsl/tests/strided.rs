//! Strided `ds(start, size).stride(n)` (Pallas's `pl.ds(start, size, stride)`): loads and
//! stores of VMEM refs take it; everything Mosaic cannot stride is refused at its line, and
//! so is a value slice at a traced start (Pallas has no `lax.dynamic_slice` lowering).
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[kernel(grid = (2,))]
fn every_other_row(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[(ds(1, 8).stride(2), ..)];
}

#[test]
fn a_strided_load_prints_its_stride() {
    let text = print_kernel(
        &every_other_row::build(&Default::default()).unwrap(),
        PrintOptions::default(),
    );
    assert!(text.contains("load v1[1:+8:2, 0:+128]"), "{text}");
}

#[kernel(grid = (2,))]
fn strided_mistakes(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let lanes = x[(.., ds(0, 64).stride(2))];
    let past_the_end = x[(ds(2, 8).stride(2), ..)];
    let sub = x.at((ds(0, 8).stride(2), ..));
    o.store_masked((ds(0, 4).stride(2), ..), x[(0..4, ..)], iota([4, 128], 0) < 2);
    let rows = x[..].slice((ds(0, 8).stride(2), ..));
    let none = x[(ds(0, 8).stride(0), ..)];
    let dynamic = x[..].slice((ds(program_id(0), 8), ..));
    o[..] = lanes[(0..8, ..)] + past_the_end + sub[..] + rows + none + dynamic;
}

#[test]
fn what_mosaic_cannot_stride_is_refused_at_its_line() {
    let errors = strided_mistakes::build(&Default::default()).unwrap_err();
    let text = errors.to_string();
    let line = |needle: &str| {
        errors
            .0
            .iter()
            .find(|e| e.message.contains(needle))
            .unwrap_or_else(|| panic!("no error about `{needle}`:\n{text}"))
            .loc
            .expect("located")
            .line
    };
    let first = line(
        "a stride along the last (lane) dim of [16,128]: Mosaic strides loads and stores along the leading dims only",
    );
    assert_eq!(line("index 2:+8:2 is out of bounds along dim 0 (extent 16)"), first + 1, "{text}");
    assert_eq!(line("a strided ds cannot make a sub-ref"), first + 2, "{text}");
    assert_eq!(line("a strided store cannot be masked"), first + 3, "{text}");
    assert_eq!(line("Pallas TPU has no lowering for strided value slices"), first + 4, "{text}");
    assert_eq!(line("ds stride 0 along dim 0"), first + 5, "{text}");
    assert_eq!(line("Pallas TPU has no lowering for `lax.dynamic_slice`"), first + 6, "{text}");
}
