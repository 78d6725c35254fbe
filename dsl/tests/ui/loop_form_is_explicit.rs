use palladium_dsl::prelude::*;

// Whether a loop is traced (one scf.for) or unrolled at trace time is said in the source,
// not left to the type of its bound: a bare range is an error naming both forms.
#[kernel]
fn pages(#[default(4)] n: usize, #[output(i32[8], space = smem)] o: Ref) {
    for i in 0..n {
        o[i] = scalar(1);
    }
    for i in 0..scalar(3) {
        o[i] = i;
    }
    for i in (1..=n) {
        o[i] = scalar(2);
    }
    // The explicit forms.
    for i in unrolled(0, n) {
        o[i] = scalar(3);
    }
    for i in fori(0, scalar(3)) {
        o[i] = i;
    }
}

fn main() {}
