//! Rewrites a kernel body (or an index-map closure) into tracing calls.
//!
//! - `r[i]` → `(&r).__pd_index(i)` (a load for refs, plain indexing otherwise);
//! - `r[i] = v` / `r[i] op= v` → `index_store(&r, i, v)` (read-modify-write for `op=`);
//! - `a == b`, `<`, ... → `cmp(pred, a, b)`; `a && b` → `and(a, || b)`;
//! - `if`, `for i in fori(a, b)`, `while` → `if_else`, `for_range`, `while_loop`: variables
//!   assigned inside and declared outside are carried through the region and assigned back.

use crate::expand::expr_text;
use crate::parse::Errors;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use std::collections::BTreeSet;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Block, Expr, Ident, Pat, parse_quote, parse_quote_spanned};

pub struct BodyRewriter<'e> {
    pub errors: &'e mut Errors,
}

/// Names assigned in a block and not declared in it: the values a region must carry.
///
/// Must see the block as the user wrote it, before nested `if`/`for`/`while` are rewritten:
/// a rewritten region re-binds its carried names inside closures (`let (mut a,) = __pd_c;`),
/// which this scan would count as declarations, so a name assigned only inside a nested
/// region would not be carried by the enclosing one (see [`region_vars`]).
fn carried(block: &Block) -> Vec<Ident> {
    #[derive(Default)]
    struct Scan {
        assigned: BTreeSet<String>,
        declared: BTreeSet<String>,
        spans: Vec<Ident>,
    }
    impl Scan {
        fn lhs(&mut self, e: &Expr) {
            match e {
                Expr::Path(p) => {
                    if let Some(id) = p.path.get_ident()
                        && self.assigned.insert(id.to_string())
                    {
                        self.spans.push(id.clone());
                    }
                }
                Expr::Tuple(t) => t.elems.iter().for_each(|e| self.lhs(e)),
                Expr::Paren(p) => self.lhs(&p.expr),
                _ => {}
            }
        }
    }
    impl<'a> Visit<'a> for Scan {
        fn visit_expr_assign(&mut self, a: &'a syn::ExprAssign) {
            self.lhs(&a.left);
            syn::visit::visit_expr_assign(self, a);
        }
        fn visit_expr_binary(&mut self, b: &'a syn::ExprBinary) {
            if is_compound(&b.op) {
                self.lhs(&b.left);
            }
            syn::visit::visit_expr_binary(self, b);
        }
        fn visit_pat_ident(&mut self, p: &'a syn::PatIdent) {
            self.declared.insert(p.ident.to_string());
        }
    }
    let mut s = Scan::default();
    s.visit_block(block);
    s.spans
        .into_iter()
        .filter(|id| !s.declared.contains(&id.to_string()) && !id.to_string().starts_with("__pd"))
        .collect()
}

