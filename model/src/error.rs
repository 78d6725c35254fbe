//! Errors from reading a `config.json`. Every variant names the field it is about, so a user
//! can fix the file without reading this crate.

use std::fmt;

/// Why a `config.json` could not be turned into a [`crate::ModelSpec`].
///
/// Field names are JSON paths into the config: `"hidden_act"`, `"rope_scaling.rope_type"`,
/// `"mlp_only_layers[2]"`. [`ConfigError::field`] returns it for tests and tools. Messages
/// start with the file: the user's path when read by [`crate::ModelSpec::from_path`]
/// ([`ConfigError::InFile`]), `config.json` for text parsed without one.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigError {
    /// The file could not be read.
    Io { path: String, message: String },
    /// The text is not JSON, or its top level is not an object, or it is empty.
    Json { message: String },
    /// A field the model needs is absent (or `null`).
    Missing { field: String, hint: String },
    /// A field has the wrong JSON type.
    Type { field: String, expected: &'static str, found: String },
    /// A field has a well-formed value this crate (or the family) does not support.
    Unsupported { field: String, value: String, supported: String },
    /// A field's value is out of range or inconsistent with another field.
    Invalid { field: String, value: String, reason: String },
    /// Two spellings of the same setting (transformers 4.x and 5.x) are both present and differ.
    Conflict { field: String, value: String, other: String, other_value: String },
    /// Any of the above in the file at `path` (the user's path, in place of `config.json`).
    InFile { path: String, error: Box<ConfigError> },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, message } => write!(f, "{path}: cannot read: {message}"),
            Self::InFile { path, error } => {
                write!(f, "{path}: ")?;
                error.describe(f)
            }
            _ => {
                write!(f, "config.json: ")?;
                self.describe(f)
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// The message without the file name.
    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { message, .. } => write!(f, "cannot read: {message}"),
            Self::Json { message } => write!(f, "{message}"),
            Self::Missing { field, hint } => write!(f, "missing required field \"{field}\"{hint}"),
            Self::Type { field, expected, found } => {
                write!(f, "field \"{field}\": expected {expected}, got {found}")
            }
            Self::Unsupported { field, value, supported } => {
                write!(f, "field \"{field}\": unsupported value {value} (supported: {supported})")
            }
            Self::Invalid { field, value, reason } => {
                write!(f, "field \"{field}\": invalid value {value}: {reason}")
            }
            Self::Conflict { field, value, other, other_value } => {
                write!(
                    f,
                    "fields \"{field}\" and \"{other}\" disagree: {field} = {value}, {other} = {other_value}"
                )
            }
            Self::InFile { error, .. } => error.describe(f),
        }
    }

    /// The error itself, whichever file it is in.
    pub fn inner(&self) -> &ConfigError {
        match self {
            Self::InFile { error, .. } => error.inner(),
            e => e,
        }
    }

    /// The field the error is about (the first one, for [`ConfigError::Conflict`]); `None` for
    /// I/O and JSON syntax errors.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::InFile { error, .. } => error.field(),
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
        Self::Invalid { field: field.into(), value: value.to_string(), reason: reason.into() }
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
