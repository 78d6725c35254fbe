//! Compile workers: every libtpu compile runs in a child process, so that libtpu aborting
//! (its static estimator does, on some kernels) rejects that one kernel with libtpu's own
//! fatal message and never kills the caller; and so that many kernels compile at once,
//! one worker per core.
//!
//! A worker is the *current executable* started again with [`WORKER_ENV`] set: a pre-main
//! hook ([`ctor`]) in this crate sees the variable and turns the process into a worker
//! before `main` (or the test harness, or a bench) runs. So any binary that links this crate
//! can compile — the `palladium` CLI, the test binaries of every crate, the benches — with
//! no separate worker binary to build, find or keep in sync (cargo builds a library's
//! binaries only for its own package, so a `palladium-tpu-worker` binary would not exist
//! for another crate's tests). The hook is an env-var check when the variable is absent.
//!
//! Protocol: one JSON request per line on the worker's stdin, one answer line per request
//! on its stdout, prefixed with `ANSWER_PREFIX` (libtpu may print to stdout too). The
//! worker's stderr goes to a file; when the worker dies mid-request, the request is rejected
//! with the fatal line libtpu logged there (glog's `F…] message`), and the next request
//! starts a fresh worker. A worker loads libtpu once and compiles many programs.
//!
//! The static estimate is a libtpu flag read once at load (`LIBTPU_INIT_ARGS`), so a
//! [`Compiler`] that estimates starts its workers with it and a profile directory each.
//!
//! A worker outlives neither its parent nor its memory bound: it kills itself within
//! [`POLL`] of its parent's death (SIGKILL of the parent included, which runs no cleanup:
//! a thread in the worker watches its parent's id), and a watchdog thread in the parent
//! stops a worker whose resident memory passes [`Compiler::with_memory_limit`].

use crate::compile::{Compiled, Session};
use crate::libtpu::{self, LIBTPU_ENVIRONMENT};
use base64::Engine;
use palladium_dsl::spec::Chip;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Set to the path of libtpu, this makes the process a compile worker (see the module docs).
pub const WORKER_ENV: &str = "PALLADIUM_RUNTIME_WORKER";
/// Set to the path of a PJRT plugin, this makes the process a client probe: it creates the
/// plugin's client, answers whether that worked, and exits ([`probe_client`]).
const PROBE_ENV: &str = "PALLADIUM_RUNTIME_PROBE";
/// The directory libtpu dumps its static profile into (set with the estimate flag).
const PROFILE_ENV: &str = "PALLADIUM_RUNTIME_PROFILE_DIR";
/// Overrides the number of parallel workers (default: the available cores).
pub const WORKERS_ENV: &str = "PALLADIUM_COMPILE_WORKERS";
/// Marks the worker's answer lines on stdout.
const ANSWER_PREFIX: &str = "PALLADIUM-WORKER ";
/// The process id of the worker's parent: the worker dies with it ([`follow_parent`]).
const PARENT_ENV: &str = "PALLADIUM_RUNTIME_PARENT";
/// The worker's own folder (its logs, its profile), removed by a worker whose parent died.
const DIR_ENV: &str = "PALLADIUM_RUNTIME_WORKER_DIR";
/// How often a worker looks at its parent, and the parent at its worker's memory.
pub const POLL: Duration = Duration::from_millis(100);

#[ctor::ctor]
fn worker_hook() {
    if let Some(libtpu) = std::env::var_os(WORKER_ENV) {
        follow_parent();
        std::process::exit(serve(Path::new(&libtpu)));
    }
    if let Some(plugin) = std::env::var_os(PROBE_ENV) {
        std::process::exit(answer_probe(Path::new(&plugin)));
    }
}

/// The probe's side of [`probe_client`]: create the client, say whether that worked.
fn answer_probe(plugin: &Path) -> i32 {
    let created = crate::ffi::Plugin::load(plugin)
        .and_then(|p| crate::ffi::Client::create(std::rc::Rc::new(p)).map(drop));
    let text = serde_json::to_string(&created)
        .unwrap_or_else(|e| format!("{{\"Err\":\"cannot encode the probe's answer: {e}\"}}"));
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "{ANSWER_PREFIX}{text}").and_then(|()| stdout.flush()).is_err() {
        return 1;
    }
    0
}

