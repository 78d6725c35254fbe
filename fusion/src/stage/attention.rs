//! Stage: attention. Per-head q/k norm (Qwen3's `q_norm`/`k_norm`) and RoPE of the q/k/v
//! projection's heads, then attention for every (kv head, sequence) over the KV cache in
//! streamed tiles (the K new K/V rows inserted and written back in place, each query row
//! causal at its own position), the outputs reassembled into `attn` for [`super::o_proj`].
//! Also the prologue's RoPE tables for the token rows' positions.

use super::{Handles, is_one_of};
use crate::layout::OperandKind;
use crate::plan::{KvTiles, Plan, written_groups};
use crate::spmd::Spmd;
use palladium_dsl::build::{Drain, eq, for_range, ge, if_else, le, lt, pipeline, range};
use palladium_dsl::prelude::*;
use palladium_kernels::body::{
    KvMask, NewRow, OnlineSoftmax, RowSelect, Window, rms_norm, rope_apply, rope_rotation,
    rope_tables, rope_tables_of,
};

#[derive(Clone, Copy)]
pub struct Attention {
    positions: Ref,
    k_cache: Ref,
    v_cache: Ref,
    /// `q_norm` / `k_norm` rows per layer (Qwen3), copied into `hn` at the layer's start.
    head_norms: Option<Ref>,
    hn: Ref,
    hn_sem: SemRef,
    /// The q/k/v bias rows per layer (`qkv_bias`, a row per projection head), copied
    /// into their buffer at the layer's start.
    bias: Option<LayerRows>,
    /// The layer's attention sinks (gpt-oss): each kv group's query rows' sink.
    sinks: Option<LayerRows>,
    kbuf: Ref,
    vbuf: Ref,
    kv_sems: SemRef,
    kv_wsems: SemRef,
    qkv: Ref,
    qs: Ref,
    os: Ref,
    ks: Ref,
    vs: Ref,
    attn: Ref,
    rot: Ref,
    cos: Ref,
    sin: Ref,
    spmd: Option<Spmd>,
}

impl Attention {
    pub fn new(hs: &Handles) -> Attention {
        let k = hs.keys;
        Attention {
            positions: hs.must(OperandKind::Positions),
            k_cache: hs.must(OperandKind::KCacheOut),
            v_cache: hs.must(OperandKind::VCacheOut),
            head_norms: hs.operand(OperandKind::HeadNorms),
            hn: hs.buffer(k.head_norm_buf),
            hn_sem: hs.sems(k.head_norm_sem),
            bias: k.qkv_bias.map(|(buf, sem)| LayerRows {
                operand: hs.must(OperandKind::QkvBias),
                buf: hs.buffer(buf),
                sem: hs.sems(sem),
            }),
            sinks: k.sinks.map(|(buf, sem)| LayerRows {
                operand: hs.must(OperandKind::Sinks),
                buf: hs.buffer(buf),
                sem: hs.sems(sem),
            }),
            kbuf: hs.buffer(k.k_tiles),
            vbuf: hs.buffer(k.v_tiles),
            kv_sems: hs.sems(k.kv_sems),
            kv_wsems: hs.sems(k.kv_write_sems),
            qkv: hs.buffer(k.qkv),
            qs: hs.buffer(k.q_heads),
            os: hs.buffer(k.attn_heads),
            ks: hs.buffer(k.k_new),
            vs: hs.buffer(k.v_new),
            attn: hs.buffer(k.attn),
            rot: hs.buffer(k.rope_rot),
            cos: hs.buffer(k.rope_cos),
            sin: hs.buffer(k.rope_sin),
            spmd: hs.spmd,
        }
    }

