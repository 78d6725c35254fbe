use palladium_dsl::prelude::*;

#[kernel(grid = (2,))]
fn broken(
    #[output(f32[16, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
    #[scratch(dma_sem[2])] sems: Ref,
) {
    o[..] = 1.0;
}

fn main() {}
