//! Model weights keyed by the family's Hugging Face tensor names, with the shapes a
//! [`ModelSpec`] implies, a seeded random initialisation, and safetensors reading and writing.
//!
//! Tensor names and shapes ([`tensor_layout`]) follow the checkpoints on the Hugging Face hub
//! (`nn.Linear` weights are `[out_features, in_features]`):
//!
//! | tensor | shape |
//! |---|---|
//! | `model.embed_tokens.weight` | `[vocab, hidden]` |
//! | `model.layers.{i}.input_layernorm.weight` | `[hidden]` |
//! | `model.layers.{i}.self_attn.q_proj.weight` (`.bias` with `attention_bias`) | `[heads*head_dim, hidden]` |
//! | `model.layers.{i}.self_attn.{k,v}_proj.weight` (`.bias` with `attention_bias`) | `[kv_heads*head_dim, hidden]` |
//! | `model.layers.{i}.self_attn.o_proj.weight` (`.bias`: Qwen3-MoE with `attention_bias`) | `[hidden, heads*head_dim]` |
//! | `model.layers.{i}.self_attn.{q,k}_norm.weight` (Qwen3-MoE only) | `[head_dim]` |
//! | `model.layers.{i}.post_attention_layernorm.weight` | `[hidden]` |
//! | Qwen3-MoE MoE layer: `model.layers.{i}.mlp.gate.weight` (router) | `[experts, hidden]` |
//! | Qwen3-MoE: `model.layers.{i}.mlp.experts.{e}.{gate,up}_proj.weight` | `[moe_intermediate, hidden]` |
//! | Qwen3-MoE: `model.layers.{i}.mlp.experts.{e}.down_proj.weight` | `[hidden, moe_intermediate]` |
//! | Qwen3-MoE dense layer (`mlp_only_layers`): `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | as above with `intermediate_size` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.gate.weight` (router) | `[experts, hidden]` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3}.weight` (gate, up) | `[intermediate, hidden]` |
//! | Mixtral: `model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight` (down) | `[hidden, intermediate]` |
//! | `model.norm.weight` | `[hidden]` |
//! | `lm_head.weight` (absent when `tie_word_embeddings`) | `[vocab, hidden]` |
//!
//! Values are held as `f32`. Random weights and weights read from a bf16 file are exactly
//! bf16-representable; weights read from an f32 file keep their f32 values (the reference
//! rounds them to bf16 when it runs in bf16, as transformers does when it loads in bf16).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use indexmap::IndexMap;
use safetensors::{Dtype as StDtype, SafeTensors, tensor::TensorView};
use thiserror::Error;

use crate::spec::{Family, FfnKind, LmHead, ModelSpec, QkNorm};

/// Why weights could not be built, read or written. Every variant about a tensor names it.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum WeightsError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: String, message: String },
    #[error("{path}: missing tensor \"{name}\" (expected shape {expected:?})")]
    Missing {
        path: String,
        name: String,
        expected: Vec<usize>,
    },
    #[error("{path}: tensor \"{name}\": shape {found:?}, expected {expected:?}")]
    Shape {
        path: String,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor \"{name}\": unsupported dtype {dtype} (supported: BF16, F16, F32)")]
    Dtype {
        path: String,
        name: String,
        dtype: String,
    },
    #[error(
        "{path}: unexpected tensor \"{name}\": not part of a {family} model with this config (wrong config.json?)"
    )]
    Unexpected {
        path: String,
        name: String,
        family: &'static str,
    },
    #[error("{path}: tensor \"{name}\" appears in more than one file")]
    Duplicate { path: String, name: String },
    #[error("unsupported model feature for weights: {what}")]
    Unsupported { what: String },
}

impl WeightsError {
    /// The tensor the error is about, if any.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            Self::Missing { name, .. }
            | Self::Shape { name, .. }
            | Self::Dtype { name, .. }
            | Self::Unexpected { name, .. }
            | Self::Duplicate { name, .. } => Some(name),
            _ => None,
        }
    }
}

