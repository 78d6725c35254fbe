//! The model against libtpu's static estimate (deviceless, through PJRT) on single-stream
//! kernels the calibration did not see: the gemv block sweep, the matmul at its library
//! blocks and a longer plain stream. Each must be within 5%.

use palladium_autotune::Libtpu;
use palladium_autotune::floor::stream_kernel;
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_profile::calibration::Calibration;
use palladium_profile::{Inputs, simulate};

fn kernel(name: &str, settings: &[(&str, &str)]) -> Kernel {
    let settings: Vec<(String, String)> = settings.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    palladium_kernels::build(name, &settings).unwrap()
}

#[test]
fn single_stream_kernels_are_within_5_percent_of_libtpu() {
    let chip = Chip::V6e;
    let gemv = |batch: &str, k: &str, n: &str, bk: &str, bn: &str| kernel("gemv", &[("batch", batch), ("k", k), ("n", n), ("block_k", bk), ("block_n", bn)]);
    let cases: Vec<(&str, Kernel)> = vec![
        ("gemv 8x4096 @ 4096x14336, 4096 x 896", gemv("8", "4096", "14336", "4096", "896")),
        ("gemv 8x4096 @ 4096x14336, 4096 x 1792", gemv("8", "4096", "14336", "4096", "1792")),
        ("gemv 8x14336 @ 14336x4096, 14336 x 512", gemv("8", "14336", "4096", "14336", "512")),
        ("gemv 32x4096 @ 4096x14336, 4096 x 1792", gemv("32", "4096", "14336", "4096", "1792")),
        ("gemv 8x4096 @ 4096x6144, 4096 x 1024", gemv("8", "4096", "6144", "4096", "1024")),
        ("gemv 8x4096 @ 4096x14336, 2048 x 896 (k split)", gemv("8", "4096", "14336", "2048", "896")),
        ("matmul 1024x2048x1024, 256x512x256", kernel("matmul", &[])),
        ("matmul 1024x2048x1024, 512x2048x512", kernel("matmul", &[("bm", "512"), ("bk", "2048"), ("bn", "512")])),
        ("HBM stream 128 MiB", stream_kernel(128 << 20).unwrap().0),
    ];
    let refs: Vec<&Kernel> = cases.iter().map(|(_, k)| k).collect();
    let measured = Libtpu::new().unwrap_or_else(|e| panic!("{e}")).with_workers(1).cycles(&refs, chip);
    let c = Calibration::committed();
    let c = c.chip(chip).unwrap();
    let mut bad = Vec::new();
    for ((name, k), libtpu) in cases.iter().zip(measured) {
        let libtpu = libtpu.unwrap_or_else(|e| panic!("{name}: {e}")) as f64;
        let model = simulate(k, chip, c, &Inputs::default()).unwrap().cycles;
        let ratio = model / libtpu;
        eprintln!("{name:<48} libtpu {libtpu:>8.0}  model {model:>8.0}  model/libtpu {ratio:.3}");
        if (ratio - 1.0).abs() > 0.05 {
            bad.push(format!("{name}: {ratio:.3}"));
        }
    }
    assert!(bad.is_empty(), "beyond 5% of libtpu: {bad:?}");
}
