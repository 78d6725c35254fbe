//! A software-pipelined stream of DMA items, the form every streaming kernel body shares
//! (Pallas's `emit_pipeline`): items are issued `ahead` of their use into a ring of VMEM
//! slots, and each is waited for and consumed in order.

use super::control::{Carry, TracedRange, for_range};
use super::val::Val;

/// How a stream's last items (issued already, nothing left to issue) are consumed.
pub enum Drain {
    /// A traced loop over the items: one copy of the consume body whatever their number.
    Loop(TracedRange),
    /// `count` items from `start`, unrolled at trace time: straight-line code, one copy of
    /// the consume body per item, which libtpu's static estimate prices without a loop
    /// (a one-tile drain as a loop costs `decode_attention` 1% more estimated cycles).
    Peeled { start: Val, count: u64 },
}

/// Runs a stream whose first `ahead` items the caller has already issued: the main loop
/// over `main` issues item `i + ahead` (`issue(i + ahead, &carry)`), then consumes item `i`;
/// the `drain` (the last items) only consumes. `consume` gets the item, the carry (ring
/// slot, cursors, accumulators) and whether it is draining, and returns the next carry.
///
/// Every issue is unconditional: no `scf.if` per item, so libtpu's static estimator (which
/// barely prices a DMA started under an `scf.if`) sees the whole stream.
pub fn pipeline<C: Carry>(main: TracedRange, drain: Drain, ahead: u64, init: C, issue: impl Fn(Val, &C), consume: impl Fn(Val, C, bool) -> C) -> C {
    let carry = for_range(main, init, |i: Val, c: C| {
        issue(i + ahead as i32, &c);
        consume(i, c, false)
    });
    match drain {
        Drain::Loop(items) => for_range(items, carry, |i: Val, c: C| consume(i, c, true)),
        Drain::Peeled { start, count } => (0..count).fold(carry, |c, k| consume(if k == 0 { start } else { start + k as i32 }, c, true)),
    }
}
