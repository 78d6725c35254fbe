use palladium_dsl::prelude::*;

// `unrolled` runs at trace time: a traced bound cannot unroll, and the error says `fori`.
#[kernel]
fn pages(#[prefetch(i32[1])] count: Ref, #[output(i32[8], space = smem)] o: Ref) {
    let pages = count[0];
    for i in unrolled(0, pages) {
        o[i] = scalar(1);
    }
}

fn main() {}