/// Makes this worker die with its parent: a thread compares the parent's id with the one
/// that started it (a dead parent's children are re-parented) every [`POLL`], and once it
/// differs removes the worker's folder and sends the worker SIGKILL (libtpu may be in the
/// middle of a compile on another thread: no exit handler may run alongside it).
fn follow_parent() {
    let Some(parent) = std::env::var(PARENT_ENV).ok().and_then(|p| p.parse::<u32>().ok()) else {
        return;
    };
    let dir = std::env::var_os(DIR_ENV).map(PathBuf::from);
    std::thread::spawn(move || {
        loop {
            if std::os::unix::process::parent_id() != parent {
                if let Some(dir) = &dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
                use rustix::process::{Signal, getpid, kill_process};
                let _ = kill_process(getpid(), Signal::KILL);
            }
            std::thread::sleep(POLL);
        }
    });
}

/// Create `plugin`'s PJRT client once in a child process (with libtpu's environment) and
/// say whether that worked. libtpu aborts the whole process on some failures of
/// `PJRT_Client_Create` instead of returning an error (seen once with another libtpu
/// process compiling alongside), so a caller that wants the client in-process asks the
/// probe first: an abort then becomes an error with libtpu's fatal message.
pub fn probe_client(plugin: &Path) -> Result<(), String> {
    std::hint::black_box(worker_hook as extern "C" fn());
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot start the client probe: no current executable: {e}"))?;
    let logs = std::env::temp_dir().join(format!(
        "palladium-probe-{}-{}",
        std::process::id(),
        WORKER_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let out = Command::new(&exe)
        .env(PROBE_ENV, plugin)
        .env_remove(WORKER_ENV)
        .envs(LIBTPU_ENVIRONMENT)
        .env(
            "LIBTPU_INIT_ARGS",
            format!(
                "{} --log_dir={}",
                std::env::var("LIBTPU_INIT_ARGS").unwrap_or_default(),
                logs.display()
            ),
        )
        .stdin(Stdio::null())
        .output();
    let _ = std::fs::remove_dir_all(&logs);
    let out = out.map_err(|e| format!("cannot start the client probe {}: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix(ANSWER_PREFIX)) {
        Some(json) => serde_json::from_str::<Result<(), String>>(json)
            .map_err(|e| format!("bad answer from the client probe: {e}"))?,
        None => {
            let said = String::from_utf8_lossy(&out.stderr);
            let why = fatal_line(&said).unwrap_or_else(|| last_lines(&said, 3));
            Err(format!("the plugin aborted creating its client: {why} (probe {})", out.status))
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Request {
    program: String,
    topology: String,
    serialize: bool,
}

#[derive(Serialize, Deserialize)]
struct Answer {
    result: Result<Compiled, String>,
    /// Base64 of the serialized executable, where asked for.
    executable: Option<String>,
}

/// The worker's loop: load libtpu, then answer requests until stdin closes.
fn serve(libtpu: &Path) -> i32 {
    let plugin = crate::ffi::Plugin::load(libtpu);
    let mut session = plugin.as_ref().map(Session::new).map_err(Clone::clone);
    let profile = std::env::var_os(PROFILE_ENV).map(PathBuf::from);
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        let answer = match serde_json::from_str::<Request>(&line) {
            Err(e) => Answer { result: Err(format!("bad worker request: {e}")), executable: None },
            Ok(req) => match &mut session {
                Err(e) => Answer { result: Err(e.clone()), executable: None },
                Ok(s) => {
                    let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        s.compile(&req.program, &req.topology, req.serialize, profile.as_deref())
                    }))
                    .unwrap_or_else(|panic| {
                        Err(format!("the compile panicked: {}", panic_text(&*panic)))
                    });
                    let mut compiled = compiled;
                    let executable = compiled
                        .as_mut()
                        .ok()
                        .and_then(|c| c.executable.take())
                        .map(|b| base64::engine::general_purpose::STANDARD.encode(b));
                    Answer { result: compiled, executable }
                }
            },
        };
        let text = serde_json::to_string(&answer).unwrap_or_else(|e| {
            format!(
                "{{\"result\":{{\"Err\":\"cannot encode the answer: {e}\"}},\"executable\":null}}"
            )
        });
        if writeln!(stdout, "{ANSWER_PREFIX}{text}").and_then(|()| stdout.flush()).is_err() {
            return 1;
        }
    }
    0
}

/// The text of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(panic without a message)".into())
}

/// One compile: a StableHLO program for one chip.
#[derive(Clone, Debug)]
pub struct Job {
    pub program: String,
    pub chip: Chip,
    /// Also return the serialized executable.
    pub serialize: bool,
}

/// Why a compile gave no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// libtpu cannot be found or a worker cannot start.
    #[error("{0}")]
    Setup(String),
    /// libtpu rejected the program: its message.
    #[error("libtpu: {0}")]
    Rejected(String),
    /// No deviceless topology of the chip has the program's devices ([`libtpu::topology`]).
    #[error("{0}")]
    NoTopology(String),
    /// libtpu aborted the worker while compiling (or estimating) this program: its fatal
    /// message.
    #[error("libtpu aborted while compiling it: {0}")]
    Aborted(String),
    /// The worker's resident memory passed the compiler's limit
    /// ([`Compiler::with_memory_limit`]): it was stopped.
    #[error("{}", over_memory(.resident, .limit, .env))]
    OverMemory {
        resident: u64,
        limit: u64,
        /// The environment variable that sets the limit.
        env: &'static str,
    },
}

