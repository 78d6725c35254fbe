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

/// The smallest kept vector with room for `n` (as it was kept), if `n` is large enough to
/// have been kept. Not one more than twice as large: a small request (a decode step's KV
/// cache, kept widened from run to run) must not take the vector a large buffer (a weight
/// ring) comes back for in the next run.
fn kept<T>(n: usize, list: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Option<Vec<T>> {
    if n < MIN_ELEMS {
        return None;
    }
    SPARE.with_borrow_mut(|s| {
        let l = list(s);
        let k = (0..l.len())
            .filter(|&k| (n..=2 * n).contains(&l[k].capacity()))
            .min_by_key(|&k| l[k].capacity())?;
        let v = l.swap_remove(k);
        s.kept -= v.capacity();
        Some(v)
    })
}

/// `n` f32s of unspecified (stale) values: a kept vector cut to length, nothing written
/// where it was long enough (for [`crate::memory`]'s fresh buffers, poisoned where touched).
pub(crate) fn stale_f32s(n: usize) -> Vec<f32> {
    stale(n, |s| &mut s.f)
}

/// As [`stale_f32s`], for i32s.
pub(crate) fn stale_i32s(n: usize) -> Vec<i32> {
    stale(n, |s| &mut s.i)
}

fn stale<T: Copy + Default>(n: usize, list: fn(&mut Spare) -> &mut Vec<Vec<T>>) -> Vec<T> {
    // Nothing kept: zeroed pages from the allocator, not written here.
    let Some(mut v) = kept(n, list) else { return vec![T::default(); n] };
    v.truncate(n);
    v.resize(n, T::default());
    v
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
    match kept(n, list) {
        Some(mut v) => {
            v.clear();
            v
        }
        None => Vec::with_capacity(n),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_vector_goes_to_a_request_of_at_least_half_its_size() {
        let big = 1 << 20;
        keep_f32s(vec![1.5; big]);
        // A small request does not take the large vector away from the large buffer.
        assert!(f32s(MIN_ELEMS).capacity() < big);
        let v = stale_f32s(big - 8);
        assert_eq!(
            (v.len(), v.capacity(), v[0]),
            (big - 8, big, 1.5),
            "the kept vector, cut to length, as it was"
        );
        // Nothing kept: zeroed storage.
        assert!(stale_f32s(big).iter().all(|&x| x == 0.0));
    }
}
