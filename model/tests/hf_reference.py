#!/usr/bin/env python3
"""Hugging Face transformers' own forward pass of a tiny checkpoint: the oracle of
`model/tests/hf_conformance.rs`.

Builds the model of a fixture config.json with transformers, random-initialises it with a
seed (scales that keep activations O(1), like `palladium_model::Weights::random`), saves it
as a bf16 safetensors checkpoint + config.json into --out-dir, reloads that checkpoint in
float32 and in bfloat16 (eager attention), and runs prompt + greedy decode in each, writing

    OUT_DIR/hf_float32.json, OUT_DIR/hf_bfloat16.json:
        {"generated_ids": [...], "steps": [{"logits": [...]}, ...], "dtype": ..., ...}

`steps[i].logits` chose `generated_ids[i]`: step 0 follows the prompt (fed as one block),
step i follows feeding generated_ids[i-1] through the KV cache. With --f32-on-bf16-ids it also
writes OUT_DIR/hf_float32_on_bfloat16_ids.json: the float32 model teacher-forced on the
bfloat16 model's ids (step i follows feeding bfloat16's generated_ids[i-1]; `fed_ids` lists
them), so that both precisions' logits are along the same sequence.

A fixture with an mxfp4 `quantization_config` (gpt-oss) is built unquantized, its saved
experts rewritten as MXFP4 blocks and scales (`to_mxfp4`), and both runs load that checkpoint
(decoded by transformers' `convert_moe_packed_tensors`, as its loader does on the CPU).

Run with the oracle venv's python (scripts/setup.sh installs torch and transformers there):
    $PALLADIUM_TPU_VENV/bin/python model/tests/hf_reference.py \
        --config fixtures/models/tiny-qwen3-moe.json --seed 7 --prompt-ids 1,2,3 --steps 8 \
        --out-dir /tmp/hf-tiny
"""