fn io_err(path: &Path, e: impl fmt::Display) -> WeightsError {
    WeightsError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// How a tensor is initialised by [`Weights::random`] (and what it is).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorRole {
    /// Embedding rows: standard deviation 1, so the residual stream starts at O(1).
    Embedding,
    /// `[out, in]` linear weight: standard deviation `1/sqrt(in)`, so outputs stay O(1).
    Linear,
    /// Bias: standard deviation 0.1.
    Bias,
    /// RMSNorm scale: uniform in `[0.8, 1.2]` (never zero, not all equal).
    Norm,
}

/// One tensor of a model: Hugging Face name, shape, role.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

/// The names of one layer's tensors (what [`tensor_layout`] lists, per layer).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNames {
    pub input_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub o_bias: Option<String>,
    pub q_norm: Option<String>,
    pub k_norm: Option<String>,
    pub post_norm: String,
    pub ffn: FfnNames,
}

/// The names of one layer's FFN tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum FfnNames {
    Dense(MlpNames),
    Moe {
        router: String,
        router_bias: Option<String>,
        experts: Vec<MlpNames>,
    },
}

/// A gated MLP's three matrices: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpNames {
    pub gate: String,
    pub up: String,
    pub down: String,
}

/// Names of the whole model's tensors, structured.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelNames {
    pub embed: String,
    pub layers: Vec<LayerNames>,
    pub final_norm: String,
    /// `lm_head.weight`, or the embedding's name when tied.
    pub lm_head: String,
}

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

impl ModelNames {
    pub fn new(spec: &ModelSpec) -> Result<Self, WeightsError> {
        let mut layers = Vec::with_capacity(spec.layers.len());
        for layer in &spec.layers {
            let p = format!("model.layers.{}.", layer.index);
            let a = |s: &str| format!("{p}self_attn.{s}");
            let qkv_bias = spec.attention.qkv_bias;
            let qk_norm = matches!(spec.attention.qk_norm, QkNorm::PerHeadRms { .. });
            let ffn = match (&layer.ffn, spec.family) {
                (FfnKind::Dense { .. }, Family::Qwen3Moe) => FfnNames::Dense(MlpNames {
                    gate: format!("{p}mlp.gate_proj.weight"),
                    up: format!("{p}mlp.up_proj.weight"),
                    down: format!("{p}mlp.down_proj.weight"),
                }),
                (FfnKind::Dense { .. }, Family::Mixtral) => {
                    return Err(WeightsError::Unsupported {
                        what: format!("dense FFN in Mixtral layer {}", layer.index),
                    });
                }
                (FfnKind::Moe(moe), family) => {
                    if moe.shared.is_some() {
                        return Err(WeightsError::Unsupported {
                            what: format!("shared expert in layer {}", layer.index),
                        });
                    }
                    let block = match family {
                        Family::Qwen3Moe => format!("{p}mlp."),
                        Family::Mixtral => format!("{p}block_sparse_moe."),
                    };
                    let experts = (0..moe.num_experts)
                        .map(|e| {
                            let x = format!("{block}experts.{e}.");
                            match family {
                                Family::Qwen3Moe => MlpNames {
                                    gate: format!("{x}gate_proj.weight"),
                                    up: format!("{x}up_proj.weight"),
                                    down: format!("{x}down_proj.weight"),
                                },
                                Family::Mixtral => MlpNames {
                                    gate: format!("{x}w1.weight"),
                                    up: format!("{x}w3.weight"),
                                    down: format!("{x}w2.weight"),
                                },
                            }
                        })
                        .collect();
                    FfnNames::Moe {
                        router: format!("{block}gate.weight"),
                        router_bias: moe.routing.router_bias.then(|| format!("{block}gate.bias")),
                        experts,
                    }
                }
            };
            layers.push(LayerNames {
                input_norm: format!("{p}input_layernorm.weight"),
                q: a("q_proj.weight"),
                k: a("k_proj.weight"),
                v: a("v_proj.weight"),
                o: a("o_proj.weight"),
                q_bias: qkv_bias.then(|| a("q_proj.bias")),
                k_bias: qkv_bias.then(|| a("k_proj.bias")),
                v_bias: qkv_bias.then(|| a("v_proj.bias")),
                o_bias: spec.attention.o_bias.then(|| a("o_proj.bias")),
                q_norm: qk_norm.then(|| a("q_norm.weight")),
                k_norm: qk_norm.then(|| a("k_norm.weight")),
                post_norm: format!("{p}post_attention_layernorm.weight"),
                ffn,
            });
        }
        Ok(Self {
            embed: EMBED.into(),
            layers,
            final_norm: FINAL_NORM.into(),
            lm_head: match spec.lm_head {
                LmHead::Untied => LM_HEAD.into(),
                LmHead::Tied => EMBED.into(),
            },
        })
    }
}

