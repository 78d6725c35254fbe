//! Trace-time and verifier errors: every mistake is reported, with the rule it breaks and
//! where it was made.
use palladium_dsl::ir::{VerifyOptions, verify};
use palladium_dsl::prelude::*;
use palladium_dsl::spec::Chip;

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
    let errors = shape_mismatch().unwrap_err();
    let text = errors.to_string();
    assert_eq!(errors.0.len(), 2, "{text}");
    assert_eq!(errors.0[0].message, "add: operand types differ: f32[8,256] vs f32[8,128]", "{text}");
    assert!(errors.0[1].message.contains("dot contracts lhs dim 1 (256) with rhs dim 0 (8): sizes differ"), "{text}");
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
    let text = unaligned_bf16_block().unwrap_err().to_string();
    assert!(text.contains("operand x") && text.contains("operand o"), "{text}");
    assert!(text.contains("TPU block rule: the last block dim (100) must be a multiple of 128 lanes"), "{text}");
    assert!(text.contains("second-minor block dim (100) must be a multiple of 16 (native bf16 tile (16,128))"), "{text}");
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
    let text = too_big().unwrap_err().to_string();
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
    let k = fits_v6e_not_v7x().unwrap();
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
    let text = bad_memory_use().unwrap_err().to_string();
    assert!(text.contains("any refs can only be accessed by DMA"), "{text}");
    assert!(text.contains("masked stores need 32-bit data, got bf16"), "{text}");
    assert!(text.contains("semaphore must be a sem, got dma_sem"), "{text}");
}
