use palladium_dsl::prelude::*;

#[kernel(grid = (4, 1), semantics = (parallel, paralel))]
fn broken(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i, _j| (i, 0))] o: Ref,
) {
    o[..] = x[..];
    loop {}
}

fn main() {}
