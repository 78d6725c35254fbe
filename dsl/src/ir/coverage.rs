//! Static analysis of index maps: which blocks the grid reaches.
//!
//! Where an index map's results are affine in the grid indices (`c + a * i`, sums of such:
//! constants, grid indices, `+`, `-`, `*` by a constant; no scalar prefetch), the verifier
//! knows every block it reaches, without running the grid:
//! - every operand: each reached block lies inside the array (a block index past the end
//!   would read or write outside it);
//! - every output that is not aliased to an input (an aliased output keeps its input's
//!   values where the kernel does not write): every element is written. This needs the
//!   reached set to be a product of per-dim sets, which holds when each result depends on
//!   at most one grid index and no grid index feeds two results (the common
//!   `|i, j, _k| (i, j)`); other maps, and maps reading scalar prefetch, are not judged.

use super::{BinaryOp, Block, Kernel, Literal, OpData, SrcLoc, Value, ValueDef};
use crate::spec::{BlockDim, OperandRole, OperandSpec};

/// One problem, for the verifier to report.
pub(super) struct CoverageError {
    pub what: String,
    /// The declaration of the operand it is about.
    pub loc: Option<SrcLoc>,
    pub message: String,
}

/// `c + Σ coef[j] * g_j` over the grid indices `g`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Affine {
    c: i64,
    coef: Vec<i64>,
}

impl Affine {
    fn constant(c: i64, rank: usize) -> Self {
        Affine { c, coef: vec![0; rank] }
    }

    fn combine(&self, other: &Affine, f: impl Fn(i64, i64) -> Option<i64>) -> Option<Affine> {
        let coef = self
            .coef
            .iter()
            .zip(&other.coef)
            .map(|(&a, &b)| f(a, b))
            .collect::<Option<Vec<_>>>()?;
        Some(Affine { c: f(self.c, other.c)?, coef })
    }

    fn scale(&self, s: i64) -> Option<Affine> {
        let coef = self.coef.iter().map(|&a| a.checked_mul(s)).collect::<Option<Vec<_>>>()?;
        Some(Affine { c: self.c.checked_mul(s)?, coef })
    }

    fn as_constant(&self) -> Option<i64> {
        self.coef.iter().all(|&a| a == 0).then_some(self.c)
    }

    /// The smallest and largest value over the grid.
    fn range(&self, grid: &[u64]) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.c, self.c);
        for (&a, &e) in self.coef.iter().zip(grid) {
            let span = a.checked_mul(i64::try_from(e).ok()?.checked_sub(1)?)?;
            if span >= 0 { hi = hi.checked_add(span)? } else { lo = lo.checked_add(span)? }
        }
        Some((lo, hi))
    }
}

/// The affine form of `v` in index map `map`, if it has one.
fn affine(k: &Kernel, map: Block, v: Value, rank: usize) -> Option<Affine> {
    match k.values[v].def {
        ValueDef::Param(b, i) if b == map && (i as usize) < rank => {
            let mut a = Affine::constant(0, rank);
            a.coef[i as usize] = 1;
            Some(a)
        }
        ValueDef::Param(..) => None,
        ValueDef::Result(op, _) => match &k.ops[op].data {
            OpData::Constant { value: Literal::Int(c), .. } => Some(Affine::constant(*c, rank)),
            OpData::AssumeMultiple { x, .. } => affine(k, map, *x, rank),
            OpData::Binary { op, lhs, rhs } => {
                let (l, r) = (affine(k, map, *lhs, rank)?, affine(k, map, *rhs, rank)?);
                match op {
                    BinaryOp::Add => l.combine(&r, i64::checked_add),
                    BinaryOp::Sub => l.combine(&r, i64::checked_sub),
                    BinaryOp::Mul => match (l.as_constant(), r.as_constant()) {
                        (Some(s), _) => r.scale(s),
                        (_, Some(s)) => l.scale(s),
                        _ => None,
                    },
                    _ => None,
                }
            }
            _ => None,
        },
    }
}

/// The affine forms of an index map's results, if all are affine.
fn forms(k: &Kernel, map: Block, rank: usize) -> Option<Vec<Affine>> {
    let last = *k.blocks[map].ops.last()?;
    let OpData::Yield { values } = &k.ops[last].data else { return None };
    values.iter().map(|&v| affine(k, map, v, rank)).collect()
}

