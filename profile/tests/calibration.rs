//! The committed calibration table (`profile/calibration.json`) is current: libtpu still
//! gives the recorded estimates of the calibration kernels, and fitting them gives the
//! recorded coefficients. `PALLADIUM_UPDATE_CALIBRATION=1` rewrites the table instead.

use palladium_autotune::Libtpu;
use palladium_autotune::floor::hbm_stream;
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_profile::calibration::{
    CALIBRATION_JSON, Calibration, CalibrationKernel, calibration_kernels, fit,
};

/// The chips the table covers.
const CHIPS: [Chip; 2] = [Chip::V6e, Chip::V7x];

fn build(k: &CalibrationKernel) -> Kernel {
    if k.kernel == "hbm_stream" {
        let mut p = hbm_stream::Params::default();
        for (n, v) in k.settings {
            p.set(n, v).unwrap();
        }
        hbm_stream::build(&p).unwrap()
    } else {
        let settings: Vec<(String, String)> =
            k.settings.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        palladium_kernels::build(k.kernel, &settings).unwrap()
    }
}

#[test]
fn the_calibration_table_is_current() {
    let libtpu = Libtpu::new().unwrap_or_else(|e| panic!("{e}")).with_workers(1);
    // The libtpu version is read as plain JSON: a stale table may not parse as a `Calibration`.
    let committed: serde_json::Value = serde_json::from_str(CALIBRATION_JSON).unwrap();
    // The chips libtpu cannot calibrate are recorded by hand: there is no fit to check them by.
    let not_calibrated =
        serde_json::from_value(committed["not_calibrated"].clone()).unwrap_or_default();
    let mut table = Calibration {
        libtpu: committed["libtpu"].as_str().unwrap().to_string(),
        chips: Default::default(),
        not_calibrated,
    };
    for chip in CHIPS {
        let kernels: Vec<Kernel> = calibration_kernels(chip).iter().map(build).collect();
        let refs: Vec<&Kernel> = kernels.iter().collect();
        let results = libtpu.cycles(&refs, chip);
        let failed: Vec<String> = calibration_kernels(chip)
            .iter()
            .zip(&results)
            .filter_map(|(k, r)| r.as_ref().err().map(|e| format!("{}: {e}", k.name)))
            .collect();
        assert!(failed.is_empty(), "{chip}: libtpu gives no estimate of {failed:#?}");
        let cycles: Vec<u64> = results.into_iter().map(Result::unwrap).collect();
        let fitted = fit(chip, &kernels, &cycles, table.chips.get("v6e").map(|c| &c.coefficients))
            .unwrap_or_else(|e| panic!("{chip}: {e}"));
        eprintln!("{chip}: {cycles:?} -> {:?}", fitted.coefficients);
        table.chips.insert(chip.name().to_string(), fitted);
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/calibration.json");
    if std::env::var_os("PALLADIUM_UPDATE_CALIBRATION").is_some() {
        std::fs::write(path, serde_json::to_string_pretty(&table).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(
        table,
        Calibration::committed(),
        "profile/calibration.json is stale: rerun with PALLADIUM_UPDATE_CALIBRATION=1"
    );
}
