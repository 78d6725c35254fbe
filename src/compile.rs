//! `palladium compile` and `palladium megakernel --compile`: a lowered kernel compiled by
//! libtpu, deviceless, through the runtime crate's workers (PJRT), with its code size, memory
//! stats and libtpu's static cycle estimate. The worker is held to the host-memory limit
//! ([`crate::host_memory`]), and a long compile shows that it is alive on stderr.

use palladium_dsl::spec::Chip;
use palladium_lowering::Lowered;
use palladium_runtime::{CallSpec, Compiled, Compiler, Estimate, Job, wrap};
use serde_json::{Value as Json, json};
use std::time::{Duration, Instant};

/// A kernel compiled for a chip.
#[derive(Debug)]
pub struct CompileReport {
    pub kernel: String,
    pub chip: Chip,
    /// The StableHLO program libtpu compiled (`KERNEL.stablehlo.mlir`).
    pub stablehlo: String,
    /// The scoped VMEM the kernel is compiled against: its `vmem_limit_bytes`, else the
    /// chip's default (PJRT's memory stats cover HBM only).
    pub vmem_limit_bytes: u64,
    /// The devices the program runs on (1 but for a mesh kernel) and the deviceless
    /// topology libtpu compiled it for (`palladium_runtime::libtpu::topology`).
    pub devices: u64,
    pub topology: &'static str,
    pub compiled: Compiled,
}

/// Wrap `lowered` and compile it for `chip` with libtpu's estimate (a compile the estimator
/// aborts is compiled again without it; `estimate_note` then says why there is no estimate),
/// in a worker stopped past `memory_limit` bytes (the command's
/// [`crate::host_memory::limit`], read before any work).
pub fn compile(lowered: &Lowered, chip: Chip, memory_limit: u64) -> Result<CompileReport, String> {
    let spec = CallSpec::from_json(&lowered.call_json)?;
    let stablehlo = wrap(&lowered.body, &spec)?;
    let devices = spec.devices.unwrap_or(1);
    // Refused here, before a worker starts, when no slice of the chip has the devices.
    let topology = palladium_runtime::libtpu::topology(chip, devices)
        .map_err(|e| format!("cannot compile `{}` for {chip}: {e}", spec.name))?;
    let compiler = Compiler::new(Estimate::Yes)
        .map_err(|e| e.to_string())?
        .with_workers(1)
        .with_memory_limit(memory_limit, crate::host_memory::ENV);
    let job = Job { program: stablehlo.clone(), chip, serialize: true };
    let what = format!("compiling `{}` for {chip} with libtpu", spec.name);
    let compiled = with_progress(&what, &compiler, || {
        compiler
            .compile_all_estimated(std::slice::from_ref(&job))
            .pop()
            .expect("one result per job")
    });
    let mut compiled =
        compiled.map_err(|e| format!("cannot compile `{}` for {chip}: {e}", spec.name))?;
    if spec.has_communication == Some(true) {
        withhold_estimate(&mut compiled, devices);
    }
    let vmem_limit_bytes =
        spec.vmem_limit_bytes.unwrap_or_else(|| chip.target().default_scoped_vmem_bytes);
    Ok(CompileReport {
        kernel: spec.name,
        chip,
        stablehlo,
        vmem_limit_bytes,
        devices,
        topology,
        compiled,
    })
}

/// No cycle figure for a kernel that communicates: libtpu's static estimator prices remote
/// DMAs and semaphore signals at 0 cycles, so what it reports (the copies around the custom
/// call) says nothing about the kernel's own time. `estimate_note` says so.
fn withhold_estimate(compiled: &mut Compiled, devices: u64) {
    let priced = compiled
        .estimated_cycles
        .map_or(String::new(), |n| format!(" (it reports {n} cycles, the copies around the call)"));
    compiled.estimate_note = Some(format!(
        "not given for a kernel that communicates ({devices} devices): libtpu's static estimator prices remote DMAs at 0 cycles{priced}"
    ));
    compiled.estimated_cycles = None;
    compiled.ops.clear();
}

/// Runs `f` (a compile by `compiler`) while showing that it is alive on stderr: on a
/// terminal a spinner with the elapsed time and the worker's memory; otherwise a line after
/// [`Ticker::QUIET_FOR`] and then every [`Ticker::LINE_EVERY`] (a quick compile prints
/// nothing).
fn with_progress<T>(what: &str, compiler: &Compiler, f: impl FnOnce() -> T) -> T {
    use std::io::IsTerminal;
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let start = Instant::now();
            let spinner = std::io::stderr().is_terminal().then(|| {
                let bar = indicatif::ProgressBar::new_spinner();
                bar.set_style(
                    indicatif::ProgressStyle::with_template("{spinner} {msg}")
                        .expect("a valid template"),
                );
                bar
            });
            let mut ticker = Ticker { start, last_line: None };
            // Until `f` returns (the sender is dropped).
            while wait
                .recv_timeout(Duration::from_millis(200))
                .is_err_and(|e| e == std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                let now = Instant::now();
                let resident = compiler.resident_bytes();
                match &spinner {
                    Some(bar) => {
                        bar.set_message(Ticker::status(what, now - start, resident));
                        bar.tick();
                    }
                    None => {
                        if let Some(line) = ticker.line(what, now, resident) {
                            eprintln!("{line}");
                        }
                    }
                }
            }
            if let Some(bar) = spinner {
                bar.finish_and_clear();
            }
        });
        let result = f();
        drop(done);
        result
    })
}

