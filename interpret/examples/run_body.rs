//! Run a serialized Mosaic body on seeded random inputs and time it.
//!
//!     cargo run --release -p palladium-interpret --example run_body -- BODY.mlir CALL.json [REPEATS]
//!
//! `BODY.mlir` and `CALL.json` are what `palladium emit KERNEL --out DIR` writes. Integer
//! inputs are filled with `k % 8` (valid ids for the library's gather).

#![allow(clippy::result_large_err)]

use palladium_array::DType;
use palladium_interpret::{CallSpec, HostArray, Module};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, body, call, rest @ ..] = args.as_slice() else {
        return Err("usage: run_body BODY.mlir CALL.json [REPEATS]".into());
    };
    let repeats: usize = rest.first().map(|r| r.parse()).transpose()?.unwrap_or(3);
    let text = std::fs::read_to_string(body)?;
    let spec = CallSpec::from_json(&std::fs::read_to_string(call)?)?;
    let t = Instant::now();
    let program = Module::parse(&text)?.prepare()?;
    println!("parse + prepare: {:.3} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut seed = 0x1234_5678_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let inputs: Vec<HostArray> = spec
        .inputs
        .iter()
        .map(|(dt, shape)| {
            let n: usize = shape.iter().product();
            match dt {
                DType::I32 => {
                    HostArray::from_i32(shape, &(0..n as i32).map(|k| k % 8).collect::<Vec<_>>())
                }
                DType::Bf16 => {
                    HostArray::bf16_from_f32(shape, &(0..n).map(|_| next()).collect::<Vec<_>>())
                }
                _ => HostArray::from_f32(shape, &(0..n).map(|_| next()).collect::<Vec<_>>()),
            }
        })
        .collect();
    for r in 0..repeats {
        let t = Instant::now();
        let out = program.run_with(&inputs, &spec)?;
        let dt = t.elapsed().as_secs_f64();
        let first = out.first().map(|o| format!("{:?}", o)).unwrap_or_default();
        println!("run {r}: {:.3} s  {first}", dt);
    }
    Ok(())
}
