"""Time JAX Pallas's interpret mode on the tiled matmul (the same kernel as the oracle's
reference matmul, `shared/tpu-oracle/oracle.py`), for `cargo bench --bench interpret`.

    JAX_PLATFORMS=cpu $PALLADIUM_TPU_VENV/bin/python benches/pallas_interpret.py \
        --m 1024 --k 2048 --n 1024 --bm 256 --bk 512 --bn 256 --runs 5

Prints one JSON line: {"median_s": ..., "runs": [...], "compile_s": ..., "jax": "..."}.
The call is jit-compiled; the first call (compile + run) is a warm-up and not counted.
"""
import argparse, json, os, statistics, time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402


def matmul(x, y, bm, bk, bn):
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
    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=True)(x, y)


def main():
    a = argparse.ArgumentParser()
    for d, v in (("m", 1024), ("k", 2048), ("n", 1024), ("bm", 256), ("bk", 512), ("bn", 256), ("runs", 5)):
        a.add_argument(f"--{d}", type=int, default=v)
    a = a.parse_args()
    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.uniform(kx, (a.m, a.k), jnp.float32, -1, 1).astype(jnp.bfloat16)
    y = jax.random.uniform(ky, (a.k, a.n), jnp.float32, -1, 1).astype(jnp.bfloat16)
    f = jax.jit(lambda x, y: matmul(x, y, a.bm, a.bk, a.bn))
    t = time.perf_counter()
    f(x, y).block_until_ready()
    compile_s = time.perf_counter() - t
    runs = []
    for _ in range(a.runs):
        t = time.perf_counter()
        f(x, y).block_until_ready()
        runs.append(time.perf_counter() - t)
    print(json.dumps({"median_s": statistics.median(runs), "runs": runs, "compile_s": compile_s,
                      "jax": jax.__version__, "backend": jax.default_backend()}))


if __name__ == "__main__":
    main()
