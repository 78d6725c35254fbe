//! `#[kernel]` error spans, pinned by trybuild: every mistake is reported, each at the
//! code that made it.
#[test]
fn kernel_macro_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