/// When a compile's progress line is due where stderr is not a terminal.
#[derive(Debug)]
struct Ticker {
    start: Instant,
    last_line: Option<Instant>,
}

impl Ticker {
    /// No line before this: most compiles take a second or two.
    const QUIET_FOR: Duration = Duration::from_secs(5);
    const LINE_EVERY: Duration = Duration::from_secs(10);

    fn line(&mut self, what: &str, now: Instant, resident: u64) -> Option<String> {
        let elapsed = now.saturating_duration_since(self.start);
        let due = match self.last_line {
            None => elapsed >= Self::QUIET_FOR,
            Some(t) => now.saturating_duration_since(t) >= Self::LINE_EVERY,
        };
        if !due {
            return None;
        }
        self.last_line = Some(now);
        Some(Self::status(what, elapsed, resident))
    }

    /// `compiling `matmul` for v6e with libtpu: 12 s, worker 3.10 GiB of host memory`.
    fn status(what: &str, elapsed: Duration, resident: u64) -> String {
        let memory = if resident > 0 {
            format!(", worker {:.2} GiB of host memory", resident as f64 / (1u64 << 30) as f64)
        } else {
            String::new()
        };
        format!("{what}: {:.0} s{memory}", elapsed.as_secs_f64())
    }
}

impl CompileReport {
    /// `ok`, `chip`, `devices`, `topology`, `code_size_bytes`, `vmem_limit_bytes`, `hbm`, `estimated_cycles`,
    /// `estimate_note`, `ops`.
    pub fn json(&self) -> Json {
        let c = &self.compiled;
        json!({
            "ok": true,
            "kernel": self.kernel,
            "chip": self.chip.name(),
            "devices": self.devices,
            "topology": self.topology,
            "code_size_bytes": c.code_size_bytes,
            "vmem_limit_bytes": self.vmem_limit_bytes,
            "hbm": c.hbm,
            "estimated_cycles": c.estimated_cycles,
            "estimate_note": c.estimate_note,
            "ops": c.ops,
        })
    }

    pub fn text(&self) -> String {
        let c = &self.compiled;
        let estimate = match (c.estimated_cycles, &c.estimate_note) {
            (Some(n), _) => format!("{n} cycles (libtpu's static estimate)"),
            (None, Some(why)) => format!("none: {why}"),
            (None, None) => "none".into(),
        };
        let devices = if self.devices > 1 {
            format!(", {} devices of {}", self.devices, self.topology)
        } else {
            String::new()
        };
        format!(
            "{} compiled by libtpu for {} (deviceless{devices})\n  code size        {} bytes\n  VMEM limit       {} bytes\n  HBM              arguments {} B, outputs {} B, aliased {} B, temporaries {} B, peak {} B\n  estimated cycles {estimate}\n",
            self.kernel,
            self.chip,
            c.code_size_bytes,
            self.vmem_limit_bytes,
            c.hbm.argument_bytes,
            c.hbm.output_bytes,
            c.hbm.alias_bytes,
            c.hbm.temp_bytes,
            c.hbm.peak_bytes
        )
    }

    /// `NAME.stablehlo.mlir` and `NAME.executable` (the serialized PJRT executable).
    pub fn files(&self, name: &str) -> Vec<(String, Vec<u8>)> {
        vec![
            (format!("{name}.stablehlo.mlir"), self.stablehlo.clone().into_bytes()),
            (format!("{name}.executable"), self.compiled.executable.clone().unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_wait_then_repeat() {
        let mut t = Ticker { start: Instant::now(), last_line: None };
        let at = |s: u64| t.start + Duration::from_secs(s);
        let (t1, t2, t3, t4) = (at(4), at(5), at(14), at(15));
        let what = "compiling `matmul` for v6e with libtpu";
        assert_eq!(t.line(what, t1, 1 << 30), None, "quiet at first");
        assert_eq!(
            t.line(what, t2, 3 << 29).as_deref(),
            Some("compiling `matmul` for v6e with libtpu: 5 s, worker 1.50 GiB of host memory")
        );
        assert_eq!(t.line(what, t3, 0), None, "not again before 10 s");
        assert_eq!(
            t.line(what, t4, 0).as_deref(),
            Some("compiling `matmul` for v6e with libtpu: 15 s")
        );
    }
}
