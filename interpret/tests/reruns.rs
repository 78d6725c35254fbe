//! One prepared program run again and again (as `palladium run` does, one run per token):
//! inputs are kept widened from run to run, so nothing a run does may leak into the next.

use palladium_interpret::{HostArray, Module};

/// Doubles rows 0..8 of its input in place (the input array itself, `any` memory space),
/// then copies the whole input to the output.
const DOUBLE_HEAD_IN_PLACE: &str = r#"module attributes {stable_mosaic.version = 15 : i64} {
  "stable_mosaic.func.func"() ({
  ^bb0(%arg0: memref<16x128xf32, #tpu.memory_space<any>>, %arg1: memref<16x128xf32, #tpu.memory_space<any>>):
    %c0 = "stable_mosaic.arith.constant"() {value = 0 : index} : () -> index
    %0 = "stable_mosaic.vector.load"(%arg0, %c0, %c0) : (memref<16x128xf32, #tpu.memory_space<any>>, index, index) -> vector<8x128xf32>
    %1 = "stable_mosaic.arith.addf"(%0, %0) {fastmath = #arith.fastmath<none>} : (vector<8x128xf32>, vector<8x128xf32>) -> vector<8x128xf32>
    "stable_mosaic.tpu.vector_store"(%1, %arg0, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 2, 0>, strides = array<i32>} : (vector<8x128xf32>, memref<16x128xf32, #tpu.memory_space<any>>, index, index) -> ()
    %2 = "stable_mosaic.vector.load"(%arg0, %c0, %c0) : (memref<16x128xf32, #tpu.memory_space<any>>, index, index) -> vector<16x128xf32>
    "stable_mosaic.tpu.vector_store"(%2, %arg1, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 2, 0>, strides = array<i32>} : (vector<16x128xf32>, memref<16x128xf32, #tpu.memory_space<any>>, index, index) -> ()
    "stable_mosaic.func.return"() : () -> ()
  }) {function_type = (memref<16x128xf32, #tpu.memory_space<any>>, memref<16x128xf32, #tpu.memory_space<any>>) -> (), sym_name = "double_head_in_place", tpu.core_type = #tpu.core_type<tc>} : () -> ()
}
"#;

fn want(x: &[f32]) -> Vec<f32> {
    x.iter().enumerate().map(|(k, v)| if k < 8 * 128 { v + v } else { *v }).collect()
}

#[test]
fn a_kernel_writing_its_input_does_not_change_the_next_run() {
    let program = Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (0..16 * 128).map(|k| k as f32 * 0.25 - 100.0).collect();
    let input = HostArray::from_f32(&[16, 128], &x);
    for run in 0..3 {
        let out = program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out[0].to_f32(), want(&x), "run {run}");
    }
}

#[test]
fn a_changed_input_is_read_afresh() {
    let program = Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let mut x: Vec<f32> = (0..16 * 128).map(|k| (k % 7) as f32).collect();
    for changed in [0, 16 * 128 - 1, 8 * 128] {
        x[changed] += 1.5;
        let out = program.run(&[HostArray::from_f32(&[16, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out[0].to_f32(), want(&x), "after changing element {changed}");
    }
    // Same values, another type: a bf16 array of the same bytes is not the f32 one.
    let err = program.run(&[HostArray::bf16_from_f32(&[16, 128], &x)]).unwrap_err();
    assert!(err.to_string().contains("bf16"), "{err}");
}

#[test]
fn an_array_changed_in_place_between_runs_is_read_afresh() {
    // The program keeps a clone of the input's shared bytes and passes an input holding the
    // same storage without comparing it; changing the caller's array copies the shared bytes
    // first (`Arc::make_mut`), so the next run sees other storage and reads it again.
    let program = Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let mut x: Vec<f32> = (0..16 * 128).map(|k| (k % 5) as f32).collect();
    let mut input = HostArray::from_f32(&[16, 128], &x);
    let out = program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].to_f32(), want(&x));
    for changed in [3, 16 * 128 - 1] {
        x[changed] = -2.0;
        std::sync::Arc::make_mut(&mut input.bytes)[4 * changed..4 * changed + 4].copy_from_slice(&(-2f32).to_le_bytes());
        let out = program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out[0].to_f32(), want(&x), "after changing element {changed} in place");
    }
}

/// Scratch `[2, 256, 128]` f32 (large enough to be poisoned lazily, chunk by chunk along dim
/// 0): when `flag[0, 0] > 0`, stores the flag row into scratch rows `[1, 0..8]`; always
/// returns scratch `[0, 0..8]` (never written), `[1, 0..8]` and `[1, 8..16]` (never written).
const PARTIAL_SCRATCH: &str = r#"module attributes {stable_mosaic.version = 15 : i64} {
  "stable_mosaic.func.func"() ({
  ^bb0(%arg0: memref<1x128xf32, #tpu.memory_space<any>>, %arg1: memref<3x8x128xf32, #tpu.memory_space<any>>, %arg2: memref<2x256x128xf32, #tpu.memory_space<vmem>>):
    %c0 = "stable_mosaic.arith.constant"() {value = 0 : index} : () -> index
    %c1 = "stable_mosaic.arith.constant"() {value = 1 : index} : () -> index
    %c2 = "stable_mosaic.arith.constant"() {value = 2 : index} : () -> index
    %c8 = "stable_mosaic.arith.constant"() {value = 8 : index} : () -> index
    %zero = "stable_mosaic.arith.constant"() {value = 0.000000e+00 : f32} : () -> f32
    %flag = "stable_mosaic.memref.load"(%arg0, %c0, %c0) : (memref<1x128xf32, #tpu.memory_space<any>>, index, index) -> f32
    %set = "stable_mosaic.arith.cmpf"(%flag, %zero) {fastmath = #arith.fastmath<none>, predicate = 2 : i64} : (f32, f32) -> i1
    "stable_mosaic.scf.if"(%set) ({
      %row = "stable_mosaic.vector.load"(%arg0, %c0, %c0) : (memref<1x128xf32, #tpu.memory_space<any>>, index, index) -> vector<1x128xf32>
      %rows = "stable_mosaic.vector.broadcast"(%row) : (vector<1x128xf32>) -> vector<1x8x128xf32>
      "stable_mosaic.tpu.vector_store"(%rows, %arg2, %c1, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> ()
      "stable_mosaic.scf.yield"() : () -> ()
    }, {
      "stable_mosaic.scf.yield"() : () -> ()
    }) : (i1) -> ()
    %r0 = "stable_mosaic.vector.load"(%arg2, %c0, %c0, %c0) : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> vector<1x8x128xf32>
    %r1 = "stable_mosaic.vector.load"(%arg2, %c1, %c0, %c0) : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> vector<1x8x128xf32>
    %r2 = "stable_mosaic.vector.load"(%arg2, %c1, %c8, %c0) : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> vector<1x8x128xf32>
    "stable_mosaic.tpu.vector_store"(%r0, %arg1, %c0, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<3x8x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.tpu.vector_store"(%r1, %arg1, %c1, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<3x8x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.tpu.vector_store"(%r2, %arg1, %c2, %c0, %c0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<3x8x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.func.return"() : () -> ()
  }) {function_type = (memref<1x128xf32, #tpu.memory_space<any>>, memref<3x8x128xf32, #tpu.memory_space<any>>, memref<2x256x128xf32, #tpu.memory_space<vmem>>) -> (), scratch_operands = 1 : i64, sym_name = "partial_scratch", tpu.core_type = #tpu.core_type<tc>} : () -> ()
}
"#;

#[test]
fn unwritten_scratch_reads_as_poison_run_after_run() {
    // Fresh scratch is poison where nothing wrote it, also in a chunk written in part, and
    // also when its storage is recycled from a run that wrote there.
    let program = Module::parse(PARTIAL_SCRATCH).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    for (run, flag) in [7.0f32, 0.0, 3.0, -1.0].into_iter().enumerate() {
        let out = program.run(&[HostArray::from_f32(&[1, 128], &[flag; 128])]).unwrap_or_else(|e| panic!("{e}"))[0].to_f32();
        let rows: Vec<&[f32]> = out.chunks(8 * 128).collect();
        assert!(rows[0].iter().all(|x| x.is_nan()), "run {run}: scratch[0] was never written");
        if flag > 0.0 {
            assert!(rows[1].iter().all(|&x| x == flag), "run {run}: scratch[1, 0..8] holds the flag row");
        } else {
            assert!(rows[1].iter().all(|x| x.is_nan()), "run {run}: scratch[1, 0..8] not written this run");
        }
        assert!(rows[2].iter().all(|x| x.is_nan()), "run {run}: scratch[1, 8..16] was never written");
    }
}
