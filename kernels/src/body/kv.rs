//! The KV-cache update: the new token's K/V row written into the cache tile (or aligned
//! block) that holds its position, in VMEM; the caller's DMAs move the tile.

use palladium_dsl::build::eq;
use palladium_dsl::prelude::*;

/// Where the new token's row goes in a `[rows, width]` tile: the row mask, built once and
/// used for every head's K and V tile.
#[derive(Clone, Copy)]
pub struct NewRow {
    hit: Val,
}

impl NewRow {
    /// Row `row` (traced: the position minus the tile's first position) of a `[rows, width]`
    /// tile.
    pub fn at(rows: u64, width: u64, row: Val) -> NewRow {
        NewRow { hit: eq(iota([rows, width], 0), row) }
    }

    /// `tile` with the new row `new` (`[1, width]`, rounded to the tile's dtype) in place.
    pub fn insert(self, tile: Val, new: Val) -> Val {
        select(self.hit, new.cast(tile.dtype()), tile)
    }
}
