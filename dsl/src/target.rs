//! The one table of TPU hardware figures: a [`Target`] per [`Chip`]. The verifier (VMEM and
//! HBM budgets), the autotuner's roofline model and the megakernel planner read these figures
//! and nothing else.
//!
//! **Chip, TensorCore, device.** Google publishes figures per *chip*; JAX's `tpu_info` (and
//! Mosaic's budgets) speak per *TensorCore*; a kernel runs on one *device*, what PJRT calls
//! one: a chip on v5e/v6e (one TensorCore), a whole chip on v4/v5p (megacore: both
//! TensorCores form one device and a kernel's parallel grid dimensions are split across
//! them), one TensorCore on v7x (two devices per chip). A [`Target`] stores each shared
//! figure per chip, as published, and derives the per-TensorCore and per-device figures
//! ([`Target::hbm_bytes_per_device`], [`Target::hbm_bandwidth_per_tensorcore`], ...); VMEM,
//! SMEM and the MXUs belong to one TensorCore and are stored so.
//!
//! **Sources, and which one won.** Two sources cover every chip: the Google Cloud TPU system
//! architecture pages (`docs.cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e,tpu7x}`, per chip)
//! and the `tpu_info` table of the JAX the project pins (`jax==0.10.2`,
//! `jax/_src/pallas/mosaic/tpu_info.py`, per TensorCore: it divides the chip's HBM and
//! bandwidth by the physical TensorCores). Where both give a figure, the Cloud page wins: it
//! is the product specification, while `tpu_info` rounds to three digits and disagrees with
//! it on v5p (2.46e12 B/s against the page's 2765 GB/s). `tpu_info` fills in what the pages
//! do not publish (VMEM, SMEM, MXU counts, `TPU7x`'s HBM bandwidth). The three tables this
//! replaces did not disagree on a figure so much as on its unit: the autotuner's v4/v5p
//! bandwidths (1200, 2765 GB/s) were per chip = per megacore device, the planner's (600,
//! 1382.5 GB/s) per TensorCore; both are derived here from the one per-chip figure.

use crate::spec::Chip;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const GB: f64 = 1e9;
const TFLOPS: f64 = 1e12;

/// The matrix units of one TensorCore.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Mxu {
    /// MXUs per TensorCore.
    pub count: u32,
    /// The systolic array is `size × size` (`tpu_info`'s `mxu_column_size`).
    pub size: u32,
}

/// Inter-chip interconnect of one chip.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Ici {
    /// ICI links (ports) per chip.
    pub links_per_chip: u32,
    /// Bidirectional ICI bandwidth per chip, bytes/s; `None` where Google publishes none.
    pub bandwidth_per_chip: Option<f64>,
    /// Remote-copy bandwidths measured from inside a kernel, where someone has measured
    /// them: they are far below the published peaks, so the link model prefers them.
    pub measured: Option<MeasuredLinks>,
}

/// Remote DMA bandwidths measured from a Pallas kernel (`make_async_remote_copy`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct MeasuredLinks {
    /// Sibling TensorCore of the same chip, remote VMEM copy: (bytes, bytes/s) at a small
    /// and at a large message (the bandwidth grows with the message in between).
    pub sibling_small: (u64, f64),
    pub sibling_large: (u64, f64),
    /// To a core of another chip, per core, per direction, bytes/s.
    pub cross_chip_per_core: f64,
    /// Time of one in-kernel collective at decode sizes, where it is latency-bound, seconds.
    pub collective_latency: f64,
}

/// Which links a ring of devices crosses, and what one hop of it is modelled at.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RingHop {
    /// Bytes/s one device sends in one direction over the ring's slowest hop.
    pub bandwidth: f64,
    /// Fixed time of one collective, seconds (0 where nothing was measured).
    pub latency: f64,
    /// Fixed time of one hop (a remote copy's or signal's first byte after its start),
    /// seconds: the measured collective latency over [`ANCHOR_ALL_REDUCE_HOPS`]. The
    /// measurement gives a time per collective, not per hop; a timeline of hops needs the
    /// latter (`palladium profile`), the planner the former.
    pub hop_latency: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// The hops one after another of the measured collective ([`MeasuredLinks::collective_latency`],
