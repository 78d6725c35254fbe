use palladium_dsl::prelude::*;

// `match` cannot branch on a traced integer (its value exists only on the device): rustc
// refuses the integer pattern at its span, and `switch(index, [..])` is the traced form
// (Pallas: `lax.switch`).
#[kernel]
fn pick(#[prefetch(i32[1])] which: Ref, #[input(f32[8, 128])] x: Ref, #[output(f32[8, 128])] o: Ref) {
    let v = x[..];
    o[..] = match which[0] {
        0 => v * 2.0,
        _ => v + 1.0,
    };
}

fn main() {}
