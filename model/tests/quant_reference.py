#!/usr/bin/env python3
"""The independent side of `model/tests/quant_oracle.rs`: ml_dtypes, XLA (through JAX on the
CPU) and torch compute the quantized formats of `palladium_model::quant`, and torch writes a
tiny Hugging Face block-scaled FP8 checkpoint.

Writes into --out-dir:

    conversions.safetensors
        e4m3fn_decoded  F32[256]     every float8_e4m3fn byte's value (ml_dtypes)
        sweep           F32[n]       f32 inputs: specials, every e4m3fn value and midpoint and
                                     their f32 neighbours, subnormals, overflow, random values
        sweep_e4m3fn    U8[n]        ml_dtypes' astype(float8_e4m3fn) of `sweep`
        sweep_e4m3fn_sat U8[n]       the same after np.clip(-448, 448)
        int8_w/_q/_scale             per-channel int8 of a [5, 300] weight (numpy)
        int4_w/_q/_scale             int4 groups of 128 of a [5, 300] weight (numpy, ml_dtypes.int4),
                                     packed by XLA: bitcast_convert_type([.., 2] int4 -> uint8)
        fp8_w/_q/_scale              fp8 128x128 blocks of a [200, 300] weight (torch)
    qwen3-fp8/config.json, model.safetensors
        a 2-layer Qwen3-MoE (one MoE, one dense layer, dims not multiples of 128) built by
        transformers, every nn.Linear that transformers' FP8 rule converts stored as
        torch.float8_e4m3fn + weight_scale_inv (F32, or BF16 for every other tensor)
    qwen3-fp8-dequantized.safetensors
        torch's dequantization of every tensor (F32): codes.float() * scale per 128x128 tile
    qwen3-fp8-source.safetensors
        the bf16-valued weights before quantization (F32), and their F32 scales
    mixtral-fp8/..., mixtral-fp8-dequantized.safetensors, mixtral-fp8-source.safetensors
        the same for a 1-layer Mixtral (router `block_sparse_moe.gate` not converted)

With --megakernel, only checkpoints the decode megakernel takes (`decode/tests/quantized.rs`):
    qwen3-fp8-mk/, mixtral-fp8-mk/ (and their -dequantized/-source files)
        the tiny Qwen3-MoE and Mixtral fixtures at 2 layers, dims as the fixtures (multiples
        of 128), lm_head and the routers not converted

Run with the oracle venv's python (scripts/setup.sh installs torch, transformers and jax):
    $PALLADIUM_TPU_VENV/bin/python model/tests/quant_reference.py --fixtures fixtures/models \
        --out-dir /tmp/quant
"""

import argparse
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import save_file as save_numpy  # noqa: E402
from safetensors.torch import save_file as save_torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

F32 = np.float32
TINY = np.finfo(F32).tiny  # every scale's floor: 2^-126
BLOCK = 128


def sweep(rng):
    """f32 inputs that exercise every rounding path of float8_e4m3fn."""
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    mids = (finite[:-1] + finite[1:]) / 2  # exact in f32: ties
    edges = np.concatenate([finite, mids, [464.0, 480.0, 896.0, 2.0**-10, 3 * 2.0**-10]]).astype(F32)
    near = np.concatenate([np.nextafter(edges, F32(np.inf)), np.nextafter(edges, F32(-np.inf))])
    specials = np.array([np.nan, np.inf, 1e30, 1e-30, 1e-45, 2.0**-126, 2.0**-149], dtype=F32)
    wide = (rng.standard_normal(4000) * np.exp2(rng.uniform(-14, 11, 4000))).astype(F32)
    x = np.concatenate([edges, near, specials, wide]).astype(F32)
    return np.concatenate([x, -x])


