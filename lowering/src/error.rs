//! The one error type of the lowering, [`LowerError`].
//!
//! Every failure says *where* (the kernel op, its text and its source line) and *why* (our
//! message plus every diagnostic MLIR emitted while it happened), never just "verification
//! failed".

use palladium_dsl::ir::{Op, SrcLoc, VerifierErrors};
use std::fmt;

/// Why a kernel could not be lowered.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    /// Our own verifier rejected the kernel before any MLIR was built.
    #[error("kernel `{kernel}` does not verify:\n{errors}")]
    Verify { kernel: String, errors: VerifierErrors },

    /// A kernel op could not be lowered, or the MLIR it lowered to does not verify.
    #[error("{0}")]
    Op(Box<OpError>),

    /// MLIR rejected the module in a way no single kernel op explains (e.g. the kernel
    /// function's signature or symbol names).
    #[error("kernel `{kernel}`{}: {message}{}", fmt_loc(.loc), fmt_diags(.diagnostics))]
    Module { kernel: String, loc: Option<SrcLoc>, message: String, diagnostics: Vec<String> },
}

/// A failure tied to one kernel op.
#[derive(Debug)]
pub struct OpError {
    pub op: Op,
    /// The op as our IR prints it, e.g. `v7 = dot v3, v5`.
    pub op_text: String,
    pub loc: Option<SrcLoc>,
    pub message: String,
    /// What MLIR's diagnostic engine said (with `file:line:col` locations), if anything.
    pub diagnostics: Vec<String>,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}){}: {}{}",
            self.op,
            self.op_text,
            fmt_loc(&self.loc),
            self.message,
            fmt_diags(&self.diagnostics)
        )
    }
}

impl LowerError {
    /// MLIR's diagnostics carried by this error (empty for our own verifier's errors).
    pub fn diagnostics(&self) -> &[String] {
        match self {
            LowerError::Verify { .. } => &[],
            LowerError::Op(e) => &e.diagnostics,
            LowerError::Module { diagnostics, .. } => diagnostics,
        }
    }
}

fn fmt_loc(loc: &Option<SrcLoc>) -> String {
    loc.map(|l| format!(" at {l}")).unwrap_or_default()
}

fn fmt_diags(diags: &[String]) -> String {
    if diags.is_empty() {
        return String::new();
    }
    let mut s = String::from("\nMLIR diagnostics:");
    for d in diags {
        s.push_str("\n  ");
        s.push_str(&d.replace('\n', "\n  "));
    }
    s
}

/// An error inside one lowering rule, before `rules::lower_op` ties it to its op; or an
/// error of a nested op (already tied to that op) passing through its parent's rule.
#[derive(Debug)]
pub(crate) enum RuleError {
    Msg(String),
    Nested(LowerError),
}

impl From<String> for RuleError {
    fn from(m: String) -> Self {
        RuleError::Msg(m)
    }
}

impl From<&str> for RuleError {
    fn from(m: &str) -> Self {
        RuleError::Msg(m.to_string())
    }
}

impl From<melior::Error> for RuleError {
    fn from(e: melior::Error) -> Self {
        RuleError::Msg(format!("MLIR: {e}"))
    }
}

impl From<LowerError> for RuleError {
    fn from(e: LowerError) -> Self {
        RuleError::Nested(e)
    }
}

pub(crate) type RuleResult<T> = Result<T, RuleError>;

/// Return early from a rule with a formatted message.
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::RuleError::Msg(format!($($t)*))) };
}
pub(crate) use bail;