/// an all-reduce over 8 devices), taken as this project's bidirectional ring all-reduce
/// does it: 7 reduce-scatter hops, then 7 all-gather hops. An assumption: the measurement
/// names no hop count (its kernel sends to `rank ^ offset`; a butterfly's 3 + 3 hops would
/// make each hop 2.3 times slower). With it, an 8-device ring all-reduce's hops add up to
/// the measured collective latency.
pub const ANCHOR_ALL_REDUCE_HOPS: u32 = 14;

impl Ici {
    /// The model of one hop of a ring over `devices` devices of a chip with
    /// `devices_per_chip` devices, for messages of `message_bytes`: a ring inside one chip
    /// runs at the sibling figure (log-interpolated between the measured sizes), a ring
    /// across chips at the cross-chip figure (its slowest hop). Unmeasured chips get the
    /// published per-chip figure over its links and two directions, and no latency. `None`
    /// where nothing is published.
    pub fn ring_hop(
        &self,
        devices: u32,
        devices_per_chip: u32,
        message_bytes: u64,
    ) -> Option<RingHop> {
        if let Some(m) = self.measured {
            let hop_latency = m.collective_latency / f64::from(ANCHOR_ALL_REDUCE_HOPS);
            if devices <= devices_per_chip {
                let ((s0, b0), (s1, b1)) = (m.sibling_small, m.sibling_large);
                let t = ((message_bytes.clamp(s0, s1) as f64).ln() - (s0 as f64).ln())
                    / ((s1 as f64).ln() - (s0 as f64).ln());
                let bandwidth = (b0.ln() + t * (b1.ln() - b0.ln())).exp();
                return Some(RingHop {
                    bandwidth,
                    latency: m.collective_latency,
                    hop_latency,
                    source: "measured sibling-core remote VMEM copy, interpolated by message size",
                });
            }
            return Some(RingHop {
                bandwidth: m.cross_chip_per_core,
                latency: m.collective_latency,
                hop_latency,
                source: "measured cross-chip remote copy per core and direction (the ring's slowest hop)",
            });
        }
        let per_chip = self.bandwidth_per_chip?;
        Some(RingHop {
            bandwidth: per_chip / f64::from(self.links_per_chip) / 2.0,
            latency: 0.0,
            hop_latency: 0.0,
            source: "published ICI peak per link and direction (not measured; no latency)",
        })
    }
}

/// One TPU generation's figures. Per-chip figures are stored as published; see the module
/// doc for the per-TensorCore and per-device views.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Target {
    pub chip: Chip,
    pub tensorcores_per_chip: u32,
    /// TensorCores one PJRT device spans: 2 on megacore chips (v4, v5p), else 1.
    pub tensorcores_per_device: u32,
    /// VMEM per TensorCore, bytes.
    pub vmem_bytes: u64,
    /// The scoped-VMEM limit libtpu applies to a kernel that sets no `vmem_limit_bytes`
    /// (reported as 16 MiB on v4/v5e/v5p and 32 MiB on v6e and later).
    pub default_scoped_vmem_bytes: u64,
    /// SMEM per TensorCore, bytes.
    pub smem_bytes: u64,
    /// HBM per chip, bytes.
    pub hbm_bytes_per_chip: u64,
    /// HBM bandwidth per chip, bytes/s.
    pub hbm_bandwidth_per_chip: f64,
    pub mxu: Mxu,
    /// Peak dense bf16 throughput per chip, flop/s.
    pub bf16_flops_per_chip: f64,
    /// The TensorCore clock, Hz: the unit of the autotuner's modeled cycles.
    pub clock_hz: f64,
    pub ici: Ici,
}

impl Target {
    /// PJRT devices per chip.
    pub fn devices_per_chip(&self) -> u32 {
        self.tensorcores_per_chip / self.tensorcores_per_device
    }

    /// HBM one device (one kernel) can address: every operand of a call must fit in it.
    pub fn hbm_bytes_per_device(&self) -> u64 {
        self.hbm_bytes_per_chip / u64::from(self.devices_per_chip())
    }

    /// HBM bandwidth of one device: what a kernel whose parallel grid dimensions use every
    /// TensorCore of the device can stream.
    pub fn hbm_bandwidth_per_device(&self) -> f64 {
        self.hbm_bandwidth_per_chip / f64::from(self.devices_per_chip())
    }

