//! The libtpu runner: lower each candidate with `palladium-lowering`, compile it with Google's
//! TPU compiler through the TPU oracle (`shared/tpu-oracle/oracle.py`, deviceless), and cost
//! it by libtpu's static LLO profile (`estimated_cycles`), a [`CostKind::Measured`] record.
//!
//! "Measured" means measured by libtpu's own scheduler estimate of the compiled kernel, not
//! on a device: the numbers compare kernels on one chip, they are not wall time.
//!
//! All candidates of a search go through one `oracle.py batch` process (libtpu starts once).
//! libtpu 0.0.42.1 aborts the whole process for some kernels while profiling them (v6e:
//! manual DMAs from HBM refs; v5e: bf16 matmuls with an 8-row LHS). The batch prints one
//! JSON line per job in order, so after an abort the first unanswered job is the one that
//! aborted: it is rejected with libtpu's last words, and the rest go to a fresh batch.
//!
//! Where the oracle lives: the Python of `$PALLADIUM_TPU_VENV` (default
//! `~/.cache/palladium/venv-tpu`) and `$PALLADIUM_TPU_ORACLE` (default
//! `shared/tpu-oracle/oracle.py` beside the repository). Both are checked by
//! [`Oracle::new`], which fails with a clear error when either is missing.

use crate::runner::{CostKind, CostRecord, Runner, RunnerError};
use crate::traffic::{Prefetch, analyze};
use palladium_dsl::Kernel;
use palladium_dsl::spec::Chip;
use palladium_lowering::{LowerOptions, lower};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Which of the lowered texts libtpu compiles.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Form {
    /// The pretty Mosaic module (`oracle.py compile`), as JAX Pallas hands it over.
    Module,
    /// The serialized `stable_mosaic` body of the `tpu_custom_call` (`oracle.py compile-body`).
    Body,
}

/// One compile job of `oracle.py batch`: paths relative to the batch's directory.
#[derive(Clone, Debug)]
pub struct Job {
    pub form: Form,
    pub path: String,
    pub spec: String,
}

impl Job {
    fn to_json(&self) -> Json {
        let kind = match self.form {
            Form::Module => "compile",
            Form::Body => "compile-body",
        };
        serde_json::json!({"kind": kind, "path": self.path, "spec": self.spec})
    }
}

/// The oracle's answer for one job: its JSON object (`ok`, `estimated_cycles`, ...), or why
/// there is none (the compiler's error, or the abort that killed the process on this job).
pub type JobResult = Result<Json, String>;

/// The TPU oracle: where its Python and script are, and a scratch directory for batches.
#[derive(Clone, Debug)]
pub struct Oracle {
    pub python: PathBuf,
    pub script: PathBuf,
    /// Files of each batch go in a fresh subdirectory of this.
    pub scratch: PathBuf,
    /// What libtpu compiles (default: the module).
    pub form: Form,
    /// Scalar-prefetch contents for the traffic model kept alongside the measurement.
    pub prefetch: Prefetch,
    /// How many `oracle.py` processes this oracle has started (aborts cost one each).
    pub processes: usize,
}

static BATCH: AtomicUsize = AtomicUsize::new(0);

impl Oracle {
    /// Locate the oracle; batches go under `scratch`. Fails when the venv's Python or the
    /// script is missing, saying which path was expected and how to set it.
    pub fn new(scratch: impl Into<PathBuf>) -> Result<Oracle, RunnerError> {
        let venv = match std::env::var_os("PALLADIUM_TPU_VENV") {
            Some(v) => PathBuf::from(v),
            None => {
                let home = std::env::var_os("HOME").ok_or_else(|| RunnerError("the TPU oracle venv: neither PALLADIUM_TPU_VENV nor HOME is set".into()))?;
                Path::new(&home).join(".cache/palladium/venv-tpu")
            }
        };
        let script = match std::env::var_os("PALLADIUM_TPU_ORACLE") {
            Some(p) => PathBuf::from(p),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tpu-oracle/oracle.py"),
        };
        Oracle::at(venv, script, scratch)
    }

