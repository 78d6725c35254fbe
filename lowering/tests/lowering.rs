//! Lowering without the oracle: determinism, error reporting, snapshots.

mod common;

use common::*;
use palladium_dsl::ir::{DType, Literal, OpData, Type};
use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerError, LowerOptions, lower};

const V6E: LowerOptions = LowerOptions { chip: Chip::V6e };

#[test]
fn lowering_is_deterministic() {
    for make in [matmul_kernel, dma_prefetch_kernel, rmsnorm_kernel, misc_kernel] {
        let (a, b) = (lower(&make(), &V6E).unwrap(), lower(&make(), &V6E).unwrap());
        assert_eq!(a.module, b.module);
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(a.body, b.body);
        assert_eq!(a.call_json, b.call_json);
    }
}

#[test]
fn module_shape_follows_pallas() {
    let l = lower(&dma_prefetch_kernel(), &V6E).unwrap();
    let m = &l.module;
    // ANY operand: `{}` and no transform_0; scalar prefetch counted; transforms take it.
    assert!(m.contains("window_params = [{}, {transform_indices = @transform_1, window_bounds = array<i64: 16, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 16, 128>}]"), "{m}");
    assert!(m.contains("scalar_prefetch = 1 : i64, scratch_operands = 2 : i64, tpu.core_type = #tpu.core_type<tc>"), "{m}");
    assert!(m.contains("func.func @transform_1(%arg0: i32, %arg1: memref<4xi32, #tpu.memory_space<smem>>) -> (i32, i32)"), "{m}");
    assert!(!m.contains("@transform_0"), "{m}");
    assert!(m.contains("memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>"), "{m}");
    assert!(m.contains("\"tpu.enqueue_dma\""), "{m}");
    assert!(m.contains("\"tpu.wait_dma2\""), "{m}");
    assert!(m.contains("\"tpu.memref_squeeze\""), "{m}");
    assert!(l.body.starts_with("module attributes {stable_mosaic.version = 15 : i64}"), "{}", l.body);
    assert_eq!(
        l.call_json,
        r#"{"inputs":["i32[4]","f32[8,16,128]","f32[64,128]"],"outputs":["f32[64,128]"],"vmem_limit_bytes":null,"input_output_aliases":[],"name":"dma_prefetch_kernel"}"#
    );
}

#[test]
fn mlir_failures_carry_diagnostics() {
    // A kernel named like one of its index-map functions: our verifier has no opinion,
    // MLIR's symbol table does.
    let mut k = matmul_kernel();
    k.name = "transform_1".into();
    let err = lower(&k, &V6E).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LowerError::Module { .. }), "{text}");
    assert!(text.contains("redefinition of symbol named 'transform_1'"), "{text}");
    assert!(text.contains("MLIR diagnostics"), "{text}");
    assert!(text.contains("lowering/tests/common/mod.rs"), "no source location in: {text}");
    assert!(!err.diagnostics().is_empty());
}

#[test]
fn rule_errors_name_the_op_and_its_source_line() {
    let mut b = K::new("bad_constant");
    b.grid(&[(1, palladium_dsl::spec::Semantics::Parallel)]);
    let o = b.operand("o", palladium_dsl::spec::OperandRole::Output, DType::I32, &[8, 128], palladium_dsl::ir::MemorySpace::Vmem, Some(vec![palladium_dsl::spec::BlockDim::Blocked(8), palladium_dsl::spec::BlockDim::Blocked(128)]));
    b.index_map(0, |b, m, g, _| {
        let z = b.i32(m, 0);
        vec![g[0], z]
    });
    let e = b.entry();
    let big = b.c(e, Literal::Int(1 << 40), Type::Vector(shape(&[8, 128]), DType::I32));
    b.op0(e, OpData::Store { dst: o, index: full(&[8, 128]), value: big, mask: None });
    let err = lower(&b.k, &V6E).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LowerError::Op(_)), "{text}");
    assert!(text.contains("const"), "{text}");
    assert!(text.contains("does not fit in 32 bits"), "{text}");
    assert!(text.contains("lowering/tests/lowering.rs:"), "{text}");
}

#[test]
fn verifier_errors_come_first() {
    let mut k = matmul_kernel();
    k.call.grid[0].extent = 0;
    let err = lower(&k, &V6E).unwrap_err();
    assert!(matches!(err, LowerError::Verify { .. }), "{err}");
}

#[test]
fn snapshots() {
    insta::with_settings!({ snapshot_path => "../../snapshots/mosaic", prepend_module_to_snapshot => false, omit_expression => true }, {
        for (name, make) in [("matmul", matmul_kernel as fn() -> _), ("dma_prefetch", dma_prefetch_kernel), ("rmsnorm", rmsnorm_kernel), ("misc", misc_kernel)] {
            let l = lower(&make(), &V6E).unwrap();
            insta::assert_snapshot!(format!("{name}.module"), l.module);
            insta::assert_snapshot!(format!("{name}.body"), l.body);
        }
    });
}