    /// HBM bandwidth of one TensorCore (the chip's split evenly, as `tpu_info` does): what a
    /// kernel running on one TensorCore streams.
    pub fn hbm_bandwidth_per_tensorcore(&self) -> f64 {
        self.hbm_bandwidth_per_chip / f64::from(self.tensorcores_per_chip)
    }

    /// Peak dense bf16 throughput of one device, flop/s.
    pub fn bf16_flops_per_device(&self) -> f64 {
        self.bf16_flops_per_chip / f64::from(self.devices_per_chip())
    }

    /// Peak dense bf16 throughput of one TensorCore, flop/s.
    pub fn bf16_flops_per_tensorcore(&self) -> f64 {
        self.bf16_flops_per_chip / f64::from(self.tensorcores_per_chip)
    }
}

/// v4. Cloud page: 2 TensorCores per chip, four MXUs each; 32 GiB HBM2 at 1200 GB/s; 275
/// TFLOP/s bf16 (`tpu_info`: 1.23e12 B/s, the same HBM2 rounded otherwise). VMEM 16 MiB,
/// SMEM 1 MiB, MXU 128 wide (`tpu_info`). Megacore: one device per chip. Clock 1.05 GHz: the
/// peak per TensorCore over four 128×128 MXUs (137.5e12 / (4 · 128² · 2)). ICI: six links
/// (the page's 3D mesh/torus: a neighbour on each side in each dimension); Google publishes
/// no per-chip ICI bandwidth for v4.
const V4: Target = Target {
    chip: Chip::V4,
    tensorcores_per_chip: 2,
    tensorcores_per_device: 2,
    vmem_bytes: 16 * MIB,
    default_scoped_vmem_bytes: 16 * MIB,
    smem_bytes: MIB,
    hbm_bytes_per_chip: 32 * GIB,
    hbm_bandwidth_per_chip: 1200.0 * GB,
    mxu: Mxu { count: 4, size: 128 },
    bf16_flops_per_chip: 275.0 * TFLOPS,
    clock_hz: 1.05e9,
    ici: Ici { links_per_chip: 6, bandwidth_per_chip: None, measured: None },
};

/// v5e. Cloud page: 1 TensorCore per chip, four MXUs; 16 GiB HBM2 at 819 GB/s (`tpu_info`:
/// 8.20e11); 197 TFLOP/s bf16; ICI 4 ports, 400 GB/s bidirectional per chip (2D torus).
/// VMEM 128 MiB, SMEM 1 MiB, MXU 128 wide (`tpu_info`). Clock 1.5 GHz: 197e12 / (4 · 128² · 2).
const V5E: Target = Target {
    chip: Chip::V5e,
    tensorcores_per_chip: 1,
    tensorcores_per_device: 1,
    vmem_bytes: 128 * MIB,
    default_scoped_vmem_bytes: 16 * MIB,
    smem_bytes: MIB,
    hbm_bytes_per_chip: 16 * GIB,
    hbm_bandwidth_per_chip: 819.0 * GB,
    mxu: Mxu { count: 4, size: 128 },
    bf16_flops_per_chip: 197.0 * TFLOPS,
    clock_hz: 1.5e9,
    ici: Ici { links_per_chip: 4, bandwidth_per_chip: Some(400.0 * GB), measured: None },
};

/// v5p. Cloud page: 2 TensorCores per chip, four MXUs each; 95 GiB `HBM2e` at 2765 GB/s (the
/// page wins over `tpu_info`'s 2.46e12); 459 TFLOP/s bf16; ICI 1200 GB/s bidirectional per
/// chip, 3D torus (six links). VMEM 64 MiB, SMEM 1 MiB, MXU 128 wide (`tpu_info`).
/// Megacore: one device per chip. Clock 1.75 GHz: 229.5e12 per TensorCore / (4 · 128² · 2).
const V5P: Target = Target {
    chip: Chip::V5p,
    tensorcores_per_chip: 2,
    tensorcores_per_device: 2,
    vmem_bytes: 64 * MIB,
    default_scoped_vmem_bytes: 16 * MIB,
    smem_bytes: MIB,
    hbm_bytes_per_chip: 95 * GIB,
    hbm_bandwidth_per_chip: 2765.0 * GB,
    mxu: Mxu { count: 4, size: 128 },
    bf16_flops_per_chip: 459.0 * TFLOPS,
    clock_hz: 1.75e9,
    ici: Ici { links_per_chip: 6, bandwidth_per_chip: Some(1200.0 * GB), measured: None },
};

