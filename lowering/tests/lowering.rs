//! Lowering without the oracle: determinism, error reporting, snapshots.

use crate::common;

use common::*;
use palladium_dsl::prelude::*;
use palladium_lowering::{LowerError, LowerOptions, lower};

const V6E: LowerOptions = LowerOptions { chip: Chip::V6e };

#[test]
fn lowering_is_deterministic() {
    for ((name, a), (_, b)) in all_kernels().iter().zip(all_kernels().iter()) {
        let (a, b) = (lower(a, &V6E).unwrap_or_else(|e| panic!("{e}")), lower(b, &V6E).unwrap());
        assert_eq!(a.module, b.module, "{name}");
        assert_eq!(a.canonical, b.canonical, "{name}");
        assert_eq!(a.body, b.body, "{name}");
        assert_eq!(a.call_json, b.call_json, "{name}");
    }
}

#[test]
fn module_shape_follows_pallas() {
    // gather_rows: scalar prefetch (ids), an ANY input (table), a squeezed output block,
    // a VMEM scratch and a DMA semaphore array, double-buffered manual DMAs.
    let l = lower(&library_kernel("gather_rows"), &V6E).unwrap();
    assert!(
        l.module.contains("loc(\"kernels/src/gather.rs\":"),
        "ops carry their Rust lines: {}",
        l.module
    );
    let m = &without_locations(&l.module);
    // ANY operand: `{}` and no transform_0; scalar prefetch counted; transforms take it.
    assert!(m.contains("window_params = [{}, {transform_indices = @transform_1, window_bounds = array<i64: 1, 16, 256>}]"), "{m}");
    assert!(m.contains("scalar_prefetch = 1 : i64, scratch_operands = 2 : i64, tpu.core_type = #tpu.core_type<tc>"), "{m}");
    assert!(m.contains("func.func @transform_1(%arg0: i32, %arg1: memref<8xi32, #tpu.memory_space<smem>>) -> (i32, i32, i32)"), "{m}");
    assert!(!m.contains("@transform_0"), "{m}");
    assert!(m.contains("memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>"), "{m}");
    assert!(m.contains("\"tpu.enqueue_dma\""), "{m}");
    assert!(m.contains("\"tpu.wait_dma2\""), "{m}");
    assert!(m.contains("\"tpu.memref_squeeze\""), "{m}");
    assert!(
        without_locations(&l.body)
            .starts_with("module attributes {stable_mosaic.version = 15 : i64}"),
        "{}",
        l.body
    );
    assert_eq!(
        l.call_json,
        r#"{"inputs":["i32[8]","bf16[64,16,256]"],"outputs":["bf16[8,16,256]"],"vmem_limit_bytes":null,"input_output_aliases":[],"name":"gather_rows"}"#
    );
}

#[test]
fn mlir_failures_carry_diagnostics() {
    // A kernel named like one of its index-map functions: our verifier has no opinion,
    // MLIR's symbol table does.
    let mut k = library_kernel("matmul");
    k.name = "transform_1".into();
    let err = lower(&k, &V6E).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LowerError::Module { .. }), "{text}");
    assert!(text.contains("redefinition of symbol named 'transform_1'"), "{text}");
    assert!(text.contains("MLIR diagnostics"), "{text}");
    assert!(text.contains("kernels/src/linalg.rs"), "no source location in: {text}");
    assert!(!err.diagnostics().is_empty());
}

/// An i32 constant that does not fit 32 bits: the typing rules accept it, the constant's
/// lowering rule does not.
#[kernel(grid = (1,), semantics = (parallel,))]
fn bad_constant(#[output(i32[8, 128], block = [8, 128], map = |i| (i, 0))] o: Ref) {
    o[..] = full([8, 128], (1u64 << 40) as f64, i32);
}

#[test]
fn rule_errors_name_the_op_and_its_source_line() {
    let err = lower(&bad_constant::build(&Default::default()).unwrap(), &V6E).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LowerError::Op(_)), "{text}");
    assert!(text.contains("const"), "{text}");
    assert!(text.contains("does not fit in 32 bits"), "{text}");
    assert!(text.contains("lowering/tests/lowering.rs:"), "{text}");
}

#[test]
fn verifier_errors_come_first() {
    let mut k = library_kernel("matmul");
    k.call.grid[0].extent = 0;
    let err = lower(&k, &V6E).unwrap_err();
    assert!(matches!(err, LowerError::Verify { .. }), "{err}");
}

/// `{name}.module` and `{name}.body` for every library kernel and every extra test kernel,
/// lowered for v6e (after our verifier: `lower` runs it).
#[test]
fn snapshots() {
    insta::with_settings!({ snapshot_path => "../../snapshots/mosaic", prepend_module_to_snapshot => false, omit_expression => true }, {
        for (name, k) in all_kernels() {
            let l = lower(&k, &V6E).unwrap_or_else(|e| panic!("{name}: {e}"));
            insta::assert_snapshot!(format!("{name}.module"), l.module);
            insta::assert_snapshot!(format!("{name}.body"), l.body);
        }
    });
}

/// No snapshot outlives its test: every file in `snapshots/mosaic` is a kernel's
/// `.module` or `.body`.
#[test]
fn no_stale_snapshots() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../snapshots/mosaic");
    let mut want: Vec<String> = all_kernels()
        .iter()
        .flat_map(|(n, _)| [format!("{n}.module.snap"), format!("{n}.body.snap")])
        .collect();
    want.sort();
    let mut have: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snap"))
        .collect();
    have.sort();
    let stale: Vec<&String> = have.iter().filter(|n| !want.contains(n)).collect();
    assert!(stale.is_empty(), "snapshots without a test in {}: {stale:?}", dir.display());
}
