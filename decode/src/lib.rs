//! The run layer of the decode megakernel: what runs a [`palladium_fusion::megakernel::Megakernel`]
//! the compiler built, apart from the compiler (`palladium-fusion` does not depend on the
//! interpreter).
//!
//! - [`pack`]: Hugging Face weights → the megakernel's input arrays, as its
//!   [`palladium_fusion::layout::StreamLayout`] describes them;
//! - [`decoder`]: decode steps, one megakernel run each, in the interpreter or on a device
//!   ([`Engine`]), the KV caches carried between runs through the call's aliases;
//! - [`speculate`]: drafting (prompt lookup, forced) and acceptance for K-token verify
//!   runs;
//! - [`comparison`]: a generation against the plain-Rust bf16 and f32 references, under the
//!   project's logits tolerance and its near-tie rules.

pub mod comparison;
pub mod decoder;
pub mod pack;
pub mod speculate;

pub use comparison::{
    Comparison, Matched, ROUTER_TIE, StepCheck, check_step, compare, compare_with,
};
pub use decoder::{DecodeError, Decoder, Engine, Step};
