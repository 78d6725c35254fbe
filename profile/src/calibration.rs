//! The model's coefficients per chip, fitted to libtpu's static estimates of small isolated
//! kernels ([`CALIBRATION_KERNELS`]) and committed as `profile/calibration.json`.
//!
//! Why a committed table and not a lazy fit: libtpu is optional at run time (a user may have
//! no TPU venv), the fit takes a minute of compiles, and a table in the repository is
//! reviewable. `profile/tests/calibration.rs` recompiles the calibration kernels, checks that
//! libtpu still gives the recorded estimates and that [`fit`] of them gives the recorded
//! coefficients; `PALLADIUM_UPDATE_CALIBRATION=1` rewrites the file instead.
//!
//! Which figures are fitted and which are assumed is part of the table (`fitted`): libtpu's
//! estimator prices the HBM stream, the grid-step overhead, the DMA latency and the MXU
//! well enough to isolate each with one kernel; on v6e the VPU, EUP, cross-lane and
//! load/store rates are assumed (one vreg per cycle per op; two for transcendentals), since
//! every library kernel hides them under its DMAs and libtpu's estimate of them cannot be
//! isolated from the DMA cost.
//!
//! v7x has its own recipe ([`V7X_CALIBRATION_KERNELS`]): libtpu 0.0.42.1's v7x estimator
//! aborts on the v6e kernels (multi-step streams and accumulators branch on the grid index,
//! `LloOpcodeIsScalarBranch`; HBM operands over 8 MiB; even one manual HBM -> VMEM copy in
//! a single grid step: "No DMA issue node found for sync flag: 0"). It prices branch-free
//! `residual_add` streams within 8 MiB and single-step matmul and GEMV: the HBM rate, one
//! factor on the assumed vector rates, the grid-step cost and the MXU are fitted to them;
//! the DMA latency, which none of them isolates, is v6e's in nanoseconds (recorded in
//! `derived`).

use crate::{Inputs, ProfileError, simulate};
use indexmap::IndexMap;
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use serde::{Deserialize, Serialize};

/// The coefficients of one chip, in libtpu's cycles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coefficients {
    /// HBM bytes per cycle of one device, shared fairly by every DMA in flight.
    pub hbm_bytes_per_cycle: f64,
    /// Cycles from a DMA's start to its first byte moving.
    pub dma_latency_cycles: f64,
    /// Fixed cost of one grid step of the Pallas pipeline (semaphore waits, issue, loop).
    pub grid_step_cycles: f64,
    /// MXU cycles to load one `s x s` weight tile (`s` the MXU size): a `dot` of
    /// `m x k @ k x n` makes `k/s * n/s` passes (in 128-wide steps), each costing
    /// `max(mxu_weight_cycles, ceil8(m) * mxu_row_cycles)` (the next tile loads while rows
    /// stream), spread over the MXUs. Weight loads bound a GEMV (few rows), rows a matmul.
    pub mxu_weight_cycles: f64,
    /// MXU cycles per LHS row of one pass.
    pub mxu_row_cycles: f64,
    /// VPU cycles per result vreg of an elementwise op (also iota, broadcast, select, cast).
    pub vpu_cycles_per_vreg: f64,
    /// EUP cycles per result vreg of a transcendental (exp, log, tanh, rsqrt, divide...).
    pub eup_cycles_per_vreg: f64,
    /// Cross-lane (XLU) cycles per input vreg of a reduction, transpose or roll.
    pub xlu_cycles_per_vreg: f64,
    /// Load/store slot cycles per vreg moved between VMEM and registers.
    pub ldst_cycles_per_vreg: f64,
    /// Scalar-unit cycles per scalar op (address arithmetic, loop bookkeeping, DMA issue).
    pub scalar_cycles: f64,
    /// Bytes per cycle of a DMA between on-chip memories (VMEM/SMEM), assumed.
    pub local_dma_bytes_per_cycle: f64,
    /// The fixed cost of one kernel call when a step is split into library kernels: libtpu's
    /// estimate of a minimal call (`residual_add` of one 16 x 128 block), taken as is. No
    /// published figure for a `pallas_call`'s launch cost exists; this is a stand-in.
    pub kernel_call_cycles: f64,
}

