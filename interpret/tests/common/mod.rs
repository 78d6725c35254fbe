//! Shared test helpers: lowering library kernels, a seeded PRNG, references, tolerances.
#![allow(dead_code)]
#![allow(clippy::result_large_err)]

use palladium_dsl::spec::Chip;
use palladium_interpret::{ErrorKind, HostArray, InterpError, Module, Program};
use palladium_lowering::{LowerOptions, lower};

/// The seeded generator and references live with the kernels.
pub use palladium_kernels::reference::Rng;

/// Build a library kernel with `settings` and lower it; returns (body, call json).
pub fn library_body(name: &str, settings: &[(&str, &str)]) -> (String, String) {
    let settings: Vec<(String, String)> =
        settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let entry =
        palladium_kernels::REGISTRY.iter().find(|e| e.name == name).expect("kernel in registry");
    let kernel = (entry.build)(&settings).unwrap_or_else(|e| panic!("{name} {settings:?}: {e}"));
    let l = lower(&kernel, &LowerOptions { chip: Chip::V6e })
        .unwrap_or_else(|e| panic!("{name} {settings:?}: {e}"));
    (l.body, l.call_json)
}

/// Lower a DSL kernel.
pub fn body_of(kernel: &palladium_dsl::Kernel) -> String {
    lower(kernel, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}")).body
}

pub fn prepare(body: &str) -> Program {
    Module::parse(body)
        .unwrap_or_else(|e| panic!("{e}"))
        .prepare()
        .unwrap_or_else(|e| panic!("{e}"))
}

pub fn run(body: &str, inputs: &[HostArray]) -> Result<Vec<HostArray>, InterpError> {
    prepare(body).run(inputs)
}

/// Max relative error `|a - b| / max(|b|, floor)` over all elements.
pub fn max_rel_err(got: &[f32], want: &[f32], floor: f32) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| if g.is_nan() { f32::INFINITY } else { (g - w).abs() / w.abs().max(floor) })
        .fold(0.0, f32::max)
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
    palladium_kernels::reference::matmul(x, y, m, k, n)
}