/// Every tensor of the model described by `spec`, in checkpoint order (embedding, layers in
/// order, final norm, `lm_head`), with its Hugging Face name and shape.
pub fn tensor_layout(spec: &ModelSpec) -> Result<Vec<TensorSpec>, WeightsError> {
    let names = ModelNames::new(spec)?;
    let h = spec.hidden_size as usize;
    let vocab = spec.vocab_size as usize;
    let hd = spec.attention.head_dim as usize;
    let q_out = spec.attention.num_heads as usize * hd;
    let kv_out = spec.attention.num_kv_heads as usize * hd;
    let mut out = Vec::new();
    let mut t = |name: &str, shape: Vec<usize>, role| {
        out.push(TensorSpec {
            name: name.to_string(),
            shape,
            role,
        });
    };
    use TensorRole::*;
    t(&names.embed, vec![vocab, h], Embedding);
    for (ln, layer) in names.layers.iter().zip(&spec.layers) {
        t(&ln.input_norm, vec![h], Norm);
        t(&ln.q, vec![q_out, h], Linear);
        if let Some(b) = &ln.q_bias {
            t(b, vec![q_out], Bias);
        }
        t(&ln.k, vec![kv_out, h], Linear);
        if let Some(b) = &ln.k_bias {
            t(b, vec![kv_out], Bias);
        }
        t(&ln.v, vec![kv_out, h], Linear);
        if let Some(b) = &ln.v_bias {
            t(b, vec![kv_out], Bias);
        }
        t(&ln.o, vec![h, q_out], Linear);
        if let Some(b) = &ln.o_bias {
            t(b, vec![h], Bias);
        }
        if let Some(n) = &ln.q_norm {
            t(n, vec![hd], Norm);
        }
        if let Some(n) = &ln.k_norm {
            t(n, vec![hd], Norm);
        }
        t(&ln.post_norm, vec![h], Norm);
        match (&ln.ffn, &layer.ffn) {
            (FfnNames::Dense(m), FfnKind::Dense { intermediate }) => {
                let inter = *intermediate as usize;
                t(&m.gate, vec![inter, h], Linear);
                t(&m.up, vec![inter, h], Linear);
                t(&m.down, vec![h, inter], Linear);
            }
            (
                FfnNames::Moe {
                    router,
                    router_bias,
                    experts,
                },
                FfnKind::Moe(moe),
            ) => {
                // Router first, as Hugging Face lists `mlp.gate` before `mlp.experts`.
                let e = moe.num_experts as usize;
                let inter = moe.intermediate as usize;
                t(router, vec![e, h], Linear);
                if let Some(b) = router_bias {
                    t(b, vec![e], Bias);
                }
                for m in experts {
                    t(&m.gate, vec![inter, h], Linear);
                    t(&m.up, vec![inter, h], Linear);
                    t(&m.down, vec![h, inter], Linear);
                }
            }
            _ => unreachable!("ModelNames follows the layer's FFN kind"),
        }
    }
    t(&names.final_norm, vec![h], Norm);
    if spec.lm_head == LmHead::Untied {
        t(LM_HEAD, vec![vocab, h], Linear);
    }
    Ok(out)
}

/// One tensor's values, row-major, as `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Whether every value is exactly representable in bf16.
    pub fn is_bf16_valued(&self) -> bool {
        self.data
            .iter()
            .all(|&x| round_bf16(x).to_bits() == x.to_bits() || x.is_nan())
    }

    /// A copy with every value rounded to the nearest bf16 (ties to even).
    pub fn to_bf16_valued(&self) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| round_bf16(x)).collect(),
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), back as `f32`.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Element type of a written safetensors file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveDtype {
    /// bf16 (round to nearest even); how the real checkpoints are stored.
    BFloat16,
    Float32,
}