/// One chip's entry: the coefficients, which of them were fitted, and the libtpu
/// estimates they were fitted to (cycles by calibration kernel name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChipCalibration {
    pub coefficients: Coefficients,
    pub fitted: Vec<String>,
    pub libtpu_cycles: IndexMap<String, u64>,
    /// Coefficients neither fitted nor assumed but derived from another chip's fit, and how
    /// (v7x's HBM rate and DMA latency, which its estimator cannot isolate).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub derived: IndexMap<String, String>,
}

/// The committed table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The libtpu the estimates come from.
    pub libtpu: String,
    pub chips: IndexMap<String, ChipCalibration>,
    /// Chips this libtpu's estimator cannot calibrate, and why (recorded by hand from the
    /// failed fits, so that `palladium profile` can say so instead of suggesting a refit).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub not_calibrated: IndexMap<String, String>,
}

/// The committed table, `profile/calibration.json`.
pub const CALIBRATION_JSON: &str = include_str!("../calibration.json");

impl Calibration {
    pub fn committed() -> Calibration {
        serde_json::from_str(CALIBRATION_JSON)
            .expect("profile/calibration.json parses (checked by its test)")
    }

    /// The coefficients for `chip`, or which chips are calibrated and why `chip` is not.
    pub fn chip(&self, chip: Chip) -> Result<&Coefficients, ProfileError> {
        self.chips.get(chip.name()).map(|c| &c.coefficients).ok_or_else(|| ProfileError::NotCalibrated {
            chip: chip.name().into(),
            calibrated: self.chips.keys().cloned().collect::<Vec<_>>().join(", "),
            remedy: match self.not_calibrated.get(chip.name()) {
                Some(why) => format!("libtpu {} cannot calibrate it: {why}", self.libtpu),
                None => "add it with `PALLADIUM_UPDATE_CALIBRATION=1 cargo test -p palladium-profile --test tests calibration::` (needs libtpu)".into(),
            },
        })
    }
}

/// A calibration kernel: its name in the table, what it isolates, and its settings.
#[derive(Copy, Clone, Debug)]
pub struct CalibrationKernel {
    pub name: &'static str,
    /// The library kernel (`hbm_stream` is the autotuner's floor kernel).
    pub kernel: &'static str,
    pub settings: &'static [(&'static str, &'static str)],
}

/// The kernels [`fit`] reads, in fit order: two plain streams of 4 MiB blocks give the HBM
/// rate (their difference) and the DMA latency (what is left of the smaller one); a stream of
/// 256 KiB blocks (256 steps) the grid-step cost; a matmul whose blocks make it MXU-bound
/// (1024 rows per pass) the MXU's row rate, and an 8-row GEMV its weight-load cost (the two
/// fitted in turn until they settle). The last, a minimal call, is not fitted: its estimate
/// is the per-call cost of an unfused step.
pub const CALIBRATION_KERNELS: [CalibrationKernel; 6] = [
    CalibrationKernel {
        name: "stream_32mib",
        kernel: "hbm_stream",
        settings: &[("rows", "16384")],
    },
    CalibrationKernel {
        name: "stream_64mib",
        kernel: "hbm_stream",
        settings: &[("rows", "32768")],
    },
    CalibrationKernel {
        name: "stream_64mib_small_blocks",
        kernel: "hbm_stream",
        settings: &[("rows", "32768"), ("block_rows", "128")],
    },
    CalibrationKernel {
        name: "matmul_mxu_bound",
        kernel: "matmul",
        settings: &[
            ("m", "2048"),
            ("k", "4096"),
            ("n", "2048"),
            ("bm", "1024"),
            ("bk", "1024"),
            ("bn", "1024"),
        ],
    },
    CalibrationKernel {
        name: "gemv_weight_bound",
        kernel: "gemv",
        settings: &[
            ("batch", "8"),
            ("k", "4096"),
            ("n", "4096"),
            ("block_k", "4096"),
            ("block_n", "512"),
        ],
    },
    CalibrationKernel {
        name: "minimal_call",
        kernel: "residual_add",
        settings: &[("rows", "16"), ("hidden", "128"), ("block_rows", "16")],
    },
];