    /// The oracle of the venv `venv` and the script `script` (both checked).
    pub fn at(venv: PathBuf, script: PathBuf, scratch: impl Into<PathBuf>) -> Result<Oracle, RunnerError> {
        let python = venv.join("bin/python");
        if !python.is_file() {
            return Err(RunnerError(format!(
                "the TPU oracle venv is missing: expected {} (run scripts/setup.sh, or set PALLADIUM_TPU_VENV to a venv with jax[tpu]==0.10.2)",
                python.display()
            )));
        }
        if !script.is_file() {
            return Err(RunnerError(format!(
                "the TPU oracle is missing: expected {} (a checkout of shared/ beside the repository, or set PALLADIUM_TPU_ORACLE)",
                script.display()
            )));
        }
        let script = script.canonicalize().unwrap_or(script);
        Ok(Oracle { python, script, scratch: scratch.into(), form: Form::Module, prefetch: Prefetch::new(), processes: 0 })
    }

    pub fn with_form(mut self, form: Form) -> Oracle {
        self.form = form;
        self
    }

    pub fn with_prefetch(mut self, prefetch: Prefetch) -> Oracle {
        self.prefetch = prefetch;
        self
    }

    /// A fresh, empty directory under [`Oracle::scratch`].
    pub fn fresh_dir(&self, label: &str) -> Result<PathBuf, RunnerError> {
        let n = BATCH.fetch_add(1, Ordering::Relaxed);
        let dir = self.scratch.join(format!("{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| RunnerError(format!("cannot create {}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Run `oracle.py ARGS…` in `dir`; returns (exit ok, killed by a signal, stdout, stderr).
    pub fn command(&mut self, dir: &Path, args: &[&str]) -> Result<(bool, bool, String, String), RunnerError> {
        self.processes += 1;
        // Deviceless compiles need no TPU: libtpu's one-process lock only gets in the way.
        let out = Command::new(&self.python)
            .arg(&self.script)
            .args(args)
            .env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            .env("ORACLE_CYCLES", "1")
            .current_dir(dir)
            .output()
            .map_err(|e| RunnerError(format!("cannot run {} {}: {e}", self.python.display(), self.script.display())))?;
        let signalled = {
            #[cfg(unix)]
            {
                use std::os::unix::process::ExitStatusExt;
                out.status.signal().is_some()
            }
            #[cfg(not(unix))]
            {
                false
            }
        };
        Ok((out.status.success(), signalled, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
    }

    /// Compile `jobs` (files already in `dir`) on `chip` with `oracle.py batch`, one result
    /// per job in order. A process that dies mid-batch rejects the job it died on with its
    /// last stderr lines and the remaining jobs run in a new process. Only an oracle that
    /// fails before answering anything, without being killed, is an error for the whole batch.
    pub fn batch(&mut self, dir: &Path, jobs: &[Job], chip: Chip) -> Result<Vec<JobResult>, RunnerError> {
        let mut results: Vec<Option<JobResult>> = vec![None; jobs.len()];
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        let mut round = 0;
        while !pending.is_empty() {
            let file = format!("jobs-{round}.json");
            round += 1;
            let list = Json::Array(pending.iter().map(|&i| jobs[i].to_json()).collect());
            std::fs::write(dir.join(&file), list.to_string()).map_err(|e| RunnerError(format!("cannot write {}: {e}", dir.join(&file).display())))?;
            let (_, signalled, stdout, stderr) = self.command(dir, &["batch", &file, "--chip", chip.name()])?;
            let answers: Vec<Json> =
                stdout.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str::<Json>(l).ok()).filter(|j| j.get("path").is_some()).collect();
            if answers.len() > pending.len() {
                return Err(RunnerError(format!("the oracle answered {} jobs of {}:\n{stdout}", answers.len(), pending.len())));
            }
            for (k, answer) in answers.iter().enumerate() {
                let i = pending[k];
                if answer["path"].as_str() != Some(jobs[i].path.as_str()) {
                    return Err(RunnerError(format!("the oracle answered {} for job {}", answer["path"], jobs[i].path)));
                }
                results[i] = Some(if answer["ok"] == Json::Bool(true) {
                    Ok(answer.clone())
                } else {
                    Err(format!("libtpu: {}", answer["error"].as_str().unwrap_or("(no error text)")))
                });
            }
            if answers.len() == pending.len() {
                break;
            }
            if answers.is_empty() && !signalled {
                return Err(RunnerError(format!("the oracle failed before compiling anything on {chip}:\n{}", last_lines(&stderr, 12))));
            }
            let died = pending[answers.len()];
            results[died] = Some(Err(format!("libtpu aborted the oracle process on {chip}: {}", fatal_line(&stderr).unwrap_or_else(|| last_lines(&stderr, 3)))));
            pending.drain(..=answers.len());
        }
        Ok(results.into_iter().map(|r| r.expect("every job answered")).collect())
    }

    /// `oracle.py floor --bytes N`: cycles of a plain bf16 stream of about `bytes` bytes
    /// (`(cycles, bytes actually streamed)`; the oracle rounds to whole 4 MiB blocks).
    pub fn floor(&mut self, chip: Chip, bytes: u64) -> Result<(u64, u64), RunnerError> {
        let dir = self.fresh_dir("floor")?;
        let (ok, _, stdout, stderr) = self.command(&dir, &["floor", "--chip", chip.name(), "--bytes", &bytes.to_string()])?;
        let j = stdout.lines().rev().find_map(|l| serde_json::from_str::<Json>(l).ok());
        match j {
            Some(j) if ok => match (j["estimated_cycles"].as_u64(), j["bytes"].as_u64()) {
                (Some(c), Some(b)) => Ok((c, b)),
                _ => Err(RunnerError(format!("oracle floor on {chip}: no cycles in {j}"))),
            },
            _ => Err(RunnerError(format!("oracle floor on {chip} failed: {stdout}{}", last_lines(&stderr, 3)))),
        }
    }

    /// `oracle.py pallas NAME`: the Mosaic module JAX Pallas emits for its reference kernel.
    pub fn pallas_module(&mut self, name: &str, chip: Chip) -> Result<String, RunnerError> {
        let dir = self.fresh_dir("pallas")?;
        let (ok, _, stdout, stderr) = self.command(&dir, &["pallas", name, "--chip", chip.name()])?;
        let start = stdout.find("module").filter(|_| ok).ok_or_else(|| RunnerError(format!("oracle pallas {name} failed: {stdout}{}", last_lines(&stderr, 3))))?;
        let end = stdout.rfind("\n}").map_or(stdout.len(), |e| e + 2);
        Ok(stdout[start..end].to_string())
    }

    /// Lower `kernel` for `chip` and write `NAME.mlir`, `NAME.body` and `NAME.json` into
    /// `dir`; returns the job compiling it in [`Oracle::form`].
    pub fn write_kernel(&self, dir: &Path, name: &str, kernel: &Kernel, chip: Chip) -> Result<Job, RunnerError> {
        let lowered = lower(kernel, &LowerOptions { chip }).map_err(|e| RunnerError(format!("lowering: {e}")))?;
        let write = |ext: &str, text: &str| {
            let p = dir.join(format!("{name}.{ext}"));
            std::fs::write(&p, text).map_err(|e| RunnerError(format!("cannot write {}: {e}", p.display())))
        };
        write("mlir", &lowered.module)?;
        write("body", &lowered.body)?;
        write("json", &lowered.call_json)?;
        let path = match self.form {
            Form::Module => format!("{name}.mlir"),
            Form::Body => format!("{name}.body"),
        };
        Ok(Job { form: self.form, path, spec: format!("{name}.json") })
    }

    fn record(&self, kernel: &Kernel, answer: JobResult, chip: Chip) -> Result<CostRecord, RunnerError> {
        let answer = answer.map_err(RunnerError)?;
        let cycles = answer["estimated_cycles"]
            .as_u64()
            .ok_or_else(|| RunnerError(format!("libtpu compiled it but reports no estimated cycles on {chip} (no static profile there)")))?;
        Ok(CostRecord { runner: self.name().to_string(), kind: CostKind::Measured, cycles: cycles as f64, traffic: analyze(kernel, &self.prefetch).ok(), model: None })
    }
}

/// The message of glog's fatal line (`F1130 01:02:41.87 5570 file.cc:1585] message`), which
/// says why libtpu aborted.
fn fatal_line(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.starts_with('F') && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit) && l.contains("] "))?;
    Some(line.split_once("] ").map_or(line, |(_, m)| m).trim().to_string())
}

/// The last `n` non-empty lines of `text`, joined by " | " (at most 600 characters).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let s = lines[lines.len().saturating_sub(n)..].join(" | ");
    if s.is_empty() {
        return "(no output)".into();
    }
    let count = s.chars().count();
    if count > 600 { format!("…{}", s.chars().skip(count - 600).collect::<String>()) } else { s }
}

impl Runner for Oracle {
    fn name(&self) -> &str {
        "libtpu-oracle"
    }

