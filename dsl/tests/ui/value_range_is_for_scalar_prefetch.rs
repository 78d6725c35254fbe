use palladium_dsl::prelude::*;

// `range = lo..=hi` declares the values a scalar-prefetch operand may hold (a kernel that
// derives DMA offsets or trip counts from them): both ends included, scalar prefetch only.
#[kernel]
fn half_open(
    #[default(8)] n: usize,
    #[prefetch(i32[4], range = 0..n)] ids: Ref,
    #[output(i32[4], space = smem)] o: Ref,
) {
    o[0] = ids[0];
}

#[kernel(grid = (4,))]
fn on_an_input(
    #[default(8)] n: usize,
    #[prefetch(i32[4], range = 0..=n - 1)] ids: Ref,
    #[input(f32[32, 128], block = [8, 128], map = |i, _ids| (i, 0), range = 0..=3)] x: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i, _ids| (i, 0))] o: Ref,
) {
    o[..] = x[..];
}

fn main() {}
