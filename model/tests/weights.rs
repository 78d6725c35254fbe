//! `Weights`: layout, seeded random init, safetensors round trip and errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use palladium_array::round_bf16;
use palladium_model::ModelSpec;
use palladium_model::weights::{SaveDtype, Weights, WeightsError, tensor_layout};
use safetensors::{Dtype, tensor::TensorView};

fn spec(name: &str) -> ModelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models").join(name);
    ModelSpec::from_path(path).unwrap()
}

fn qwen() -> ModelSpec {
    spec("tiny-qwen3-moe.json")
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("weights-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn layout_uses_hugging_face_names_and_shapes() {
    let s = qwen();
    let layout = tensor_layout(&s).unwrap();
    let shapes: HashMap<&str, &[usize]> =
        layout.iter().map(|t| (t.name.as_str(), t.shape.as_slice())).collect();
    let want: &[(&str, &[usize])] = &[
        ("model.embed_tokens.weight", &[512, 256]),
        ("model.layers.0.input_layernorm.weight", &[256]),
        ("model.layers.0.self_attn.q_proj.weight", &[256, 256]),
        ("model.layers.0.self_attn.k_proj.weight", &[128, 256]),
        ("model.layers.0.self_attn.v_proj.weight", &[128, 256]),
        ("model.layers.0.self_attn.o_proj.weight", &[256, 256]),
        ("model.layers.0.self_attn.q_norm.weight", &[64]),
        ("model.layers.0.self_attn.k_norm.weight", &[64]),
        ("model.layers.3.post_attention_layernorm.weight", &[256]),
        ("model.layers.3.mlp.gate.weight", &[8, 256]),
        ("model.layers.3.mlp.experts.7.gate_proj.weight", &[128, 256]),
        ("model.layers.3.mlp.experts.7.up_proj.weight", &[128, 256]),
        ("model.layers.3.mlp.experts.7.down_proj.weight", &[256, 128]),
        ("model.norm.weight", &[256]),
        ("lm_head.weight", &[512, 256]),
    ];
    for (n, shape) in want {
        assert_eq!(shapes.get(n), Some(shape), "{n}");
    }
    // 1 embed + 4 * (2 norms + 4 proj + 2 qk norms + router + 8*3 experts) + norm + head
    assert_eq!(layout.len(), 1 + 4 * (2 + 4 + 2 + 1 + 24) + 2);
    assert!(!shapes.contains_key("model.layers.0.self_attn.q_proj.bias"));

    let m = spec("tiny-mixtral.json");
    let names: Vec<String> = tensor_layout(&m).unwrap().into_iter().map(|t| t.name).collect();
    for n in [
        "model.layers.1.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.experts.0.w1.weight",
        "model.layers.1.block_sparse_moe.experts.0.w2.weight",
        "model.layers.1.block_sparse_moe.experts.0.w3.weight",
    ] {
        assert!(names.iter().any(|x| x == n), "{n}");
    }
    assert!(!names.iter().any(|x| x.contains("q_norm")));
}

#[test]
fn layout_follows_config_options() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen3-moe.json"),
    )
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["attention_bias"] = true.into();
    v["mlp_only_layers"] = serde_json::json!([1]);
    v["tie_word_embeddings"] = true.into();
    let s = ModelSpec::from_json(&v).unwrap();
    let layout = tensor_layout(&s).unwrap();
    let has = |n: &str| layout.iter().any(|t| t.name == n);
    assert!(has("model.layers.0.self_attn.q_proj.bias"));
    assert!(has("model.layers.0.self_attn.o_proj.bias"));
    assert!(has("model.layers.1.mlp.gate_proj.weight"));
    assert!(!has("model.layers.1.mlp.gate.weight"));
    assert!(!has("lm_head.weight"));
    let dense = layout.iter().find(|t| t.name == "model.layers.1.mlp.down_proj.weight").unwrap();
    assert_eq!(dense.shape, vec![256, 512]);
}