/// All of a model's weights, keyed by Hugging Face tensor name, in checkpoint order; every
/// tensor of [`tensor_layout`] is present with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    family: Family,
    tensors: IndexMap<String, Tensor>,
}

/// `SplitMix64`: a small, fast, well-mixed generator, enough for test weights.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    fn uniform_pm1(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// FNV-1a, to give each tensor its own stream independent of the others' order and sizes.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

impl Weights {
    /// Seeded random weights, bf16-valued, scaled so activations stay O(1) (see
    /// [`TensorRole`]): uniform distributions with the role's standard deviation. Each tensor
    /// draws from its own stream (seed and name), so the same seed gives the same tensor for
    /// the same name and shape whatever else the model holds.
    pub fn random(spec: &ModelSpec, seed: u64) -> Result<Self, WeightsError> {
        let layout = tensor_layout(spec)?;
        let sqrt3 = 3f32.sqrt();
        let tensors = layout
            .into_iter()
            .map(|ts| {
                let mut rng = SplitMix64(seed ^ fnv1a(&ts.name).rotate_left(17));
                let n: usize = ts.shape.iter().product();
                let data = (0..n)
                    .map(|_| {
                        let u = rng.uniform_pm1();
                        let x = match ts.role {
                            TensorRole::Embedding => u * sqrt3,
                            TensorRole::Linear => u * sqrt3 / (ts.shape[1] as f32).sqrt(),
                            TensorRole::Bias => u * sqrt3 * 0.1,
                            TensorRole::Norm => 1.0 + 0.2 * u,
                        };
                        round_bf16(x)
                    })
                    .collect();
                (
                    ts.name,
                    Tensor {
                        shape: ts.shape,
                        data,
                    },
                )
            })
            .collect();
        Ok(Self {
            family: spec.family,
            tensors,
        })
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Mutable access (tests perturb single tensors); the shape must not change.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        self.tensors.get_mut(name).map(|t| t.data.as_mut_slice())
    }

