"""Deviceless tests of palladium_jax on v6e (no TPU: libtpu compiles for the v6e:2x2 topology).

    $PALLADIUM_TPU_VENV/bin/python python/tests/test_deviceless.py EMIT_DIR

EMIT_DIR holds what `palladium emit KERNEL --chip v6e --out EMIT_DIR` wrote for matmul,
residual_add_inplace and kv_cache_update, and `palladium megakernel CONFIG --chip v6e --out
EMIT_DIR` (tests/jax_interop.rs prepares it). The kernels are called through
`palladium_jax.load`, compiled with `jax.jit` / `jax.shard_map`, and compared with the same
body compiled through JAX's own (private) tpu_custom_call primitive, the route Pallas takes.
"""
import json
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from palladium_jax import deviceless  # noqa: E402

deviceless.enable_cycle_estimates()  # before libtpu starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import palladium_jax  # noqa: E402
from palladium_jax import PalladiumKernelError  # noqa: E402

CHIP = "v6e"
EMIT_DIR: Path


def compile_kernel(fn, args, **kw):
    return deviceless.compile(deviceless.lower(fn, args, CHIP, **kw), CHIP)


def through_jax_primitive(kernel):
    """The same body and call spec through `jax._src.tpu_custom_call`, as Pallas calls it."""
    from jax._src import tpu_custom_call as tcc
    config = tcc._lowered_to_custom_call_config(
        kernel.files.body.read_bytes(), lowered_module_asm_version=None,
        vmem_limit_bytes=kernel.vmem_limit_bytes, cost_estimate=None, flags=None,
        allow_input_fusion=None, internal_scratch_in_bytes=None, collective_id=None,
        serialization_format=1, has_custom_barrier=False, has_communication=False,
        needs_hlo_passes=False, needs_layout_passes=True, device_type=None)
    outs = kernel.outputs if len(kernel.outputs) > 1 else kernel.outputs[0]
    return tcc._as_jax_callable(config, tcc.TpuSideEffectType.PURE, outs, kernel_name=kernel.name,
                                input_output_aliases=tuple(kernel.input_output_aliases.items()), metadata=None)


class SameAsJax(unittest.TestCase):
    """load()'s public ffi_call compiles to what JAX's own primitive compiles to."""

    def check(self, name, donate):
        k = palladium_jax.load(EMIT_DIR, name)
        donate_argnums = k.donate_argnums if donate else ()
        _, ours = compile_kernel(k, k.inputs, donate_argnums=donate_argnums)
        _, theirs = compile_kernel(through_jax_primitive(k), k.inputs, donate_argnums=donate_argnums)
        ops = ", ".join(f"{o['op']} {o['estimated_cycles']}" for o in ours["ops"])
        print(f"\n  {name} on {CHIP}: {ours['code_size_bytes']} bytes, {ours['estimated_cycles']} cycles ({ops})",
              file=sys.stderr)
        self.assertGreater(ours["estimated_cycles"], 0)
        self.assertEqual(ours["code_size_bytes"], theirs["code_size_bytes"])
        self.assertEqual(ours["estimated_cycles"], theirs["estimated_cycles"])

    def test_matmul(self):
        self.check("matmul", donate=False)

    def test_residual_add_inplace(self):
        self.check("residual_add_inplace", donate=True)

    def test_kv_cache_update(self):
        self.check("kv_cache_update", donate=True)

    def test_megakernel(self):
        self.check("megakernel", donate=True)


