//! Test helpers: the kernels under test (the library's, plus `#[kernel]`s for the ops the
//! library does not use), and JAX's side of the comparisons (`scripts/jax_reference.py`).
#![allow(dead_code)]

use palladium_dsl::Kernel;
use std::path::{Path, PathBuf};
use std::process::Command;

// --- the kernels of the tests ------------------------------------------------------------------

/// Every kernel the lowering tests cover, by name: each kernel of the library
/// (`palladium_kernels::REGISTRY`, at its defaults), then [`extra_kernels`].
pub fn all_kernels() -> Vec<(String, Kernel)> {
    let mut all: Vec<(String, Kernel)> = palladium_kernels::REGISTRY
        .iter()
        .map(|e| {
            (
                e.name.to_string(),
                (e.build)(&[]).unwrap_or_else(|err| panic!("library kernel {}: {err}", e.name)),
            )
        })
        .collect();
    all.extend(extra_kernels());
    all
}

/// A library kernel at its defaults.
pub fn library_kernel(name: &str) -> Kernel {
    palladium_kernels::build(name, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// The op-coverage kernels (`palladium_kernels::coverage`), plus library kernels at
/// non-default settings that change the emitted types or attributes (`Buffered(1)` K/V:
/// `#tpu.pipeline_mode<synchronous>`).
pub fn extra_kernels() -> Vec<(String, Kernel)> {
    let mut all: Vec<(String, Kernel)> = palladium_kernels::coverage::ALL
        .iter()
        .map(|(name, build)| {
            (name.to_string(), build().unwrap_or_else(|e| panic!("coverage kernel {name}: {e}")))
        })
        .collect();
    /// A label, the library kernel and its `--set` settings.
    type Variant = (&'static str, &'static str, &'static [(&'static str, &'static str)]);
    let settings: [Variant; 8] = [
        ("matmul_f32_out", "matmul", &[("out_dtype", "f32")]),
        ("flash_attention_sync_kv", "flash_attention", &[("kv_buffers", "1")]),
        // The other weight formats (the quantized projections default to int8 per channel, the experts to int4).
        ("gemv_quantized_int4", "gemv_quantized", &[("wdtype", "i4"), ("group", "128")]),
        ("gemv_quantized_fp8", "gemv_quantized", &[("wdtype", "f8e4m3fn"), ("group", "128")]),
        (
            "matmul_quantized_int4",
            "matmul_quantized",
            &[("wdtype", "i4"), ("group", "128"), ("bk", "1024")],
        ),
        ("expert_ffn_quantized_fp8", "expert_ffn_quantized", &[("wdtype", "f8e4m3fn")]),
        (
            "grouped_matmul_quantized_int8",
            "grouped_matmul_quantized",
            &[("wdtype", "i8"), ("group", "2048")],
        ),
        // A visit axis fixed by the routing (issue 34's decode: 64 rows, 53 experts hit).
        (
            "grouped_matmul_53_visits",
            "grouped_matmul",
            &[("m", "64"), ("block_m", "64"), ("block_k", "1024"), ("num_tiles", "53")],
        ),
    ];
    for (label, kernel, sets) in settings {
        let sets: Vec<(String, String)> =
            sets.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        all.push((
            label.to_string(),
            palladium_kernels::build(kernel, &sets).unwrap_or_else(|e| panic!("{label}: {e}")),
        ));
    }
    all
}

// --- JAX's side of the comparisons -------------------------------------------------------------

/// The TPU venv's Python: `$PALLADIUM_TPU_VENV/bin/python`, default `~/.cache/palladium/venv-tpu`
/// (made by `scripts/setup.sh`).
pub fn venv_python() -> PathBuf {
    let venv = palladium_runtime::libtpu::venv().unwrap_or_else(|e| panic!("{e}"));
    let py = venv.join("bin/python");
    assert!(
        py.is_file(),
        "the TPU venv is missing: expected {} (run scripts/setup.sh, or set PALLADIUM_TPU_VENV)",
        py.display()
    );
    py
}

/// `scripts/jax_reference.py ARGS…` (JAX's own serializer and Pallas kernels) in `dir`: its
/// JSON answer, which must say `ok`.
pub fn jax_reference(dir: &Path, args: &[&str]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/jax_reference.py");
    let out = Command::new(venv_python())
        .arg(&script)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("cannot run scripts/jax_reference.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
            panic!(
                "jax_reference.py {args:?} printed no JSON:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(json["ok"], true, "jax_reference.py {args:?}: {}", json["error"]);
    json
}

/// A fresh scratch directory under the target dir, this process's own (test binaries, and
/// tests under `cargo nextest`, run side by side).
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("cannot create a scratch dir");
    d
}

/// `text` without its source locations: every ` loc(...)` (and ` loc[...]`, a resolved alias
/// in `libtpu.rs`) removed, and the `#loc… = loc(…)` alias lines dropped.
pub fn without_locations(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().filter(|l| !(l.starts_with("#loc") && l.contains(" = loc("))) {
        let mut rest = line;
        while let Some(at) = rest.find(" loc(").into_iter().chain(rest.find(" loc[")).min() {
            out.push_str(&rest[..at]);
            let mut depth = 0;
            let end = rest[at + 4..].char_indices().find(|&(_, c)| {
                depth += match c {
                    '(' | '[' => 1,
                    ')' | ']' => -1,
                    _ => 0,
                };
                depth == 0
            });
            rest = end.map_or("", |(i, _)| &rest[at + 5 + i..]);
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}
