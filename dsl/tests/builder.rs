//! The tracing builder used directly (what `#[kernel]` expands to).
use palladium_dsl::__private::*;
use palladium_dsl::build::range;
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[test]
fn hand_traced_matmul_prints_and_verifies() {
    let (m, k, n, bm, bk, bn) = (1024u64, 2048u64, 1024u64, 256u64, 512u64, 256u64);
    let mut b = KernelBuilder::new("matmul");
    b.grid_dim(m / bm, Semantics::Parallel)
        .grid_dim(n / bn, Semantics::Parallel)
        .grid_dim(k / bk, Semantics::Arbitrary);
    b.operand(
        "x",
        OperandRole::Input,
        DType::Bf16,
        &[m, k],
        MemorySpace::Vmem,
        Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bk)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[0], g[2]))),
    );
    b.operand(
        "y",
        OperandRole::Input,
        DType::Bf16,
        &[k, n],
        MemorySpace::Vmem,
        Some(vec![BlockDim::Blocked(bk), BlockDim::Blocked(bn)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[2], g[1]))),
    );
    b.operand(
        "o",
        OperandRole::Output,
        DType::Bf16,
        &[m, n],
        MemorySpace::Vmem,
        Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bn)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[0], g[1]))),
    );
    b.scratch_buffer("acc", MemorySpace::Vmem, DType::F32, &[bm, bn]);
    let sealed = b.seal().unwrap();
    let h: Vec<Ref> = sealed.handles.iter().cloned().map(|h| h.into_ref()).collect();
    let (x, y, o, acc) = (h[0], h[1], h[2], h[3]);
    if_else(
        cmp(CmpPred::Eq, program_id(2), 0),
        || acc.store(.., zeros([bm, bn], DType::F32)),
        || (),
    );
    acc.store(.., acc.load(..) + dot(x.load(..), y.load(..)));
    if_else(
        cmp(CmpPred::Eq, program_id(2), num_programs(2) - 1),
        || o.store(.., acc.load(..).cast(DType::Bf16)),
        || (),
    );
    let kernel = sealed.finish().unwrap();
    let text = print_kernel(&kernel, PrintOptions::default());
    assert!(text.contains("dot"), "{text}");
    println!("{text}");
}

/// A stream's drain as a traced loop is one more `for` around one copy of `consume`; peeled,
/// it is `count` straight-line copies, each told it is draining. The items and the carry
/// are the same either way.
#[test]
fn pipeline_drain_is_a_loop_or_peeled() {
    use palladium_dsl::build::{Drain, pipeline};
    use std::cell::Cell;
    let trace = |peeled: bool| {
        let mut b = KernelBuilder::new("stream");
        b.operand(
            "o",
            OperandRole::Output,
            DType::F32,
            &[8, 128],
            MemorySpace::Vmem,
            None,
            None::<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>,
        );
        let sealed = b.seal().unwrap();
        let o = sealed.handles[0].clone().into_ref();
        let (issued, drained) = (Cell::new(0), Cell::new(0));
        let drain = if peeled {
            Drain::Peeled { start: scalar(5), count: 2 }
        } else {
            Drain::Loop(range(scalar(5), scalar(7)))
        };
        let sum = pipeline(
            range(scalar(0), scalar(5)),
            drain,
            2,
            zeros([8, 128], DType::F32),
            |_, _| issued.set(issued.get() + 1),
            |i, acc, draining| {
                drained.set(drained.get() + usize::from(draining));
                acc + i.cast(DType::F32)
            },
        );
        o.store(.., sum);
        let text = print_kernel(&sealed.finish().unwrap(), PrintOptions::default());
        (
            text.lines()
                .filter(|l| l.contains(" for ") || l.trim_start().starts_with("for "))
                .count(),
            issued.get(),
            drained.get(),
        )
    };
    assert_eq!(trace(false), (2, 1, 1), "main loop and drain loop, each body traced once");
    assert_eq!(trace(true), (1, 1, 2), "main loop, then the two drain items unrolled");
}

/// A declaration's slot gives its handle after sealing, whatever was declared around it
/// (operands are laid out before scratch, so positions would not tell).
#[test]
fn sealed_handles_are_found_by_their_declaration_slot() {
    let mut b = KernelBuilder::new("slots");
    let acc = b.scratch_buffer("acc", MemorySpace::Vmem, DType::F32, &[8, 128]);
    let o = b.operand(
        "o",
        OperandRole::Output,
        DType::F32,
        &[8, 128],
        MemorySpace::Vmem,
        None,
        None::<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>,
    );
    let sems = b.scratch_semaphores("sems", SemKind::Dma, &[2]);
    let sealed = b.seal().unwrap();
    let [acc_h, o_h] = [acc, o].map(|slot| sealed.handle(slot).into_ref());
    assert_eq!(acc_h, sealed.handles[0].clone().into_ref());
    assert_eq!(o_h, sealed.handles[1].clone().into_ref());
    assert_eq!(sealed.handle(sems).into_sem(), sealed.handles[2].clone().into_sem());
    assert_ne!(acc_h, o_h);
    o_h.store(.., acc_h.load(..));
    let kernel = sealed.finish().unwrap();
    let text = print_kernel(&kernel, PrintOptions::default());
    assert!(text.contains("scratch acc") && text.contains("out o"), "{text}");
}
