"""A Palladium kernel's emitted files as a JAX function (see the package docs)."""
from __future__ import annotations

import base64
import dataclasses
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp

# The dtype names of Palladium's call spec (`DType::name` in dsl/src/ir/types.rs).
DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32,
          "f8e4m3fn": jnp.float8_e4m3fn, "f8e5m2": jnp.float8_e5m2, "i32": jnp.int32,
          "i16": jnp.int16, "i8": jnp.int8, "i4": jnp.int4, "bool": jnp.bool_}

_TYPE = re.compile(r"(\w+)\[([\d,]*)\]")
_BYTECODE_MAGIC = b"ML\xefR"


class PalladiumKernelError(ValueError):
    """Emitted files that cannot be loaded, or a call with the wrong arguments."""


@dataclasses.dataclass(frozen=True)
class KernelFiles:
    """The two files `load` reads: the serialized body and the call spec."""
    body: Path
    call_spec: Path

    @staticmethod
    def find(directory, name: str | None = None) -> "KernelFiles":
        d = Path(directory)
        if not d.is_dir():
            raise PalladiumKernelError(f"{d}: not a directory (expected the --out DIR of `palladium emit` "
                                       "or `palladium megakernel`)")
        if name is None:
            names = sorted(p.name[:-len(".call.json")] for p in d.glob("*.call.json"))
            if not names:
                raise PalladiumKernelError(f"{d}: no *.call.json here (expected the --out DIR of "
                                           "`palladium emit` or `palladium megakernel`)")
            if len(names) > 1:
                raise PalladiumKernelError(f"{d} holds several kernels ({', '.join(names)}): "
                                           "pass name=")
            name = names[0]
        files = KernelFiles(body=d / f"{name}.body.mlir", call_spec=d / f"{name}.call.json")
        for p in (files.call_spec, files.body):
            if not p.is_file():
                raise PalladiumKernelError(f"{p}: missing (`palladium emit` writes {name}.body.mlir "
                                           f"and {name}.call.json together)")
        return files


def _parse_type(text, where: str) -> jax.ShapeDtypeStruct:
    m = _TYPE.fullmatch(text) if isinstance(text, str) else None
    if not m or m.group(1) not in DTYPES:
        raise PalladiumKernelError(f"{where}: {text!r} is not an array type like bf16[1024,2048] "
                                   f"(dtypes: {', '.join(DTYPES)})")
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return jax.ShapeDtypeStruct(dims, DTYPES[m.group(1)])


def type_name(t) -> str:
    """`bf16[1024,2048]`: the call spec's spelling of an array type."""
    name = next((n for n, d in DTYPES.items() if jnp.dtype(d) == jnp.dtype(t.dtype)), str(t.dtype))
    return f"{name}[{','.join(map(str, t.shape))}]"


def _read_call_spec(path: Path) -> dict:
    try:
        spec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PalladiumKernelError(f"{path}: not a call spec JSON: {e}") from None
    if not isinstance(spec, dict):
        raise PalladiumKernelError(f"{path}: expected a JSON object")
    for key in ("inputs", "outputs"):
        if not isinstance(spec.get(key), list):
            raise PalladiumKernelError(f"{path}: `{key}` must be a list of array types")
    if not spec["outputs"]:
        raise PalladiumKernelError(f"{path}: `outputs` is empty (a kernel has at least one result)")
    limit = spec.get("vmem_limit_bytes")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise PalladiumKernelError(f"{path}: `vmem_limit_bytes` must be a positive integer or null, got {limit!r}")
    return spec


