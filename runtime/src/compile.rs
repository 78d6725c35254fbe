//! One deviceless compile with libtpu, in this process: `PJRT_TopologyDescription_Create`,
//! `PJRT_Compile` without a client (one replica, one partition), the compiled memory stats,
//! optionally the serialized executable, and libtpu's static cycle estimate read from the
//! profile it dumps (`--xla_jf_dump_static_llo_profile_to`, set in `LIBTPU_INIT_ARGS` when the
//! process started). Only workers ([`crate::worker`]) call this: the estimator can abort the
//! whole process.

use crate::ffi::{Plugin, Topology};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Device memory (HBM) of the compiled program, from `PJRT_Executable_GetCompiledMemoryStats`
/// (what JAX's `compiled.memory_analysis()` reports). PJRT's stats cover HBM only: the
/// kernel's VMEM is its scoped-VMEM limit (`vmem_limit_bytes` of the call spec, else the
/// chip's default), not a compiled statistic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HbmStats {
    pub argument_bytes: i64,
    pub output_bytes: i64,
    /// Bytes of arguments reused as outputs.
    pub alias_bytes: i64,
    /// XLA temporaries (e.g. copies that honour an alias of a non-donated input).
    pub temp_bytes: i64,
    /// Peak device memory of a run.
    pub peak_bytes: i64,
}

/// libtpu's estimate of one HLO op of the program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCycles {
    pub op: String,
    pub estimated_cycles: u64,
}

/// The result of one compile.
#[derive(Clone, Serialize, Deserialize)]
pub struct Compiled {
    /// `generated_code_size_in_bytes` of the memory stats (JAX's figure).
    pub code_size_bytes: i64,
    pub hbm: HbmStats,
    /// The sum of libtpu's static LLO profile over the program's ops, where there is one.
    pub estimated_cycles: Option<u64>,
    /// Why `estimated_cycles` is null.
    pub estimate_note: Option<String>,
    /// Per HLO op (the kernel's custom call, plus any copy XLA adds).
    pub ops: Vec<OpCycles>,
    /// Wall time of `PJRT_Compile` and the estimate in the worker (seconds).
    pub compile_seconds: f64,
    /// `PJRT_Executable_Serialize`, where asked for.
    #[serde(skip)]
    pub executable: Option<Vec<u8>>,
}

impl std::fmt::Debug for Compiled {
    /// Everything but the executable's bytes (their count instead).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("code_size_bytes", &self.code_size_bytes)
            .field("hbm", &self.hbm)
            .field("estimated_cycles", &self.estimated_cycles)
            .field("estimate_note", &self.estimate_note)
            .field("ops", &self.ops)
            .field("compile_seconds", &self.compile_seconds)
            .field("executable_bytes", &self.executable.as_ref().map(Vec::len))
            .finish()
    }
}

/// A loaded libtpu with its topologies, created once per name.
pub struct Session<'p> {
    plugin: &'p Plugin,
    topologies: HashMap<String, Topology<'p>>,
}

impl<'p> Session<'p> {
    pub fn new(plugin: &'p Plugin) -> Session<'p> {
        Session { plugin, topologies: HashMap::new() }
    }

    /// Compile the StableHLO text `program` for the first device of `topology`. With
    /// `profile_dir`, libtpu dumps its static profile there: stale files are removed first,
    /// and the new ones are read and removed after.
    pub fn compile(
        &mut self,
        program: &str,
        topology: &str,
        serialize: bool,
        profile_dir: Option<&Path>,
    ) -> Result<Compiled, String> {
        if !self.topologies.contains_key(topology) {
            let t = self
                .plugin
                .topology(topology)
                .map_err(|e| format!("cannot create the topology {topology}: {e}"))?;
            self.topologies.insert(topology.to_string(), t);
        }
        let topo = &self.topologies[topology];
        if let Some(dir) = profile_dir {
            read_profile(dir)?;
        }
        let started = std::time::Instant::now();
        // One replica; as many partitions as the program says (`mhlo.num_partitions`, more
        // than one for a multi-device kernel: `crate::stablehlo::wrap`).
        let options = crate::ffi::partitioned_options(crate::stablehlo::num_partitions(program));
        let exe = self.plugin.compile(program.as_bytes(), topo, &options)?;
        let stats = exe.memory_stats()?;
        let executable = if serialize { Some(exe.serialize()?) } else { None };
        let (estimated_cycles, estimate_note, ops) = match profile_dir {
            None => (None, Some("no estimate asked for".to_string()), vec![]),
            Some(dir) => {
                let ops = read_profile(dir)?;
                let total: u64 = ops.iter().map(|o| o.estimated_cycles).sum();
                if ops.is_empty() {
                    (None, Some("libtpu wrote no static profile for this program".to_string()), ops)
                } else if total == 0 {
                    (None, Some("libtpu's static profile prices the program at 0 cycles, which is no estimate (it does so, e.g., for kernels with remote DMAs)".to_string()), ops)
                } else {
                    (Some(total), None, ops)
                }
            }
        };
        Ok(Compiled {
            code_size_bytes: stats.generated_code_size_in_bytes,
            hbm: HbmStats {
                argument_bytes: stats.argument_size_in_bytes,
                output_bytes: stats.output_size_in_bytes,
                alias_bytes: stats.alias_size_in_bytes,
                temp_bytes: stats.temp_size_in_bytes,
                peak_bytes: stats.peak_memory_in_bytes,
            },
            estimated_cycles,
            estimate_note,
            ops,
            compile_seconds: started.elapsed().as_secs_f64(),
            executable,
        })
    }
}

/// Read (and remove) every `*static_llo_profile*` file in `dir`: each HLO op's
/// `estimated_cycles` (text protos: `hlo_op_name: "…"` then `estimated_cycles: N`).
fn read_profile(dir: &Path) -> Result<Vec<OpCycles>, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the profile directory {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().contains("static_llo_profile"))
        })
        .collect();
    files.sort();
    let mut ops = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        ops.extend(parse_profile(&text));
        let _ = std::fs::remove_file(&f);
    }
    Ok(ops)
}

/// The `(hlo_op_name, estimated_cycles)` pairs of one profile dump: an op's
/// `estimated_cycles` is the line right after its `hlo_op_name`.
fn parse_profile(text: &str) -> Vec<OpCycles> {
    let mut ops = Vec::new();
    let mut op: Option<String> = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let name = op.take();
        if let Some(rest) = line.strip_prefix("hlo_op_name:") {
            op = Some(rest.trim().trim_matches('"').to_string());
        } else if let (Some(name), Some(rest)) = (name, line.strip_prefix("estimated_cycles:"))
            && let Ok(cycles) = rest.trim().parse::<u64>()
        {
            ops.push(OpCycles { op: name, estimated_cycles: cycles });
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_give_cycles_per_op() {
        let text = "ops {\n  hlo_op_name: \"tpu_custom_call.1\"\n  estimated_cycles: 46041\n}\nops {\n  hlo_op_name: \"copy\"\n  estimated_cycles: 12\n}\nestimated_cycles: 7\n";
        let ops = parse_profile(text);
        assert_eq!(
            ops,
            [
                OpCycles { op: "tpu_custom_call.1".into(), estimated_cycles: 46041 },
                OpCycles { op: "copy".into(), estimated_cycles: 12 }
            ]
        );
    }
}
