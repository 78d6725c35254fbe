#!/usr/bin/env python3
"""JAX's side of Palladium's comparisons with JAX (run with the venv scripts/setup.sh makes,
`$PALLADIUM_TPU_VENV/bin/python`, default ~/.cache/palladium/venv-tpu). No TPU needed:
libtpu compiles for a chip's topology and estimates cycles statically.

  serialize MODULE.mlir...       the serialized (stable_mosaic, current version) text JAX would
                                 embed in a tpu_custom_call for each Mosaic module, parsed and
                                 verified with JAX's registered tpu dialect: {"bodies": {MODULE: ...}}
  pallas matmul|gemv|array_ops|element_windows|flash_attention[:k=v,...]|ops_matmul|paged_attention|gmm[:k=v,...] --chip C [--no-estimate]
                                 JAX Pallas's own reference kernel: its Mosaic module as Pallas
                                 prints it (debug=True, canonicalized; none for the ops.tpu ones:
                                 ops_matmul, paged_attention, gmm, which also reports its
                                 routing's `num_tiles` and `group_sizes`),
                                 the body it embeds, its
                                 call spec, and libtpu's code size and estimated cycles (null
                                 with --no-estimate: libtpu 0.0.42.1's static profiler aborts
                                 the process on these kernels for v7x and v4)
  compile-time BODY CALL.json --chip C [--repeat N]
                                 wall time of a compile + cycle estimate of a Palladium body
                                 through JAX (palladium_jax.load, aliased operands donated):
                                 the first (libtpu starting) and the steady ones

Each prints one JSON object with `ok` (and `error` on failure); exit status 0 iff ok.
"""
import argparse
import base64
import json
import statistics
import sys
import time
from pathlib import Path

_STARTED = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from palladium_jax import deviceless  # noqa: E402
from palladium_jax.kernel import KernelFiles, PalladiumKernel, type_name  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

# The reference kernels' problems (shapes, blocks): the same as the Palladium kernels they are
# compared with (lowering/tests/oracle.rs, benches/kernels.rs).
MATMUL = dict(m=1024, k=2048, n=1024, bm=256, bk=512, bn=256)
GEMV = dict(batch=8, k=4096, n=14336, bn=1024)
FLASH = dict(batch=2, heads=2, seq_q=512, seq_k=512, head_dim=64, block_q=128, block_k_major=256, block_k=128, causal=True, kv_buffers=2)
# `ops.tpu.matmul` and `ops.tpu.paged_attention` as shipped (issue 34's peers table).
OPS_MATMUL = dict(m=4096, k=4096, n=4096, bm=512, bk=512, bn=512)
PAGED = dict(batch=8, kv_heads=8, group=4, head_dim=128, context=4096, page=128, block=2048)
# Megablox gmm at issue 34's decode routing: 8 tokens x top-8 of 128 experts, 53 experts hit.
GMM = dict(m=64, k=2048, n=1536, groups=128, hit=53, tm=64, tk=1024, tn=512, static=True)


