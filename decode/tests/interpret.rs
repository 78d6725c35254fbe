//! The tiny megakernels' serialized bodies run in the CPU interpreter (race and deadlock
//! detection on) with random weights: logits come out finite, and the KV caches change
//! exactly at the new positions (written in place through the aliased outputs).
//!
//!
//! The body is run with the call spec (`Program::run_with`), so the aliased cache outputs
//! start as the cache inputs, as on the TPU. (Run without the aliases, the outputs start as
//! the interpreter's NaN poison: attention then reads NaN K/V, the router scores are NaN and
//! top-k used to pick the padded expert id 128, an out-of-bounds expert fetch.) The cache
//! rows past each sequence's position may hold anything, NaN included
//! (`stale_cache_rows_do_not_leak`): scores there are masked and V rows zeroed.
use palladium_array::{DType, HostArray};
use palladium_dsl::spec::Chip;
use palladium_fusion::layout::OperandKind;
use palladium_fusion::plan::Plan;
use palladium_fusion::{
    megakernel::Megakernel,
    plan::{ExpertFetch, KvTiles, PlanOptions, Prefetch},
};
use palladium_interpret::{CallSpec, Module, Program};
use palladium_model::ModelSpec;

fn run(name: &str, batch: u64, context: u64, positions: &[i32]) {
    step(
        name,
        batch,
        context,
        positions,
        false,
        KvTiles::UpToPosition,
        Prefetch::Deep,
        1,
        ExpertFetch::Distinct,
    );
}

fn run_with_stale(name: &str, batch: u64, context: u64, positions: &[i32], stale: bool) {
    step(
        name,
        batch,
        context,
        positions,
        stale,
        KvTiles::UpToPosition,
        Prefetch::Deep,
        1,
        ExpertFetch::Distinct,
    );
}

/// The megakernel of the fixture `name` planned with `options`: its plan, its prepared
/// body, its call spec and seeded random inputs (token row `k` fed id `(7 + 100 k) % 500`,
/// sequence `b` at `positions[b]`; weights in [-0.1, 0.1], f32 operands in [0.9, 1.1]).
fn setup(
    name: &str,
    options: &PlanOptions,
    positions: &[i32],
) -> (Plan, Program, CallSpec, Vec<HostArray>) {
    let spec = ModelSpec::from_path(format!(
        "{}/../fixtures/models/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mk = Megakernel::build(&spec, options).unwrap();
    let (l, plan) = (mk.lowered, mk.plan);
    let call = CallSpec::from_json(&l.call_json).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 0.2 - 0.1
    };
    let inputs: Vec<HostArray> = call
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (dt, shape))| {
            let n: usize = shape.iter().product();
            match (i, dt) {
                (0, _) => HostArray::from_i32(
                    shape,
                    &(0..n as i32).map(|k| (7 + 100 * k) % 500).collect::<Vec<_>>(),
                ),
                (1, _) => HostArray::from_i32(shape, positions),
                (_, DType::Bf16) => {
                    HostArray::bf16_from_f32(shape, &(0..n).map(|_| next()).collect::<Vec<_>>())
                }
                _ => HostArray::from_f32(shape, &(0..n).map(|_| 1.0 + next()).collect::<Vec<_>>()),
            }
        })
        .collect();
    let program = Module::parse(&l.body).unwrap().prepare().unwrap();
    (plan, program, call, inputs)
}

