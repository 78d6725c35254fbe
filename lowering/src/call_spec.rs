//! The oracle's call spec JSON: the full array types of the custom call's operands
//! (scalar prefetch, then inputs) and results, plus the VMEM limit, aliases and name.

use palladium_dsl::ir::Kernel;
use palladium_dsl::spec::{OperandRole, OperandSpec};

#[derive(serde::Serialize)]
struct CallJson<'a> {
    inputs: Vec<String>,
    outputs: Vec<String>,
    vmem_limit_bytes: Option<u64>,
    /// `[custom-call operand index, output index]` (operand indices count prefetch arrays).
    input_output_aliases: Vec<[usize; 2]>,
    name: &'a str,
}

/// `bf16[1024,2048]`.
fn array_type(o: &OperandSpec) -> String {
    let dims: Vec<String> = o.shape.dims().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", o.dtype.name(), dims.join(","))
}

pub(crate) fn call_json(k: &Kernel) -> String {
    let c = &k.call;
    let prefetch = c.operands_of(OperandRole::Prefetch).count();
    let spec = CallJson {
        inputs: c.operands.iter().filter(|o| o.role != OperandRole::Output).map(array_type).collect(),
        outputs: c.operands_of(OperandRole::Output).map(array_type).collect(),
        vmem_limit_bytes: c.vmem_limit_bytes,
        input_output_aliases: c.aliases.iter().map(|&(i, o)| [i + prefetch, o]).collect(),
        name: &k.name,
    };
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_string(&spec).unwrap_or_default()
}
