//! `palladium`: the command-line front end.

use clap::{Parser, Subcommand};
use palladium::author::{emitted_files, file_set};
use palladium::check::{Backend, CheckOptions, check_on};
use palladium::output::{Input, OutputFolder};
use palladium_dsl::ir::{PrintOptions, VerifyOptions, check_hbm, print_kernel, verify};
use palladium_dsl::spec::Chip;
use palladium_kernels::{KernelError, REGISTRY, parse_setting};
use palladium_lowering::{LowerOptions, lower};
use palladium_model::quant::WeightsDtype;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "palladium",
    version,
    about = "A Rust compiler for TPU kernels (Pallas-style DSL lowered to Mosaic MLIR)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the library kernels and their parameters.
    Kernels,
    /// Trace a library kernel, verify it, and print its IR.
    Ir {
        kernel: String,
        /// Override a compile-time parameter: NAME=VALUE (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Check the VMEM budget for this chip.
        #[arg(long, default_value = "v6e")]
        chip: Chip,
        /// Annotate every op with its source location.
        #[arg(long)]
        locations: bool,
    },
    /// Lower a library kernel to Mosaic MLIR: writes DIR/KERNEL.mlir (the module),
    /// DIR/KERNEL.body.mlir (the serialized `tpu_custom_call` body) and DIR/KERNEL.call.json.
    Emit {
        kernel: String,
        #[arg(long)]
        chip: Chip,
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Compile a library kernel with libtpu, deviceless (PJRT; no TPU needed): prints the
    /// code size, VMEM limit, HBM from the compiled memory stats and libtpu's static cycle
    /// estimate (none, with the reason, where libtpu gives none). --out DIR also writes
    /// emit's three files, DIR/KERNEL.stablehlo.mlir and the serialized executable
    /// DIR/KERNEL.executable, all or none.
    Compile {
        kernel: String,
        #[arg(long)]
        chip: Chip,
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Plan and emit the decode megakernel of a Hugging Face MoE model (config.json): one
    /// grid-less kernel for a whole decode step. Writes DIR/megakernel.mlir, .body.mlir and
    /// .call.json and prints the report (layers, bytes streamed per step, VMEM plan, DMA
    /// schedule). A model that does not fit the chip is refused and nothing is written.
    Megakernel {
        config: PathBuf,
        #[arg(long)]
        chip: Chip,
        #[command(flatten)]
        plan: PlanArgs,
        #[arg(long)]
        out: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also compile it with libtpu (as `palladium compile`): writes
        /// megakernel.stablehlo.mlir and megakernel.executable too, and the report (its JSON:
        /// a `compile` object) gains code size, memory and the estimate.
        #[arg(long)]
        compile: bool,
    },
    /// Model one call's timeline (docs/profiling.md): DMAs sharing the HBM bandwidth, compute
    /// costed per op with coefficients calibrated against libtpu's estimates, loops run with
    /// their real trip counts. Writes DIR/trace.json (Chrome trace events: Perfetto),
    /// DIR/timeline.svg and DIR/summary.json, all or none, and prints the summary (step time,
    /// HBM efficiency, bubbles by cause, the three largest). Profiles a library kernel
    /// (KERNEL [--set NAME=VALUE]...) or, with --megakernel CONFIG, the decode megakernel
    /// (its options as for `megakernel`; experts at the plan's static worst case). A kernel
    /// on several devices (a library collective's `--set n=N`, the megakernel's `--devices
    /// N`) is profiled as device 0 of the SPMD program: remote copies on the ICI links
    /// (a model: libtpu prices them at 0 cycles), collective time and bubbles named apart.
    /// A flag the chosen target does not use is refused.
    #[command(group(clap::ArgGroup::new("what").required(true).args(["kernel", "megakernel"])))]
    Profile {
        kernel: Option<String>,
        /// Override a compile-time parameter of KERNEL: NAME=VALUE (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// The contents of KERNEL's scalar-prefetch operand NAME, row-major (repeatable;
        /// e.g. `decode_attention`'s `lens=4096,4096`): loops bounded by them run their real
        /// trip counts. Values outside the range the kernel declares for the operand are
        /// refused.
        #[arg(long, value_name = "NAME=V,...")]
        prefetch: Vec<String>,
        /// Profile the decode megakernel of this Hugging Face config.json instead.
        #[arg(long, value_name = "CONFIG", conflicts_with = "kernel")]
        megakernel: Option<PathBuf>,
        #[command(flatten)]
        plan: PlanArgs,
        /// Also profile the same step split into library kernels (per layer rmsnorm, qkv
        /// gemv, rope, KV update, attention, o gemv, residual adds, router, experts; `lm_head`),
        /// each call plus a fixed cost, and print fused / unfused.
        #[arg(long)]
        unfused: bool,
        /// The step's position per sequence (comma-separated, one per --batch); default: each
        /// sequence at the end of the context (context - K).
        #[arg(long, value_name = "P,...")]
        positions: Option<String>,
        #[arg(long)]
        chip: Chip,
        #[arg(long)]
        out: PathBuf,
    },
    /// Prompt + greedy decode of a Hugging Face MoE model (config.json) through its decode
    /// megakernel in interpret mode: the megakernel is emitted, verified and lowered, its
    /// serialized body runs once per token on the CPU (the prompt at positions 0.., then
    /// --steps greedy steps; KV caches carried between runs). Prints the generated ids.
    #[command(group(clap::ArgGroup::new("source").required(true).args(["weights", "random_weights"])))]
    Run {
        config: PathBuf,
        /// A safetensors checkpoint with the family's Hugging Face tensor names: a
        /// .safetensors file, or a directory (sharded with model.safetensors.index.json, or
        /// *.safetensors files).
        #[arg(long, value_name = "DIR")]
        weights: Option<PathBuf>,
        /// Seeded random weights instead of a checkpoint.
        #[arg(long)]
        random_weights: bool,
        /// Seed of --random-weights (default 0).
        #[arg(long, requires = "random_weights", conflicts_with = "weights")]
        seed: Option<u64>,
        /// Prompt token ids: 1,2,3.
        #[arg(long, value_name = "IDS", required = true)]
        prompt_ids: String,
        /// Greedy decode steps (generated tokens).
        #[arg(long)]
        steps: usize,
        /// Write `{"generated_ids": [...], "steps": [{"logits": [...]}, ...]}`; `steps[i].logits`
        /// chose `generated_ids[i]`.
        #[arg(long, value_name = "FILE.json")]
        logits_out: Option<PathBuf>,
        /// The chip the megakernel is planned, verified and lowered for.
        #[arg(long, default_value = "v6e")]
        chip: Chip,
        /// KV-cache positions to plan for (default: the positions the run writes, prompt +
        /// steps - 1 + K - 1).
        #[arg(long)]
        context: Option<u64>,
        /// Also run the plain-Rust bf16 reference teacher-forced on the generated ids and
        /// print how far the logits are from it; fails unless they match (docs/numerics.md).
        #[arg(long)]
        check: bool,
        /// Relative logits tolerance of --check: max |ours - reference| <= R * max |reference|
        /// per step (default 2^-6 = 0.015625, the project's logits tolerance).
        #[arg(long, value_name = "R", requires = "check", value_parser = palladium_model::tolerance::parse_relative_tolerance)]
        tolerance: Option<f32>,
        /// Where the megakernel runs: `interpret` (the CPU interpreter) or `tpu` (libtpu's
        /// PJRT client; refused where no TPU is attached).
        #[arg(long, default_value = "interpret", value_parser = parse_backend)]
        backend: Backend,
        /// The weights' dtype: `bf16` (the checkpoint's own values), or quantized at load to
        /// `int8`, `fp8` or `int4` (docs/quantization.md). Default: the checkpoint's own
        /// (fp8 for a config with an FP8 `quantization_config`).
        #[arg(long, value_name = "DTYPE", value_parser = parse_weights_dtype)]
        weights_dtype: Option<WeightsDtype>,
        /// Speculative decoding with prompt-lookup drafts: `ngram` or `ngram:N` (match the
        /// last N tokens, default 3, earlier in the context and propose up to K - 1 of the
        /// tokens that followed); each decode run verifies them (same ids as plain greedy).
        #[arg(long, value_name = "ngram[:N]", value_parser = palladium::run::parse_speculate)]
        speculate: Option<usize>,
        /// Forced drafts instead of the n-gram lookup (for tests): a proposed continuation
        /// of the prompt; each run drafts its next K - 1 ids past the ids generated so far.
        #[arg(long, value_name = "IDS", conflicts_with = "speculate")]
        draft_ids: Option<String>,
        /// Tokens per sequence in one megakernel run, 1..=16 (default 4 with --speculate or
        /// --draft-ids, else 1): the prompt is fed K tokens per run.
        #[arg(long, value_name = "K")]
        tokens_per_seq: Option<u64>,
        /// Split the megakernel over N devices (1, 2, 4, 8; as `megakernel --devices`) and
        /// run it on N virtual devices in the interpreter (each its share of the weights and
        /// its own KV caches); the ids and logits are the one-device run's up to the logits
        /// tolerance.
        #[arg(long, value_name = "N", default_value_t = 1)]
        devices: u64,
    },
    /// The device counterpart of `interpret`: run a library kernel on an attached TPU
    /// (libtpu's PJRT client) on seeded random inputs and compare every output with its
    /// reference. Refused, with libtpu's reason, where no TPU is attached.
    Exec {
        #[command(flatten)]
        check: CheckArgs,
    },
    /// Run a library kernel's serialized Mosaic body in the CPU interpreter on seeded random
    /// inputs and compare every output with the kernel's plain-Rust reference: prints max
    /// abs error and max relative error (max |got - want| / max |want|) per output;
    /// exits non-zero if any output is out of tolerance or the interpreter reports an error.
    Interpret {
        #[command(flatten)]
        check: CheckArgs,
    },
}

/// The megakernel's plan options (`megakernel` and `profile --megakernel`).
#[derive(clap::Args)]
struct PlanArgs {
    #[arg(long, default_value_t = 1)]
    batch: u64,
    #[arg(long, default_value_t = 4096)]
    context: u64,
    /// Use only the first N decoder layers.
    #[arg(long)]
    layers: Option<usize>,
    /// Read every KV-cache tile (masked past the position) with a static trip count:
    /// the cost of a full-context step, priceable by libtpu's static estimate, which
    /// ignores loops with run-time trip counts. Same results.
    #[arg(long)]
    all_kv_tiles: bool,
    /// At most two chunks of a weight stream in flight at once (3 dense banks, two chunks
    /// ahead; the expert ring keeps 2 in flight through each compute), as a double-buffered
    /// pipeline: libtpu's static estimate gives every concurrent DMA its own bandwidth,
    /// so only this variant compares with its HBM floor. Same results.
    #[arg(long)]
    single_prefetch: bool,
    /// New tokens per sequence in one step (1..=16): positions p..p+K-1, causal among
    /// themselves, as a speculative verify step scores K proposed tokens.
    #[arg(long, value_name = "K", default_value_t = 1)]
    tokens_per_seq: u64,
    /// Also return the full f32 logits (the kernel always returns each token row's
    /// greedy id and maximum logit).
    #[arg(long)]
    logits: bool,
    /// Fetch the static worst case of `min(E, batch x K x top_k)` distinct experts per
    /// layer (the extra ones at weight zero) instead of the run-time count of distinct
    /// experts: priceable by libtpu's static estimate. Same results.
    #[arg(long)]
    worst_case_experts: bool,
    /// Split the step over N devices (1, 2, 4, 8; a TensorCore on v7x, a chip on v6e):
    /// attention by heads, experts EP or TP, `lm_head` by vocabulary, in-kernel
    /// all-reduces. The report gives the split (per-device HBM and VMEM, the collectives'
    /// modelled time); the emitted kernel is one SPMD program over a mesh of N devices.
    #[arg(long, value_name = "N", default_value_t = 1)]
    devices: u64,
    /// The weights' dtype the operands take: `bf16`, `int8`, `fp8` or `int4`
    /// (docs/quantization.md). Default: fp8 for a config with an FP8 `quantization_config`,
    /// else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = parse_weights_dtype)]
    weights_dtype: Option<WeightsDtype>,
}

impl PlanArgs {
    /// The plan options for `spec` (its checkpoint's dtype decides the weights when
    /// `--weights-dtype` is not given).
    fn options(
        &self,
        spec: &palladium_model::ModelSpec,
        chip: Chip,
    ) -> Result<palladium_fusion::plan::PlanOptions, String> {
        use palladium_fusion::plan::{ExpertFetch, KvTiles, PlanOptions, Prefetch};
        Ok(PlanOptions {
            layers: self.layers,
            kv_tiles: if self.all_kv_tiles { KvTiles::All } else { KvTiles::UpToPosition },
            prefetch: if self.single_prefetch { Prefetch::Single } else { Prefetch::Deep },
            tokens_per_seq: self.tokens_per_seq,
            logits: self.logits,
            expert_fetch: if self.worst_case_experts {
                ExpertFetch::WorstCase
            } else {
                ExpertFetch::Distinct
            },
            devices: self.devices,
            weights: palladium_fusion::plan::weights_dtype(spec, self.weights_dtype)
                .map_err(|e| e.to_string())?,
            ..PlanOptions::new(chip, self.batch, self.context)
        })
    }
}

/// What `interpret` and `exec` check: a library kernel at its settings on seeded inputs.
#[derive(clap::Args)]
struct CheckArgs {
    kernel: String,
    /// Override a compile-time parameter: NAME=VALUE (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    #[arg(long, default_value = "v6e")]
    chip: Chip,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Relative tolerance for every output (default: bf16 1e-2, f16 1e-3, f32 1e-5,
    /// integers exact).
    #[arg(long)]
    tolerance: Option<f32>,
}

fn build(kernel: &str, set: &[String]) -> Result<palladium_dsl::Kernel, KernelError> {
    let settings = set.iter().map(|s| parse_setting(s)).collect::<Result<Vec<_>, _>>()?;
    palladium_kernels::build(kernel, &settings)
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Kernels => {
            for e in REGISTRY {
                let params: Vec<String> =
                    (e.defaults)().iter().map(|(n, v)| format!("{n}={v}")).collect();
                println!(
                    "{:<12} {}\n{:<12} params: {}",
                    e.name,
                    e.description,
                    "",
                    params.join(" ")
                );
            }
            Ok(())
        }
        Command::Ir { kernel, set, chip, locations } => {
            let k = build(&kernel, &set).map_err(|e| e.to_string())?;
            verify(&k, VerifyOptions { chip: Some(chip) })
                .map_err(|e| format!("kernel `{kernel}` does not verify on {chip}:\n{e}"))?;
            check_hbm(&k, chip)?;
            print!("{}", print_kernel(&k, PrintOptions { locations }));
            Ok(())
        }
        Command::Emit { kernel, chip, set, out } => {
            palladium_kernels::entry(&kernel).map_err(|e| e.to_string())?;
            let out = OutputFolder::check("--out", &out, &file_set(&kernel), &[])?;
            let k = build(&kernel, &set).map_err(|e| e.to_string())?;
            check_hbm(&k, chip)?;
            let lowered = lower(&k, &LowerOptions { chip })
                .map_err(|e| format!("cannot lower `{kernel}` for {chip}:\n{e}"))?;
            let files = emitted_files(&kernel, lowered);
            out.write(&files)?;
            for (name, _) in &files {
                println!("{}", out.dir().join(name).display());
            }
            Ok(())
        }
        Command::Compile { kernel, chip, set, out, json } => {
            palladium_kernels::entry(&kernel).map_err(|e| e.to_string())?;
            let out = out
                .map(|out| OutputFolder::check("--out", &out, &file_set(&kernel), &[]))
                .transpose()?;
            let memory_limit = palladium::host_memory::compile_limit()?;
            let k = build(&kernel, &set).map_err(|e| e.to_string())?;
            check_hbm(&k, chip)?;
            let lowered = lower(&k, &LowerOptions { chip })
                .map_err(|e| format!("cannot lower `{kernel}` for {chip}:\n{e}"))?;
            let report = match palladium::compile::compile(&lowered, chip, memory_limit) {
                Ok(r) => r,
                Err(e) if json => {
                    println!(
                        "{}",
                        serde_json::json!({"ok": false, "kernel": kernel, "chip": chip.name(), "error": e})
                    );
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            if let Some(out) = &out {
                let mut files = emitted_files(&kernel, lowered);
                files.extend(report.files(&kernel));
                out.write(&files)?;
            }
            if json {
                println!("{}", report.json())
            } else {
                print!("{}", report.text())
            }
            Ok(())
        }
        Command::Megakernel { config, chip, plan, out, json, compile } => {
            use palladium_fusion::megakernel::{Megakernel, MegakernelError};
            use palladium_fusion::plan::PlanError;
            let out = OutputFolder::check(
                "--out",
                &out,
                &file_set("megakernel"),
                &[Input::new("the config", &config)],
            )?;
            let memory_limit = compile.then(palladium::host_memory::compile_limit).transpose()?;
            let spec = palladium_model::ModelSpec::from_path(&config).map_err(|e| e.to_string())?;
            let options = plan.options(&spec, chip)?;
            let Megakernel { plan, lowered, .. } =
                Megakernel::build(&spec, &options).map_err(|e| match e {
                    MegakernelError::Plan(PlanError::Hbm { .. }) => format!("{e}; try --layers N"),
                    e => e.to_string(),
                })?;
            let compiled = memory_limit
                .map(|limit| palladium::compile::compile(&lowered, chip, limit))
                .transpose()?;
            let mut files = emitted_files("megakernel", lowered);
            if let Some(c) = &compiled {
                files.extend(c.files("megakernel"));
            }
            out.write(&files)?;
            if json {
                let mut report: serde_json::Value =
                    serde_json::from_str(&palladium_fusion::report::json(&plan))
                        .map_err(|e| e.to_string())?;
                if let (Some(c), Some(obj)) = (&compiled, report.as_object_mut()) {
                    obj.insert("compile".into(), c.json());
                }
                println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
            } else {
                print!("{}", palladium_fusion::report::text(&plan));
                if let Some(c) = &compiled {
                    print!("{}", c.text());
                }
            }
            Ok(())
        }
        Command::Profile {
            kernel,
            set,
            prefetch,
            megakernel,
            plan,
            unfused,
            positions,
            chip,
            out,
        } => {
            use palladium_profile::{Inputs, calibration::Calibration, report, simulate};
            const FILES: [&str; 3] = ["trace.json", "timeline.svg", "summary.json"];
            let inputs: Vec<Input> =
                megakernel.iter().map(|config| Input::new("the config", config)).collect();
            let out = OutputFolder::check("--out", &out, &FILES, &inputs)?;
            let calibration = Calibration::committed();
            let coefficients = calibration.chip(chip).map_err(|e| e.to_string())?;
            let mut inputs = Inputs::default();
            let mut notes = Vec::new();
            let mut unfused_step = None;
            // The planner's modelled collective time per step (seconds), beside the timeline's.
            let mut planner_collectives = None;
            let kernel = match (kernel, megakernel) {
                (Some(name), None) => {
                    palladium_kernels::entry(&name).map_err(|e| e.to_string())?;
                    let k = build(&name, &set).map_err(|e| e.to_string())?;
                    check_hbm(&k, chip)?;
                    for p in &prefetch {
                        let (array, values) = p.split_once('=').ok_or_else(|| {
                            format!("--prefetch {p:?}: expected NAME=V,... (e.g. lens=4096,4096)")
                        })?;
                        let values = values
                            .split(',')
                            .map(|v| v.trim().parse::<i64>())
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|_| {
                                format!(
                                    "--prefetch {p:?}: the values must be comma-separated integers"
                                )
                            })?;
                        inputs.prefetch.insert(array.trim().to_string(), values);
                    }
                    k
                }
                (None, Some(config)) => {
                    use palladium_fusion::plan::{ExpertFetch, Plan};
                    let spec = palladium_model::ModelSpec::from_path(&config)
                        .map_err(|e| e.to_string())?;
                    // The distinct experts of a step are data (routing): profile the plan's
                    // static worst case, which fetches as many as any routing can.
                    let options = palladium_fusion::plan::PlanOptions {
                        expert_fetch: ExpertFetch::WorstCase,
                        ..plan.options(&spec, chip)?
                    };
                    if unfused {
                        unfused_like_fused(&options, positions.is_some())?;
                    }
                    let p = Plan::new(&spec, &options)
                        .map_err(|e| format!("megakernel refused: {e}"))?;
                    notes.push(format!("routing: the static worst case of {} distinct experts per layer (min(E, batch x K x top_k)), each fetched once", p.distinct_experts()));
                    let k = plan.tokens_per_seq;
                    let at = match positions {
                        Some(list) => list.split(',').map(|p| p.trim().parse::<i64>()).collect::<Result<Vec<_>, _>>().map_err(|_| format!("--positions {list:?}: expected comma-separated positions, e.g. 4095,17"))?,
                        None => vec![plan.context as i64 - k as i64; plan.batch as usize],
                    };
                    if at.len() as u64 != plan.batch {
                        return Err(format!(
                            "--positions: {} positions for --batch {}",
                            at.len(),
                            plan.batch
                        ));
                    }
                    if let Some(&bad) = at.iter().find(|&&p| p < 0) {
                        return Err(format!(
                            "--positions: {bad} is not a position (positions are 0 or more)"
                        ));
                    }
                    if let Some(&bad) = at.iter().find(|&&p| p as u64 + k > plan.context) {
                        return Err(format!(
                            "--positions: {bad} + {k} new tokens is past --context {}",
                            plan.context
                        ));
                    }
                    notes.push(format!("positions: {at:?}"));
                    if unfused {
                        unfused_step = Some(palladium::profile::UnfusedStep::new(
                            &spec,
                            p.layers,
                            plan.batch,
                            plan.context,
                            chip,
                            coefficients,
                        )?);
                    }
                    inputs.prefetch.insert("positions".into(), at);
                    planner_collectives = p.sharding.as_ref().map(|s| s.collective_seconds);
                    palladium_fusion::emit::emit(&p)
                        .map_err(|e| format!("cannot build the megakernel:\n{e}"))?
                }
                _ => return Err("give exactly one of KERNEL and --megakernel CONFIG".into()),
            };
            let mut timeline =
                simulate(&kernel, chip, coefficients, &inputs).map_err(|e| e.to_string())?;
            if let Some(links) = &mut timeline.links {
                links.planner_collective_cycles =
                    planner_collectives.map(|secs| secs * timeline.clock_hz);
            }
            // Coefficients the chip's estimator could not isolate are labelled as derived.
            for (name, how) in
                calibration.chips.get(chip.name()).map(|c| &c.derived).into_iter().flatten()
            {
                timeline
                    .assumptions
                    .insert(format!("calibration: {name} derived, not fitted to {chip}: {how}"), 1);
            }
            for n in notes {
                timeline.assumptions.insert(n, 1);
            }
            let trace =
                serde_json::to_string(&report::trace_json(&timeline)).map_err(|e| e.to_string())?;
            let mut summary = report::summary_json(&timeline);
            if let (Some(u), Some(obj)) = (&unfused_step, summary.as_object_mut()) {
                obj.insert("unfused".into(), u.json(timeline.cycles));
            }
            let summary = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
            let files = [
                (FILES[0], trace.into_bytes()),
                (FILES[1], report::svg(&timeline).into_bytes()),
                (FILES[2], summary.into_bytes()),
            ];
            out.write(&files)?;
            print!("{}", report::summary_text(&timeline));
            if let Some(u) = &unfused_step {
                print!("{}", u.text(timeline.cycles));
            }
            Ok(())
        }
        Command::Run {
            config,
            weights,
            random_weights,
            seed,
            prompt_ids,
            steps,
            logits_out,
            chip,
            context,
            check,
            tolerance,
            backend,
            weights_dtype,
            speculate,
            draft_ids,
            tokens_per_seq,
            devices,
        } => {
            use palladium::output::OutputFile;
            use palladium::run::{Progress, RunOptions, WeightSource};
            let source = match (weights, random_weights) {
                (Some(p), false) => WeightSource::Checkpoint(p),
                (None, true) => WeightSource::Random(seed.unwrap_or(0)),
                _ => return Err("give exactly one of --weights DIR and --random-weights".into()),
            };
            use palladium::run::Drafts;
            let drafts = match (speculate, draft_ids) {
                (Some(n), _) => Drafts::Ngram(n),
                (None, Some(ids)) => Drafts::Forced(
                    palladium::run::parse_ids(&ids)
                        .map_err(|e| e.replace("--prompt-ids", "--draft-ids"))?,
                ),
                (None, None) => Drafts::None,
            };
            let tokens_per_seq =
                tokens_per_seq.unwrap_or(if drafts == Drafts::None { 1 } else { 4 });
            let logits = logits_out.is_some() || check;
            let options = RunOptions {
                config,
                weights: source,
                prompt: palladium::run::parse_ids(&prompt_ids)?,
                steps,
                chip,
                context,
                check,
                tokens_per_seq,
                drafts,
                logits,
                weights_dtype,
                devices,
            };
            // A bad --logits-out fails here, before any work.
            let logits_file = logits_out
                .as_deref()
                .map(|p| OutputFile::create("--logits-out", p, &options.inputs()))
                .transpose()?;
            let mut progress = Progress::new();
            let out =
                palladium::run::run(&options, backend, |done, total| progress.update(done, total));
            progress.finish();
            let out = out?;
            let g = &out.generation;
            let on = if devices > 1 { format!(" on {devices} devices") } else { String::new() };
            eprintln!(
                "{} ({} layers), megakernel for {chip}{on} (batch 1, KV cache {} positions, body {} KiB): {} runs ({} prompt tokens, {} generated tokens fed back) interpreted in {:.2} s (parse + prepare {:.1} ms)",
                out.spec.family.model_type(),
                out.spec.layers.len(),
                out.plan_context,
                out.body_bytes / 1024,
                out.runs,
                options.prompt.len(),
                steps - 1,
                out.interpret.as_secs_f64(),
                out.prepare.as_secs_f64() * 1e3
            );
            if options.drafts != Drafts::None {
                let s = &out.speculation;
                eprintln!(
                    "speculation ({}, {} tokens per run): acceptance rate {:.3} ({} of {} drafted tokens), {:.2} tokens per decode run ({} runs for {} generated tokens)",
                    options.drafts.describe(),
                    options.tokens_per_seq,
                    s.acceptance_rate(),
                    s.accepted,
                    s.drafted,
                    s.tokens_per_run(),
                    s.runs,
                    g.generated_ids.len()
                );
            }
            println!(
                "{}",
                g.generated_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            );
            if let Some(file) = logits_file {
                let json = serde_json::to_string(g).map_err(|e| e.to_string())?;
                file.commit(json.as_bytes())?;
            }
            if check {
                let relative =
                    tolerance.unwrap_or(palladium_model::tolerance::LOGITS_RELATIVE_TOLERANCE);
                let c = palladium::run::check_reference(&options, &out, relative)?;
                let on = if out.weights_dtype == WeightsDtype::Bf16 {
                    String::new()
                } else {
                    format!(" on the dequantized {} weights", out.weights_dtype.name())
                };
                println!("reference{on} (teacher-forced on these ids): {}", c.summary());
                if let Some((abs, rel)) = palladium::run::quantization_error(&options, &out)? {
                    println!(
                        "quantization error against the bf16 model (reported, not checked): max |logits diff| {abs:.4e} ({rel:.4e} of its max |logit|)"
                    );
                }
                if !c.passed() {
                    return Err("the megakernel does not match the reference".into());
                }
            }
            Ok(())
        }
        Command::Exec { check } => check_kernel(check, Backend::Tpu),
        Command::Interpret { check } => check_kernel(check, Backend::Interpret),
    }
}

/// `profile --unfused` compares like with like: the unfused step is modelled as bf16 library
/// kernels on one device, one token per sequence, attending to the full context (static
/// bounds); a fused step planned otherwise is refused with the difference.
fn unfused_like_fused(
    options: &palladium_fusion::plan::PlanOptions,
    positions_given: bool,
) -> Result<(), String> {
    let why = if options.tokens_per_seq != 1 {
        "the unfused step is one token per sequence (drop --tokens-per-seq)".to_string()
    } else if options.devices != 1 {
        format!(
            "the unfused step is modelled on one device, the fused one on --devices {} (no sharded unfused step with its collectives): drop one of them",
            options.devices
        )
    } else if options.weights != WeightsDtype::Bf16 {
        format!(
            "the unfused step is modelled with bf16 library kernels, the fused one with {} weights (--weights-dtype, or the config's quantization_config): drop --unfused, or profile bf16 weights",
            options.weights.name()
        )
    } else if positions_given {
        "the unfused step attends to the full context (static bounds), the fused one from --positions: drop one of them".to_string()
    } else {
        return Ok(());
    };
    Err(format!("--unfused: {why}"))
}

/// `interpret` / `exec`: the kernel's outputs on `backend` against its reference.
fn check_kernel(args: CheckArgs, backend: Backend) -> Result<(), String> {
    let CheckArgs { kernel, set, chip, seed, tolerance } = args;
    let settings = set
        .iter()
        .map(|s| parse_setting(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let max_host_memory = palladium::host_memory::limit()?;
    let report = check_on(
        &kernel,
        &settings,
        &CheckOptions { chip, seed, tolerance, max_host_memory },
        backend,
    )
    .map_err(|e| e.to_string())?;
    println!("{report}");
    let on = if backend == Backend::Tpu { " on the TPU" } else { "" };
    if report.passed() {
        Ok(())
    } else {
        Err(format!("`{kernel}` does not match its reference{on}"))
    }
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    match s {
        "interpret" => Ok(Backend::Interpret),
        "tpu" => Ok(Backend::Tpu),
        _ => Err(format!("unknown backend `{s}` (known: interpret, tpu)")),
    }
}

fn parse_weights_dtype(s: &str) -> Result<WeightsDtype, String> {
    if s == "mxfp4" {
        return Err(format!(
            "`mxfp4` (MXFP4 experts kept as codes in HBM) is not supported yet: an MXFP4 checkpoint (gpt-oss) is decoded to bf16 values on load, so leave --weights-dtype out (known: {})",
            WeightsDtype::NAMES
        ));
    }
    WeightsDtype::parse(s)
        .ok_or_else(|| format!("unknown weights dtype `{s}` (known: {})", WeightsDtype::NAMES))
}

/// libtpu reads its environment once, at load: a command that loads it in this process
/// (`exec`, `run --backend tpu`) runs again as a child with it set, unless it is set.
fn rerun_with_libtpu_environment(cli: &Cli) -> Option<ExitCode> {
    let loads_libtpu =
        matches!(cli.command, Command::Exec { .. } | Command::Run { backend: Backend::Tpu, .. });
    let env = palladium_runtime::libtpu::LIBTPU_ENVIRONMENT;
    if !loads_libtpu || env.iter().all(|(k, v)| std::env::var(k).as_deref() == Ok(*v)) {
        return None;
    }
    let status = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe).args(std::env::args_os().skip(1)).envs(env).status()
    });
    Some(match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: cannot run palladium again with libtpu's environment: {e}");
            ExitCode::FAILURE
        }
    })
}