fn over_memory(resident: &u64, limit: &u64, env: &str) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    format!(
        "the compile worker (libtpu) held {resident} bytes ({:.2} GiB) of host memory, past the limit of {limit} bytes ({:.2} GiB), and was stopped; raise the limit with {env}=<bytes or e.g. 64GiB> if this machine has the memory",
        *resident as f64 / GIB,
        *limit as f64 / GIB
    )
}

/// Whether libtpu's static cycle estimate is taken.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Estimate {
    Yes,
    No,
}

/// Compiles jobs in parallel worker processes.
#[derive(Clone, Debug)]
pub struct Compiler {
    libtpu: PathBuf,
    estimate: Estimate,
    workers: usize,
    /// Shared by the clones (the estimating and plain passes of one compile).
    memory: Arc<WorkerMemory>,
}

/// The host memory of a compiler's workers: the bound on each, and what they hold together.
#[derive(Debug, Default)]
struct WorkerMemory {
    /// A worker whose resident memory passes this many bytes is stopped, and the environment
    /// variable that sets the bound; `None`: unbounded.
    limit: Option<(u64, &'static str)>,
    /// The resident bytes of the running workers, together, as last sampled.
    resident: AtomicU64,
}

/// The number of workers `PALLADIUM_COMPILE_WORKERS` asks for (`None`: unset).
fn workers_from_env() -> Result<Option<usize>, CompileError> {
    match std::env::var(WORKERS_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(CompileError::Setup(format!("{WORKERS_ENV}: {e}"))),
        Ok(v) => parse_workers(&v).map(Some),
    }
}

/// A value of `PALLADIUM_COMPILE_WORKERS`: a positive whole number.
fn parse_workers(value: &str) -> Result<usize, CompileError> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CompileError::Setup(format!(
            "{WORKERS_ENV}={value:?}: expected a positive whole number of compile workers (e.g. 4), or unset it for one per core"
        ))),
    }
}

static WORKER_SEQ: AtomicUsize = AtomicUsize::new(0);

impl Compiler {
    /// Locate libtpu ([`libtpu::locate`]; the error says where it looked), with
    /// `PALLADIUM_COMPILE_WORKERS` workers at most (refused unless a positive number), else
    /// one per core.
    pub fn new(estimate: Estimate) -> Result<Compiler, CompileError> {
        let workers = workers_from_env()?
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let libtpu = libtpu::locate().map_err(CompileError::Setup)?;
        Ok(Compiler { libtpu, estimate, workers, memory: Arc::default() })
    }

    /// Stop any worker whose resident memory passes `bytes` (sampled every [`POLL`]): its
    /// job fails with [`CompileError::OverMemory`], which names `env`, the variable that
    /// sets the limit.
    pub fn with_memory_limit(mut self, bytes: u64, env: &'static str) -> Compiler {
        self.memory =
            Arc::new(WorkerMemory { limit: Some((bytes, env)), resident: AtomicU64::new(0) });
        self
    }

