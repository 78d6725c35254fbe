//! Parsing of `#[kernel(...)]` arguments and of the parameter attributes.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprClosure, Ident, Token, bracketed};

/// Collects every error instead of stopping at the first.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    pub fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }
    pub fn into_result(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// `#[kernel(grid = (..), semantics = (..), vmem_limit = e, aliases = [(x, o)], cost = (f, t, b), requires = [..], mesh = [x = n], collective_id = 0)]`
pub struct KernelArgs {
    pub grid: Vec<Expr>,
    pub grid_span: Span,
    pub semantics: Vec<Ident>,
    pub semantics_span: Span,
    pub vmem_limit: Option<Expr>,
    pub aliases: Vec<(Ident, Ident)>,
    pub cost: Option<Vec<Expr>>,
    /// `requires = [top_k <= experts, ffn % block_ffn == 0]`: relations between parameters,
    /// checked before anything is traced.
    pub requires: Vec<Expr>,
    /// `mesh = [x = 4]` (or `[x = 2, y = n]`): the device mesh, axis names and sizes.
    pub mesh: Vec<(Ident, Expr)>,
    /// `collective_id = 0`: the barrier semaphore's collective.
    pub collective_id: Option<Expr>,
}

fn tuple_elems(e: &Expr) -> Vec<Expr> {
    match e {
        Expr::Tuple(t) => t.elems.iter().cloned().collect(),
        Expr::Paren(p) => vec![(*p.expr).clone()],
        other => vec![other.clone()],
    }
}

pub fn parse_kernel_args(tokens: TokenStream, errors: &mut Errors) -> KernelArgs {
    let mut args = KernelArgs {
        grid: Vec::new(),
        grid_span: Span::call_site(),
        semantics: Vec::new(),
        semantics_span: Span::call_site(),
        vmem_limit: None,
        aliases: Vec::new(),
        cost: None,
        requires: Vec::new(),
        mesh: Vec::new(),
        collective_id: None,
    };
    let parsed = match syn::parse::Parser::parse2(
        Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated,
        tokens,
    ) {
        Ok(p) => p,
        Err(e) => {
            errors.push(e);
            return args;
        }
    };
    for nv in parsed {
        let key = nv.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
        match key.as_str() {
            "grid" => {
                args.grid = tuple_elems(&nv.value);
                args.grid_span = nv.value.span();
            }
            "semantics" => {
                args.semantics_span = nv.value.span();
                for e in tuple_elems(&nv.value) {
                    match &e {
                        Expr::Path(p) if p.path.get_ident().is_some() => {
                            let id = p.path.get_ident().cloned().expect("checked");
                            if id != "parallel" && id != "arbitrary" {
                                errors.at(id.span(), format!("unknown dimension semantics `{id}`: expected `parallel` or `arbitrary`"));
                            }
                            args.semantics.push(id);
                        }
                        other => errors.at(other.span(), "dimension semantics are `parallel` or `arbitrary`"),
                    }
                }
            }
            "vmem_limit" => args.vmem_limit = Some(nv.value.clone()),
            "cost" => args.cost = Some(tuple_elems(&nv.value)),
            "requires" => match &nv.value {
                Expr::Array(a) => args.requires = a.elems.iter().cloned().collect(),
                other => errors.at(other.span(), "requires = [relation, ...], e.g. requires = [top_k <= experts]"),
            },
            "collective_id" => args.collective_id = Some(nv.value.clone()),
            "mesh" => match &nv.value {
                Expr::Array(a) => {
                    for e in &a.elems {
                        match e {
                            Expr::Assign(asg) if matches!(&*asg.left, Expr::Path(p) if p.path.get_ident().is_some()) => {
                                let Expr::Path(p) = &*asg.left else { unreachable!("matched above") };
                                args.mesh.push((p.path.get_ident().cloned().expect("matched above"), (*asg.right).clone()));
                            }
                            other => errors.at(other.span(), "a mesh axis is `name = size`, e.g. mesh = [x = 4]"),
                        }
                    }
                }
                other => errors.at(other.span(), "mesh = [axis = size, ...], e.g. mesh = [x = 4]"),
            },
            "aliases" => match &nv.value {
                Expr::Array(a) => {
                    for e in &a.elems {
                        let pair = tuple_elems(e);
                        let ids: Vec<Option<Ident>> = pair.iter().map(|x| if let Expr::Path(p) = x { p.path.get_ident().cloned() } else { None }).collect();
                        match ids.as_slice() {
                            [Some(i), Some(o)] => args.aliases.push((i.clone(), o.clone())),
                            _ => errors.at(e.span(), "an alias is `(input_name, output_name)`"),
                        }
                    }
                }
                other => errors.at(other.span(), "aliases = [(input_name, output_name), ...]"),
            },
            _ => errors.at(nv.path.span(), format!("unknown kernel argument `{key}`: expected grid, semantics, vmem_limit, aliases, cost, requires, mesh or collective_id")),
        }
    }
    if !args.grid.is_empty() && args.semantics.is_empty() {
        args.semantics = args.grid.iter().map(|e| Ident::new("arbitrary", e.span())).collect();
    } else if args.semantics.len() != args.grid.len() {
        errors.at(
            args.semantics_span,
            format!(
                "{} dimension semantics for a grid of {} dims",
                args.semantics.len(),
                args.grid.len()
            ),
        );
    }
    args
}

/// `dtype[d0, d1, ...]`
pub struct ArrayTy {
    pub dtype: Ident,
    pub dims: Vec<Expr>,
    pub span: Span,
}

impl Parse for ArrayTy {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let dtype: Ident = input.parse()?;
        let content;
        let b = bracketed!(content in input);
        let dims = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
        Ok(ArrayTy {
            span: dtype.span().join(b.span.close()).unwrap_or(dtype.span()),
            dtype,
            dims: dims.into_iter().collect(),
        })
    }
}

