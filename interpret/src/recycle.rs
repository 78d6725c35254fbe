//! Large element vectors recycled from run to run on the same thread.
//!
//! A run allocates its arrays, windows and scratch afresh; blocks of megabytes come from the
//! allocator as fresh pages (and go back to the OS when freed), so every run paid for page
//! faults and zeroing before its first op. The vectors of a finished run are kept here (up to
//! [`MAX_KEPT`] elements per thread) and handed to the next run's buffers.

use std::cell::RefCell;

/// Smaller vectors are left to the allocator.
const MIN_ELEMS: usize = 1 << 15;
/// Elements kept per thread (1 GiB of f32).
const MAX_KEPT: usize = 1 << 28;

#[derive(Default)]
struct Spare {
    f: Vec<Vec<f32>>,
    i: Vec<Vec<i32>>,
    kept: usize,
}

thread_local! {
    static SPARE: RefCell<Spare> = RefCell::default();
}

/// The smallest kept vector that holds `n`, emptied.
fn best_fit<T>(list: &mut Vec<Vec<T>>, n: usize) -> Option<Vec<T>> {
    let k = (0..list.len()).filter(|&k| list[k].capacity() >= n).min_by_key(|&k| list[k].capacity())?;
    let mut v = list.swap_remove(k);
    v.clear();
    Some(v)
}

/// An empty vector with room for `n` f32s.
pub(crate) fn f32s(n: usize) -> Vec<f32> {
    take(n, |s| &mut s.f)
}

/// An empty vector with room for `n` i32s.
pub(crate) fn i32s(n: usize) -> Vec<i32> {
    take(n, |s| &mut s.i)
}

fn take<T>(n: usize, list: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    if n < MIN_ELEMS {
        return Vec::with_capacity(n);
    }
    SPARE.with_borrow_mut(|s| {
        let v = best_fit(list(s), n);
        s.kept -= v.as_ref().map_or(0, Vec::capacity);
        v.unwrap_or_else(|| Vec::with_capacity(n))
    })
}

/// Keep `v` for a later run (if it is large and there is room).
pub(crate) fn keep_f32s(v: Vec<f32>) {
    keep(v, |s| &mut s.f);
}

/// Keep `v` for a later run (if it is large and there is room).
pub(crate) fn keep_i32s(v: Vec<i32>) {
    keep(v, |s| &mut s.i);
}

fn keep<T>(v: Vec<T>, list: fn(&mut Spare) -> &mut Vec<Vec<T>>) {
    let cap = v.capacity();
    if cap < MIN_ELEMS {
        return;
    }
    SPARE.with_borrow_mut(|s| {
        if s.kept + cap > MAX_KEPT {
            return;
        }
        s.kept += cap;
        list(s).push(v);
    });
}