#[test]
fn random_weights_are_seeded_bf16_and_well_scaled() {
    let s = qwen();
    let a = Weights::random(&s, 1).unwrap();
    let b = Weights::random(&s, 1).unwrap();
    let c = Weights::random(&s, 2).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.is_bf16_valued());
    assert_eq!(a.len(), tensor_layout(&s).unwrap().len());
    for (name, t) in a.iter() {
        assert!(t.data.iter().any(|&x| x != 0.0), "{name} is all zero");
        assert!(t.data.iter().all(|x| x.is_finite()), "{name}");
        let n = t.data.len() as f64;
        let mean = t.data.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let std = (t.data.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n).sqrt();
        if name.ends_with("norm.weight") {
            assert!(t.data.iter().all(|&x| (0.79..=1.21).contains(&x)), "{name}");
        } else if name == "model.embed_tokens.weight" {
            assert!((std - 1.0).abs() < 0.05, "{name}: std {std}");
        } else {
            let want = 1.0 / (t.shape[1] as f64).sqrt();
            assert!((std / want - 1.0).abs() < 0.1, "{name}: std {std}, want {want}");
        }
    }
    // Two experts of one layer differ (distinct streams per tensor).
    assert_ne!(
        a.get("model.layers.0.mlp.experts.0.up_proj.weight"),
        a.get("model.layers.0.mlp.experts.1.up_proj.weight")
    );
}