pub const DTYPES: &[(&str, &str)] = &[
    ("bf16", "Bf16"),
    ("f16", "F16"),
    ("f32", "F32"),
    ("f8e4m3fn", "F8E4M3"),
    ("f8e5m2", "F8E5M2"),
    ("i32", "I32"),
    ("i16", "I16"),
    ("i8", "I8"),
    ("i4", "I4"),
    ("bool", "Bool"),
];

pub const SPACES: &[(&str, &str)] =
    &[("vmem", "Vmem"), ("smem", "Smem"), ("hbm", "Hbm"), ("any", "Any")];

/// A block dim: an expression, `None` for a squeezed dim, or `Element(n)` /
/// `Element(n, (lo, hi))` (Pallas's `pl.Element`) for an element-indexed one.
pub enum BlockDimArg {
    Blocked(Expr),
    Squeezed,
    Element { size: Expr, pad: Option<Box<(Expr, Expr)>> },
}

/// `Element(n)` or `Element(n, (lo, hi))`; `None` when `e` is not a call of `Element`.
fn element_dim(e: &Expr) -> Option<syn::Result<BlockDimArg>> {
    let Expr::Call(c) = e else { return None };
    if !matches!(&*c.func, Expr::Path(p) if p.path.is_ident("Element")) {
        return None;
    }
    let usage =
        "expected `Element(n)` or `Element(n, (pad_before, pad_after))` (Pallas's `pl.Element`)";
    let args: Vec<&Expr> = c.args.iter().collect();
    Some(match args.as_slice() {
        [size] => Ok(BlockDimArg::Element { size: (*size).clone(), pad: None }),
        [size, Expr::Tuple(t)] if t.elems.len() == 2 => Ok(BlockDimArg::Element {
            size: (*size).clone(),
            pad: Some(Box::new((t.elems[0].clone(), t.elems[1].clone()))),
        }),
        _ => Err(syn::Error::new(e.span(), usage)),
    })
}

/// `#[input(T[dims], block = [..], map = |..| .., space = vmem)]` and friends.
pub struct OperandArgs {
    pub array: ArrayTy,
    pub block: Option<(Vec<BlockDimArg>, Span)>,
    pub map: Option<ExprClosure>,
    pub space: Option<Ident>,
    /// `pipeline_mode = Buffered(n)`: the buffer count `n`.
    pub buffered: Option<Expr>,
    /// `range = lo..=hi` (scalar prefetch only): the values the operand may hold.
    pub range: Option<(Expr, Expr, Span)>,
}

