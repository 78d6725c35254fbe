//! `if`, `for` and `while` in kernel bodies: traced into structured regions when their
//! conditions are traced (a loop when it says `fori`), plain Rust when they are not (a loop
//! when it says `unrolled`); assigned variables are carried.
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[kernel(grid = (4,), semantics = (arbitrary,))]
fn loops(
    #[default(3)] repeats: usize,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(smem, i32[1])] count: Ref,
) {
    let mut acc = x[..];
    // Unrolled while tracing (three multiplies, no loop op).
    for _ in unrolled(0, repeats) {
        acc = acc * 2.0;
    }
    // An scf.for carrying `acc` and `steps`.
    let mut steps = scalar(0);
    for i in fori(0, program_id(0)) {
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
    let k = loops::build(&loops::Params { repeats: 3 }).unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    assert_eq!(text.matches(" = mul ").count(), 3, "static loop unrolled:\n{text}");
    assert!(text.contains(" = for "), "{text}");
    assert!(text.contains(" = while init("), "{text}");
    assert!(text.contains("} do {"), "{text}");
    let if_line = text
        .lines()
        .find(|l| l.contains(" = if "))
        .unwrap_or_else(|| panic!("if with a result:\n{text}"));
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
    let k = scoped::build(&Default::default()).unwrap();
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
    for _t in fori(0, 2) {
        for _c in fori(0, 3) {
            slot = 1 - slot;
        }
    }
    let mut n = scalar(0);
    for i in fori(0, 4) {
        if i > 1 {
            n = n + i;
        }
    }
    o[0] = slot + n;
}

#[test]
fn names_assigned_in_nested_regions_are_carried_by_the_enclosing_ones() {
    let k = nested_carry::build(&Default::default()).unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    // All three loops and the `if` yield: the outer loop carries `slot` through the inner one.
    assert_eq!(text.matches(" = for ").count(), 3, "{text}");
    assert!(!text.contains("init()"), "a loop carries nothing:\n{text}");
    assert!(text.contains(" = if "), "{text}");
}

#[kernel]
fn literal_bounds(#[default(2)] repeats: usize, #[output(f32[8], space = smem)] o: Ref) {
    // `fori` traces whatever its bounds are (Rust literals become i32 constants; `i` is a
    // traced i32, so a method call on it needs no annotation).
    for i in fori(0, 4) {
        o[i] = i.cast(f32);
    }
    for j in fori(scalar(4), 8) {
        o[j] = j.cast(f32);
    }
    // `unrolled` runs at trace time; an unsuffixed literal takes the other bound's type.
    for k in unrolled(0, repeats) {
        o[k] = o[k] + 1.0;
    }
    for k in unrolled(repeats, 4) {
        o[k] = o[k] + 2.0;
    }
}

#[test]
fn the_loop_form_not_the_bounds_says_traced_or_unrolled() {
    let k = literal_bounds::build(&literal_bounds::Params { repeats: 2 }).unwrap();
    let text = print_kernel(&k, PrintOptions::default());
    assert_eq!(
        text.matches(" for ").count(),
        2,
        "two traced loops (Rust bounds and all), the others unrolled:\n{text}"
    );
    assert_eq!(text.matches(" = add ").count(), 4, "2 + 2 unrolled iterations:\n{text}");
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
    let errors = rust_value_in_traced_if::build(&Default::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert!(
        errors.0[0].message.starts_with("a Rust value cannot change inside a traced if"),
        "{errors}"
    );
}