    fn run(&mut self, kernel: &Kernel, chip: Chip) -> Result<CostRecord, RunnerError> {
        self.run_batch(&[kernel], chip).pop().expect("one result per kernel")
    }

    fn run_batch(&mut self, kernels: &[&Kernel], chip: Chip) -> Vec<Result<CostRecord, RunnerError>> {
        let dir = match self.fresh_dir("batch") {
            Ok(d) => d,
            Err(e) => return kernels.iter().map(|_| Err(e.clone())).collect(),
        };
        // Lower every kernel; lowering failures are that candidate's rejection.
        let written: Vec<Result<Job, RunnerError>> = kernels.iter().enumerate().map(|(i, k)| self.write_kernel(&dir, &format!("c{i}"), k, chip)).collect();
        let jobs: Vec<Job> = written.iter().filter_map(|w| w.as_ref().ok().cloned()).collect();
        let mut answers = match self.batch(&dir, &jobs, chip) {
            Ok(a) => a.into_iter(),
            Err(e) => return kernels.iter().map(|_| Err(e.clone())).collect(),
        };
        kernels
            .iter()
            .zip(written)
            .map(|(k, w)| match w {
                Err(e) => Err(e),
                Ok(_) => self.record(k, answers.next().expect("one answer per job"), chip),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fatal_line_says_why() {
        let err = "W0000 warning\nF1130 01:02:41.870801    5570 llo_dumper.cc:1585] Static LLO profiling failed: Unsupported DMA direction.\n*** SIGABRT";
        assert_eq!(fatal_line(err).as_deref(), Some("Static LLO profiling failed: Unsupported DMA direction."));
        assert_eq!(fatal_line("Failed to find host bounds\n"), None);
    }

    #[test]
    fn last_lines_keeps_the_tail() {
        assert_eq!(last_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(last_lines("", 2), "(no output)");
        let long = "x".repeat(700);
        assert!(last_lines(&long, 1).chars().count() <= 602);
    }

    #[test]
    fn missing_venv_or_script_is_a_clear_error() {
        let err = Oracle::at(PathBuf::from("/nonexistent/venv"), PathBuf::from("/nonexistent/oracle.py"), "/tmp").unwrap_err();
        assert!(err.0.contains("the TPU oracle venv is missing: expected /nonexistent/venv/bin/python"), "{err}");
        let exe = std::env::current_exe().unwrap();
        // A "venv" whose bin/python exists: this test binary's directory layout will not
        // have one, so fake it in a temp dir.
        let venv = std::env::temp_dir().join(format!("palladium-fake-venv-{}", std::process::id()));
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::copy(&exe, venv.join("bin/python")).unwrap();
        let err = Oracle::at(venv.clone(), PathBuf::from("/nonexistent/oracle.py"), "/tmp").unwrap_err();
        assert!(err.0.contains("the TPU oracle is missing: expected /nonexistent/oracle.py"), "{err}");
        let _ = std::fs::remove_dir_all(&venv);
    }
}
