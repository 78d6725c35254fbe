//! Constants and grid queries: `arith.constant`, `tpu.iota`, `tpu.iteration_bound`,
//! `tpu.core_id`.

use super::At;
use crate::error::{Result, bail};
use crate::exec::Machine;
use crate::parse::{Attr, DenseElem};
use crate::prepare::Instr;
use crate::value::{DType, Data, Shape, Tile, Val, round_f, wrap_i};

/// A prepared constant instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    Const(Val),
    Iota { shape: Shape, dim: usize },
    IterationBound { dim: usize },
}

/// The instruction for a constant op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let op = at.op;
    Ok(Some(match at.name() {
        "arith.constant" => {
            let (shape, dt) = at.res_sd()?;
            let Some(v) = op.attr("value") else {
                bail!(Malformed, "arith.constant without a value")
            };
            Op::Const(constant(v, dt, &shape)?)
        }
        "tpu.iota" => {
            let (shape, _) = at.res_sd()?;
            let dims = op
                .attr("dimensions")
                .and_then(Attr::as_i64_list)
                .or_else(|| op.attr("dimension").and_then(Attr::as_int).map(|d| vec![d]))
                .unwrap_or_default();
            match dims.as_slice() {
                [d] if (*d as usize) < shape.len() => Op::Iota { shape, dim: *d as usize },
                _ => bail!(
                    Unsupported,
                    "tpu.iota with dimensions {dims:?} on shape [{}]",
                    crate::memory::join(&shape)
                ),
            }
        }
        "tpu.iteration_bound" => {
            let dim = op.attr("dim").and_then(Attr::as_int).unwrap_or(0) as usize;
            Op::IterationBound { dim }
        }
        "tpu.core_id" => Op::Const(Val::Int(0)),
        _ => return Ok(None),
    }))
}

/// Run one constant instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(mach: &mut Machine<'_>, _ins: &Instr, kind: &Op, _fr: &[Val]) -> Result<Val> {
    Ok(match kind {
        Op::Const(c) => c.clone(),
        Op::Iota { shape, dim } => {
            // Runs of `inner` equal values counting 0..shape[dim], repeated.
            let inner: usize = shape[*dim + 1..].iter().product();
            let outer: usize = shape[..*dim].iter().product();
            let mut data = Vec::with_capacity(outer * shape[*dim] * inner);
            for _ in 0..outer {
                for i in 0..shape[*dim] {
                    data.extend(std::iter::repeat_n(i as i32, inner));
                }
            }
            Val::Tile(Tile::new(DType::I32, shape.clone(), Data::I(data)))
        }
        Op::IterationBound { dim } => Val::Int(mach.prog.grid.get(*dim).copied().unwrap_or(1)),
    })
}

fn elem_f(e: DenseElem, dt: DType) -> f64 {
    match e {
        DenseElem::Int(i) => i as f64,
        DenseElem::Bits(b) => match dt {
            DType::F32 => f64::from(f32::from_bits(b as u32)),
            DType::Bf16 => f64::from(half::bf16::from_bits(b as u16).to_f32()),
            DType::F16 => f64::from(half::f16::from_bits(b as u16).to_f32()),
            _ => f64::from_bits(b as u64),
        },
        DenseElem::Float(f) => f,
        DenseElem::Bool(b) => f64::from(u8::from(b)),
    }
}

fn elem_i(e: DenseElem) -> i64 {
    match e {
        DenseElem::Int(i) => i as i64,
        DenseElem::Bits(b) => b as i64,
        DenseElem::Float(f) => f as i64,
        DenseElem::Bool(b) => i64::from(b),
    }
}

/// The value of an `arith.constant`.
fn constant(v: &Attr, dt: DType, shape: &Shape) -> Result<Val> {
    let n: usize = shape.iter().product();
    let scalar = |a: &Attr| -> Result<Val> {
        Ok(match a {
            Attr::Int { value, .. } if dt.is_float() => {
                Val::Float(f64::from(round_f(dt, *value as f32)))
            }
            Attr::Int { value, .. } => Val::Int(wrap_i(dt, *value as i64)),
            Attr::Float { value, .. } if dt.is_float() => {
                Val::Float(f64::from(round_f(dt, *value as f32)))
            }
            Attr::Bool(b) => Val::Int(i64::from(*b)),
            other => bail!(Unsupported, "constant {other}"),
        })
    };
    if shape.is_empty() && !matches!(v, Attr::Dense { .. } | Attr::DenseHex { .. }) {
        return scalar(v);
    }
    let data = match v {
        Attr::Dense { elems, splat, .. } => {
            if !*splat && elems.len() != n {
                bail!(Malformed, "dense constant has {} elements for {n}", elems.len());
            }
            let get = |k: usize| elems[if *splat { 0 } else { k }];
            if dt.is_float() {
                Data::F((0..n).map(|k| round_f(dt, elem_f(get(k), dt) as f32)).collect())
            } else {
                Data::I((0..n).map(|k| wrap_i(dt, elem_i(get(k))) as i32).collect())
            }
        }
        Attr::DenseHex { bytes, .. } => {
            let w = dt.size();
            let count = bytes.len() / w.max(1);
            if count != 1 && count != n {
                bail!(Malformed, "dense hex constant has {count} elements for {n}");
            }
            let at = |k: usize| -> u64 {
                let k = if count == 1 { 0 } else { k };
                let mut x = 0u64;
                for b in 0..w {
                    x |= u64::from(bytes[k * w + b]) << (8 * b);
                }
                x
            };
            match dt {
                DType::F32 => Data::F((0..n).map(|k| f32::from_bits(at(k) as u32)).collect()),
                DType::Bf16 => {
                    Data::F((0..n).map(|k| half::bf16::from_bits(at(k) as u16).to_f32()).collect())
                }
                DType::F16 => {
                    Data::F((0..n).map(|k| half::f16::from_bits(at(k) as u16).to_f32()).collect())
                }
                DType::Bool => Data::I((0..n).map(|k| i32::from(at(k) != 0)).collect()),
                d if !d.is_float() => {
                    Data::I((0..n).map(|k| wrap_i(d, at(k) as i64) as i32).collect())
                }
                d => bail!(Unsupported, "dense hex constant of {d}"),
            }
        }
        other => {
            let s = scalar(other)?;
            return Ok(if shape.is_empty() {
                s
            } else {
                Val::Tile(Tile::splat(dt, shape.clone(), &s))
            });
        }
    };
    if shape.is_empty() {
        return Ok(Tile::new(dt, Shape::from_elem(1, 1), data).get(0));
    }
    Ok(Val::Tile(Tile::new(dt, shape.clone(), data)))
}
