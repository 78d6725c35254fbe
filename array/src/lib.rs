//! The base every Palladium crate may depend on, and which depends on none of them: the
//! element [`DType`], THE host array ([`HostArray`]), THE bf16 rounding ([`round_bf16`],
//! [`f32_to_bf16`]), THE float8 / int4 conversions ([`quant`]), THE logits tolerance
//! ([`tolerance`]) and THE Pallas grid pipeline ([`pipeline`]: which blocks move at which
//! grid step). One definition of each, so the kernel library's references, the interpreter,
//! the runtime, the model reference, the profile and autotune agree bit for bit; a base crate
//! because the interpreter does not depend on the DSL.

mod bf16;
mod dtype;
mod host;
pub mod pipeline;
pub mod quant;
pub mod tolerance;

pub use bf16::{bf16_to_f32, f32_to_bf16, round_bf16};
pub use dtype::DType;
pub use host::HostArray;
