//! The traffic model against hand counts, the search's rejections, and determinism.
use palladium_autotune::{
    ChipModel, CompileOnly, CostKind, CostRecord, Outcome, Prefetch, Runner, RunnerError,
    SearchSpace, Stage, TrafficError, analyze, search,
};
use palladium_dsl::__private::*;
use palladium_dsl::Kernel;
use palladium_dsl::prelude::*;
use palladium_dsl::spec::Chip;

const MIB: u64 = 1 << 20;

fn matmul(settings: &[(&str, u64)]) -> Kernel {
    let s: Vec<(String, String)> =
        settings.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    palladium_kernels::build("matmul", &s).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn default_matmul_traffic_matches_hand_counts() {
    // 1024x2048x1024, blocks bm=256 bk=512 bn=256: grid (4, 4, 4), kk fastest.
    let t = analyze(&matmul(&[]), &Prefetch::new()).unwrap();
    assert_eq!(t.grid_steps, 64);
    let by_name = |n: &str| t.operands.iter().find(|o| o.name == n).unwrap().clone();
    // x's block (i, kk) changes every step: the whole of x is read once per j (4 times).
    let x = by_name("x");
    assert_eq!((x.dmas, x.block_bytes), (64, 256 * 512 * 2));
    assert_eq!(x.bytes, 4 * 1024 * 2048 * 2);
    // y's block (kk, j) also changes every step: y is read once per i (4 times).
    let y = by_name("y");
    assert_eq!((y.dmas, y.bytes), (64, 4 * 2048 * 1024 * 2));
    // o's block (i, j) changes every 4 steps: each block is written back once.
    let o = by_name("o");
    assert_eq!((o.role, o.dmas, o.bytes), ("output", 16, 1024 * 1024 * 2));
    assert_eq!(t.hbm_read_bytes, 32 * MIB);
    assert_eq!(t.hbm_write_bytes, 2 * MIB);
    assert_eq!(t.prefetch_bytes, 0);
    // VMEM: x, y, o double-buffered + the f32 accumulator.
    assert_eq!(
        t.vmem_bytes,
        2 * 256 * 512 * 2 + 2 * 512 * 256 * 2 + 2 * 256 * 256 * 2 + 256 * 256 * 4
    );
    // One 256x512 @ 512x256 dot per step.
    assert_eq!(t.mxu_flops_per_step, 2 * 256 * 256 * 512);
    assert_eq!(t.mxu_flops, 2 * 1024 * 2048 * 1024);
    assert!(t.notes.is_empty(), "{:?}", t.notes);
}

#[test]
fn matmul_traffic_follows_the_reuse_formula_for_every_block_shape() {
    let (m, k, n) = (1024u64, 2048u64, 1024u64);
    for bm in [128, 256, 512] {
        for bk in [256, 512, 1024, 2048] {
            for bn in [128, 256, 512] {
                let t = analyze(&matmul(&[("bm", bm), ("bk", bk), ("bn", bn)]), &Prefetch::new())
                    .unwrap();
                let what = format!("bm={bm} bk={bk} bn={bn}");
                assert_eq!(t.grid_steps, (m / bm) * (n / bn) * (k / bk), "{what}");
                // x re-read n/bn times, y re-read m/bm times, o written once; except that with
                // bk = k, x's block (i, 0) stays put while j moves, so x is read only once.
                let x_reads = if bk == k { 1 } else { n / bn };
                assert_eq!(t.hbm_read_bytes, x_reads * m * k * 2 + (m / bm) * k * n * 2, "{what}");
                assert_eq!(t.hbm_write_bytes, m * n * 2, "{what}");
                assert_eq!(t.mxu_flops, 2 * m * k * n, "{what}");
            }
        }
    }
}

#[test]
fn single_block_reductions_and_constant_maps_fetch_once() {
    // With bk = k the x block (i, 0) only changes with i: read exactly once.
    let t = analyze(&matmul(&[("bm", 512), ("bk", 2048), ("bn", 1024)]), &Prefetch::new()).unwrap();
    let x = t.operands.iter().find(|o| o.name == "x").unwrap();
    assert_eq!((x.dmas, x.bytes), (2, 1024 * 2048 * 2));
    // rmsnorm's weight map is (0, 0): fetched at step 0 and never again.
    let k = palladium_kernels::build("rmsnorm", &[]).unwrap();
    let t = analyze(&k, &Prefetch::new()).unwrap();
    let w = t.operands.iter().find(|o| o.name == "weight").unwrap();
    assert_eq!((t.grid_steps, w.dmas, w.bytes), (4, 1, 2048 * 2));
    assert_eq!(t.mxu_flops, 0);
}

#[test]
fn manual_dma_operands_are_noted_not_guessed() {
    let k = palladium_kernels::build("gather_rows", &[]).unwrap();
    let t = analyze(&k, &Prefetch::new()).unwrap();
    assert_eq!(t.operands.len(), 1, "only `out` is windowed");
    assert_eq!(t.hbm_write_bytes, 8 * 16 * 256 * 2);
    assert_eq!(t.prefetch_bytes, 8 * 4);
    assert_eq!(t.hbm_read_bytes, 8 * 4, "the HBM table is moved by the body's DMAs");
    assert!(t.notes.iter().any(|n| n.contains("`table` is in any")), "{:?}", t.notes);
}

/// grid (4,): `x` (bf16[64,128], blocks of [16,128]) at block `row(ids[i])` picked through a
/// scalar-prefetch table; the output at block `i`.
fn prefetch_kernel(row: fn(Val) -> Val) -> Kernel {
    let mut b = KernelBuilder::new("pick");
    b.grid_dim(4u64, Semantics::Arbitrary);
    b.operand::<(Val, i32)>(
        "ids",
        OperandRole::Prefetch,
        DType::I32,
        &[4],
        MemorySpace::Smem,
        None,
        None,
    );
    b.operand(
        "x",
        OperandRole::Input,
        DType::Bf16,
        &[64, 128],
        MemorySpace::Vmem,
        Some(vec![BlockDim::Blocked(16), BlockDim::Blocked(128)]),
        Some(Box::new(move |g: &[Val], p: &[Ref]| (row(p[0].load(g[0])), 0))),
    );
    b.operand(
        "o",
        OperandRole::Output,
        DType::Bf16,
        &[64, 128],
        MemorySpace::Vmem,
        Some(vec![BlockDim::Blocked(16), BlockDim::Blocked(128)]),
        Some(Box::new(|g: &[Val], _: &[Ref]| (g[0], 0))),
    );
    let sealed = b.seal().unwrap();
    let h: Vec<Ref> = sealed.handles.iter().cloned().map(|h| h.into_ref()).collect();
    h[2].store(.., h[1].load(..));
    sealed.finish().unwrap()
}

#[test]
fn index_maps_read_scalar_prefetch_contents() {
    let k = prefetch_kernel(|id| (id / 1).minimum(3));
    let x = |p: &Prefetch| {
        analyze(&k, p).unwrap().operands.iter().find(|o| o.name == "x").unwrap().dmas
    };
    // Default contents ids[i] = i: a new block every step.
    assert_eq!(x(&Prefetch::new()), 4);
    // Repeated ids are not re-fetched; only changes between consecutive steps count.
    assert_eq!(x(&Prefetch::new().with("ids", vec![0, 0, 1, 1])), 2);
    assert_eq!(x(&Prefetch::new().with("ids", vec![2, 1, 2, 1])), 4);
    // `/` and `min` are evaluated: ids / 2 = [0, 0, 1, 1].
    let halves = analyze(&prefetch_kernel(|id| (id / 2).minimum(3)), &Prefetch::new()).unwrap();
    assert_eq!(halves.operands[0].dmas, 2);
    // Comparisons and selects too (the one scalar evaluator): ids < 2 ? ids : 0 = [0, 1, 0, 0].
    let k = prefetch_kernel(|id| select(cmp(CmpPred::Lt, id, 2), id, 0));
    assert_eq!(analyze(&k, &Prefetch::new()).unwrap().operands[0].dmas, 3);
    assert_eq!(halves.prefetch_bytes, 16);

    let err = analyze(&k, &Prefetch::new().with("ids", vec![0, 1])).unwrap_err();
    assert!(err.to_string().contains("2 values given, the array [4] has 4"), "{err}");
    let err = analyze(&k, &Prefetch::new().with("ids", vec![0, -1, 0, 0])).unwrap_err();
    assert!(matches!(err, TrafficError::Eval { .. }), "{err}");
    assert!(
        err.to_string().contains(
            "index map of `x` at grid point [1]: block index -1 in dim 0 is outside the array"
        ),
        "{err}"
    );
}

#[test]
fn unknown_index_map_ops_are_errors_not_guesses() {
    // A float in an index map: not an integer scalar op.
    let float = || prefetch_kernel(|id| id.cast(DType::F32).cast(DType::I32));
    let err = analyze(&float(), &Prefetch::new()).unwrap_err();
    assert_eq!(err, TrafficError::UnsupportedOp { operand: "x".into(), op: "cast".into() });
    // The compile-only runner turns it into a runner rejection.
    let mut r = CompileOnly::new();
    let e = r.run(&float(), Chip::V6e).unwrap_err();
    assert!(e.to_string().contains("op `cast` is not supported"), "{e}");
}

#[test]
fn search_rejects_untileable_blocks_and_vmem_overflow_on_v7x() {
    // 8 (which tiles m) breaks the (16, 128) bf16 tile; 4096x4096x4096 blocks of 2048x4096x2048 need
    // 2 x 16 MiB for x alone, over v7x's 32 MiB scoped VMEM.
    let space = SearchSpace::new("matmul")
        .fixed("m", 4096)
        .fixed("k", 4096)
        .fixed("n", 4096)
        .param("bm", [8, 256, 2048])
        .param("bk", [512, 4096])
        .param("bn", [256, 2048]);
    let report = search(&space, Chip::V7x, &mut CompileOnly::new()).unwrap();
    assert_eq!(report.results.len(), 12);
    let get = |bm: &str, bk: &str, bn: &str| {
        let want = [("bm", bm), ("bk", bk), ("bn", bn)]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .to_vec();
        report.results.iter().find(|r| r.candidate.settings == want).unwrap()
    };
    for bk in ["512", "4096"] {
        for bn in ["256", "2048"] {
            match &get("8", bk, bn).outcome {
                Outcome::Rejected { stage: Stage::Build, reason } => {
                    assert!(reason.contains("TPU block rule"), "{reason}")
                }
                o => panic!("bm=8 must fail the tiling rule: {o:?}"),
            }
        }
    }
    match &get("2048", "4096", "2048").outcome {
        Outcome::Rejected { stage: Stage::Verify, reason } => {
            assert!(
                reason.contains("VMEM budget exceeded") && reason.contains("on v7x"),
                "{reason}"
            );
        }
        o => panic!("oversize blocks must fail the VMEM budget: {o:?}"),
    }
    assert!(get("256", "512", "256").cost().is_some());
    let table = report.table();
    println!("{table}");
    assert!(
        table.contains("rej:build") && table.contains("rej:verify") && table.contains("ok #1"),
        "{table}"
    );
    // Every rejection keeps a reason; every survivor is costed.
    assert!(
        report
            .rejected()
            .all(|r| matches!(&r.outcome, Outcome::Rejected { reason, .. } if !reason.is_empty()))
    );
    assert_eq!(report.ranking().len() + report.rejected().count(), 12);
}

fn sweep() -> SearchSpace {
    SearchSpace::new("matmul")
        .param("bm", [128, 256, 512])
        .param("bk", [256, 512, 1024, 2048])
        .param("bn", [128, 256, 512])
}

#[test]
fn candidates_enumerate_in_a_fixed_order() {
    let c = sweep().candidates();
    assert_eq!(c.len(), 36);
    assert_eq!(c[0].to_string(), "bm=128 bk=256 bn=128");
    assert_eq!(c[1].to_string(), "bm=128 bk=256 bn=256", "last parameter fastest");
    assert_eq!(c[3].to_string(), "bm=128 bk=512 bn=128");
    assert_eq!(c[35].to_string(), "bm=512 bk=2048 bn=512");
    assert!(c.iter().enumerate().all(|(i, c)| c.index == i));
    assert_eq!(SearchSpace::pow2(100, 1024), vec![128, 256, 512, 1024]);
    let err =
        search(&SearchSpace::new("matmul").param("bq", [1]), Chip::V6e, &mut CompileOnly::new())
            .unwrap_err();
    assert!(err.to_string().contains("no parameter `bq`"), "{err}");
}

#[test]
fn ranking_is_deterministic_and_follows_the_model() {
    let a = search(&sweep(), Chip::V6e, &mut CompileOnly::new()).unwrap();
    let b = search(&sweep(), Chip::V6e, &mut CompileOnly::new()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_json(), b.to_json());
    let names = |r: &palladium_autotune::SearchReport| {
        r.ranking().iter().map(|c| c.candidate.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(names(&a), names(&b));
    assert_eq!(a.ranking().len(), 36, "every block shape of the sweep fits");
    // Costs are non-decreasing down the ranking, ties in enumeration order.
    let ranked = a.ranking();
    for w in ranked.windows(2) {
        let (x, y) = (w[0].cost().unwrap().cycles, w[1].cost().unwrap().cycles);
        assert!(x < y || (x == y && w[0].candidate.index < w[1].candidate.index));
    }
    // The model is HBM-bound here: the biggest bm/bn minimise re-reads, the biggest bk
    // minimises steps.
    assert_eq!(a.best().unwrap().candidate.to_string(), "bm=512 bk=2048 bn=512");
    let best = a.best().unwrap().cost().unwrap();
    let m = ChipModel::of(Chip::V6e);
    let t = best.traffic.as_ref().unwrap();
    let want = (t.hbm_bytes() as f64 / m.hbm_bytes_per_cycle())
        .max(t.mxu_flops as f64 / m.mxu_flops_per_cycle())
        + t.grid_steps as f64 * m.per_step_overhead_cycles();
    assert_eq!(best.cycles, want);
    assert_eq!(best.kind, CostKind::Modeled);
}

/// A stand-in for a measuring runner: proves the trait carries a non-model cost and errors.
struct StepsRunner;

impl Runner for StepsRunner {
    fn name(&self) -> &str {
        "steps"
    }
    fn run(&mut self, kernel: &Kernel, _chip: Chip) -> Result<CostRecord, RunnerError> {
        let steps: u64 = kernel.call.grid.iter().map(|g| g.extent).product();
        if steps > 64 {
            return Err(RunnerError(format!("{steps} steps is too many")));
        }
        Ok(CostRecord {
            runner: "steps".into(),
            kind: CostKind::Measured,
            cycles: steps as f64,
            traffic: None,
            model: None,
        })
    }
}

#[test]
fn other_runners_plug_in() {
    let report = search(&sweep(), Chip::V6e, &mut StepsRunner).unwrap();
    assert_eq!(report.runner, "steps");
    assert!(
        report
            .rejected()
            .all(|r| matches!(r.outcome, Outcome::Rejected { stage: Stage::Runner, .. }))
    );
    assert_eq!(report.rejected().count(), 36 - report.ranking().len());
    assert_eq!(report.best().unwrap().cost().unwrap().cycles, 4.0);
    assert!(report.table().contains("rej:runner"));
}

/// Element windows (`element_windows`: x's 16-row windows every 8 rows, padded 8 after) move
/// only their rows inside the array: 3 full windows and one half in padding, and 4 output
/// windows of 8 rows.
#[test]
fn element_windows_move_only_rows_inside_the_array() {
    let k = palladium_kernels::coverage::element_windows::build(&Default::default()).unwrap();
    let t = analyze(&k, &Prefetch::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.hbm_read_bytes, (3 * 16 + 8) * 128 * 4);
    assert_eq!(t.hbm_write_bytes, 4 * 8 * 128 * 4);
}
