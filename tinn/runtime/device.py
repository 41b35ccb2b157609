"""The one switch: does this arch run the host path or the device path?

On the CPU tinn computes MLP products with numpy's BLAS on host arrays (``networks/_mlp_host.py``). On
any other arch (CUDA, Vulkan, Metal, ...) that would move every activation across the bus twice per
step, so there batches live in ``ti.ndarray``s on the device and the MLP runs as Taichi kernels
(``networks/_kernel_mlp.py``). :func:`active` is the one place that chooses; tests set :data:`FORCE`
to run the device path on the CPU, where it is checked against the BLAS path. The operations on each
kind of batch are ``tinn.batch.host_ops`` and ``tinn.batch.device_ops``; ``tinn.batch.kind`` picks them for a batch.
"""
import taichi as ti
from taichi.lang import impl

FORCE = False
"""Use the device path on the CPU too (read at every call, by ``tinn.batch.kind.as_batch``: the kind of the call's
batches then picks every backend)."""


def is_cpu() -> bool:
    """Whether Taichi runs on the host's CPU (x64 or arm64)."""
    return impl.current_cfg().arch in (ti.x64, ti.arm64)


def active() -> bool:
    """Whether batches live in ``ti.ndarray``s and the MLP runs as kernels: every arch but the CPU."""
    return FORCE or not is_cpu()


HALF_ARCHS = ("x64", "arm64", "cuda", "vulkan")
"""The archs whose kernels read and write float16 fields (Taichi's f16): tested on x64, CUDA and Vulkan
(Mesa's llvmpipe; a Vulkan device needs ``shaderFloat16`` and 16-bit storage, which Taichi 1.7 cannot query).
Metal and OpenGL, untested, are refused. No kernel of tinn adds atomically into a float16 field."""


def require_half(what: str):
    """``ValueError`` naming ``what`` unless the current arch runs float16 fields (before any field or kernel)."""
    arch = impl.current_cfg().arch
    if arch.name not in HALF_ARCHS:
        raise ValueError(f"{what}: precision 'float16' needs float16 fields, which tinn runs on "
                         f"{', '.join(HALF_ARCHS)}; this Taichi program runs on {arch.name} (use precision 'float32')")