    /// The prologue's: RoPE tables (neox, rotate halves) for the token rows' positions, one
    /// row each (token row r is sequence r / K's (r % K)-th new token, at its position +
    /// r % K), and the rotation restricted to the first `head_dim` lanes of a padded head;
    /// the query heads' buffer cleared.
    pub fn rope_tables(self, p: &Plan, row_i: RowSelect) {
        let d = &p.dims;
        let kt = d.tokens_per_seq;
        let mut pos = zeros([d.rows, 1], f32);
        for r in 0..d.tokens {
            let at = self.positions.load(r / kt);
            let at = if r % kt == 0 { at } else { at + (r % kt) as i32 };
            pos = row_i.put(pos, r as i32, at.cast(f32));
        }
        // Partial rotary (GLM-4.5): the first `rotary_dim` lanes rotate as a head of that
        // size would (frequencies and halves of `rotary_dim`), the rest pass through
        // (cos 1, sin 0, no rotation).
        let rotary = d.rotary_dim.unwrap_or(d.head_dim);
        let (cos, sin) = match &d.rope_table {
            Some((inv_freq, factor)) => rope_tables_of(pos, d.head_pad, inv_freq, *factor),
            None => rope_tables(pos, d.head_pad, rotary, d.rope_theta),
        };
        let (cos, sin) = match d.rotary_dim {
            Some(r) => {
                let rotated = lt(iota([1, d.head_pad], 1), r as i32);
                (select(rotated, cos, 1.0), select(rotated, sin, 0.0))
            }
            None => (cos, sin),
        };
        self.cos.store(.., cos);
        self.sin.store(.., sin);
        self.rot.store(.., rope_rotation(d.head_pad, rotary, false));
        self.qs.store(.., 0.0);
    }

    /// The prologue's: the heads' output buffer cleared.
    pub fn clear_outputs(self) {
        self.os.store(.., 0.0);
    }

    /// The layer's first thing: its head norms (Qwen3), q/k/v biases and sinks issued.
    pub fn issue_head_rows(self, layer: Val) {
        if let Some(norms) = self.head_norms {
            async_copy(norms.at(layer), self.hn, self.hn_sem.at(0)).start();
        }
        for rows in [self.bias, self.sinks].into_iter().flatten() {
            rows.copy(layer).start();
        }
    }