/// v7x's calibration kernels, in fit order (see the module doc): `residual_add` streams of
/// 4096 and 2048 x 1024 bf16 in 1024-row blocks (the HBM rate from their difference, one
/// factor on the assumed vector rates from the larger) and of 4096 x 1024 in 64-row blocks
/// (the grid-step cost); a single-step 1024-square matmul (the MXU row rate) and a
/// single-step 8-row GEMV (the MXU weight load); the minimal call, as on v6e.
pub const V7X_CALIBRATION_KERNELS: [CalibrationKernel; 6] = [
    CalibrationKernel {
        name: "residual_add_4096_rows",
        kernel: "residual_add",
        settings: &[("rows", "4096"), ("hidden", "1024"), ("block_rows", "1024")],
    },
    CalibrationKernel {
        name: "residual_add_2048_rows",
        kernel: "residual_add",
        settings: &[("rows", "2048"), ("hidden", "1024"), ("block_rows", "1024")],
    },
    CalibrationKernel {
        name: "residual_add_64_row_blocks",
        kernel: "residual_add",
        settings: &[("rows", "4096"), ("hidden", "1024"), ("block_rows", "64")],
    },
    CalibrationKernel {
        name: "matmul_one_step",
        kernel: "matmul",
        settings: &[
            ("m", "1024"),
            ("k", "1024"),
            ("n", "1024"),
            ("bm", "1024"),
            ("bk", "1024"),
            ("bn", "1024"),
        ],
    },
    CalibrationKernel {
        name: "gemv_one_step",
        kernel: "gemv",
        settings: &[
            ("batch", "8"),
            ("k", "4096"),
            ("n", "512"),
            ("block_k", "4096"),
            ("block_n", "512"),
        ],
    },
    CalibrationKernel {
        name: "minimal_call",
        kernel: "residual_add",
        settings: &[("rows", "16"), ("hidden", "128"), ("block_rows", "16")],
    },
];

/// The calibration kernels of `chip`'s recipe.
pub fn calibration_kernels(chip: Chip) -> &'static [CalibrationKernel] {
    match chip {
        Chip::V7x => &V7X_CALIBRATION_KERNELS,
        _ => &CALIBRATION_KERNELS,
    }
}

/// The assumed coefficients every fit starts from (see the module doc).
fn assumed() -> Coefficients {
    Coefficients {
        hbm_bytes_per_cycle: 1.0,
        dma_latency_cycles: 0.0,
        grid_step_cycles: 0.0,
        mxu_weight_cycles: 0.0,
        mxu_row_cycles: 1.0,
        vpu_cycles_per_vreg: 1.0,
        eup_cycles_per_vreg: 2.0,
        xlu_cycles_per_vreg: 1.0,
        ldst_cycles_per_vreg: 1.0,
        scalar_cycles: 1.0,
        local_dma_bytes_per_cycle: 512.0,
        kernel_call_cycles: 0.0,
    }
}