/// The names a region expression carries (`if`: both branches; `for`/`while`: the body),
/// computed on the unrewritten expression, or `None` for anything else.
fn region_vars(e: &Expr) -> Option<Vec<Ident>> {
    Some(match e {
        Expr::If(i) if !matches!(&*i.cond, Expr::Let(_)) => {
            let mut vars = carried(&i.then_branch);
            if let Some((_, else_expr)) = &i.else_branch {
                let else_block: Block = match &**else_expr {
                    Expr::Block(b) => b.block.clone(),
                    other => parse_quote!({ #other }),
                };
                for v in carried(&else_block) {
                    if !vars.iter().any(|x| x == &v) {
                        vars.push(v);
                    }
                }
            }
            vars
        }
        Expr::ForLoop(f) => carried(&f.body),
        Expr::While(w) => carried(&w.body),
        _ => return None,
    })
}

fn is_compound(op: &BinOp) -> bool {
    matches!(
        op,
        BinOp::AddAssign(_)
            | BinOp::SubAssign(_)
            | BinOp::MulAssign(_)
            | BinOp::DivAssign(_)
            | BinOp::RemAssign(_)
            | BinOp::BitAndAssign(_)
            | BinOp::BitOrAssign(_)
            | BinOp::BitXorAssign(_)
            | BinOp::ShlAssign(_)
            | BinOp::ShrAssign(_)
    )
}

/// `a op= b` → the plain operator, for read-modify-write of refs.
fn plain_op(op: &BinOp) -> Option<TokenStream> {
    Some(match op {
        BinOp::AddAssign(t) => quote_spanned!(t.span()=> +),
        BinOp::SubAssign(t) => quote_spanned!(t.span()=> -),
        BinOp::MulAssign(t) => quote_spanned!(t.span()=> *),
        BinOp::DivAssign(t) => quote_spanned!(t.span()=> /),
        BinOp::RemAssign(t) => quote_spanned!(t.span()=> %),
        BinOp::BitAndAssign(t) => quote_spanned!(t.span()=> &),
        BinOp::BitOrAssign(t) => quote_spanned!(t.span()=> |),
        BinOp::BitXorAssign(t) => quote_spanned!(t.span()=> ^),
        BinOp::ShlAssign(t) => quote_spanned!(t.span()=> <<),
        BinOp::ShrAssign(t) => quote_spanned!(t.span()=> >>),
        _ => return None,
    })
}

fn cmp_pred(op: &BinOp) -> Option<&'static str> {
    Some(match op {
        BinOp::Eq(_) => "Eq",
        BinOp::Ne(_) => "Ne",
        BinOp::Lt(_) => "Lt",
        BinOp::Le(_) => "Le",
        BinOp::Gt(_) => "Gt",
        BinOp::Ge(_) => "Ge",
        _ => return None,
    })
}

/// `let (mut a, mut b) = (a, b);` re-binding carried names mutably inside a closure.
fn rebind(vars: &[Ident]) -> TokenStream {
    if vars.is_empty() {
        return quote!();
    }
    quote!(#[allow(unused_mut, unused_variables)] let (#(mut #vars,)*) = (#(#vars,)*);)
}

impl BodyRewriter<'_> {
    fn reject_in(&mut self, block: &Block, what: &str) {
        struct Find<'a> {
            errors: &'a mut Errors,
            what: &'a str,
            depth: usize,
        }
        impl<'x> Visit<'x> for Find<'_> {
            fn visit_expr_break(&mut self, b: &'x syn::ExprBreak) {
                if self.depth == 0 {
                    self.errors.at(
                        b.span(),
                        format!("`break` is not supported in a traced {}", self.what),
                    );
                }
            }
            fn visit_expr_continue(&mut self, c: &'x syn::ExprContinue) {
                if self.depth == 0 {
                    self.errors.at(
                        c.span(),
                        format!("`continue` is not supported in a traced {}", self.what),
                    );
                }
            }
            fn visit_expr_closure(&mut self, c: &'x syn::ExprClosure) {
                self.depth += 1;
                syn::visit::visit_expr_closure(self, c);
                self.depth -= 1;
            }
            fn visit_expr_for_loop(&mut self, f: &'x syn::ExprForLoop) {
                self.depth += 1;
                syn::visit::visit_expr_for_loop(self, f);
                self.depth -= 1;
            }
            fn visit_expr_while(&mut self, w: &'x syn::ExprWhile) {
                self.depth += 1;
                syn::visit::visit_expr_while(self, w);
                self.depth -= 1;
            }
            fn visit_expr_loop(&mut self, l: &'x syn::ExprLoop) {
                self.depth += 1;
                syn::visit::visit_expr_loop(self, l);
                self.depth -= 1;
            }
        }
        Find { errors: self.errors, what, depth: 0 }.visit_block(block);
    }

    fn rewrite_if(&mut self, e: &syn::ExprIf, vars: Vec<Ident>) -> Expr {
        let span = e.if_token.span();
        let cond = &e.cond;
        let then_b = &e.then_branch;
        let else_tokens = match &e.else_branch {
            Some((_, else_expr)) => {
                let else_block: Block = match &**else_expr {
                    Expr::Block(b) => b.block.clone(),
                    other => parse_quote!({ #other }),
                };
                quote!(#else_block)
            }
            None => quote!({}),
        };
        let bind = rebind(&vars);
        parse_quote_spanned! {span=>
            {
                let __pd_r = ::__pd_root::__private::if_else(
                    #cond,
                    || { #bind let __pd_v = #then_b; (__pd_v, (#(#vars,)*)) },
                    || { #bind let __pd_v = #else_tokens; (__pd_v, (#(#vars,)*)) },
                );
                (#(#vars,)*) = __pd_r.1;
                __pd_r.0
            }
        }
    }

    /// `for i in fori(a, b)` → `for_range(fori(a, b), ..)`, one traced `scf.for`; a bare
    /// `for i in a..b` is an error naming both forms (traced or unrolled would depend on the
    /// bounds' types, invisibly); any other iterator, `unrolled(a, b)` included, is plain
    /// Rust, run at trace time.
    fn rewrite_for(&mut self, f: &syn::ExprForLoop, vars: Vec<Ident>) -> Option<Expr> {
        let mut iter = &*f.expr;
        while let Expr::Paren(p) = iter {
            iter = &p.expr;
        }
        match iter {
            Expr::Range(r) => {
                let (lo, hi) = (r.start.as_deref().map(expr_text), r.end.as_deref().map(expr_text));
                let (lo, hi) = (lo.unwrap_or_else(|| "a".into()), hi.unwrap_or_else(|| "b".into()));
                let closed = matches!(r.limits, syn::RangeLimits::Closed(_));
                let text = format!("{lo}{}{hi}", if closed { "..=" } else { ".." });
                let hi = if closed { format!("{hi} + 1") } else { hi };
                self.errors.at(
                    r.span(),
                    format!(
                        "say how `for .. in {text}` runs: `fori({lo}, {hi})` traces one scf.for (lax.fori_loop; bounds may be traced values), \
                         `unrolled({lo}, {hi})` repeats the body at trace time (a Python `for`; bounds are Rust integers)"
                    ),
                );
                None
            }
            Expr::Call(c) if matches!(&*c.func, Expr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "fori")) =>
            {
                self.reject_in(&f.body, "for loop");
                let span = f.for_token.span();
                let pat: &Pat = &f.pat;
                let body = &f.body;
                Some(parse_quote_spanned! {span=>
                    {
                        let __pd_r = ::__pd_root::__private::for_range(
                            #iter,
                            (#(#vars,)*),
                            |#pat, __pd_c| { #[allow(unused_mut, unused_variables)] let (#(mut #vars,)*) = __pd_c; #body; (#(#vars,)*) },
                        );
                        (#(#vars,)*) = __pd_r;
                    }
                })
            }
            _ => None,
        }
    }

    fn rewrite_while(&mut self, w: &syn::ExprWhile, vars: Vec<Ident>) -> Option<Expr> {
        if matches!(&*w.cond, Expr::Let(_)) {
            return None;
        }
        self.reject_in(&w.body, "while loop");
        let span = w.while_token.span();
        let cond = &w.cond;
        let body = &w.body;
        Some(parse_quote_spanned! {span=>
            {
                let __pd_r = ::__pd_root::__private::while_loop(
                    (#(#vars,)*),
                    |__pd_c| { #[allow(unused_variables)] let (#(#vars,)*) = __pd_c; #cond },
                    |__pd_c| { #[allow(unused_mut, unused_variables)] let (#(mut #vars,)*) = __pd_c; #body; (#(#vars,)*) },
                );
                (#(#vars,)*) = __pd_r;
            }
        })
    }

    fn store(
        &mut self,
        base: &Expr,
        index: &Expr,
        value: TokenStream,
        span: proc_macro2::Span,
    ) -> Expr {
        parse_quote_spanned! {span=>
            {
                let __pd_base = &#base;
                let __pd_idx = #index;
                ::__pd_root::__private::index_store(__pd_base, ::core::clone::Clone::clone(&__pd_idx), #value)
            }
        }
    }
}

impl VisitMut for BodyRewriter<'_> {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        // Assignments through an index are stores: rewrite before the index becomes a load.
        if let Expr::Assign(a) = e
            && let Expr::Index(ix) = &mut *a.left
        {
            self.visit_expr_mut(&mut ix.expr);
            self.visit_expr_mut(&mut ix.index);
            self.visit_expr_mut(&mut a.right);
            let (base, index, right) = (&ix.expr, &ix.index, &a.right);
            *e = self.store(base, index, quote!(#right), a.eq_token.span());
            return;
        }
        if let Expr::Binary(b) = e
            && let (Expr::Index(ix), Some(op)) = (&mut *b.left, plain_op(&b.op))
        {
            self.visit_expr_mut(&mut ix.expr);
            self.visit_expr_mut(&mut ix.index);
            self.visit_expr_mut(&mut b.right);
            let right = &b.right;
            let value = quote_spanned!(b.op.span()=>
                    ::__pd_root::__private::IndexRef::__pd_index(__pd_base, ::core::clone::Clone::clone(&__pd_idx)) #op (#right));
            *e = self.store(&ix.expr, &ix.index, value, b.op.span());
            return;
        }
        // Carried names of a region: from the source, before its nested regions are rewritten.
        let vars = region_vars(e).unwrap_or_default();
        visit_mut::visit_expr_mut(self, e);
        let replaced: Option<Expr> = match e {
            Expr::Index(ix) => {
                let (base, index) = (&ix.expr, &ix.index);
                Some(
                    parse_quote_spanned!(ix.bracket_token.span.join()=> (&#base).__pd_index(#index)),
                )
            }
            Expr::Binary(b) => {
                let (l, r) = (&b.left, &b.right);
                if let Some(pred) = cmp_pred(&b.op) {
                    let pred = Ident::new(pred, b.op.span());
                    Some(
                        parse_quote_spanned!(b.op.span()=> ::__pd_root::__private::cmp(::__pd_root::__private::CmpPred::#pred, #l, #r)),
                    )
                } else {
                    match b.op {
                        BinOp::And(t) => Some(
                            parse_quote_spanned!(t.span()=> ::__pd_root::__private::and(#l, || #r)),
                        ),
                        BinOp::Or(t) => Some(
                            parse_quote_spanned!(t.span()=> ::__pd_root::__private::or(#l, || #r)),
                        ),
                        _ => None,
                    }
                }
            }
            Expr::If(i) if !matches!(&*i.cond, Expr::Let(_)) => Some(self.rewrite_if(i, vars)),
            Expr::ForLoop(f) => self.rewrite_for(f, vars),
            Expr::While(w) => self.rewrite_while(w, vars),
            Expr::Return(r) => {
                self.errors.at(
                    r.span(),
                    "a kernel body cannot `return`: it is traced once, straight through",
                );
                None
            }
            Expr::Loop(l) => {
                self.errors.at(l.loop_token.span(), "`loop` is not supported in kernels: use `while` (traced when its condition is)");
                None
            }
            Expr::Try(t) => {
                self.errors.at(t.question_token.span(), "`?` is not supported in a kernel body");
                None
            }
            _ => None,
        };
        if let Some(r) = replaced {
            *e = r;
        }
    }
}
