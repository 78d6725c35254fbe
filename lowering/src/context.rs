//! The MLIR context: upstream dialects registered, `tpu` (and, for the serialized body,
//! `stable_mosaic`) allowed as unregistered dialects, and every diagnostic captured so that
//! errors can carry MLIR's own words.

use melior::{
    Context,
    dialect::DialectRegistry,
    ir::{Location, operation::OperationLike},
    utility::register_all_dialects,
};
use std::{cell::RefCell, rc::Rc};

/// The upstream dialects Mosaic kernels use.
const DIALECTS: [&str; 7] = ["builtin", "func", "arith", "math", "vector", "memref", "scf"];

/// An MLIR context set up for Mosaic, with its diagnostics sink.
pub(crate) struct MlirContext {
    pub ctx: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
}

impl MlirContext {
    pub fn new() -> MlirContext {
        let ctx = Context::new();
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        ctx.append_dialect_registry(&registry);
        for d in DIALECTS {
            ctx.get_or_load_dialect(d);
        }
        // `tpu.*` ops, `#tpu.*` attributes and `!tpu.*` types are not upstream MLIR.
        ctx.set_allow_unregistered_dialects(true);
        let diagnostics: Rc<RefCell<Vec<String>>> = Rc::default();
        let sink = diagnostics.clone();
        ctx.attach_diagnostic_handler(move |d| {
            let mut text = format!("{}: {:?}: {d}", location_text(d.location()), d.severity());
            for i in 0..d.note_count() {
                if let Ok(n) = d.note(i) {
                    text.push_str(&format!("\n  note: {}: {n}", location_text(n.location())));
                }
            }
            sink.borrow_mut().push(text);
            true // handled: do not print to stderr
        });
        MlirContext { ctx, diagnostics }
    }

    /// Take (and clear) the diagnostics captured so far.
    pub fn take_diagnostics(&self) -> Vec<String> {
        std::mem::take(&mut *self.diagnostics.borrow_mut())
    }

    /// Verify `op` (and everything nested in it); on failure return MLIR's diagnostics.
    pub fn verify<'c: 'a, 'a>(&self, op: &impl OperationLike<'c, 'a>) -> Result<(), Vec<String>> {
        self.take_diagnostics();
        if op.verify() {
            self.take_diagnostics();
            Ok(())
        } else {
            let d = self.take_diagnostics();
            Err(if d.is_empty() {
                vec!["MLIR verification failed without a diagnostic".into()]
            } else {
                d
            })
        }
    }
}

/// `file:line:col` for file locations (MLIR prints them as `loc("file":line:col)`).
fn location_text(loc: Location<'_>) -> String {
    let s = loc.to_string();
    match s.strip_prefix("loc(\"").and_then(|r| r.strip_suffix(')')) {
        Some(inner) => inner.replacen('"', "", 1),
        None => s,
    }
}
