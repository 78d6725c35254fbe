//! `palladium`: the command-line front end.

use clap::{Parser, Subcommand};
use palladium_dsl::ir::{PrintOptions, VerifyOptions, print_kernel, verify};
use palladium_dsl::spec::Chip;
use palladium_kernels::{KernelError, REGISTRY, parse_setting};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "palladium", version, about = "A Rust compiler for TPU kernels (Pallas-style DSL lowered to Mosaic MLIR)")]
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
}

fn build(kernel: &str, set: &[String]) -> Result<palladium_dsl::Kernel, KernelError> {
    let settings = set.iter().map(|s| parse_setting(s)).collect::<Result<Vec<_>, _>>()?;
    palladium_kernels::build(kernel, &settings)
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Kernels => {
            for e in REGISTRY {
                let params: Vec<String> = (e.defaults)().iter().map(|(n, v)| format!("{n}={v}")).collect();
                println!("{:<12} {}\n{:<12} params: {}", e.name, e.description, "", params.join(" "));
            }
            Ok(())
        }
        Command::Ir { kernel, set, chip, locations } => {
            let k = build(&kernel, &set).map_err(|e| e.to_string())?;
            verify(&k, VerifyOptions { chip: Some(chip) }).map_err(|e| format!("kernel `{kernel}` does not verify on {chip}:\n{e}"))?;
            print!("{}", print_kernel(&k, PrintOptions { locations }));
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
