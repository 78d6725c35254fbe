//! Token embedding rows.

use super::rows::RowSelect;
use palladium_dsl::prelude::*;

/// Row `token % rows` of `group` (`[rows, hidden]`, the embedding table's aligned group of
/// `rows` rows holding `token`, fetched whole: a DMA of one bf16 row would not be
/// tile-aligned), as f32 `[1, hidden]`.
pub fn embedding_row(group: Val, token: Val) -> Val {
    let dims = group.shape().0;
    let rows = dims[0];
    RowSelect::new(rows, dims[1]).take(group.cast(f32), token % rows as i32)
}
