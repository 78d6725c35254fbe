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
    let program =
        Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (0..16 * 128).map(|k| k as f32 * 0.25 - 100.0).collect();
    let input = HostArray::from_f32(&[16, 128], &x);
    for run in 0..3 {
        let out = program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out[0].to_f32(), want(&x), "run {run}");
    }
}

#[test]
fn a_changed_input_is_read_afresh() {
    let program =
        Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let mut x: Vec<f32> = (0..16 * 128).map(|k| (k % 7) as f32).collect();
    for changed in [0, 16 * 128 - 1, 8 * 128] {
        x[changed] += 1.5;
        let out =
            program.run(&[HostArray::from_f32(&[16, 128], &x)]).unwrap_or_else(|e| panic!("{e}"));
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
    let program =
        Module::parse(DOUBLE_HEAD_IN_PLACE).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let mut x: Vec<f32> = (0..16 * 128).map(|k| (k % 5) as f32).collect();
    let mut input = HostArray::from_f32(&[16, 128], &x);
    let out = program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].to_f32(), want(&x));
    for changed in [3, 16 * 128 - 1] {
        x[changed] = -2.0;
        std::sync::Arc::make_mut(&mut input.bytes)[4 * changed..4 * changed + 4]
            .copy_from_slice(&(-2f32).to_le_bytes());
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
    let program =
        Module::parse(PARTIAL_SCRATCH).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    for (run, flag) in [7.0f32, 0.0, 3.0, -1.0].into_iter().enumerate() {
        let out = program
            .run(&[HostArray::from_f32(&[1, 128], &[flag; 128])])
            .unwrap_or_else(|e| panic!("{e}"))[0]
            .to_f32();
        let rows: Vec<&[f32]> = out.chunks(8 * 128).collect();
        assert!(rows[0].iter().all(|x| x.is_nan()), "run {run}: scratch[0] was never written");
        if flag > 0.0 {
            assert!(
                rows[1].iter().all(|&x| x == flag),
                "run {run}: scratch[1, 0..8] holds the flag row"
            );
        } else {
            assert!(
                rows[1].iter().all(|x| x.is_nan()),
                "run {run}: scratch[1, 0..8] not written this run"
            );
        }
        assert!(
            rows[2].iter().all(|x| x.is_nan()),
            "run {run}: scratch[1, 8..16] was never written"
        );
    }
}