/// v6e (Trillium). Cloud page: 1 TensorCore per chip with two 256×256 MXUs (`tpu_info`
/// agrees: `num_mxus = 2`, column size 256; an older version of the page said four); 32 GiB
/// HBM at 1640 GB/s (`tpu_info`: 1.64e12; another page version rounds to 1600); 918 TFLOP/s
/// bf16; ICI 4 ports, 800 GB/s bidirectional per chip. VMEM 128 MiB, SMEM 1 MiB
/// (`tpu_info`). Clock 1.75 GHz, assumed (the autotuner's figure before this table): Google
/// publishes none, and the evidence disagrees. The peak over four 256² MXUs gives 1.75 GHz,
/// over the two the page now states 3.5 GHz; libtpu's own cycle estimates stream HBM at 1380
/// bytes/cycle on v6e (`autotune/tests/libtpu.rs`, the floor test), which at 1640 GB/s would
/// mean at most 1.19 GHz. Only cycle counts depend on it: the autotuner's ranking within a
/// chip does not.
const V6E: Target = Target {
    chip: Chip::V6e,
    tensorcores_per_chip: 1,
    tensorcores_per_device: 1,
    vmem_bytes: 128 * MIB,
    default_scoped_vmem_bytes: 32 * MIB,
    smem_bytes: MIB,
    hbm_bytes_per_chip: 32 * GIB,
    hbm_bandwidth_per_chip: 1640.0 * GB,
    mxu: Mxu { count: 2, size: 256 },
    bf16_flops_per_chip: 918.0 * TFLOPS,
    clock_hz: 1.75e9,
    ici: Ici { links_per_chip: 4, bandwidth_per_chip: Some(800.0 * GB), measured: None },
};

/// `TPU7x` (Ironwood). Cloud page: 2 TensorCores (and 4 `SparseCores`) per chip, each
/// TensorCore its own device; 192 GiB HBM (96 GiB per device; `tpu_info`: 206e9 / 2);
/// 2307 TFLOP/s bf16. HBM bandwidth 7.40e12 B/s per chip from `tpu_info` (the page's cell
/// could not be read; press coverage of the launch quotes 7.2 to 7.4 TB/s). VMEM 64 MiB,
/// SMEM 1 MiB, two 256×256 MXUs per TensorCore (`tpu_info`). ICI: four links, 1.2 TB/s
/// bidirectional per chip (Google's Ironwood announcement, "9.6 Tbps" aggregate); measured
/// from a Pallas kernel on 4 `TPU7x` chips (a hand-written `816B-A42B` MoE megakernel, TP 8:
/// the project's issue 15): sibling-core remote VMEM copy 101 GB/s at 256 KiB to 610 GB/s
/// at 16 MiB, cross-chip ~45 GB/s per core per direction (134 GB/s over 3 links), four
/// collectives per layer ~14 us at batch 1 (latency-bound, ~3.5 us each). Clock
/// 2.0 GHz, assumed (unpublished; as on v6e, the peak over two MXUs would mean 4.4 GHz, over
/// four 2.2 GHz).
const V7X: Target = Target {
    chip: Chip::V7x,
    tensorcores_per_chip: 2,
    tensorcores_per_device: 1,
    vmem_bytes: 64 * MIB,
    default_scoped_vmem_bytes: 32 * MIB,
    smem_bytes: MIB,
    hbm_bytes_per_chip: 192 * GIB,
    hbm_bandwidth_per_chip: 7400.0 * GB,
    mxu: Mxu { count: 2, size: 256 },
    bf16_flops_per_chip: 2307.0 * TFLOPS,
    clock_hz: 2.0e9,
    ici: Ici {
        links_per_chip: 4,
        bandwidth_per_chip: Some(1200.0 * GB),
        measured: Some(MeasuredLinks {
            sibling_small: (256 * 1024, 101.0 * GB),
            sibling_large: (16 * MIB, 610.0 * GB),
            cross_chip_per_core: 45.0 * GB,
            collective_latency: 3.5e-6,
        }),
    },
};

