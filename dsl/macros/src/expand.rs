//! The expansion of `#[kernel]`.

use crate::body::BodyRewriter;
use crate::parse::{
    BlockDimArg, DTYPES, Errors, OperandArgs, SPACES, ScratchArgs, parse_kernel_args,
};
use proc_macro2::{Group, Punct, Spacing, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Expr, FnArg, Ident, ItemFn, Pat, Type};

/// The crate the expansion reaches the DSL's items through, fixed by the entry point the
/// author imported: an author depends on `palladium-dsl` or on the entry crate `palladium`,
/// and the generated code must name the crate that is in their `Cargo.toml`.
///
/// The templates name it by a placeholder (`::__pd_root::__private::...`, spanned like the
/// rest of their template) that [`Root::reroot`] replaces at the end, at the placeholder's
/// span: the span is what `#[track_caller]` reports, so every traced op keeps the kernel line
/// that traced it whichever crate the path names.
#[derive(Clone, Copy, Debug)]
pub enum Root {
    /// `palladium_dsl::kernel`: `::palladium_dsl`.
    Dsl,
    /// `palladium::kernel` (the entry crate's re-export): `::palladium::dsl`.
    Entry,
}

impl Root {
    fn path(self) -> &'static [&'static str] {
        match self {
            Root::Dsl => &["palladium_dsl"],
            Root::Entry => &["palladium", "dsl"],
        }
    }

    /// `tokens` with every placeholder `__pd_root` (a name the macro reserves: its own are
    /// `__pd`-prefixed) replaced by this root's path. Groups without one are kept as they are.
    fn reroot(self, tokens: TokenStream) -> TokenStream {
        let mut out = TokenStream::new();
        for tree in tokens {
            match tree {
                TokenTree::Ident(id) if id == PLACEHOLDER => {
                    for (i, segment) in self.path().iter().enumerate() {
                        if i > 0 {
                            let mut joint = Punct::new(':', Spacing::Joint);
                            let mut alone = Punct::new(':', Spacing::Alone);
                            joint.set_span(id.span());
                            alone.set_span(id.span());
                            out.extend([TokenTree::Punct(joint), TokenTree::Punct(alone)]);
                        }
                        out.extend([TokenTree::Ident(Ident::new(segment, id.span()))]);
                    }
                }
                TokenTree::Group(g) if mentions_placeholder(g.stream()) => {
                    let mut group = Group::new(g.delimiter(), self.reroot(g.stream()));
                    group.set_span(g.span());
                    out.extend([TokenTree::Group(group)]);
                }
                other => out.extend([other]),
            }
        }
        out
    }
}

/// The name the templates give the DSL crate until [`Root::reroot`].
const PLACEHOLDER: &str = "__pd_root";

fn mentions_placeholder(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(id) => id == PLACEHOLDER,
        TokenTree::Group(g) => mentions_placeholder(g.stream()),
        _ => false,
    })
}

pub fn expand(root: Root, args: TokenStream, item: TokenStream) -> TokenStream {
    root.reroot(expand_with_placeholder(args, item))
}

