//! The walker's semantics on small kernels: a nested pipeline's manual DMAs (ring slots,
//! semaphores, the drain), bubbles attributed to the transfer that ended them, and a wait
//! that nothing would satisfy refused rather than modeled.

use palladium_dsl::prelude::*;
use palladium_profile::calibration::Calibration;
use palladium_profile::dma::Resource;
use palladium_profile::{Inputs, ProfileError, simulate};

fn v6e() -> palladium_profile::calibration::Coefficients {
    Calibration::committed().chip(Chip::V6e).unwrap().clone()
}

#[test]
fn a_nested_pipeline_streams_its_chunks_through_the_ring_overlapping_the_adds() {
    // Two grid steps, each streaming 6 chunks of 1 MiB (2048 x 128 f32) through a two-slot ring.
    let mut p = palladium_kernels::coverage::nested_pipeline::Params::default();
    p.set("rows", "2048").unwrap();
    let k = palladium_kernels::coverage::nested_pipeline::build(&p).unwrap();
    let c = v6e();
    let t = simulate(&k, Chip::V6e, &c, &Inputs::default()).unwrap();
    let chunk = 2048 * 128 * 4;
    let from_x: Vec<_> = t.dmas.iter().filter(|d| d.src == "x").collect();
    assert_eq!(from_x.len(), 12);
    assert!(
        from_x.iter().all(|d| d.dst == "ring" && d.bytes == chunk && d.resource == Resource::Hbm)
    );
    // And the two output blocks written back by the grid pipeline.
    assert_eq!(t.hbm_bytes(), 12 * chunk + 2 * chunk);
    // No faster than the bandwidth, and the chunks overlap the adds: well under the serial
    // sum of every transfer and every stretch of compute.
    let stream = t.hbm_bytes() as f64 / c.hbm_bytes_per_cycle;
    let compute: f64 = t.compute.iter().map(|s| s.end - s.start).sum();
    assert!(
        t.cycles >= stream && t.cycles < stream + compute,
        "{} vs stream {stream} + compute {compute}",
        t.cycles
    );
    // Every bubble ends with a transfer that lands in the ring or leaves the window.
    for w in &t.waits {
        let d = &t.dmas[w.dma];
        assert!(w.end <= d.done + 1e-6 && w.end >= d.done - 1e-6, "{w:?} ended by {d:?}");
    }
    assert!(t.waits.iter().any(|w| t.dmas[w.dma].src == "x"));
    assert!(t.assumptions.is_empty());
}

#[kernel(grid = (1,), semantics = (arbitrary,))]
fn waits_for_nothing(
    #[input(f32[8, 128], space = any)] x: Ref,
    #[output(f32[8, 128], block = [8, 128], map = |_i| (0, 0))] o: Ref,
    #[scratch(vmem, f32[8, 128])] buf: Ref,
    #[scratch(dma_sem[1])] sems: SemRef,
) {
    async_copy(x, buf, sems.at(0)).wait();
    o[..] = buf[..];
}

#[test]
fn a_wait_with_no_dma_in_flight_is_refused_at_its_line() {
    let k = waits_for_nothing::build(&waits_for_nothing::Params::default()).unwrap();
    let err = simulate(&k, Chip::V6e, &v6e(), &Inputs::default()).unwrap_err();
    assert!(matches!(err, ProfileError::Unsupported { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("engine.rs:") && msg.contains("with no DMA in flight") && msg.contains("sems"),
        "{msg}"
    );
}

#[test]
fn a_chip_libtpu_cannot_calibrate_is_refused_with_the_reason() {
    let err =
        Calibration::committed().chip(palladium_dsl::spec::Chip::V5e).unwrap_err().to_string();
    assert!(
        err.contains("no calibration for v5e (calibrated: v6e, v7x)")
            && err.contains("cannot calibrate it")
            && err.contains("vector-bf16packed"),
        "{err}"
    );
}
