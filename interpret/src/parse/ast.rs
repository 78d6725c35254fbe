//! The parsed module: generic MLIR operations with typed values, attributes and regions.

use std::fmt;

/// A position in the parsed text (1-based line and column).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Float element kinds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FloatKind {
    F16,
    Bf16,
    F32,
    F64,
    F8E4M3FN,
    F8E5M2,
}

/// An MLIR type (the subset Mosaic kernels use).
#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    /// `iN` (signless).
    Int(u32),
    Index,
    Float(FloatKind),
    None,
    /// `vector<4x8xf32>`.
    Vector {
        shape: Vec<i64>,
        elem: Box<Type>,
    },
    /// `memref<4x8xf32, #tpu.memory_space<vmem>>` (`-1` for `?` dims).
    MemRef {
        shape: Vec<i64>,
        elem: Box<Type>,
        layout: Option<Box<Attr>>,
        space: Option<Box<Attr>>,
    },
    DmaSemaphore,
    Semaphore,
    /// `(a, b) -> (c)`.
    Function {
        inputs: Vec<Type>,
        results: Vec<Type>,
    },
    Tuple(Vec<Type>),
    /// Any other `!dialect.type<…>`.
    Opaque(String),
}

impl Type {
    pub fn memory_space(&self) -> Option<&str> {
        match self {
            Type::MemRef { space: Some(a), .. } => match &**a {
                Attr::Dialect { name, body } if name == "tpu.memory_space" => {
                    Some(body.split(',').next().unwrap_or("").trim())
                }
                _ => None,
            },
            _ => None,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims = |f: &mut fmt::Formatter<'_>, shape: &[i64]| -> fmt::Result {
            for d in shape {
                if *d < 0 { write!(f, "?x")? } else { write!(f, "{d}x")? }
            }
            Ok(())
        };
        match self {
            Type::Int(w) => write!(f, "i{w}"),
            Type::Index => write!(f, "index"),
            Type::Float(k) => write!(
                f,
                "{}",
                match k {
                    FloatKind::F16 => "f16",
                    FloatKind::Bf16 => "bf16",
                    FloatKind::F32 => "f32",
                    FloatKind::F64 => "f64",
                    FloatKind::F8E4M3FN => "f8E4M3FN",
                    FloatKind::F8E5M2 => "f8E5M2",
                }
            ),
            Type::None => write!(f, "none"),
            Type::Vector { shape, elem } => {
                write!(f, "vector<")?;
                dims(f, shape)?;
                write!(f, "{elem}>")
            }
            Type::MemRef { shape, elem, space, .. } => {
                write!(f, "memref<")?;
                dims(f, shape)?;
                write!(f, "{elem}")?;
                if let Some(s) = space {
                    write!(f, ", {s}")?;
                }
                write!(f, ">")
            }
            Type::DmaSemaphore => write!(f, "!tpu.dma_semaphore"),
            Type::Semaphore => write!(f, "!tpu.semaphore"),
            Type::Function { inputs, results } => {
                write!(f, "(")?;
                for (i, t) in inputs.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{t}")?;
                }
                write!(f, ") -> (")?;
                for (i, t) in results.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{t}")?;
                }
                write!(f, ")")
            }
            Type::Tuple(ts) => {
                write!(f, "tuple<")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{t}")?;
                }
                write!(f, ">")
            }
            Type::Opaque(s) => write!(f, "{s}"),
        }
    }
}

/// One element of a `dense<…>` literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DenseElem {
    Int(i128),
    /// A hex literal: the element's bit pattern (how MLIR prints non-finite floats).
    Bits(u128),
    Float(f64),
    Bool(bool),
}

/// `#tpu.dot_dimension_numbers<[lc], [rc], [lnc], [rnc], [out pairs], [lb], [rb]>`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DotDims {
    pub lhs_contract: Vec<i64>,
    pub rhs_contract: Vec<i64>,
    pub lhs_noncontract: Vec<i64>,
    pub rhs_noncontract: Vec<i64>,
    pub output_dim_order: Vec<i64>,
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Unit,
    Bool(bool),
    Int {
        value: i128,
        ty: Type,
    },
    Float {
        value: f64,
        ty: Type,
    },
    String(String),
    /// `@a::@b` (the nested parts joined with `::`).
    SymbolRef(String),
    Array(Vec<Attr>),
    Dict(Vec<(String, Attr)>),
    /// `array<i32: 1, 2>`.
    DenseArray {
        elem: Type,
        values: Vec<f64>,
    },
    /// `dense<…> : vector<…>`: `splat` when one element was written.
    Dense {
        elems: Vec<DenseElem>,
        splat: bool,
        ty: Type,
    },
    /// `dense<"0x…">` raw little-endian bytes.
    DenseHex {
        bytes: Vec<u8>,
        ty: Type,
    },
    Type(Type),
    DotDims(DotDims),
    /// Any other `#dialect.name<body>` (body is the raw text between the angle brackets).
    Dialect {
        name: String,
        body: String,
    },
}