impl Parse for OperandArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let array: ArrayTy = input.parse()?;
        let mut out =
            OperandArgs { array, block: None, map: None, space: None, buffered: None, range: None };
        while input.peek(Token![,]) {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "block" => {
                    let e: syn::ExprArray = input.parse()?;
                    let dims = e
                        .elems
                        .iter()
                        .map(|d| match d {
                            Expr::Path(p) if p.path.is_ident("None") => Ok(BlockDimArg::Squeezed),
                            other => element_dim(other)
                                .unwrap_or_else(|| Ok(BlockDimArg::Blocked(other.clone()))),
                        })
                        .collect::<syn::Result<Vec<_>>>()?;
                    // Pallas (jax 0.10.2) refuses a block mixing element and blocked dims.
                    let element = dims.iter().any(|d| matches!(d, BlockDimArg::Element { .. }));
                    if let Some(BlockDimArg::Blocked(b)) = dims
                        .iter()
                        .find(|d| matches!(d, BlockDimArg::Blocked(_)))
                        .filter(|_| element)
                    {
                        return Err(syn::Error::new(
                            b.span(),
                            "a block with an `Element` dim cannot have blocked dims (Pallas refuses the mix): write `Element(n)` (or `None` to squeeze)",
                        ));
                    }
                    for d in &dims {
                        if let BlockDimArg::Element {
                            size: size @ Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }),
                            ..
                        } = d
                            && n.base10_digits() == "0"
                        {
                            return Err(syn::Error::new(
                                size.span(),
                                "an `Element` dim of size 0: a window needs at least one element",
                            ));
                        }
                    }
                    out.block = Some((dims, e.span()));
                }
                "map" => out.map = Some(input.parse()?),
                "space" => out.space = Some(input.parse()?),
                "pipeline_mode" => {
                    let mode: Expr = input.parse()?;
                    match &mode {
                        Expr::Call(c)
                            if matches!(&*c.func, Expr::Path(p) if p.path.is_ident("Buffered"))
                                && c.args.len() == 1 =>
                        {
                            out.buffered = c.args.first().cloned();
                        }
                        other => {
                            return Err(syn::Error::new(
                                other.span(),
                                "unknown pipeline mode: expected `Buffered(n)` (Pallas's `pl.Buffered(n)`)",
                            ));
                        }
                    }
                }
                "range" => {
                    let r: syn::ExprRange = input.parse()?;
                    match (r.start, r.limits, r.end) {
                        (Some(lo), syn::RangeLimits::Closed(_), Some(hi)) => {
                            out.range = Some((*lo, *hi, key.span()));
                        }
                        _ => {
                            return Err(syn::Error::new(
                                key.span(),
                                "a value range is `lo..=hi` (both ends included), e.g. range = 1..=max_context",
                            ));
                        }
                    }
                }
                other => {
                    return Err(syn::Error::new(
                        key.span(),
                        format!(
                            "unknown operand argument `{other}`: expected block, map, space, pipeline_mode or range"
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// `#[scratch(vmem, f32[8, 128])]`, `#[scratch(dma_sem[2])]`, `#[scratch(sem)]`.
pub enum ScratchArgs {
    Buffer { space: Ident, array: ArrayTy },
    Semaphores { kind: Ident, dims: Vec<Expr> },
}

impl Parse for ScratchArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let first: Ident = input.parse()?;
        match first.to_string().as_str() {
            "dma_sem" | "sem" => {
                let dims = if input.peek(syn::token::Bracket) {
                    let content;
                    bracketed!(content in input);
                    Punctuated::<Expr, Token![,]>::parse_terminated(&content)?.into_iter().collect()
                } else {
                    Vec::new()
                };
                Ok(ScratchArgs::Semaphores { kind: first, dims })
            }
            _ => {
                input.parse::<Token![,]>()?;
                Ok(ScratchArgs::Buffer { space: first, array: input.parse()? })
            }
        }
    }
}
