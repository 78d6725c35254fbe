//! The oracle's call spec JSON: the full array types of the custom call's operands
//! (scalar prefetch, then inputs) and results, plus the VMEM limit, aliases and name.

use palladium_dsl::ir::{Kernel, OpData};
use palladium_dsl::spec::{OperandRole, OperandSpec};

#[derive(serde::Serialize)]
struct CallJson<'a> {
    inputs: Vec<String>,
    outputs: Vec<String>,
    vmem_limit_bytes: Option<u64>,
    /// `[custom-call operand index, output index]` (operand indices count prefetch arrays).
    input_output_aliases: Vec<[usize; 2]>,
    name: &'a str,
    /// Multi-device kernels only (absent otherwise): the devices of the mesh (operand types
    /// are then per device, as under `jax.shard_map`), and what the custom call's backend
    /// config gains, as JAX sets it: `has_communication` when the body names a device,
    /// `collective_id` for the barrier semaphore.
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mesh: Option<Vec<(String, u64)>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    has_communication: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collective_id: Option<u32>,
}

/// `bf16[1024,2048]`.
fn array_type(o: &OperandSpec) -> String {
    let dims: Vec<String> = o.shape.dims().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", o.dtype.name(), dims.join(","))
}

/// Whether the body names another device (a remote DMA or signal, or the device id), what
/// makes JAX set `has_communication`.
fn communicates(k: &Kernel) -> bool {
    k.ops.values().any(|node| match &node.data {
        OpData::DeviceId => true,
        OpData::DmaStart { remote, .. } => remote.is_some(),
        OpData::SemSignal { device_id, .. } => device_id.is_some(),
        _ => false,
    })
}

pub(crate) fn call_json(k: &Kernel) -> String {
    let c = &k.call;
    let prefetch = c.operands_of(OperandRole::Prefetch).count();
    let spec = CallJson {
        inputs: c
            .operands
            .iter()
            .filter(|o| o.role != OperandRole::Output)
            .map(array_type)
            .collect(),
        outputs: c.operands_of(OperandRole::Output).map(array_type).collect(),
        vmem_limit_bytes: c.vmem_limit_bytes,
        input_output_aliases: c.aliases.iter().map(|&(i, o)| [i + prefetch, o]).collect(),
        name: &k.name,
        devices: c.mesh.as_ref().map(|m| m.devices()),
        mesh: c.mesh.as_ref().map(|m| m.axes.iter().map(|a| (a.name.clone(), a.size)).collect()),
        has_communication: c.mesh.as_ref().map(|_| communicates(k)),
        collective_id: c.collective_id,
    };
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_string(&spec).unwrap_or_default()
}
