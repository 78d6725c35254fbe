//! The tracing builder used directly (what `#[kernel]` expands to).
use palladium_dsl::__private::*;
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[test]
fn hand_traced_matmul_prints_and_verifies() {
    let (m, k, n, bm, bk, bn) = (1024u64, 2048u64, 1024u64, 256u64, 512u64, 256u64);
    let mut b = KernelBuilder::new("matmul");
    b.grid_dim(m / bm, Semantics::Parallel).grid_dim(n / bn, Semantics::Parallel).grid_dim(k / bk, Semantics::Arbitrary);
    b.operand("x", OperandRole::Input, DType::Bf16, &[m, k], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bk)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[0], g[2]))));
    b.operand("y", OperandRole::Input, DType::Bf16, &[k, n], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bk), BlockDim::Blocked(bn)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[2], g[1]))));
    b.operand("o", OperandRole::Output, DType::Bf16, &[m, n], MemorySpace::Vmem, Some(vec![BlockDim::Blocked(bm), BlockDim::Blocked(bn)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[0], g[1]))));
    b.scratch_buffer("acc", MemorySpace::Vmem, DType::F32, &[bm, bn]);
    let sealed = b.seal().unwrap();
    let h: Vec<Ref> = sealed.handles.iter().cloned().map(|h| h.into_ref()).collect();
    let (x, y, o, acc) = (h[0], h[1], h[2], h[3]);
    if_else(cmp(CmpPred::Eq, program_id(2), 0), || acc.store(.., zeros([bm, bn], DType::F32)), || ());
    acc.store(.., acc.load(..) + dot(x.load(..), y.load(..)));
    if_else(cmp(CmpPred::Eq, program_id(2), num_programs(2) - 1), || o.store(.., acc.load(..).cast(DType::Bf16)), || ());
    let kernel = sealed.finish().unwrap();
    let text = print_kernel(&kernel, PrintOptions::default());
    assert!(text.contains("dot"), "{text}");
    println!("{text}");
}