    /// Tensors in checkpoint order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of parameters.
    pub fn num_params(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// Whether every value is exactly representable in bf16.
    pub fn is_bf16_valued(&self) -> bool {
        self.tensors.values().all(Tensor::is_bf16_valued)
    }

    /// Reads a checkpoint: a `.safetensors` file, or a directory holding
    /// `model.safetensors.index.json` (sharded, Hugging Face layout) or `*.safetensors` files.
    /// Every tensor of [`tensor_layout`] must be present with its shape, in BF16, F16 or F32;
    /// a tensor the model does not have is an error (it usually means the wrong config),
    /// except `lm_head.weight` of a tied model and `rotary_emb.inv_freq` buffers, which are
    /// ignored.
    pub fn load(spec: &ModelSpec, path: impl AsRef<Path>) -> Result<Self, WeightsError> {
        let path = path.as_ref();
        let files = checkpoint_files(path)?;
        let mut buffers = Vec::with_capacity(files.len());
        for f in &files {
            buffers.push((f.clone(), std::fs::read(f).map_err(|e| io_err(f, e))?));
        }
        let refs: Vec<(&Path, &[u8])> = buffers
            .iter()
            .map(|(p, b)| (p.as_path(), b.as_slice()))
            .collect();
        Self::from_safetensors(spec, &refs)
    }

    /// [`Weights::load`] on bytes already in memory: one `(label, bytes)` pair per file.
    pub fn from_safetensors(
        spec: &ModelSpec,
        files: &[(&Path, &[u8])],
    ) -> Result<Self, WeightsError> {
        let layout = tensor_layout(spec)?;
        let expected: HashMap<&str, &TensorSpec> =
            layout.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut found: HashMap<String, (PathBuf, Tensor)> = HashMap::new();
        for (path, bytes) in files {
            let disp = path.display().to_string();
            let st = SafeTensors::deserialize(bytes).map_err(|e| WeightsError::Format {
                path: disp.clone(),
                message: e.to_string(),
            })?;
            for (name, view) in st.tensors() {
                let Some(ts) = expected.get(name.as_str()) else {
                    let tied_head = spec.lm_head == LmHead::Tied && name == LM_HEAD;
                    if tied_head || name.ends_with("rotary_emb.inv_freq") {
                        continue;
                    }
                    return Err(WeightsError::Unexpected {
                        path: disp,
                        name,
                        family: spec.family.model_type(),
                    });
                };
                if view.shape() != ts.shape.as_slice() {
                    return Err(WeightsError::Shape {
                        path: disp,
                        name,
                        expected: ts.shape.clone(),
                        found: view.shape().to_vec(),
                    });
                }
                let data = decode(&view).ok_or_else(|| WeightsError::Dtype {
                    path: disp.clone(),
                    name: name.clone(),
                    dtype: format!("{:?}", view.dtype()),
                })?;
                let t = Tensor {
                    shape: ts.shape.clone(),
                    data,
                };
                if found
                    .insert(name.clone(), (path.to_path_buf(), t))
                    .is_some()
                {
                    return Err(WeightsError::Duplicate { path: disp, name });
                }
            }
        }
        let where_ = match files {
            [(p, _)] => p.display().to_string(),
            _ => files
                .first()
                .and_then(|(p, _)| p.parent())
                .map_or_else(|| "checkpoint".into(), |d| d.display().to_string()),
        };
        let mut tensors = IndexMap::with_capacity(layout.len());
        for ts in layout {
            let Some((_, t)) = found.remove(&ts.name) else {
                return Err(WeightsError::Missing {
                    path: where_,
                    name: ts.name,
                    expected: ts.shape,
                });
            };
            tensors.insert(ts.name, t);
        }
        Ok(Self {
            family: spec.family,
            tensors,
        })
    }

    /// The safetensors bytes of these weights (metadata `format: pt`, as transformers needs).
    pub fn to_safetensors_bytes(&self, dtype: SaveDtype) -> Result<Vec<u8>, WeightsError> {
        let encoded: Vec<(&str, &Tensor, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(n, t)| {
                let bytes = match dtype {
                    SaveDtype::BFloat16 => t
                        .data
                        .iter()
                        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                        .collect(),
                    SaveDtype::Float32 => t.data.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                };
                (n.as_str(), t, bytes)
            })
            .collect();
        let st_dtype = match dtype {
            SaveDtype::BFloat16 => StDtype::BF16,
            SaveDtype::Float32 => StDtype::F32,
        };
        let fmt_err = |e: safetensors::SafeTensorError| WeightsError::Format {
            path: "<serialize>".into(),
            message: e.to_string(),
        };
        let mut views = BTreeMap::new();
        for (n, t, bytes) in &encoded {
            views.insert(
                n.to_string(),
                TensorView::new(st_dtype, t.shape.clone(), bytes).map_err(fmt_err)?,
            );
        }
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize(views, Some(meta)).map_err(fmt_err)
    }

    /// Writes one safetensors file. The bytes go to a temporary file next to `path` that is
    /// renamed over it once complete, so a failed save never leaves a half-written file.
    pub fn save(&self, path: impl AsRef<Path>, dtype: SaveDtype) -> Result<(), WeightsError> {
        let path = path.as_ref();
        let bytes = self.to_safetensors_bytes(dtype)?;
        let file_name = path
            .file_name()
            .ok_or_else(|| io_err(path, "not a file path"))?
            .to_string_lossy();
        let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(path, e)
        })
    }
}

fn decode(view: &TensorView<'_>) -> Option<Vec<f32>> {
    let d = view.data();
    Some(match view.dtype() {
        StDtype::BF16 => d
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StDtype::F16 => d
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StDtype::F32 => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => return None,
    })
}

/// The safetensors files of a checkpoint path (see [`Weights::load`]).
fn checkpoint_files(path: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    if !path.is_dir() {
        if !path.exists() {
            return Err(io_err(path, "no such file or directory"));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let index = path.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| io_err(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| WeightsError::Format {
                path: index.display().to_string(),
                message: e.to_string(),
            })?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| WeightsError::Format {
                path: index.display().to_string(),
                message: "no \"weight_map\" object".into(),
            })?;
        let mut files: Vec<PathBuf> = map
            .values()
            .filter_map(|f| f.as_str())
            .map(|f| path.join(f))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| io_err(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(io_err(path, "no *.safetensors file in this directory"));
    }
    Ok(files)
}
