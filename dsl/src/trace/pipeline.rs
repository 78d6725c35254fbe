//! A software-pipelined stream of DMA items, the form every streaming kernel body shares
//! (Pallas's `emit_pipeline`): items are issued `ahead` of their use into a ring of VMEM
//! slots, and each is waited for and consumed in order.

use super::control::{Carry, TracedRange, for_range};
use super::val::Val;

/// Runs a stream whose first `ahead` items the caller has already issued: the main loop
/// over `main` issues item `i + ahead` (`issue(i + ahead, &carry)`), then consumes item `i`;
/// the drain loop over `drain` (the last `ahead` items) only consumes. `consume` gets the
/// item, the carry (ring slot, cursors, accumulators) and whether it is draining, and
/// returns the next carry.
///
/// Every issue is unconditional: no `scf.if` per item, so libtpu's static estimator (which
/// barely prices a DMA started under an `scf.if`) sees the whole stream.
pub fn pipeline<C: Carry>(main: TracedRange, drain: TracedRange, ahead: u64, init: C, issue: impl Fn(Val, &C), consume: impl Fn(Val, C, bool) -> C) -> C {
    let carry = for_range(main, init, |i: Val, c: C| {
        issue(i + ahead as i32, &c);
        consume(i, c, false)
    });
    for_range(drain, carry, |i: Val, c: C| consume(i, c, true))
}