/// Fit `chip`'s coefficients to libtpu's estimates of the calibration kernels (`kernels[i]`
/// is [`calibration_kernels`]`(chip)[i]` built, `cycles[i]` its estimate). Each fitted
/// coefficient is found by bisection so that the model reproduces its kernel's estimate,
/// the ones before it already fixed. v7x needs v6e's fit (`v6e`) for what it derives.
pub fn fit(
    chip: Chip,
    kernels: &[Kernel],
    cycles: &[u64],
    v6e: Option<&Coefficients>,
) -> Result<ChipCalibration, ProfileError> {
    let recipe = calibration_kernels(chip);
    assert_eq!(
        (kernels.len(), cycles.len()),
        (recipe.len(), recipe.len()),
        "one kernel and one estimate per calibration kernel"
    );
    if chip == Chip::V7x {
        let v6e = v6e.ok_or_else(|| {
            ProfileError::Calibration(
                "v7x's HBM rate and DMA latency are derived from v6e's fit: fit v6e first".into(),
            )
        })?;
        return fit_v7x(kernels, cycles, v6e);
    }
    let bytes = |k: &Kernel| -> f64 {
        k.call
            .operands
            .iter()
            .filter(|o| o.role == palladium_dsl::spec::OperandRole::Input)
            .map(|o| (o.shape.num_elements() * u64::from(o.dtype.memory_bits())) as f64 / 8.0)
            .sum()
    };
    let mut c = assumed();
    // The HBM rate: the 32 MiB more of the second stream cost only bandwidth.
    c.hbm_bytes_per_cycle =
        (bytes(&kernels[1]) - bytes(&kernels[0])) / (cycles[1] as f64 - cycles[0] as f64);
    let model = |c: &Coefficients, k: &Kernel| -> Result<f64, ProfileError> {
        Ok(simulate(k, chip, c, &Inputs::default())?.cycles)
    };
    c.dma_latency_cycles = bisect(0.0, 20_000.0, cycles[0] as f64, |x| {
        model(&Coefficients { dma_latency_cycles: x, ..c.clone() }, &kernels[0])
    })?;
    c.grid_step_cycles = bisect(0.0, 20_000.0, cycles[2] as f64, |x| {
        model(&Coefficients { grid_step_cycles: x, ..c.clone() }, &kernels[2])
    })?;
    for _ in 0..8 {
        c.mxu_row_cycles = bisect(0.0, 64.0, cycles[3] as f64, |x| {
            model(&Coefficients { mxu_row_cycles: x, ..c.clone() }, &kernels[3])
        })?;
        c.mxu_weight_cycles = bisect(0.0, 8192.0, cycles[4] as f64, |x| {
            model(&Coefficients { mxu_weight_cycles: x, ..c.clone() }, &kernels[4])
        })?;
    }
    c.kernel_call_cycles = cycles[5] as f64;
    let round = |x: f64| (x * 1e4).round() / 1e4;
    c.hbm_bytes_per_cycle = round(c.hbm_bytes_per_cycle);
    c.dma_latency_cycles = round(c.dma_latency_cycles);
    c.grid_step_cycles = round(c.grid_step_cycles);
    c.mxu_row_cycles = round(c.mxu_row_cycles);
    c.mxu_weight_cycles = round(c.mxu_weight_cycles);
    Ok(ChipCalibration {
        coefficients: c,
        fitted: [
            "hbm_bytes_per_cycle",
            "dma_latency_cycles",
            "grid_step_cycles",
            "mxu_row_cycles",
            "mxu_weight_cycles",
        ]
        .map(String::from)
        .to_vec(),
        libtpu_cycles: CALIBRATION_KERNELS
            .iter()
            .zip(cycles)
            .map(|(k, &c)| (k.name.to_string(), c))
            .collect(),
        derived: IndexMap::new(),
    })
}

