//! The example kernel from outside the repository's crates, through the entry crate alone:
//! interpreted against its reference, its IR snapshotted (`tests/snapshots/`), emitted to a
//! folder and compiled by libtpu for v6e (the TPU venv's libtpu, as every libtpu test here:
//! `scripts/setup.sh` installs it, and its absence fails the test, naming where it looked).

use palladium::dsl::ir::{PrintOptions, print_kernel};
use palladium::lowering::{LowerOptions, lower};
use palladium::{Chip, Error, HostArray};
use palladium_examples::{softmax, softmax_inputs, softmax_reference};
use std::path::PathBuf;

fn build(p: &softmax::Params) -> palladium::Kernel {
    softmax::build(p).unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh folder under the target dir.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn softmax_interprets_within_tolerance_of_its_reference() {
    let small = softmax::Params { rows: 64, cols: 256, block_rows: 16 };
    for p in [softmax::Params::default(), small] {
        let kernel = build(&p);
        let inputs = softmax_inputs(&p, 7);
        let want = [softmax_reference(&p, &inputs[0])];
        let result = palladium::interpret_against(&kernel, Chip::V6e, &inputs, &want, None)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{result}");
        assert!(result.passed(), "{p:?}:\n{result}");
        assert_eq!(result.outputs.len(), 1);
        assert_eq!(result.outputs[0].ty, format!("bf16[{},{}]", p.rows, p.cols));
    }
}

/// The comparison can fail: a reference that is not the kernel's (the input itself) is out
/// of tolerance, and one of another shape is an error naming the output.
#[test]
fn a_wrong_reference_fails_the_comparison() {
    let p = softmax::Params::default();
    let kernel = build(&p);
    let inputs = softmax_inputs(&p, 1);
    let result = palladium::interpret_against(&kernel, Chip::V6e, &inputs, &inputs, None).unwrap();
    assert!(!result.passed(), "{result}");
    assert!(result.to_string().ends_with("FAIL"), "{result}");
    let small = softmax::Params { rows: 64, ..softmax::Params::default() };
    let other = [softmax_reference(&small, &softmax_inputs(&small, 1)[0])];
    let err = palladium::interpret_against(&kernel, Chip::V6e, &inputs, &other, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`softmax`: output o: the run returned bf16[256, 512], the reference bf16[64,512]"
    );
    let err =
        palladium::interpret_against(&kernel, Chip::V6e, &inputs, &other, Some(-1.0)).unwrap_err();
    assert_eq!(err.to_string(), "tolerance -1 must be finite and non-negative");
}

/// Inputs that do not fit the kernel are the interpreter's error, naming the kernel.
#[test]
fn inputs_of_the_wrong_shape_are_refused() {
    let kernel = build(&softmax::Params::default());
    let wrong = [HostArray::bf16_from_f32(&[8, 512], &[0.0; 8 * 512])];
    let err = palladium::interpret(&kernel, Chip::V6e, &wrong).unwrap_err().to_string();
    assert!(err.starts_with("interpreter error in `softmax`: "), "{err}");
}

#[test]
fn softmax_ir_snapshot() {
    let kernel = build(&softmax::Params::default());
    insta::assert_snapshot!("softmax.ir", print_kernel(&kernel, PrintOptions::default()));
    let lowered = lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap();
    insta::assert_snapshot!("softmax.mosaic", lowered.module);
}

/// Through `palladium::kernel` every traced op keeps the kernel line that traced it: the
/// output's store is located at `o[..] = ...`, not at the `#[kernel]` line (which locates
/// the function itself), so interpreter and libtpu errors name the statement.
#[test]
fn ops_carry_the_lines_that_traced_them() {
    let kernel = build(&softmax::Params::default());
    let module = lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap().module;
    let location = |alias: &str| {
        let line = module.lines().find(|l| l.starts_with(&format!("{alias} = loc(")));
        line.unwrap_or_else(|| panic!("no {alias} in\n{module}")).to_string()
    };
    let store = module.lines().find(|l| l.contains("tpu.vector_store")).expect("a store");
    let alias = store.rsplit("loc(").next().unwrap().trim_end_matches(')');
    assert_ne!(alias, "#loc", "the store is located at the #[kernel] line: {store}");
    let kernel_line = location("#loc");
    let store_line = location(alias);
    assert!(store_line.contains("\"examples/src/lib.rs\":"), "{store_line}");
    assert_ne!(store_line.split(':').nth(1), kernel_line.split(':').nth(1));
}

#[test]
fn emit_writes_the_three_files_all_or_nothing() {
    let kernel = build(&softmax::Params::default());
    let dir = scratch("emit");
    let written = palladium::emit(&kernel, Chip::V6e, &dir).unwrap();
    let names: Vec<String> =
        written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["softmax.mlir", "softmax.body.mlir", "softmax.call.json"]);
    let lowered = lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("softmax.body.mlir")).unwrap(), lowered.body);
    // A folder where a file goes: refused before anything is written.
    let blocked = scratch("emit-blocked");
    std::fs::create_dir_all(blocked.join("softmax.body.mlir")).unwrap();
    let err = palladium::emit(&kernel, Chip::V6e, &blocked).unwrap_err();
    assert!(matches!(err, Error::Emit { .. }), "{err:?}");
    assert!(err.to_string().starts_with("cannot emit `softmax`: "), "{err}");
    assert!(!blocked.join("softmax.mlir").exists());
}

#[test]
fn softmax_compiles_for_v6e_with_libtpu() {
    let kernel = build(&softmax::Params::default());
    let report = palladium::compile_for(&kernel, Chip::V6e).unwrap_or_else(|e| panic!("{e}"));
    eprint!("{}", report.text());
    assert_eq!(report.topology, "v6e:2x2");
    assert!(report.compiled.code_size_bytes > 0, "{report:?}");
    let cycles = report.compiled.estimated_cycles;
    assert!(cycles.is_some_and(|c| c > 0), "no estimate: {:?}", report.compiled.estimate_note);
}
