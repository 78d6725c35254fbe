//! Stage: multi-head latent attention (`DeepSeek`), absorbed over a latent cache
//! (`docs/megakernel.md`, the MLA stage). Not emitted yet: [`crate::plan`] refuses MLA. What
//! the stage's plan is made of is here: the latent cache row ([`LatentRow`], the kernel
//! bodies' own) and how the per-head weight blocks the dense stream cannot take as they are
//! (`kv_b_proj`'s `W_UK_h` and `W_UV_h`, `q_b_proj`) stack into its `hidden`-row chunks
//! ([`Stacked`]), with the bytes both cost ([`MlaWidths`]).

use crate::options::PlanError;
use palladium_kernels::body::LatentRow;
use palladium_model::spec::MlaSpec;
use serde::Serialize;

/// Per-head (or per-slice) weight blocks of `rows x cols` stacked into the dense stream's
/// `hidden`-row chunks: rows `k*rows..(k+1)*rows` of column block `g` hold block `g *
/// per_block + k` (the stage reads it as a row slice of the ring bank), so a block streams
/// its own bytes instead of `hidden / rows` times them padded to `hidden` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stacked {
    pub rows: u64,
    pub cols: u64,
    /// The blocks stacked (heads, or slices of columns).
    pub count: u64,
    /// Blocks one above the other in a column block: `hidden / rows`.
    pub per_block: u64,
    /// Column blocks: `count / per_block` rounded up.
    pub blocks: u64,
}

impl Stacked {
    /// `count` blocks of `rows x cols` in chunks of `hidden` rows; `what` names them in a
    /// refusal (a block taller than `hidden`, or rows off the bf16 sublane tile of 16, which
    /// a row slice of the bank needs).
    pub fn new(
        hidden: u64,
        rows: u64,
        cols: u64,
        count: u64,
        what: &str,
    ) -> Result<Stacked, PlanError> {
        if rows == 0 || rows > hidden || !rows.is_multiple_of(16) {
            return Err(PlanError::Unsupported(format!(
                "{what}: blocks of {rows} rows in chunks of hidden_size {hidden} rows (a multiple of 16, at most hidden_size)"
            )));
        }
        let per_block = hidden / rows;
        Ok(Stacked { rows, cols, count, per_block, blocks: count.div_ceil(per_block) })
    }

    /// The dense stream's columns the blocks take.
    pub fn stream_cols(self) -> u64 {
        self.blocks * self.cols
    }
}

/// The MLA stage's widths for one device's `heads` query heads on a hidden size `hidden`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaWidths {
    pub row: LatentRow,
    /// `W_UK_h` (`[nope, rank]` per head, the rank on the row's latent lanes).
    pub uk: Stacked,
    /// `W_UV_h^T` (`[rank, v]` per head, `v` on whole lane tiles).
    pub uv: Stacked,
    /// `q_b_proj^T` (`[q_lora_rank, heads * (nope + rope)]`) in slices of 128 output
    /// columns, each head's nope and rope parts on lane tiles of their own (the rope part
    /// in one 128-lane block, as the row's); `None` for a direct `q_proj`.
    pub q_b: Option<Stacked>,
    pub heads: u64,
    pub nope: u64,
    pub v: u64,
}

impl MlaWidths {
    pub fn new(hidden: u64, heads: u64, m: MlaSpec) -> Result<MlaWidths, PlanError> {
        let row = LatentRow { rank: m.kv_lora_rank };
        let nope = m.qk_nope_head_dim;
        let lanes = |n: u64| n.div_ceil(128) * 128;
        let uk = Stacked::new(hidden, nope, row.latent_lanes(), heads, "kv_b_proj's W_UK")?;
        let uv =
            Stacked::new(hidden, m.kv_lora_rank, lanes(m.v_head_dim), heads, "kv_b_proj's W_UV")?;
        let q_b = match m.q_lora_rank {
            None => None,
            Some(q) => {
                let slices = heads * (lanes(nope) + 128) / 128;
                Some(Stacked::new(hidden, q, 128, slices, "q_b_proj")?)
            }
        };
        Ok(MlaWidths { row, uk, uv, q_b, heads, nope, v: m.v_head_dim })
    }

    /// bf16 bytes per cached position and layer: the latent row (the latent on whole lane
    /// tiles, the rope key in its 128-lane block), and every head's key (`nope + rope`) and
    /// value expanded, as grouped-query attention would cache them.
    pub fn kv_bytes(self, rope: u64) -> (u64, u64) {
        (2 * self.row.width(), 2 * self.heads * (self.nope + rope + self.v))
    }

