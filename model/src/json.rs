//! A small typed reader over a JSON object that turns every failure into a [`ConfigError`]
//! naming the field. `serde_json`'s derive errors name a line and column, not the field, so the
//! config is read field by field instead.

use serde_json::{Map, Value};

use crate::error::ConfigError;

/// Upper bound on every size read from a config (dimensions, counts, positions). Real models
/// are far below it (vocabularies ~256 Ki, hidden sizes ~16 Ki, contexts ~10 Mi); with it,
/// products of four sizes fit in `u128`, so the cost model never overflows on a parsed model.
pub(crate) const MAX_SIZE: u64 = 1 << 24;

/// One JSON object plus the path prefix used in error messages (`""` at the top level,
/// `"rope_parameters."` inside that object).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Obj<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

/// A short description of a JSON value for error messages: strings quoted, containers abridged.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!("an array of {} elements", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

impl<'a> Obj<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Self { map, prefix }
    }

    /// The full path of `key` for messages.
    pub(crate) fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value of `key`, with `null` read as absent (Hugging Face writes `null` for `None`).
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present as `null` (which [`Obj::get`] reads as absent).
    pub(crate) fn is_null(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(Value::is_null)
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn type_error(&self, key: &str, expected: &'static str, found: &Value) -> ConfigError {
        ConfigError::Type { field: self.path(key), expected, found: describe(found) }
    }

    pub(crate) fn missing(&self, key: &str) -> ConfigError {
        ConfigError::Missing { field: self.path(key), hint: String::new() }
    }

    pub(crate) fn opt_u64(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.get(key)
            .map(|v| v.as_u64().ok_or_else(|| self.type_error(key, "a non-negative integer", v)))
            .transpose()
    }

    pub(crate) fn req_u64(&self, key: &str) -> Result<u64, ConfigError> {
        self.opt_u64(key)?.ok_or_else(|| self.missing(key))
    }

    /// A required size (a dimension or count): at least 1 and at most [`MAX_SIZE`].
    pub(crate) fn req_pos(&self, key: &str) -> Result<u64, ConfigError> {
        let v = self.req_u64(key)?;
        if v == 0 {
            return Err(ConfigError::invalid(self.path(key), 0, "must be at least 1"));
        }
        self.cap(key, v)
    }

    /// An optional size, at most [`MAX_SIZE`] (0 is left to the caller).
    pub(crate) fn opt_size(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.opt_u64(key)?.map(|v| self.cap(key, v)).transpose()
    }

    fn cap(&self, key: &str, v: u64) -> Result<u64, ConfigError> {
        if v > MAX_SIZE {
            return Err(ConfigError::invalid(
                self.path(key),
                v,
                format!("larger than {MAX_SIZE}, the most Palladium accepts for a size"),
            ));
        }
        Ok(v)
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.type_error(key, "a number", v)))
            .transpose()
    }

    /// An optional number that must be finite and strictly positive.
    pub(crate) fn opt_pos_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        let v = self.opt_f64(key)?;
        if let Some(x) = v
            && !(x.is_finite() && x > 0.0)
        {
            return Err(ConfigError::invalid(self.path(key), x, "must be a finite number > 0"));
        }
        Ok(v)
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.type_error(key, "true or false", v)))
            .transpose()
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.type_error(key, "a string", v)))
            .transpose()
    }

    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
        self.get(key)
            .map(|v| v.as_object().ok_or_else(|| self.type_error(key, "an object or null", v)))
            .transpose()
    }

    fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| self.type_error(key, "an array", v)))
            .transpose()
    }

    pub(crate) fn opt_u64_list(&self, key: &str) -> Result<Option<Vec<u64>>, ConfigError> {
        self.opt_list(key, "a non-negative integer", Value::as_u64)
    }

    /// A size per layer: one integer for every layer, or an array of `layers` of them
    /// (Hunyuan's `num_experts`, `moe_topk`).
    pub(crate) fn opt_per_layer(
        &self,
        key: &str,
        layers: u64,
    ) -> Result<Option<Vec<u64>>, ConfigError> {
        if let Some(n) = self.get(key).and_then(Value::as_u64) {
            return Ok(Some(vec![n; layers as usize]));
        }
        let Some(list) = self.opt_list(key, "a non-negative integer", Value::as_u64)? else {
            return Ok(None);
        };
        if list.len() as u64 != layers {
            return Err(ConfigError::Invalid {
                field: self.path(key),
                value: format!("an array of {} elements", list.len()),
                reason: format!("needs one entry per layer ({layers}), or one integer for all"),
            });
        }
        Ok(Some(list))
    }

    pub(crate) fn opt_str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConfigError> {
        self.opt_list(key, "a string", Value::as_str)
    }

    /// An optional array whose every item converts with `item`; a bad item is named by its
    /// index (`field[i]`).
    fn opt_list<T>(
        &self,
        key: &str,
        expected: &'static str,
        item: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>, ConfigError> {
        let Some(items) = self.opt_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                item(v).ok_or_else(|| ConfigError::Type {
                    field: format!("{}[{i}]", self.path(key)),
                    expected,
                    found: describe(v),
                })
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.map.keys().map(String::as_str)
    }
}
