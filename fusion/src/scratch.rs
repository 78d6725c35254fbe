//! The megakernel's scratch, declared once: every buffer (name, memory space, dtype, shape)
//! and every DMA semaphore array, sized from the plan's dims, layout and rings. The plan
//! keeps the declaration ([`crate::plan::Plan::scratch`]); the same list is what
//! [`crate::emit`] declares on the kernel builder, taking each handle by the typed key its
//! entry's declaration returned (never by position), and what the plan's VMEM budget sums,
//! each buffer at the dsl's own padded size ([`padded_vmem_bytes`], the rule of the
//! verifier's VMEM check). No second inventory.
//!
//! [`Scratch`] is the mechanism: an ordered list any part of the kernel declares its entries
//! into, getting a [`BufferKey`] or [`SemaphoresKey`] for each; [`MegakernelScratch`] is the
//! megakernel's declaration and its keys.

use crate::layout::{OperandKind, StreamLayout};
use crate::options::{Dims, round_up};
use palladium_dsl::DType;
use palladium_dsl::build::{KernelBuilder, MemorySpace, SemKind};
use palladium_dsl::ir::{Shape, padded_vmem_bytes};
use palladium_dsl::prelude::{Ref, SemRef};
use palladium_dsl::trace::builder_handles::{Sealed, Slot};

/// The key of a scratch buffer in its [`Scratch`], returned by [`Scratch::buffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferKey(usize);

/// The key of a DMA semaphore array in its [`Scratch`], returned by
/// [`Scratch::dma_semaphores`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemaphoresKey(usize);

/// One scratch entry.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    /// A buffer; `group` is the line of the VMEM budget it is counted under.
    Buffer {
        name: &'static str,
        group: &'static str,
        space: MemorySpace,
        dtype: DType,
        shape: Vec<u64>,
    },
    DmaSemaphores {
        name: &'static str,
        shape: Vec<u64>,
    },
}

/// A kernel's scratch in declaration order (the order of the kernel's scratch operands).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scratch {
    entries: Vec<Entry>,
}

/// The VMEM of one group of scratch buffers ([`Scratch::vmem_groups`]).
#[derive(Clone, Debug, PartialEq)]
pub struct VmemGroup {
    pub group: &'static str,
    /// Its buffers' names, in declaration order.
    pub buffers: Vec<&'static str>,
    /// Bytes at the dsl's padded size.
    pub bytes: u64,
}

impl VmemGroup {
    /// The group's budget line: its name, and its buffers' where they say more.
    pub fn label(&self) -> String {
        match self.buffers.as_slice() {
            [only] if *only == self.group => self.group.to_string(),
            names => format!("{} ({})", self.group, names.join(", ")),
        }
    }
}

impl Scratch {
    pub fn buffer(
        &mut self,
        group: &'static str,
        name: &'static str,
        space: MemorySpace,
        dtype: DType,
        shape: &[u64],
    ) -> BufferKey {
        self.entries.push(Entry::Buffer { name, group, space, dtype, shape: shape.to_vec() });
        BufferKey(self.entries.len() - 1)
    }

