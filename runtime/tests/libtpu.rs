//! Deviceless compiles with libtpu through the runtime's workers (needs the TPU venv that
//! `scripts/setup.sh` installs).

use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerOptions, lower};
use palladium_runtime::{CallSpec, CompileError, Compiler, Estimate, Job, wrap};

fn job(kernel: &str, sets: &[(&str, &str)], chip: Chip) -> Job {
    let sets: Vec<(String, String)> =
        sets.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    let k = palladium_kernels::build(kernel, &sets).unwrap_or_else(|e| panic!("{e}"));
    let l = lower(&k, &LowerOptions { chip }).unwrap_or_else(|e| panic!("{e}"));
    let spec = CallSpec::from_json(&l.call_json).unwrap();
    Job { program: wrap(&l.body, &spec).unwrap(), chip, serialize: true }
}

#[test]
fn matmul_compiles_with_jax_pallas_cycles_and_an_abort_rejects_one_kernel() {
    let compiler = Compiler::new(Estimate::Yes).unwrap_or_else(|e| panic!("{e}")).with_workers(2);
    let bad = Job {
        program: "module { this is not stablehlo }".into(),
        chip: Chip::V6e,
        serialize: false,
    };
    // gather_rows's manual DMA from a squeezed row of a 3-D HBM table aborts v6e's profiler.
    let jobs = [
        job("matmul", &[], Chip::V6e),
        job("gather_rows", &[], Chip::V6e),
        bad,
        job("matmul", &[], Chip::V7x),
    ];
    let results = compiler.compile_all(&jobs);
    let matmul = results[0].as_ref().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("matmul v6e: {matmul:?}");
    assert_eq!(matmul.estimated_cycles, Some(46041), "{matmul:?}");
    assert!(
        matmul.code_size_bytes > 0 && matmul.executable.as_ref().is_some_and(|e| !e.is_empty())
    );
    assert_eq!(matmul.hbm.argument_bytes, (1024 * 2048 + 2048 * 1024) * 2);
    assert_eq!(matmul.hbm.output_bytes, 1024 * 1024 * 2);
    match &results[1] {
        Err(CompileError::Aborted(why)) => assert!(why.contains("DMA"), "{why}"),
        other => panic!("gather_rows on v6e: expected the estimator to abort, got {other:?}"),
    }
    match &results[2] {
        Err(CompileError::Rejected(why)) => assert!(!why.is_empty()),
        other => panic!("expected libtpu to reject the program, got {other:?}"),
    }
    eprintln!(
        "matmul v7x: {:?}",
        results[3].as_ref().map(|c| (c.estimated_cycles, &c.estimate_note))
    );
    let fallback = compiler.compile_all_estimated(&jobs[1..2]);
    let gather = fallback[0].as_ref().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(gather.estimated_cycles, None);
    assert!(
        gather.estimate_note.as_deref().is_some_and(|n| n.contains("aborted") && n.contains("DMA")),
        "{gather:?}"
    );
    assert!(gather.code_size_bytes > 0);
}

#[test]
fn libtpu_errors_name_the_rust_line() {
    // A planted fault libtpu refuses: the scale multiply of gather_rows made an integer add
    // of float vectors. The body carries each op's Rust line as `loc(..)`,
    // so libtpu's error names it.
    let k = palladium_kernels::build("gather_rows", &[]).unwrap();
    let l = lower(&k, &LowerOptions { chip: Chip::V5e }).unwrap();
    let planted =
        l.body.replacen("\"stable_mosaic.arith.mulf\"", "\"stable_mosaic.arith.addi\"", 1);
    assert_ne!(planted, l.body);
    let bad = Job {
        program: wrap(&planted, &CallSpec::from_json(&l.call_json).unwrap()).unwrap(),
        chip: Chip::V5e,
        serialize: false,
    };
    let compiler = Compiler::new(Estimate::No).unwrap_or_else(|e| panic!("{e}"));
    let result = compiler.compile_all(&[bad]).remove(0);
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/src/gather.rs"))
            .unwrap();
    let line = source
        .lines()
        .position(|l| !l.trim_start().starts_with("//") && l.contains("* scale"))
        .expect("the scale line")
        + 1;
    match result {
        Err(CompileError::Rejected(why)) => {
            assert!(why.contains(&format!("loc(\"kernels/src/gather.rs\":{line}:")), "{why}")
        }
        other => panic!("expected libtpu to reject the planted addi, got {other:?}"),
    }
}
