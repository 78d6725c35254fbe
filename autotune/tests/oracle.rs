//! The libtpu runner against the real oracle (deviceless): measured cycles, and a libtpu
//! abort mid-batch rejects only the candidate it died on.

use palladium_autotune::{CostKind, Oracle, Outcome, Runner, SearchSpace, Stage, search};
use palladium_dsl::spec::Chip;

fn oracle() -> Oracle {
    Oracle::new(env!("CARGO_TARGET_TMPDIR")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_search_is_costed_by_libtpu() {
    let space = SearchSpace::new("matmul").fixed("m", 512).fixed("k", 512).fixed("n", 512).param("bm", [256, 512]).param("bn", [64, 256]);
    let mut o = oracle();
    let report = search(&space, Chip::V6e, &mut o).unwrap();
    assert_eq!(o.processes, 1, "one libtpu start for the whole search");
    assert_eq!(report.runner, "libtpu-oracle");
    // bn = 64 breaks the tiling rule: rejected at build, never sent to libtpu.
    for r in &report.results {
        let bn = &r.candidate.settings[1].1;
        match (&r.outcome, bn.as_str()) {
            (Outcome::Rejected { stage: Stage::Build, .. }, "64") => {}
            (Outcome::Costed(c), "256") => assert!(c.kind == CostKind::Measured && c.cycles > 0.0 && c.traffic.is_some(), "{c:?}"),
            (o, _) => panic!("{}: {o:?}", r.candidate),
        }
    }
}

#[test]
fn an_abort_mid_batch_rejects_only_its_candidate() {
    // On v6e libtpu 0.0.42.1's profiler aborts the process for gather_rows's manual DMAs
    // of a squeezed row of a 3-D HBM table; the matmuls around it must still be measured.
    let build = |name: &str, s: &[(&str, &str)]| {
        palladium_kernels::build(name, &s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>()).unwrap()
    };
    let small = [("m", "256"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "256"), ("bn", "128")];
    let a = build("matmul", &small);
    let d = build("gather_rows", &[]);
    let b = build("matmul", &[("m", "512"), ("k", "256"), ("n", "256"), ("bm", "128"), ("bk", "256"), ("bn", "128")]);
    let mut o = oracle();
    let r = o.run_batch(&[&a, &d, &b], Chip::V6e);
    assert_eq!(o.processes, 2, "the abort costs one more process: {r:?}");
    let (ca, cb) = (r[0].as_ref().unwrap().cycles, r[2].as_ref().unwrap().cycles);
    assert!(ca > 0.0 && cb > ca, "{ca} {cb}");
    let err = r[1].as_ref().unwrap_err();
    eprintln!("gather_rows on v6e: {err}");
    assert!(err.0.contains("libtpu aborted the oracle process on v6e"), "{err}");
}