/// `profile`'s flags that only a library KERNEL uses; `chip`, `out` and the target itself
/// serve both targets, every other flag only `--megakernel`.
const PROFILE_KERNEL_FLAGS: [&str; 2] = ["set", "prefetch"];
const PROFILE_COMMON: [&str; 4] = ["kernel", "megakernel", "chip", "out"];

/// A `profile` flag given on the command line that the chosen target does not use: refused,
/// never ignored. (clap's `requires` cannot say this: it counts a required argument as
/// present when it conflicts with one given, and KERNEL and --megakernel conflict.)
fn unused_profile_flag(profile: &clap::Command, m: &clap::ArgMatches) -> Option<String> {
    use clap::parser::ValueSource;
    let kernel = m.get_one::<String>("kernel");
    profile.get_arguments().find_map(|arg| {
        let id = arg.get_id().as_str();
        if m.value_source(id) != Some(ValueSource::CommandLine) || PROFILE_COMMON.contains(&id) {
            return None;
        }
        let flag = format!("--{}", arg.get_long().unwrap_or(id));
        match (kernel, PROFILE_KERNEL_FLAGS.contains(&id)) {
            (None, true) => Some(format!(
                "{flag} applies to a library KERNEL (`palladium profile KERNEL {flag} ...`), not to --megakernel: drop it (the megakernel takes its plan options: --layers, --batch, --context, ...)"
            )),
            (Some(name), false) => Some(format!(
                "{flag} is a megakernel option: give --megakernel CONFIG, or drop it to profile `{name}`"
            )),
            _ => None,
        }
    })
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command).exit());
    if let Some(("profile", m)) = matches.subcommand()
        && let Some(profile) = command.find_subcommand_mut("profile")
        && let Some(why) = unused_profile_flag(profile, m)
    {
        profile.error(clap::error::ErrorKind::ArgumentConflict, why).exit();
    }
    if let Some(code) = rerun_with_libtpu_environment(&cli) {
        return code;
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
