//! Trace-time and verifier errors: every mistake is reported, with the rule it breaks and
//! where it was made.
use crate::common;
use common::line_of;
use palladium_dsl::ir::{VerifyOptions, check_hbm, verify};
use palladium_dsl::prelude::*;
use palladium_dsl::spec::Chip;

/// This file's text: error locations are checked against its declarations.
const SOURCE: &str = include_str!("verifier.rs");

#[kernel(grid = (4,))]
fn shape_mismatch(
    #[input(f32[32, 256], block = [8, 256], map = |i| (i, 0))] x: Ref,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] y: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let bad = x[..] + y[..];
    o[..] = bad;
    o[..] = dot(x[..], y[..]);
}

#[test]
fn trace_errors_are_all_reported_at_their_lines() {
    let errors = shape_mismatch::build(&Default::default()).unwrap_err();
    let text = errors.to_string();
    assert_eq!(errors.0.len(), 2, "{text}");
    assert_eq!(
        errors.0[0].message, "add: operand types differ: f32[8,256] vs f32[8,128]",
        "{text}"
    );
    assert!(
        errors.0[1]
            .message
            .contains("dot contracts lhs dim 1 (256) with rhs dim 0 (8): sizes differ"),
        "{text}"
    );
    let lines: Vec<u32> = errors.0.iter().map(|e| e.loc.expect("located").line).collect();
    assert_eq!(lines[1], lines[0] + 2, "errors point at the two offending lines: {text}");
    assert!(errors.0.iter().all(|e| e.loc.unwrap().file.ends_with("tests/verifier.rs")));
}

#[kernel(grid = (4,))]
fn unaligned_bf16_block(
    #[input(bf16[400, 400], block = [100, 100], map = |i| (i, 0))] x: Ref,
    #[output(bf16[400, 400], block = [100, 100], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn a_100x100_bf16_block_breaks_the_tiling_rule() {
    let text = unaligned_bf16_block::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains("operand x") && text.contains("operand o"), "{text}");
    assert!(
        text.contains("TPU block rule: the last block dim (100) must be a multiple of 128 lanes"),
        "{text}"
    );
    assert!(
        text.contains(
            "second-minor block dim (100) must be a multiple of 16 (native bf16 tile (16,128))"
        ),
        "{text}"
    );
}

#[kernel(grid = (2,), vmem_limit = 1 << 20)]
fn too_big(
    #[input(f32[2048, 512], block = [1024, 512], map = |i| (i, 0))] x: Ref,
    #[output(f32[2048, 512], block = [1024, 512], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn vmem_budget_is_checked_with_the_numbers() {
    let text = too_big::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains("VMEM budget exceeded: 8388608 bytes needed (x 2x2097152 + o 2x2097152), limit 1048576 bytes"), "{text}");
}

#[kernel(grid = (1,))]
fn fits_v6e_not_v7x(
    #[input(f32[4096, 2048], block = [4096, 2048], map = |i| (0, 0))] x: Ref,
    #[output(f32[4096, 2048], block = [4096, 2048], map = |i| (0, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn vmem_budget_depends_on_the_chip() {
    // 4 x 32 MiB of double-buffered blocks: over the default scoped limit everywhere.
    let k = fits_v6e_not_v7x::build(&Default::default()).unwrap();
    let err = verify(&k, VerifyOptions { chip: Some(Chip::V7x) }).unwrap_err().to_string();
    assert!(err.contains("limit 33554432 bytes on v7x"), "{err}");
}

#[kernel(grid = (2,))]
fn bad_memory_use(
    #[input(f32[16, 128], space = any)] h: Ref,
    #[input(bf16[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(bf16[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(dma_sem)] sem: SemRef,
) {
    let direct = h[..];
    o.store_masked(.., x[..], iota([8, 128], 1) < 64);
    sem.signal(1);
}

#[test]
fn memory_rules() {
    let text = bad_memory_use::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains("any refs can only be accessed by DMA"), "{text}");
    assert!(text.contains("masked stores need 32-bit data, got bf16"), "{text}");
    assert!(text.contains("semaphore must be a sem, got dma_sem"), "{text}");
}

/// Blocks tile their arrays, but the grid is too short: rows 24.. are never written.
#[kernel(grid = (rows / 256,), semantics = (parallel,))]
fn short_grid(
    #[default(1000)] rows: usize,
    #[input(f32[rows, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[rows, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn outputs_the_grid_does_not_cover_are_named_with_the_range() {
    let text = short_grid::build(&short_grid::Params { rows: 1000 }).unwrap_err().to_string();
    assert!(text.contains("output o at "), "{text}");
    assert!(text.contains(": elements 24..1000 of dim 0 (size 1000) are never written: the grid (3) reaches blocks 0..3 of its 125 blocks of 8"), "{text}");
    assert!(!text.contains("output x"), "inputs need not be read whole: {text}");
}