/// v7x's recipe ([`V7X_CALIBRATION_KERNELS`]): the DMA latency derived from v6e's fit
/// (`v6e`: the same nanoseconds at v7x's clock); then, in turn until they settle (the
/// first pass with free vector ops), the HBM rate (the 4096-row stream in 1024-row blocks),
/// the grid-step cost (the 64-row-block stream), the vector factor (the 2048-row stream:
/// VPU, cross-lane and load/store at the factor, EUP at twice it), the MXU row rate (the
/// matmul) and its weight load (the GEMV).
fn fit_v7x(
    kernels: &[Kernel],
    cycles: &[u64],
    v6e: &Coefficients,
) -> Result<ChipCalibration, ProfileError> {
    let (chip, t6) = (Chip::V7x, Chip::V6e.target());
    let t7 = chip.target();
    let mut c = assumed();
    c.dma_latency_cycles = v6e.dma_latency_cycles / t6.clock_hz * t7.clock_hz;
    let model = |c: &Coefficients, k: &Kernel| -> Result<f64, ProfileError> {
        Ok(simulate(k, chip, c, &Inputs::default())?.cycles)
    };
    let vector = |c: &Coefficients, x: f64| Coefficients {
        vpu_cycles_per_vreg: x,
        eup_cycles_per_vreg: 2.0 * x,
        xlu_cycles_per_vreg: x,
        ldst_cycles_per_vreg: x,
        ..c.clone()
    };
    c = vector(&c, 0.0);
    for _ in 0..8 {
        // Cycles per byte, so that the model's cycles grow with it.
        let per_byte = bisect(1e-5, 1e-2, cycles[0] as f64, |x| {
            model(&Coefficients { hbm_bytes_per_cycle: 1.0 / x, ..c.clone() }, &kernels[0])
        })?;
        c.hbm_bytes_per_cycle = 1.0 / per_byte;
        c.grid_step_cycles = bisect(0.0, 20_000.0, cycles[2] as f64, |x| {
            model(&Coefficients { grid_step_cycles: x, ..c.clone() }, &kernels[2])
        })?;
        let factor = bisect(0.0, 8.0, cycles[1] as f64, |x| model(&vector(&c, x), &kernels[1]))?;
        c = vector(&c, factor);
        c.mxu_row_cycles = bisect(0.0, 64.0, cycles[3] as f64, |x| {
            model(&Coefficients { mxu_row_cycles: x, ..c.clone() }, &kernels[3])
        })?;
        c.mxu_weight_cycles = bisect(0.0, 8192.0, cycles[4] as f64, |x| {
            model(&Coefficients { mxu_weight_cycles: x, ..c.clone() }, &kernels[4])
        })?;
    }
    c.kernel_call_cycles = cycles[5] as f64;
    let round = |x: f64| (x * 1e4).round() / 1e4;
    for x in [
        &mut c.hbm_bytes_per_cycle,
        &mut c.dma_latency_cycles,
        &mut c.grid_step_cycles,
        &mut c.mxu_row_cycles,
        &mut c.mxu_weight_cycles,
        &mut c.vpu_cycles_per_vreg,
    ] {
        *x = round(*x);
    }
    c = vector(&c, c.vpu_cycles_per_vreg);
    let derived = IndexMap::from([(
        "dma_latency_cycles".to_string(),
        format!(
            "v6e's fitted {:.4} cycles at {:.2} GHz, the same time at {:.2} GHz: libtpu aborts on every v7x kernel that would isolate it (multi-step streams branch on the grid index; operands over 8 MiB; even one manual HBM -> VMEM copy in one grid step: \"No DMA issue node found for sync flag: 0\")",
            v6e.dma_latency_cycles,
            t6.clock_hz / 1e9,
            t7.clock_hz / 1e9
        ),
    )]);
    Ok(ChipCalibration {
        coefficients: c,
        fitted: [
            "hbm_bytes_per_cycle",
            "vpu_cycles_per_vreg",
            "eup_cycles_per_vreg",
            "xlu_cycles_per_vreg",
            "ldst_cycles_per_vreg",
            "grid_step_cycles",
            "mxu_row_cycles",
            "mxu_weight_cycles",
        ]
        .map(String::from)
        .to_vec(),
        libtpu_cycles: V7X_CALIBRATION_KERNELS
            .iter()
            .zip(cycles)
            .map(|(k, &c)| (k.name.to_string(), c))
            .collect(),
        derived,
    })
}

/// The `x` in `lo..hi` where the increasing `f(x)` reaches `target` (to 1e-4 relative), or
/// an error saying the target is out of the model's reach.
fn bisect(
    mut lo: f64,
    mut hi: f64,
    target: f64,
    f: impl Fn(f64) -> Result<f64, ProfileError>,
) -> Result<f64, ProfileError> {
    let (flo, fhi) = (f(lo)?, f(hi)?);
    if !(flo <= target && target <= fhi) {
        return Err(ProfileError::Calibration(format!(
            "libtpu's {target} cycles are outside the model's range {flo:.0}..{fhi:.0} for this coefficient"
        )));
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if f(mid)? < target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-4 * hi.max(1e-9) {
            break;
        }
    }
    Ok(0.5 * (lo + hi))
}
