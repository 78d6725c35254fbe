//! `#[kernel]`: turns a Rust function over refs into a function that traces Palladium IR.
//!
//! ```text
//! #[kernel(grid = (m / bm, n / bn, k / bk), semantics = (parallel, parallel, arbitrary))]
//! pub fn matmul(
//!     #[default(1024)] m: usize, /* ... compile-time parameters ... */
//!     #[input(bf16[m, k], block = [bm, bk], map = |i, _j, kk| (i, kk))] x: Ref,
//!     #[input(bf16[k, n], block = [bk, bn], map = |_i, j, kk| (kk, j))] y: Ref,
//!     #[output(bf16[m, n], block = [bm, bn], map = |i, j, _kk| (i, j))] o: Ref,
//!     #[scratch(vmem, f32[bm, bn])] acc: Ref,
//! ) {
//!     if program_id(2) == 0 { acc[..] = zeros([bm, bn], f32); }
//!     acc[..] += dot(x[..], y[..]);
//!     if program_id(2) == num_programs(2) - 1 { o[..] = acc[..].cast(bf16); }
//! }
//! ```
//! expands to `mod matmul { struct Params { m, .. }; fn build(&Params) -> Result<Kernel,
//! BuildErrors>; NAME; PARAMS }`: compile-time parameters are set by name only (a Rust
//! caller writes `matmul::build(&matmul::Params { bm: 128, ..Default::default() })`, a tool
//! `Params::set("bm", "128")`); ref parameters become declarations and the body is traced
//! inside `build`. All generated paths go through `__private` of the crate the author
//! depends on: `::palladium_dsl` for [`macro@kernel`], `::palladium::dsl` for
//! [`macro@kernel_in_palladium`] (the entry crate's `palladium::kernel`). Every error found is
//! reported, each at its own span.

mod body;
mod expand;
mod parse;

use expand::Root;
use proc_macro::TokenStream;

/// `palladium_dsl::kernel`: the expansion reaches the DSL as `::palladium_dsl`.
#[proc_macro_attribute]
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(Root::Dsl, args.into(), item.into()).into()
}

/// `palladium::kernel`, the same macro for a crate that depends only on the entry crate
/// `palladium`: the expansion reaches the DSL as `::palladium::dsl`.
#[proc_macro_attribute]
pub fn kernel_in_palladium(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(Root::Entry, args.into(), item.into()).into()
}
