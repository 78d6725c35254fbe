//! THE evaluator of integer scalar ops (grid indices, block indices, loop bounds, SMEM
//! values) and of index maps, for the tools that run a kernel's control without its data:
//! the profile walks the body's scalars and both the profile and autotune's traffic model
//! walk the grid pipeline ([`palladium_array::pipeline`]) with [`CompiledIndexMap`]. Integers wrap
//! at their type's width, as Mosaic's `arith` ops do; a value that depends on data the
//! caller does not have is unknown (`None`) and stays unknown through the ops that use it.

use super::{
    BinaryOp, Block, CmpPred, DType, Index, Kernel, Literal, Offset, Op, OpData, Type, UnaryOp,
    Value,
};
use crate::spec::{OperandRole, OperandSpec};
use smallvec::SmallVec;
use std::collections::HashMap;

/// A pure integer scalar op: what it computes, without its operands.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum ScalarOp {
    Const(i64),
    /// The operand unchanged (`assume_multiple`, a scalar `reshape`).
    Copy,
    Binary(BinaryOp, DType),
    Compare(CmpPred),
    /// `cond ? on_true : on_false`: known when `cond` and the chosen operand are.
    Select,
    Unary(UnaryOp, DType),
    Cast(DType),
}

impl ScalarOp {
    /// `op` as a scalar op and its operands, if it is an integer (or bool) scalar op the
    /// evaluator knows; `None` for anything else (vectors, floats, memory, control flow).
    pub fn of(k: &Kernel, op: Op) -> Option<(ScalarOp, SmallVec<[Value; 3]>)> {
        let node = &k.ops[op];
        let int = |v: Value| match k.ty(v) {
            Type::Scalar(d) => !d.is_float(),
            _ => false,
        };
        let result = *node.results.first()?;
        if !int(result) {
            return None;
        }
        let Type::Scalar(dt) = *k.ty(result) else { return None };
        let (sop, args): (ScalarOp, &[Value]) = match &node.data {
            OpData::Constant { value: Literal::Int(i), .. } => (ScalarOp::Const(wrap(*i, dt)), &[]),
            OpData::Constant { value: Literal::Bool(b), .. } => {
                (ScalarOp::Const(i64::from(*b)), &[])
            }
            OpData::Binary { op: BinaryOp::Pow, .. } => return None,
            OpData::Binary { op: b, lhs, rhs } => (ScalarOp::Binary(*b, dt), &[*lhs, *rhs]),
            OpData::Compare { pred, lhs, rhs } if int(*lhs) && int(*rhs) => {
                (ScalarOp::Compare(*pred), &[*lhs, *rhs])
            }
            OpData::Select { cond, on_true, on_false } => {
                (ScalarOp::Select, &[*cond, *on_true, *on_false])
            }
            OpData::Unary { op: u @ (UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not), x } => {
                (ScalarOp::Unary(*u, dt), std::slice::from_ref(x))
            }
            OpData::Cast { x, to } if int(*x) => (ScalarOp::Cast(*to), std::slice::from_ref(x)),
            OpData::AssumeMultiple { x, .. } | OpData::Reshape { x, .. } => {
                (ScalarOp::Copy, std::slice::from_ref(x))
            }
            _ => return None,
        };
        args.iter().all(|&a| int(a)).then(|| (sop, args.iter().copied().collect()))
    }

