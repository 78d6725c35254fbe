//! The source maps (`palladium_fusion::source`) agree with the layout: every weight operand
//! has one map of its shape, no element of an operand is written twice or out of bounds,
//! every read lies inside its checkpoint tensor, and every element of every tensor an
//! operand reads is read as often as the split says (once; on every device for the
//! replicated ones; once per replica for replicated KV heads), on 1 and 2 devices, bf16 and
//! quantized. A wrong map (a block moved or cut short) is caught.

use palladium_dsl::build::OperandRole;
use palladium_dsl::spec::Chip;
use palladium_fusion::graph::WeightKind;
use palladium_fusion::layout::{Ffn, OperandKind};
use palladium_fusion::plan::{Plan, PlanOptions};
use palladium_fusion::source::{Element, OperandSource, Role, source_maps};
use palladium_model::ModelSpec;
use palladium_model::quant::WeightsDtype;
use std::collections::{BTreeMap, BTreeSet};

fn plan(name: &str, weights: WeightsDtype, devices: u64) -> Plan {
    let path = format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let spec = ModelSpec::from_path(path).unwrap();
    Plan::new(&spec, &PlanOptions { weights, devices, ..PlanOptions::new(Chip::V6e, 1, 16) })
        .unwrap()
}

/// A tensor instance: role, layer, expert.
type TensorKey = (Role, Option<u64>, Option<u64>);

