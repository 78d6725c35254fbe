use palladium_dsl::spec::Chip;
use palladium_fusion::{decode::Decoder, emit::emit, pack::pack, plan::{Plan, PlanOptions}};
use palladium_lowering::{LowerOptions, lower};
use palladium_model::ModelSpec;
use palladium_model::reference::{Precision, Reference};
use palladium_model::weights::Weights;

fn spec(name: &str) -> ModelSpec {
    ModelSpec::from_path(format!("{}/../fixtures/models/{name}.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn explore() {
    for name in ["tiny-qwen3-moe", "tiny-mixtral"] {
        let s = spec(name);
        let plan = Plan::new(&s, &PlanOptions { chip: Chip::V6e, batch: 1, context: 32, layers: None, check_hbm: true }).unwrap();
        let l = lower(&emit(&plan).unwrap(), &LowerOptions { chip: Chip::V6e }).unwrap();
        for seed in 0..3 {
            let w = Weights::random(&s, seed).unwrap();
            let mut dec = Decoder::new(&plan, &l.body, &l.call_json, pack(&s, &plan, &w).unwrap()).unwrap();
            let prompt = [1u32, 17, 300, 42];
            let g = dec.generate(&prompt, 8).unwrap();
            let rb = Reference::new(&s, &w, Precision::Bf16).unwrap();
            let rf = Reference::new(&s, &w, Precision::F32).unwrap();
            let tb = rb.teacher_force(&prompt, &g.generated_ids).unwrap();
            let tf = rf.teacher_force(&prompt, &g.generated_ids).unwrap();
            let a = g.agreement(&tb);
            let f = tf.agreement(&tb);
            let m = g.agreement(&tf);
            println!("{name} seed {seed}: ids {:?} ref {:?}\n  mk vs bf16 {a:?}\n  f32 vs bf16 {f:?}\n  mk vs f32 {m:?}  interp {:.2}s/{} runs", g.generated_ids, tb.generated_ids, dec.elapsed.as_secs_f64(), dec.runs);
            for (i, (x, y)) in g.steps.iter().zip(&tb.steps).enumerate() {
                let d = x.logits.iter().zip(&y.logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let sc = y.logits.iter().map(|a| a.abs()).fold(0f32, f32::max);
                print!(" [{i}: {d:.3}/{sc:.2}]");
            }
            println!();
        }
    }
}