    /// The result for operands `args` (`None`: unknown), or why it has none (a division
    /// by zero, a shift past the width).
    pub fn apply(self, args: &[Option<i64>]) -> Result<Option<i64>, String> {
        if self == ScalarOp::Select {
            return Ok(args[0].and_then(|c| if c != 0 { args[1] } else { args[2] }));
        }
        let mut known = [0i64; 2];
        for (k, a) in known.iter_mut().zip(args) {
            let Some(a) = a else { return Ok(None) };
            *k = *a;
        }
        let [a, b] = known;
        Ok(Some(match self {
            ScalarOp::Const(c) => c,
            ScalarOp::Copy => a,
            ScalarOp::Select => unreachable!("evaluated above"),
            ScalarOp::Binary(op, dt) => wrap(
                match op {
                    BinaryOp::Add => a.wrapping_add(b),
                    BinaryOp::Sub => a.wrapping_sub(b),
                    BinaryOp::Mul => a.wrapping_mul(b),
                    BinaryOp::Div | BinaryOp::Rem if b == 0 => {
                        return Err(format!("{op} by zero"));
                    }
                    BinaryOp::Div => a.wrapping_div(b),
                    BinaryOp::Rem => a.wrapping_rem(b),
                    BinaryOp::Max => a.max(b),
                    BinaryOp::Min => a.min(b),
                    BinaryOp::And => a & b,
                    BinaryOp::Or => a | b,
                    BinaryOp::Xor => a ^ b,
                    BinaryOp::Shl | BinaryOp::Shr if !(0..i64::from(dt.bits())).contains(&b) => {
                        return Err(format!("{op} by {b}, past the {}-bit width", dt.bits()));
                    }
                    BinaryOp::Shl => a << b,
                    BinaryOp::Shr => a >> b,
                    BinaryOp::Pow => unreachable!("not a scalar op (ScalarOp::of)"),
                },
                dt,
            ),
            ScalarOp::Compare(pred) => i64::from(match pred {
                CmpPred::Eq => a == b,
                CmpPred::Ne => a != b,
                CmpPred::Lt => a < b,
                CmpPred::Le => a <= b,
                CmpPred::Gt => a > b,
                CmpPred::Ge => a >= b,
            }),
            ScalarOp::Unary(op, dt) => match op {
                UnaryOp::Neg => wrap(a.wrapping_neg(), dt),
                UnaryOp::Abs => wrap(a.wrapping_abs(), dt),
                UnaryOp::Not if dt == DType::Bool => 1 - a,
                UnaryOp::Not => wrap(!a, dt),
                _ => unreachable!("not a scalar op (ScalarOp::of)"),
            },
            ScalarOp::Cast(to) => wrap(a, to),
        }))
    }
}

/// `x` as a value of integer type `dt`: the low bits, sign-extended; a bool is 0 or 1.
fn wrap(x: i64, dt: DType) -> i64 {
    match dt {
        DType::Bool => i64::from(x != 0),
        _ if dt.bits() >= 64 => x,
        _ => {
            let shift = 64 - dt.bits();
            (x << shift) >> shift
        }
    }
}

/// Why an index map cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexMapError {
    /// An op other than integer scalar arithmetic and scalar-prefetch loads (its mnemonic).
    UnsupportedOp(String),
    /// The map is not the function of the grid indices and prefetch refs the call spec says.
    Malformed(String),
}

/// Where an instruction operand comes from.
#[derive(Copy, Clone, Debug)]
enum Arg {
    Slot(usize),
    Imm(i64),
}

#[derive(Clone, Debug)]
enum Instr {
    Scalar(ScalarOp, SmallVec<[Arg; 3]>),
    /// A scalar load from prefetch array `table` (row-major, `dims`).
    Load {
        table: usize,
        offsets: Vec<Arg>,
        dims: Vec<u64>,
    },
}

/// One operand's index map compiled to straight-line code: slots `0..grid rank` are the grid
/// indices, each instruction writes the next slot, and the yielded slots are the block
/// indices (element offsets for element windows).
#[derive(Clone, Debug)]
pub struct CompiledIndexMap {
    grid_rank: usize,
    instrs: Vec<Instr>,
    outputs: Vec<Arg>,
}

/// What an index-map value is during compilation.
#[derive(Copy, Clone)]
enum Bound {
    Scalar(usize),
    Prefetch(usize),
}