    /// The resident memory of the running workers together, as last sampled (bytes; 0
    /// when none runs, and without a memory limit, where nothing samples it).
    pub fn resident_bytes(&self) -> u64 {
        self.memory.resident.load(Ordering::Relaxed)
    }

    /// At most `n` workers at once (each holds its own libtpu: about 300 MB of RAM for a
    /// library kernel, more for a megakernel).
    pub fn with_workers(mut self, n: usize) -> Compiler {
        self.workers = n.max(1);
        self
    }

    pub fn estimate(&self) -> Estimate {
        self.estimate
    }

    /// The most workers that run at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Compile one job.
    pub fn compile(&self, job: &Job) -> Result<Compiled, CompileError> {
        self.compile_all(std::slice::from_ref(job)).pop().expect("one result per job")
    }

    /// Compile every job, in parallel workers; one result per job, in order. An abort
    /// rejects the job it happened on; the others go on in fresh workers.
    pub fn compile_all(&self, jobs: &[Job]) -> Vec<Result<Compiled, CompileError>> {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<Compiled, CompileError>>>> =
            Mutex::new(vec![None; jobs.len()]);
        let threads = self.workers.min(jobs.len());
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let mut worker: Option<Worker> = None;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        let r = self.run(&mut worker, job);
                        results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                    }
                });
            }
        });
        results
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|r| r.expect("every job ran"))
            .collect()
    }

    /// [`Compiler::compile_all`] with the estimate; a job whose compile aborts, is refused,
    /// or passes the memory limit with the estimate on is compiled again without it, and its
    /// `estimate_note` says why there is no estimate. libtpu's static profiler changes what
    /// is compiled: it aborts on some programs, and it places VMEM temporaries differently
    /// (the deep-ring megakernel on v7x: "Used 74 MiB of 64 MiB vmem" with it, accepted
    /// without it); its time and memory grow with the grid steps it prices (a 8192^3 matmul,
    /// 16384 steps: past 3 GiB in 8 s, where the plain compile takes 0.4 s). Whether libtpu
    /// accepts a program is the plain compile's answer; where that also fails, it is the
    /// job's error.
    pub fn compile_all_estimated(&self, jobs: &[Job]) -> Vec<Result<Compiled, CompileError>> {
        let estimating = Compiler { estimate: Estimate::Yes, ..self.clone() };
        let mut results = estimating.compile_all(jobs);
        let failed: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                matches!(
                    r,
                    Err(CompileError::Aborted(_)
                        | CompileError::Rejected(_)
                        | CompileError::OverMemory { .. })
                )
            })
            .map(|(i, _)| i)
            .collect();
        if failed.is_empty() {
            return results;
        }
        let plain = Compiler { estimate: Estimate::No, ..self.clone() };
        let again = plain.compile_all(&failed.iter().map(|&i| jobs[i].clone()).collect::<Vec<_>>());
        for (i, r) in failed.into_iter().zip(again) {
            let note = match &results[i] {
                Err(CompileError::Aborted(why)) => {
                    format!("libtpu's static estimator aborted on this program: {why}")
                }
                Err(e @ CompileError::OverMemory { .. }) => format!(
                    "libtpu's static estimator needs more host memory on this program than the limit (it grows with the grid steps it prices), so it was compiled without it: {e}"
                ),
                Err(e) => format!(
                    "libtpu refuses this program with its static estimator on, and accepts it without ({})",
                    e.to_string().lines().next().unwrap_or_default()
                ),
                Ok(_) => continue,
            };
            results[i] = r.map(|mut c| {
                c.estimate_note = Some(note);
                c
            });
        }
        results
    }

    fn run(&self, worker: &mut Option<Worker>, job: &Job) -> Result<Compiled, CompileError> {
        if worker.is_none() {
            *worker = Some(Worker::spawn(&self.libtpu, self.estimate, &self.memory)?);
        }
        let w = worker.as_mut().expect("spawned above");
        let topology = libtpu::topology(
            job.chip,
            crate::stablehlo::num_partitions(&job.program).max(1) as u64,
        )
        .map_err(CompileError::NoTopology)?;
        let request = Request {
            program: job.program.clone(),
            topology: topology.to_string(),
            serialize: job.serialize,
        };
        match w.ask(&request) {
            Ok(answer) => {
                let mut compiled = answer.result.map_err(CompileError::Rejected)?;
                if let Some(b64) = answer.executable {
                    compiled.executable =
                        Some(base64::engine::general_purpose::STANDARD.decode(b64).map_err(
                            |e| CompileError::Setup(format!("bad executable from the worker: {e}")),
                        )?);
                }
                Ok(compiled)
            }
            Err(died) => {
                *worker = None;
                Err(died)
            }
        }
    }
}

