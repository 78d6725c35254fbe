//! Finding libtpu and naming the deviceless topology of each chip.
//!
//! libtpu comes from the `libtpu` wheel that `scripts/setup.sh` installs into the TPU venv
//! (`jax[tpu]==0.10.2` pulls libtpu 0.0.42.1, PJRT C API 0.112); `PALLADIUM_LIBTPU` names
//! another `libtpu.so`.

use palladium_dsl::spec::Chip;
use std::path::{Path, PathBuf};

/// Environment variable naming a `libtpu.so` to use instead of the venv's.
pub const LIBTPU_ENV: &str = "PALLADIUM_LIBTPU";
/// Environment variable naming the TPU venv (default `~/.cache/palladium/venv-tpu`).
pub const VENV_ENV: &str = "PALLADIUM_TPU_VENV";

/// What libtpu must see in its environment before it is loaded, and why:
/// - `TPU_SKIP_MDS_QUERY=1`: without it libtpu may wait minutes for a GCE metadata server;
/// - `ALLOW_MULTIPLE_LIBTPU_LOAD=1`: otherwise `PJRT_Plugin_Initialize` fails on
///   `/tmp/libtpu_lockfile` while any other process (a parallel compile worker, another test
///   binary) holds libtpu; deviceless compiles share no device, so the lock only gets in the way;
/// - `TF_CPP_MIN_LOG_LEVEL` / `GLOG_minloglevel` = 3: only fatal lines (which say why libtpu
///   aborted) reach stderr.
pub const LIBTPU_ENVIRONMENT: [(&str, &str); 4] = [
    ("TPU_SKIP_MDS_QUERY", "1"),
    ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
    ("TF_CPP_MIN_LOG_LEVEL", "3"),
    ("GLOG_minloglevel", "3"),
];

/// The deviceless slices libtpu compiles for, smallest first per chip, with their device
/// counts (a device as PJRT counts it: a chip on v4/v5e/v5p/v6e, megacore on v4 and v5p; a
/// TensorCore on v7x, two a chip).
const SLICES: &[(Chip, &str, u64)] = &[
    (Chip::V4, "v4:2x2x1", 4),
    (Chip::V4, "v4:2x2x2", 8),
    (Chip::V5e, "v5e:2x2", 4),
    (Chip::V5e, "v5e:2x4", 8),
    (Chip::V5p, "v5p:2x2x1", 4),
    (Chip::V5p, "v5p:2x2x2", 8),
    (Chip::V6e, "v6e:2x2", 4),
    (Chip::V6e, "v6e:2x4", 8),
    (Chip::V7x, "tpu7x:2x2x1", 8),
    (Chip::V7x, "tpu7x:2x2x2", 16),
];

/// The deviceless topology libtpu compiles a program of `devices` devices (its
/// `mhlo.num_partitions`) for on `chip`: the smallest slice of the generation with at least
/// that many (v6e:2x2 has 4 devices; tpu7x:2x2x1 has 8, one per TensorCore). A
/// single-device kernel is compiled for one device of the smallest. `Err` naming the largest
/// slice when none is big enough.
pub fn topology(chip: Chip, devices: u64) -> Result<&'static str, String> {
    let slices = || SLICES.iter().filter(|(c, _, _)| *c == chip);
    slices().find(|(_, _, n)| *n >= devices).map(|(_, name, _)| *name).ok_or_else(|| {
        let (_, name, n) = slices().next_back().expect("every chip has a slice");
        format!("a program for {devices} devices does not fit a deviceless {chip} topology: the largest here is {name} with {n} devices")
    })
}

/// The TPU venv: `$PALLADIUM_TPU_VENV`, else `~/.cache/palladium/venv-tpu`.
pub fn venv() -> Result<PathBuf, String> {
    if let Some(v) = std::env::var_os(VENV_ENV) {
        return Ok(PathBuf::from(v));
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| format!("cannot find the TPU venv: neither {VENV_ENV} nor HOME is set"))?;
    Ok(Path::new(&home).join(".cache/palladium/venv-tpu"))
}

/// Where libtpu is: `$PALLADIUM_LIBTPU` if set (it must exist), else the `libtpu` wheel of the
/// TPU venv (`lib/python3*/site-packages/libtpu/libtpu.so`). The error names every place it
/// looked and how to fix it.
pub fn locate() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(LIBTPU_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{LIBTPU_ENV}={} is not a file", p.display()))
        };
    }
    let venv = venv()?;
    locate_in_venv(&venv).map_err(|looked| {
        format!(
            "libtpu not found: looked for {looked} (run scripts/setup.sh, which installs jax[tpu]==0.10.2 and its libtpu wheel into {}; or set {VENV_ENV} to such a venv, or {LIBTPU_ENV} to a libtpu.so)",
            venv.display()
        )
    })
}

/// `VENV/lib/python3*/site-packages/libtpu/libtpu.so`; the error is the pattern it looked for.
fn locate_in_venv(venv: &Path) -> Result<PathBuf, String> {
    let lib = venv.join("lib");
    let pattern = lib.join("python3*/site-packages/libtpu/libtpu.so").display().to_string();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map_err(|_| pattern.clone())?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/libtpu/libtpu.so"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().ok_or(pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chip_has_a_topology() {
        let names: Vec<&str> = Chip::ALL.iter().map(|&c| topology(c, 1).unwrap()).collect();
        assert_eq!(names, ["v4:2x2x1", "v5e:2x2", "v5p:2x2x1", "v6e:2x2", "tpu7x:2x2x1"]);
        assert_eq!(topology(Chip::V6e, 4), Ok("v6e:2x2"));
        assert_eq!(topology(Chip::V6e, 8), Ok("v6e:2x4"));
        assert_eq!(topology(Chip::V7x, 8), Ok("tpu7x:2x2x1"));
        assert_eq!(topology(Chip::V7x, 16), Ok("tpu7x:2x2x2"));
        let err = topology(Chip::V6e, 16).unwrap_err();
        assert_eq!(
            err,
            "a program for 16 devices does not fit a deviceless v6e topology: the largest here is v6e:2x4 with 8 devices"
        );
    }

    #[test]
    fn a_venv_without_libtpu_names_where_it_looked() {
        let err = locate_in_venv(Path::new("/nonexistent/venv")).unwrap_err();
        assert_eq!(err, "/nonexistent/venv/lib/python3*/site-packages/libtpu/libtpu.so");
    }
}