/// One step's logits, `tokens_per_seq` new tokens per sequence at `positions[b]..`;
/// `stale`: every cache row past its sequence's position is NaN. The kernel's greedy ids
/// and maxima are checked against the logits it returns.
#[allow(clippy::too_many_arguments)]
fn step(
    name: &str,
    batch: u64,
    context: u64,
    positions: &[i32],
    stale: bool,
    kv_tiles: KvTiles,
    prefetch: Prefetch,
    tokens_per_seq: u64,
    expert_fetch: ExpertFetch,
) -> Vec<f32> {
    let options = PlanOptions {
        kv_tiles,
        prefetch,
        tokens_per_seq,
        expert_fetch,
        ..PlanOptions::new(Chip::V6e, batch, context)
    };
    let (plan, program, call, mut inputs) = setup(name, &options, positions);
    if stale {
        let kv_in = inputs.len() - 2;
        for c in [kv_in, kv_in + 1] {
            let s = inputs[c].shape.clone();
            let (pos_n, hp) = (s[3], s[4]);
            let mut v = inputs[c].to_f32();
            for (row, r) in v.chunks_mut(hp).enumerate() {
                let seq = (row / pos_n / s[2]) % s[1];
                if row % pos_n > positions[seq] as usize {
                    r.fill(f32::NAN);
                }
            }
            inputs[c] = HostArray::bf16_from_f32(&s, &v);
        }
    }
    let out = program.run_with(&inputs, &call).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(out[0].to_f32().iter().all(|v| v.is_finite()), "{name}: non-finite logits");
    // Outputs: logits, greedy ids, maxima, then the caches. Ids: the lowest id of the
    // row's maximum, as the host's argmax.
    let (logits, ids, maxima) = (out[0].to_f32(), out[1].to_i32(), out[2].to_f32());
    let (cw, rows, vocab) =
        (plan.layout.chunk_cols as usize, plan.dims.rows as usize, plan.dims.vocab as usize);
    for r in 0..plan.dims.tokens as usize {
        let row: Vec<f32> =
            (0..vocab).map(|v| logits[((v / cw) * rows + r) * cw + v % cw]).collect();
        assert_eq!(
            ids[r * 128] as usize,
            palladium_model::reference::argmax(&row),
            "{name}: row {r}'s greedy id"
        );
        assert_eq!(
            maxima[r * 128],
            row.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            "{name}: row {r}'s maximum"
        );
    }
    // KV: [layers, batch, kv_heads, positions, head_pad]; rows change only at the new
    // positions `positions[b]..positions[b] + K`.
    let kv_in = inputs.len() - 2;
    let kv_out = out.len() - 2;
    let k = tokens_per_seq as usize;
    for (cache_in, cache_out) in [(kv_in, kv_out), (kv_in + 1, kv_out + 1)] {
        let (before, after) = (inputs[cache_in].to_f32(), out[cache_out].to_f32());
        let s = &inputs[cache_in].shape;
        let (pos_n, hp) = (s[3], s[4]);
        for (row, (a, b)) in before.chunks(hp).zip(after.chunks(hp)).enumerate() {
            let p = row % pos_n;
            let seq = (row / pos_n / s[2]) % s[1];
            if (positions[seq] as usize..positions[seq] as usize + k).contains(&p) {
                assert_ne!(a, b, "{name}: row {row} (position {p}) not written");
            } else {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name}: row {row} (position {p}) changed"
                );
            }
        }
    }
    out[0].to_f32()
}

#[test]
fn tiny_qwen3_runs_in_the_interpreter() {
    run("tiny-qwen3-moe", 1, 600, &[700 - 1]);
}

#[test]
fn tiny_mixtral_runs_in_the_interpreter() {
    run("tiny-mixtral", 2, 300, &[0, 37]);
}

#[test]
fn tiny_qwen3_pos0_runs_in_the_interpreter() {
    run("tiny-qwen3-moe", 1, 256, &[0]);
}

#[test]
fn tiny_qwen3_pos37_runs_in_the_interpreter() {
    run("tiny-qwen3-moe", 1, 256, &[37]);
}

#[test]
fn stale_cache_rows_do_not_leak() {
    run_with_stale("tiny-qwen3-moe", 1, 256, &[37], true);
    run_with_stale("tiny-mixtral", 2, 300, &[5, 290], true);
}

/// The cost variants (every KV tile read with a static trip count, masked past the
/// position; at most two chunks in flight per weight stream; the worst case of distinct experts)
/// compute the same step, bit for bit,
/// stale NaN rows past the positions included.
#[test]
fn cost_variants_give_the_same_step() {
    for (name, batch, context, positions) in
        [("tiny-qwen3-moe", 1, 2048, &[37][..]), ("tiny-mixtral", 2, 1024, &[5, 600][..])]
    {
        let needed = step(
            name,
            batch,
            context,
            positions,
            true,
            KvTiles::UpToPosition,
            Prefetch::Deep,
            1,
            ExpertFetch::Distinct,
        );
        for (kv, prefetch) in [
            (KvTiles::All, Prefetch::Deep),
            (KvTiles::UpToPosition, Prefetch::Single),
            (KvTiles::All, Prefetch::Single),
        ] {
            let variant = step(
                name,
                batch,
                context,
                positions,
                true,
                kv,
                prefetch,
                1,
                ExpertFetch::WorstCase,
            );
            assert!(
                needed.iter().zip(&variant).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {kv:?} {prefetch:?}: logits differ"
            );
        }
    }
}

