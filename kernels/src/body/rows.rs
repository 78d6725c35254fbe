//! Row moves on loaded vectors, which have no dynamic row slice: the batch's rows packed
//! onto (and back off) the MXU's sublanes, a row picked out of a fetched group.

use palladium_dsl::build::{IntoVal, eq};
use palladium_dsl::prelude::*;

/// The row index of `[rows, width]` vectors (`width` 1 to broadcast over any width), built
/// once and shared by every move on vectors of that shape.
#[derive(Clone, Copy)]
pub struct RowSelect {
    row: Val,
}

impl RowSelect {
    pub fn new(rows: u64, width: u64) -> RowSelect {
        RowSelect { row: iota([rows, width], 0) }
    }

    /// Row `i` of `x` as `[1, width]`: a masked sum over the sublanes (exact: one term is
    /// not zero).
    pub fn take(self, x: Val, i: impl IntoVal) -> Val {
        select(eq(self.row, i), x, 0.0).sum_keepdims(0)
    }

    /// `value` (a scalar or `[1, width]`) on row `i`, zero elsewhere.
    pub fn only(self, i: impl IntoVal, value: impl IntoVal) -> Val {
        select(eq(self.row, i), value, 0.0)
    }

    /// `x` with row `i` replaced by `value` (`[1, width]`, broadcast).
    pub fn put(self, x: Val, i: impl IntoVal, value: Val) -> Val {
        select(eq(self.row, i), value, x)
    }
}