    pub fn dma_semaphores(&mut self, name: &'static str, shape: &[u64]) -> SemaphoresKey {
        self.entries.push(Entry::DmaSemaphores { name, shape: shape.to_vec() });
        SemaphoresKey(self.entries.len() - 1)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The VMEM buffers by group, in order of each group's first buffer, each at the dsl's
    /// padded size (the minor two dims rounded up to the dtype's native tile).
    pub fn vmem_groups(&self) -> Vec<VmemGroup> {
        let mut groups: Vec<VmemGroup> = Vec::new();
        for entry in &self.entries {
            let Entry::Buffer { name, group, space: MemorySpace::Vmem, dtype, shape } = entry
            else {
                continue;
            };
            let bytes = padded_vmem_bytes(*dtype, &Shape::new(shape.clone()));
            match groups.iter_mut().find(|g| g.group == *group) {
                Some(g) => {
                    g.buffers.push(name);
                    g.bytes = g.bytes.saturating_add(bytes);
                }
                None => groups.push(VmemGroup { group, buffers: vec![name], bytes }),
            }
        }
        groups
    }

    /// Declare every entry on `kb`, in order; the slots give the handles once sealed.
    pub fn declare(&self, kb: &mut KernelBuilder) -> ScratchSlots {
        let slots = self
            .entries
            .iter()
            .map(|entry| match entry {
                Entry::Buffer { name, space, dtype, shape, .. } => {
                    kb.scratch_buffer(name, *space, *dtype, shape)
                }
                Entry::DmaSemaphores { name, shape } => {
                    kb.scratch_semaphores(name, SemKind::Dma, shape)
                }
            })
            .collect();
        ScratchSlots(slots)
    }
}

/// The builder's slots of a declared [`Scratch`], one per entry.
pub struct ScratchSlots(Vec<Slot>);

impl ScratchSlots {
    /// The handles of the entries, once the kernel is sealed.
    pub fn handles(&self, sealed: &Sealed) -> ScratchHandles {
        ScratchHandles(self.0.iter().map(|&slot| sealed.handle(slot)).collect())
    }
}

/// The traced handles of a declared [`Scratch`], by key.
pub struct ScratchHandles(Vec<palladium_dsl::trace::builder_handles::Handle>);

impl ScratchHandles {
    pub fn buffer(&self, key: BufferKey) -> Ref {
        self.0[key.0].clone().into_ref()
    }

    pub fn semaphores(&self, key: SemaphoresKey) -> SemRef {
        self.0[key.0].clone().into_sem()
    }
}

/// What the megakernel's scratch is sized by besides the dims and the layout: the plan's
/// rings and KV tiles, and the devices.
#[derive(Clone, Copy, Debug)]
pub struct ScratchSizes {
    /// Dense ring banks, expert ring slots, a quantized plan's `lm_head` ring banks.
    pub dense_banks: u64,
    pub expert_slots: u64,
    pub lm_banks: u64,
    pub block_kv: u64,
    /// 16-row K (and V) groups written back from a tile holding new rows.
    pub kv_write_groups: u64,
    pub devices: u64,
}

/// The megakernel's scratch ([`MegakernelScratch::declare`]) and the keys of its entries.
#[derive(Clone, Debug, PartialEq)]
pub struct MegakernelScratch {
    pub scratch: Scratch,
    pub keys: ScratchKeys,
}

/// The megakernel's scratch entries: the rings, the KV tiles, the activations, the expert
/// ids (fields named as the entries).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScratchKeys {
    pub ring: BufferKey,
    pub ring_sems: SemaphoresKey,
    pub expert_buf: BufferKey,
    pub expert_sems: SemaphoresKey,
    pub k_tiles: BufferKey,
    pub v_tiles: BufferKey,
    pub kv_sems: SemaphoresKey,
    pub kv_write_sems: SemaphoresKey,
    pub emb_rows: BufferKey,
    pub emb_sems: SemaphoresKey,
    pub head_norm_buf: BufferKey,
    pub head_norm_sem: SemaphoresKey,
    /// The layer's q/k/v bias rows and their copy's semaphore (models with the biases).
    pub qkv_bias: Option<(BufferKey, SemaphoresKey)>,
    /// The layer's correction-bias rows and their copy's semaphore (`DeepSeek`-V3's
    /// router).
    pub correction_bias: Option<(BufferKey, SemaphoresKey)>,
    /// The layer's `o_proj` bias rows and their copy's semaphore.
    pub o_bias: Option<(BufferKey, SemaphoresKey)>,
    /// The layer's attention sinks (`[kv_heads, attn_rows, 128]`), the router bias row,
    /// and the expert ring's bias blocks (`[slots, 8, lanes]`, `sems[slot]`), where the
    /// model has them (gpt-oss).
    pub sinks: Option<(BufferKey, SemaphoresKey)>,
    pub router_bias: Option<(BufferKey, SemaphoresKey)>,
    pub expert_bias: Option<(BufferKey, SemaphoresKey)>,
    pub x: BufferKey,
    pub expert_acc: BufferKey,
    pub o_acc: BufferKey,
    pub qkv: BufferKey,
    pub q_heads: BufferKey,
    pub attn_heads: BufferKey,
    pub k_new: BufferKey,
    pub v_new: BufferKey,
    pub attn: BufferKey,
    pub router_logits: BufferKey,
    pub rope_rot: BufferKey,
    pub rope_cos: BufferKey,
    pub rope_sin: BufferKey,
    pub expert_ids: BufferKey,
    pub quant: Option<QuantKeys>,
    pub collectives: Option<CollectiveKeys>,
}

