//! Vector shapes and data movement: `vector.broadcast`, `shape_cast`, `multi_reduction`,
//! `extract`, `extract_strided_slice`, transposes, `tpu.concatenate`, `tpu.dynamic_rotate`,
//! `tpu.reduce_index`.

use super::{At, Slot, ints};
use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::exec::Machine;
use crate::memory::join;
use crate::parse::Attr;
use crate::prepare::Instr;
use crate::value::{
    DType, Data, Shape, Tile, Val, gather, permute, round_slice, scatter, strides_of, walk_rows,
};
use smallvec::SmallVec;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RKind {
    Add,
    Mul,
    MaxF,
    MinF,
    MaxNumF,
    MinNumF,
    MaxSI,
    MinSI,
    MaxUI,
    MinUI,
    And,
    Or,
    Xor,
}

/// A prepared shape instruction: slots, shapes and attributes resolved.
#[derive(Debug)]
pub(crate) enum Op {
    Broadcast { a: Slot, dt: DType, shape: Shape },
    ShapeCast { a: Slot, shape: Shape },
    Reduce { kind: RKind, dt: DType, a: Slot, acc: Slot, dims: Vec<usize> },
    Extract { a: Slot, pos: Vec<i64>, dyn_pos: Vec<Slot> },
    ExtractSS { a: Slot, offsets: Vec<usize>, sizes: Vec<usize>, strides: Vec<usize> },
    Transpose { a: Slot, perm: Vec<usize> },
    Concat { xs: Vec<Slot>, dim: usize },
    Rotate { a: Slot, shift: Slot, dim: usize },
    ReduceIndex { a: Slot, dim: usize, max: bool },
}

/// The instruction for a shape op, or `None` when `at` is not one.
pub(crate) fn prepare(at: &At<'_>) -> Result<Option<Op>> {
    let (op, o) = (at.op, &at.o[..]);
    Ok(Some(match at.name() {
        "vector.broadcast" => {
            at.arity(1)?;
            let (shape, dt) = at.res_sd()?;
            let (from, _) = at.opnd_sd(0)?;
            if from.len() > shape.len() {
                bail!(Malformed, "broadcast to a lower rank");
            }
            let pad = shape.len() - from.len();
            for (k, &d) in from.iter().enumerate() {
                if d != 1 && d != shape[pad + k] {
                    bail!(
                        Malformed,
                        "cannot broadcast [{}] to [{}]",
                        crate::memory::join(&from),
                        crate::memory::join(&shape)
                    );
                }
            }
            Op::Broadcast { a: o[0], dt, shape }
        }
        "vector.shape_cast" => {
            at.arity(1)?;
            let (shape, _) = at.res_sd()?;
            let (from, _) = at.opnd_sd(0)?;
            if from.iter().product::<usize>() != shape.iter().product::<usize>() {
                bail!(Malformed, "shape_cast changes the element count");
            }
            Op::ShapeCast { a: o[0], shape }
        }
        "vector.multi_reduction" => {
            at.arity(2)?;
            let (_, dt) = at.res_sd()?;
            let kind = match op.attr("kind").and_then(|a| a.dialect("vector.kind")) {
                Some("add") => RKind::Add,
                Some("mul") => RKind::Mul,
                Some("maximumf") => RKind::MaxF,
                Some("minimumf") => RKind::MinF,
                Some("maxnumf") => RKind::MaxNumF,
                Some("minnumf") => RKind::MinNumF,
                Some("maxsi") => RKind::MaxSI,
                Some("minsi") => RKind::MinSI,
                Some("maxui") => RKind::MaxUI,
                Some("minui") => RKind::MinUI,
                Some("and") => RKind::And,
                Some("or") => RKind::Or,
                Some("xor") => RKind::Xor,
                k => bail!(Unsupported, "reduction kind {k:?}"),
            };
            let Some(dims) = op.attr("reduction_dims").and_then(Attr::as_i64_list) else {
                bail!(Malformed, "missing reduction_dims")
            };
            Op::Reduce {
                kind,
                dt,
                a: o[0],
                acc: o[1],
                dims: dims.into_iter().map(|d| d as usize).collect(),
            }
        }
        "vector.extract" => {
            at.arity(1)?;
            let pos = op.attr("static_position").and_then(Attr::as_i64_list).unwrap_or_default();
            Op::Extract { a: o[0], pos, dyn_pos: o[1..].to_vec() }
        }
        "vector.extract_strided_slice" => {
            at.arity(1)?;
            let list = |k: &str| -> Result<Vec<usize>> {
                op.attr(k)
                    .and_then(Attr::as_i64_list)
                    .map(|v| v.into_iter().map(|x| x as usize).collect())
                    .ok_or_else(|| InterpError::new(ErrorKind::Malformed, format!("missing {k}")))
            };
            Op::ExtractSS {
                a: o[0],
                offsets: list("offsets")?,
                sizes: list("sizes")?,
                strides: list("strides")?,
            }
        }
        "tpu.transpose" | "vector.transpose" => {
            at.arity(1)?;
            let Some(perm) = op.attr("permutation").and_then(Attr::as_i64_list) else {
                bail!(Malformed, "missing permutation")
            };
            Op::Transpose { a: o[0], perm: perm.into_iter().map(|p| p as usize).collect() }
        }
        "tpu.concatenate" => {
            let Some(dim) = op.attr("dimension").and_then(Attr::as_int) else {
                bail!(Malformed, "missing dimension")
            };
            Op::Concat { xs: o.to_vec(), dim: dim as usize }
        }
        "tpu.dynamic_rotate" => {
            at.arity(2)?;
            let (shape, _) = at.opnd_sd(0)?;
            let dim = op.attr("dimension").and_then(Attr::as_int).unwrap_or(-1);
            if op.attr("stride").is_some() {
                bail!(Unsupported, "tpu.dynamic_rotate with a stride");
            }
            match usize::try_from(dim) {
                Ok(d) if d < shape.len() => Op::Rotate { a: o[0], shift: o[1], dim: d },
                _ => bail!(
                    Malformed,
                    "tpu.dynamic_rotate dimension {dim} for a rank-{} vector",
                    shape.len()
                ),
            }
        }
        "tpu.reduce_index" => {
            at.arity(1)?;
            let (shape, dt) = at.opnd_sd(0)?;
            let axis = op.attr("axis").and_then(Attr::as_int).unwrap_or(-1);
            let max = match op.attr("kind").and_then(|a| a.dialect("tpu.reduction_kind")) {
                Some("arg_max") => true,
                Some("arg_min") => false,
                k => bail!(Unsupported, "tpu.reduce_index kind {k:?}"),
            };
            if !dt.is_float() {
                bail!(Unsupported, "tpu.reduce_index of {}", dt.name());
            }
            match usize::try_from(axis) {
                Ok(d) if d < shape.len() => Op::ReduceIndex { a: o[0], dim: d, max },
                _ => bail!(
                    Malformed,
                    "tpu.reduce_index axis {axis} for a rank-{} vector",
                    shape.len()
                ),
            }
        }
        _ => return Ok(None),
    }))
}

