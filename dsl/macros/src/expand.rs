//! The expansion of `#[kernel]`.

use crate::body::BodyRewriter;
use crate::parse::{
    BlockDimArg, DTYPES, Errors, OperandArgs, SPACES, ScratchArgs, parse_kernel_args,
};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Expr, FnArg, Ident, ItemFn, Pat, Type};

/// The path the expansion reaches `palladium_dsl`'s items through, fixed by the entry point
/// the author imported: an author depends on `palladium-dsl` or on the entry crate
/// `palladium`, and the generated code must name the crate that is in their `Cargo.toml`.
pub struct Root(TokenStream);

impl Root {
    /// `palladium_dsl::kernel`: `::palladium_dsl`.
    pub fn dsl() -> Self {
        Root(quote!(::palladium_dsl))
    }

    /// `palladium::kernel` (the entry crate's re-export): `::palladium::dsl`.
    pub fn entry() -> Self {
        Root(quote!(::palladium::dsl))
    }
}

impl ToTokens for Root {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(self.0.clone());
    }
}

pub fn expand(root: &Root, args: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    match expand_fn(root, args, func.clone()) {
        Ok(tokens) => tokens,
        Err(e) => {
            // Report every error, and keep a body-less item of the same name so the rest of
            // the crate still resolves it (and the IDE keeps working).
            let errors = e.to_compile_error();
            let fallback = fallback_item(root, &func);
            quote!(#errors #fallback)
        }
    }
}

fn fallback_item(root: &Root, func: &ItemFn) -> TokenStream {
    let build = quote! {
        ::core::result::Result::Err(#root::BuildErrors::default())
    };
    params_module(root, &func.sig.ident, &func.vis, &[], &compile_time_params(func), build)
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
fn dtype_tokens(root: &Root, id: &Ident, params: &[Param], errors: &mut Errors) -> TokenStream {
    if let Some((_, v)) = DTYPES.iter().find(|(n, _)| id == n) {
        let v = Ident::new(v, id.span());
        return quote!(#root::__private::DType::#v);
    }
    if params.iter().any(|p| p.ident == *id) {
        return quote_spanned!(id.span()=> { let __pd_dtype: #root::__private::DType = #id; __pd_dtype });
    }
    let known: Vec<_> = DTYPES.iter().map(|(n, _)| *n).collect();
    errors.at(
        id.span(),
        format!(
            "unknown dtype `{id}` (known: {}, or a compile-time parameter of type DType)",
            known.join(", ")
        ),
    );
    quote!(#root::__private::DType::F32)
}

fn space_tokens(
    root: &Root,
    id: Option<&Ident>,
    default: &str,
    errors: &mut Errors,
) -> TokenStream {
    let name = id.map(|i| i.to_string()).unwrap_or_else(|| default.to_string());
    let span = id.map(|i| i.span()).unwrap_or_else(Span::call_site);
    match SPACES.iter().find(|(n, _)| *n == name) {
        Some((_, v)) => {
            let v = Ident::new(v, span);
            quote!(#root::__private::MemorySpace::#v)
        }
        None => {
            errors.at(span, format!("unknown memory space `{name}` (known: vmem, smem, hbm, any)"));
            quote!(#root::__private::MemorySpace::Vmem)
        }
    }
}

/// A size expression of an attribute with its arithmetic checked (see
/// `palladium_dsl::trace::params`): `a op b` for `+ - * / %` becomes `size::op(a, b)`,
/// through parentheses; anything else (a name, a literal, a call) is an operand as is.
/// With `relations`, comparisons, `&&`, `||` and `!` are rewritten too (for `requires`).
fn checked(root: &Root, e: &Expr, relations: bool) -> TokenStream {
    use syn::BinOp as B;
    match e {
        // In arithmetic the calls group; a relation keeps the user's parentheses.
        Expr::Paren(p) if relations => {
            let x = checked(root, &p.expr, true);
            quote_spanned!(p.span()=> (#x))
        }
        Expr::Paren(p) => checked(root, &p.expr, false),
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
                    let (l, r, op) =
                        (checked(root, &b.left, true), checked(root, &b.right, true), &b.op);
                    return quote_spanned!(b.span()=> #l #op #r);
                }
                _ => return quote!(#e),
            };
            let (l, r) = (checked(root, &b.left, false), checked(root, &b.right, false));
            let f = Ident::new(f, b.op.span());
            quote_spanned!(b.span()=> #root::__private::size::#f(#l, #r))
        }
        Expr::Unary(u) if relations && matches!(u.op, syn::UnOp::Not(_)) => {
            let x = checked(root, &u.expr, true);
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
fn size_tokens(root: &Root, e: &Expr, what: &str) -> TokenStream {
    let value = checked(root, e, false);
    let text = expr_text(e);
    quote_spanned!(e.span()=> __pd_c.size(#value, #what, #text))
}

fn dims_tokens(root: &Root, dims: &[Expr], owner: &str) -> TokenStream {
    let ds = dims
        .iter()
        .enumerate()
        .map(|(i, d)| size_tokens(root, d, &format!("dim {i} of `{owner}`")));
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
fn require_tokens(root: &Root, e: &Expr, params: &[Param]) -> TokenStream {
    if let Expr::Binary(eq) = e
        && matches!(eq.op, syn::BinOp::Eq(_))
        && let Expr::Binary(rem) = &*eq.left
        && matches!(rem.op, syn::BinOp::Rem(_))
        && matches!(&*eq.right, Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(z), .. }) if z.base10_digits() == "0")
    {
        let (a, b) = (checked(root, &rem.left, false), checked(root, &rem.right, false));
        let (at, bt) = (expr_text(&rem.left), expr_text(&rem.right));
        return quote_spanned!(e.span()=> __pd_c.divides("", (#root::__private::size::IntoSize::into_size(#b), #bt), (#root::__private::size::IntoSize::into_size(#a), #at)););
    }
    let holds = checked(root, e, true);
    let text = expr_text(e);
    let values = mentioned(e, params).into_iter().map(|id| {
        let name = id.to_string();
        quote!((#name, &#id as &dyn ::core::fmt::Display))
    });
    quote_spanned!(e.span()=> __pd_c.require(#holds, #text, &[#(#values),*]);)
}

fn expand_fn(root: &Root, args: TokenStream, func: ItemFn) -> syn::Result<TokenStream> {
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
                let dtype = dtype_tokens(root, &args.array.dtype, &params, &mut errors);
                let default_space = if *role == "Prefetch" { "smem" } else { "vmem" };
                let space = space_tokens(root, args.space.as_ref(), default_space, &mut errors);
                let shape = dims_tokens(root, &args.array.dims, &name_str);
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
                                let (bv, av) = (checked(root, b, false), checked(root, a, false));
                                let (bt, at) = (expr_text(b), expr_text(a));
                                tiling.push(quote_spanned!(b.span()=> __pd_c.divides(#what, (#root::__private::size::IntoSize::into_size(#bv), #bt), (#root::__private::size::IntoSize::into_size(#av), #at));));
                            }
                        }
                        let ds = dims.iter().enumerate().map(|(d, b)| match b {
                            BlockDimArg::Blocked(e) => {
                                let size = size_tokens(root, e, &format!("block dim {d} of `{name_str}`"));
                                quote_spanned!(e.span()=> #root::__private::BlockDim::Blocked(#size))
                            }
                            BlockDimArg::Squeezed => quote!(#root::__private::BlockDim::Squeezed),
                            BlockDimArg::Element { size, pad } => {
                                let what = format!("element block dim {d} of `{name_str}`");
                                let n = size_tokens(root, size, &what);
                                let (lo, hi) = match pad.as_deref() {
                                    Some((lo, hi)) => (size_tokens(root, lo, &format!("padding before {what}")), size_tokens(root, hi, &format!("padding after {what}"))),
                                    None => (quote!(0u64), quote!(0u64)),
                                };
                                quote_spanned!(size.span()=> #root::__private::BlockDim::Element { size: #n, pad: (#lo, #hi) })
                            }
                        });
                        quote!(::core::option::Option::Some(::std::vec![#(#ds),*]))
                    }
                    None => quote!(::core::option::Option::None),
                };
                let map = match &args.map {
                    Some(closure) => {
                        index_map(root, closure, grid_rank, prefetch_count, &mut errors)
                    }
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
                                            &[#root::__private::Val],
                                            &[#root::__private::Ref],
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
                    __pd_b.operand(#name_str, #root::__private::OperandRole::#role_id, #dtype, #shape, #space, #block, #map)
                };
                let buffered = args.buffered.iter().map(|n| {
                    let count = size_tokens(root, n, &format!("the buffer count of `{name_str}`"));
                    quote_spanned!(n.span()=> __pd_b.pipeline_mode(__pd_slot, #root::__private::PipelineMode::Buffered(#count));)
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
                    let lo = size_tokens(root, lo, &format!("the lowest value of `{name_str}`"));
                    let hi = size_tokens(root, hi, &format!("the highest value of `{name_str}`"));
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
                let space = space_tokens(root, Some(space), "vmem", &mut errors);
                let dtype = dtype_tokens(root, &array.dtype, &params, &mut errors);
                let shape = dims_tokens(root, &array.dims, &name_str);
                decls.push(quote_spanned!(ident.span()=> __pd_b.scratch_buffer(#name_str, #space, #dtype, #shape);));
                bindings.push(quote_spanned!(ty.span()=> let #ident: #ty = __pd_sealed.handles[#i].clone().into_ref();));
            }
            RefKind::Scratch(ScratchArgs::Semaphores { kind, dims }) => {
                let k = if kind == "dma_sem" { quote!(Dma) } else { quote!(Regular) };
                let shape = dims_tokens(root, dims, &name_str);
                decls.push(quote_spanned!(ident.span()=> __pd_b.scratch_semaphores(#name_str, #root::__private::SemKind::#k, #shape);));
                bindings.push(quote_spanned!(ty.span()=> let #ident: #ty = __pd_sealed.handles[#i].clone().into_sem();));
            }
        }
    }
    let grid = kargs.grid.iter().enumerate().map(|(i, e)| {
        let parallel = kargs.semantics.get(i).is_some_and(|s| s == "parallel");
        let sem = Ident::new(if parallel { "Parallel" } else { "Arbitrary" }, e.span());
        let extent = size_tokens(root, e, &format!("grid dim {i}"));
        quote_spanned!(e.span()=> __pd_b.grid_dim(#extent, #root::__private::Semantics::#sem);)
    });
    let vmem = kargs.vmem_limit.iter().map(|e| {
        let bytes = size_tokens(root, e, "vmem_limit");
        quote_spanned!(e.span()=> __pd_b.vmem_limit_bytes(#bytes);)
    });
    let mesh = if kargs.mesh.is_empty() {
        quote!()
    } else {
        let axes = kargs.mesh.iter().map(|(name, size)| {
            let (name, size) =
                (name.to_string(), size_tokens(root, size, &format!("mesh axis {name}")));
            quote!((#name, #size))
        });
        quote!(__pd_b.mesh(&[#(#axes),*]);)
    };
    let collective_id = kargs.collective_id.iter().map(|e| {
        let id = size_tokens(root, e, "collective_id");
        quote_spanned!(e.span()=> __pd_b.collective_id(#id as u32);)
    });
    let aliases = kargs.aliases.iter().map(|(i, o)| {
        let (i, o) = (i.to_string(), o.to_string());
        quote!(__pd_b.alias(#i, #o);)
    });
    let cost = match &kargs.cost {
        Some(c) if c.len() == 3 => {
            let (f, t, b) = (
                size_tokens(root, &c[0], "cost flops"),
                size_tokens(root, &c[1], "cost transcendentals"),
                size_tokens(root, &c[2], "cost bytes_accessed"),
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
    BodyRewriter { root, errors: &mut errors }.visit_block_mut(&mut body);
    errors.into_result()?;

    let param_checks = params.iter().map(|p| {
        let (id, name) = (&p.ident, p.ident.to_string());
        quote_spanned!(p.ty.span()=> __pd_c.param(#name, &#id);)
    });
    let requires: Vec<TokenStream> =
        kargs.requires.iter().map(|e| require_tokens(root, e, &params)).collect();
    let requires_stage =
        if requires.is_empty() { quote!() } else { quote!(#(#requires)* __pd_c.stage()?;) };
    let param_idents = params.iter().map(|p| &p.ident);
    let attrs = &func.attrs;
    let name_str = name.to_string();
    // The body runs inside `build`, with every parameter bound from `Params` by name: no
    // positional entry point exists, so swapped arguments cannot go unnoticed.
    let build = quote! {
        #[allow(unused_imports)]
        use #root::__private::{IndexRef as _, IndexStd as _};
        let Params { #(#param_idents),* } = ::core::clone::Clone::clone(__pd_params);
        // Checked before anything is traced, in stages: parameters, `requires`, block
        // tiling, then every size the attributes compute.
        let mut __pd_c = #root::__private::Checks::new();
        #(#param_checks)*
        __pd_c.stage()?;
        #requires_stage
        #(#tiling)*
        __pd_c.stage()?;
        let mut __pd_b = #root::__private::KernelBuilder::new(#name_str);
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
    Ok(params_module(root, &name, &vis, attrs, &params, build))
}

fn index_map(
    root: &Root,
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
    BodyRewriter { root, errors }.visit_expr_mut(&mut body);
    let binds = closure.inputs.iter().enumerate().map(|(i, p)| {
        if i < grid_rank {
            quote_spanned!(p.span()=> let #p = __pd_g[#i];)
        } else {
            let j = i - grid_rank;
            quote_spanned!(p.span()=> let #p = __pd_p[#j];)
        }
    });
    quote_spanned! {closure.span()=>
        ::core::option::Option::Some(::std::boxed::Box::new(move |__pd_g: &[#root::__private::Val], __pd_p: &[#root::__private::Ref]| {
            #[allow(unused_imports)]
            use #root::__private::{IndexRef as _, IndexStd as _};
            #(#binds)*
            #body
        }))
    }
}

/// `mod <kernel> { Params, build, NAME, PARAMS }`, the kernel's whole interface: built from
/// named parameters (`matmul::build(&matmul::Params { bm: 128, ..Default::default() })`,
/// CLI `--set bm=128`). `build_body` is the tracing code, run with `__pd_params: &Params`.
fn params_module(
    root: &Root,
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
                pub fn set(&mut self, name: &str, value: &str) -> ::core::result::Result<(), #root::__private::ParamError> {
                    match name {
                        #(#names => {
                            self.#ids = value.parse::<#tys>().map_err(|_| #root::__private::ParamError::BadValue {
                                kernel: NAME.to_string(), name: name.to_string(), value: value.to_string(), ty: #ty_names.to_string(),
                            })?;
                            ::core::result::Result::Ok(())
                        })*
                        _ => ::core::result::Result::Err(#root::__private::ParamError::Unknown {
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
            pub fn build(__pd_params: &Params) -> ::core::result::Result<#root::Kernel, #root::BuildErrors> {
                #build_body
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Root, expand};
    use quote::quote;

    fn pretty(tokens: proc_macro2::TokenStream) -> String {
        prettyplease::unparse(&syn::parse2(tokens).expect("the expansion is a valid file"))
    }

    /// The whole expansion of a small kernel, so changes to generated code are reviewed.
    #[test]
    fn expansion_of_a_gridded_kernel_with_a_carried_loop() {
        let out = expand(
            &Root::dsl(),
            quote!(grid = (n / 8,), semantics = (parallel,)),
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
            },
        );
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
        let kernel = quote! {
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
        };
        let args = quote!(grid = (n / 8,), semantics = (parallel,));
        let dsl = expand(&Root::dsl(), args.clone(), kernel.clone()).to_string();
        let entry = expand(&Root::entry(), args, kernel).to_string();
        assert!(!entry.contains("palladium_dsl"), "{entry}");
        assert_eq!(entry, dsl.replace(":: palladium_dsl ::", ":: palladium :: dsl ::"));
        // The fallback item of a kernel that does not expand.
        let broken = expand(
            &Root::entry(),
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
