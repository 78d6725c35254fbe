use palladium_dsl::prelude::*;

// `Element` dims (Pallas's `pl.Element`) cannot mix with blocked ones, need a size, and take
// their padding as one `(before, after)` pair; each mistake is named at its span.
#[kernel(grid = (4,))]
fn element_mistakes(
    #[input(f32[32, 128], block = [Element(16), 128], map = |i| (i * 8, 0))] x: Ref,
    #[input(f32[32, 128], block = [Element(0), Element(128)], map = |i| (i * 8, 0))] y: Ref,
    #[input(f32[32, 128], block = [Element(16, 0, 8), Element(128)], map = |i| (i * 8, 0))] z: Ref,
    #[output(f32[32, 128], block = [Element(8), Element(128)], map = |i| (i * 8, 0))] o: Ref,
) {
    o[..] = x[..] + y[..] + z[..];
}

fn main() {}