#[test]
fn safetensors_round_trip_bf16_and_f32() {
    let s = qwen();
    let d = tmp("roundtrip");
    let w = Weights::random(&s, 3).unwrap();
    let p = d.join("model.safetensors");
    w.save(&p, SaveDtype::BFloat16).unwrap();
    assert_eq!(Weights::load(&s, &p).unwrap(), w);
    // The directory form finds the file too.
    assert_eq!(Weights::load(&s, &d).unwrap(), w);
    // Only the file is left: no temporary.
    let entries: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert_eq!(entries.len(), 1);
    // bf16 file size: 8-byte length + header + 2 bytes per parameter.
    let len = std::fs::metadata(&p).unwrap().len() as usize;
    assert!(len > 2 * w.num_params() && len < 2 * w.num_params() + 64 * 1024);

    // f32 keeps values that bf16 cannot hold; a bf16 save rounds them.
    let mut w32 = w.clone();
    w32.get_mut("model.norm.weight").unwrap()[0] = 1.0 + 1e-6;
    assert!(!w32.is_bf16_valued());
    let p32 = d.join("f32.safetensors");
    w32.save(&p32, SaveDtype::Float32).unwrap();
    let back = Weights::load(&s, &p32).unwrap();
    assert_eq!(back, w32);
    w32.save(&p32, SaveDtype::BFloat16).unwrap();
    let back = Weights::load(&s, &p32).unwrap();
    assert_eq!(back.get("model.norm.weight").unwrap().data[0], round_bf16(1.0 + 1e-6));
    assert!(back.is_bf16_valued());

    let m = spec("tiny-mixtral.json");
    let wm = Weights::random(&m, 4).unwrap();
    let bytes = wm.to_safetensors_bytes(SaveDtype::BFloat16).unwrap();
    assert_eq!(Weights::from_safetensors(&m, &[(Path::new("mem"), &bytes)]).unwrap(), wm);
    // A Qwen3 checkpoint is not a Mixtral one.
    let err = Weights::load(&m, &p).unwrap_err();
    assert!(matches!(err, WeightsError::Unexpected { .. }), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sharded_checkpoint_with_index() {
    let s = qwen();
    let w = Weights::random(&s, 5).unwrap();
    let d = sharded("sharded", &w, |_| {});
    assert_eq!(Weights::load(&s, &d).unwrap(), w);
    let _ = std::fs::remove_dir_all(&d);
}

/// Writes a safetensors file of `w`'s tensors, edited by `edit` (name → (dtype, shape, bytes)).
fn write_edited(
    w: &Weights,
    path: &Path,
    edit: impl Fn(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) {
    let mut ts: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = w
        .iter()
        .map(|(n, t)| {
            (
                n.to_string(),
                Dtype::F32,
                t.shape.clone(),
                t.data.iter().flat_map(|&x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    edit(&mut ts);
    let views: Vec<(String, TensorView<'_>)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn load_errors_name_the_tensor() {
    let s = qwen();
    let d = tmp("errors");
    let w = Weights::random(&s, 6).unwrap();
    let p = d.join("bad.safetensors");
    let victim = "model.layers.2.mlp.experts.5.down_proj.weight";

    write_edited(&w, &p, |ts| ts.retain(|t| t.0 != victim));
    let e = Weights::load(&s, &p).unwrap_err();
    assert!(matches!(e, WeightsError::Missing { .. }), "{e}");
    assert_eq!(e.tensor(), Some(victim));
    assert!(e.to_string().contains(victim), "{e}");
    assert!(e.to_string().contains("[256, 128]"), "{e}");

    write_edited(&w, &p, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == victim).unwrap();
        t.2 = vec![128, 256];
    });
    let e = Weights::load(&s, &p).unwrap_err();
    assert!(matches!(e, WeightsError::Shape { .. }), "{e}");
    assert!(e.to_string().contains(victim) && e.to_string().contains("[128, 256]"), "{e}");

    write_edited(&w, &p, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == victim).unwrap();
        t.1 = Dtype::I32;
    });
    let e = Weights::load(&s, &p).unwrap_err();
    assert!(matches!(e, WeightsError::Dtype { .. }), "{e}");
    assert!(e.to_string().contains(victim) && e.to_string().contains("I32"), "{e}");

    write_edited(&w, &p, |ts| {
        ts.push(("model.layers.9.mlp.gate.weight".into(), Dtype::F32, vec![1], vec![0; 4]));
    });
    let e = Weights::load(&s, &p).unwrap_err();
    assert!(matches!(e, WeightsError::Unexpected { .. }), "{e}");
    assert_eq!(e.tensor(), Some("model.layers.9.mlp.gate.weight"));

    // An `inv_freq` buffer from an old checkpoint is ignored.
    write_edited(&w, &p, |ts| {
        ts.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            Dtype::F32,
            vec![32],
            vec![0; 128],
        ));
    });
    assert_eq!(Weights::load(&s, &p).unwrap(), w);

    std::fs::write(&p, b"not a safetensors file").unwrap();
    let e = Weights::load(&s, &p).unwrap_err();
    assert!(matches!(e, WeightsError::Format { .. }), "{e}");
    let e = Weights::load(&s, d.join("absent.safetensors")).unwrap_err();
    assert!(matches!(e, WeightsError::Io { .. }), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn failed_save_leaves_nothing_behind() {
    let s = qwen();
    let d = tmp("failsave");
    let w = Weights::random(&s, 7).unwrap();
    // The target is a directory: the rename fails, the temporary is removed.
    let target = d.join("model.safetensors");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    let e = w.save(&target, SaveDtype::BFloat16).unwrap_err();
    assert!(matches!(e, WeightsError::Io { .. }), "{e}");
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["model.safetensors".to_string()]);
    // A save into a directory that does not exist fails and creates nothing.
    let e = w.save(d.join("no/such/dir/m.safetensors"), SaveDtype::BFloat16).unwrap_err();
    assert!(matches!(e, WeightsError::Io { .. }), "{e}");
    // Overwriting an existing file replaces it whole.
    let p = d.join("m.safetensors");
    std::fs::write(&p, b"old").unwrap();
    w.save(&p, SaveDtype::BFloat16).unwrap();
    assert_eq!(Weights::load(&s, &p).unwrap(), w);
    let _ = std::fs::remove_dir_all(&d);
}

/// The bytes of a safetensors file whose header is `header` (a JSON object) and data `data`.
fn raw_safetensors(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn non_finite_weights_are_refused_naming_the_tensor_and_the_first_bad_index() {
    let s = qwen();
    let d = tmp("nonfinite");
    let p = d.join("model.safetensors");
    for (victim, index, value) in [
        ("model.layers.1.self_attn.q_proj.weight", 3 * 256 + 7, f32::NAN),
        ("model.layers.0.mlp.experts.4.gate_proj.weight", 0, f32::INFINITY),
        ("model.embed_tokens.weight", 511 * 256 + 255, f32::NEG_INFINITY),
        ("lm_head.weight", 1000, f32::NAN),
        ("model.norm.weight", 9, f32::INFINITY),
    ] {
        let mut w = Weights::random(&s, 8).unwrap();
        w.get_mut(victim).unwrap()[index] = value;
        w.get_mut(victim).unwrap()[index + 1..].iter_mut().take(3).for_each(|x| *x = f32::NAN);
        for dtype in [SaveDtype::BFloat16, SaveDtype::Float32] {
            w.save(&p, dtype).unwrap();
            let e = Weights::load(&s, &p).unwrap_err();
            assert!(matches!(e, WeightsError::NonFinite { .. }), "{e}");
            assert_eq!(e.tensor(), Some(victim));
            let shape = &w.get(victim).unwrap().shape;
            let want = if shape.len() == 2 {
                format!("[{}, {}]", index / shape[1], index % shape[1])
            } else {
                format!("[{index}]")
            };
            assert!(e.to_string().contains(&format!("at index {want}")), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn header_sizes_that_do_not_add_up_name_the_tensor() {
    let s = qwen();
    let name = "model.norm.weight";
    let entry = |shape: serde_json::Value, offsets: serde_json::Value| serde_json::json!({ name: {"dtype": "F32", "shape": shape, "data_offsets": offsets} });
    let cases = [
        (
            entry(serde_json::json!([256]), serde_json::json!([0, 1000])),
            vec![0u8; 1024],
            "needs 1024 bytes, data_offsets [0, 1000] hold 1000",
        ),
        (
            entry(serde_json::json!([256]), serde_json::json!([0, 1024])),
            vec![0u8; 100],
            "outside the file's 100 data bytes",
        ),
        (entry(serde_json::json!([256]), serde_json::json!([8, 4])), vec![0u8; 1024], "outside"),
        (
            entry(serde_json::json!([u64::MAX, 4]), serde_json::json!([0, 16])),
            vec![0u8; 16],
            "more than 2^64",
        ),
        (entry(serde_json::json!([-1]), serde_json::json!([0, 4])), vec![0u8; 4], "\"shape\""),
        (entry(serde_json::json!([256]), serde_json::json!("x")), vec![0u8; 4], "\"data_offsets\""),
        (
            serde_json::json!({ name: {"shape": [256], "data_offsets": [0, 1024]} }),
            vec![0u8; 1024],
            "\"dtype\"",
        ),
    ];
    for (header, data, want) in cases {
        let bytes = raw_safetensors(&header, &data);
        let e = Weights::from_safetensors(&s, &[(Path::new("m.safetensors"), &bytes)]).unwrap_err();
        assert!(matches!(e, WeightsError::Header { .. }), "{header}: {e}");
        assert_eq!(e.tensor(), Some(name), "{header}: {e}");
        assert!(
            e.to_string().contains(want) && e.to_string().contains("m.safetensors"),
            "{header}: {e}"
        );
    }
    // Two tensors sharing bytes.
    let header = serde_json::json!({
        "model.norm.weight": {"dtype": "F32", "shape": [256], "data_offsets": [0, 1024]},
        "lm_head.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [1020, 1024]},
    });
    let bytes = raw_safetensors(&header, &[0u8; 1024]);
    let e = Weights::from_safetensors(&s, &[(Path::new("m"), &bytes)]).unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
}

#[test]
fn truncated_and_empty_files_say_so() {
    let s = qwen();
    let bytes = Weights::random(&s, 9).unwrap().to_safetensors_bytes(SaveDtype::BFloat16).unwrap();
    let p = Path::new("m.safetensors");
    let e = Weights::from_safetensors(&s, &[(p, &[])]).unwrap_err();
    assert!(e.to_string().contains("the file is empty"), "{e}");
    let e = Weights::from_safetensors(&s, &[(p, &bytes[..5])]).unwrap_err();
    assert!(e.to_string().contains("too short"), "{e}");
    let e = Weights::from_safetensors(&s, &[(p, &bytes[..100])]).unwrap_err();
    assert!(e.to_string().contains("past the end of the file"), "{e}");
    // Cut inside the data: the tensor whose bytes are missing is named.
    let e = Weights::from_safetensors(&s, &[(p, &bytes[..bytes.len() - 10])]).unwrap_err();
    assert!(matches!(e, WeightsError::Header { .. }) && e.to_string().contains("truncated"), "{e}");
}

#[test]
fn shard_paths_stay_inside_the_checkpoint_folder() {
    let s = qwen();
    let d = tmp("escape");
    for shard in ["../../etc/passwd", "/etc/passwd", "sub/../../x.safetensors", ""] {
        let index = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let e = Weights::load(&s, &d).unwrap_err();
        assert!(matches!(e, WeightsError::Format { .. }), "{shard}: {e}");
        assert!(
            e.to_string().contains("inside the checkpoint folder")
                && e.to_string().contains("model.norm.weight"),
            "{shard}: {e}"
        );
    }
    let index = serde_json::json!({"weight_map": {"model.norm.weight": 3}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = Weights::load(&s, &d).unwrap_err();
    assert!(e.to_string().contains("not a file name"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A tensor name listed twice in a header (which `serde_json` would read as its last entry
/// alone) is refused, naming the name and the file, whatever the two entries hold.
#[test]
fn duplicate_tensor_names_in_a_header_are_refused() {
    let s = qwen();
    let bytes = Weights::random(&s, 10).unwrap().to_safetensors_bytes(SaveDtype::BFloat16).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let (header, data) = (std::str::from_utf8(&bytes[8..8 + n]).unwrap(), &bytes[8 + n..]);
    let entries = serde_json::from_str::<serde_json::Value>(header).unwrap();
    // The same entry again, and one pointing at another tensor's bytes; listed first, so
    // its second listing is the first (sorted) or the last entry of the original header.
    let other = &entries["model.layers.0.input_layernorm.weight"];
    for (name, repeated) in [
        ("lm_head.weight", &entries["lm_head.weight"]),
        ("model.norm.weight", &entries["model.norm.weight"]),
        ("model.norm.weight", other),
    ] {
        let text = format!("{{\"{name}\":{repeated},{}", &header.trim_end()[1..]);
        let mut file = (text.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(text.as_bytes());
        file.extend_from_slice(data);
        let e = Weights::from_safetensors(&s, &[(Path::new("m.safetensors"), &file)]).unwrap_err();
        assert_eq!(e.tensor(), Some(name), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("duplicate") && msg.contains("m.safetensors"), "{msg}");
    }
}

/// One shard's tensors: name, bytes, shape.
type Shard = Vec<(String, Vec<u8>, Vec<usize>)>;

/// Writes `w` as two F32 shards (tensors alternating) and an index whose `weight_map` is
/// the truth edited by `edit`; returns the folder.
fn sharded(
    name: &str,
    w: &Weights,
    edit: impl Fn(&mut serde_json::Map<String, serde_json::Value>),
) -> PathBuf {
    let d = tmp(name);
    let mut shards: [Shard; 2] = Default::default();
    let mut map = serde_json::Map::new();
    for (i, (n, t)) in w.iter().enumerate() {
        let bytes = t.data.iter().flat_map(|&x| x.to_le_bytes()).collect();
        map.insert(n.to_string(), format!("model-{:05}-of-00002.safetensors", i % 2 + 1).into());
        shards[i % 2].push((n.to_string(), bytes, t.shape.clone()));
    }
    for (i, shard) in shards.iter().enumerate() {
        let views: Vec<(String, TensorView<'_>)> = shard
            .iter()
            .map(|(n, b, s)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(d.join(format!("model-{:05}-of-00002.safetensors", i + 1)), bytes).unwrap();
    }
    edit(&mut map);
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    d
}

/// A `weight_map` that disagrees with the shards is refused, naming the tensor, the index
/// and the shards: a tensor mapped to a shard that lacks it, a tensor of a shard the map
/// leaves out, a shard that does not exist, a tensor no shard holds.
#[test]
fn shard_index_disagreements_name_the_tensor_the_index_and_the_shard() {
    let s = qwen();
    let w = Weights::random(&s, 11).unwrap();
    // In the first shard (index 0 of the checkpoint order): the embedding.
    let victim = "model.embed_tokens.weight";
    let (one, two) = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    type Edit = Box<dyn Fn(&mut serde_json::Map<String, serde_json::Value>)>;
    let cases: Vec<(Edit, &str, Vec<&str>)> = vec![
        (
            Box::new(move |m| {
                m.insert(victim.into(), two.into());
            }),
            victim,
            vec![two, one, "but it is in"],
        ),
        (
            Box::new(move |m| {
                m.remove(victim);
            }),
            victim,
            vec![one, "weight_map does not list it"],
        ),
        (
            Box::new(move |m| {
                m.insert(victim.into(), "model-00003-of-00002.safetensors".into());
            }),
            victim,
            vec!["model-00003-of-00002.safetensors", "cannot be read"],
        ),
        (
            Box::new(move |m| {
                m.insert("model.layers.0.mlp.gate.bias".into(), one.into());
            }),
            "model.layers.0.mlp.gate.bias",
            vec![one, "does not hold it"],
        ),
    ];
    for (i, (edit, name, texts)) in cases.into_iter().enumerate() {
        let d = sharded(&format!("index-{i}"), &w, edit);
        let e = Weights::load(&s, &d).unwrap_err();
        assert!(matches!(e, WeightsError::Index { .. }), "{e}");
        assert_eq!(e.tensor(), Some(name), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("model.safetensors.index.json"), "{msg}");
        for t in texts {
            assert!(msg.contains(t), "{t}: {msg}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// GLM-4.5's checkpoints carry the multi-token-prediction layer after the last decoder layer
/// (`model.layers.{num_hidden_layers}.*`), which transformers skips on load: so do we. A
/// layer past it is still an unexpected tensor.
#[test]
fn glm4_moe_mtp_layer_is_skipped() {
    let with_layers = |n: u64| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-glm4-moe.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["num_hidden_layers"] = n.into();
        ModelSpec::from_json(&v).unwrap()
    };
    let s = with_layers(4);
    let bytes = |n| {
        Weights::random(&with_layers(n), 3)
            .unwrap()
            .to_safetensors_bytes(SaveDtype::BFloat16)
            .unwrap()
    };
    let five = bytes(5);
    let w = Weights::from_safetensors(&s, &[(Path::new("mem"), &five)]).unwrap();
    assert_eq!(w, Weights::random(&s, 3).unwrap());
    let six = bytes(6);
    let e = Weights::from_safetensors(&s, &[(Path::new("mem"), &six)]).unwrap_err();
    assert!(e.tensor().is_some_and(|t| t.starts_with("model.layers.5.")), "{e}");
}

/// gpt-oss's MXFP4 experts as shipped: `<name>_blocks` / `<name>_scales` decoded on load
/// (value `[e, i, o]` from byte `blocks[e, o, i / 32, i % 32 / 2]`, low nibble at even `i`,
/// times `2^(scale - 127)`), and a bad part refused naming it.
#[test]
fn mxfp4_experts_decode_and_bad_parts_are_named() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-gpt-oss.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["num_hidden_layers"] = 1.into();
    v["layer_types"] = serde_json::json!(["sliding_attention"]);
    let plain = ModelSpec::from_json(&v).unwrap();
    v["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"});
    let s = ModelSpec::from_json(&v).unwrap();
    let w = Weights::random(&plain, 5).unwrap();
    let gate_up = "model.layers.0.mlp.experts.gate_up_proj";
    let (experts, hidden, two_i) = (8, 192, 256);
    // Every byte 0x2B (low nibble 0xB: -1.5, high 0x2: 1.0); expert 3's scales 129 (x4),
    // the others 127 (x1); output row 5 of expert 0 scale 126 (x0.5).
    let groups = hidden / 32;
    let blocks = vec![0x2Bu8; experts * two_i * groups * 16];
    let mut scales = vec![127u8; experts * two_i * groups];
    scales[3 * two_i * groups..4 * two_i * groups].fill(129);
    scales[5 * groups..6 * groups].fill(126);
    let file = |blocks: &[u8], blocks_dtype: &str, scales: &[u8], with_scales: bool| {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        let mut put = |name: &str, dtype: &str, shape: Vec<usize>, bytes: &[u8]| {
            let start = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.into(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
            );
        };
        for (name, t) in w.iter() {
            if name == gate_up {
                put(
                    &format!("{name}_blocks"),
                    blocks_dtype,
                    vec![experts, two_i, groups, 16],
                    blocks,
                );
                if with_scales {
                    put(&format!("{name}_scales"), "U8", vec![experts, two_i, groups], scales);
                }
            } else {
                let bytes: Vec<u8> = t
                    .data
                    .iter()
                    .flat_map(|&x| palladium_array::f32_to_bf16(x).to_le_bytes())
                    .collect();
                put(name, "BF16", t.shape.clone(), &bytes);
            }
        }
        raw_safetensors(&serde_json::Value::Object(header), &data)
    };
    let load = |bytes: &[u8]| Weights::from_safetensors(&s, &[(Path::new("mem"), bytes)]);
    let decoded = load(&file(&blocks, "U8", &scales, true)).unwrap();
    let t = decoded.get(gate_up).unwrap();
    assert_eq!(t.shape, [experts, hidden, two_i]);
    let at = |e: usize, i: usize, o: usize| t.data[(e * hidden + i) * two_i + o];
    assert_eq!((at(0, 0, 0), at(0, 1, 0), at(0, 191, 255)), (-1.5, 1.0, 1.0));
    assert_eq!((at(3, 0, 7), at(3, 63, 7)), (-6.0, 4.0));
    assert_eq!((at(0, 2, 5), at(0, 3, 5), at(1, 2, 5)), (-0.75, 0.5, -1.5));
    // The rest is what the plain tensors were.
    assert_eq!(decoded.get("model.embed_tokens.weight"), w.get("model.embed_tokens.weight"));
    // e8m0's 0xFF is NaN.
    let mut nan = scales.clone();
    nan[groups + 2] = 0xFF;
    let e = load(&file(&blocks, "U8", &nan, true)).unwrap_err();
    assert!(matches!(e, WeightsError::NonFinite { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("{gate_up}_scales")) && e.to_string().contains("[0, 1, 2]"),
        "{e}"
    );
    let e = load(&file(&blocks, "U8", &scales, false)).unwrap_err();
    assert!(matches!(e, WeightsError::Missing { .. }) && e.to_string().contains("_scales"), "{e}");
    let e = load(&file(&blocks, "I8", &scales, true)).unwrap_err();
    assert!(e.to_string().contains("stored as I8; MXFP4 blocks are U8"), "{e}");
}

/// Llama 4 as shipped is multimodal: its text model under `language_model.`, read through
/// `text_config`; the vision tensors are skipped, and the text model computes what the same
/// weights do unprefixed.
#[test]
fn multimodal_llama4_reads_its_language_model() {
    use palladium_model::reference::{Precision, Reference};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-llama4.json");
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let outer = serde_json::json!({
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": text,
    });
    let plain = ModelSpec::from_json(&text).unwrap();
    let s = ModelSpec::from_json(&outer).unwrap();
    assert_eq!(s.layers, plain.layers);
    let w = Weights::random(&s, 4).unwrap();
    assert!(w.iter().all(|(n, _)| n.starts_with("language_model.")));
    let lm = w.to_safetensors_bytes(SaveDtype::BFloat16).unwrap();
    let vision = raw_safetensors(
        &serde_json::json!({"vision_model.patch_embedding.weight":
            {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}),
        &[0; 8],
    );
    let files = [(Path::new("lm"), &lm[..]), (Path::new("vision"), &vision[..])];
    let loaded = Weights::from_safetensors(&s, &files).unwrap();
    assert_eq!(loaded, w);
    // The same values under the text model's own names.
    let unprefixed = w.to_safetensors_bytes(SaveDtype::BFloat16).unwrap();
    let header_len = u64::from_le_bytes(unprefixed[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&unprefixed[8..8 + header_len]).unwrap();
    let renamed = header.replace("\"language_model.", "\"");
    let mut bytes = (renamed.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(renamed.as_bytes());
    bytes.extend_from_slice(&unprefixed[8 + header_len..]);
    let w_plain = Weights::from_safetensors(&plain, &[(Path::new("plain"), &bytes[..])]).unwrap();
    let run = |spec: &ModelSpec, w: &Weights| {
        Reference::new(spec, w, Precision::Bf16).unwrap().generate(&[3, 1, 4], 3).unwrap()
    };
    assert_eq!(run(&s, &loaded), run(&plain, &w_plain));
}
