use palladium_dsl::prelude::*;

// `x[0, .., ..]` does not parse as Rust (rustc rejects it before `#[kernel]` sees the tokens):
// the error is at the comma, the tuple form `x[(0, .., ..)]` is the one that works, and the
// parse error does not hide another kernel's mistakes.
#[kernel(grid = (2,))]
fn first_row(
    #[input(f32[2, 8, 128], block = [None, 8, 128], map = |i| (i, 0, 0))] x: Ref,
    #[output(f32[2, 8, 128], block = [None, 8, 128], map = |i| (i, 0, 0))] o: Ref,
) {
    o[(0, .., ..)] = x[0, .., ..];
}

#[kernel(grid = (2,))]
fn other(#[output(f31[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref) {
    o[..] = 1.0;
}

fn main() {}
