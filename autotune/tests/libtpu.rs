//! The libtpu runner (deviceless, through PJRT): measured cycles, and a libtpu abort
//! rejects only the candidate it happened on.

use palladium_autotune::{CostKind, Libtpu, Outcome, Runner, SearchSpace, Stage, search};
use palladium_dsl::spec::Chip;

fn libtpu() -> Libtpu {
    Libtpu::new().unwrap_or_else(|e| panic!("{e}")).with_workers(2)
}

#[test]
fn a_search_is_costed_by_libtpu() {
    let space = SearchSpace::new("matmul")
        .fixed("m", 512)
        .fixed("k", 512)
        .fixed("n", 512)
        .param("bm", [256, 512])
        .param("bn", [64, 256]);
    let report = search(&space, Chip::V6e, &mut libtpu()).unwrap();
    assert_eq!(report.runner, "libtpu");
    // bn = 64 breaks the tiling rule: rejected at build, never sent to libtpu.
    for r in &report.results {
        let bn = &r.candidate.settings[1].1;
        match (&r.outcome, bn.as_str()) {
            (Outcome::Rejected { stage: Stage::Build, .. }, "64") => {}
            (Outcome::Costed(c), "256") => assert!(
                c.kind == CostKind::Measured && c.cycles > 0.0 && c.traffic.is_some(),
                "{c:?}"
            ),
            (o, _) => panic!("{}: {o:?}", r.candidate),
        }
    }
}

#[test]
fn an_abort_rejects_only_its_candidate() {
    // On v6e libtpu 0.0.42.1's profiler aborts the process for gather_rows's manual DMAs
    // of a squeezed row of a 3-D HBM table; the matmuls around it must still be measured.
    let build = |name: &str, s: &[(&str, &str)]| {
        palladium_kernels::build(
            name,
            &s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>(),
        )
        .unwrap()
    };
    let small =
        [("m", "256"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "256"), ("bn", "128")];
    let a = build("matmul", &small);
    let d = build("gather_rows", &[]);
    let b = build(
        "matmul",
        &[("m", "512"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "256"), ("bn", "128")],
    );
    let r = libtpu().run_batch(&[&a, &d, &b], Chip::V6e);
    let (ca, cb) = (r[0].as_ref().unwrap().cycles, r[2].as_ref().unwrap().cycles);
    assert!(ca > 0.0 && cb > ca, "{ca} {cb}");
    let err = r[1].as_ref().unwrap_err();
    eprintln!("gather_rows on v6e: {err}");
    assert!(
        err.0.contains("libtpu aborted on v6e") && err.0.contains("Unsupported DMA direction"),
        "{err}"
    );
}

#[test]
fn the_floor_streams_whole_blocks_near_hbm_bandwidth() {
    let l = libtpu();
    let (cycles, bytes) = l.floor(Chip::V6e, 64 << 20).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bytes, 64 << 20);
    let (half, half_bytes) = l.floor(Chip::V6e, 32 << 20).unwrap();
    assert_eq!(half_bytes, 32 << 20);
    eprintln!(
        "v6e floor: {cycles} cycles for 64 MiB, {half} for 32 MiB ({:.0} bytes/cycle)",
        bytes as f64 / cycles as f64
    );
    // A stream: twice the bytes, about twice the cycles (one pipeline fill apart).
    let ratio = cycles as f64 / half as f64;
    assert!((1.8..2.1).contains(&ratio), "{cycles} vs {half}");
}
