//! The benches' figure tables in the docs book: a bench that reports a table also rewrites
//! its page under `docs/benchmarks/`, headed by the machine, the date and the command that
//! made it, so the book's tables are the benches' own output and never copied by hand.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// A markdown table printed as it grows and kept for the docs page.
pub struct Table {
    lines: Vec<String>,
}

impl Table {
    /// A table with its header row and its alignment row (`|---|---:|`), both printed.
    pub fn new(header: &str, rule: &str) -> Table {
        println!("{header}");
        println!("{rule}");
        Table { lines: vec![header.to_string(), rule.to_string()] }
    }

    /// Print `row` and keep it.
    pub fn row(&mut self, row: String) {
        println!("{row}");
        self.lines.push(row);
    }

    /// The table as markdown, one line a row.
    pub fn markdown(&self) -> String {
        self.lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// Rewrite `docs/benchmarks/<file>` with `title`, the header (machine, date, `command`) and
/// `body` (markdown: the tables and what they measured), atomically: a temporary sibling
/// renamed into place, so an interrupted run leaves the old page whole. A failure is
/// printed, not fatal: the figures are on stdout either way.
pub fn write_page(file: &str, title: &str, command: &str, body: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks");
    let path = dir.join(file);
    let page = format!(
        "# {title}\n\n\
         Written by `{command}` on {machine}, {date} (UTC). Do not edit: the bench's next run \
         replaces this page.\n\n{body}",
        machine = machine(),
        date = utc_date(SystemTime::now()),
    );
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, page))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match written {
        Ok(()) => println!("(table written to {})", path.display()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            println!("(could not write {}: {e})", path.display())
        }
    }
}

/// The CPU model (`/proc/cpuinfo`'s first `model name`) and the cores this process may use.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores")
}

/// `YYYY-MM-DD` of `t` in UTC (the proleptic Gregorian calendar, from days since 1970).
fn utc_date(t: SystemTime) -> String {
    let days = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
