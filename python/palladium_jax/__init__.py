"""Call Palladium kernels from JAX.

`palladium emit KERNEL --chip C --out DIR` (or `palladium megakernel ... --out DIR`) writes
`KERNEL.body.mlir` (the serialized Mosaic body of a `tpu_custom_call`) and `KERNEL.call.json`
(operand and result types, VMEM limit, input/output aliases). `load(DIR)` turns them into a JAX
function that calls the body through the public `jax.ffi.ffi_call`, the same custom call JAX
Pallas emits, so it works under `jax.jit`, `jax.shard_map` and ahead-of-time compilation:

    import jax, palladium_jax
    matmul = palladium_jax.load("out/")          # DIR holds one kernel, or pass name="matmul"
    y = jax.jit(matmul)(a, b)

Operands are the kernel's scalar-prefetch arrays, then its inputs, in the call spec's order
(`matmul.inputs`); results are one array, or a tuple when the kernel has several outputs.
"""
from .kernel import KernelFiles, PalladiumKernel, PalladiumKernelError, load

__all__ = ["KernelFiles", "PalladiumKernel", "PalladiumKernelError", "load"]
