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
