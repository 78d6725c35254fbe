//! The execution path (client, buffers, execute, several outputs, donation, errors) on XLA's
//! CPU PJRT plugin (`lammps-jax-pjrt-cpu`, installed into the TPU venv by setup) with plain
//! StableHLO programs. A TPU runs the same code with libtpu's client.

use palladium_array::{DType, HostArray};
use palladium_runtime::ArrayType;
use palladium_runtime::exec::{Device, cpu_plugin};

fn cpu() -> Device {
    Device::open(&cpu_plugin().unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"))
}

fn ty(s: &str) -> ArrayType {
    s.parse().unwrap()
}

#[test]
fn several_outputs_come_back() {
    let d = cpu();
    assert_eq!(d.platform().unwrap(), "cpu");
    let program = "module @two {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %s = stablehlo.add %a, %b : tensor<2x3xf32>
    %p = stablehlo.multiply %a, %b : tensor<2x3xf32>
    return %s, %p : tensor<2x3xf32>, tensor<2x3xf32>
  }
}";
    let loaded = d
        .compile(program, &[ty("f32[2,3]"), ty("f32[2,3]")], &[ty("f32[2,3]"), ty("f32[2,3]")])
        .unwrap();
    let a = HostArray::from_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = HostArray::from_f32(&[2, 3], &[10., 20., 30., 40., 50., 60.]);
    let run = loaded.run(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(run.donated, [false, false], "nothing aliased, nothing donated");
    let out = run.outputs;
    assert_eq!(out[0].to_f32(), [11., 22., 33., 44., 55., 66.]);
    assert_eq!(out[1].to_f32(), [10., 40., 90., 160., 250., 360.]);
    // Runs again with fresh buffers: nothing was consumed on the host.
    assert_eq!(loaded.run(&[a, b]).unwrap().outputs[0].to_f32()[0], 11.);
}

#[test]
fn an_aliased_input_is_donated_to_its_output() {
    // An in-place row update, the input donated to the output (`tf.aliasing_output`), as a
    // KV-cache update's program is.
    let d = cpu();
    let program = "module @update {
  func.func public @main(%cache: tensor<4x2xf32> {tf.aliasing_output = 0 : i32}, %row: tensor<1x2xf32>, %pos: tensor<i32>) -> tensor<4x2xf32> {
    %z = stablehlo.constant dense<0> : tensor<i32>
    %u = stablehlo.dynamic_update_slice %cache, %row, %pos, %z : (tensor<4x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<4x2xf32>
    return %u : tensor<4x2xf32>
  }
}";
    let loaded = d
        .compile(program, &[ty("f32[4,2]"), ty("f32[1,2]"), ty("i32[]")], &[ty("f32[4,2]")])
        .unwrap();
    let cache = HostArray::from_f32(&[4, 2], &[0.; 8]);
    let row = HostArray::from_f32(&[1, 2], &[7., 8.]);
    let pos = HostArray::new(DType::I32, &[], 2i32.to_le_bytes().to_vec()).unwrap();
    let run = loaded.run(&[cache, row, pos]).unwrap();
    assert_eq!(run.outputs[0].to_f32(), [0., 0., 0., 0., 7., 8., 0., 0.]);
    assert_eq!(
        run.donated,
        [true, false, false],
        "the cache is donated to the output, the rest is not"
    );
}

#[test]
fn bf16_buffers_round_trip() {
    let d = cpu();
    let program = "module @bf {
  func.func public @main(%a: tensor<4xbf16>, %b: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xf32>) {
    %s = stablehlo.add %a, %a : tensor<4xbf16>
    %c = stablehlo.convert %a : (tensor<4xbf16>) -> tensor<4xf32>
    %p = stablehlo.add %c, %b : tensor<4xf32>
    return %s, %p : tensor<4xbf16>, tensor<4xf32>
  }
}";
    let loaded =
        d.compile(program, &[ty("bf16[4]"), ty("f32[4]")], &[ty("bf16[4]"), ty("f32[4]")]).unwrap();
    // bf16 1.5, -2, 0.25, 3 (upper halves of their f32 bits).
    let a: Vec<u8> = [1.5f32, -2., 0.25, 3.]
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let out = loaded
        .run(&[
            HostArray::new(DType::Bf16, &[4], a).unwrap(),
            HostArray::from_f32(&[4], &[1., 1., 1., 1.]),
        ])
        .unwrap()
        .outputs;
    let doubled: Vec<f32> = out[0]
        .bytes
        .chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect();
    assert_eq!(doubled, [3., -4., 0.5, 6.]);
    assert_eq!(out[1].to_f32(), [2.5, -1., 1.25, 4.]);
}

#[test]
fn errors_say_what_is_wrong() {
    let d = cpu();
    let e = d
        .compile("module { this is not stablehlo }", &[], &[ty("f32[1]")])
        .err()
        .expect("a bad program is rejected");
    assert!(e.contains("the device rejected the program"), "{e}");
    let program = "module @id {
  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
    return %a : tensor<2xf32>
  }
}";
    let loaded = d.compile(program, &[ty("f32[2]")], &[ty("f32[2]")]).unwrap();
    assert_eq!(loaded.run(&[]).unwrap_err(), "the program takes 1 inputs, not 0");
    let e = loaded.run(&[HostArray::from_f32(&[3], &[1., 2., 3.])]).unwrap_err();
    assert_eq!(e, "input 0 is f32[3], the program takes f32[2]");
    assert!(
        HostArray::new(DType::F32, &[2], vec![0; 7])
            .unwrap_err()
            .contains("f32[2] holds 8 bytes, not 7")
    );
    let e = Device::open(std::path::Path::new("/nonexistent/plugin.so")).err().unwrap();
    assert!(e.contains("/nonexistent/plugin.so"), "{e}");
}

#[test]
fn without_a_tpu_libtpu_has_no_client() {
    // This machine has no TPU: opening libtpu's client fails with a message, whatever the
    // environment (this test binary does not set libtpu's variables itself).
    let e = Device::tpu().err().expect("no TPU here");
    assert!(e.contains("libtpu needs") || e.contains("no TPU attached"), "{e}");
}
