"""Ahead-of-time compiles for a TPU generation on a machine without a TPU, and libtpu's static
cycle estimate of the result.

libtpu compiles for a topology description (`jax.experimental.topologies`); no device is
needed. `enable_cycle_estimates()` must run before libtpu starts (before the first TPU
compile or topology of the process): libtpu reads `LIBTPU_INIT_ARGS` once, and its
`--xla_jf_dump_static_llo_profile_to` flag makes every compile dump a static LLO profile with
per-op estimated cycles. The profiler aborts the whole process on some kernels (see the
project's docs/benchmarks.md), so callers that must survive that run compiles in a child process.
"""
from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import tempfile

# Palladium's chip names (`palladium emit --chip`) and the topology compiled for: the smallest
# multi-chip slice of each generation (v6e:2x2 has 4 devices, tpu7x:2x2x1 8: one per core).
TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "v7x": "tpu7x:2x2x1"}

_profile_dir: str | None = None


def configure_libtpu():
    """Environment for a deviceless libtpu: no metadata server to wait for (it can stall for
    minutes), and no single-process lock (several compiling processes may run at once)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GLOG_minloglevel", "3")


def enable_cycle_estimates() -> str:
    """Make libtpu dump its static profile of every compile; returns the dump directory."""
    global _profile_dir
    configure_libtpu()
    if _profile_dir is None:
        _profile_dir = tempfile.mkdtemp(prefix="palladium-llo-profile-")
        # The process owns the directory: remove it (and any profile not yet read) at exit.
        atexit.register(shutil.rmtree, _profile_dir, ignore_errors=True)
        os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "")
                                          + f" --xla_jf_dump_static_llo_profile_to={_profile_dir}").strip()
    return _profile_dir


def _take_profiles() -> list[tuple[str, int]]:
    """(HLO op, estimated cycles) of every profile dumped since the last call; removes them."""
    ops = []
    for path in sorted(glob.glob(os.path.join(_profile_dir, "*static_llo_profile*"))):
        with open(path) as f:
            ops += [(op, int(c)) for op, c in re.findall(r'hlo_op_name: "([^"]*)"\s*estimated_cycles: (\d+)', f.read())]
        os.remove(path)
    return ops


def devices(chip: str):
    """The compile-only devices of the chip's topology."""
    from jax.experimental import topologies
    if chip not in TOPOLOGIES:
        raise ValueError(f"unknown chip {chip!r}; known: {', '.join(TOPOLOGIES)}")
    configure_libtpu()
    return topologies.get_topology_desc(topology_name=TOPOLOGIES[chip], platform="tpu").devices


def lower(fn, args, chip: str, *, donate_argnums=(), shardings=None):
    """Trace and lower `fn` for the chip. `args` are `jax.ShapeDtypeStruct`s; without
    `shardings` they live on the topology's first device."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if shardings is None:
        one = NamedSharding(Mesh(np.array(devices(chip)[:1]), ("x",)), P())
        shardings = [one] * len(args)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, shardings)]
    return jax.jit(fn, donate_argnums=donate_argnums).trace(*avals).lower(lowering_platforms=("tpu",))


def compile(lowered, chip: str):
    """Compile a `lower`ed function without a device. Returns (compiled, report): `report` has
    `chip`, `code_size_bytes`, `estimated_cycles` (the sum over the static profile's ops;
    `None` unless `enable_cycle_estimates()` ran first) and `ops` (cycles per HLO op)."""
    if _profile_dir is not None:
        _take_profiles()
    compiled = lowered.compile()
    ops = _take_profiles() if _profile_dir is not None else None
    report = {"chip": chip, "code_size_bytes": compiled.memory_analysis().generated_code_size_in_bytes,
              "estimated_cycles": sum(c for _, c in ops) if ops is not None else None,
              "ops": [{"op": op, "estimated_cycles": c} for op, c in ops or []]}
    return compiled, report
