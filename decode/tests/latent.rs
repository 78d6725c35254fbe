//! The MLA stage's new position (`palladium_kernels::body::LatentRow::entry` and
//! `RopeBlock`) run in the interpreter against the model crate's stage form,
//! `palladium_model::mla::latent_entry` (held equal to transformers' expanded heads for
//! every rope layout): the latent RMS-normed without its weight over `kv_lora_rank` values
//! (64 padded to a lane tile, and 512), the rope key and the query's rope part rotated by
//! the model's layout with YaRN's inverse frequencies and factor, at positions past
//! `original_max_position_embeddings`; the padding lanes stay zero.

use palladium_array::{HostArray, round_bf16};
use palladium_dsl::__private::*;
use palladium_dsl::spec::Chip;
use palladium_kernels::body::{LatentRow, RopeBlock};
use palladium_kernels::reference::Rng;
use palladium_lowering::{LowerOptions, lower};
use palladium_model::ModelSpec;
use palladium_model::mla::{StageRotation, latent_entry};
use palladium_model::spec::AttentionForm;

const ROWS: usize = 16;
/// `kv_a_layernorm`'s eps (`DeepseekV3RMSNorm`'s default, whatever the config says).
const EPS: f64 = 1e-6;

/// A kernel: `kv_a f32[16, width]`, `positions f32[16, 128]` (lane 0), `q_rope f32[16,
/// 128]` in; the cache rows `f32[16, width]` and the rotated query blocks `f32[16, 128]` out.
fn latent_kernel(row: LatentRow, inv_freq: &[f32], factor: f64, rotation: StageRotation) -> String {
    let mut b = KernelBuilder::new("latent_entry");
    type NoMap = Option<Box<dyn FnOnce(&[Val], &[Ref]) -> i32>>;
    let width = row.width();
    for (name, role, lanes) in [
        ("kv_a", OperandRole::Input, width),
        ("positions", OperandRole::Input, 128),
        ("q_rope", OperandRole::Input, 128),
        ("entry", OperandRole::Output, width),
        ("q_rotated", OperandRole::Output, 128),
    ] {
        let shape = [ROWS as u64, lanes];
        b.operand(name, role, DType::F32, &shape, MemorySpace::Vmem, None, None as NoMap);
    }
    let sealed = b.seal().unwrap();
    let h: Vec<Ref> = sealed.handles.iter().cloned().map(|h| h.into_ref()).collect();
    let rope = RopeBlock::new(h[1].load((.., 0..1)), inv_freq, factor, rotation);
    h[3].store(.., row.entry(h[0].load(..), EPS, rope));
    h[4].store(.., rope.apply(h[2].load(..)));
    let kernel = sealed.finish().unwrap();
    lower(&kernel, &LowerOptions { chip: Chip::V6e }).unwrap().body
}

/// `fixture`'s MLA sizes and YaRN tables, its rope parts rotated by `rotation`.
fn check(fixture: &str, rotation: StageRotation, seed: u64) {
    let path = format!("{}/../fixtures/models/{fixture}.json", env!("CARGO_MANIFEST_DIR"));
    let spec = ModelSpec::from_path(path).unwrap();
    let AttentionForm::Mla(mla) = spec.attention.form else { panic!("{fixture}: not MLA") };
    let (rank, rope) = (mla.kv_lora_rank as usize, mla.qk_rope_head_dim as usize);
    let r = &spec.attention.rope;
    let (inv_freq, factor) = r.scaling.inv_freq(r.theta, r.rotary_dim, 1);
    let row = LatentRow { rank: rank as u64 };
    let (width, lanes) = (row.width() as usize, row.latent_lanes() as usize);
    let program = palladium_interpret::Module::parse(&latent_kernel(
        row,
        &inv_freq,
        f64::from(factor),
        rotation,
    ))
    .unwrap()
    .prepare()
    .unwrap();
    // bf16-representable inputs (the rotation's product takes its input in bf16, exactly
    // then); zero in the padding lanes, as the projection leaves them.
    let mut rng = Rng::new(seed);
    let mut kv_a = vec![0f32; ROWS * width];
    let mut q = vec![0f32; ROWS * 128];
    for r in 0..ROWS {
        for l in (0..rank).chain(lanes..lanes + rope) {
            kv_a[r * width + l] = round_bf16(rng.unit() * 2.0);
        }
        for l in 0..rope {
            q[r * 128 + l] = round_bf16(rng.unit());
        }
    }
    let positions: Vec<usize> = (0..ROWS).map(|_| rng.range(0, 8192) as usize).collect();
    let lane0: Vec<f32> = (0..ROWS * 128)
        .map(|i| if i % 128 == 0 { positions[i / 128] as f32 } else { 0.0 })
        .collect();
    let out = program
        .run(&[
            HostArray::from_f32(&[ROWS, width], &kv_a),
            HostArray::from_f32(&[ROWS, 128], &lane0),
            HostArray::from_f32(&[ROWS, 128], &q),
        ])
        .unwrap();
    let (entry, q_rotated) = (out[0].to_f32(), out[1].to_f32());
    let close = |got: f32, want: f32| (got - want).abs() <= 1e-5 * want.abs().max(1.0);
    for r in 0..ROWS {
        // Position p's tables as transformers computes them (f32 angles, times the factor).
        let angle: Vec<f32> = inv_freq.iter().map(|&f| positions[r] as f32 * f).collect();
        let cos: Vec<f32> = angle.iter().map(|a| a.cos() * factor).collect();
        let sin: Vec<f32> = angle.iter().map(|a| a.sin() * factor).collect();
        let dense: Vec<f32> =
            [&kv_a[r * width..r * width + rank], &kv_a[r * width + lanes..][..rope]].concat();
        let want = latent_entry(&dense, rank, EPS as f32, rotation, (&cos, &sin));
        let got = &entry[r * width..(r + 1) * width];
        for (l, &got) in got.iter().enumerate() {
            let want = match l {
                l if l < rank => want[l],
                l if (lanes..lanes + rope).contains(&l) => want[rank + l - lanes],
                _ => 0.0,
            };
            assert!(close(got, want), "{fixture} {rotation:?} row {r} lane {l}: {got} vs {want}");
        }
        let mut want_q = q[r * 128..r * 128 + rope].to_vec();
        rotation.apply(&mut want_q, &cos, &sin);
        for l in 0..128 {
            let want = want_q.get(l).copied().unwrap_or(0.0);
            let got = q_rotated[r * 128 + l];
            assert!(close(got, want), "{fixture} {rotation:?} q row {r} lane {l}: {got} vs {want}");
        }
    }
}

#[test]
fn the_latent_entry_body_norms_and_rotates_as_the_stage_form() {
    // The tiny checkpoints' rank 64 (padded to 128) and rope 16 with YaRN (factor 4 over
    // 1024 positions), both layouts; DeepSeek-V3's rank 512 and rope 64 (factor 40).
    check("tiny-deepseek-v3", StageRotation::Pairs, 1);
    check("tiny-deepseek-v3", StageRotation::Halves, 2);
    check("tiny-deepseek-v2", StageRotation::Pairs, 3);
    check("deepseek-v3", StageRotation::Pairs, 4);
}
