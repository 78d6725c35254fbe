//! Debugging and tracing: `tpu.log`, `cf.assert`, and the trace markers run as no-ops.

use super::{At, Slot, ints};
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::parse::Attr;
use crate::prepare::Instr;
use crate::value::Val;

/// A prepared debug instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    /// `tpu.log`: print `tag` (its `$k` replaced by scalar `k` when formatted).
    Log {
        tag: String,
        formatted: bool,
        args: Vec<Slot>,
    },
    Assert {
        c: Slot,
        msg: String,
    },
    Nop,
}

/// The instruction for a debug op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o) = (at.op, &at.o[..]);
    Ok(Some(match at.name() {
        "tpu.log" => {
            let tag = match op.attr("tag") {
                Some(Attr::String(s)) => s.clone(),
                _ => bail!(Malformed, "tpu.log without a tag"),
            };
            let formatted = op.attr("formatted").and_then(Attr::as_bool).unwrap_or(false);
            Op::Log { tag, formatted, args: o.to_vec() }
        }
        "cf.assert" => {
            at.arity(1)?;
            let msg = match op.attr("msg") {
                Some(Attr::String(s)) => s.clone(),
                _ => "assertion failed".into(),
            };
            Op::Assert { c: o[0], msg }
        }
        "tpu.trace_start" | "tpu.trace_stop" | "tpu.delay" | "tpu.log_buffer"
        | "tpu.trace_value" => Op::Nop,
        _ => return Ok(None),
    }))
}

/// Run one debug instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(_mach: &mut Machine<'_>, _ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::Log { tag, formatted, args } => {
            let values = ints(args, fr)?;
            println!("{}", log_line(tag, *formatted, &values));
            Val::Undef
        }
        Op::Assert { c, msg } => {
            if v(c).int()? == 0 {
                bail!(Undefined, "cf.assert failed: {msg}");
            }
            Val::Undef
        }
        Op::Nop => Val::Undef,
    })
}

/// A `tpu.log` line: `$k` in a formatted tag is scalar `k`; an unformatted tag is printed
/// followed by its values.
fn log_line(tag: &str, formatted: bool, values: &[i64]) -> String {
    if !formatted {
        return values.iter().fold(tag.to_string(), |s, v| format!("{s} {v}"));
    }
    let mut out = String::new();
    let mut rest = tag;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        match rest[at + 1..at + 1 + digits].parse::<usize>().ok().and_then(|k| values.get(k)) {
            Some(v) => out.push_str(&v.to_string()),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::log_line;

    #[test]
    fn log_lines_fill_placeholders_in_order() {
        assert_eq!(log_line("step $0 of $1: $0", true, &[3, 8]), "step 3 of 8: 3");
        assert_eq!(log_line("cost $5", true, &[1]), "cost $5");
        assert_eq!(log_line("done", false, &[]), "done");
        assert_eq!(log_line("values", false, &[4, -2]), "values 4 -2");
    }
}
