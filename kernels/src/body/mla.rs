//! Multi-head latent attention's cache row and the query that attends to it (DeepSeek's
//! absorbed decode form, `docs/deepseek.md`): one layout for `mla_decode_attention` and the
//! megakernel's MLA stage, the new position's row ([`LatentRow::entry`]: the stage's form of
//! `palladium_model::mla::latent_entry`) and RoPE on a rope block ([`RopeBlock`]).

use super::{rms_unit, rope_apply, rope_rotation};
use palladium_dsl::build::{eq, ge, lt};
use palladium_dsl::prelude::*;
use palladium_model::mla::StageRotation;

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

    /// The new position's cache row (`[rows, width]`, f32) from `kv_a_proj_with_mqa`'s
    /// output laid out as a row (`kv_a`, `[rows, width]`, zero in the padding): the latent
    /// RMS-normed over its `rank` values without `kv_a_layernorm`'s weight (folded into
    /// `kv_b_proj`'s inputs), the rope key rotated by `rope`.
    pub fn entry(self, kv_a: Val, eps: f64, rope: RopeBlock) -> Val {
        let lanes = self.latent_lanes();
        let latent = rms_unit(kv_a.slice((.., 0..lanes)).cast(f32), self.rank, eps);
        let key = rope.apply(kv_a.slice((.., lanes..lanes + 128)));
        concatenate(&[latent, key], 1)
    }
}

/// RoPE on a rope block (`[rows, 128]`, the rope part's values first, zero past them), as
/// MLA rotates its query's and key's rope parts: the model's layout as a
/// [`StageRotation`] and `cos`/`sin` tables of its inverse frequencies (YaRN's, from
/// `RopeScaling::inv_freq`) times its factor, at each row's position.
#[derive(Clone, Copy)]
pub struct RopeBlock {
    pub rotation: Val,
    pub cos: Val,
    pub sin: Val,
}

impl RopeBlock {
    /// The block's rotation and tables for `positions` (`[rows, 1]`, f32): lane `j` of
    /// the `2 * inv_freq.len()` rope values turns by frequency `j / 2` (pairs) or `j mod
    /// inv_freq.len()` (halves), `cos`/`sin` times `factor`; past them cos 1, sin 0.
    pub fn new(positions: Val, inv_freq: &[f32], factor: f64, rotation: StageRotation) -> Self {
        let half = inv_freq.len() as i32;
        let lane = iota([1, 128], 1);
        let pair = match rotation {
            StageRotation::Pairs => lane / 2,
            StageRotation::Halves => select(ge(lane, half), lane - half, lane),
        };
        let freq = inv_freq.iter().enumerate().fold(zeros([1, 128], f32), |acc, (i, &f)| {
            select(eq(pair, i as i32), full([1, 128], f64::from(f), f32), acc)
        });
        let angle = positions * freq;
        let rotated = lt(lane, 2 * half);
        let rope = 2 * inv_freq.len() as u64;
        RopeBlock {
            rotation: rope_rotation(128, rope, rotation == StageRotation::Pairs),
            cos: select(rotated, angle.cos() * factor, 1.0),
            sin: select(rotated, angle.sin() * factor, 0.0),
        }
    }

    /// `x` (`[rows, 128]`) rotated, f32.
    pub fn apply(self, x: Val) -> Val {
        rope_apply(x, self.rotation, self.cos, self.sin)
    }
}