/// The first run of blocks in `0..n` that `form` (depending on at most grid dim `j`)
/// never reaches.
fn first_gap(form: &Affine, grid: &[u64], n: i64) -> Option<(i64, i64)> {
    let dep = form.coef.iter().position(|&a| a != 0);
    let reached = |b: i64| match dep {
        None => b == form.c,
        Some(j) => {
            let (a, e) = (form.coef[j], grid[j] as i64);
            let d = b - form.c;
            d % a == 0 && (0..e).contains(&(d / a))
        }
    };
    // A step of 1 (either sign) reaches one interval; otherwise block 0 or 1 is missed.
    let start = match dep.map(|j| form.coef[j]) {
        Some(1) | Some(-1) => {
            let (lo, hi) = form.range(grid)?;
            if lo > 0 {
                0
            } else if hi < n - 1 {
                hi + 1
            } else {
                return None;
            }
        }
        _ => (0..n).find(|&b| !reached(b))?,
    };
    let mut end = start + 1;
    while end < n && !reached(end) {
        end += 1;
    }
    Some((start, end))
}

/// Every bounds and coverage problem of `kernel`'s analyzable index maps.
pub(super) fn check(k: &Kernel) -> Vec<CoverageError> {
    let mut errors = Vec::new();
    let grid: Vec<u64> = k.call.grid.iter().map(|g| g.extent).collect();
    if grid.is_empty() || grid.iter().any(|&e| e == 0 || e > i32::MAX as u64) {
        return errors; // no grid, or one the verifier already refuses
    }
    let aliased: Vec<usize> = k.call.aliases.iter().map(|&(_, o)| o).collect();
    let mut output_index = 0;
    for o in &k.call.operands {
        let is_output = o.role == OperandRole::Output;
        let aliased_output = is_output && aliased.contains(&output_index);
        output_index += usize::from(is_output);
        let (Some(block), Some(map)) = (&o.block, o.index_map) else { continue };
        if block.len() != o.shape.rank() || block.iter().any(|&b| b.extent() == 0) {
            continue; // reported by the operand rules
        }
        let Some(forms) = forms(k, map, grid.len()) else { continue };
        if forms.len() != o.shape.rank() {
            continue;
        }
        let element = o.has_element_window();
        if element {
            element_bounds(o, block, &forms, &grid, &mut errors);
        } else {
            bounds(o, block, &forms, &grid, &mut errors);
        }
        if is_output && !aliased_output && product_of_dims(&forms, &grid) {
            if element {
                element_coverage(o, block, &forms, &grid, &mut errors);
            } else {
                coverage(o, block, &forms, &grid, &mut errors);
            }
        }
    }
    errors
}

fn blocks_along(o: &OperandSpec, block: &[BlockDim], d: usize) -> i64 {
    o.shape.dims()[d].div_ceil(block[d].extent()) as i64
}

fn bounds(
    o: &OperandSpec,
    block: &[BlockDim],
    forms: &[Affine],
    grid: &[u64],
    errors: &mut Vec<CoverageError>,
) {
    for (d, f) in forms.iter().enumerate() {
        let n = blocks_along(o, block, d);
        let Some((lo, hi)) = f.range(grid) else { continue };
        if lo < 0 || hi >= n {
            let bad = if lo < 0 { lo } else { hi };
            errors.push(CoverageError {
                what: format!("index map of {}", o.name),
                loc: o.loc,
                message: format!("reaches block {bad} along dim {d}, outside the array's {n} blocks of {} (dim {} of {})", block[d], o.shape.dims()[d], o.shape),
            });
        }
    }
}

/// Whether the reached set is a product of per-dim sets: each result on at most one grid
/// dim, each grid dim once (only then is coverage judged).
fn product_of_dims(forms: &[Affine], grid: &[u64]) -> bool {
    let mut used = vec![false; grid.len()];
    for f in forms {
        let deps: Vec<usize> = (0..grid.len()).filter(|&j| f.coef[j] != 0).collect();
        match deps.as_slice() {
            [] => {}
            [j] if !used[*j] => used[*j] = true,
            _ => return false,
        }
    }
    true
}