/// K = 4 new tokens per sequence: the K rows are written (crossing a 16-row group and a
/// KV tile: positions 1022..1026 of tiles of 1024), nothing else changes, stale NaN rows
/// past the positions (the K new ones included until written) never leak, and reading
/// every tile gives the same step bit for bit.
#[test]
fn k_tokens_per_sequence_write_their_rows_and_match_the_cost_variant() {
    for (name, batch, context, positions) in
        [("tiny-qwen3-moe", 1, 256, &[37][..]), ("tiny-mixtral", 2, 2048, &[5, 1022][..])]
    {
        let needed = step(
            name,
            batch,
            context,
            positions,
            true,
            KvTiles::UpToPosition,
            Prefetch::Deep,
            4,
            ExpertFetch::Distinct,
        );
        let variant = step(
            name,
            batch,
            context,
            positions,
            true,
            KvTiles::All,
            Prefetch::Single,
            4,
            ExpertFetch::WorstCase,
        );
        assert!(
            needed.iter().zip(&variant).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the cost variant's logits differ"
        );
    }
}

/// Token ids and positions out of range (negative, past the vocabulary or the cache) are
/// clamped in the kernel: the interpreter's bounds checks see no access outside an array
/// (on a TPU, no DMA out of bounds), one token per sequence or K, each alone.
#[test]
fn token_ids_and_positions_out_of_range_stay_in_bounds() {
    for (name, batch, kt, bad_positions) in
        [("tiny-mixtral", 2, 1, [-7, i32::MAX]), ("tiny-qwen3-moe", 2, 4, [i32::MIN, 300])]
    {
        let options = PlanOptions { tokens_per_seq: kt, ..PlanOptions::new(Chip::V6e, batch, 256) };
        let rows = (batch * kt) as usize;
        let bad_tokens: Vec<i32> =
            (0..rows).map(|r| [-1, i32::MAX, 512, i32::MIN][r % 4]).collect();
        for (what, tokens, positions) in
            [("token ids", Some(bad_tokens), [3, 5]), ("positions", None, bad_positions)]
        {
            let (_, program, call, mut inputs) = setup(name, &options, &positions);
            if let Some(tokens) = tokens {
                inputs[0] = HostArray::from_i32(&[rows], &tokens);
            }
            program.run_with(&inputs, &call).unwrap_or_else(|e| panic!("{name}, {what}: {e}"));
        }
    }
}

/// A token row whose router logits are NaN (its embedding row is NaN): the kernel flags
/// that row in `router_non_finite` at every layer (NaN stays NaN), leaves the other rows
/// and the lanes past the layers at zero, and routes the NaN row to distinct experts in
/// range (one sequence: its two picks are the whole expert stream, so a repeated pick
/// would leave the stream's second expert id unwritten).
#[test]
fn non_finite_router_logits_are_flagged_by_row_and_layer_and_route_in_bounds() {
    for (name, batch) in [("tiny-qwen3-moe", 1), ("tiny-mixtral", 2)] {
        let (plan, program, call, mut inputs) =
            setup(name, &PlanOptions::new(Chip::V6e, batch, 256), &[3, 5][..batch as usize]);
        // Token row 0 is id 7: row 7 of the embedding's first 16-row group.
        let embed = plan.layout.index(OperandKind::Embed).unwrap();
        let shape = inputs[embed].shape.clone();
        let mut values = inputs[embed].to_f32();
        values[7 * shape[2]..8 * shape[2]].fill(f32::NAN);
        inputs[embed] = HostArray::bf16_from_f32(&shape, &values);
        let out = program.run_with(&inputs, &call).unwrap_or_else(|e| panic!("{name}: {e}"));
        let at =
            plan.layout.outputs().position(|o| o.kind == OperandKind::RouterNonFinite).unwrap();
        let flags = out[at].to_f32();
        let lanes = out[at].shape[1];
        for r in 0..out[at].shape[0] {
            for l in 0..lanes {
                let want = if r == 0 && l < plan.layers { 1.0 } else { 0.0 };
                assert_eq!(flags[r * lanes + l], want, "{name}: row {r}, lane {l}");
            }
        }
    }
}