fn expand_with_placeholder(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    match expand_fn(args, func.clone()) {
        Ok(tokens) => tokens,
        Err(e) => {
            // Report every error, and keep a body-less item of the same name so the rest of
            // the crate still resolves it (and the IDE keeps working).
            let errors = e.to_compile_error();
            let fallback = fallback_item(&func);
            quote!(#errors #fallback)
        }
    }
}

fn fallback_item(func: &ItemFn) -> TokenStream {
    let build = quote! {
        ::core::result::Result::Err(::__pd_root::BuildErrors::default())
    };
    params_module(&func.sig.ident, &func.vis, &[], &compile_time_params(func), build)
}

struct Param {
    ident: Ident,
    ty: Type,
    default: Option<Expr>,
}

enum RefKind {
    Operand { role: &'static str, args: Box<OperandArgs> },
    Scratch(ScratchArgs),
}

fn attr_kind(a: &Attribute) -> Option<&'static str> {
    ["input", "output", "prefetch", "scratch", "default"].into_iter().find(|k| a.path().is_ident(k))
}

fn compile_time_params(func: &ItemFn) -> Vec<Param> {
    let mut out = Vec::new();
    for arg in &func.sig.inputs {
        let FnArg::Typed(pt) = arg else { continue };
        let kinds: Vec<_> = pt.attrs.iter().filter_map(attr_kind).collect();
        if kinds.iter().any(|k| *k != "default") {
            continue;
        }
        let Pat::Ident(pi) = &*pt.pat else { continue };
        if is_ref_type(&pt.ty) {
            // A ref without a spec: reported as such, not a parameter.
            continue;
        }
        let default = pt
            .attrs
            .iter()
            .find(|a| a.path().is_ident("default"))
            .and_then(|a| a.parse_args::<Expr>().ok());
        out.push(Param { ident: pi.ident.clone(), ty: (*pt.ty).clone(), default });
    }
    out
}

fn is_ref_type(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Ref" || s.ident == "SemRef"))
}

/// A dtype in `dtype[dims]`: a dtype name, or a compile-time parameter of type `DType`
/// (so one kernel can be built for several element types, e.g. `out_dtype[m, n]`).
fn dtype_tokens(id: &Ident, params: &[Param], errors: &mut Errors) -> TokenStream {
    if let Some((_, v)) = DTYPES.iter().find(|(n, _)| id == n) {
        let v = Ident::new(v, id.span());
        return quote!(::__pd_root::__private::DType::#v);
    }
    if params.iter().any(|p| p.ident == *id) {
        return quote_spanned!(id.span()=> { let __pd_dtype: ::__pd_root::__private::DType = #id; __pd_dtype });
    }
    let known: Vec<_> = DTYPES.iter().map(|(n, _)| *n).collect();
    errors.at(
        id.span(),
        format!(
            "unknown dtype `{id}` (known: {}, or a compile-time parameter of type DType)",
            known.join(", ")
        ),
    );
    quote!(::__pd_root::__private::DType::F32)
}

fn space_tokens(id: Option<&Ident>, default: &str, errors: &mut Errors) -> TokenStream {
    let name = id.map(|i| i.to_string()).unwrap_or_else(|| default.to_string());
    let span = id.map(|i| i.span()).unwrap_or_else(Span::call_site);
    match SPACES.iter().find(|(n, _)| *n == name) {
        Some((_, v)) => {
            let v = Ident::new(v, span);
            quote!(::__pd_root::__private::MemorySpace::#v)
        }
        None => {
            errors.at(span, format!("unknown memory space `{name}` (known: vmem, smem, hbm, any)"));
            quote!(::__pd_root::__private::MemorySpace::Vmem)
        }
    }
}

/// A size expression of an attribute with its arithmetic checked (see
/// `palladium_dsl::trace::params`): `a op b` for `+ - * / %` becomes `size::op(a, b)`,
/// through parentheses; anything else (a name, a literal, a call) is an operand as is.
/// With `relations`, comparisons, `&&`, `||` and `!` are rewritten too (for `requires`).
fn checked(e: &Expr, relations: bool) -> TokenStream {
    use syn::BinOp as B;
    match e {
        // In arithmetic the calls group; a relation keeps the user's parentheses.
        Expr::Paren(p) if relations => {
            let x = checked(&p.expr, true);
            quote_spanned!(p.span()=> (#x))
        }
        Expr::Paren(p) => checked(&p.expr, false),
        Expr::Binary(b) => {
            let f = match b.op {
                B::Add(_) => "add",
                B::Sub(_) => "sub",
                B::Mul(_) => "mul",
                B::Div(_) => "div",
                B::Rem(_) => "rem",
                B::Lt(_) if relations => "lt",
                B::Le(_) if relations => "le",
                B::Gt(_) if relations => "gt",
                B::Ge(_) if relations => "ge",
                B::Eq(_) if relations => "eq",
                B::Ne(_) if relations => "ne",
                B::And(_) | B::Or(_) if relations => {
                    let (l, r, op) = (checked(&b.left, true), checked(&b.right, true), &b.op);
                    return quote_spanned!(b.span()=> #l #op #r);
                }
                _ => return quote!(#e),
            };
            let (l, r) = (checked(&b.left, false), checked(&b.right, false));
            let f = Ident::new(f, b.op.span());
            quote_spanned!(b.span()=> ::__pd_root::__private::size::#f(#l, #r))
        }
        Expr::Unary(u) if relations && matches!(u.op, syn::UnOp::Not(_)) => {
            let x = checked(&u.expr, true);
            quote_spanned!(u.span()=> !#x)
        }
        _ => quote!(#e),
    }
}

/// An expression as the user wrote it, for error messages (`tokens.div_ceil(16) * 16`).
pub(crate) fn expr_text(e: &Expr) -> String {
    let raw = quote!(#e).to_string();
    let chars: Vec<char> = raw.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev = out.chars().last().unwrap_or(' ');
            let next = chars.get(i + 1).copied().unwrap_or(' ');
            let glued = matches!(next, '.' | ',' | ')' | ']')
                || matches!(prev, '.' | '(' | '[' | '!')
                || (next == '(' && (prev.is_alphanumeric() || prev == '_'));
            if glued {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// `checks.size(expr, what, text)`: one checked size as a `u64`.
fn size_tokens(e: &Expr, what: &str) -> TokenStream {
    let value = checked(e, false);
    let text = expr_text(e);
    quote_spanned!(e.span()=> __pd_c.size(#value, #what, #text))
}

fn dims_tokens(dims: &[Expr], owner: &str) -> TokenStream {
    let ds = dims.iter().enumerate().map(|(i, d)| size_tokens(d, &format!("dim {i} of `{owner}`")));
    quote!(&[#(#ds),*])
}

/// The parameters an expression mentions, in order of first mention.
fn mentioned<'a>(e: &Expr, params: &'a [Param]) -> Vec<&'a Ident> {
    struct Names(Vec<Ident>);
    impl<'ast> syn::visit::Visit<'ast> for Names {
        fn visit_ident(&mut self, i: &'ast Ident) {
            if !self.0.contains(i) {
                self.0.push(i.clone());
            }
        }
    }
    let mut names = Names(Vec::new());
    syn::visit::visit_expr(&mut names, e);
    names.0.iter().filter_map(|n| params.iter().find(|p| p.ident == *n).map(|p| &p.ident)).collect()
}

/// One `requires` relation: `a % b == 0` reads "b = .. does not divide a = ..", anything
/// else "requires <relation>, but <the parameters it mentions>".
fn require_tokens(e: &Expr, params: &[Param]) -> TokenStream {
    if let Expr::Binary(eq) = e
        && matches!(eq.op, syn::BinOp::Eq(_))
        && let Expr::Binary(rem) = &*eq.left
        && matches!(rem.op, syn::BinOp::Rem(_))
        && matches!(&*eq.right, Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(z), .. }) if z.base10_digits() == "0")
    {
        let (a, b) = (checked(&rem.left, false), checked(&rem.right, false));
        let (at, bt) = (expr_text(&rem.left), expr_text(&rem.right));
        return quote_spanned!(e.span()=> __pd_c.divides("", (::__pd_root::__private::size::IntoSize::into_size(#b), #bt), (::__pd_root::__private::size::IntoSize::into_size(#a), #at)););
    }
    let holds = checked(e, true);
    let text = expr_text(e);
    let values = mentioned(e, params).into_iter().map(|id| {
        let name = id.to_string();
        quote!((#name, &#id as &dyn ::core::fmt::Display))
    });
    quote_spanned!(e.span()=> __pd_c.require(#holds, #text, &[#(#values),*]);)
}

fn expand_fn(args: TokenStream, func: ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let kargs = parse_kernel_args(args, &mut errors);
    let grid_rank = kargs.grid.len();
    let name = func.sig.ident.clone();
    let vis = func.vis.clone();
    if func.sig.output != syn::ReturnType::Default {
        errors.at(
            func.sig.output.span(),
            "a kernel returns nothing: it writes its outputs through refs",
        );
    }
    if !func.sig.generics.params.is_empty() {
        errors
            .at(func.sig.generics.span(), "kernels cannot be generic: use compile-time parameters");
    }

    // Classify parameters.
    let mut refs: Vec<(Ident, RefKind, Type)> = Vec::new();
    for arg in &func.sig.inputs {
        let FnArg::Typed(pt) = arg else {
            errors.at(arg.span(), "kernels are free functions (no `self`)");
            continue;
        };
        let Pat::Ident(pi) = &*pt.pat else {
            errors.at(pt.pat.span(), "kernel parameters must be plain names");
            continue;
        };
        let specs: Vec<&Attribute> =
            pt.attrs.iter().filter(|a| matches!(attr_kind(a), Some(k) if k != "default")).collect();
        match specs.as_slice() {
            [] if is_ref_type(&pt.ty) => errors.at(
                pt.ty.span(),
                format!("ref parameter `{}` needs a spec: #[input(..)], #[output(..)], #[prefetch(..)] or #[scratch(..)]", pi.ident),
            ),
            [] => {}
            [a] => {
                let kind = attr_kind(a).expect("filtered");
                let parsed = if kind == "scratch" {
                    a.parse_args::<ScratchArgs>().map(RefKind::Scratch)
                } else {
                    let role = match kind {
                        "input" => "Input",
                        "output" => "Output",
                        _ => "Prefetch",
                    };
                    a.parse_args::<OperandArgs>().map(|args| RefKind::Operand { role, args: Box::new(args) })
                };
                match parsed {
                    Ok(k) => refs.push((pi.ident.clone(), k, (*pt.ty).clone())),
                    Err(e) => errors.push(e),
                }
            }
            [_, second, ..] => errors.at(second.span(), "a parameter takes one spec attribute"),
        }
    }
    let params = compile_time_params(&func);
    let prefetch_count = refs
        .iter()
        .filter(|(_, k, _)| matches!(k, RefKind::Operand { role: "Prefetch", .. }))
        .count();

    // Declarations.
    let mut decls = Vec::new();
    let mut tiling = Vec::new();
    let mut bindings = Vec::new();
    for (i, (ident, kind, ty)) in refs.iter().enumerate() {
        let name_str = ident.to_string();
        match kind {
            RefKind::Operand { role, args } => {
                let role_id = Ident::new(role, ident.span());
                let dtype = dtype_tokens(&args.array.dtype, &params, &mut errors);
                let default_space = if *role == "Prefetch" { "smem" } else { "vmem" };
                let space = space_tokens(args.space.as_ref(), default_space, &mut errors);
                let shape = dims_tokens(&args.array.dims, &name_str);
                let block = match &args.block {
                    Some((dims, span)) => {
                        if dims.len() != args.array.dims.len() {
                            errors.at(
                                *span,
                                format!(
                                    "block rank {} differs from the array rank {}",
                                    dims.len(),
                                    args.array.dims.len()
                                ),
                            );
                        }
                        for (d, (b, a)) in dims.iter().zip(&args.array.dims).enumerate() {
                            if let BlockDimArg::Blocked(b) = b {
                                let what = format!("block dim {d} of `{name_str}`");
                                let (bv, av) = (checked(b, false), checked(a, false));
                                let (bt, at) = (expr_text(b), expr_text(a));
                                tiling.push(quote_spanned!(b.span()=> __pd_c.divides(#what, (::__pd_root::__private::size::IntoSize::into_size(#bv), #bt), (::__pd_root::__private::size::IntoSize::into_size(#av), #at));));
                            }
                        }
                        let ds = dims.iter().enumerate().map(|(d, b)| match b {
                            BlockDimArg::Blocked(e) => {
                                let size = size_tokens(e, &format!("block dim {d} of `{name_str}`"));
                                quote_spanned!(e.span()=> ::__pd_root::__private::BlockDim::Blocked(#size))
                            }
                            BlockDimArg::Squeezed => quote!(::__pd_root::__private::BlockDim::Squeezed),
                            BlockDimArg::Element { size, pad } => {
                                let what = format!("element block dim {d} of `{name_str}`");
                                let n = size_tokens(size, &what);
                                let (lo, hi) = match pad.as_deref() {
                                    Some((lo, hi)) => (size_tokens(lo, &format!("padding before {what}")), size_tokens(hi, &format!("padding after {what}"))),
                                    None => (quote!(0u64), quote!(0u64)),
                                };
                                quote_spanned!(size.span()=> ::__pd_root::__private::BlockDim::Element { size: #n, pad: (#lo, #hi) })
                            }
                        });
                        quote!(::core::option::Option::Some(::std::vec![#(#ds),*]))
                    }
                    None => quote!(::core::option::Option::None),
                };
                let map = match &args.map {
                    Some(closure) => index_map(closure, grid_rank, prefetch_count, &mut errors),
                    None => {
                        if args.block.is_some() {
                            errors.at(
                                args.array.span,
                                "a block shape needs an index map: `map = |i, j| (i, j)`",
                            );
                        }
                        quote!(
                            ::core::option::Option::<
                                ::std::boxed::Box<
                                    dyn ::core::ops::FnOnce(
                                            &[::__pd_root::__private::Val],
                                            &[::__pd_root::__private::Ref],
                                        )
                                            -> (u32,),
                                >,
                            >::None
                        )
                    }
                };
                // Spanned at the attribute: the declaration's location (for call-spec errors)
                // is the operand's `bf16[m, k]`, not the `#[kernel]` line.
                let declare = quote_spanned! {args.array.span=>
                    __pd_b.operand(#name_str, ::__pd_root::__private::OperandRole::#role_id, #dtype, #shape, #space, #block, #map)
                };
                let buffered = args.buffered.iter().map(|n| {
                    let count = size_tokens(n, &format!("the buffer count of `{name_str}`"));
                    quote_spanned!(n.span()=> __pd_b.pipeline_mode(__pd_slot, ::__pd_root::__private::PipelineMode::Buffered(#count));)
                });
                let range = args.range.iter().map(|(lo, hi, span)| {
                    if *role != "Prefetch" {
                        errors.at(
                            *span,
                            format!(
                                "`range` is for scalar prefetch: `{name_str}` is an {}",
                                role.to_lowercase()
                            ),
                        );
                    }
                    let lo = size_tokens(lo, &format!("the lowest value of `{name_str}`"));
                    let hi = size_tokens(hi, &format!("the highest value of `{name_str}`"));
                    quote_spanned!(*span=> __pd_b.value_range(__pd_slot, #lo, #hi);)
                });
                let settings: Vec<TokenStream> = buffered.chain(range).collect();
                decls.push(if settings.is_empty() {
                    quote!(#declare;)
                } else {
                    quote!({ let __pd_slot = #declare; #(#settings)* })
                });
                bindings.push(quote_spanned!(ty.span()=> let #ident: #ty = __pd_sealed.handles[#i].clone().into_ref();));
            }
            RefKind::Scratch(ScratchArgs::Buffer { space, array }) => {
                let space = space_tokens(Some(space), "vmem", &mut errors);
                let dtype = dtype_tokens(&array.dtype, &params, &mut errors);
                let shape = dims_tokens(&array.dims, &name_str);
                decls.push(quote_spanned!(ident.span()=> __pd_b.scratch_buffer(#name_str, #space, #dtype, #shape);));
                bindings.push(quote_spanned!(ty.span()=> let #ident: #ty = __pd_sealed.handles[#i].clone().into_ref();));
            }
            RefKind::Scratch(ScratchArgs::Semaphores { kind, dims }) => {
                let k = if kind == "dma_sem" { quote!(Dma) } else { quote!(Regular) };
                let shape = dims_tokens(dims, &name_str);
                decls.push(quote_spanned!(ident.span()=> __pd_b.scratch_semaphores(#name_str, ::__pd_root::__private::SemKind::#k, #shape);));
                bindings.push(quote_spanned!(ty.span()=> let #ident: #ty = __pd_sealed.handles[#i].clone().into_sem();));
            }
        }
    }
    let grid = kargs.grid.iter().enumerate().map(|(i, e)| {
        let parallel = kargs.semantics.get(i).is_some_and(|s| s == "parallel");
        let sem = Ident::new(if parallel { "Parallel" } else { "Arbitrary" }, e.span());
        let extent = size_tokens(e, &format!("grid dim {i}"));
        quote_spanned!(e.span()=> __pd_b.grid_dim(#extent, ::__pd_root::__private::Semantics::#sem);)
    });
    let vmem = kargs.vmem_limit.iter().map(|e| {
        let bytes = size_tokens(e, "vmem_limit");
        quote_spanned!(e.span()=> __pd_b.vmem_limit_bytes(#bytes);)
    });
    let mesh = if kargs.mesh.is_empty() {
        quote!()
    } else {
        let axes = kargs.mesh.iter().map(|(name, size)| {
            let (name, size) = (name.to_string(), size_tokens(size, &format!("mesh axis {name}")));
            quote!((#name, #size))
        });
        quote!(__pd_b.mesh(&[#(#axes),*]);)
    };
    let collective_id = kargs.collective_id.iter().map(|e| {
        let id = size_tokens(e, "collective_id");
        quote_spanned!(e.span()=> __pd_b.collective_id(#id as u32);)
    });
    let aliases = kargs.aliases.iter().map(|(i, o)| {
        let (i, o) = (i.to_string(), o.to_string());
        quote!(__pd_b.alias(#i, #o);)
    });
    let cost = match &kargs.cost {
        Some(c) if c.len() == 3 => {
            let (f, t, b) = (
                size_tokens(&c[0], "cost flops"),
                size_tokens(&c[1], "cost transcendentals"),
                size_tokens(&c[2], "cost bytes_accessed"),
            );
            quote!(__pd_b.cost_estimate(#f, #t, #b);)
        }
        Some(c) => {
            errors.at(
                c.first().map(|e| e.span()).unwrap_or_else(Span::call_site),
                "cost = (flops, transcendentals, bytes_accessed)",
            );
            quote!()
        }
        None => quote!(),
    };

    // The body.
    let mut body = (*func.block).clone();
    BodyRewriter { errors: &mut errors }.visit_block_mut(&mut body);
    errors.into_result()?;

    let param_checks = params.iter().map(|p| {
        let (id, name) = (&p.ident, p.ident.to_string());
        quote_spanned!(p.ty.span()=> __pd_c.param(#name, &#id);)
    });
    let requires: Vec<TokenStream> =
        kargs.requires.iter().map(|e| require_tokens(e, &params)).collect();
    let requires_stage =
        if requires.is_empty() { quote!() } else { quote!(#(#requires)* __pd_c.stage()?;) };
    let param_idents = params.iter().map(|p| &p.ident);
    let attrs = &func.attrs;
    let name_str = name.to_string();
    // The body runs inside `build`, with every parameter bound from `Params` by name: no
    // positional entry point exists, so swapped arguments cannot go unnoticed.
    let build = quote! {
        #[allow(unused_imports)]
        use ::__pd_root::__private::{IndexRef as _, IndexStd as _};
        let Params { #(#param_idents),* } = ::core::clone::Clone::clone(__pd_params);
        // Checked before anything is traced, in stages: parameters, `requires`, block
        // tiling, then every size the attributes compute.
        let mut __pd_c = ::__pd_root::__private::Checks::new();
        #(#param_checks)*
        __pd_c.stage()?;
        #requires_stage
        #(#tiling)*
        __pd_c.stage()?;
        let mut __pd_b = ::__pd_root::__private::KernelBuilder::new(#name_str);
        #(#grid)*
        #(#decls)*
        #(#aliases)*
        #(#vmem)*
        #mesh
        #(#collective_id)*
        #cost
        __pd_c.stage()?;
        let __pd_sealed = __pd_b.seal()?;
        #(#bindings)*
        #body
        __pd_sealed.finish()
    };
    Ok(params_module(&name, &vis, attrs, &params, build))
}

fn index_map(
    closure: &syn::ExprClosure,
    grid_rank: usize,
    prefetch: usize,
    errors: &mut Errors,
) -> TokenStream {
    let want = grid_rank + prefetch;
    if closure.inputs.len() != want {
        errors.at(
            closure.inputs.span(),
            format!(
                "index map takes {} parameter{}; expected {want}: {grid_rank} grid indices{}",
                closure.inputs.len(),
                if closure.inputs.len() == 1 { "" } else { "s" },
                if prefetch > 0 {
                    format!(" then {prefetch} scalar-prefetch refs")
                } else {
                    String::new()
                }
            ),
        );
    }
    let mut body = (*closure.body).clone();
    BodyRewriter { errors }.visit_expr_mut(&mut body);
    let binds = closure.inputs.iter().enumerate().map(|(i, p)| {
        if i < grid_rank {
            quote_spanned!(p.span()=> let #p = __pd_g[#i];)
        } else {
            let j = i - grid_rank;
            quote_spanned!(p.span()=> let #p = __pd_p[#j];)
        }
    });
    quote_spanned! {closure.span()=>
        ::core::option::Option::Some(::std::boxed::Box::new(move |__pd_g: &[::__pd_root::__private::Val], __pd_p: &[::__pd_root::__private::Ref]| {
            #[allow(unused_imports)]
            use ::__pd_root::__private::{IndexRef as _, IndexStd as _};
            #(#binds)*
            #body
        }))
    }
}

/// `mod <kernel> { Params, build, NAME, PARAMS }`, the kernel's whole interface: built from
/// named parameters (`matmul::build(&matmul::Params { bm: 128, ..Default::default() })`,
/// CLI `--set bm=128`). `build_body` is the tracing code, run with `__pd_params: &Params`.
fn params_module(
    name: &Ident,
    vis: &syn::Visibility,
    attrs: &[Attribute],
    params: &[Param],
    build_body: TokenStream,
) -> TokenStream {
    let fields = params.iter().map(|p| {
        let (id, ty) = (&p.ident, &p.ty);
        quote!(pub #id: #ty)
    });
    let ids: Vec<&Ident> = params.iter().map(|p| &p.ident).collect();
    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let tys: Vec<&Type> = params.iter().map(|p| &p.ty).collect();
    let ty_names: Vec<String> = tys.iter().map(|t| quote!(#t).to_string()).collect();
    let default_impl = if params.iter().all(|p| p.default.is_some()) {
        let defaults = params.iter().map(|p| {
            let (id, d) = (&p.ident, p.default.as_ref().expect("checked"));
            quote_spanned!(d.span()=> #id: #d)
        });
        quote! {
            impl ::core::default::Default for Params {
                fn default() -> Self { Params { #(#defaults),* } }
            }
        }
    } else {
        quote!()
    };
    let name_str = name.to_string();
    let mod_name = format_ident!("{}", name);
    quote! {
        #(#attrs)*
        #[allow(non_snake_case, dead_code)]
        #vis mod #mod_name {
            #[allow(unused_imports)]
            use super::*;
            /// The kernel's compile-time parameters.
            #[derive(Clone, Debug, PartialEq)]
            pub struct Params { #(#fields),* }
            #default_impl
            /// The kernel's name.
            pub const NAME: &str = #name_str;
            /// Parameter names, in declaration order.
            pub const PARAMS: &[&str] = &[#(#names),*];
            impl Params {
                /// Set one parameter from text (`--set NAME=VALUE`).
                pub fn set(&mut self, name: &str, value: &str) -> ::core::result::Result<(), ::__pd_root::__private::ParamError> {
                    match name {
                        #(#names => {
                            self.#ids = value.parse::<#tys>().map_err(|_| ::__pd_root::__private::ParamError::BadValue {
                                kernel: NAME.to_string(), name: name.to_string(), value: value.to_string(), ty: #ty_names.to_string(),
                            })?;
                            ::core::result::Result::Ok(())
                        })*
                        _ => ::core::result::Result::Err(::__pd_root::__private::ParamError::Unknown {
                            kernel: NAME.to_string(), name: name.to_string(), known: PARAMS.join(", "),
                        }),
                    }
                }
                /// `(name, value)` pairs, for reports.
                pub fn values(&self) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                    ::std::vec![#((#names, ::std::string::ToString::to_string(&self.#ids))),*]
                }
            }
            /// Trace the kernel with these parameters.
            #[allow(unused_variables, unused_mut, unused_assignments, clippy::let_unit_value, clippy::unused_unit, clippy::unnecessary_operation)]
            pub fn build(__pd_params: &Params) -> ::core::result::Result<::__pd_root::Kernel, ::__pd_root::BuildErrors> {
                #build_body
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Root, TokenStream, expand};
    use quote::quote;

    fn pretty(tokens: TokenStream) -> String {
        prettyplease::unparse(&syn::parse2(tokens).expect("the expansion is a valid file"))
    }

    /// A small gridded kernel with a carried loop, a comparison and both kinds of store.
    fn scale_kernel() -> TokenStream {
        quote! {
            pub fn scale(
                #[default(64)] n: usize,
                #[input(f32[n, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
                #[output(f32[n, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
            ) {
                let mut acc = x[..];
                for _ in fori(0, 3) {
                    acc = acc * 2.0;
                }
                if program_id(0) > 0 && n > 8 {
                    o[..] = acc;
                } else {
                    o[..] += acc;
                }
            }
        }
    }

    /// The whole expansion of a small kernel, so changes to generated code are reviewed.
    #[test]
    fn expansion_of_a_gridded_kernel_with_a_carried_loop() {
        let out =
            expand(Root::Dsl, quote!(grid = (n / 8,), semantics = (parallel,)), scale_kernel());
        insta::with_settings!({ snapshot_path => "../../../snapshots/macro_expand", prepend_module_to_snapshot => false, omit_expression => true }, {
            insta::assert_snapshot!("scale", pretty(out));
        });
    }

    /// Through the entry crate's `palladium::kernel`, every generated path (attributes, index
    /// maps, the body's loads, stores, comparisons and regions, `Params::set`, the error
    /// fallback) names `::palladium::dsl`, none `palladium_dsl`: an author who depends only
    /// on `palladium` has no `palladium_dsl` to resolve.
    #[test]
    fn the_entry_crates_kernel_names_only_palladium() {
        let kernel = scale_kernel();
        let args = quote!(grid = (n / 8,), semantics = (parallel,));
        let dsl = expand(Root::Dsl, args.clone(), kernel.clone()).to_string();
        let entry = expand(Root::Entry, args, kernel).to_string();
        assert!(!entry.contains("palladium_dsl"), "{entry}");
        assert!(!entry.contains("__pd_root") && !dsl.contains("__pd_root"), "{entry}");
        assert_eq!(entry, dsl.replace(":: palladium_dsl ::", ":: palladium :: dsl ::"));
        // The fallback item of a kernel that does not expand.
        let broken = expand(
            Root::Entry,
            quote!(grid = (1,)),
            quote!(
                fn k() -> u32 {}
            ),
        );
        let broken = broken.to_string();
        assert!(broken.contains("compile_error"), "{broken}");
        assert!(broken.contains(":: palladium :: dsl :: BuildErrors"), "{broken}");
        assert!(!broken.contains("palladium_dsl"), "{broken}");
    }
}
