//! The library collectives compiled deviceless by libtpu on several devices: each body in
//! an `sdy.manual_computation` over the devices (`palladium_runtime::wrap` for a call spec
//! with `devices`, as JAX lowers a `shard_map`), for the devices of v6e:2x2 (4) and tpu7x:2x2x1 (8
//! TensorCores). libtpu's static estimator prices remote DMAs at 0 cycles, so no figure is
//! asserted.

use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerOptions, lower};
use palladium_runtime::{CallSpec, Compiler, Estimate, Job, wrap};

fn program(kernel: Result<palladium_dsl::Kernel, palladium_dsl::BuildErrors>) -> String {
    let k = kernel.unwrap_or_else(|e| panic!("{e}"));
    let l = lower(&k, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}"));
    let spec = CallSpec::from_json(&l.call_json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.has_communication, Some(true));
    wrap(&l.body, &spec).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn collectives_compile_on_v6e_and_v7x_devices() {
    use palladium_kernels::{all_gather, all_reduce, permute, reduce_scatter};
    let jobs: Vec<(String, Job)> = [(Chip::V6e, 4), (Chip::V7x, 8)]
        .into_iter()
        .flat_map(|(chip, n)| {
            [
                (
                    "permute",
                    program(permute::build(&permute::Params { n, shift: 1, rows: 8, cols: 128 })),
                ),
                (
                    "all_gather",
                    program(all_gather::build(&all_gather::Params { n, rows: 16, cols: 128 })),
                ),
                (
                    "reduce_scatter",
                    program(reduce_scatter::build(&reduce_scatter::Params {
                        n,
                        rows: 16,
                        cols: 128,
                    })),
                ),
                (
                    "all_reduce",
                    program(all_reduce::build(&all_reduce::Params {
                        n,
                        rows: 16,
                        cols: 256,
                        bidirectional: true,
                    })),
                ),
            ]
            .into_iter()
            .map(move |(name, p)| {
                (
                    format!("{name} on {n} {chip} devices"),
                    Job { program: p, chip, serialize: false },
                )
            })
        })
        .collect();
    assert!(
        jobs[0].1.program.contains("mhlo.num_partitions = 4 : i32")
            && jobs[0]
                .1
                .program
                .contains("sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{\"x\"}, {}]>]")
    );
    assert!(
        jobs[0].1.program.contains("\\22has_communication\\22: true, \\22collective_id\\22: 0")
    );
    let compiler = Compiler::new(Estimate::No).unwrap_or_else(|e| panic!("{e}")).with_workers(1);
    let results = compiler.compile_all(&jobs.iter().map(|(_, j)| j.clone()).collect::<Vec<_>>());
    for ((what, _), r) in jobs.iter().zip(results) {
        let compiled = r.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(compiled.code_size_bytes > 0, "{what}");
    }
}

/// The ops (constants and the function aside) of a module, in order, with the segment sizes of those that
/// have them.
fn ops(module: &str) -> Vec<String> {
    module
        .lines()
        .filter_map(|l| {
            let rest = l
                .trim_start()
                .split_once(" = ")
                .filter(|_| l.trim_start().starts_with('%'))
                .map_or(l.trim_start(), |(_, r)| r);
            let name: String = rest
                .trim_start_matches('"')
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            let segments = l
                .split_once("operandSegmentSizes = array<i32: ")
                .map(|(_, r)| r.split('>').next().unwrap_or("").to_string());
            (name.contains('.') && name != "arith.constant" && !name.starts_with("func."))
                .then(|| segments.map_or(name.clone(), |s| format!("{name} [{s}]")))
        })
        .collect()
}

#[test]
fn permute_is_pallas_ring_permute_op_for_op() {
    let k = palladium_kernels::permute::build(&palladium_kernels::permute::Params {
        n: 4,
        shift: 1,
        rows: 8,
        cols: 128,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let l = lower(&k, &LowerOptions { chip: Chip::V6e }).unwrap_or_else(|e| panic!("{e}"));
    // What Pallas (jax 0.10.2) prints for the same ring permute under `jax.shard_map` over 4
    // devices: `lax.axis_index`, the right and left neighbours, `get_barrier_semaphore`, a
    // signal to each, `semaphore_wait(2)`, `make_async_remote_copy(..).start()/.wait()`.
    let pallas = [
        "tpu.device_id",
        "arith.remsi",
        "arith.addi",
        "arith.remsi",
        "arith.addi",
        "arith.remsi",
        "tpu.sem_barrier",
        "tpu.sem_signal [1, 1, 1, 0, 0]",
        "tpu.sem_signal [1, 1, 1, 0, 0]",
        "tpu.sem_wait",
        "tpu.enqueue_dma [1, 1, 1, 1, 1, 0, 0]",
        "tpu.wait_dma2 [1, 1, 1, 1, 1]",
        "tpu.wait_dma2 [1, 1, 1, 1, 0]",
    ];
    let ours = ops(&l.module);
    assert_eq!(ours, pallas.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{}", l.module);
}