    /// Per-head q/k norm + RoPE into the head buffers, then attention for every (kv head,
    /// sequence) over the cache in streamed tiles, writing the new K/V in place; the
    /// outputs are reassembled into `attn` `[rows, heads * head_pad]`.
    pub fn emit(self, p: &Plan, layer: Val) {
        let d = &p.dims;
        let (hp, rows, group, kvh) = (d.head_pad, d.rows, d.group, d.kv_heads);
        if let Some(norms) = self.head_norms {
            async_copy(norms.at(layer), self.hn, self.hn_sem.at(0)).wait();
        }
        for rows in [self.bias, self.sinks].into_iter().flatten() {
            rows.copy(layer).wait();
        }
        // The layer's window where layers differ in it (gpt-oss's sliding and full layers:
        // a full layer's spans the whole cache), from compares of the layer index.
        let window = match (d.window, &d.sliding_layers) {
            (Some(w), Some(sliding)) => Some(Window::PerLayer(select(
                is_one_of(layer, sliding),
                scalar(w as i32),
                scalar(d.positions as i32),
            ))),
            (w, _) => w.map(Window::Fixed),
        };
        // The projection's head at column `col`, its bias added (`r(W x + b)` in the
        // reference: the bias before the norm and RoPE).
        let head = |col: u64| {
            let v = self.qkv.load((.., col..col + hp));
            match self.bias {
                Some(bias) => v + bias.buf.load((col / hp..col / hp + 1, ..)),
                None => v,
            }
        };
        let cos = self.cos.load(..);
        let sin = self.sin.load(..);
        let rot = self.rot.load(..);
        // OLMoE's clip_qkv: q and k after their norms, and v, clamped.
        let clip = |v: Val| match d.clip_qkv {
            Some(c) => v.cast(f32).maximum(-c).minimum(c),
            None => v,
        };
        // OLMoE's RMSNorm over the whole q and k projections (`[heads * head_dim]` values,
        // head padding zero): the inverse rms of each, per row. On N devices each holds some
        // heads: the sums of squares are summed over the devices (exactly, in f32), a KV
        // head's counted once (each is on `kv_replicas` devices).
        let whole_inv = d.whole_qk_norm.then(|| {
            let squares = |first: u64, count: u64| {
                (first..first + count)
                    .map(|t| {
                        let v = head(t * hp);
                        (v * v).sum_keepdims(1)
                    })
                    .reduce(|a, b| a + b)
                    .expect("a projection has heads")
            };
            let (q, k) = (squares(0, d.heads), squares(d.heads, kvh));
            let m = &p.model_dims;
            let (q, k) = match self.spmd {
                None => (q, k),
                Some(spmd) => {
                    let lane = iota([rows, 128], 1);
                    let both = select(eq(lane, 0), q, select(eq(lane, 1), k, 0.0));
                    let sum = spmd.sum_rows(both);
                    let replicas = p.sharding.as_ref().map_or(1, |s| s.heads.kv_replicas);
                    (sum.slice((.., 0..1)), sum.slice((.., 1..2)) / replicas as f64)
                }
            };
            let inv =
                |squares: Val, heads: u64| (squares / (heads * m.head_dim) as f64 + d.eps).rsqrt();
            [inv(q, m.heads), inv(k, m.kv_heads)]
        });
        // A head's q (`which` 0) or k (1) columns: the q/k norm (Qwen3's per head, or OLMoE's
        // whole-projection one with the head's row of the weight; rounded to bf16 as Hugging
        // Face does), the clip, RoPE (Hunyuan's per-head norm after it), and for q the
        // softmax scale folded in.
        let prep = |col: u64, which: usize, scale: f64| {
            let v = head(col);
            let v = match whole_inv {
                Some(inv) => {
                    let t = col / hp;
                    (v * inv[which] * self.hn.load((t..t + 1, ..))).cast(bf16)
                }
                None if d.qk_norm && !d.qk_norm_after_rope => {
                    let w = self.hn.load((which as u64..which as u64 + 1, ..));
                    rms_norm(v, Some(w), d.head_dim, d.eps)
                }
                None => v,
            };
            let v = rope_apply(clip(v), rot, cos, sin);
            // Hunyuan's norms after RoPE, on the rotated head rounded as transformers' bf16.
            let v = match d.qk_norm_after_rope {
                true => {
                    let w = self.hn.load((which as u64..which as u64 + 1, ..));
                    rms_norm(v.cast(bf16), Some(w), d.head_dim, d.eps).cast(f32)
                }
                false => v,
            };
            v * scale
        };
        for head in 0..d.heads {
            let (g, j) = (head / group, head % group);
            let v = prep(head * hp, 0, d.scale);
            self.qs.store((g, j * rows..(j + 1) * rows, ..), v);
        }
        for g in 0..kvh {
            let v = prep((d.heads + g) * hp, 1, 1.0);
            self.ks.store(g, v);
            self.vs.store(g, clip(head((d.heads + kvh + g) * hp)));
        }
        let bkv = p.block_kv;
        let qrows = d.attn_rows;
        let kt = d.tokens_per_seq;
        // A token row of the batch-stacked head buffers; a query row of one attention.
        let row_b = RowSelect::new(rows, hp);
        let arow = RowSelect::new(qrows, hp);
        // Query row `k * group + j` is head j of the sequence's k-th new token, at position
        // `pos + k`: its offset from `pos` (static), for the mask's causality among the K.
        let queries = (kt > 1).then(|| {
            let row = iota([qrows, 1], 0);
            let offsets = (1..kt)
                .fold(zeros([qrows, 1], i32), |o, k| select(ge(row, (k * group) as i32), o + 1, o));
            (offsets, kt)
        });
        for_range(range(0, scalar(kvh as i32)), (), |g: Val, ()| {
            for_range(range(0, scalar(d.batch as i32)), (), |bi: Val, ()| {
                // The token row of sequence `bi`'s k-th new token (the sequence's own row for
                // one token per sequence).
                let token_row = |k: u64| if kt == 1 { bi } else { bi * kt as i32 + k as i32 };
                // Sequence `bi`'s query rows of the group's heads: attention runs on `group * K`
                // rows (rounded up to 16) whatever the batch.
                let mut qg = zeros([qrows, hp], f32);
                for k in 0..kt {
                    for j in 0..group {
                        let q = row_b
                            .take(self.qs.load((g, j * rows..(j + 1) * rows, ..)), token_row(k));
                        qg = arow.put(qg, (k * group + j) as i32, q);
                    }
                }
                let qg = qg.cast(bf16);
                let pos = self.positions.load(bi);
                // The newest position written and attended: the sequence's last new token's.
                let newest = if kt == 1 { pos } else { pos + (kt - 1) as i32 };
                let new_kv: Vec<(Val, Val)> = (0..kt)
                    .map(|k| {
                        (
                            row_b.take(self.ks.load(g), token_row(k)),
                            row_b.take(self.vs.load(g), token_row(k)),
                        )
                    })
                    .collect();
                let bkv_i = bkv as i32;
                // The tile holding the newest position: the last one read, or any one of all.
                let last = newest / bkv_i;
                let (t0, ntiles) = match p.kv_tiles {
                    KvTiles::UpToPosition => {
                        let t0 = match window {
                            Some(Window::Fixed(w)) => {
                                let first = pos - (w as i32 - 1);
                                select(lt(first, 0), 0, first) / bkv_i
                            }
                            Some(Window::PerLayer(w)) => {
                                let first = pos - (w - 1);
                                select(lt(first, 0), 0, first) / bkv_i
                            }
                            None => scalar(0),
                        };
                        (t0, last + 1)
                    }
                    KvTiles::All => (scalar(0), scalar((d.positions / bkv) as i32)),
                };
                let fetch = |t: Val, slot: Val| {
                    let start = (t * bkv_i).multiple_of(bkv as u32);
                    let k = async_copy(
                        self.k_cache.at((layer, bi, g, ds(start, bkv), ..)),
                        self.kbuf.at(slot),
                        self.kv_sems.at((0, slot)),
                    );
                    let v = async_copy(
                        self.v_cache.at((layer, bi, g, ds(start, bkv), ..)),
                        self.vbuf.at(slot),
                        self.kv_sems.at((1, slot)),
                    );
                    (k, v)
                };
                // The 16-row groups of tile `t` holding new K/V rows, written back in place from
                // the tile's slot: the one group of the new row; for K > 1 (K <= 16 rows span at
                // most two groups) the group of the first new row in the tile and the next one
                // (the previous one at the tile's end; then it holds no new row and rewrites the
                // bytes read: two DMAs into one group at once would race).
                let write_back = |t: Val, slot: Val| {
                    let groups: Vec<Val> = if kt == 1 {
                        let rrow = pos - last * bkv_i;
                        vec![((rrow / 16) * 16).multiple_of(16)]
                    } else {
                        let lo = pos - t * bkv_i;
                        let first = ((select(lt(lo, 0), 0, lo) / 16) * 16).multiple_of(16);
                        if written_groups(kt, bkv) == 1 {
                            vec![first]
                        } else {
                            vec![
                                first,
                                select(lt(first + 16, bkv_i), first + 16, first - 16)
                                    .multiple_of(16),
                            ]
                        }
                    };
                    groups
                        .into_iter()
                        .enumerate()
                        .map(|(i, g16)| {
                            let tile_start = if kt == 1 { last * bkv_i } else { t * bkv_i };
                            let at = (tile_start + g16).multiple_of(16);
                            let sem = 2 * i as u64;
                            let k = async_copy(
                                self.kbuf.at((slot, ds(g16, 16), ..)),
                                self.k_cache.at((layer, bi, g, ds(at, 16), ..)),
                                self.kv_wsems.at(sem),
                            );
                            let v = async_copy(
                                self.vbuf.at((slot, ds(g16, 16), ..)),
                                self.v_cache.at((layer, bi, g, ds(at, 16), ..)),
                                self.kv_wsems.at(sem + 1),
                            );
                            (k, v)
                        })
                        .collect::<Vec<_>>()
                };
                // Runs `f` on the tiles holding new positions: statically the drain's one tile
                // when the loop stops there (one token), else under a run-time test.
                let holds_new = |t: Val| {
                    if kt == 1 {
                        eq(t, last)
                    } else {
                        let start = t * bkv_i;
                        le(start, newest) & lt(pos, start + bkv_i)
                    }
                };
                let on_new_tile = |t: Val, draining: bool, f: &dyn Fn()| match p.kv_tiles {
                    KvTiles::UpToPosition if draining => f(),
                    KvTiles::UpToPosition if kt == 1 => {}
                    _ => if_else(holds_new(t), f, || ()),
                };
                let (k0, v0) = fetch(t0, scalar(0));
                k0.start();
                v0.start();
                // A sink per query row (its head's, lane 0 of the row) starts each row's
                // softmax (gpt-oss).
                let start = || match self.sinks {
                    Some(sinks) => OnlineSoftmax::with_sink(
                        qrows,
                        hp,
                        sinks.buf.load((g, .., ..)).slice((.., 0..1)),
                    ),
                    None => OnlineSoftmax::start(qrows, hp),
                };
                let (state, _) = pipeline(
                    range(t0, ntiles - 1),
                    Drain::Loop(range(ntiles - 1, ntiles)),
                    1,
                    (start(), scalar(0)),
                    |next: Val, &(_, slot): &(OnlineSoftmax, Val)| {
                        let (kn, vn) = fetch(next, 1 - slot);
                        kn.start();
                        vn.start();
                    },
                    |t: Val, (state, slot): (OnlineSoftmax, Val), draining: bool| {
                        let (kc, vc) = fetch(t, slot);
                        kc.wait();
                        vc.wait();
                        // Insert the new K/V rows into their tile and write their groups back.
                        on_new_tile(t, draining, &|| {
                            // One row mask at a time, for both tiles (K masks of a whole tile live
                            // at once would not fit VMEM's scoped budget).
                            let (mut k_tile, mut v_tile) =
                                (self.kbuf.load(slot), self.vbuf.load(slot));
                            for (k, &(knew, vnew)) in new_kv.iter().enumerate() {
                                let row = NewRow::at(
                                    bkv,
                                    hp,
                                    if k == 0 { pos } else { pos + k as i32 } - t * bkv_i,
                                );
                                k_tile = row.insert(k_tile, knew);
                                v_tile = row.insert(v_tile, vnew);
                            }
                            self.kbuf.store(slot, k_tile);
                            self.vbuf.store(slot, v_tile);
                            for (kw, vw) in write_back(t, slot) {
                                kw.start();
                                vw.start();
                            }
                        });
                        // Positions past each query's (or before its window) are masked, V rows
                        // included (the cache holds whatever it held there). With one token,
                        // only a tile that holds such positions pays for it: the last one read;
                        // with K, the last two may (the queries' own positions). Reading all
                        // tiles, every tile pays (a run-time choice per tile costs more in
                        // libtpu's estimate than the masking: the cost variant stays an upper
                        // bound).
                        let mask = match (p.kv_tiles, window) {
                            (KvTiles::UpToPosition, None) if !draining && kt == 1 => None,
                            _ => Some(KvMask {
                                start: t * bkv_i,
                                last: pos,
                                queries,
                                window,
                                zero_values: true,
                            }),
                        };
                        let state = state.attend(
                            qg,
                            self.kbuf.load(slot),
                            self.vbuf.load(slot),
                            None,
                            mask,
                        );
                        // The write-back reads this slot: it lands before the slot is refilled.
                        on_new_tile(t, draining, &|| {
                            for (kw, vw) in write_back(t, slot) {
                                kw.wait();
                                vw.wait();
                            }
                        });
                        (state, 1 - slot)
                    },
                );
                // Head j's output row for token k back to the token's row of its stacked block.
                let out = state.output();
                for k in 0..kt {
                    for j in 0..group {
                        let block = || (g, j * rows..(j + 1) * rows, ..);
                        self.os.store(
                            block(),
                            row_b.put(
                                self.os.load(block()),
                                token_row(k),
                                arow.take(out, (k * group + j) as i32),
                            ),
                        );
                    }
                }
            });
        });
        for head in 0..d.heads {
            let (g, j) = (head / group, head % group);
            self.attn.store(
                (.., head * hp..(head + 1) * hp),
                self.os.load((g, j * rows..(j + 1) * rows, ..)),
            );
        }
    }
}

/// A per-layer operand of rows copied whole into its VMEM buffer.
#[derive(Clone, Copy)]
struct LayerRows {
    operand: Ref,
    buf: Ref,
    sem: SemRef,
}

impl LayerRows {
    fn copy(self, layer: Val) -> Dma {
        async_copy(self.operand.at(layer), self.buf, self.sem.at(0))
    }
}
