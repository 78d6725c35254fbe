//! `if`, `for` and `while` in kernel bodies: traced into structured regions when their
//! conditions are traced, plain Rust when they are not; assigned variables are carried.
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[kernel(grid = (4,), semantics = (arbitrary,))]
fn loops(
    #[default(3)] unrolled: usize,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(smem, i32[1])] count: Ref,
) {
    let mut acc = x[..];
    // Static bounds: unrolled while tracing (three multiplies, no loop op).
    for _ in 0..unrolled {
        acc = acc * 2.0;
    }
    // Traced bounds: an scf.for carrying `acc` and `steps`.
    let mut steps = scalar(0);
    for i in 0..program_id(0) {
        acc = acc + 1.0;
        steps = steps + i;
    }
    // A traced while loop carrying a counter.
    let mut n = scalar(0);
    while n < 5 {
        n = n + 1;
    }
    // An if whose branches assign `acc` differently.
    if steps > n && program_id(0) != 0 {
        acc = -acc;
    } else {
        acc = acc.maximum(0.0);
    }
    count[0] = n;
    o[..] = acc;
}

#[test]
fn loops_trace_into_regions_with_carried_values() {
    let k = loops(3).unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    assert_eq!(text.matches(" = mul ").count(), 3, "static loop unrolled:\n{text}");
    assert!(text.contains(" = for "), "{text}");
    assert!(text.contains(" = while init("), "{text}");
    assert!(text.contains("} do {"), "{text}");
    let if_line = text.lines().find(|l| l.contains(" = if ")).unwrap_or_else(|| panic!("if with a result:\n{text}"));
    assert!(if_line.contains(": f32[8,128]"), "{if_line}");
    // The for loop yields both carried values; the store reads the if's result.
    let for_line = text.lines().find(|l| l.contains(" = for ")).unwrap();
    assert!(for_line.contains(": f32[8,128], i32"), "{for_line}");
}

#[kernel(grid = (2,))]
fn scoped(
    #[input(f32[16, 128], space = any)] src: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let i = program_id(0);
    let block = run_scoped(|s| {
        let buf = s.vmem([8, 128], f32);
        let sem = s.dma_sem();
        let copy = async_copy(src.at(ds(i * 8, 8)), buf, sem);
        copy.start();
        copy.wait();
        buf[..]
    });
    o[..] = block + 1.0;
}

#[test]
fn run_scoped_allocates_and_yields() {
    let k = scoped().unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    assert!(text.contains(" = run_scoped : f32[8,128] {"), "{text}");
    assert!(text.contains("alloc scoped0 : ref<vmem, f32[8,128]>"), "{text}");
    assert!(text.contains("sem_alloc scoped_sem0 : dma_sem"), "{text}");
    assert!(text.contains("ref_slice v1[v"), "dynamic DMA slice:\n{text}");
}

#[kernel]
fn nested_carry(#[output(i32[1], space = smem)] o: Ref) {
    // `slot` is assigned only in the inner loop, `n` only inside an `if`: every enclosing
    // region must carry them too (a ring slot flipped per chunk, as in `expert_ffn`).
    let mut slot = scalar(0);
    for _t in 0..scalar(2) {
        for _c in 0..scalar(3) {
            slot = 1 - slot;
        }
    }
    let mut n = scalar(0);
    for i in 0..scalar(4) {
        if i > 1 {
            n = n + i;
        }
    }
    o[0] = slot + n;
}

#[test]
fn names_assigned_in_nested_regions_are_carried_by_the_enclosing_ones() {
    let k = nested_carry().unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    // All three loops and the `if` yield: the outer loop carries `slot` through the inner one.
    assert_eq!(text.matches(" = for ").count(), 3, "{text}");
    assert!(!text.contains("init()"), "a loop carries nothing:\n{text}");
    assert!(text.contains(" = if "), "{text}");
}

#[kernel]
fn literal_bounds(#[default(2)] unrolled: usize, #[output(f32[8], space = smem)] o: Ref) {
    // An unsuffixed literal bound takes the other bound's type: traced against `scalar(..)`
    // (a method call on `i` needs its type known), unrolled against a `usize`.
    for i in 0..scalar(4) {
        o[i] = i.cast(f32);
    }
    for j in scalar(4)..8 {
        o[j] = j.cast(f32);
    }
    for _ in 0..unrolled {
        o[0] = o[0] + 1.0;
    }
}

#[test]
fn a_literal_bound_takes_the_other_bounds_type() {
    let k = literal_bounds(2).unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    assert_eq!(text.matches(" for ").count(), 2, "two traced loops, one unrolled:\n{text}");
}

#[kernel]
fn rust_value_in_traced_if(#[output(i32[1], space = smem)] o: Ref) {
    let mut k = 0;
    if o[0] > 0 {
        k = 1;
    }
    o[0] = k;
}

#[test]
fn a_rust_value_assigned_in_a_traced_if_is_reported_once() {
    let errors = rust_value_in_traced_if().unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert!(errors.0[0].message.starts_with("a Rust value cannot change inside a traced if"), "{errors}");
}
