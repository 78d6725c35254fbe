//! The megakernel's router body, `palladium_kernels::body::Routing::choosing`, run in the
//! interpreter against the model crate's `moe::route_with` (the reference forward pass's
//! routing, checked against transformers): every routing option the router stage takes as
//! data (softmax or sigmoid, renormalised or raw, `DeepSeek`-V3's correction bias, expert
//! groups and `routed_scaling_factor`), on logits drawn from a few values so that scores,
//! choice scores and group scores tie: the ids must be the reference's exactly (ties to the
//! lower id and group, as `torch.topk` on the tests), the weights within f32 rounding.

use palladium_array::HostArray;
use palladium_dsl::__private::*;
use palladium_dsl::spec::Chip;
use palladium_kernels::body::{Choice, Routing};
use palladium_kernels::reference::Rng;
use palladium_lowering::{LowerOptions, lower};
use palladium_model::moe::{self, route_with};
use palladium_model::spec::{ExpertGroups, GroupScore, RouterScoring, TopKWeights};

const ROWS: u64 = 16;
const WIDTH: u64 = 128;

/// One routing configuration: `experts` of the `WIDTH` columns real, `top_k`, and the
/// choice's options (the bias always given; `None` leaves it out).
#[derive(Clone, Copy, Debug)]
struct Case {
    experts: u64,
    top_k: u64,
    sigmoid: bool,
    renormalize: bool,
    bias: bool,
    groups: Option<ExpertGroups>,
    scaling: f64,
}

/// `n_group` groups scored by their best two, the best `topk_group` kept.
fn groups(groups: u64, chosen_groups: u64) -> Option<ExpertGroups> {
    Some(ExpertGroups { groups, chosen_groups, score: GroupScore::TopTwoSum })
}

/// A kernel: `logits f32[16, 128]`, `bias f32[8, 128]` (row 0) in; the routing's ids and
/// weights in the first `top_k` lanes of `i32[16, 128]` and `f32[16, 128]` out.
fn routing_kernel(c: Case) -> String {
    let mut b = KernelBuilder::new("routing");
    type NoMap = Option<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>;
    let vm = MemorySpace::Vmem;
    for (name, role, dtype, rows) in [
        ("logits", OperandRole::Input, DType::F32, ROWS),
        ("bias", OperandRole::Input, DType::F32, 8),
        ("ids", OperandRole::Output, DType::I32, ROWS),
        ("weights", OperandRole::Output, DType::F32, ROWS),
    ] {
        b.operand(name, role, dtype, &[rows, WIDTH], vm, None, None as NoMap);
    }
    let sealed = b.seal().unwrap();
    let h: Vec<Ref> = sealed.handles.iter().cloned().map(|h| h.into_ref()).collect();
    let choice = Choice {
        correction_bias: c.bias.then(|| h[1].load((0..1, ..))),
        groups: c.groups,
        scaling: c.scaling,
    };
    let r = Routing::choosing(h[0].load(..), c.experts, c.top_k, c.sigmoid, c.renormalize, choice);
    h[2].store(.., 0);
    h[3].store(.., 0.0);
    h[2].store((.., 0..c.top_k), r.ids);
    h[3].store((.., 0..c.top_k), r.weights);
    let kernel = sealed.finish().unwrap();
    lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap().body
}

fn check(c: Case, seed: u64) {
    let program =
        palladium_interpret::Module::parse(&routing_kernel(c)).unwrap().prepare().unwrap();
    let mut rng = Rng::new(seed);
    let (e, w) = (c.experts as usize, WIDTH as usize);
    // Even seeds: logits and biases from a few values, ties everywhere; odd seeds: spread
    // logits and small biases, as a model's.
    let (logits, bias): (Vec<f32>, Vec<f32>) = if seed.is_multiple_of(2) {
        (
            (0..ROWS as usize * w).map(|_| rng.range(-4, 4) as f32 * 0.5).collect(),
            (0..8 * w).map(|_| rng.range(-2, 2) as f32 * 0.25).collect(),
        )
    } else {
        (
            (0..ROWS as usize * w).map(|_| rng.unit() * 0.5).collect(),
            (0..8 * w).map(|_| rng.unit() * 0.05).collect(),
        )
    };
    let out = program
        .run(&[
            HostArray::from_f32(&[ROWS as usize, w], &logits),
            HostArray::from_f32(&[8, w], &bias),
        ])
        .unwrap();
    let (ids, weights) = (out[0].to_i32(), out[1].to_f32());
    let scoring = if c.sigmoid { RouterScoring::Sigmoid } else { RouterScoring::Softmax };
    let top = if c.renormalize { TopKWeights::Renormalized } else { TopKWeights::Raw };
    let choice = moe::Choice {
        correction_bias: c.bias.then_some(&bias[..e]),
        groups: c.groups,
        scaling: c.scaling as f32,
    };
    for r in 0..ROWS as usize {
        let want = route_with(&logits[r * w..r * w + e], c.top_k as usize, scoring, top, &choice);
        for (j, &(id, weight)) in want.chosen.iter().enumerate() {
            let (got_id, got) = (ids[r * w + j], weights[r * w + j]);
            assert_eq!(got_id as usize, id, "{c:?} seed {seed} row {r} slot {j}: {want:?}");
            assert!(
                (got - weight).abs() <= 1e-6 * weight.abs().max(1.0),
                "{c:?} seed {seed} row {r} slot {j}: weight {got}, the reference's {weight}"
            );
        }
    }
}

#[test]
fn the_router_body_routes_as_the_reference_with_every_option() {
    let plain = Case {
        experts: 8,
        top_k: 2,
        sigmoid: false,
        renormalize: true,
        bias: false,
        groups: None,
        scaling: 1.0,
    };
    let deepseek = Case { sigmoid: true, bias: true, groups: groups(2, 1), scaling: 2.5, ..plain };
    for (i, c) in [
        plain,
        Case { sigmoid: true, renormalize: false, ..plain },
        deepseek,
        Case { groups: None, ..deepseek },
        Case { bias: false, ..deepseek },
        Case { renormalize: false, scaling: 1.0, ..deepseek },
        // DeepSeek-V3's shape, scaled down: 8 groups, 4 kept, top-8 of 64.
        Case { experts: 64, top_k: 8, groups: groups(8, 4), ..deepseek },
        // Top-k past the kept group's experts: dropped experts (choice score 0) are chosen.
        Case { top_k: 6, ..deepseek },
        // DeepSeek-V2's group_limited_greedy: softmax, groups scored by their best, raw.
        Case {
            sigmoid: false,
            bias: false,
            renormalize: false,
            groups: Some(ExpertGroups { groups: 4, chosen_groups: 2, score: GroupScore::Max }),
            ..deepseek
        },
    ]
    .into_iter()
    .enumerate()
    {
        check(c, 100 + 2 * i as u64);
        check(c, 101 + 2 * i as u64);
    }
}
