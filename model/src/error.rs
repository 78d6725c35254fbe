//! Errors from reading a `config.json`. Every variant names the field it is about, so a user
//! can fix the file without reading this crate.

use thiserror::Error;

/// Why a `config.json` could not be turned into a [`crate::ModelSpec`].
///
/// Field names are JSON paths into the config: `"hidden_act"`, `"rope_scaling.rope_type"`,
/// `"mlp_only_layers[2]"`. [`ConfigError::field`] returns it for tests and tools.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read: {message}")]
    Io { path: String, message: String },
    /// The text is not JSON, or its top level is not an object.
    #[error("config.json: not a JSON object: {message}")]
    Json { message: String },
    /// A field the model needs is absent (or `null`).
    #[error("config.json: missing required field \"{field}\"{hint}")]
    Missing { field: String, hint: String },
    /// A field has the wrong JSON type.
    #[error("config.json: field \"{field}\": expected {expected}, got {found}")]
    Type {
        field: String,
        expected: &'static str,
        found: String,
    },
    /// A field has a well-formed value this crate (or the family) does not support.
    #[error("config.json: field \"{field}\": unsupported value {value} (supported: {supported})")]
    Unsupported {
        field: String,
        value: String,
        supported: String,
    },
    /// A field's value is out of range or inconsistent with another field.
    #[error("config.json: field \"{field}\": invalid value {value}: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: String,
    },
    /// Two spellings of the same setting (transformers 4.x and 5.x) are both present and differ.
    #[error(
        "config.json: fields \"{field}\" and \"{other}\" disagree: {field} = {value}, {other} = {other_value}"
    )]
    Conflict {
        field: String,
        value: String,
        other: String,
        other_value: String,
    },
}

impl ConfigError {
    /// The field the error is about (the first one, for [`ConfigError::Conflict`]); `None` for
    /// I/O and JSON syntax errors.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Io { .. } | Self::Json { .. } => None,
            Self::Missing { field, .. }
            | Self::Type { field, .. }
            | Self::Unsupported { field, .. }
            | Self::Invalid { field, .. }
            | Self::Conflict { field, .. } => Some(field),
        }
    }

    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(
        field: impl Into<String>,
        value: impl ToString,
        supported: impl Into<String>,
    ) -> Self {
        Self::Unsupported {
            field: field.into(),
            value: value.to_string(),
            supported: supported.into(),
        }
    }
}