/// Every other block (`2 * i`), and a constant block on the second dim.
#[kernel(grid = (4,))]
fn strided_map(
    #[input(f32[64, 256], block = [8, 128], map = |i| (2 * i, 0))] x: Ref,
    #[output(f32[64, 256], block = [8, 128], map = |i| (2 * i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn strided_and_constant_maps_leave_gaps() {
    let text = strided_map::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains(": elements 8..16 of dim 0 (size 64) are never written: the grid (4) reaches blocks 0, 2, ..., 6 of its 8 blocks of 8"), "{text}");
    assert!(text.contains(": elements 128..256 of dim 1 (size 256) are never written: the grid (4) reaches only block 0 of its 2 blocks of 128"), "{text}");
}

/// The index map runs past the end of the array.
#[kernel(grid = (4,))]
fn past_the_end(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i + 1, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn blocks_past_the_end_of_an_array_are_refused() {
    let text = past_the_end::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains("index map of x at "), "{text}");
    assert!(
        text.contains(
            ": reaches block 4 along dim 0, outside the array's 4 blocks of 8 (dim 32 of [32,128])"
        ),
        "{text}"
    );
}

/// Parameters are checked before tracing: sizes, `requires`, block tiling, in stages.
#[kernel(grid = (m / bm,), semantics = (parallel,), requires = [top <= m, m % 16 == 0])]
fn checked_params(
    #[default(1024)] m: usize,
    #[default(256)] bm: usize,
    #[default(4)] top: usize,
    #[default(1.0)] eps: f64,
    #[input(f32[m, 128], block = [bm, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[m, 128], block = [bm, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..] * eps;
}

#[test]
fn parameters_are_checked_before_tracing() {
    let err =
        |r: Result<palladium_dsl::Kernel, palladium_dsl::BuildErrors>| r.unwrap_err().to_string();
    let text = err(checked_params::build(&checked_params::Params {
        m: 1024,
        bm: 0,
        top: 4,
        eps: f64::NAN,
    }));
    assert!(
        text.contains("parameter bm = 0: sizes and counts must be between 1 and 2147483647"),
        "{text}"
    );
    assert!(text.contains("parameter eps = NaN: must be finite"), "{text}");
    let text = err(checked_params::build(&checked_params::Params {
        m: 1 << 40,
        bm: 256,
        top: 4,
        eps: 1.0,
    }));
    assert!(text.contains("parameter m = 1099511627776: sizes and counts must be between 1 and 2147483647 (TPU index arithmetic is i32)"), "{text}");
    let text =
        err(checked_params::build(&checked_params::Params { m: 1000, bm: 8, top: 2000, eps: 1.0 }));
    assert!(text.contains("requires top <= m, but top = 2000, m = 1000"), "{text}");
    assert!(text.contains("16 does not divide m = 1000"), "{text}");
    let text =
        err(checked_params::build(&checked_params::Params { m: 1024, bm: 384, top: 4, eps: 1.0 }));
    assert_eq!(
        text,
        "error: block dim 0 of `x`: bm = 384 does not divide m = 1024\nerror: block dim 0 of `o`: bm = 384 does not divide m = 1024"
    );
    assert!(
        checked_params::build(&checked_params::Params { m: 1024, bm: 256, top: 4, eps: 1.0 })
            .is_ok()
    );
}

#[kernel(grid = (1,))]
fn sixty_gib(
    #[input(bf16[1 << 15, 1 << 20], space = any)] x: Ref,
    #[output(f32[8, 128], block = [8, 128], map = |i| (0, 0))] o: Ref,
) {
    o[..] = 0.0;
}

#[test]
fn operands_must_fit_the_chips_hbm() {
    let k = sixty_gib::build(&Default::default()).unwrap();
    assert!(check_hbm(&k, Chip::V7x).is_ok());
    let err = check_hbm(&k, Chip::V6e).unwrap_err();
    assert_eq!(
        err,
        "the operands of `sixty_gib` need 64.00 GiB (68719480832 bytes: x 64.00 GiB, o 0.00 GiB), more than the 32.00 GiB of HBM per device on v6e"
    );
}