/// Run one shape instruction, returning its result (`Val::Undef` for none).
pub(crate) fn exec(_mach: &mut Machine<'_>, _ins: &Instr, kind: &Op, fr: &[Val]) -> Result<Val> {
    let v = |s: &Slot| -> &Val { &fr[*s as usize] };
    Ok(match kind {
        Op::Broadcast { a, dt, shape } => broadcast(v(a), *dt, shape)?,
        Op::ShapeCast { a, shape } => {
            let t = v(a).tile()?;
            Val::Tile(Tile { dt: t.dt, shape: shape.clone(), data: t.data.clone() })
        }
        Op::Reduce { kind, dt, a, acc, dims } => reduce(*kind, *dt, v(a).tile()?, v(acc), dims)?,
        Op::Extract { a, pos, dyn_pos } => {
            let t = v(a).tile()?;
            let mut dynv = ints(dyn_pos, fr)?.into_iter();
            let mut p = Vec::new();
            for &x in pos {
                p.push(if x == i64::MIN { dynv.next().unwrap_or(0) } else { x });
            }
            extract(t, &p)?
        }
        Op::ExtractSS { a, offsets, sizes, strides } => {
            extract_ss(v(a).tile()?, offsets, sizes, strides)?
        }
        Op::Transpose { a, perm } => {
            let t = v(a).tile()?;
            if perm.len() != t.shape.len() {
                bail!(Malformed, "permutation {perm:?} for a rank-{} vector", t.shape.len());
            }
            Val::Tile(permute(t, perm))
        }
        Op::Concat { xs, dim } => {
            let ts =
                xs.iter().map(|s| fr[*s as usize].tile().cloned()).collect::<Result<Vec<_>>>()?;
            concat(&ts, *dim)?
        }
        Op::Rotate { a, shift, dim } => rotate(v(a).tile()?, v(shift).int()?, *dim)?,
        Op::ReduceIndex { a, dim, max } => reduce_index(v(a).tile()?, *dim, *max)?,
    })
}

