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

/// `n[0]` chunk copies, with no declared range on `n`: only the profiler's bounds stop a
/// run-away trip count.
#[kernel]
fn copies(
    #[prefetch(i32[1])] n: Ref,
    #[input(f32[8, 128], space = any)] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[scratch(vmem, f32[8, 128])] buf: Ref,
    #[scratch(dma_sem[1])] sems: SemRef,
) {
    for _i in fori(0, n[0]) {
        let copy = async_copy(x, buf, sems.at(0));
        copy.start();
        copy.wait();
    }
    o[..] = buf[..];
}

#[test]
fn a_trip_count_from_data_is_bounded_by_the_profiler() {
    let k = copies::build(&copies::Params::default()).unwrap();
    let c = v6e();
    let n = |v: i64| Inputs { prefetch: [("n".to_string(), vec![v])].into_iter().collect() };
    let small = palladium_profile::Bounds { ops: 100_000, events: 1_000 };
    let t = palladium_profile::simulate_within(&k, Chip::V6e, &c, &n(10), small).unwrap();
    assert_eq!(t.dmas.len(), 10 + 1);
    // i32::MAX copies: refused where the events pass the bound, naming the loop.
    let err = palladium_profile::simulate_within(&k, Chip::V6e, &c, &n(i32::MAX as i64), small)
        .unwrap_err();
    assert!(matches!(err, ProfileError::TooLarge { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("cannot profile `copies`: the call runs past 1000 timeline events")
            && msg.contains("engine.rs:"),
        "{msg}"
    );
    let err = palladium_profile::simulate_within(
        &k,
        Chip::V6e,
        &c,
        &n(i32::MAX as i64),
        palladium_profile::Bounds { ops: 1_000, events: 1_000_000 },
    )
    .unwrap_err();
    assert!(err.to_string().contains("the call runs past 1000 ops"), "{err}");
    // Not an i32: refused before anything runs.
    let err = simulate(&k, Chip::V6e, &c, &n(1 << 40)).unwrap_err();
    assert!(
        err.to_string().contains("scalar prefetch `n`: value 0 is 1099511627776, outside an i32"),
        "{err}"
    );
}

/// `decode_attention` declares `lens` in `1..=max_context`: values past its cache, zero or
/// negative are refused before the loop runs, naming the operand, the value and the bound.
#[test]
fn prefetch_values_outside_the_declared_range_are_refused() {
    let k = palladium_kernels::build("decode_attention", &[]).unwrap();
    let c = v6e();
    let lens = |v: Vec<i64>| Inputs { prefetch: [("lens".to_string(), v)].into_iter().collect() };
    assert!(simulate(&k, Chip::V6e, &c, &lens(vec![4096, 1])).is_ok());
    for (values, want) in [
        (vec![99999, 99999], "value 0 is 99999"),
        (vec![4096, 4097], "value 1 is 4097"),
        (vec![-1, -1], "value 0 is -1"),
        (vec![0, 5], "value 0 is 0"),
        (vec![2147483647, 1], "value 0 is 2147483647"),
    ] {
        let err = simulate(&k, Chip::V6e, &c, &lens(values)).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "scalar prefetch `lens`: {want}, outside the range 1..=4096 the kernel declares for it"
            )),
            "{err}"
        );
    }
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