/// The index map returns one block index for a 2-d array.
#[kernel(grid = (4,))]
fn short_index_map(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i,))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn call_spec_errors_point_at_the_operand_declaration() {
    // Each at the operand's array type in its attribute (`bf16[..]` after `#[input(`), not at
    // the `#[kernel]` line.
    // `#[output(` is a column longer.
    let at = |line: u32| format!(" at {}:{line}:13: ", file!());
    let at_output = |line: u32| format!(" at {}:{line}:14: ", file!());
    let tiling = unaligned_bf16_block::build(&Default::default()).unwrap_err().to_string();
    assert!(
        tiling.contains(&format!(
            "operand x{}TPU block rule",
            at(line_of(SOURCE, "#[input(bf16[400, 400], block = [100, 100]"))
        )),
        "{tiling}"
    );
    let o = line_of(SOURCE, "#[output(bf16[400, 400], block = [100, 100]");
    assert!(tiling.contains(&format!("operand o{}TPU block rule", at_output(o))), "{tiling}");
    assert!(tiling.contains(&format!("output o{}elements 100..400", at_output(o))), "{tiling}");
    // The budget at its largest VMEM user (here a tie: the first).
    let budget = too_big::build(&Default::default()).unwrap_err().to_string();
    assert!(
        budget.contains(&format!(
            "vmem{}VMEM budget exceeded",
            at(line_of(SOURCE, "#[input(f32[2048, 512], block = [1024, 512]"))
        )),
        "{budget}"
    );
    let arity = short_index_map::build(&Default::default()).unwrap_err().to_string();
    assert!(
        arity.contains(&format!(
            "index map of x{}returns (i32), expected one i32 block index per array dim (2 dims)",
            at(line_of(SOURCE, "map = |i| (i,))] x"))
        )),
        "{arity}"
    );
}

/// A trace error (the add) and a call-spec error (o's tiling) in one kernel.
#[kernel(grid = (4,))]
fn errors_of_two_stages(
    #[input(f32[32, 256], block = [8, 256], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [4, 128], map = |i| (i, 0))] o: Ref,
) {
    let bad = x[..] + zeros([8, 128], f32);
    o[..] = bad;
}

#[test]
fn a_trace_error_does_not_hide_the_verifiers() {
    let errors = errors_of_two_stages::build(&Default::default()).unwrap_err();
    let text = errors.to_string();
    assert!(text.contains("add: operand types differ: f32[8,256] vs f32[8,128]"), "{text}");
    assert!(text.contains("operand o at") && text.contains("TPU block rule"), "{text}");
    assert_eq!(errors.0.len(), 2, "nothing repeated about the poisoned store: {text}");
}

#[kernel(grid = (4,))]
fn array_op_mistakes(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[input(bf16[64, 128], block = [16, 128], map = |i| (i, 0))] h: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let v = x[..];
    let a = v.sum(2);
    let b = v[(program_id(0), ..)];
    let c = v.roll(-1, 1);
    let d = dot_general(v, v, "mk,nk->nm", f32, Precision::Default);
    let e = concatenate(&[v, v[(.., 0..64)]], 0);
    let f = h[..].argmax(1);
    let g = v[(.., 64..256)];
    debug_print("{} of {}", &[program_id(0)]);
    o[..] = v;
}

#[test]
fn array_op_mistakes_are_reported_at_their_lines() {
    let errors = array_op_mistakes::build(&Default::default()).unwrap_err();
    let text = errors.to_string();
    let want = [
        "axis 2 is out of range for a value of shape [8,128]",
        "slice: the start along dim 0 must be a static non-negative integer",
        "roll: a static shift must be non-negative, got -1 (as pltpu.roll)",
        "dot_general: contraction spec `mk,nk->nm`: the result must be `mn`",
        "concat: cannot concatenate f32[8,128] and f32[8,64] along axis 0",
        "argmax: argmax takes an f32 vector (as tpu.reduce_index), got bf16[16,128]",
        "slice: range 64..256 is out of bounds along dim 1 (extent 128)",
        "debug_print: the format \"{} of {}\" has 2 `{}` placeholders for 1 values",
    ];
    assert_eq!(errors.0.len(), want.len(), "{text}");
    for (e, w) in errors.0.iter().zip(want) {
        assert!(e.message.starts_with(w), "expected `{w}…`, got `{}`\n{text}", e.message);
    }
    let lines: Vec<u32> = errors.0.iter().map(|e| e.loc.expect("located").line).collect();
    assert!(
        lines.windows(2).all(|w| w[1] == w[0] + 1),
        "one error per line, in order: {lines:?}\n{text}"
    );
}