/// A running worker process (parent side).
struct Worker {
    /// Shared with the watchdog, which kills it over the memory limit.
    child: Arc<Mutex<Child>>,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    watchdog: Option<Watchdog>,
}

/// The thread that samples a worker's resident memory every [`POLL`] (adding it to the
/// compiler's total) and kills the worker past the limit.
struct Watchdog {
    stop: Arc<AtomicBool>,
    /// The resident bytes that got the worker killed; 0 while it is within the limit.
    over: Arc<AtomicU64>,
    limit: (u64, &'static str),
    thread: std::thread::JoinHandle<()>,
}

impl Watchdog {
    fn start(
        child: &Arc<Mutex<Child>>,
        memory: &Arc<WorkerMemory>,
        limit: (u64, &'static str),
    ) -> Watchdog {
        let (stop, over) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let pid = child.lock().unwrap_or_else(PoisonError::into_inner).id();
        let thread = std::thread::spawn({
            let (stop, over, child, memory) =
                (stop.clone(), over.clone(), child.clone(), memory.clone());
            move || {
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(now) = resident_bytes(pid) {
                        memory.resident.fetch_add(now, Ordering::Relaxed);
                        memory.resident.fetch_sub(last, Ordering::Relaxed);
                        last = now;
                        if now > limit.0 && over.load(Ordering::Relaxed) == 0 {
                            over.store(now, Ordering::Relaxed);
                            let _ = child.lock().unwrap_or_else(PoisonError::into_inner).kill();
                        }
                    }
                    std::thread::sleep(POLL);
                }
                memory.resident.fetch_sub(last, Ordering::Relaxed);
            }
        });
        Watchdog { stop, over, limit, thread }
    }

    /// Stops the thread; the bytes that got the worker killed, if they did.
    fn finish(self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        Some(self.over.load(Ordering::Relaxed)).filter(|&b| b > 0)
    }
}

/// The resident memory of process `pid` (`VmRSS` of `/proc/PID/status`), `None` once it has
/// exited.
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    kib.trim().strip_suffix("kB")?.trim().parse::<u64>().ok().map(|k| k * 1024)
}

