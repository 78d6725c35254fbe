//! A software-pipelined stream of DMA items, the form every streaming kernel body shares
//! (Pallas's `emit_pipeline`): items are issued `ahead` of their use into a ring of VMEM
//! slots, and each is waited for and consumed in order.

use super::control::{Carry, TracedRange, for_range, range};
use super::val::{Val, scalar};

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
pub fn pipeline<C: Carry>(
    main: TracedRange,
    drain: Drain,
    ahead: u64,
    init: C,
    issue: impl Fn(Val, &C),
    consume: impl Fn(Val, C, bool) -> C,
) -> C {
    let carry = for_range(main, init, |i: Val, c: C| {
        issue(i + ahead as i32, &c);
        consume(i, c, false)
    });
    match drain {
        Drain::Loop(items) => for_range(items, carry, |i: Val, c: C| consume(i, c, true)),
        Drain::Peeled { start, count } => (0..count)
            .fold(carry, |c, k| consume(if k == 0 { start } else { start + k as i32 }, c, true)),
    }
}

/// A stream of `total` items (at least `ahead + 1`) whose compute lags its waits by one
/// item, so that `ahead` DMAs stay in flight while an item computes: iteration `j` computes
/// item `j - 1`, waits for item `j`, then issues item `j + ahead` into the slot the compute
/// just freed (a ring of `ahead + 1` slots). The caller has issued items `0..ahead`;
/// `issue(i, &carry)` issues item `i` from the carry of item `i - ahead`, `wait(i, &carry)`
/// waits for item `i`, `compute(i, carry)` consumes item `i` and returns item `i + 1`'s
/// carry. With `ahead = 0` each item is issued, waited for and computed in turn.
///
/// Why not [`pipeline`]: libtpu's scheduler starts a DMA as late as the next wait allows,
/// so an item issued before a compute in the same loop body starts after it; here the
/// start ends the body, and the loop's back edge keeps it ahead of the next compute.
/// libtpu's static estimator gives every DMA its own bandwidth, so a stream moves at the
/// rate of the DMAs it has in flight: `ahead` of them through the compute here, one in
/// [`pipeline`] at `ahead = 1` (which then, like a double-buffered Pallas pipeline, has two
/// in flight only between the next item's start and the current one's wait).
pub fn pipeline_lagged<C: Carry>(
    total: Val,
    ahead: u64,
    init: C,
    issue: impl Fn(Val, &C),
    wait: impl Fn(Val, &C),
    compute: impl Fn(Val, C) -> C,
) -> C {
    let fetch = |j: Val, c: &C| {
        if ahead == 0 {
            issue(j, c);
            wait(j, c);
        } else {
            wait(j, c);
            issue(j + ahead as i32, c);
        }
    };
    fetch(scalar(0), &init);
    let split = total - ahead as i32;
    let carry = for_range(range(scalar(1), split), init, |j: Val, c: C| {
        let c = compute(j - 1, c);
        fetch(j, &c);
        c
    });
    // The last `ahead` items: nothing left to issue.
    let carry = match ahead {
        0 => carry,
        _ => for_range(range(split, total), carry, |j: Val, c: C| {
            let c = compute(j - 1, c);
            wait(j, &c);
            c
        }),
    };
    compute(total - 1, carry)
}