class Calls(unittest.TestCase):
    def test_types(self):
        mm = palladium_jax.load(EMIT_DIR, "matmul")
        self.assertEqual([(t.shape, t.dtype) for t in mm.inputs],
                         [((1024, 2048), jnp.bfloat16), ((2048, 1024), jnp.bfloat16)])
        out = jax.eval_shape(mm, *mm.inputs)
        self.assertEqual((out.shape, out.dtype), ((1024, 1024), jnp.bfloat16))
        mk = palladium_jax.load(EMIT_DIR, "megakernel")
        outs = jax.eval_shape(mk, *mk.inputs)
        self.assertIsInstance(outs, tuple)
        self.assertEqual([(o.shape, o.dtype) for o in outs], [(o.shape, o.dtype) for o in mk.outputs])

    def test_aliases_in_compiled_hlo(self):
        kv = palladium_jax.load(EMIT_DIR, "kv_cache_update")
        self.assertEqual(kv.input_output_aliases, {3: 0, 4: 1})
        self.assertEqual(kv.donate_argnums, (3, 4))
        copied, with_copies = compile_kernel(kv, kv.inputs)
        donated, in_place = compile_kernel(kv, kv.inputs, donate_argnums=kv.donate_argnums)
        for c in (copied, donated):
            self.assertIn("output_to_operand_aliasing={{0}: (3, {}), {1}: (4, {})}", c.as_text())
        # Donated caches are updated in place: the module aliases its parameters, and XLA adds
        # no whole-cache copies in front of the kernel.
        self.assertIn("input_output_alias={ {0}: (3, {}, may-alias), {1}: (4, {}, may-alias) }", donated.as_text())
        self.assertNotIn("input_output_alias=", copied.as_text())
        self.assertEqual([o["op"].split(".")[0] for o in in_place["ops"]], ["ffi_call"])
        self.assertIn("copy", [o["op"].split(".")[0] for o in with_copies["ops"]])
        self.assertLess(in_place["estimated_cycles"], with_copies["estimated_cycles"])

    def test_inside_a_larger_jit(self):
        """The kernel next to XLA's own ops. (libtpu's static profiler takes minutes on a
        module with two of these custom calls, so there is one here.)"""
        mm = palladium_jax.load(EMIT_DIR, "matmul")

        def f(x, y, bias):
            return mm(x, y) + bias
        compiled, report = compile_kernel(f, [*mm.inputs, mm.outputs[0]])
        self.assertEqual(compiled.as_text().count('custom_call_target="tpu_custom_call"'), 1)
        kernel_ops = [o for o in report["ops"] if o["op"].startswith("ffi_call")]
        self.assertEqual(len(kernel_ops), 1)
        self.assertGreater(kernel_ops[0]["estimated_cycles"], 0)
        self.assertGreater(report["estimated_cycles"], kernel_ops[0]["estimated_cycles"])  # + the add

    def test_shard_map(self):
        """Each of v6e:2x2's four devices multiplies its row block of x by the whole y."""
        mm = palladium_jax.load(EMIT_DIR, "matmul")
        mesh = Mesh(np.array(deviceless.devices(CHIP)), ("x",))
        f = jax.shard_map(mm, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
        (m, k), n = mm.inputs[0].shape, mm.outputs[0].shape[1]
        args = [jax.ShapeDtypeStruct((4 * m, k), jnp.bfloat16), mm.inputs[1]]
        compiled, sharded = compile_kernel(f, args, shardings=[NamedSharding(mesh, P("x")), NamedSharding(mesh, P())])
        _, single = compile_kernel(mm, mm.inputs)
        self.assertIn('custom_call_target="tpu_custom_call"', compiled.as_text())
        self.assertEqual(compiled.output_shardings.spec, P("x"))
        self.assertEqual(jax.eval_shape(f, *args).shape, (4 * m, n))
        self.assertEqual(sharded["estimated_cycles"], single["estimated_cycles"])


class Errors(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="palladium-jax-test-"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def copy(self, name):
        for suffix in (".body.mlir", ".call.json"):
            shutil.copy(EMIT_DIR / f"{name}{suffix}", self.tmp / f"{name}{suffix}")

    def assertFails(self, pattern, fn, *args, **kw):
        with self.assertRaisesRegex(PalladiumKernelError, pattern):
            fn(*args, **kw)

    def test_directories(self):
        self.assertFails("not a directory", palladium_jax.load, self.tmp / "nope")
        self.assertFails(r"no \*\.call\.json", palladium_jax.load, self.tmp)
        self.assertFails("several kernels .*kv_cache_update, matmul.*pass name=", palladium_jax.load, EMIT_DIR)
        self.assertFails(r"nope\.call\.json: missing", palladium_jax.load, EMIT_DIR, "nope")
        self.copy("matmul")
        (self.tmp / "matmul.body.mlir").unlink()
        self.assertFails(r"matmul\.body\.mlir: missing", palladium_jax.load, self.tmp)

    def test_bad_files(self):
        self.copy("residual_add_inplace")
        spec_path = self.tmp / "residual_add_inplace.call.json"
        good = json.loads(spec_path.read_text())
        for change, pattern in [
            ("{", "not a call spec JSON"),
            ({**good, "inputs": ["bf17[4]", *good["inputs"][1:]]}, r"inputs\[0\]: 'bf17\[4\]' is not an array type"),
            ({**good, "outputs": []}, "`outputs` is empty"),
            ({**good, "vmem_limit_bytes": "lots"}, "`vmem_limit_bytes` must be a positive integer"),
            ({**good, "input_output_aliases": [[1, 3]]}, r"entry \[1, 3\] is not \[input < 2, output < 1\]"),
            ({**good, "outputs": ["f32[1024,4096]"]}, r"input 1 \(bf16\[1024,4096\]\) aliases output 0 \(f32\[1024,4096\]\): types differ"),
        ]:
            spec_path.write_text(change if isinstance(change, str) else json.dumps(change))
            self.assertFails(pattern, palladium_jax.load, self.tmp)
        spec_path.write_text(json.dumps(good))
        (self.tmp / "residual_add_inplace.body.mlir").write_text("module {}\n")
        self.assertFails("not a serialized Mosaic body", palladium_jax.load, self.tmp)

    def test_wrong_operands(self):
        mm = palladium_jax.load(EMIT_DIR, "matmul")
        x, y = (np.zeros(t.shape, t.dtype) for t in mm.inputs)
        self.assertFails(r"matmul takes 2 operands \(bf16\[1024,2048\], bf16\[2048,1024\]\), got 1", mm, x)
        self.assertFails(r"operand 1 must be bf16\[2048,1024\], got bf16\[1024,2048\]", mm, x, x)
        self.assertFails(r"operand 0 must be bf16\[1024,2048\], got f32\[1024,2048\]", mm, x.astype(jnp.float32), y)
        self.assertFails(r"operand 1 must be an array of bf16\[2048,1024\], got float", mm, x, 1.0)
        self.assertFails("operand 1 must be", jax.jit(mm).trace, x, x)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(f"usage: {sys.argv[0]} EMIT_DIR [unittest options] (see the module docs)")
    EMIT_DIR = Path(sys.argv[1])
    unittest.main(argv=sys.argv[:1] + sys.argv[2:], verbosity=2)