/// Element windows: the index map's results are offsets into the array padded by each
/// dim's `(before, after)`, and the whole window must lie inside that padded array.
fn element_bounds(
    o: &OperandSpec,
    block: &[BlockDim],
    forms: &[Affine],
    grid: &[u64],
    errors: &mut Vec<CoverageError>,
) {
    for (d, f) in forms.iter().enumerate() {
        let (size, (lo, hi)) = (block[d].extent() as i64, block[d].padding());
        let padded = (o.shape.dims()[d] + lo + hi) as i64;
        let Some((first, last)) = f.range(grid) else { continue };
        if first < 0 || last + size > padded {
            let bad = if first < 0 { first } else { last };
            errors.push(CoverageError {
                what: format!("index map of {}", o.name),
                loc: o.loc,
                message: format!(
                    "reaches element offset {bad} along dim {d}: its window of {size} ends at {}, outside the array's {padded} elements (dim {} of {}{})",
                    bad + size,
                    o.shape.dims()[d],
                    o.shape,
                    if lo + hi > 0 { format!(", padded by {lo} and {hi}") } else { String::new() }
                ),
            });
        }
    }
}

/// The coverage rule of an output with element windows: along each dim, the union of the
/// windows `offset..offset + size` the grid reaches (overlaps allowed) must be the whole dim.
fn element_coverage(
    o: &OperandSpec,
    block: &[BlockDim],
    forms: &[Affine],
    grid: &[u64],
    errors: &mut Vec<CoverageError>,
) {
    for (d, f) in forms.iter().enumerate() {
        let (n, size) = (o.shape.dims()[d] as i64, block[d].extent() as i64);
        let Some((first, last)) = f.range(grid) else { continue };
        // Offsets step by |a| from `first` to `last`: a gap opens before the first window,
        // between two windows further apart than their size, or after the last one.
        let step = f.coef.iter().find(|&&a| a != 0).map_or(0, |a| a.abs());
        let gap = if first > 0 {
            Some((0, first.min(n)))
        } else if step > size && first + size < n {
            Some((first + size, (first + step).min(n)))
        } else if last + size < n {
            Some((last + size, n))
        } else {
            None
        };
        if let Some((e0, e1)) = gap {
            errors.push(CoverageError {
                what: format!("output {}", o.name),
                loc: o.loc,
                message: format!(
                    "elements {e0}..{e1} of dim {d} (size {n}) are never written: the grid ({}) places its windows of {size} at element {}",
                    grid.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                    reached_text(f, grid, ("offset", "offsets"))
                ),
            });
        }
    }
}

fn coverage(
    o: &OperandSpec,
    block: &[BlockDim],
    forms: &[Affine],
    grid: &[u64],
    errors: &mut Vec<CoverageError>,
) {
    for (d, f) in forms.iter().enumerate() {
        let n = blocks_along(o, block, d);
        if let Some((b0, b1)) = first_gap(f, grid, n) {
            let size = o.shape.dims()[d] as i64;
            let b = block[d].extent() as i64;
            let (e0, e1) = (b0 * b, (b1 * b).min(size));
            errors.push(CoverageError {
                what: format!("output {}", o.name),
                loc: o.loc,
                message: format!(
                    "elements {e0}..{e1} of dim {d} (size {size}) are never written: the grid ({}) reaches {} of its {n} blocks of {b}",
                    grid.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                    reached_text(f, grid, ("block", "blocks"))
                ),
            });
        }
    }
}

/// `blocks 0..3`, `only block 0`, `blocks 0, 2, ..., 6` (or `offsets ..`) for an error message.
fn reached_text(f: &Affine, grid: &[u64], (one, many): (&str, &str)) -> String {
    match f.coef.iter().position(|&a| a != 0) {
        None => format!("only {one} {}", f.c),
        Some(j) => match (f.coef[j], f.range(grid)) {
            (1 | -1, Some((lo, hi))) => format!("{many} {lo}..{}", hi + 1),
            (a, _) => {
                let at = |t: i64| f.c + a * t;
                let e = grid[j] as i64;
                if e <= 3 {
                    format!(
                        "{many} {}",
                        (0..e).map(|t| at(t).to_string()).collect::<Vec<_>>().join(", ")
                    )
                } else {
                    format!("{many} {}, {}, ..., {}", at(0), at(1), at(e - 1))
                }
            }
        },
    }
}
