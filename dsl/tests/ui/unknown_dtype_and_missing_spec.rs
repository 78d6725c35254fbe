use palladium_dsl::prelude::*;

#[kernel(grid = (4,))]
fn broken(
    #[input(f31[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    o: Ref,
) {
    o[..] = x[..];
}

fn main() {}
