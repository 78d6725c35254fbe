//! A recursive-descent parser for MLIR's generic operation syntax, as printed for the
//! serialized (`stable_mosaic`) Mosaic body.

use super::ast::*;
use std::collections::HashMap;
use std::fmt;

/// A syntax error at a line and column of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: u32,
    pub col: u32,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parse error at line {}, column {}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for ParseError {}

type R<T> = Result<T, ParseError>;

pub(crate) struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    line: u32,
    col: u32,
    serialized: Option<bool>,
}

const PREFIX: &str = "stable_mosaic.";

impl<'a> Parser<'a> {
    pub fn new(text: &'a str) -> Self {
        Parser { s: text.as_bytes(), i: 0, line: 1, col: 1, serialized: None }
    }

    fn pos(&self) -> Pos {
        Pos { line: self.line, col: self.col }
    }

    fn err<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(ParseError { line: self.line, col: self.col, message: msg.into() })
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn peek_at(&self, k: usize) -> Option<u8> {
        self.s.get(self.i + k).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        if c == b'\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    /// Skip whitespace and `//` comments.
    fn ws(&mut self) {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\n' | b'\r') => {
                    self.bump();
                }
                Some(b'/') if self.peek_at(1) == Some(b'/') => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn rest_starts(&self, lit: &str) -> bool {
        self.s[self.i..].starts_with(lit.as_bytes())
    }

    /// Consume `lit` (after whitespace) if present.
    fn eat(&mut self, lit: &str) -> bool {
        self.ws();
        if self.rest_starts(lit) {
            for _ in 0..lit.len() {
                self.bump();
            }
            true
        } else {
            false
        }
    }

    fn expect(&mut self, lit: &str) -> R<()> {
        if self.eat(lit) {
            Ok(())
        } else {
            let found = self.found();
            self.err(format!("expected `{lit}`, found {found}"))
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "end of input".into(),
            Some(_) => {
                let end = (self.i + 20).min(self.s.len());
                let snippet = String::from_utf8_lossy(&self.s[self.i..end]);
                let snippet = snippet.split('\n').next().unwrap_or("");
                format!("`{snippet}`")
            }
        }
    }

    fn is_id_char(c: u8) -> bool {
        c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$' | b'-')
    }

    /// A bare identifier (`[A-Za-z_][A-Za-z0-9_.$-]*`), after whitespace.
    fn ident(&mut self) -> R<String> {
        self.ws();
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {}
            _ => {
                let f = self.found();
                return self.err(format!("expected an identifier, found {f}"));
            }
        }
        let start = self.i;
        while let Some(c) = self.peek() {
            if Self::is_id_char(c) && !(c == b'-' && self.peek_at(1) == Some(b'>')) {
                self.bump();
            } else {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// `%name` or `^name` or `@name` suffix (after the sigil).
    fn suffix_id(&mut self) -> R<String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$' | b'-') {
                self.bump();
            } else {
                break;
            }
        }
        if start == self.i {
            return self.err("expected a name after the sigil");
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn value_name(&mut self) -> R<String> {
        self.ws();
        if self.peek() != Some(b'%') {
            let f = self.found();
            return self.err(format!("expected a value name (`%…`), found {f}"));
        }
        self.bump();
        let mut n = self.suffix_id()?;
        // `%12#1` refers to result 1 of a multi-result op.
        if self.peek() == Some(b'#') {
            self.bump();
            let k = self.suffix_id()?;
            n = format!("{n}#{k}");
        }
        Ok(n)
    }

    fn string_lit(&mut self) -> R<String> {
        self.ws();
        if self.peek() != Some(b'"') {
            let f = self.found();
            return self.err(format!("expected a string, found {f}"));
        }
        self.bump();
        let mut out = Vec::new();
        loop {
            match self.bump() {
                None => return self.err("unterminated string"),
                Some(b'"') => break,
                Some(b'\\') => match self.bump() {
                    Some(b'n') => out.push(b'\n'),
                    Some(b't') => out.push(b'\t'),
                    Some(b'"') => out.push(b'"'),
                    Some(b'\\') => out.push(b'\\'),
                    Some(c) if c.is_ascii_hexdigit() => {
                        let d = self.bump().unwrap_or(b'0');
                        let h = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                        out.push(h(c) * 16 + h(d));
                    }
                    _ => return self.err("bad escape in string"),
                },
                Some(c) => out.push(c),
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Raw text up to the matching `>` (the opening `<` already consumed); nested `<>`,
    /// `()`, `[]`, `{}` and strings are skipped over.
    fn balanced_angle(&mut self) -> R<String> {
        let start = self.i;
        let mut depth = 1i32;
        loop {
            match self.peek() {
                None => return self.err("unterminated `<…>`"),
                Some(b'"') => {
                    self.string_lit()?;
                    continue;
                }
                Some(b'<' | b'(' | b'[' | b'{') => depth += 1,
                Some(b'>') if self.i > 0 && self.s[self.i - 1] == b'-' => {}
                Some(b'>' | b')' | b']' | b'}') => {
                    depth -= 1;
                    if depth == 0 {
                        let body = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                        self.bump();
                        return Ok(body);
                    }
                }
                _ => {}
            }
            self.bump();
        }
    }

    /// A trailing `loc(...)`, if any: its text between the parentheses, unresolved.
    fn loc(&mut self) -> R<Option<String>> {
        self.ws();
        if !self.rest_starts("loc(") {
            return Ok(None);
        }
        self.eat("loc(");
        let start = self.i;
        let mut depth = 1;
        while depth > 0 {
            match self.peek() {
                None => return self.err("unterminated loc(…)"),
                Some(b'"') => {
                    self.string_lit()?;
                    continue;
                }
                Some(b'(') => depth += 1,
                Some(b')') => depth -= 1,
                _ => {}
            }
            self.bump();
        }
        Ok(Some(String::from_utf8_lossy(&self.s[start..self.i - 1]).into_owned()))
    }

    /// Top-level lines starting with `#`: location aliases (`#loc3 = loc(...)`) are kept in
    /// `aliases`, other attribute aliases (`#map = …`) skipped.
    fn top_level_aliases(&mut self, aliases: &mut HashMap<String, String>) -> R<()> {
        loop {
            self.ws();
            if self.peek() != Some(b'#') {
                return Ok(());
            }
            let line_start = (self.i, self.line, self.col);
            self.bump();
            let name = self.suffix_id()?;
            self.ws();
            if self.eat("=")
                && let Some(text) = self.loc()?
            {
                aliases.insert(name, text);
                continue;
            }
            (self.i, self.line, self.col) = line_start;
            while let Some(c) = self.bump() {
                if c == b'\n' {
                    break;
                }
            }
        }
    }

    // --- numbers ----------------------------------------------------------------------------

    /// An integer or float literal (optionally negative, hex allowed).
    fn number(&mut self) -> R<DenseElem> {
        self.ws();
        let start = self.i;
        let neg = self.peek() == Some(b'-');
        if neg {
            self.bump();
        }
        if self.rest_starts("0x") || self.rest_starts("0X") {
            self.bump();
            self.bump();
            let hs = self.i;
            while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                self.bump();
            }
            let h = std::str::from_utf8(&self.s[hs..self.i]).unwrap_or("");
            let v = u128::from_str_radix(h, 16)
                .or_else(|_| self.err(format!("bad hex literal `{h}`")))?;
            if neg {
                return Ok(DenseElem::Int(-(v as i128)));
            }
            return Ok(DenseElem::Bits(v));
        }
        let mut float = false;
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() {
                self.bump();
            } else if c == b'.' || c == b'e' || c == b'E' {
                float = true;
                self.bump();
                if (c == b'e' || c == b'E') && matches!(self.peek(), Some(b'+' | b'-')) {
                    self.bump();
                }
            } else {
                break;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        if text.is_empty() || text == "-" {
            let f = self.found();
            return self.err(format!("expected a number, found {f}"));
        }
        if float {
            text.parse::<f64>()
                .map(DenseElem::Float)
                .or_else(|_| self.err(format!("bad float literal `{text}`")))
        } else {
            text.parse::<i128>()
                .map(DenseElem::Int)
                .or_else(|_| self.err(format!("bad integer literal `{text}`")))
        }
    }

    fn starts_number(&mut self) -> bool {
        self.ws();
        match self.peek() {
            Some(c) if c.is_ascii_digit() => true,
            Some(b'-') => self.peek_at(1).is_some_and(|c| c.is_ascii_digit()),
            _ => false,
        }
    }

    // --- types ------------------------------------------------------------------------------

    pub fn parse_type(&mut self) -> R<Type> {
        self.ws();
        match self.peek() {
            Some(b'(') => {
                self.bump();
                let mut inputs = Vec::new();
                if !self.eat(")") {
                    loop {
                        inputs.push(self.parse_type()?);
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                if self.eat("->") {
                    let results = self.result_types()?;
                    Ok(Type::Function { inputs, results })
                } else {
                    Ok(Type::Tuple(inputs))
                }
            }
            Some(b'!') => {
                self.bump();
                let name = self.suffix_id()?;
                let mut full = format!("!{name}");
                if self.peek() == Some(b'<') {
                    self.bump();
                    let body = self.balanced_angle()?;
                    full = format!("{full}<{body}>");
                }
                Ok(match full.as_str() {
                    "!tpu.dma_semaphore" => Type::DmaSemaphore,
                    "!tpu.semaphore" => Type::Semaphore,
                    _ => Type::Opaque(full),
                })
            }
            _ => {
                let pos = self.pos();
                let id = self.ident_no_dot_x()?;
                self.named_type(&id, pos)
            }
        }
    }

    /// An identifier for a type keyword (letters, digits, `_`).
    fn ident_no_dot_x(&mut self) -> R<String> {
        self.ws();
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            self.bump();
        }
        if start == self.i {
            let f = self.found();
            return self.err(format!("expected a type, found {f}"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn named_type(&mut self, id: &str, pos: Pos) -> R<Type> {
        let t = match id {
            "index" => Type::Index,
            "none" => Type::None,
            "f16" => Type::Float(FloatKind::F16),
            "bf16" => Type::Float(FloatKind::Bf16),
            "f32" => Type::Float(FloatKind::F32),
            "f64" => Type::Float(FloatKind::F64),
            "f8E4M3FN" => Type::Float(FloatKind::F8E4M3FN),
            "f8E5M2" => Type::Float(FloatKind::F8E5M2),
            "vector" | "memref" => {
                self.expect("<")?;
                let mut shape = Vec::new();
                loop {
                    self.ws();
                    match self.peek() {
                        Some(c) if c.is_ascii_digit() => {
                            let start = self.i;
                            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                                self.bump();
                            }
                            let n: i64 = std::str::from_utf8(&self.s[start..self.i])
                                .unwrap_or("0")
                                .parse()
                                .or_else(|_| self.err("bad dimension"))?;
                            shape.push(n);
                            if self.peek() != Some(b'x') {
                                return self.err("expected `x` after a dimension");
                            }
                            self.bump();
                        }
                        Some(b'?') => {
                            self.bump();
                            shape.push(-1);
                            if self.peek() != Some(b'x') {
                                return self.err("expected `x` after a dimension");
                            }
                            self.bump();
                        }
                        _ => break,
                    }
                }
                let elem = Box::new(self.parse_type()?);
                if id == "vector" {
                    self.expect(">")?;
                    Type::Vector { shape, elem }
                } else {
                    let (mut layout, mut space) = (None, None);
                    while self.eat(",") {
                        let a = self.parse_attr()?;
                        let is_space = matches!(&a, Attr::Dialect { name, .. } if name == "tpu.memory_space")
                            || matches!(a, Attr::Int { .. });
                        if is_space {
                            space = Some(Box::new(a));
                        } else {
                            layout = Some(Box::new(a));
                        }
                    }
                    self.expect(">")?;
                    Type::MemRef { shape, elem, layout, space }
                }
            }
            "tuple" => {
                self.expect("<")?;
                let mut ts = Vec::new();
                if !self.eat(">") {
                    loop {
                        ts.push(self.parse_type()?);
                        if self.eat(">") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Type::Tuple(ts)
            }
            _ if id.len() > 1
                && id.starts_with('i')
                && id[1..].bytes().all(|c| c.is_ascii_digit()) =>
            {
                Type::Int(id[1..].parse().unwrap_or(32))
            }
            // `si32` / `ui32`: signed and unsigned attribute types (`tpu.dynamic_rotate`'s
            // `dimension`); values are read the same as signless ones.
            _ if id.len() > 2
                && (id.starts_with("si") || id.starts_with("ui"))
                && id[2..].bytes().all(|c| c.is_ascii_digit()) =>
            {
                Type::Int(id[2..].parse().unwrap_or(32))
            }
            _ => {
                return Err(ParseError {
                    line: pos.line,
                    col: pos.col,
                    message: format!("unknown type `{id}`"),
                });
            }
        };
        Ok(t)
    }

    /// `()` | `type` | `(type, …)` after `->`.
    fn result_types(&mut self) -> R<Vec<Type>> {
        self.ws();
        if self.peek() == Some(b'(') {
            self.bump();
            let mut ts = Vec::new();
            if !self.eat(")") {
                loop {
                    ts.push(self.parse_type()?);
                    if self.eat(")") {
                        break;
                    }
                    self.expect(",")?;
                }
            }
            Ok(ts)
        } else {
            Ok(vec![self.parse_type()?])
        }
    }

    // --- attributes -------------------------------------------------------------------------

    pub fn parse_attr(&mut self) -> R<Attr> {
        self.ws();
        let pos = self.pos();
        match self.peek() {
            None => self.err("expected an attribute, found end of input"),
            Some(b'[') => {
                self.bump();
                let mut xs = Vec::new();
                if !self.eat("]") {
                    loop {
                        xs.push(self.parse_attr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Attr::Array(xs))
            }
            Some(b'{') => Ok(Attr::Dict(self.attr_dict()?)),
            Some(b'"') => Ok(Attr::String(self.string_lit()?)),
            Some(b'@') => {
                self.bump();
                let mut name =
                    if self.peek() == Some(b'"') { self.string_lit()? } else { self.suffix_id()? };
                while self.eat("::") {
                    self.expect("@")?;
                    let part = self.suffix_id()?;
                    name = format!("{name}::{part}");
                }
                Ok(Attr::SymbolRef(name))
            }
            Some(b'#') => {
                self.bump();
                let name = self.suffix_id()?;
                let body = if self.peek() == Some(b'<') {
                    self.bump();
                    self.balanced_angle()?
                } else {
                    String::new()
                };
                if name == "tpu.dot_dimension_numbers" {
                    return dot_dims(&body).map(Attr::DotDims).ok_or(ParseError {
                        line: pos.line,
                        col: pos.col,
                        message: format!("bad #tpu.dot_dimension_numbers<{body}>"),
                    });
                }
                Ok(Attr::Dialect { name, body })
            }
            Some(b'(' | b'!') => Ok(Attr::Type(self.parse_type()?)),
            _ if self.starts_number() => {
                let n = self.number()?;
                let ty = if self.eat(":") { self.parse_type()? } else { Type::Int(64) };
                Ok(scalar_attr(n, ty))
            }
            _ => {
                let save = (self.i, self.line, self.col);
                let id = self.ident()?;
                match id.as_str() {
                    "true" | "false" => {
                        let b = id == "true";
                        // `true : i1` is an integer attribute in some printers; keep it a bool.
                        if self.rest_after_ws_starts(":") && !self.rest_after_ws_starts("::") {
                            self.expect(":")?;
                            self.parse_type()?;
                        }
                        Ok(Attr::Bool(b))
                    }
                    "unit" => Ok(Attr::Unit),
                    "array" => {
                        self.expect("<")?;
                        let elem = self.parse_type()?;
                        let mut values = Vec::new();
                        if self.eat(":") {
                            loop {
                                let v = self.dense_elem()?;
                                values.push(match v {
                                    DenseElem::Int(i) => i as f64,
                                    DenseElem::Bits(b) => b as f64,
                                    DenseElem::Float(f) => f,
                                    DenseElem::Bool(b) => f64::from(u8::from(b)),
                                });
                                if !self.eat(",") {
                                    break;
                                }
                            }
                        }
                        self.expect(">")?;
                        Ok(Attr::DenseArray { elem, values })
                    }
                    "dense" => {
                        self.expect("<")?;
                        self.ws();
                        if self.peek() == Some(b'"') {
                            let s = self.string_lit()?;
                            self.expect(">")?;
                            self.expect(":")?;
                            let ty = self.parse_type()?;
                            let hex = s.trim_start_matches("0x").trim_start_matches("0X");
                            let bytes = (0..hex.len() / 2)
                                .map(|k| u8::from_str_radix(&hex[2 * k..2 * k + 2], 16))
                                .collect::<Result<Vec<_>, _>>();
                            let Ok(bytes) = bytes else {
                                return self.err("bad hex string in dense<…>");
                            };
                            return Ok(Attr::DenseHex { bytes, ty });
                        }
                        let mut elems = Vec::new();
                        let splat = if self.peek() == Some(b'[') {
                            self.dense_list(&mut elems)?;
                            false
                        } else if self.eat(">") {
                            // dense<> (empty)
                            self.expect(":")?;
                            let ty = self.parse_type()?;
                            return Ok(Attr::Dense { elems, splat: false, ty });
                        } else {
                            elems.push(self.dense_elem()?);
                            true
                        };
                        self.expect(">")?;
                        self.expect(":")?;
                        let ty = self.parse_type()?;
                        Ok(Attr::Dense { elems, splat, ty })
                    }
                    "affine_map" | "affine_set" | "strided" | "distinct" => {
                        self.expect("<")?;
                        let body = self.balanced_angle()?;
                        Ok(Attr::Dialect { name: id, body })
                    }
                    _ => {
                        // A type used as an attribute (`i32`, `vector<…>`, …).
                        (self.i, self.line, self.col) = save;
                        match self.parse_type() {
                            Ok(t) => Ok(Attr::Type(t)),
                            Err(_) => Err(ParseError {
                                line: pos.line,
                                col: pos.col,
                                message: format!("unknown attribute `{id}`"),
                            }),
                        }
                    }
                }
            }
        }
    }

    fn rest_after_ws_starts(&mut self, lit: &str) -> bool {
        self.ws();
        self.rest_starts(lit)
    }

    fn dense_elem(&mut self) -> R<DenseElem> {
        self.ws();
        if self.rest_starts("true") {
            self.eat("true");
            return Ok(DenseElem::Bool(true));
        }
        if self.rest_starts("false") {
            self.eat("false");
            return Ok(DenseElem::Bool(false));
        }
        if self.peek() == Some(b'(') {
            return self.err("complex dense elements are not supported");
        }
        self.number()
    }

    fn dense_list(&mut self, out: &mut Vec<DenseElem>) -> R<()> {
        self.expect("[")?;
        if self.eat("]") {
            return Ok(());
        }
        loop {
            self.ws();
            if self.peek() == Some(b'[') {
                self.dense_list(out)?;
            } else {
                out.push(self.dense_elem()?);
            }
            if self.eat("]") {
                return Ok(());
            }
            self.expect(",")?;
        }
    }

    /// `{key = value, unit_key, "quoted" = value}`.
    fn attr_dict(&mut self) -> R<Vec<(String, Attr)>> {
        self.expect("{")?;
        let mut out = Vec::new();
        if self.eat("}") {
            return Ok(out);
        }
        loop {
            self.ws();
            let key = if self.peek() == Some(b'"') { self.string_lit()? } else { self.ident()? };
            let value = if self.eat("=") { self.parse_attr()? } else { Attr::Unit };
            out.push((key, value));
            if self.eat("}") {
                return Ok(out);
            }
            self.expect(",")?;
        }
    }

    // --- operations -------------------------------------------------------------------------

    pub fn parse_module(&mut self) -> R<ModuleAst> {
        // Top-level aliases: before the module (`#map = …`) and, for locations, after it.
        let mut aliases = HashMap::new();
        let mut attrs = Vec::new();
        self.top_level_aliases(&mut aliases)?;
        let ops = if self.eat("module") {
            self.ws();
            if self.peek() == Some(b'@') {
                self.bump();
                self.suffix_id()?;
            }
            if self.eat("attributes") {
                attrs = self.attr_dict()?;
            }
            let region = self.region()?;
            self.loc()?;
            let mut blocks = region.blocks;
            if blocks.len() != 1 {
                return self.err("the module must have exactly one block");
            }
            blocks.remove(0).ops
        } else {
            // A bare list of top-level ops.
            let mut ops = Vec::new();
            loop {
                self.ws();
                if self.peek().is_none() {
                    break;
                }
                ops.push(self.operation()?);
            }
            ops
        };
        self.top_level_aliases(&mut aliases)?;
        if self.peek().is_some() {
            let f = self.found();
            return self.err(format!("unexpected text after the module: {f}"));
        }
        let mut ops = ops;
        resolve_locations(&mut ops, &aliases);
        Ok(ModuleAst { attrs, ops, serialized: self.serialized.unwrap_or(false) })
    }

    fn region(&mut self) -> R<Region> {
        self.expect("{")?;
        let mut blocks = Vec::new();
        let mut cur = Block::default();
        let mut started = false;
        loop {
            self.ws();
            match self.peek() {
                None => return self.err("unterminated region (missing `}`)"),
                Some(b'}') => {
                    self.bump();
                    if started || !cur.ops.is_empty() || cur.label.is_some() {
                        blocks.push(cur);
                    }
                    return Ok(Region { blocks });
                }
                Some(b'^') => {
                    if started || !cur.ops.is_empty() {
                        blocks.push(std::mem::take(&mut cur));
                    }
                    started = true;
                    self.bump();
                    cur.label = Some(self.suffix_id()?);
                    if self.eat("(") && !self.eat(")") {
                        loop {
                            let n = self.value_name()?;
                            self.expect(":")?;
                            let t = self.parse_type()?;
                            self.loc()?;
                            cur.args.push((n, t));
                            if self.eat(")") {
                                break;
                            }
                            self.expect(",")?;
                        }
                    }
                    self.expect(":")?;
                }
                _ => {
                    let op = self.operation()?;
                    cur.ops.push(op);
                }
            }
        }
    }

    fn operation(&mut self) -> R<Operation> {
        self.ws();
        let pos = self.pos();
        let mut results = Vec::new();
        if self.peek() == Some(b'%') {
            loop {
                let n = self.value_name()?;
                if self.peek() == Some(b':') && self.peek_at(1).is_some_and(|c| c.is_ascii_digit())
                {
                    self.bump();
                    let start = self.i;
                    while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.bump();
                    }
                    // Each result needs a type in the op's signature, so a count past the
                    // rest of the text is malformed (and must not size an allocation).
                    let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                    let k = text.parse::<usize>().ok().filter(|&k| k <= self.s.len() - self.i).ok_or_else(|| ParseError {
                        line: pos.line,
                        col: pos.col,
                        message: format!("result group `%{n}:{text}` has more results than the op's type can list"),
                    })?;
                    for j in 0..k {
                        results.push(format!("{n}#{j}"));
                    }
                } else {
                    results.push(n);
                }
                if !self.eat(",") {
                    break;
                }
            }
            self.expect("=")?;
        }
        self.ws();
        if self.peek() != Some(b'"') {
            let f = self.found();
            return self.err(format!("expected an operation in generic form (`\"dialect.op\"(…)`), found {f}; custom op syntax is not supported"));
        }
        let raw = self.string_lit()?;
        let name = match raw.strip_prefix(PREFIX) {
            Some(n) => {
                self.serialized.get_or_insert(true);
                n.to_string()
            }
            None => {
                if raw != "builtin.module" {
                    self.serialized = Some(false);
                }
                raw
            }
        };
        self.expect("(")?;
        let mut operands = Vec::new();
        if !self.eat(")") {
            loop {
                operands.push(self.value_name()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        if self.rest_after_ws_starts("[") {
            return self.err("successor blocks (unstructured control flow) are not supported");
        }
        let mut attrs = Vec::new();
        if self.eat("<{") {
            // Properties: `<{a = 1}>` — parse as a dict.
            self.i -= 1;
            self.col -= 1;
            attrs.extend(self.attr_dict()?);
            self.expect(">")?;
        }
        let mut regions = Vec::new();
        self.ws();
        if self.peek() == Some(b'(') {
            self.bump();
            loop {
                regions.push(self.region()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.ws();
        if self.peek() == Some(b'{') {
            attrs.extend(self.attr_dict()?);
        }
        self.expect(":")?;
        let fty = self.parse_type()?;
        let Type::Function { inputs, results: rtys } = fty else {
            return Err(ParseError {
                line: pos.line,
                col: pos.col,
                message: format!("`{name}`: expected a function type after `:`"),
            });
        };
        let src = self.loc()?;
        if inputs.len() != operands.len() {
            return Err(ParseError {
                line: pos.line,
                col: pos.col,
                message: format!(
                    "`{name}` has {} operands but its type lists {}",
                    operands.len(),
                    inputs.len()
                ),
            });
        }
        if rtys.len() != results.len() {
            return Err(ParseError {
                line: pos.line,
                col: pos.col,
                message: format!(
                    "`{name}` defines {} results but its type lists {}",
                    results.len(),
                    rtys.len()
                ),
            });
        }
        Ok(Operation {
            name,
            pos,
            src,
            results,
            result_types: rtys,
            operands,
            operand_types: inputs,
            attrs,
            regions,
        })
    }
}

/// Replace each op's raw `loc(...)` text by the `file:line:col` it names (through aliases,
/// names and call sites: the first file location found), or `None`.
fn resolve_locations(ops: &mut [Operation], aliases: &HashMap<String, String>) {
    for op in ops {
        op.src = op.src.as_deref().and_then(|raw| file_line_col(raw, aliases, 0));
        for r in &mut op.regions {
            for b in &mut r.blocks {
                resolve_locations(&mut b.ops, aliases);
            }
        }
    }
}

/// The first `"file":line:col` in a location's text, following `#alias` references (at most a
/// few deep: an alias cycle is malformed input, not a reason to loop).
fn file_line_col(text: &str, aliases: &HashMap<String, String>, depth: u32) -> Option<String> {
    let mut rest = text;
    while let Some(q) = rest.find(['"', '#']) {
        let after = &rest[q + 1..];
        if rest.as_bytes()[q] == b'#' {
            let end = after
                .find(|c: char| {
                    !(c.is_alphanumeric() || c == '_' || c == '.' || c == '$' || c == '-')
                })
                .unwrap_or(after.len());
            if depth < 8
                && let Some(found) =
                    aliases.get(&after[..end]).and_then(|t| file_line_col(t, aliases, depth + 1))
            {
                return Some(found);
            }
            rest = &after[end..];
            continue;
        }
        let close = after.find('"')?;
        let (file, tail) = (&after[..close], &after[close + 1..]);
        let digits = |t: &str| {
            t.strip_prefix(':')
                .map(|t| t.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("").to_string())
                .filter(|d| !d.is_empty())
        };
        if let Some(line) = digits(tail)
            && let Some(col) = digits(&tail[1 + line.len()..])
        {
            return Some(format!("{file}:{line}:{col}"));
        }
        rest = tail;
    }
    None
}

fn scalar_attr(n: DenseElem, ty: Type) -> Attr {
    match (n, &ty) {
        (DenseElem::Bits(bits), Type::Float(k)) => {
            // Hex literal: the float's bit pattern.
            let v = match k {
                FloatKind::F32 => f64::from(f32::from_bits(bits as u32)),
                FloatKind::F64 => f64::from_bits(bits as u64),
                FloatKind::Bf16 => f64::from(half::bf16::from_bits(bits as u16).to_f32()),
                FloatKind::F16 => f64::from(half::f16::from_bits(bits as u16).to_f32()),
                _ => bits as f64,
            };
            Attr::Float { value: v, ty }
        }
        (DenseElem::Int(v), Type::Float(_)) => Attr::Float { value: v as f64, ty },
        (DenseElem::Int(v), _) => Attr::Int { value: v, ty },
        (DenseElem::Bits(v), _) => Attr::Int { value: v as i128, ty },
        (DenseElem::Float(f), _) => Attr::Float { value: f, ty },
        (DenseElem::Bool(b), _) => Attr::Bool(b),
    }
}

/// `[1], [0], [0], [1], [0, 0, 1, 1], [], []`.
fn dot_dims(body: &str) -> Option<DotDims> {
    let mut lists = Vec::new();
    let mut rest = body.trim();
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']')? + open;
        let inner = &rest[open + 1..close];
        let xs = inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<i64>().ok())
            .collect::<Option<Vec<_>>>()?;
        lists.push(xs);
        rest = &rest[close + 1..];
    }
    if lists.len() != 7 {
        return None;
    }
    let mut it = lists.into_iter();
    Some(DotDims {
        lhs_contract: it.next()?,
        rhs_contract: it.next()?,
        lhs_noncontract: it.next()?,
        rhs_noncontract: it.next()?,
        output_dim_order: it.next()?,
        lhs_batch: it.next()?,
        rhs_batch: it.next()?,
    })
}