fn broadcast(a: &Val, dt: DType, shape: &Shape) -> Result<Val> {
    match a {
        Val::Tile(t) => {
            let pad = shape.len() - t.shape.len();
            let st = strides_of(&t.shape);
            let strides: SmallVec<[isize; 4]> = (0..shape.len())
                .map(|d| if d < pad || t.shape[d - pad] == 1 { 0 } else { st[d - pad] as isize })
                .collect();
            let data = match &*t.data {
                Data::F(v) => Data::F(gather(v, 0, &strides, shape)),
                Data::I(v) => Data::I(gather(v, 0, &strides, shape)),
            };
            Ok(Val::Tile(Tile::new(dt, shape.clone(), data)))
        }
        s @ (Val::Int(_) | Val::Float(_)) => Ok(Val::Tile(Tile::splat(dt, shape.clone(), s))),
        other => bail!(Mismatch, "cannot broadcast {}", other.kind()),
    }
}

fn extract(t: &Tile, pos: &[i64]) -> Result<Val> {
    if pos.len() > t.shape.len() {
        bail!(Malformed, "extract position {pos:?} for a rank-{} vector", t.shape.len());
    }
    let st = strides_of(&t.shape);
    let mut off = 0usize;
    for (d, &p) in pos.iter().enumerate() {
        if p < 0 || p as usize >= t.shape[d] {
            bail!(OutOfBounds, "extract position {pos:?} out of bounds of [{}]", join(&t.shape));
        }
        off += p as usize * st[d];
    }
    let rest: Shape = t.shape[pos.len()..].into();
    if rest.is_empty() {
        return Ok(t.get(off));
    }
    let n: usize = rest.iter().product();
    let data = match &*t.data {
        Data::F(v) => Data::F(v[off..off + n].to_vec()),
        Data::I(v) => Data::I(v[off..off + n].to_vec()),
    };
    Ok(Val::Tile(Tile::new(t.dt, rest, data)))
}

fn extract_ss(t: &Tile, offsets: &[usize], sizes: &[usize], strides: &[usize]) -> Result<Val> {
    let st = strides_of(&t.shape);
    let mut shape: Shape = t.shape.clone();
    let mut gs: SmallVec<[isize; 4]> = st.iter().map(|&s| s as isize).collect();
    let mut off = 0isize;
    for d in 0..offsets.len() {
        let step = strides.get(d).copied().unwrap_or(1);
        if offsets[d] + (sizes[d].max(1) - 1) * step >= t.shape[d] {
            bail!(
                OutOfBounds,
                "extract_strided_slice offsets {offsets:?} sizes {sizes:?} out of bounds of [{}]",
                join(&t.shape)
            );
        }
        off += (offsets[d] * st[d]) as isize;
        shape[d] = sizes[d];
        gs[d] *= step as isize;
    }
    let data = match &*t.data {
        Data::F(v) => Data::F(gather(v, off, &gs, &shape)),
        Data::I(v) => Data::I(gather(v, off, &gs, &shape)),
    };
    Ok(Val::Tile(Tile::new(t.dt, shape, data)))
}

fn concat(ts: &[Tile], dim: usize) -> Result<Val> {
    let Some(first) = ts.first() else { bail!(Malformed, "concatenate of nothing") };
    let mut shape = first.shape.clone();
    if dim >= shape.len() {
        bail!(Malformed, "concatenate along dim {dim} of rank {}", shape.len());
    }
    shape[dim] = ts.iter().map(|t| t.shape[dim]).sum();
    let st = strides_of(&shape);
    let ist: SmallVec<[isize; 4]> = st.iter().map(|&s| s as isize).collect();
    let n: usize = shape.iter().product();
    let mut data = Data::filled(first.dt, n, 0.0, 0);
    let mut at = 0usize;
    for t in ts {
        let off = (at * st[dim]) as isize;
        match (&mut data, &*t.data) {
            (Data::F(d), Data::F(s)) => scatter(d, off, &ist, &t.shape, s, None, false),
            (Data::I(d), Data::I(s)) => scatter(d, off, &ist, &t.shape, s, None, false),
            _ => bail!(Mismatch, "concatenate of different element kinds"),
        }
        at += t.shape[dim];
    }
    Ok(Val::Tile(Tile::new(first.dt, shape, data)))
}