/// Input `[2, 256, 128]` f32 (`any`), two DMAs of its slots into a VMEM ring of the same
/// shape (slots large enough to be lent rather than copied): after the first DMA the kernel
/// doubles rows 0..8 of input slot 0 (the source changes after the copy); after the second it
/// stores `-1` into rows 0..8 of ring slot 1 (a partial write into a lent slot). Returns ring
/// slot 0, ring slot 1 and input slot 0.
const LENT_SLOTS: &str = r#"module attributes {stable_mosaic.version = 15 : i64} {
  "stable_mosaic.func.func"() ({
  ^bb0(%arg0: memref<2x256x128xf32, #tpu.memory_space<any>>, %arg1: memref<3x256x128xf32, #tpu.memory_space<any>>, %arg2: memref<2x256x128xf32, #tpu.memory_space<vmem>>, %arg3: memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>):
    %c0 = "stable_mosaic.arith.constant"() {value = 0 : i32} : () -> i32
    %c1 = "stable_mosaic.arith.constant"() {value = 1 : i32} : () -> i32
    %i0 = "stable_mosaic.arith.constant"() {value = 0 : index} : () -> index
    %i1 = "stable_mosaic.arith.constant"() {value = 1 : index} : () -> index
    %i2 = "stable_mosaic.arith.constant"() {value = 2 : index} : () -> index
    %s0 = "stable_mosaic.tpu.memref_slice"(%arg0, %c0, %c0, %c0) {operandSegmentSizes = array<i32: 1, 3, 0>} : (memref<2x256x128xf32, #tpu.memory_space<any>>, i32, i32, i32) -> memref<1x256x128xf32, #tpu.memory_space<any>>
    %d0 = "stable_mosaic.tpu.memref_slice"(%arg2, %c0, %c0, %c0) {operandSegmentSizes = array<i32: 1, 3, 0>} : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, i32, i32, i32) -> memref<1x256x128xf32, #tpu.memory_space<vmem>>
    "stable_mosaic.tpu.enqueue_dma"(%s0, %d0, %arg3) {operandSegmentSizes = array<i32: 1, 0, 1, 1, 0, 0, 0>, priority = 0 : i32, strict_ordering = false} : (memref<1x256x128xf32, #tpu.memory_space<any>>, memref<1x256x128xf32, #tpu.memory_space<vmem>>, memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>) -> ()
    "stable_mosaic.tpu.wait_dma2"(%arg3, %s0, %d0) {operandSegmentSizes = array<i32: 1, 1, 1, 0, 0>, strict_ordering = false} : (memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>, memref<1x256x128xf32, #tpu.memory_space<any>>, memref<1x256x128xf32, #tpu.memory_space<vmem>>) -> ()
    %s1 = "stable_mosaic.tpu.memref_slice"(%arg0, %c1, %c0, %c0) {operandSegmentSizes = array<i32: 1, 3, 0>} : (memref<2x256x128xf32, #tpu.memory_space<any>>, i32, i32, i32) -> memref<1x256x128xf32, #tpu.memory_space<any>>
    %d1 = "stable_mosaic.tpu.memref_slice"(%arg2, %c1, %c0, %c0) {operandSegmentSizes = array<i32: 1, 3, 0>} : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, i32, i32, i32) -> memref<1x256x128xf32, #tpu.memory_space<vmem>>
    "stable_mosaic.tpu.enqueue_dma"(%s1, %d1, %arg3) {operandSegmentSizes = array<i32: 1, 0, 1, 1, 0, 0, 0>, priority = 0 : i32, strict_ordering = false} : (memref<1x256x128xf32, #tpu.memory_space<any>>, memref<1x256x128xf32, #tpu.memory_space<vmem>>, memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>) -> ()
    "stable_mosaic.tpu.wait_dma2"(%arg3, %s1, %d1) {operandSegmentSizes = array<i32: 1, 1, 1, 0, 0>, strict_ordering = false} : (memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>, memref<1x256x128xf32, #tpu.memory_space<any>>, memref<1x256x128xf32, #tpu.memory_space<vmem>>) -> ()
    %h = "stable_mosaic.vector.load"(%arg0, %i0, %i0, %i0) : (memref<2x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> vector<1x8x128xf32>
    %h2 = "stable_mosaic.arith.addf"(%h, %h) {fastmath = #arith.fastmath<none>} : (vector<1x8x128xf32>, vector<1x8x128xf32>) -> vector<1x8x128xf32>
    "stable_mosaic.tpu.vector_store"(%h2, %arg0, %i0, %i0, %i0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<2x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    %m = "stable_mosaic.arith.constant"() {value = dense<-1.000000e+00> : vector<1x8x128xf32>} : () -> vector<1x8x128xf32>
    "stable_mosaic.tpu.vector_store"(%m, %arg2, %i1, %i0, %i0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x8x128xf32>, memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> ()
    %r0 = "stable_mosaic.vector.load"(%arg2, %i0, %i0, %i0) : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> vector<1x256x128xf32>
    %r1 = "stable_mosaic.vector.load"(%arg2, %i1, %i0, %i0) : (memref<2x256x128xf32, #tpu.memory_space<vmem>>, index, index, index) -> vector<1x256x128xf32>
    %x0 = "stable_mosaic.vector.load"(%arg0, %i0, %i0, %i0) : (memref<2x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> vector<1x256x128xf32>
    "stable_mosaic.tpu.vector_store"(%r0, %arg1, %i0, %i0, %i0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x256x128xf32>, memref<3x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.tpu.vector_store"(%r1, %arg1, %i1, %i0, %i0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x256x128xf32>, memref<3x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.tpu.vector_store"(%x0, %arg1, %i2, %i0, %i0) {add = false, operandSegmentSizes = array<i32: 1, 1, 3, 0>, strides = array<i32>} : (vector<1x256x128xf32>, memref<3x256x128xf32, #tpu.memory_space<any>>, index, index, index) -> ()
    "stable_mosaic.func.return"() : () -> ()
  }) {function_type = (memref<2x256x128xf32, #tpu.memory_space<any>>, memref<3x256x128xf32, #tpu.memory_space<any>>, memref<2x256x128xf32, #tpu.memory_space<vmem>>, memref<!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>) -> (), scratch_operands = 2 : i64, sym_name = "lent_slots", tpu.core_type = #tpu.core_type<tc>} : () -> ()
}
"#;

#[test]
fn a_slot_a_dma_filled_from_a_kept_input_holds_the_values_of_the_copy() {
    // The ring's slots borrow the kept input's storage instead of a copy: the input changed
    // after the DMA, or the slot changed in part, must not show through; run after run.
    let program = Module::parse(LENT_SLOTS).unwrap().prepare().unwrap_or_else(|e| panic!("{e}"));
    let slot = 256 * 128;
    let x: Vec<f32> = (0..2 * slot).map(|k| (k % 1000) as f32 * 0.5 - 7.0).collect();
    let input = HostArray::from_f32(&[2, 256, 128], &x);
    for run in 0..3 {
        let out =
            program.run(std::slice::from_ref(&input)).unwrap_or_else(|e| panic!("{e}"))[0].to_f32();
        assert_eq!(
            out[..slot],
            x[..slot],
            "run {run}: ring slot 0 holds input slot 0 as the DMA copied it"
        );
        let slot1: Vec<f32> =
            (0..slot).map(|k| if k < 8 * 128 { -1.0 } else { x[slot + k] }).collect();
        assert_eq!(
            out[slot..2 * slot],
            slot1[..],
            "run {run}: ring slot 1 is input slot 1 with rows 0..8 stored over"
        );
        let changed: Vec<f32> =
            (0..slot).map(|k| if k < 8 * 128 { 2.0 * x[k] } else { x[k] }).collect();
        assert_eq!(out[2 * slot..], changed[..], "run {run}: the kernel's write to its input");
    }
}