impl Worker {
    fn spawn(
        libtpu: &Path,
        estimate: Estimate,
        memory: &Arc<WorkerMemory>,
    ) -> Result<Worker, CompileError> {
        // Referencing the hook keeps its object file (and so its `.init_array` entry) in
        // every binary that can spawn workers, however the linker prunes the rlib.
        std::hint::black_box(worker_hook as extern "C" fn());
        let setup = |what: &str, e: std::io::Error| {
            CompileError::Setup(format!("cannot start a compile worker: {what}: {e}"))
        };
        let exe = std::env::current_exe().map_err(|e| setup("no current executable", e))?;
        let n = WORKER_SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("palladium-worker-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("profile"))
            .map_err(|e| setup(&format!("cannot create {}", dir.display()), e))?;
        let stderr = std::fs::File::create(dir.join("stderr.log"))
            .map_err(|e| setup("cannot create its stderr log", e))?;
        let mut cmd = Command::new(&exe);
        cmd.env(WORKER_ENV, libtpu)
            .env(PARENT_ENV, std::process::id().to_string())
            .env(DIR_ENV, &dir)
            .envs(LIBTPU_ENVIRONMENT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // libtpu's own log files go to the worker's directory, removed with it: by default
        // they land in /tmp/tpu_logs and stay, hundreds of MB for one rejected program.
        let mut args = format!(
            "{} --log_dir={}",
            std::env::var("LIBTPU_INIT_ARGS").unwrap_or_default(),
            dir.display()
        );
        if estimate == Estimate::Yes {
            let profile = dir.join("profile");
            args = format!("{args} --xla_jf_dump_static_llo_profile_to={}", profile.display());
            cmd.env(PROFILE_ENV, &profile);
        }
        cmd.env("LIBTPU_INIT_ARGS", args);
        let mut child = cmd.spawn().map_err(|e| setup(&exe.display().to_string(), e))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let child = Arc::new(Mutex::new(child));
        let watchdog = memory.limit.map(|limit| Watchdog::start(&child, memory, limit));
        Ok(Worker { child, stdin, stdout, dir, watchdog })
    }

    /// Send one request and read its answer; `Err` when the worker died on it.
    fn ask(&mut self, request: &Request) -> Result<Answer, CompileError> {
        let log = self.dir.join("stderr.log");
        let offset = std::fs::metadata(&log).map_or(0, |m| m.len());
        let line = serde_json::to_string(request)
            .map_err(|e| CompileError::Setup(format!("cannot encode a worker request: {e}")))?;
        let sent = self.stdin.as_mut().map(|s| writeln!(s, "{line}").and_then(|()| s.flush()));
        if matches!(sent, Some(Ok(()))) {
            let mut text = String::new();
            loop {
                text.clear();
                match self.stdout.read_line(&mut text) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if let Some(json) = text.trim_end().strip_prefix(ANSWER_PREFIX) {
                            return serde_json::from_str(json).map_err(|e| {
                                CompileError::Setup(format!(
                                    "bad answer from the compile worker: {e}"
                                ))
                            });
                        }
                    }
                }
            }
        }
        // The worker died: over the memory limit, or say how, with libtpu's last words.
        self.stdin = None;
        let status = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| format!("unknown status ({e})"));
        if let Some(w) = self.watchdog.take() {
            let (limit, env) = w.limit;
            if let Some(resident) = w.finish() {
                return Err(CompileError::OverMemory { resident, limit, env });
            }
        }
        let mut said = String::new();
        if let Ok(mut f) = std::fs::File::open(&log) {
            let _ = f.seek(SeekFrom::Start(offset));
            let _ = f.read_to_string(&mut said);
        }
        let why = fatal_line(&said).unwrap_or_else(|| last_lines(&said, 3));
        Err(CompileError::Aborted(format!("{why} (worker {status})")))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.finish();
        }
        // Closing stdin ends the worker's loop.
        self.stdin = None;
        let _ = self.child.lock().unwrap_or_else(PoisonError::into_inner).wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The message of glog's fatal line (`F1130 01:02:41.87 5570 file.cc:1585] message`), which
/// says why libtpu aborted.
pub fn fatal_line(stderr: &str) -> Option<String> {
    let line = stderr.lines().find(|l| {
        l.starts_with('F')
            && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit)
            && l.contains("] ")
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fatal_line_says_why() {
        let err = "W0000 warning\nF1130 01:02:41.870801    5570 llo_dumper.cc:1585] Static LLO profiling failed: Unsupported DMA direction.\n*** SIGABRT";
        assert_eq!(
            fatal_line(err).as_deref(),
            Some("Static LLO profiling failed: Unsupported DMA direction.")
        );
        assert_eq!(fatal_line("Failed to find host bounds\n"), None);
    }

    #[test]
    fn the_client_probe_answers_from_its_own_process() {
        // The probe is this test binary started again; a plugin that cannot load is its
        // ordinary error, carried back over the answer line.
        let err = probe_client(Path::new("/nonexistent/pjrt_plugin.so")).unwrap_err();
        assert!(err.contains("/nonexistent/pjrt_plugin.so") && !err.contains("aborted"), "{err}");
    }

    #[test]
    fn the_worker_count_is_a_positive_number() {
        assert_eq!(parse_workers(" 4 "), Ok(4));
        for bad in ["abc", "0", "-1", "", "2.5"] {
            let err = parse_workers(bad).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{WORKERS_ENV}={bad:?}: expected a positive")),
                "{err}"
            );
        }
    }

    #[test]
    fn resident_memory_is_read_from_proc() {
        let mine = resident_bytes(std::process::id()).expect("this process runs");
        assert!(mine > 0 && mine.is_multiple_of(1024), "{mine}");
        assert_eq!(resident_bytes(u32::MAX), None);
    }

    #[test]
    fn last_lines_keeps_the_tail() {
        assert_eq!(last_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(last_lines("", 2), "(no output)");
        assert!(last_lines(&"x".repeat(700), 1).chars().count() <= 602);
    }
}
