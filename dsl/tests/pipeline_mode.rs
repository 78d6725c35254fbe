//! `pipeline_mode = Buffered(n)` on a `BlockSpec` operand (Pallas's
//! `BlockSpec(pipeline_mode=pl.Buffered(n))`): carried in the call spec, printed, counted n
//! times in the VMEM budget, and refused at the operand's attribute where Mosaic has no mode.
use crate::common;
use common::line_of;
use palladium_dsl::ir::{PrintOptions, VerifyOptions, print_kernel, verify};
use palladium_dsl::prelude::*;
use palladium_dsl::spec::{Chip, PipelineMode};

/// This file's text: error locations are checked against its declarations.
const SOURCE: &str = include_str!("pipeline_mode.rs");

#[kernel(grid = (4,), semantics = (arbitrary,))]
fn buffered(
    #[default(1)] n: usize,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0), pipeline_mode = Buffered(n))] x: Ref,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0), pipeline_mode = Buffered(2))] y: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..] + y[..];
}

#[test]
fn buffer_counts_reach_the_call_spec_and_the_printer() {
    let k = buffered::build(&buffered::Params::default()).unwrap();
    let modes: Vec<Option<PipelineMode>> =
        k.call.operands.iter().map(|o| o.pipeline_mode).collect();
    assert_eq!(modes, [Some(PipelineMode::Buffered(1)), Some(PipelineMode::Buffered(2)), None]);
    let text = print_kernel(&k, PrintOptions::default());
    assert!(
        text.contains("in x: f32[32,128] vmem block [8,128] map bb1 pipeline_mode Buffered(1)\n"),
        "{text}"
    );
    assert!(
        text.contains("in y: f32[32,128] vmem block [8,128] map bb2 pipeline_mode Buffered(2)\n"),
        "{text}"
    );
    assert!(text.contains("out o: f32[32,128] vmem block [8,128] map bb3\n"), "{text}");
    for chip in Chip::ALL {
        verify(&k, VerifyOptions { chip: Some(chip) }).unwrap_or_else(|e| panic!("{chip}: {e}"));
    }
}

#[test]
fn counts_mosaic_has_no_mode_for_are_refused_at_the_attribute() {
    for n in [3, 8] {
        let text = buffered::build(&buffered::Params { n }).unwrap_err().to_string();
        let at = format!(
            "operand x at {}:{}:13: pipeline_mode = Buffered({n}): Mosaic pipelines a window with 1 (synchronous) or 2 (double-buffered) buffers",
            file!(),
            line_of(
                SOURCE,
                "f32[32, 128], block = [8, 128], map = |i| (i, 0), pipeline_mode = Buffered(n))]"
            )
        );
        assert!(text.contains(&at), "{text}");
        assert!(!text.contains("operand y"), "{text}");
    }
}

/// One 1 MiB block each way; Buffered(1) on both fits 2 MiB where the default's two
/// buffers each do not.
#[kernel(grid = (2,), vmem_limit = 2 << 20)]
fn single_buffered_budget(
    #[default(1)] n: usize,
    #[input(f32[1024, 512], block = [512, 512], map = |i| (i, 0), pipeline_mode = Buffered(n))]
    x: Ref,
    #[output(f32[1024, 512], block = [512, 512], map = |i| (i, 0), pipeline_mode = Buffered(n))] o: Ref,
) {
    o[..] = x[..];
}

#[test]
fn the_vmem_budget_counts_the_buffers() {
    assert!(single_buffered_budget::build(&single_buffered_budget::Params { n: 1 }).is_ok());
    let text = single_buffered_budget::build(&single_buffered_budget::Params { n: 2 })
        .unwrap_err()
        .to_string();
    assert!(text.contains("VMEM budget exceeded: 4194304 bytes needed (x 2x1048576 + o 2x1048576), limit 2097152 bytes"), "{text}");
}

#[kernel(grid = (2,))]
fn unwindowed(
    #[input(f32[16, 128], space = any, pipeline_mode = Buffered(1))] x: Ref,
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = zeros([8, 128], f32);
    let _ = x;
}

#[test]
fn only_windowed_operands_are_pipelined() {
    let text = unwindowed::build(&Default::default()).unwrap_err().to_string();
    assert!(text.contains(&format!("operand x at {}:{}:13: pipeline_mode = Buffered(1) needs a windowed operand of a gridded kernel (a VMEM block with an index map)", file!(), line_of(SOURCE, "space = any, pipeline_mode = Buffered(1))] x"))), "{text}");
}