impl Attr {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int { value, .. } => i64::try_from(*value).ok(),
            Attr::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(b) => Some(*b),
            Attr::Int { value, .. } => Some(*value != 0),
            Attr::Unit => Some(true),
            _ => None,
        }
    }
    /// `array<i64: …>` / `array<i32: …>` or `[1, 2]` of integers.
    pub fn as_i64_list(&self) -> Option<Vec<i64>> {
        match self {
            Attr::DenseArray { values, .. } => Some(values.iter().map(|v| *v as i64).collect()),
            Attr::Array(xs) => xs.iter().map(Attr::as_int).collect(),
            _ => None,
        }
    }
    /// The body of `#name<body>` if this is that dialect attribute.
    pub fn dialect(&self, name: &str) -> Option<&str> {
        match self {
            Attr::Dialect { name: n, body } if n == name => Some(body.trim()),
            _ => None,
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Unit => write!(f, "unit"),
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Int { value, ty } => write!(f, "{value} : {ty}"),
            Attr::Float { value, ty } => write!(f, "{value:e} : {ty}"),
            Attr::String(s) => write!(f, "{s:?}"),
            Attr::SymbolRef(s) => write!(f, "@{s}"),
            Attr::Array(xs) => {
                write!(f, "[")?;
                for (i, x) in xs.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{x}")?;
                }
                write!(f, "]")
            }
            Attr::Dict(kv) => {
                write!(f, "{{")?;
                for (i, (k, v)) in kv.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k} = {v}")?;
                }
                write!(f, "}}")
            }
            Attr::DenseArray { elem, values } => {
                write!(f, "array<{elem}")?;
                for (i, v) in values.iter().enumerate() {
                    write!(f, "{}{v}", if i == 0 { ": " } else { ", " })?;
                }
                write!(f, ">")
            }
            Attr::Dense { elems, ty, .. } => write!(f, "dense<{} elems> : {ty}", elems.len()),
            Attr::DenseHex { bytes, ty } => write!(f, "dense<{} bytes> : {ty}", bytes.len()),
            Attr::Type(t) => write!(f, "{t}"),
            Attr::DotDims(d) => write!(f, "#tpu.dot_dimension_numbers<{d:?}>"),
            Attr::Dialect { name, body } => write!(f, "#{name}<{body}>"),
        }
    }
}

/// A block: label, typed arguments, operations.
#[derive(Clone, Debug, Default)]
pub struct Block {
    pub label: Option<String>,
    pub args: Vec<(String, Type)>,
    pub ops: Vec<Operation>,
}

#[derive(Clone, Debug, Default)]
pub struct Region {
    pub blocks: Vec<Block>,
}

/// One operation in generic form. `name` has the `stable_mosaic.` prefix removed.
#[derive(Clone, Debug)]
pub struct Operation {
    pub name: String,
    pub pos: Pos,
    /// The source location its `loc(...)` names, `file:line:col` (for Palladium's bodies
    /// the Rust line that traced the op, e.g. `kernels/src/gather.rs:27:5`).
    pub src: Option<String>,
    /// Result value names (`%12:2` expands to `%12#0`, `%12#1`).
    pub results: Vec<String>,
    pub result_types: Vec<Type>,
    pub operands: Vec<String>,
    pub operand_types: Vec<Type>,
    pub attrs: Vec<(String, Attr)>,
    pub regions: Vec<Region>,
}

impl Operation {
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

/// The parsed `module attributes {…} { … }`.
#[derive(Clone, Debug)]
pub struct ModuleAst {
    pub attrs: Vec<(String, Attr)>,
    pub ops: Vec<Operation>,
    /// Whether op names carried the `stable_mosaic.` prefix (the serialized form).
    pub serialized: bool,
}