impl CompiledIndexMap {
    /// Compile operand `o`'s index map `map` of kernel `k`.
    pub fn compile(
        k: &Kernel,
        o: &OperandSpec,
        map: Block,
    ) -> Result<CompiledIndexMap, IndexMapError> {
        let bad = |m: String| IndexMapError::Malformed(m);
        let grid_rank = k.call.grid.len();
        let n_prefetch = k.call.operands_of(OperandRole::Prefetch).count();
        let params = &k.blocks[map].params;
        if params.len() != grid_rank + n_prefetch {
            return Err(bad(format!(
                "takes {} parameters, expected {grid_rank} grid indices and {n_prefetch} prefetch refs",
                params.len()
            )));
        }
        let mut env: HashMap<Value, Bound> = HashMap::new();
        for (i, &p) in params.iter().enumerate() {
            let b = if i < grid_rank { Bound::Scalar(i) } else { Bound::Prefetch(i - grid_rank) };
            env.insert(p, b);
        }
        let scalar = |env: &HashMap<Value, Bound>, v: Value| match env.get(&v) {
            Some(Bound::Scalar(s)) => Ok(Arg::Slot(*s)),
            Some(Bound::Prefetch(_)) => Err(bad(format!("{v} is a prefetch ref used as a scalar"))),
            None => Err(bad(format!("{v} is not defined inside the index map"))),
        };
        let mut instrs = Vec::new();
        let mut outputs = None;
        for &op in &k.blocks[map].ops {
            let node = &k.ops[op];
            if outputs.is_some() {
                return Err(bad("ops after the yield".into()));
            }
            let instr = match &node.data {
                OpData::Constant { value: Literal::Int(v), ty: Type::Scalar(DType::I32) }
                    if i32::try_from(*v).is_err() =>
                {
                    return Err(bad(format!("constant {v} does not fit in i32")));
                }
                OpData::Constant { value, ty } if !matches!(ty, Type::Scalar(d) if !d.is_float()) =>
                {
                    return Err(bad(format!(
                        "constant {value} of type {ty}: index maps compute in scalar i32"
                    )));
                }
                OpData::Load { src, index } => {
                    let Some(Bound::Prefetch(table)) = env.get(src).copied() else {
                        return Err(bad(format!(
                            "load from {src}, which is not a scalar-prefetch ref"
                        )));
                    };
                    let dims = match k.ty(*src) {
                        Type::Ref(r) => r.shape.dims().to_vec(),
                        t => return Err(bad(format!("load from a {t}"))),
                    };
                    if index.len() != dims.len() {
                        return Err(bad(format!(
                            "load with {} indices from a rank-{} ref",
                            index.len(),
                            dims.len()
                        )));
                    }
                    let mut offsets = Vec::new();
                    for ix in index {
                        offsets.push(match ix {
                            Index::Point(Offset::Static(i)) => Arg::Imm(*i),
                            Index::Point(Offset::Dynamic(v)) => scalar(&env, *v)?,
                            Index::Slice { .. } => return Err(bad("vector loads in an index map (only scalar SMEM loads are evaluated)".into())),
                        });
                    }
                    Instr::Load { table, offsets, dims }
                }
                OpData::Yield { values } => {
                    let yielded: Result<Vec<Arg>, _> =
                        values.iter().map(|&v| scalar(&env, v)).collect();
                    outputs = Some(yielded?);
                    continue;
                }
                _ => match ScalarOp::of(k, op) {
                    Some((sop, args)) => Instr::Scalar(
                        sop,
                        args.iter().map(|&a| scalar(&env, a)).collect::<Result<_, _>>()?,
                    ),
                    None => return Err(IndexMapError::UnsupportedOp(node.data.mnemonic())),
                },
            };
            let [result] = node.results.as_slice() else {
                return Err(bad(format!(
                    "op {} has {} results",
                    node.data.mnemonic(),
                    node.results.len()
                )));
            };
            env.insert(*result, Bound::Scalar(grid_rank + instrs.len()));
            instrs.push(instr);
        }
        let outputs = outputs.ok_or_else(|| bad("does not end with a yield".into()))?;
        if outputs.len() != o.shape.rank() {
            return Err(bad(format!(
                "yields {} block indices for a rank-{} array",
                outputs.len(),
                o.shape.rank()
            )));
        }
        Ok(CompiledIndexMap { grid_rank, instrs, outputs })
    }

