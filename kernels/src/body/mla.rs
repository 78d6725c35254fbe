//! Multi-head latent attention's cache row and the query that attends to it (DeepSeek's
//! absorbed decode form, `docs/deepseek.md`): one layout for `mla_decode_attention` and the
//! megakernel's MLA stage.

use palladium_dsl::prelude::*;

/// A latent cache row: `[latent | rope key]`, the latent (`kv_lora_rank` values) in whole
/// 128-lane tiles, zero past `rank` (the tiny checkpoints' rank of 64 pads to 128), then
/// the rope key in a 128-lane block of its own (zero past its `qk_rope_head_dim` values).
/// The padding lanes are zero in the query and the row alike, so scores are exact, and
/// the output's padding lanes (probabilities times zeros) are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatentRow {
    pub rank: u64,
}

impl LatentRow {
    /// The latent's lanes, `rank` rounded up to 128: where the rope block starts.
    pub fn latent_lanes(self) -> u64 {
        self.rank.div_ceil(128) * 128
    }

    /// The row's width: the latent's lanes and the rope block (640 for DeepSeek-V3).
    pub fn width(self) -> u64 {
        self.latent_lanes() + 128
    }

    /// The attending rows `[q_lat | q_rope]` (`[rows, width]`, bf16) from the query's
    /// latent part `q_lat` (`[rows, rank]`, `W_UK` absorbed) and its rope block `q_rope`
    /// (`[rows, 128]`, rotated, zero past the rope values).
    pub fn query(self, q_lat: Val, q_rope: Val) -> Val {
        let rows = q_lat.shape().0[0];
        let pad = self.latent_lanes() - self.rank;
        if pad == 0 {
            return concatenate(&[q_lat, q_rope], 1);
        }
        concatenate(&[q_lat, zeros([rows, pad], bf16), q_rope], 1)
    }

    /// The latent the probabilities weighted (`[rows, rank]`) from attention's output over
    /// the rows (`[rows, width]`): what `W_UV` reads.
    pub fn latent(self, out: Val) -> Val {
        out.slice((.., 0..self.rank))
    }
}
