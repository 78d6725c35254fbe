"""Time JAX Pallas's interpret mode on the tiled matmul (the reference matmul of
`scripts/jax_reference.py`), for `cargo bench --bench interpret`.

    JAX_PLATFORMS=cpu $PALLADIUM_TPU_VENV/bin/python benches/pallas_interpret.py \
        --m 1024 --k 2048 --n 1024 --bm 256 --bk 512 --bn 256 --runs 5

Prints one JSON line: {"median_s": ..., "runs": [...], "compile_s": ..., "jax": "..."}.
The call is jit-compiled; the first call (compile + run) is a warm-up and not counted.
"""
import argparse, json, os, statistics, sys, time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from jax_reference import matmul  # noqa: E402


def main():
    a = argparse.ArgumentParser()
    for d, v in (("m", 1024), ("k", 2048), ("n", 1024), ("bm", 256), ("bk", 512), ("bn", 256), ("runs", 5)):
        a.add_argument(f"--{d}", type=int, default=v)
    a = a.parse_args()
    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.uniform(kx, (a.m, a.k), jnp.float32, -1, 1).astype(jnp.bfloat16)
    y = jax.random.uniform(ky, (a.k, a.n), jnp.float32, -1, 1).astype(jnp.bfloat16)
    f = jax.jit(lambda x, y: matmul(x, y, a.bm, a.bk, a.bn, interpret=True))
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