/// `tpu.dynamic_rotate` (`jnp.roll`): element `i` along `dim` moves to `(i + shift) mod n`,
/// i.e. the last `shift` elements wrap to the front.
fn rotate(t: &Tile, shift: i64, dim: usize) -> Result<Val> {
    let n = t.shape[dim];
    let s = shift.rem_euclid(n as i64) as usize;
    if s == 0 {
        return Ok(Val::Tile(t.clone()));
    }
    let part = |from: usize, len: usize| -> Result<Tile> {
        let mut offsets = vec![0; t.shape.len()];
        offsets[dim] = from;
        let mut sizes = t.shape.to_vec();
        sizes[dim] = len;
        extract_ss(t, &offsets, &sizes, &[]).and_then(|v| v.tile().cloned())
    };
    concat(&[part(n - s, s)?, part(0, n - s)?], dim)
}

/// `tpu.reduce_index`: the i32 index of the max (min) along `dim`, the first on ties; a NaN
/// counts as the extreme (as `jnp.argmax`).
fn reduce_index(t: &Tile, dim: usize, max: bool) -> Result<Val> {
    let Data::F(x) = &*t.data else { bail!(Mismatch, "tpu.reduce_index of an integer vector") };
    let n = t.shape[dim];
    let inner: usize = t.shape[dim + 1..].iter().product();
    let outer: usize = t.shape[..dim].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * n + k) * inner + i];
            let mut best = 0;
            for k in 1..n {
                let (b, c) = (at(best), at(k));
                if b.is_nan() {
                    break;
                }
                if c.is_nan() || (max && c > b) || (!max && c < b) {
                    best = k;
                }
            }
            out.push(best as i32);
        }
    }
    let shape: Shape =
        t.shape.iter().enumerate().filter(|&(d, _)| d != dim).map(|(_, &s)| s).collect();
    if shape.is_empty() {
        return Ok(Val::Int(out[0].into()));
    }
    Ok(Val::Tile(Tile::new(DType::I32, shape, Data::I(out))))
}

/// Fold `src` (row-major over `shape`) into `out` at the positions `strides` map it to, in
/// `src`'s order. Generic over `f` so each reduction is its own loop: a row reduced into one
/// element (stride 0) is a plain fold, a row kept (stride 1) a zip the compiler vectorizes.
fn accumulate<T: Copy>(
    shape: &[usize],
    strides: &[isize],
    out: &mut [T],
    src: &[T],
    f: impl Fn(T, T) -> T,
) {
    let mut i = 0usize;
    walk_rows(shape, strides, 0, |o, len, s| {
        let row = &src[i..i + len];
        match s {
            0 => {
                let p = o as usize;
                out[p] = row.iter().fold(out[p], |a, &x| f(a, x));
            }
            1 => out[o as usize..o as usize + len]
                .iter_mut()
                .zip(row)
                .for_each(|(a, &x)| *a = f(*a, x)),
            _ => {
                for (j, &x) in row.iter().enumerate() {
                    let p = (o + j as isize * s) as usize;
                    out[p] = f(out[p], x);
                }
            }
        }
        i += len;
    });
}

