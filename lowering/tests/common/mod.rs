//! Test helpers: the kernels under test (the library's, plus `#[kernel]`s for the ops the
//! library does not use) and the TPU oracle.
#![allow(dead_code)]

use palladium_dsl::Kernel;
use palladium_dsl::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

// --- the kernels of the tests ------------------------------------------------------------------

/// Every kernel the lowering tests cover, by name: each kernel of the library
/// (`palladium_kernels::REGISTRY`, at its defaults), then [`extra_kernels`].
pub fn all_kernels() -> Vec<(String, Kernel)> {
    let mut all: Vec<(String, Kernel)> = palladium_kernels::REGISTRY
        .iter()
        .map(|e| (e.name.to_string(), (e.build)(&[]).unwrap_or_else(|err| panic!("library kernel {}: {err}", e.name))))
        .collect();
    all.extend(extra_kernels());
    all
}

/// A library kernel at its defaults.
pub fn library_kernel(name: &str) -> Kernel {
    palladium_kernels::build(name, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// The test kernels below, by name: the ops and patterns no library kernel lowers.
pub fn extra_kernels() -> Vec<(String, Kernel)> {
    let built = [
        (misc::NAME, misc()),
        (masked_store::NAME, masked_store()),
        (transpose::NAME, transpose()),
        (semaphores::NAME, semaphores()),
        (dynamic_dma::NAME, dynamic_dma()),
        (casts::NAME, casts()),
    ];
    let mut all: Vec<(String, Kernel)> =
        built.into_iter().map(|(name, k)| (name.to_string(), k.unwrap_or_else(|e| panic!("test kernel {name}: {e}")))).collect();
    // Library kernels at non-default settings that change the emitted types.
    let settings = [("matmul_f32_out", "matmul", [("out_dtype", "f32")])];
    for (label, kernel, sets) in settings {
        let sets: Vec<(String, String)> = sets.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        all.push((label.to_string(), palladium_kernels::build(kernel, &sets).unwrap_or_else(|e| panic!("{label}: {e}"))));
    }
    all
}

/// A grid-less kernel: iota, compare, select, a traced `for` carrying a vector, a traced
/// `while`, a reduction to a scalar stored to SMEM, an i32 → f32 scalar cast, and
/// `run_scoped` with a scoped VMEM buffer and DMA semaphore copying to an ANY output.
#[kernel]
pub fn misc(
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[output(f32[2], space = smem)] s: Ref,
    #[output(f32[8, 128], space = any)] o2: Ref,
) {
    let xv = x[..];
    let mut acc = select(iota([8, 128], 1) < 100, xv, 0.0);
    for _i in 0..scalar(4) {
        acc = acc + xv;
    }
    s[0] = acc.sum_all();
    let mut n = scalar(0);
    while n < 3 {
        n = n + 1;
    }
    s[1] = n.cast(f32);
    o[..] = acc;
    run_scoped(|scope| {
        let buf = scope.vmem([8, 128], f32);
        let sem = scope.dma_sem();
        buf[..] = acc;
        let copy = async_copy(buf, o2, sem);
        copy.start();
        copy.wait();
    });
}

/// A masked f32 store: zero the block, then write only its first 64 lanes.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn masked_store(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = 0.0;
    let lanes = iota([8, 128], 1);
    o.store_masked(.., x[..] * 2.0, lanes < 64);
}

/// `.t()` of a 128x128 f32 block: `o = x^T`, block by block.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn transpose(
    #[input(f32[256, 128], block = [128, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[128, 256], block = [128, 128], map = |i| (0, i))] o: Ref,
) {
    o[..] = x[..].t();
}

/// A regular semaphore allocated in a scoped region, signalled and waited on.
#[kernel(grid = (2,), semantics = (arbitrary,))]
pub fn semaphores(
    #[input(f32[16, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    run_scoped(|scope| {
        let sem = scope.sem();
        sem.signal(1);
        sem.wait(1);
    });
    o[..] = x[..] + 1.0;
}

/// A DMA from HBM at a dynamic row offset promised to be a multiple of 16 (`multiple_of`).
#[kernel(grid = (4,), semantics = (arbitrary,))]
pub fn dynamic_dma(
    #[input(f32[64, 128], space = any)] src: Ref,
    #[output(f32[64, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(vmem, f32[16, 128])] buf: Ref,
    #[scratch(dma_sem[1])] sems: SemRef,
) {
    let start = (program_id(0) * 16).multiple_of(16);
    let copy = async_copy(src.at(ds(start, 16)), buf, sems.at(0));
    copy.start();
    copy.wait();
    o[..] = buf[..] * 3.0;
}

/// Vector casts: f32 → bf16, bf16 → f32 and i32 → f32.
#[kernel(grid = (2,), semantics = (parallel,))]
pub fn casts(
    #[input(f32[32, 128], block = [16, 128], map = |i| (i, 0))] x: Ref,
    #[input(i32[32, 128], block = [16, 128], map = |i| (i, 0))] n: Ref,
    #[output(bf16[32, 128], block = [16, 128], map = |i| (i, 0))] half: Ref,
    #[output(f32[32, 128], block = [16, 128], map = |i| (i, 0))] o: Ref,
) {
    let h = x[..].cast(bf16);
    half[..] = h;
    o[..] = h.cast(f32) + n[..].cast(f32);
}

// --- the oracle ---------------------------------------------------------------------------------

/// `../shared/tpu-oracle/oracle.py` relative to the repository root.
pub fn oracle_script() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tpu-oracle/oracle.py");
    assert!(p.is_file(), "the TPU oracle is missing: expected {} (a checkout of shared/ beside the repository)", p.display());
    p
}

/// The oracle's Python: `$PALLADIUM_TPU_VENV/bin/python`, default `~/.cache/palladium/venv-tpu`.
pub fn oracle_python() -> PathBuf {
    let venv = std::env::var_os("PALLADIUM_TPU_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is not set");
        Path::new(&home).join(".cache/palladium/venv-tpu")
    });
    let py = venv.join("bin/python");
    assert!(py.is_file(), "the TPU oracle venv is missing: expected {} (set PALLADIUM_TPU_VENV)", py.display());
    py
}

/// Run `oracle.py ARGS…` in `dir`; returns (success, stdout).
pub fn oracle(dir: &Path, args: &[&str]) -> (bool, String) {
    oracle_with_env(dir, args, &[])
}

/// [`oracle`] with extra environment variables (e.g. `ORACLE_CYCLES=0`).
pub fn oracle_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    // Deviceless compiles need no TPU, so libtpu's single-process lock only gets in the way
    // when another oracle (another test binary, a developer's shell) runs at the same time.
    let out = Command::new(oracle_python())
        .arg(oracle_script())
        .args(args)
        .env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("cannot run the oracle");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A fresh scratch directory under the target dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("cannot create a scratch dir");
    d
}