/// A quantized plan's scratch ([`crate::layout::QuantLayout`]): one buffer per quantized
/// operand, shaped as one DMA of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantKeys {
    /// One layer's q/k/v and o scales, router and norm rows (`layer_sems`: 0..4 in that
    /// order).
    pub qkv_scales_buf: BufferKey,
    pub o_scales_buf: BufferKey,
    pub router_buf: BufferKey,
    pub norm_buf: BufferKey,
    pub layer_sems: SemaphoresKey,
    /// `lm_head`'s ring and its scales (`lm_sems[0 | 1, bank]`).
    pub lm_ring: BufferKey,
    pub lm_scales_buf: BufferKey,
    pub lm_sems: SemaphoresKey,
    /// The expert ring's scales (`expert_scale_sems[0 | 1, slot]`).
    pub expert_scales_buf: BufferKey,
    pub expert_down_scales_buf: BufferKey,
    pub expert_scale_sems: SemaphoresKey,
}

/// The collectives' scratch on `N > 1` devices ([`crate::spmd`]): the staged and the
/// reduced bf16 activation (`N` blocks of `[r16, hidden / N]` each, `r16` the rows rounded
/// to a bf16 tile), the reduce's stage (`N` more blocks), the gathered `(max, id)` pairs
/// (`[N * r8, 128]` f32 and i32), and the ring hops' send and receive semaphores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CollectiveKeys {
    pub staged: BufferKey,
    pub reduced: BufferKey,
    pub stage: BufferKey,
    pub maxes: BufferKey,
    pub ids: BufferKey,
    pub send: SemaphoresKey,
    pub recv: SemaphoresKey,
}