impl Chip {
    /// The chip's hardware figures.
    pub fn target(self) -> &'static Target {
        match self {
            Chip::V4 => &V4,
            Chip::V5e => &V5E,
            Chip::V5p => &V5P,
            Chip::V6e => &V6E,
            Chip::V7x => &V7X,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chip_has_its_own_target() {
        for chip in Chip::ALL {
            assert_eq!(chip.target().chip, chip);
        }
    }

    #[test]
    fn devices_split_the_chip() {
        // Megacore: the device is the whole chip; v7x: one device per TensorCore.
        let v4 = Chip::V4.target();
        assert_eq!((v4.devices_per_chip(), v4.hbm_bytes_per_device()), (1, 32 * GIB));
        assert_eq!(
            (v4.hbm_bandwidth_per_device(), v4.hbm_bandwidth_per_tensorcore()),
            (1200e9, 600e9)
        );
        assert_eq!(Chip::V5p.target().hbm_bandwidth_per_tensorcore(), 1382.5e9);
        let v7x = Chip::V7x.target();
        assert_eq!((v7x.devices_per_chip(), v7x.hbm_bytes_per_device()), (2, 96 * GIB));
        assert_eq!(v7x.hbm_bandwidth_per_device(), v7x.hbm_bandwidth_per_tensorcore());
        assert_eq!(v7x.bf16_flops_per_device(), 1153.5e12);
        let v6e = Chip::V6e.target();
        assert_eq!((v6e.hbm_bytes_per_device(), v6e.bf16_flops_per_device()), (32 * GIB, 918e12));
    }

    #[test]
    fn ring_hops_follow_the_measured_links() {
        let v7x = Chip::V7x.target();
        let hop = |devices, bytes| {
            v7x.ici.ring_hop(devices, v7x.devices_per_chip(), bytes).expect("v7x is measured")
        };
        // Two devices of one chip: the sibling figures at their sizes, between them in between.
        assert!((hop(2, 256 * 1024).bandwidth - 101e9).abs() < 1.0);
        assert!((hop(2, 16 * MIB).bandwidth - 610e9).abs() < 1.0);
        assert!((hop(2, 1024).bandwidth - 101e9).abs() < 1.0);
        let mid = hop(2, 2 * MIB).bandwidth;
        assert!(mid > 101e9 && mid < 610e9, "{mid}");
        // Across chips the ring runs at its slowest hop, whatever the size.
        assert_eq!(hop(8, 16 * MIB).bandwidth, 45e9);
        // The measured latency is per collective: an 8-device ring all-reduce's 14 hops add
        // up to it.
        assert!((hop(8, 1).hop_latency * f64::from(ANCHOR_ALL_REDUCE_HOPS) - 3.5e-6).abs() < 1e-15);
        // v6e has no measurement: the published 800 GB/s over 4 links and 2 directions.
        let v6e = Chip::V6e.target();
        let h = v6e.ici.ring_hop(4, 1, 1 << 20).expect("v6e publishes ICI");
        assert_eq!((h.bandwidth, h.latency, h.hop_latency), (100e9, 0.0, 0.0));
        assert_eq!(Chip::V4.target().ici.ring_hop(2, 1, 1), None);
    }

    #[test]
    fn derived_clocks_match_the_peak_over_the_mxus() {
        // Where the clock is derived (v4, v5e, v5p), the peak per TensorCore is the MXUs at
        // that clock, one multiply-add per cell per cycle.
        for chip in [Chip::V4, Chip::V5e, Chip::V5p] {
            let t = chip.target();
            let per_cycle = f64::from(t.mxu.count) * f64::from(t.mxu.size).powi(2) * 2.0;
            let clock = t.bf16_flops_per_tensorcore() / per_cycle;
            assert!(
                (clock / t.clock_hz - 1.0).abs() < 0.01,
                "{chip}: {clock} Hz derived, {} Hz in the table",
                t.clock_hz
            );
        }
    }
}