fn reduce(kind: RKind, dt: DType, a: &Tile, acc: &Val, dims: &[usize]) -> Result<Val> {
    let rank = a.shape.len();
    if dims.iter().any(|&d| d >= rank) {
        bail!(Malformed, "reduction dims {dims:?} for a rank-{rank} vector");
    }
    let out_shape: Shape = (0..rank).filter(|d| !dims.contains(d)).map(|d| a.shape[d]).collect();
    let ost = strides_of(&out_shape);
    let mut k = 0;
    let strides: SmallVec<[isize; 4]> = (0..rank)
        .map(|d| {
            if dims.contains(&d) {
                0
            } else {
                let s = ost[k] as isize;
                k += 1;
                s
            }
        })
        .collect();
    let accv: Data = match acc {
        Val::Tile(t) => {
            if t.shape != out_shape {
                bail!(
                    Mismatch,
                    "reduction accumulator shape [{}], expected [{}]",
                    join(&t.shape),
                    join(&out_shape)
                );
            }
            (*t.data).clone()
        }
        Val::Float(f) => Data::F(vec![*f as f32]),
        Val::Int(i) => Data::I(vec![*i as i32]),
        other => bail!(Mismatch, "reduction accumulator is {}", other.kind()),
    };
    // Each reduction its own loop ([`accumulate`] is generic over it).
    macro_rules! fold {
        ($out:ident, $src:ident, $f:expr) => {
            accumulate(&a.shape, &strides, &mut $out, $src, $f)
        };
    }
    let data = match (accv, &*a.data) {
        (Data::F(mut out), Data::F(src)) => {
            match kind {
                RKind::Add => fold!(out, src, |x, y| x + y),
                RKind::Mul => fold!(out, src, |x, y| x * y),
                RKind::MaxF => fold!(out, src, |x, y| if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.max(y)
                }),
                RKind::MinF => fold!(out, src, |x, y| if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.min(y)
                }),
                RKind::MaxNumF => fold!(out, src, f32::max),
                RKind::MinNumF => fold!(out, src, f32::min),
                k => bail!(Malformed, "float reduction {k:?}"),
            }
            round_slice(dt, &mut out);
            Data::F(out)
        }
        (Data::I(mut out), Data::I(src)) => {
            match kind {
                RKind::Add => fold!(out, src, i32::wrapping_add),
                RKind::Mul => fold!(out, src, i32::wrapping_mul),
                RKind::MaxSI => fold!(out, src, i32::max),
                RKind::MinSI => fold!(out, src, i32::min),
                RKind::MaxUI => fold!(out, src, |x, y| (x as u32).max(y as u32) as i32),
                RKind::MinUI => fold!(out, src, |x, y| (x as u32).min(y as u32) as i32),
                RKind::And => fold!(out, src, |x, y| x & y),
                RKind::Or => fold!(out, src, |x, y| x | y),
                RKind::Xor => fold!(out, src, |x, y| x ^ y),
                k => bail!(Malformed, "integer reduction {k:?}"),
            }
            Data::I(out)
        }
        _ => bail!(Mismatch, "reduction of mixed element kinds"),
    };
    if out_shape.is_empty() {
        return Ok(Tile::new(dt, Shape::from_elem(1, 1), data).get(0));
    }
    Ok(Val::Tile(Tile::new(dt, out_shape, data)))
}

#[cfg(test)]
mod tests {
    use super::{RKind, reduce};
    use crate::value::{DType, Data, Shape, Tile, Val};

    #[test]
    fn reductions_fold_each_output_in_the_order_of_the_source() {
        // Values whose f32 sums depend on the order (1e8 + 1 - 1e8), and NaN for the max.
        let shape: Shape = [3, 4, 5].into_iter().collect();
        let src: Vec<f32> = (0..60)
            .map(|i| match i % 7 {
                0 => 1e8,
                3 => -1e8,
                5 if i == 40 => f32::NAN,
                k => k as f32 * 0.37,
            })
            .collect();
        let t = Tile::new(DType::F32, shape.clone(), Data::F(src.clone()));
        for dims in [vec![2], vec![0], vec![1], vec![0, 2], vec![0, 1, 2]] {
            for (kind, f) in [
                (RKind::Add, (|a, b| a + b) as fn(f32, f32) -> f32),
                (
                    RKind::MaxF,
                    |a: f32, b: f32| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) },
                ),
            ] {
                let kept: Vec<usize> = (0..3).filter(|d| !dims.contains(d)).collect();
                let out_shape: Shape = kept.iter().map(|&d| shape[d]).collect();
                let n: usize = out_shape.iter().product();
                // Row-major over the source, each element folded into its output in turn.
                let mut want = vec![0.5f32; n];
                for (i, &x) in src.iter().enumerate() {
                    let idx = [i / 20, i / 5 % 4, i % 5];
                    let o = kept.iter().fold(0, |o, &d| o * shape[d] + idx[d]);
                    want[o] = f(want[o], x);
                }
                let acc = if n == 1 && kept.is_empty() {
                    Val::Float(0.5)
                } else {
                    Val::Tile(Tile::new(DType::F32, out_shape, Data::F(vec![0.5; n])))
                };
                let got: Vec<f32> = match reduce(kind, DType::F32, &t, &acc, &dims).unwrap() {
                    Val::Tile(r) => match &*r.data {
                        Data::F(v) => v.clone(),
                        Data::I(_) => panic!("floats"),
                    },
                    Val::Float(x) => vec![x as f32],
                    other => panic!("{}", other.kind()),
                };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kind:?} over {dims:?}");
            }
        }
    }
}
