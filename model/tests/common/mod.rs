//! Fixture loading shared by the model tests.

#![allow(dead_code)]

use palladium_model::{ConfigError, ModelSpec};
use serde_json::Value;

pub fn fixture_text(name: &str) -> String {
    let path = format!("{}/../fixtures/models/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture_text(name)).expect("fixture is JSON")
}

pub fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_json_str(&fixture_text(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The fixture `name` with `edits` applied: `Some(v)` sets a top-level field, `None` removes it.
pub fn edited(name: &str, edits: &[(&str, Option<Value>)]) -> Result<ModelSpec, ConfigError> {
    let mut v = fixture_json(name);
    let map = v.as_object_mut().expect("object");
    for (key, value) in edits {
        match value {
            Some(value) => map.insert((*key).to_string(), value.clone()),
            None => map.remove(*key),
        };
    }
    ModelSpec::from_json(&v)
}

/// The entries of an FP8 checkpoint as a transformers FP8 model ships them: name → (dtype,
/// shape, bytes), codes with their `weight_scale_inv`; and the quantized weights they hold
/// (random weights of `spec`, `seed`).
pub type Entries = std::collections::BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

pub fn fp8_entries(
    spec: &ModelSpec,
    seed: u64,
) -> (palladium_model::quant::QuantizedWeights, Entries) {
    use palladium_model::quant::{QuantizedWeights, StoredTensor, WeightsDtype};
    use safetensors::Dtype;
    let weights = palladium_model::weights::Weights::random(spec, seed).unwrap();
    let q = QuantizedWeights::quantize(spec, &weights, WeightsDtype::Fp8).unwrap();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut entries = Entries::new();
    for (name, stored) in q.iter() {
        match stored {
            StoredTensor::Plain(t) => {
                entries.insert(name.into(), (Dtype::F32, t.shape.clone(), f32_bytes(&t.data)));
            }
            StoredTensor::Quantized(t) => {
                entries.insert(name.into(), (Dtype::F8_E4M3, t.shape.to_vec(), t.data.clone()));
                entries.insert(
                    format!("{name}_scale_inv"),
                    (Dtype::F32, t.scales.shape.clone(), f32_bytes(&t.scales.values)),
                );
            }
        }
    }
    (q, entries)
}
