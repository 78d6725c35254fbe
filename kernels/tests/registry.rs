//! Every registry kernel can be checked: it has an input generator and a reference, and
//! both agree with the kernel's own call spec (operand order, dtypes, shapes).

use palladium_dsl::spec::OperandRole;
use palladium_kernels::{HostArray, REGISTRY};

/// The host arrays of the operands in `roles`: a mesh kernel's are its devices' operands
/// stacked on dim 0.
fn types(kernel: &palladium_dsl::Kernel, roles: &[OperandRole]) -> Vec<String> {
    let devices = kernel.call.devices();
    let global = |d: usize, n: u64| if d == 0 { n * devices } else { n };
    kernel
        .call
        .operands
        .iter()
        .filter(|o| roles.contains(&o.role))
        .map(|o| {
            format!(
                "{}[{}]",
                o.dtype,
                o.shape
                    .dims()
                    .iter()
                    .enumerate()
                    .map(|(d, &n)| global(d, n).to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect()
}

fn all_zero(d: &HostArray) -> bool {
    d.to_f32().iter().all(|&x| x == 0.0)
}

#[test]
fn every_kernel_has_inputs_and_a_reference_matching_its_call_spec() {
    let mut missing = Vec::new();
    for e in REGISTRY {
        let kernel = (e.build)(&[]).unwrap_or_else(|err| panic!("{err}"));
        let inputs = match (e.inputs)(&[], 1) {
            Ok(x) => x,
            Err(err) => {
                missing.push(format!("{}: {err}", e.name));
                continue;
            }
        };
        let got: Vec<String> = inputs.iter().map(HostArray::type_string).collect();
        assert_eq!(
            got,
            types(&kernel, &[OperandRole::Prefetch, OperandRole::Input]),
            "{}: inputs must follow the operand order",
            e.name
        );
        for (i, x) in inputs.iter().enumerate() {
            assert!(!all_zero(x), "{}: input {i} is all zero", e.name);
        }
        assert_eq!((e.inputs)(&[], 1).unwrap(), inputs, "{}: inputs must be deterministic", e.name);
        assert_ne!((e.inputs)(&[], 2).unwrap(), inputs, "{}: the seed must matter", e.name);
        let outputs = match (e.reference)(&[], &inputs) {
            Ok(x) => x,
            Err(err) => {
                missing.push(format!("{}: {err}", e.name));
                continue;
            }
        };
        let got: Vec<String> = outputs.iter().map(HostArray::type_string).collect();
        assert_eq!(
            got,
            types(&kernel, &[OperandRole::Output]),
            "{}: reference outputs must follow the kernel's outputs",
            e.name
        );
        assert!(outputs.iter().all(|o| !all_zero(o)), "{}: reference output is all zero", e.name);
    }
    assert!(
        missing.is_empty(),
        "kernels without a reference (every REGISTRY kernel needs `cases::NAME` in its entry!):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn settings_reach_inputs_and_reference() {
    let e = palladium_kernels::entry("matmul").unwrap();
    let set =
        [("m".to_string(), "32".to_string()), ("k".into(), "64".into()), ("n".into(), "16".into())];
    let x = (e.inputs)(&set, 7).unwrap();
    assert_eq!(x[0].shape, [32, 64]);
    assert_eq!((e.reference)(&set, &x).unwrap()[0].shape, [32, 16]);
    let err = (e.inputs)(&[("q".into(), "1".into())], 7).unwrap_err().to_string();
    assert!(err.contains("has no parameter `q`"), "{err}");
}

#[test]
fn attention_lengths_are_in_range_and_not_all_whole_tiles() {
    let e = palladium_kernels::entry("decode_attention").unwrap();
    for seed in 0..50 {
        let set = [
            ("batch".to_string(), "1".to_string()),
            ("max_context".into(), "1024".into()),
            ("block_kv".into(), "512".into()),
        ];
        let x = (e.inputs)(&set, seed).unwrap();
        let lens = x[0].to_i32();
        assert!(lens.iter().all(|&l| (1..=1024).contains(&l)), "{lens:?}");
        assert!(lens.iter().any(|&l| l % 512 != 0), "{lens:?}");
    }
}

#[test]
fn gather_ids_are_in_range_and_distinct() {
    let e = palladium_kernels::entry("gather_rows").unwrap();
    let x = (e.inputs)(&[], 3).unwrap();
    let mut ids = x[0].to_i32();
    assert!(ids.iter().all(|&i| (0..64).contains(&i)));
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 8);
}

#[test]
fn mesh_kernels_are_registered_with_their_devices() {
    for name in ["permute", "all_gather", "reduce_scatter", "all_reduce"] {
        let k = palladium_kernels::build(name, &[("n".into(), "8".into())])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.call.devices(), 8, "{name}");
        let e = palladium_kernels::entry(name).unwrap();
        let x = (e.inputs)(&[("n".into(), "8".into())], 1).unwrap();
        assert_eq!(x[0].shape[0] % 8, 0, "{name}: inputs stack the 8 devices' operands");
    }
}

/// A kernel whose DMA offsets or trip counts come from scalar prefetch declares the values
/// it takes (`#[prefetch(.., range = lo..=hi)]`), checked by `profile`, `interpret` and
/// `exec` (which also holds the seeded inputs to them: `tests/interpret.rs`).
#[test]
fn prefetch_ranges_are_declared_where_dmas_or_loops_derive_from_them() {
    let range = |kernel: &str, operand: &str| {
        let k = palladium_kernels::build(kernel, &[]).unwrap();
        let o = k.call.operands.iter().find(|o| o.name == operand).unwrap();
        o.values.map(|r| r.to_string())
    };
    for (kernel, operand, want) in [
        ("decode_attention", "lens", "1..=4096"),
        ("kv_cache_update", "positions", "0..=4095"),
        ("gather_rows", "ids", "0..=63"),
        ("expert_ffn", "ids", "0..=127"),
        ("expert_ffn_quantized", "ids", "0..=127"),
        ("grouped_matmul", "group_offsets", "0..=512"),
        ("grouped_matmul", "group_ids", "0..=127"),
        ("grouped_matmul", "m_tile_ids", "0..=3"),
        ("grouped_matmul_quantized", "num_visits", "0..=131"),
    ] {
        assert_eq!(range(kernel, operand).as_deref(), Some(want), "{kernel} {operand}");
    }
    // Outside its range, a value is named with the bound.
    let k = palladium_kernels::build("decode_attention", &[("max_context".into(), "1024".into())])
        .unwrap();
    let lens = k.call.operands.iter().find(|o| o.name == "lens").unwrap();
    assert_eq!(
        lens.check_values(&[1024, 1025]).unwrap_err(),
        "value 1 is 1025, outside the range 1..=1024 the kernel declares for it"
    );
}
