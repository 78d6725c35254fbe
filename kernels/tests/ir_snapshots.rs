//! The IR of every library kernel, verified, then snapshotted under `snapshots/ir/`.
//! Bless changes with `cargo insta review` (CI refuses to write snapshots).
use palladium_dsl::ir::{PrintOptions, VerifyOptions, print_kernel, verify};
use palladium_dsl::spec::Chip;

#[test]
fn library_kernels_print_verified_ir() {
    for entry in palladium_kernels::REGISTRY {
        let kernel = (entry.build)(&[]).unwrap_or_else(|e| panic!("{e}"));
        for chip in Chip::ALL {
            if let Err(e) = verify(&kernel, VerifyOptions { chip: Some(chip) }) {
                panic!("{} does not verify on {chip}:\n{e}", entry.name);
            }
        }
        let text = print_kernel(&kernel, PrintOptions::default());
        assert_eq!(
            text,
            print_kernel(&(entry.build)(&[]).unwrap(), PrintOptions::default()),
            "printing is deterministic"
        );
        insta::with_settings!({ snapshot_path => "../../snapshots/ir", prepend_module_to_snapshot => false, omit_expression => true }, {
            insta::assert_snapshot!(entry.name, text);
        });
    }
}

#[test]
fn settings_override_defaults_and_bad_settings_are_named() {
    let k = palladium_kernels::build("matmul", &[("bm".into(), "128".into())]).unwrap();
    assert_eq!(k.call.grid[0].extent, 8);
    let err =
        palladium_kernels::build("matmul", &[("bq".into(), "128".into())]).unwrap_err().to_string();
    assert!(
        err.contains(
            "kernel `matmul` has no parameter `bq` (parameters: m, k, n, bm, bk, bn, out_dtype)"
        ),
        "{err}"
    );
    let err =
        palladium_kernels::build("matmul", &[("bm".into(), "big".into())]).unwrap_err().to_string();
    assert!(err.contains("cannot parse `big` as usize"), "{err}");
    let err = palladium_kernels::build("matmull", &[]).unwrap_err().to_string();
    assert!(err.contains("unknown kernel `matmull`"), "{err}");
    // 100 tiles m = 1000 but is no multiple of bf16's 16 sublanes.
    let err = palladium_kernels::build(
        "matmul",
        &[("m".into(), "1000".into()), ("bm".into(), "100".into())],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("TPU block rule"), "{err}");
    let err =
        palladium_kernels::build("matmul", &[("bm".into(), "100".into())]).unwrap_err().to_string();
    assert!(err.contains("block dim 0 of `x`: bm = 100 does not divide m = 1024"), "{err}");
}
