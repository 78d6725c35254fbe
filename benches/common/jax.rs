//! JAX's side of the benches: `scripts/jax_reference.py` run with the TPU venv's Python
//! (`scripts/setup.sh` makes it).

use serde_json::Value as Json;
use std::path::Path;
use std::process::Command;

/// `scripts/jax_reference.py ARGS…`: its JSON answer, or why there is none.
pub fn jax_reference(args: &[&str]) -> Result<Json, String> {
    let venv = palladium_runtime::libtpu::venv()?;
    let python = venv.join("bin/python");
    if !python.is_file() {
        return Err(format!(
            "the TPU venv is missing: expected {} (run scripts/setup.sh, or set PALLADIUM_TPU_VENV)",
            python.display()
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/jax_reference.py");
    let out = Command::new(&python)
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: Json =
        stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok()).ok_or_else(|| {
            format!(
                "jax_reference.py {args:?} printed no JSON: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    if json["ok"] != true {
        return Err(format!("jax_reference.py {args:?}: {}", json["error"]));
    }
    Ok(json)
}
