"""Tensors between torch and tinn: the one place that decides where a tensor must be for Taichi's arch
and how it crosses.

:func:`rule` names one of three routes, and the torch device tensors must be on for it:

* ``HOST``, the CPU's own path (Taichi on x64/arm64, ``tinn.runtime.program`` not active): CPU tensors reach tinn
  as numpy views of their memory (no copy) and tinn's numpy results come back as tensors over them.
* ``DIRECT``, the device path on an arch whose memory torch holds (CUDA tensors on ``ti.cuda``; CPU
  tensors on x64/arm64 with ``tinn.runtime.program.FORCE``): Taichi kernels take the tensor itself (a CUDA
  tensor by its device pointer), so an input becomes a ``ti.ndarray`` by one copy kernel and a
  ``ti.ndarray`` result a tensor from ``torch.empty`` by another; nothing passes through the host.
* ``UPLOAD``, the device path on an arch torch cannot hold (Vulkan, Metal, OpenGL; CUDA with a torch
  built without it): CPU tensors, through numpy once per call (uploaded with ``tinn.batch.buffers.put``,
  results read back with ``to_numpy``).

Parameters and their gradients cross with the same routes (:mod:`tinn.torch._store`).
"""
import numpy as np
import taichi as ti
import torch
from taichi.lang import impl

from ..batch import buffers as _buffers
from ..runtime import program as _program
from ..runtime.types import ANY

HOST, DIRECT, UPLOAD = "host", "direct", "upload"

_CPU = torch.device("cpu")
_TAICHI_TYPES = {torch.float32: ti.f32, torch.int32: ti.i32}


def rule(arch, device_path: bool, torch_has_cuda: bool) -> tuple[str, torch.device]:
    """``(route, device)`` for Taichi's ``arch``: how tensors cross, and the torch device they must be on.
    ``device_path``: whether ``tinn.runtime.program`` is active; ``torch_has_cuda``: whether torch can hold CUDA
    tensors. Taichi's CUDA backend runs on the first visible GPU, ``cuda:0``."""
    if not device_path:
        return HOST, _CPU
    if arch in (ti.x64, ti.arm64):
        return DIRECT, _CPU
    if arch == ti.cuda and torch_has_cuda:
        return DIRECT, torch.device("cuda", 0)
    return UPLOAD, _CPU


def route() -> tuple[str, torch.device]:
    """:func:`rule` for the running Taichi program."""
    arch = impl.current_cfg().arch
    return rule(arch, _program.active(), arch == ti.cuda and torch.cuda.is_available())


def device() -> torch.device:
    """The torch device a tensor must be on to reach tinn (see :func:`rule`)."""
    return route()[1]


@ti.kernel
def _copy(src: ANY, dst: ANY):
    """``dst = src`` for two arrays of one shape and dtype (``ti.ndarray``s or tensors on Taichi's device)."""
    for I in ti.grouped(src):
        dst[I] = src[I]


def to_tinn(t: torch.Tensor, dtype=torch.float32):
    """A tensor (any shape, e.g. a ``(batch, n_input_dims)`` input or ``(batch,)`` routing ids) as the
    array tinn's native API takes, of ``dtype`` (float32 or int32): a numpy view of its memory (``HOST``), a
    new ``ti.ndarray`` filled from it by one kernel (``DIRECT``) or uploaded from numpy (``UPLOAD``).
    The tensor is detached; converting it to ``dtype`` and :func:`device` copies it only if needed."""
    how, dev = route()
    t = t.detach().to(dev, dtype).contiguous()
    if how == HOST:
        return t.numpy()
    if how == UPLOAD:
        return _buffers.put(t.numpy(), _TAICHI_TYPES[dtype])
    out = _buffers.buffer(t.shape, _TAICHI_TYPES[dtype])
    _copy(t, out)
    return out


def from_tinn(a) -> torch.Tensor:
    """A float32 result of tinn's native API (numpy on ``HOST``, a ``ti.ndarray`` on the device path) as a
    float32 tensor of its shape on :func:`device`: over the numpy array's memory (``HOST``), filled from
    the ``ti.ndarray`` by one kernel (``DIRECT``) or read back through numpy (``UPLOAD``)."""
    how, dev = route()
    if how == HOST:
        return torch.from_numpy(a)
    if how == UPLOAD:
        return torch.from_numpy(a.to_numpy())
    out = torch.empty(tuple(a.shape), dtype=torch.float32, device=dev)
    _copy(a, out)
    return out


def _check_int32(lo: int, hi: int):
    """Ids that an int32 cannot hold are refused, not wrapped (2^32 + 1 would become network 1)."""
    if lo < -2 ** 31 or hi >= 2 ** 31:
        raise ValueError(f"instance ids must be network ids, got values in [{lo}, {hi}] (beyond int32's range)")


def instances(instance):
    """Routing ids (a tensor, numpy array or sequence of integers) as the int32 ``(batch,)`` array tinn
    takes: a tensor by :func:`to_tinn`, host ids as numpy (``HOST``) or uploaded once (device path); tinn
    checks their shape and range."""
    if instance is None:
        return None
    if isinstance(instance, torch.Tensor):
        if instance.is_floating_point() or instance.is_complex() or instance.dtype == torch.bool:
            raise TypeError(f"instance must hold integers, got {instance.dtype}")
        if instance.dtype != torch.int32 and instance.numel():
            _check_int32(int(instance.min()), int(instance.max()))
        return to_tinn(instance, torch.int32)
    arr = np.asarray(instance)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"instance must hold integers, got {arr.dtype}")
    if arr.size:
        _check_int32(int(arr.min()), int(arr.max()))
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    return arr if route()[0] == HOST else _buffers.put(arr, ti.i32)      # host data: one upload
