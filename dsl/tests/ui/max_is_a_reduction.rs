use palladium_dsl::prelude::*;

// `max`/`min` reduce along an axis (jnp's `x.max(axis=1)`); the elementwise forms are
// `maximum`/`minimum`. The old spelling of the elementwise max does not compile.
#[kernel(grid = (4,))]
fn relu_and_clamp(
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] x: Ref,
    #[input(f32[32, 128], block = [8, 128], map = |i| (i, 0))] y: Ref,
    #[output(f32[32, 128], block = [8, 128], map = |i| (i, 0))] o: Ref,
) {
    let relu = x[..].max(0.0);
    o[..] = relu.min(y[..]);
}

fn main() {}