    /// bf16 bytes per layer the stacked blocks stream, and what they would stream each
    /// padded to `hidden` rows.
    pub fn stacked_bytes(self, hidden: u64) -> (u64, u64) {
        let parts = [Some(self.uk), Some(self.uv), self.q_b];
        let stacked = parts.iter().flatten().map(|s| s.stream_cols()).sum::<u64>();
        let padded = parts.iter().flatten().map(|s| s.count * s.cols).sum::<u64>();
        (2 * hidden * stacked, 2 * hidden * padded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mla(q_lora: Option<u64>, rank: u64, nope: u64, rope: u64, v: u64) -> MlaSpec {
        MlaSpec {
            q_lora_rank: q_lora,
            kv_lora_rank: rank,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: v,
        }
    }

    /// The design's numbers (`docs/megakernel.md`): DeepSeek-V2-Lite's 16 heads of `W_UK`
    /// in one 512-column block, V3's 128 in three; `W_UV^T` 4 and 14 heads per block;
    /// V3's `q_b_proj^T` 4 blocks high (6144 of 7168 rows); the latent row 640 lanes.
    #[test]
    fn deepseek_v2_lite_and_v3_stack_as_designed() {
        let lite = MlaWidths::new(2048, 16, mla(None, 512, 128, 64, 128)).unwrap();
        assert_eq!(lite.uk, Stacked { rows: 128, cols: 512, count: 16, per_block: 16, blocks: 1 });
        assert_eq!(lite.uv, Stacked { rows: 512, cols: 128, count: 16, per_block: 4, blocks: 4 });
        assert_eq!(lite.q_b, None);
        assert_eq!(lite.kv_bytes(64), (1280, 10240));
        let v3 = MlaWidths::new(7168, 128, mla(Some(1536), 512, 128, 64, 128)).unwrap();
        assert_eq!(v3.uk, Stacked { rows: 128, cols: 512, count: 128, per_block: 56, blocks: 3 });
        assert_eq!(v3.uv, Stacked { rows: 512, cols: 128, count: 128, per_block: 14, blocks: 10 });
        // 128 heads of [nope | rope] on 2 lane tiles: 256 slices of 128 columns, 4 high.
        assert_eq!(
            v3.q_b,
            Some(Stacked { rows: 1536, cols: 128, count: 256, per_block: 4, blocks: 64 })
        );
        assert_eq!(v3.kv_bytes(64), (1280, 81920));
        // Stacked, W_UK, W_UV and q_b_proj stream 1536 + 1280 + 8192 columns of 7168 rows.
        let (stacked, padded) = v3.stacked_bytes(7168);
        assert_eq!(stacked, 2 * 7168 * (1536 + 1280 + 8192));
        // Each head's (slice's) block padded to 7168 rows instead: 128 x 512 + 128 x 128 +
        // 256 x 128 columns, 10.4x the bytes.
        assert_eq!(padded, 2 * 7168 * (128 * 512 + 128 * 128 + 256 * 128));
    }

    /// The tiny checkpoints: a latent of 64 on one lane tile (its row 256 lanes), 4 heads.
    #[test]
    fn the_tiny_checkpoints_pad_their_latent_and_value_to_lane_tiles() {
        let tiny = MlaWidths::new(256, 4, mla(Some(96), 64, 32, 16, 32)).unwrap();
        assert_eq!(tiny.row.width(), 256);
        assert_eq!(tiny.uk, Stacked { rows: 32, cols: 128, count: 4, per_block: 8, blocks: 1 });
        assert_eq!(tiny.uv, Stacked { rows: 64, cols: 128, count: 4, per_block: 4, blocks: 1 });
        assert_eq!(
            tiny.q_b,
            Some(Stacked { rows: 96, cols: 128, count: 8, per_block: 2, blocks: 4 })
        );
        assert_eq!(tiny.kv_bytes(16), (512, 640));
    }

    /// A block whose rows a bank's row slice cannot take, or taller than a chunk, is
    /// refused by name.
    #[test]
    fn blocks_off_the_sublane_tile_or_taller_than_a_chunk_are_refused() {
        for (m, what) in [
            (mla(None, 512, 40, 64, 128), "kv_b_proj's W_UK: blocks of 40 rows"),
            (mla(None, 4096, 128, 64, 128), "kv_b_proj's W_UV: blocks of 4096 rows"),
            (mla(Some(100), 512, 128, 64, 128), "q_b_proj: blocks of 100 rows"),
        ] {
            let err = MlaWidths::new(2048, 16, m).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        }
    }
}
