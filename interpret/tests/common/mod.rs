//! Shared test helpers: lowering library kernels, a seeded PRNG, references, tolerances.
#![allow(dead_code)]

#![allow(clippy::result_large_err)]

use half::bf16;
use palladium_dsl::spec::Chip;
use palladium_interpret::{ErrorKind, HostArray, InterpError, Module, Program};
use palladium_lowering::{LowerOptions, lower};

/// `SplitMix64`: small, seeded, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1), never exactly zero.
    pub fn unit(&mut self) -> f32 {
        let x = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if x == 0.0 { 0.5 } else { x }
    }
    /// `n` values rounded to bf16 (as f32).
    pub fn bf16s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| bf16::from_f32(self.unit()).to_f32()).collect()
    }
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
    /// A random permutation of 0..n.
    pub fn permutation(&mut self, n: usize) -> Vec<i32> {
        let mut v: Vec<i32> = (0..n as i32).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// Build a library kernel with `settings` and lower it; returns (body, call json).
pub fn library_body(name: &str, settings: &[(&str, &str)]) -> (String, String) {
    let settings: Vec<(String, String)> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let entry = palladium_kernels::REGISTRY.iter().find(|e| e.name == name).expect("kernel in registry");
    let kernel = (entry.build)(&settings).unwrap_or_else(|e| panic!("{name} {settings:?}: {e}"));
    let l = lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{name} {settings:?}: {e}"));
    (l.body, l.call_json)
}

/// Lower a DSL kernel.
pub fn body_of(kernel: &palladium_dsl::Kernel) -> String {
    lower(kernel, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}")).body
}

pub fn prepare(body: &str) -> Program {
    Module::parse(body).unwrap_or_else(|e| panic!("{e}")).prepare().unwrap_or_else(|e| panic!("{e}"))
}

pub fn run(body: &str, inputs: &[HostArray]) -> Result<Vec<HostArray>, InterpError> {
    prepare(body).run(inputs)
}

/// Max relative error `|a - b| / max(|b|, floor)` over all elements.
pub fn max_rel_err(got: &[f32], want: &[f32], floor: f32) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| if g.is_nan() { f32::INFINITY } else { (g - w).abs() / w.abs().max(floor) }).fold(0.0, f32::max)
}

pub fn assert_close(got: &[f32], want: &[f32], tol: f32, floor: f32, what: &str) {
    let e = max_rel_err(got, want, floor);
    assert!(e < tol, "{what}: max relative error {e} >= {tol}");
}

/// Expect an error of `kind`; returns its text.
pub fn expect_err(r: Result<Vec<HostArray>, InterpError>, kind: ErrorKind) -> String {
    match r {
        Ok(_) => panic!("expected a {kind:?} error, but the kernel ran"),
        Err(e) => {
            let text = e.to_string();
            assert_eq!(e.kind, kind, "wrong error kind: {text}");
            text
        }
    }
}

/// Replace exactly one occurrence of `from` in `body`.
pub fn edit(body: &str, from: &str, to: &str) -> String {
    assert_eq!(body.matches(from).count(), 1, "`{from}` must occur exactly once in:\n{body}");
    body.replacen(from, to, 1)
}

/// Delete the (single) line containing `needle`.
pub fn delete_line(body: &str, needle: &str) -> String {
    let n = body.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(n, 1, "`{needle}` must occur on exactly one line");
    body.lines().filter(|l| !l.contains(needle)).collect::<Vec<_>>().join("\n")
}

/// Reference matmul: bf16 inputs (as f32), f32 accumulation, output rounded to bf16.
pub fn matmul_ref(x: &[f32], y: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for kk in 0..k {
            let a = x[i * k + kk];
            for j in 0..n {
                out[i * n + j] += a * y[kk * n + j];
            }
        }
    }
    out.into_iter().map(|v| bf16::from_f32(v).to_f32()).collect()
}