def matmul(x, y, bm, bk, bn, *, interpret=False, debug=False):
    """The Pallas tiled matmul: bf16 in, an f32 VMEM accumulator over the k blocks."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret, debug=debug)(x, y)


def gemv(x, w, bn, *, debug=False):
    """Decode GEMV: the whole k in one block, the weight streamed in column blocks."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    batch, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((batch, n), jnp.float32),
        grid=(n // bn,),
        in_specs=[pl.BlockSpec((batch, k), lambda j: (0, 0)), pl.BlockSpec((k, bn), lambda j: (0, j))],
        out_specs=pl.BlockSpec((batch, bn), lambda j: (0, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=100 * 2**20),
        debug=debug)(x, w)


def array_ops(shift, x, w, *, debug=False):
    """Palladium's `array_ops` coverage kernel written in Pallas, line for line: value slices,
    concatenate, pltpu.roll by a static and a scalar-prefetched shift, repeat, mean, max/min
    over an axis, maximum/minimum, an NT dot_general, the approximate reciprocal, argmax/argmin."""
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(shift_ref, x_ref, w_ref, o_ref, idx_ref):
        v = x_ref[...]
        left = v[:, 0:128]
        swapped = jnp.concatenate([v[:, 128:256], left], axis=1)
        rolled = pltpu.roll(v, 3, 1) + pltpu.roll(v, shift_ref[0], 0)
        stats = v[:, 0:1] + jnp.mean(v, axis=1, keepdims=True) + jnp.max(v, axis=-1, keepdims=True) - jnp.min(v, axis=1).reshape(8, 1)
        spread = jnp.maximum(jnp.repeat(left[:, 0:64], 4, axis=1), 0.0)
        p = lax.dot_general(left, w_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        r = pl.reciprocal(p * p + 1.0, approx=True)
        o_ref[...] = swapped + rolled + stats + spread + jnp.concatenate([r, jnp.minimum(r, 0.5)], axis=1)
        idx_ref[...] = jnp.argmax(v, axis=1).reshape(8, 1) * 1000 + jnp.argmin(left, axis=0)
    rows = x.shape[0]
    return pl.pallas_call(
        body, out_shape=[jax.ShapeDtypeStruct((rows, 256), jnp.float32), jax.ShapeDtypeStruct((rows, 128), jnp.int32)],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(rows // 8,),
            in_specs=[pl.BlockSpec((8, 256), lambda i, s: (i, 0)), pl.BlockSpec((128, 128), lambda i, s: (0, 0))],
            out_specs=[pl.BlockSpec((8, 256), lambda i, s: (i, 0)), pl.BlockSpec((8, 128), lambda i, s: (i, 0))]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        debug=debug)(shift, x, w)


def flash_attention(q, k, v, block_q, block_k_major, block_k, causal, kv_buffers, *, debug=False):
    """The forward flash attention of JAX's Pallas TPU ops (`jax/experimental/pallas/ops/tpu/
    flash_attention.py`, `_flash_attention_kernel_single_batch` with block_b = 1, no bias or
    segment ids), its K and V specs `pipeline_mode=pl.Buffered(kv_buffers)`: Palladium's
    `flash_attention` line for line."""
    import math
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    sm_scale = 1.0 / math.sqrt(head_dim)
    mask_value = -0.7 * float(jnp.finfo(jnp.float32).max)

    def below_or_on_diag(r, r_blk, c, c_blk):
        return ((r + 1) * r_blk - 1) > (c * c_blk)

    def body(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        q_idx, kv_idx = pl.program_id(2), pl.program_id(3)

        @pl.when(kv_idx == 0)
        def _():
            m_ref[0, 0] = jnp.full((block_q, 128), -jnp.inf, jnp.float32)
            l_ref[0, 0] = jnp.zeros((block_q, 128), jnp.float32)
            acc_ref[0, 0] = jnp.zeros((block_q, head_dim), jnp.float32)

        def tile_lanes(x, n):
            return jnp.tile(x, (1, n // 128)) if n >= 128 else x[:, :n]

        @pl.when(below_or_on_diag(q_idx, block_q, kv_idx, block_k_major) if causal else True)
        def _():
            for start_k in range(0, block_k_major, block_k):
                m_prev = m_ref[0, 0]
                l_prev = l_ref[0, 0]
                q = q_ref[0, 0]
                k = k_ref[0, 0, pl.ds(start_k, block_k), :]
                s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
                s *= sm_scale
                if causal:
                    row_ids = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0) + q_idx * block_q
                    col_ids = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1) + (kv_idx * block_k_major + start_k)
                    s = s + jnp.where(col_ids <= row_ids, 0.0, mask_value)
                m_curr = jnp.max(s, axis=1)[:, None]
                m_next = jnp.maximum(m_prev, m_curr)
                p = jnp.exp(s - tile_lanes(m_next, block_k))
                alpha = jnp.exp(m_prev - m_next)
                l_corr = alpha * l_prev
                l_next = jnp.sum(p, axis=1)[:, None] + l_corr
                l_ref[0, 0] = l_next
                m_ref[0, 0] = m_next
                l_next_inv_safe = jnp.where(l_next == 0.0, 1.0, 1.0 / l_next)
                acc_ref[0, 0] *= tile_lanes(l_corr * l_next_inv_safe, head_dim)
                v = v_ref[0, 0, pl.ds(start_k, block_k), :]
                o_curr = lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
                acc_ref[0, 0] += o_curr * tile_lanes(l_next_inv_safe, head_dim)

        @pl.when(kv_idx == seq_k // block_k_major - 1)
        def _():
            o_ref[0, 0] = acc_ref[0, 0].astype(o_ref.dtype)

    def kv_map(b, h, i, j):
        return (b, h, lax.select(below_or_on_diag(i, block_q, j, block_k_major), j, 0) if causal else j, 0)
    kv_spec = pl.BlockSpec((1, 1, block_k_major, head_dim), kv_map, pipeline_mode=pl.Buffered(kv_buffers))
    return pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(batch, heads, seq_q // block_q, seq_k // block_k_major),
        in_specs=[pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0)), kv_spec, kv_spec],
        out_specs=pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0)),
        scratch_shapes=[pltpu.VMEM((1, 1, block_q, 128), jnp.float32), pltpu.VMEM((1, 1, block_q, 128), jnp.float32),
                        pltpu.VMEM((1, 1, block_q, head_dim), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        debug=debug)(q, k, v)


def routing(m, groups, hit):
    """Rows per expert of a fixed routing: `hit` experts spread evenly over `groups`, the `m`
    rows dealt to them as evenly as possible (the first `m % hit` get one more)."""
    import numpy as np
    sizes = np.zeros(groups, np.int32)
    for i in range(hit):
        sizes[i * groups // hit] = m // hit + (i < m % hit)
    return sizes


def gmm(lhs, rhs, group_sizes, tm, tk, tn, *, static):
    """Megablox's grouped matmul (`jax.experimental.pallas.ops.tpu.megablox.gmm`) as shipped.
    Its visit axis' extent is `num_active_tiles` from the group metadata, a traced value: a
    dynamic grid (`iteration_bounds` `?`, the count passed as the call's first operand), whose
    steps libtpu's static estimate cannot count. With `static`, `group_sizes` (numpy) are
    constants and the metadata is evaluated at trace time, so the extent is the routing's
    exact visit count, what Palladium's `grouped_matmul` gets from `num_tiles`."""
    import contextlib
    import importlib
    # The module (the package's `gmm` attribute is ops.py's custom-vjp wrapper of its function).
    megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

    make = megablox.make_group_metadata

    # gmm is jitted, so the sizes it passes are traced: the constant ones (and group 0 first,
    # no sharding) are evaluated here instead.
    def static_metadata(**kw):
        with jax.ensure_compile_time_eval():
            metadata, num_tiles = make(**{**kw, "group_sizes": jnp.asarray(group_sizes), "start_group": 0})
        return metadata, int(num_tiles)
    patch = _patched(megablox, "make_group_metadata", static_metadata) if static else contextlib.nullcontext()
    with patch:
        return megablox.gmm(lhs, rhs, jnp.asarray(group_sizes), preferred_element_type=lhs.dtype, tiling=(tm, tk, tn))


@__import__("contextlib").contextmanager
def _patched(module, name, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def gmm_visits(group_sizes, m, tm):
    """Megablox's visit count for a routing (`make_group_metadata`'s `num_tiles`): each
    non-empty group visits every m tile its rows touch."""
    offsets = [0]
    for s in group_sizes:
        offsets.append(offsets[-1] + int(s))
    return sum(-(-hi // tm) - lo // tm for lo, hi in zip(offsets, offsets[1:]) if hi > lo)


def element_windows(x, *, debug=False):
    """Palladium's `element_windows` coverage kernel written in Pallas, line for line:
    `pl.Element` blocks (element offsets from the index maps), the input padded 8 rows after."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, o_ref):
        here = x_ref[0:8, :]
        o_ref[...] = here

        @pl.when(pl.program_id(0) < pl.num_programs(0) - 1)
        def _():
            o_ref[...] = here + x_ref[8:16, :]
    rows = x.shape[0]
    return pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32), grid=(rows // 8,),
        in_specs=[pl.BlockSpec((pl.Element(16, (0, 8)), pl.Element(128)), lambda i: (i * 8, 0))],
        out_specs=pl.BlockSpec((pl.Element(8), pl.Element(128)), lambda i: (i * 8, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        debug=debug)(x)


def reference(name):
    """(function of the operands taking debug=, operand types) of a reference kernel."""
    bf16 = jnp.bfloat16
    if name == "matmul":
        p = MATMUL
        return (lambda x, y, debug=False: matmul(x, y, p["bm"], p["bk"], p["bn"], debug=debug),
                [jax.ShapeDtypeStruct((p["m"], p["k"]), bf16), jax.ShapeDtypeStruct((p["k"], p["n"]), bf16)])
    if name == "gemv":
        p = GEMV
        return (lambda x, w, debug=False: gemv(x, w, p["bn"], debug=debug),
                [jax.ShapeDtypeStruct((p["batch"], p["k"]), bf16), jax.ShapeDtypeStruct((p["k"], p["n"]), bf16)])
    if name == "array_ops":
        return (array_ops, [jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((16, 256), jnp.float32),
                            jax.ShapeDtypeStruct((128, 128), jnp.float32)])
    if name == "element_windows":
        return (element_windows, [jax.ShapeDtypeStruct((32, 128), jnp.float32)])
    if name.startswith("flash_attention"):
        # `flash_attention[:k=v,...]`: FLASH with overrides (the Palladium kernel's --set names).
        p = overrides(FLASH, name)
        fa = {n: p[n] for n in ("block_q", "block_k_major", "block_k", "causal", "kv_buffers")}
        q = jax.ShapeDtypeStruct((p["batch"], p["heads"], p["seq_q"], p["head_dim"]), bf16)
        kv = jax.ShapeDtypeStruct((p["batch"], p["heads"], p["seq_k"], p["head_dim"]), bf16)
        return (lambda q_, k_, v_, debug=False: flash_attention(q_, k_, v_, **fa, debug=debug), [q, kv, kv])
    if name.startswith("ops_matmul"):
        from jax.experimental.pallas.ops.tpu.matmul import matmul as ops_matmul
        p = overrides(OPS_MATMUL, name)
        return (lambda x, y: ops_matmul(x, y, block_shape=(p["bm"], p["bn"]), block_k=p["bk"]),
                [jax.ShapeDtypeStruct((p["m"], p["k"]), bf16), jax.ShapeDtypeStruct((p["k"], p["n"]), bf16)],
                {"debug_module": False})
    if name.startswith("paged_attention"):
        # Every sequence `context` long, its pages in order; `block` tokens per compute block.
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        p = overrides(PAGED, name)
        pages = p["context"] // p["page"]
        q = jax.ShapeDtypeStruct((p["batch"], p["kv_heads"] * p["group"], p["head_dim"]), bf16)
        kv = jax.ShapeDtypeStruct((p["kv_heads"], p["batch"] * pages, p["page"], p["head_dim"]), bf16)
        lengths = jnp.full((p["batch"],), p["context"], jnp.int32)
        table = jnp.arange(p["batch"] * pages, dtype=jnp.int32).reshape(p["batch"], pages)
        return (lambda q_, k_, v_: paged_attention(q_, k_, v_, lengths, table, pages_per_compute_block=p["block"] // p["page"],
                                                   inline_seq_dim=True),
                [q, kv, kv], {"debug_module": False})
    if name.startswith("gmm"):
        p = overrides(GMM, name)
        sizes = routing(p["m"], p["groups"], p["hit"])
        lhs = jax.ShapeDtypeStruct((p["m"], p["k"]), bf16)
        rhs = jax.ShapeDtypeStruct((p["groups"], p["k"], p["n"]), bf16)
        tiles = dict(tm=p["tm"], tk=p["tk"], tn=p["tn"], static=p["static"])
        extra = {"num_tiles": gmm_visits(sizes, p["m"], p["tm"]), "group_sizes": sizes.tolist(), "debug_module": False}
        if p["static"]:
            return (lambda x, w: gmm(x, w, sizes, **tiles), [lhs, rhs], extra)
        return (lambda x, w, g: gmm(x, w, g, **tiles),
                [lhs, rhs, jax.ShapeDtypeStruct((p["groups"],), jnp.int32)], extra)
    raise ValueError(f"unknown reference kernel {name!r}; known: matmul, gemv, array_ops, element_windows, flash_attention, ops_matmul, paged_attention, gmm (each [:k=v,...])")


def overrides(defaults, name):
    """`defaults` with the `NAME:k=v,...` overrides of a reference kernel's name."""
    p = dict(defaults)
    for setting in filter(None, name.partition(":")[2].split(",")):
        key, _, value = setting.partition("=")
        if key not in p:
            raise ValueError(f"{name.partition(':')[0]} has no parameter {key!r}; known: {', '.join(p)}")
        p[key] = value == "true" if isinstance(p[key], bool) else int(value)
    return p


def mosaic_context():
    """An MLIR context with JAX's registered tpu dialect."""
    from jax._src.interpreters import mlir as jmlir
    from jax.experimental.mosaic.dialects import tpu
    ctx = jmlir.make_ir_context()
    tpu.register_dialect(ctx)
    return ctx


def serialized_text(module_text):
    """Parse + verify a Mosaic module with the tpu dialect, then serialize it as JAX does
    (`mosaic-serde`, current version: libtpu 0.0.42.1 reads it without a downgrade), printed
    with its source locations (`loc(...)`: JAX's serialized bytecode keeps them too)."""
    from jax._src.lib.mlir import ir, passmanager
    ctx = mosaic_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(module_text)
        if not module.operation.verify():
            raise ValueError("the module does not verify")
        ctx.allow_unregistered_dialects = True
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(module.operation)
        return module.operation.get_asm(enable_debug_info=True)


def embedded_call(lowered):
    """The tpu_custom_call of a lowered JAX function: (its Mosaic body as text, its backend
    config without the body)."""
    from jax._src.lib.mlir import ir
    bodies = []

    def visit(op):
        if op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value == "tpu_custom_call":
            config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
            bodies.append((base64.b64decode(config["custom_call_config"].pop("body")), config))
        return ir.WalkResult.ADVANCE
    lowered.compiler_ir("stablehlo").operation.walk(visit)
    if len(bodies) != 1:
        raise ValueError(f"expected one tpu_custom_call, found {len(bodies)}")
    ctx = mosaic_context()
    ctx.allow_unregistered_dialects = True  # the serialized form's `stable_mosaic` version marker
    body, config = bodies[0]
    with ctx, ir.Location.unknown():
        return str(ir.Module.parse(body)), config


def cmd_serialize(a):
    # Several modules in one process: the import of jax + jaxlib costs more than a module.
    return {"ok": True, "bodies": {m: serialized_text(Path(m).read_text()) for m in a.modules}}


def cmd_pallas(a):
    import contextlib
    import io
    import re
    fn, args, *extra = reference(a.name)
    extra = extra[0] if extra else {}
    module = None
    if extra.pop("debug_module", True):  # the ops kernels take no debug flag: no printed module
        # Pallas prints the (canonicalized) Mosaic module of a pallas_call lowered with debug=True.
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            deviceless.lower(lambda *xs: fn(*xs, debug=True), args, a.chip)
        m = re.search(r"^module .*?^}\s*$", printed.getvalue(), re.S | re.M)
        if not m:
            raise ValueError(f"Pallas printed no Mosaic module:\n{printed.getvalue()[:2000]}")
        module = m.group(0).rstrip() + "\n"
    # The kernel as Pallas ships it (no debug canonicalization) for the body and the estimate.
    lowered = deviceless.lower(fn, args, a.chip)
    _, report = deviceless.compile(lowered, a.chip)
    body, config = embedded_call(lowered)
    vmem_limit = [c["size"] for c in config.get("scoped_memory_configs", []) if c["memory_space"] == 1]
    return {"ok": True, "kernel": a.name, "module": module, "body": body, **extra,
            "inputs": [type_name(t) for t in args], "outputs": [type_name(t) for t in jax.tree.leaves(jax.eval_shape(fn, *args))],
            "vmem_limit_bytes": vmem_limit[0] if vmem_limit else None, **report}


def cmd_compile_time(a):
    imported_s = time.perf_counter() - _STARTED
    kernel = PalladiumKernel(KernelFiles(body=Path(a.body), call_spec=Path(a.call_spec)))
    times, reports = [], []
    for _ in range(1 + a.repeat):
        # A fresh function each time: JAX caches traces and compiles per function object.
        fresh = lambda *xs: kernel(*xs)  # noqa: E731
        t = time.perf_counter()
        lowered = deviceless.lower(fresh, kernel.inputs, a.chip, donate_argnums=kernel.donate_argnums)
        _, report = deviceless.compile(lowered, a.chip)
        times.append(time.perf_counter() - t)
        if not report["ops"]:
            raise RuntimeError("libtpu dumped no static profile for a compile (did it compile at all?)")
        reports.append(report)
    cycles = {r["estimated_cycles"] for r in reports}
    if len(cycles) != 1:
        raise RuntimeError(f"the estimate changed between identical compiles: {sorted(cycles)}")
    return {"ok": True, "kernel": kernel.name, "chip": a.chip, "import_s": imported_s, "first_s": times[0],
            "steady_s": statistics.median(times[1:]) if a.repeat else None, "runs_s": times[1:],
            "code_size_bytes": reports[0]["code_size_bytes"], "estimated_cycles": cycles.pop(),
            "jax": jax.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serialize")
    s.add_argument("modules", nargs="+", metavar="MODULE")
    r = sub.add_parser("pallas")
    r.add_argument("name", help="matmul, gemv, array_ops, element_windows or flash_attention[:k=v,...] (e.g. flash_attention:causal=false)")
    r.add_argument("--chip", default="v6e", choices=sorted(deviceless.TOPOLOGIES))
    r.add_argument("--no-estimate", action="store_true", help="compile without libtpu's static profile")
    c = sub.add_parser("compile-time")
    c.add_argument("body")
    c.add_argument("call_spec")
    c.add_argument("--chip", default="v6e", choices=sorted(deviceless.TOPOLOGIES))
    c.add_argument("--repeat", type=int, default=5, help="steady compiles after the first")
    a = p.parse_args()
    if a.cmd == "compile-time" or (a.cmd == "pallas" and not a.no_estimate):
        deviceless.enable_cycle_estimates()  # before libtpu starts
    try:
        result = {"serialize": cmd_serialize, "pallas": cmd_pallas, "compile-time": cmd_compile_time}[a.cmd](a)
    except Exception as e:  # the toolchain's own words, as JSON
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
