//! The host-memory limit of the CPU-side commands (`palladium run`, which interprets a whole
//! model, and `palladium interpret`): what a command will allocate is computed before anything is allocated and refused
//! above the limit, with the numbers and how to raise it, instead of aborting mid-way.
//! libtpu's compile worker (`compile`, `megakernel --compile`) cannot be sized up front: it
//! is stopped when its resident memory passes the limit ([`crate::compile`]).
//!
//! The limit is `PALLADIUM_MAX_HOST_MEMORY` (bytes, or a number with a `KiB`, `MiB`, `GiB` or
//! `TiB` suffix: `PALLADIUM_MAX_HOST_MEMORY=48GiB`); when unset, [`DEFAULT_LIMIT`] for what is
//! sized up front and three quarters of the machine's memory for a compile worker
//! ([`compile_limit`]).

/// The environment variable that sets the limit.
pub const ENV: &str = "PALLADIUM_MAX_HOST_MEMORY";

/// 8 GiB: a laptop's worth, far above the tiny models interpret mode is for.
pub const DEFAULT_LIMIT: u64 = 8 << 30;

const GIB: f64 = (1u64 << 30) as f64;

/// The limit in bytes: `PALLADIUM_MAX_HOST_MEMORY`, or [`DEFAULT_LIMIT`].
pub fn limit() -> Result<u64, String> {
    limit_or(DEFAULT_LIMIT)
}

/// The limit of a libtpu compile worker: `PALLADIUM_MAX_HOST_MEMORY`, or three quarters of
/// the machine's memory. Unlike `run`, a compile cannot be sized up front and only a machine
/// it would exhaust is worth stopping it for: libtpu's static estimator takes up to ~15 GB on
/// a real model's megakernel, and a fixed laptop-sized default would drop those estimates.
pub fn compile_limit() -> Result<u64, String> {
    limit_or(physical_memory().map_or(DEFAULT_LIMIT, |total| total / 4 * 3))
}

fn limit_or(default: u64) -> Result<u64, String> {
    match std::env::var(ENV) {
        Ok(v) => parse(&v).map_err(|e| format!("{ENV}={v:?}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => Err(format!("{ENV}: {e}")),
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes (`None` where it cannot be read).
fn physical_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 =
        line.trim_start_matches("MemTotal:").trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// `"1073741824"`, `"1GiB"`, `"1.5 GiB"`, `"512MiB"`.
pub fn parse(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (s[..i].trim(), &s[i..]),
        None => (s, ""),
    };
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(format!("unknown unit {unit:?} (write bytes, or KiB, MiB, GiB, TiB)")),
    };
    // A whole number of bytes exactly; anything else (a fraction, a unit) through f64.
    if let (1, Ok(bytes)) = (scale, number.parse::<u64>()) {
        return if bytes == 0 { Err(NOT_POSITIVE.into()) } else { Ok(bytes) };
    }
    let x: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let bytes = x * scale as f64;
    if bytes < 1.0 {
        return Err(NOT_POSITIVE.into());
    }
    // 2^64 as f64: the first size past the largest (`u64::MAX`).
    if bytes >= u64::MAX as f64 {
        return Err(format!(
            "too large: the largest limit is {} bytes (16 EiB, no limit at all in practice)",
            u64::MAX
        ));
    }
    Ok(bytes as u64)
}

const NOT_POSITIVE: &str = "must be a positive size (at least 1 byte), e.g. 48GiB";

/// Ok when `need` bytes (made of `parts`: name and bytes) are within [`limit`]; otherwise an
/// error stating what, how much, the limit and how to raise it.
pub fn check(what: &str, need: u64, parts: &[(&str, u64)]) -> Result<(), String> {
    check_within(limit()?, what, need, parts)
}

/// [`check`] against a given limit (a caller that read [`limit`] once, up front).
pub fn check_within(
    limit: u64,
    what: &str,
    need: u64,
    parts: &[(&str, u64)],
) -> Result<(), String> {
    if need <= limit {
        return Ok(());
    }
    let parts: Vec<String> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|(n, b)| format!("{n} {:.2} GiB", *b as f64 / GIB))
        .collect();
    Err(format!(
        "{what} needs {need} bytes ({:.2} GiB: {}) of host memory, over the limit of {limit} bytes ({:.2} GiB); raise it with {ENV}=<bytes or e.g. 64GiB> if this machine has the memory",
        need as f64 / GIB,
        parts.join(" + "),
        limit as f64 / GIB
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_memory_is_read() {
        let total = physical_memory().expect("/proc/meminfo has MemTotal");
        assert!(total >= 1 << 28, "{total}");
    }

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse("1073741824"), Ok(1 << 30));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse("512MiB"), Ok(1 << 29));
        assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
        for bad in ["", "GiB", "-1", "0", "1GB", "nan", "1e30 TiB"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// Too large and not positive are different mistakes, told apart.
    #[test]
    fn a_size_too_large_is_not_called_non_positive() {
        for big in ["99999999999999999999999", "18446744073709551616", "16777216 TiB"] {
            let err = parse(big).unwrap_err();
            assert!(
                err.starts_with("too large: the largest limit is 18446744073709551615 bytes"),
                "{big}: {err}"
            );
        }
        for small in ["0", "-1", "0.5", "-3GiB"] {
            assert_eq!(parse(small).unwrap_err(), NOT_POSITIVE, "{small}");
        }
    }
}