    /// The block indices at grid point `point`, written into `out`, with the scalar-prefetch
    /// arrays' contents `tables` (row-major, in operand order; `None`: not known). False
    /// when they depend on an unknown table; an error for a division by zero or a load out
    /// of bounds. `slots` is scratch space, reused between calls.
    pub fn eval(
        &self,
        point: &[i64],
        tables: &[Option<Vec<i64>>],
        slots: &mut Vec<Option<i64>>,
        out: &mut Vec<i64>,
    ) -> Result<bool, String> {
        slots.clear();
        slots.extend(point[..self.grid_rank].iter().map(|&x| Some(x)));
        let get = |slots: &[Option<i64>], a: Arg| match a {
            Arg::Slot(s) => slots[s],
            Arg::Imm(v) => Some(v),
        };
        let mut args: SmallVec<[Option<i64>; 3]> = SmallVec::new();
        for instr in &self.instrs {
            let v = match instr {
                Instr::Scalar(op, from) => {
                    args.clear();
                    args.extend(from.iter().map(|&a| get(slots, a)));
                    op.apply(&args)?
                }
                Instr::Load { table, offsets, dims } => {
                    let mut flat = Some(0i64);
                    for (d, (&a, &n)) in offsets.iter().zip(dims).enumerate() {
                        let Some(i) = get(slots, a) else {
                            flat = None;
                            continue;
                        };
                        if i < 0 || i as u64 >= n {
                            return Err(format!(
                                "prefetch load index {i} out of bounds in dim {d} (size {n})"
                            ));
                        }
                        flat = flat.map(|f| f * n as i64 + i);
                    }
                    flat.zip(tables[*table].as_ref()).map(|(f, t)| t[f as usize])
                }
            };
            slots.push(v);
        }
        out.clear();
        for &a in &self.outputs {
            let Some(x) = get(slots, a) else { return Ok(false) };
            out.push(x);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_wrap_at_their_width_as_mosaic_arith_does() {
        let add = ScalarOp::Binary(BinaryOp::Add, DType::I32);
        assert_eq!(add.apply(&[Some(i64::from(i32::MAX)), Some(1)]), Ok(Some(i64::from(i32::MIN))));
        let mul = ScalarOp::Binary(BinaryOp::Mul, DType::I32);
        assert_eq!(mul.apply(&[Some(1 << 20), Some(1 << 12)]), Ok(Some(0)));
        let div = ScalarOp::Binary(BinaryOp::Div, DType::I32);
        assert_eq!(div.apply(&[Some(-7), Some(2)]), Ok(Some(-3)), "signed division truncates");
        assert_eq!(div.apply(&[Some(1), Some(0)]), Err("div by zero".into()));
        let shl = ScalarOp::Binary(BinaryOp::Shl, DType::I32);
        assert_eq!(shl.apply(&[Some(1), Some(31)]), Ok(Some(i64::from(i32::MIN))));
        assert!(shl.apply(&[Some(1), Some(32)]).is_err());
        assert_eq!(ScalarOp::Cast(DType::I8).apply(&[Some(200)]), Ok(Some(-56)));
        assert_eq!(ScalarOp::Unary(UnaryOp::Not, DType::Bool).apply(&[Some(1)]), Ok(Some(0)));
        assert_eq!(ScalarOp::Unary(UnaryOp::Not, DType::I32).apply(&[Some(0)]), Ok(Some(-1)));
    }

    #[test]
    fn unknown_operands_make_unknown_results_except_a_select_s_other_branch() {
        let sub = ScalarOp::Binary(BinaryOp::Sub, DType::I32);
        assert_eq!(sub.apply(&[None, Some(1)]), Ok(None));
        assert_eq!(ScalarOp::Compare(CmpPred::Lt).apply(&[Some(1), None]), Ok(None));
        assert_eq!(ScalarOp::Select.apply(&[Some(1), Some(5), None]), Ok(Some(5)));
        assert_eq!(ScalarOp::Select.apply(&[Some(0), Some(5), None]), Ok(None));
        assert_eq!(ScalarOp::Select.apply(&[None, Some(5), Some(5)]), Ok(None));
    }
}
