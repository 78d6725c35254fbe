use palladium_dsl::prelude::*;

// Compile-time parameters are set by name: the kernel is a module (`Params`, `build`), with
// no positional entry point where swapped block sizes would go unnoticed.
#[kernel(grid = (m / bm, n / bn), semantics = (parallel, parallel))]
fn scale(
    #[default(64)] m: usize,
    #[default(256)] n: usize,
    #[default(8)] bm: usize,
    #[default(128)] bn: usize,
    #[input(f32[m, n], block = [bm, bn], map = |i, j| (i, j))] x: Ref,
    #[output(f32[m, n], block = [bm, bn], map = |i, j| (i, j))] o: Ref,
) {
    o[..] = x[..] * 2.0;
}

fn main() {
    // The old positional call.
    let _ = scale(64, 256, 128, 8);
    // A misspelled parameter.
    let _ = scale::build(&scale::Params { bmm: 16, ..Default::default() });
    // A missing one.
    let _ = scale::build(&scale::Params { m: 64, n: 256, bm: 8 });
    // Named, in any order.
    let _ = scale::build(&scale::Params { bn: 128, bm: 16, n: 256, m: 64 });
}