class PalladiumKernel:
    """A Palladium kernel as a JAX function: `kernel(*operands)`.

    `inputs` / `outputs` are the per-device operand and result types (under `jax.shard_map`
    the kernel sees one shard); `input_output_aliases` maps an operand index to the result
    that reuses its buffer; pass `donate_argnums=kernel.donate_argnums` to `jax.jit` to let
    XLA update those operands in place instead of copying them first. `backend_config` is the
    `tpu_custom_call` payload (also what torch_xla's `_xla_tpu_custom_call` takes).
    """

    def __init__(self, files: KernelFiles):
        spec = _read_call_spec(files.call_spec)
        where = files.call_spec
        self.files = files
        self.name: str = spec.get("name") or files.call_spec.name[:-len(".call.json")]
        self.inputs = tuple(_parse_type(t, f"{where}: inputs[{i}]") for i, t in enumerate(spec["inputs"]))
        self.outputs = tuple(_parse_type(t, f"{where}: outputs[{i}]") for i, t in enumerate(spec["outputs"]))
        self.vmem_limit_bytes: int | None = spec.get("vmem_limit_bytes")
        self.input_output_aliases = self._aliases(spec.get("input_output_aliases", []), where)
        self.has_communication = bool(spec.get("has_communication", False))
        self.collective_id: int | None = spec.get("collective_id")
        body = files.body.read_bytes()
        if not (body.startswith(_BYTECODE_MAGIC) or b"stable_mosaic.version" in body[:4096]):
            raise PalladiumKernelError(f"{files.body}: not a serialized Mosaic body (no "
                                       "`stable_mosaic.version` module attribute)")
        self.backend_config = json.dumps(self._config(body))
        multiple = len(self.outputs) > 1
        self._call = jax.ffi.ffi_call(
            "tpu_custom_call", list(self.outputs) if multiple else self.outputs[0],
            custom_call_api_version=1, legacy_backend_config=self.backend_config,
            input_output_aliases=self.input_output_aliases or None)
        self.__name__ = self.name  # jax.jit names the computation after it

    def _aliases(self, pairs, where) -> dict[int, int]:
        aliases: dict[int, int] = {}
        if not isinstance(pairs, list):
            raise PalladiumKernelError(f"{where}: `input_output_aliases` must be a list of [input, output] pairs")
        for pair in pairs:
            ok = (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair)
                  and 0 <= pair[0] < len(self.inputs) and 0 <= pair[1] < len(self.outputs))
            if not ok:
                raise PalladiumKernelError(f"{where}: input_output_aliases entry {pair!r} is not "
                                           f"[input < {len(self.inputs)}, output < {len(self.outputs)}]")
            i, o = pair
            if o in aliases.values() or i in aliases:
                raise PalladiumKernelError(f"{where}: input_output_aliases uses input {i} or output {o} twice")
            if self.inputs[i] != self.outputs[o]:
                raise PalladiumKernelError(f"{where}: input {i} ({type_name(self.inputs[i])}) aliases "
                                           f"output {o} ({type_name(self.outputs[o])}): types differ")
            aliases[i] = o
        return aliases

    def _config(self, body: bytes) -> dict:
        """The backend config JAX Pallas writes for the same kernel (`CustomCallBackendConfig`)."""
        call = {"body": base64.b64encode(body).decode("ascii")}
        if self.has_communication:
            call["has_communication"] = True
        if self.collective_id is not None:
            call["collective_id"] = self.collective_id
        call.update(serialization_format=1, needs_layout_passes=True, shape_invariant_numerics=False)
        config = {"custom_call_config": call}
        if self.vmem_limit_bytes is not None:
            config["scoped_memory_configs"] = [{"memory_space": 1, "offset": 0, "size": self.vmem_limit_bytes}]
        return config

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        return tuple(sorted(self.input_output_aliases))

    def __call__(self, *operands):
        if len(operands) != len(self.inputs):
            raise PalladiumKernelError(
                f"{self.name} takes {len(self.inputs)} operands "
                f"({', '.join(map(type_name, self.inputs))}), got {len(operands)}")
        for i, (x, want) in enumerate(zip(operands, self.inputs)):
            shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
            if shape is None or dtype is None:
                raise PalladiumKernelError(f"{self.name}: operand {i} must be an array of "
                                           f"{type_name(want)}, got {type(x).__name__}")
            if tuple(shape) != want.shape or jnp.dtype(dtype) != jnp.dtype(want.dtype):
                got = jax.ShapeDtypeStruct(tuple(shape), dtype)
                raise PalladiumKernelError(f"{self.name}: operand {i} must be {type_name(want)}, "
                                           f"got {type_name(got)}")
        results = self._call(*operands)
        return tuple(results) if len(self.outputs) > 1 else results

    def __repr__(self):
        ins = ", ".join(map(type_name, self.inputs))
        outs = ", ".join(map(type_name, self.outputs))
        return f"PalladiumKernel({self.name}: ({ins}) -> ({outs}), aliases {self.input_output_aliases})"


def load(directory, name: str | None = None) -> PalladiumKernel:
    """The kernel `name` (the files' stem: the kernel's name, or `megakernel`) of an emit
    directory; `name` may be left out when the directory holds one kernel."""
    return PalladiumKernel(KernelFiles.find(directory, name))
