use palladium_dsl::prelude::*;

// Pallas's pipeline modes are `pl.Buffered(n)`; anything else is named at its span.
#[kernel(grid = (4,))]
fn triple_buffered(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0), pipeline_mode = Triple)] x: Ref,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0), buffers = 3)] y: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    o[..] = x[..] + y[..];
}

fn main() {}