impl MegakernelScratch {
    /// The megakernel's scratch for `dims` and `layout`, in the kernel's order (the
    /// one-device scratch, then a quantized plan's, then the collectives'; so a one-device
    /// bf16 kernel declares the same entries whatever else a plan adds).
    pub fn declare(dims: &Dims, layout: &StreamLayout, sizes: ScratchSizes) -> MegakernelScratch {
        let (h, hp, rows, tokens, kvh) =
            (dims.hidden, dims.head_pad, dims.rows, dims.tokens, dims.kv_heads);
        let (cw, eb, slots, bkv) =
            (layout.chunk_cols, layout.expert_block, sizes.expert_slots, sizes.block_kv);
        let nqkv = (dims.heads + 2 * kvh) * hp;
        let quant = layout.quant;
        let dense_dtype = quant.map_or(DType::Bf16, |q| q.dense.codes);
        let expert_dtype = quant.map_or(DType::Bf16, |q| q.experts.codes);
        let (vm, f32, bf16) = (MemorySpace::Vmem, DType::F32, DType::Bf16);
        let mut s = Scratch::default();
        let ring = s.buffer("dense ring", "ring", vm, dense_dtype, &[sizes.dense_banks, h, cw]);
        let ring_sems = s.dma_semaphores("ring_sems", &[sizes.dense_banks]);
        let expert_buf =
            s.buffer("expert ring", "expert_buf", vm, expert_dtype, &[slots, h, 3 * eb]);
        let expert_sems = s.dma_semaphores("expert_sems", &[slots]);
        let k_tiles = s.buffer("kv tiles", "k_tiles", vm, bf16, &[2, bkv, hp]);
        let v_tiles = s.buffer("kv tiles", "v_tiles", vm, bf16, &[2, bkv, hp]);
        let kv_sems = s.dma_semaphores("kv_sems", &[2, 2]);
        let kv_write_sems = s.dma_semaphores("kv_write_sems", &[2 * sizes.kv_write_groups]);
        let emb_rows = s.buffer("embedding rows", "emb_rows", vm, bf16, &[tokens, 16, h]);
        let emb_sems = s.dma_semaphores("emb_sems", &[tokens]);
        let head_norm_buf =
            s.buffer("head norms", "head_norm_buf", vm, f32, &[dims.head_norm_rows(), hp]);
        let head_norm_sem = s.dma_semaphores("head_norm_sem", &[1]);
        let qkv_bias = dims.qkv_bias.then(|| {
            let rows = dims.qkv_bias_rows();
            let buf = s.buffer("q/k/v biases", "qkv_bias_buf", vm, f32, &[rows, hp]);
            (buf, s.dma_semaphores("qkv_bias_sem", &[1]))
        });
        let correction_bias = dims.correction_bias.then(|| {
            let buf = s.buffer("correction bias", "bias_buf", vm, f32, &[8, dims.experts_pad]);
            (buf, s.dma_semaphores("bias_sem", &[1]))
        });
        let o_bias = dims.o_bias.then(|| {
            let buf = s.buffer("o_proj bias", "o_bias_buf", vm, f32, &[8, h]);
            (buf, s.dma_semaphores("o_bias_sem", &[1]))
        });
        let sinks = dims.sinks.then(|| {
            let buf =
                s.buffer("attention sinks", "sinks_buf", vm, f32, &[kvh, dims.attn_rows, 128]);
            (buf, s.dma_semaphores("sinks_sem", &[1]))
        });
        let router_bias = dims.router_bias.then(|| {
            let buf = s.buffer("router bias", "router_bias_buf", vm, f32, &[8, dims.experts_pad]);
            (buf, s.dma_semaphores("router_bias_sem", &[1]))
        });
        let expert_bias = dims.expert_bias.then(|| {
            let lanes = dims.expert_bias_lanes(eb);
            let buf = s.buffer("expert ring", "expert_bias_buf", vm, f32, &[slots, 8, lanes]);
            (buf, s.dma_semaphores("expert_bias_sems", &[slots]))
        });
        let acc = "residual and accumulators";
        let x = s.buffer(acc, "x", vm, f32, &[rows, h]);
        let expert_acc = s.buffer(acc, "expert_acc", vm, f32, &[rows, h]);
        let o_acc = s.buffer(acc, "o_acc", vm, f32, &[rows, h]);
        let qkv = s.buffer("qkv", "qkv", vm, f32, &[rows, nqkv]);
        // Per kv group, its query heads (then outputs) stacked: head j's rows at j * rows.
        let heads = "attention heads";
        let q_heads = s.buffer(heads, "q_heads", vm, f32, &[kvh, dims.group * rows, hp]);
        let attn_heads = s.buffer(heads, "attn_heads", vm, f32, &[kvh, dims.group * rows, hp]);
        let k_new = s.buffer(heads, "k_new", vm, f32, &[kvh, rows, hp]);
        let v_new = s.buffer(heads, "v_new", vm, f32, &[kvh, rows, hp]);
        let attn = s.buffer("attention rows", "attn", vm, f32, &[rows, dims.heads * hp]);
        let router_logits =
            s.buffer("router logits", "router_logits", vm, f32, &[rows, dims.experts_pad]);
        let rope_rot = s.buffer("rope tables", "rope_rot", vm, bf16, &[hp, hp]);
        let rope_cos = s.buffer("rope tables", "rope_cos", vm, f32, &[rows, hp]);
        let rope_sin = s.buffer("rope tables", "rope_sin", vm, f32, &[rows, hp]);
        let expert_ids = s.buffer(
            "expert ids",
            "expert_ids",
            MemorySpace::Smem,
            DType::I32,
            &[dims.distinct_experts() + 1],
        );
        let quant = quant.map(|q| {
            // The trailing dims of a quantized operand: one layer's (or chunk's) block.
            let tail = |kind: OperandKind| {
                let shape = layout.operand(kind).map(|o| o.shape.clone()).unwrap_or_default();
                shape[shape.len().saturating_sub(2)..].to_vec()
            };
            let with_slots = |kind| [vec![slots], tail(kind)].concat();
            let (scales, router_norms) = ("qkv + o scales", "router (bf16) + norms");
            let lm = "lm_head ring + scales";
            let lm_dtype = q.lm_head.map_or(bf16, |f| f.codes);
            let lm_rows = if q.lm_head.is_some() { tail(OperandKind::LmScales)[0] } else { 1 };
            let expert_scales = "expert scales";
            QuantKeys {
                qkv_scales_buf: s.buffer(
                    scales,
                    "qkv_scales_buf",
                    vm,
                    f32,
                    &tail(OperandKind::QkvScales),
                ),
                o_scales_buf: s.buffer(
                    scales,
                    "o_scales_buf",
                    vm,
                    f32,
                    &tail(OperandKind::OScales),
                ),
                router_buf: s.buffer(
                    router_norms,
                    "router_buf",
                    vm,
                    bf16,
                    &tail(OperandKind::Router),
                ),
                norm_buf: s.buffer(router_norms, "norm_buf", vm, f32, &tail(OperandKind::Norms)),
                layer_sems: s.dma_semaphores("layer_sems", &[4]),
                lm_ring: s.buffer(lm, "lm_ring", vm, lm_dtype, &[sizes.lm_banks, h, cw]),
                lm_scales_buf: s.buffer(
                    lm,
                    "lm_scales_buf",
                    vm,
                    f32,
                    &[sizes.lm_banks, lm_rows, cw],
                ),
                lm_sems: s.dma_semaphores("lm_sems", &[2, sizes.lm_banks]),
                expert_scales_buf: s.buffer(
                    expert_scales,
                    "expert_scales_buf",
                    vm,
                    f32,
                    &with_slots(OperandKind::ExpertScales),
                ),
                expert_down_scales_buf: s.buffer(
                    expert_scales,
                    "expert_down_scales_buf",
                    vm,
                    f32,
                    &with_slots(OperandKind::ExpertDownScales),
                ),
                expert_scale_sems: s.dma_semaphores("expert_scale_sems", &[2, slots]),
            }
        });
        let collectives = (sizes.devices > 1).then(|| {
            let n = sizes.devices;
            let (r16, r8) = (round_up(rows, 16), round_up(rows, 8));
            let c = "collective buffers";
            CollectiveKeys {
                staged: s.buffer(c, "allreduce_staged", vm, bf16, &[n * r16, h / n]),
                reduced: s.buffer(c, "allreduce_reduced", vm, bf16, &[n * r16, h / n]),
                stage: s.buffer(c, "allreduce_stage", vm, bf16, &[n, r16, h / n]),
                maxes: s.buffer(c, "greedy_maxes", vm, f32, &[n * r8, 128]),
                ids: s.buffer(c, "greedy_ids", vm, DType::I32, &[n * r8, 128]),
                send: s.dma_semaphores("hop_send_sems", &[4, n - 1]),
                recv: s.dma_semaphores("hop_recv_sems", &[4, n - 1]),
            }
        });
        let keys = ScratchKeys {
            ring,
            ring_sems,
            expert_buf,
            expert_sems,
            k_tiles,
            v_tiles,
            kv_sems,
            kv_write_sems,
            emb_rows,
            emb_sems,
            head_norm_buf,
            head_norm_sem,
            qkv_bias,
            correction_bias,
            o_bias,
            sinks,
            router_bias,
            expert_bias,
            x,
            expert_acc,
            o_acc,
            qkv,
            q_heads,
            attn_heads,
            k_new,
            v_new,
            attn,
            router_logits,
            rope_rot,
            rope_cos,
            rope_sin,
            expert_ids,
            quant,
            collectives,
        };
        MegakernelScratch { scratch: s, keys }
    }
}
