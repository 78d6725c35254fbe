//! Loading a PJRT plugin (libtpu, or a CPU plugin for the execution tests) in this process.

use std::path::Path;

/// libtpu's (or any plugin's) PJRT API, loaded and initialized.
pub type Api = pjrt::Api;

/// Load the PJRT plugin at `path` and run `PJRT_Plugin_Initialize`.
///
/// The `pjrt` crate panics where initialization fails (e.g. libtpu's
/// `/tmp/libtpu_lockfile` when `ALLOW_MULTIPLE_LIBTPU_LOAD` is unset): that panic becomes
/// an error here. For libtpu the caller must have its [`crate::libtpu::LIBTPU_ENVIRONMENT`]
/// in the process environment before the first load (workers get it from their parent).
pub fn load(path: &Path) -> Result<Api, String> {
    let name = path.display().to_string();
    let loaded = std::panic::catch_unwind(|| pjrt::plugin(name.clone()).load());
    match loaded {
        Ok(Ok(api)) => Ok(api),
        Ok(Err(e)) => Err(format!("cannot load the PJRT plugin {name}: {}", message(&e))),
        Err(panic) => Err(format!("cannot initialize the PJRT plugin {name}: {}", panic_text(&*panic))),
    }
}

/// A PJRT error's own words (the `pjrt` crate's `Display` appends a backtrace).
pub fn message(e: &pjrt::Error) -> String {
    match e {
        pjrt::Error::PjrtError { msg, code, .. } => format!("{msg} ({code:?})"),
        other => other.to_string(),
    }
}

/// The text of a caught panic.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "(panic without a message)".into())
}