import argparse
import json
import math
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def reinit(model, seed):
    """Seeded init with O(1) activations: embeddings N(0, 1), linear weights N(0, 1/in)
    (fused experts' [experts, in, out] too, gpt-oss's gate_up 4x), biases (and routers' e_score_correction_bias
    buffers) N(0, 0.01), attention sinks N(0, 1), norm weights U(0.8, 1.2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # `*norm.weight`, and DBRX's `norm_1` / `norm_2` / `norm_f`.
            if re.search(r"norm(_\w+)?\.weight$", name):
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight") or name.endswith("wte.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") or name.endswith("_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".sinks"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif p.dim() == 3:
                # Fused experts (gpt-oss), `x @ W`: [experts, in, out]. gate_up 4x larger,
                # so that its clamp at 7 (swiglu_limit) is reached.
                gpt_oss = model.config.model_type == "gpt_oss"
                scale = 4.0 if gpt_oss and name.endswith("gate_up_proj") else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            else:
                raise SystemExit(f"hf_reference.py: no init rule for parameter {name} {tuple(p.shape)}")
        # Persistent buffers saved with the checkpoint: DeepSeek-V3-style routers' correction
        # bias (zeros as built, which would hide a wrong use of it) is drawn like a bias.
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def to_mxfp4(w):
    """gpt-oss's MXFP4 form of a fused expert tensor `w` [experts, in, out] (x @ W): the
    transposed [experts, out, in] in groups of 32 inputs, each an e8m0 scale (the smallest
    power of two that brings the group within e2m1's +-6) and 32 nearest e2m1 codes, two a
    byte, low nibble first. Returns (blocks u8 [e, out, in/32, 16], scales u8 [e, out, in/32]).
    """
    t = w.float().transpose(1, 2).contiguous()
    e, rows, cols = t.shape
    g = t.reshape(e, rows, cols // 32, 32)
    amax = g.abs().amax(dim=-1).clamp(min=2.0**-126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, exp)[..., None]
    grid = torch.tensor(E2M1)
    mag = (scaled.abs()[..., None] - grid).abs().argmin(dim=-1)
    codes = (mag + 8 * (scaled < 0)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8).contiguous()


def save_mxfp4(out_dir, quantization_config):
    """Rewrites the saved bf16 checkpoint in gpt-oss's shipped form: every fused expert
    matrix as `<name>_blocks` / `<name>_scales`, config.json with the quantization_config.
    Returns a folder holding the unquantized model transformers' own decoder
    (`convert_moe_packed_tensors`, what its loader runs on a CPU) makes of those blocks: the
    one the runs load (its loader's dequantizing path needs `accelerate`, which the venv
    does not install)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    decoded = dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = to_mxfp4(tensors.pop(name))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        decoded[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    decoded_dir = os.path.join(out_dir, "decoded")
    os.makedirs(decoded_dir, exist_ok=True)
    with open(os.path.join(decoded_dir, "config.json"), "w") as f:
        json.dump(saved, f, indent=2)
    save_file(decoded, os.path.join(decoded_dir, "model.safetensors"), metadata={"format": "pt"})
    saved["quantization_config"] = quantization_config
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2)
    return decoded_dir


def greedy(model, prompt, steps, forced=None):
    """Prompt + `steps` greedy steps; with `forced`, step i+1 is fed forced[i] instead of the
    argmax (teacher forcing; generated_ids are still the model's own argmaxes)."""
    ids, logits_out = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        for s in range(steps):
            tok = int(torch.argmax(logits))
            ids.append(tok)
            logits_out.append({"logits": logits.float().tolist()})
            if s + 1 < steps:
                if forced is not None:
                    tok = forced[s]
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
    return ids, logits_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument(
        "--f32-on-bf16-ids",
        action="store_true",
        help="also write hf_float32_on_bfloat16_ids.json: the float32 model teacher-forced on "
        "the bfloat16 model's generated ids (its logits along the bf16 sequence)",
    )
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    with open(args.config) as f:
        cfg = json.load(f)
    model_type = cfg.pop("model_type")
    # A pre-quantized form to ship: the model is built and initialised unquantized, then
    # its checkpoint rewritten (transformers dequantizes it again on load, on the CPU).
    quantization_config = cfg.pop("quantization_config", None)
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype"):
        cfg.pop(k, None)
    config = AutoConfig.for_model(model_type, **cfg)
    config.torch_dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    reinit(model, args.seed)
    model = model.to(torch.bfloat16)
    os.makedirs(args.out_dir, exist_ok=True)
    model.save_pretrained(args.out_dir, safe_serialization=True)
    del model
    load_dir = args.out_dir
    if quantization_config is not None:
        if quantization_config.get("quant_method") != "mxfp4":
            raise SystemExit(f"hf_reference.py: no writer for {quantization_config}")
        load_dir = save_mxfp4(args.out_dir, quantization_config)

    for dtype, tag in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        m = AutoModelForCausalLM.from_pretrained(load_dir, torch_dtype=dtype, attn_implementation="eager")
        m.eval()
        ids, steps = greedy(m, prompt, args.steps)
        # Phi-3.5-MoE's rotary embedding computes its (f32) inv_freq in every call; DBRX's
        # (under `transformer`) is each attention's own.
        rotary = getattr(getattr(m, "model", None), "rotary_emb", None)
        inv_freq = getattr(rotary, "inv_freq", torch.zeros(0, dtype=torch.float32))
        result = {
            "generated_ids": ids,
            "steps": steps,
            "dtype": tag,
            "prompt_ids": prompt,
            "seed": args.seed,
            "model_type": model_type,
            "inv_freq_dtype": str(inv_freq.dtype),
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
        }
        with open(os.path.join(args.out_dir, f"hf_{tag}.json"), "w") as f:
            json.dump(result, f)
        print(f"hf_reference.py: {model_type} {tag}: generated {ids}", file=sys.stderr)
        if tag == "bfloat16":
            bf16_ids = ids

    if args.f32_on_bf16_ids:
        m = AutoModelForCausalLM.from_pretrained(load_dir, torch_dtype=torch.float32, attn_implementation="eager")
        m.eval()
        ids, steps = greedy(m, prompt, args.steps, forced=bf16_ids)
        result = {
            "generated_ids": ids,
            "fed_ids": bf16_ids,
            "steps": steps,
            "dtype": "float32",
            "prompt_ids": prompt,
            "seed": args.seed,
            "model_type": model_type,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
        }
        with open(os.path.join(args.out_dir, "hf_float32_on_bfloat16_ids.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