def int_quantize(w, group, qmax, lo, hi):
    """Symmetric integer quantization in groups of `group` along the rows' inputs."""
    rows, cols = w.shape
    groups = -(-cols // group)
    padded = np.zeros((rows, groups * group), F32)
    padded[:, :cols] = np.abs(w)
    amax = padded.reshape(rows, groups, group).max(axis=2)
    scale = np.maximum(amax / F32(qmax), TINY).astype(F32)
    per_element = np.repeat(scale, group, axis=1)[:, :cols]
    q = np.clip(np.rint(w / per_element), lo, hi)
    return q, scale


def fp8_quantize(w):
    """torch: amax / 448 per 128x128 tile, (w / scale).clamp(-448, 448) to float8_e4m3fn."""
    rows, cols = w.shape
    scale = torch.empty((-(-rows // BLOCK), -(-cols // BLOCK)), dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            scale[i, j] = torch.clamp(tile.abs().max() / 448.0, min=float(TINY))
    full = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    q = (w / full).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def fp8_dequantize(q, scale):
    rows, cols = q.shape
    full = scale.float().repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.float() * full


def conversions(out_dir):
    rng = np.random.default_rng(16)
    x = sweep(rng)
    t = {
        "e4m3fn_decoded": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32),
        "sweep": x,
        "sweep_e4m3fn": x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
        "sweep_e4m3fn_sat": np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
    }
    # Rows with exact ties (scale 1 when max|w| is 127 or 7), an all-zero row, a tiny row
    # whose scale hits the floor, and random rows.
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -6.5], F32)
    w = (rng.standard_normal((5, 300)) * 0.05).astype(F32)
    w[0, :8], w[0, 8:] = ties, 0
    w[0, 299] = 127
    w[1] = 0
    w[2] = F32(1e-40) * rng.standard_normal(300).astype(F32)
    q, scale = int_quantize(w, 300, 127, -128, 127)
    t["int8_w"], t["int8_q"], t["int8_scale"] = w, q.astype(np.int8), scale[:, 0]
    w4 = w.copy()
    w4[0, 299] = 0
    w4[0, 127] = 7  # max of the first group: scale 1 there, the ties stay ties
    q, scale = int_quantize(w4, BLOCK, 7, -8, 7)
    pairs = q.astype(ml_dtypes.int4).reshape(5, 150, 2)
    packed = np.asarray(jax.lax.bitcast_convert_type(jnp.asarray(pairs), jnp.uint8))
    t["int4_w"], t["int4_q"], t["int4_scale"] = w4, packed, scale
    wf = (rng.standard_normal((200, 300)) * np.exp2(rng.uniform(-8, 4, (200, 300)))).astype(F32)
    wf[:128, :128] = 0  # an all-zero tile
    wf[128:, 256:] = np.resize(t["sweep"][np.isfinite(t["sweep"])][:500], (72, 44)) / 1e3
    q, scale = fp8_quantize(torch.from_numpy(wf))
    t["fp8_w"], t["fp8_q"], t["fp8_scale"] = wf, q.view(torch.uint8).numpy(), scale.numpy()
    save_numpy(t, os.path.join(out_dir, "conversions.safetensors"))


def fp8_checkpoint(config_path, name, overrides, not_converted, out_dir):
    with open(config_path) as f:
        cfg = json.load(f)
    cfg.update(overrides)
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK],
                                  "modules_to_not_convert": not_converted}
    ckpt = os.path.join(out_dir, name)
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    plain = dict(cfg)
    del plain["quantization_config"]
    config = AutoConfig.for_model(**plain)
    torch.manual_seed(16)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    # transformers' rule (integrations/finegrained_fp8.py, _replace_with_fp8_linear): an
    # nn.Linear is converted unless its name is listed or a listed name is a substring of its path.
    converted = {
        f"{path}.weight"
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
        and path.split(".")[-1] not in not_converted
        and not any(key in path for key in not_converted)
    }
    stored, dequantized, source = {}, {}, {}
    for i, (tensor, p) in enumerate(sorted(model.state_dict().items())):
        w = p.detach().float()
        if tensor in converted:
            q, scale = fp8_quantize(w)
            if i % 2:
                scale_stored = scale.to(torch.bfloat16)
            else:
                scale_stored = scale
            stored[tensor] = q.contiguous()
            stored[tensor + "_scale_inv"] = scale_stored.contiguous()
            dequantized[tensor] = fp8_dequantize(q, scale_stored)
            source[tensor] = w.contiguous()
            source[tensor + "_scale_inv"] = scale.contiguous()
        else:
            stored[tensor] = p.detach().contiguous()
            dequantized[tensor] = w.contiguous()
    save_torch(stored, os.path.join(ckpt, "model.safetensors"), metadata={"format": "pt"})
    save_torch(dequantized, os.path.join(out_dir, f"{name}-dequantized.safetensors"))
    save_torch(source, os.path.join(out_dir, f"{name}-source.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True, help="fixtures/models")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--megakernel", action="store_true", help="only the megakernel's checkpoints")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.megakernel:
        fp8_checkpoint(os.path.join(args.fixtures, "tiny-qwen3-moe.json"), "qwen3-fp8-mk", dict(num_hidden_layers=2),
                       ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"], args.out_dir)
        fp8_checkpoint(os.path.join(args.fixtures, "tiny-mixtral.json"), "mixtral-fp8-mk", dict(num_hidden_layers=2),
                       ["lm_head", "block_sparse_moe.gate"], args.out_dir)
        return
    conversions(args.out_dir)
    # Dims that are not multiples of 128 (partial tiles).
    fp8_checkpoint(os.path.join(args.fixtures, "tiny-qwen3-moe.json"), "qwen3-fp8",
                   dict(num_hidden_layers=2, num_experts=4, hidden_size=160, moe_intermediate_size=96,
                        intermediate_size=200, vocab_size=300, mlp_only_layers=[1]),
                   ["lm_head", "model.layers.0.mlp.gate", "model.layers.0.input_layernorm"], args.out_dir)
    fp8_checkpoint(os.path.join(args.fixtures, "tiny-mixtral.json"), "mixtral-fp8",
                   dict(num_hidden_layers=1, num_local_experts=3, hidden_size=160, intermediate_size=96,
                        vocab_size=300),
                   ["lm_head", "block_sparse_moe.gate"], args.out_dir)
    # DeepSeek-V3's MLA projections, none a multiple of 128 (partial edge blocks): q_a_proj
    # [100, 160], q_b_proj [160, 100], kv_a_proj_with_mqa [88, 160], kv_b_proj [176, 72],
    # o_proj [160, 80]; every layer dense.
    fp8_checkpoint(os.path.join(args.fixtures, "tiny-deepseek-v3.json"), "deepseek-fp8",
                   dict(num_hidden_layers=2, first_k_dense_replace=2, hidden_size=160, q_lora_rank=100,
                        kv_lora_rank=72, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=20,
                        intermediate_size=200, vocab_size=300),
                   ["lm_head"], args.out_dir)


if __name__ == "__main__":
    main()