/// Checks `maps` (of `plan`) against the layout and the model's tensors; `Err` names the
/// first disagreement.
fn check(plan: &Plan, maps: &[OperandSource]) -> Result<(), String> {
    let weight_operands: Vec<OperandKind> = plan
        .layout
        .operands
        .iter()
        .filter(|o| o.role == OperandRole::Input)
        .filter(|o| !matches!(o.kind, OperandKind::KCache | OperandKind::VCache))
        .map(|o| o.kind)
        .collect();
    let mapped: Vec<OperandKind> = maps.iter().map(|m| m.operand).collect();
    if mapped != weight_operands {
        return Err(format!("maps {mapped:?}, weight operands {weight_operands:?}"));
    }
    let devices = plan.sharding.as_ref().map_or(1, |sh| sh.devices);
    let replicas = plan.sharding.as_ref().map_or(1, |sh| sh.heads.kv_replicas);
    for map in maps {
        let o = plan.layout.operand(map.operand).unwrap();
        if map.shape != o.shape {
            return Err(format!(
                "{}: map shape {:?}, layout {:?}",
                o.kind.name(),
                map.shape,
                o.shape
            ));
        }
        let size: u64 = o.shape.iter().product();
        // Reads of each tensor element (values and codes), over all devices.
        let mut reads: BTreeMap<TensorKey, Vec<u32>> = BTreeMap::new();
        for me in 0..devices {
            let mut written = vec![0u8; size as usize];
            for b in &map.blocks {
                let shape = b.read.tensor.shape(&plan.model_dims);
                let (outs, ins) =
                    if shape.len() == 1 { (1, shape[0]) } else { (shape[0], shape[1]) };
                if b.cols > b.row_stride && b.rows > 1 {
                    return Err(format!("{}: a block's rows overlap", o.kind.name()));
                }
                for inst in b.instances(plan, me) {
                    if inst.at + (b.rows - 1) * b.row_stride + b.cols > size {
                        return Err(format!("{}: a block past the operand's end", o.kind.name()));
                    }
                    let key = (
                        b.read.tensor,
                        inst.layer.filter(|_| b.read.tensor.per_layer()),
                        inst.expert,
                    );
                    for r in 0..b.rows {
                        let Some(ri) = b.row.model(me, inst.chunk, r) else { continue };
                        for s in 0..b.cols {
                            let Some(ci) = b.col.model(me, inst.chunk, s) else { continue };
                            let at = (inst.at + r * b.row_stride + s) as usize;
                            written[at] += 1;
                            if written[at] > 1 {
                                return Err(format!(
                                    "{}: element {at} written twice on device {me}",
                                    o.kind.name()
                                ));
                            }
                            let (oi, ii) = if shape.len() == 1 {
                                (0, ci)
                            } else if b.read.transposed {
                                (ci, ri)
                            } else {
                                (ri, ci)
                            };
                            if oi >= outs || ii >= ins {
                                return Err(format!(
                                    "{}: reads {:?}[{oi}, {ii}] of {shape:?}",
                                    o.kind.name(),
                                    b.read.tensor
                                ));
                            }
                            if !matches!(b.read.element, Element::Scale(_)) {
                                reads
                                    .entry(key)
                                    .or_insert_with(|| vec![0; (outs * ins) as usize])
                                    [(oi * ins + ii) as usize] += 1;
                            }
                        }
                    }
                }
            }
        }
        // Every tensor instance of the operand's roles, every element as often as the split
        // replicates it.
        let roles: BTreeSet<Role> = reads.keys().map(|k| k.0).collect();
        for role in roles {
            let times = match role {
                Role::Embed
                | Role::Weight(
                    WeightKind::Router
                    | WeightKind::SharedExpertGate
                    | WeightKind::InputNorm
                    | WeightKind::PostAttentionNorm
                    | WeightKind::FinalNorm
                    | WeightKind::QNorm
                    | WeightKind::KNorm
                    | WeightKind::CorrectionBias
                    | WeightKind::OBias,
                ) => devices as u32,
                Role::Weight(
                    WeightKind::KProj | WeightKind::VProj | WeightKind::KBias | WeightKind::VBias,
                ) => replicas as u32,
                _ => 1,
            };
            let layers: Vec<Option<u64>> = if !role.per_layer() {
                vec![None]
            } else {
                let kind = match role {
                    Role::Weight(
                        WeightKind::Router
                        | WeightKind::CorrectionBias
                        | WeightKind::SharedExpertGate
                        | WeightKind::SharedGate
                        | WeightKind::SharedUp
                        | WeightKind::SharedDown,
                    ) => Some(Ffn::RoutedExperts),
                    _ if role.per_expert() => Some(Ffn::RoutedExperts),
                    Role::Weight(WeightKind::MlpGate | WeightKind::MlpUp | WeightKind::MlpDown) => {
                        Some(Ffn::DenseMlp)
                    }
                    _ => None,
                };
                (0..plan.layers as u64)
                    .filter(|&l| kind.is_none_or(|k| plan.layer_ffns.0[l as usize] == k))
                    .map(Some)
                    .collect()
            };
            let experts: Vec<Option<u64>> = if role.per_expert() {
                (0..plan.dims.experts).map(Some).collect()
            } else {
                vec![None]
            };
            for &l in &layers {
                for &e in &experts {
                    let Some(counts) = reads.get(&(role, l, e)) else {
                        return Err(format!(
                            "{}: {role:?} of layer {l:?} expert {e:?} never read",
                            o.kind.name()
                        ));
                    };
                    if let Some(i) = counts.iter().position(|&c| c != times) {
                        return Err(format!(
                            "{}: element {i} of {role:?} of layer {l:?} expert {e:?} read {} times, not {times}",
                            o.kind.name(),
                            counts[i]
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

const FIXTURES: [&str; 6] = [
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-qwen3-moe-mlp-only-layers",
    "tiny-qwen3-moe-sparse-step-2",
    "tiny-qwen3-moe-tf5",
    // Sizes padded to 128-lane tiles: every checkpoint element read once all the same.
    "tiny-glm4-moe-padded",
];

#[test]
fn source_maps_cover_the_layout_and_the_tensors() {
    for name in FIXTURES {
        for devices in [1, 2] {
            for dtype in [WeightsDtype::Bf16, WeightsDtype::Int8, WeightsDtype::Fp8] {
                let p = plan(name, dtype, devices);
                check(&p, &source_maps(&p)).unwrap_or_else(|e| {
                    panic!("{name} on {devices} devices, {}: {e}", dtype.name())
                });
            }
        }
    }
    // Qwen2-MoE's q/k/v biases, shared expert and its gate (bf16 only: a shared expert is
    // not planned quantized).
    for devices in [1, 2] {
        let p = plan("tiny-qwen2-moe", WeightsDtype::Bf16, devices);
        check(&p, &source_maps(&p))
            .unwrap_or_else(|e| panic!("tiny-qwen2-moe on {devices} devices: {e}"));
    }
}

#[test]
fn a_wrong_source_map_is_caught() {
    let p = plan("tiny-qwen3-moe", WeightsDtype::Bf16, 2);
    let good = source_maps(&p);
    let stream = good.iter().position(|m| m.operand == OperandKind::WStream).unwrap();
    // A block moved onto its neighbour's columns.
    let mut moved = good.clone();
    moved[stream].blocks[1].at = moved[stream].blocks[0].at;
    assert!(check(&p, &moved).unwrap_err().contains("written twice"));
    // A block cut short: its tensor's last input never read.
    let mut short = good.clone();
    short[stream].blocks[0].rows -= 1;
    assert!(check(&p, &short).unwrap_err().contains("read 0 times"));
    // A missing operand.
    let mut missing = good.clone();
    missing.remove(stream);
    assert!(check(&p, &missing).unwrap_err().starts_with("maps"));
}
