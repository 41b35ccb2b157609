"""Device buffers: new ``ti.ndarray``s, the few kept per program, a pool that outlives its users, and
mirrors of small host tables.

Creating a ``ti.ndarray`` costs about a quarter of a millisecond of Python, so the buffers every step
needs are made once per Taichi program (:func:`kept`), and a forward pass's activations come back to a
:class:`Pool` when its context dies.
"""
import collections
import weakref

import numpy as np
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray, ScalarNdarray
from taichi.lang.enums import Layout
from taichi.lang.util import cook_dtype

from ..runtime.types import I32_1D

_NUMPY_TYPES = {ti.f32: np.float32, ti.f16: np.float16, ti.i32: np.int32}


class _Buffer(ScalarNdarray):
    """``ti.ndarray(dtype, shape)`` (zero-filled) without the Python stack trace Taichi records for every
    ndarray it creates: formatting it costs about 0.25 ms, ten times the allocation itself, and a training
    step on the device allocates a dozen buffers."""

    def __init__(self, dtype, shape):
        Ndarray.__init__(self)
        self.dtype, self.element_type = cook_dtype(dtype), dtype
        self.arr = impl.get_runtime().prog.create_ndarray(self.dtype, shape, layout=Layout.NULL, zero_fill=True,
                                                          dbg_info=_ti_core.DebugInfo(""))
        self.shape = tuple(self.arr.shape)

    def __del__(self):
        if hasattr(self, "arr"):                    # (not so for a construction that an interrupt cut short)
            super().__del__()


def buffer(shape, dtype=ti.f32):
    """A new zero-filled ``ti.ndarray`` of ``shape``; a numpy one for a shape with a 0 (Taichi has no empty
    ndarray, and an empty array has nothing to move: an ``Empty`` encoding's output without padding)."""
    shape = tuple(int(n) for n in shape)
    if 0 in shape:
        return np.zeros(shape, _NUMPY_TYPES[dtype])
    return _Buffer(dtype, shape)


def put(a: np.ndarray, dtype=ti.f32):
    """A host array as a ``ti.ndarray`` (one upload)."""
    out = buffer(a.shape, dtype)
    out.from_numpy(a)
    return out


class _Kept:
    """Buffers kept for the live Taichi program under a key (at most 16; all forgotten when ``ti.init``
    replaces the program)."""

    def __init__(self):
        self._program, self._buffers = None, {}

    def __call__(self, key, make):
        program = impl.get_runtime().prog
        if program is not self._program or (key not in self._buffers and len(self._buffers) >= 16):
            self._program, self._buffers = program, {}
        if key not in self._buffers:
            self._buffers[key] = make()
        return self._buffers[key]


kept = _Kept()
"""``kept(key, make)``: the buffer kept under ``key``, made by ``make()`` the first time."""


def zeros_i32():
    """A one-element int32 ``ti.ndarray`` holding 0 (kept: the ids kernels take for a single network's batch)."""
    return kept("zero ids", lambda: put(np.zeros(1, np.int32), ti.i32))


def full(n: int, value: float):
    """A length-``n`` float32 ``ti.ndarray`` of ``value`` (kept: callers only read it)."""
    def make():
        out = buffer((n,))
        out.fill(value)
        return out
    return kept(("full", n, value), make)


@ti.kernel
def _fill_dense_ids(ids: I32_1D, per_network: ti.i32):
    for b in range(ids.shape[0]):
        ids[b] = b // per_network


def dense_ids(k: int, b: int):
    """The ids of a dense ``(k, b, n)`` batch, ``k`` repeated ``b`` times, ``(k * b,)`` int32 (kept)."""
    def make():
        ids = buffer((k * b,), ti.i32)
        _fill_dense_ids(ids, b)
        return ids
    return kept(("dense ids", k, b), make)


class Pool:
    """Device buffers that outlive their user: a buffer taken for an ``owner`` (a forward pass's context)
    comes back when the owner is garbage collected, and the next request of its shape gets it instead of
    a new allocation. At most two free buffers of a shape (and dtype) and four shapes are kept (a training
    loop asks for the same few shapes again and again)."""

    def __init__(self):
        self._free = {}

    def take(self, shape, owner, dtype=ti.f32):
        key = (tuple(shape), dtype)
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= 4:                # a new batch size: forget the oldest shape
                del self._free[next(iter(self._free))]
            free = self._free[key] = collections.deque(maxlen=2)
        out = free.pop() if free else buffer(*key)
        weakref.finalize(owner, free.append, out)  # (a builtin: the give-back runs no line of Python that a
        return out                                  # Ctrl-C during garbage collection could cut short)


class Mirror:
    """A small host array that kernels only read (a mask of networks, a learning rate per network, a
    table), as a device path's kernel argument: a ``ti.ndarray`` uploaded again only when its values
    change (on the host path kernels take the host array itself). On CUDA a numpy kernel argument costs a
    device allocation, two copies and two waits for the whole device at every launch."""

    def __init__(self):
        self._values = self._array = self._program = None

    def __call__(self, values: np.ndarray):
        program = impl.get_runtime().prog
        if (program is not self._program or self._values is None or self._values.shape != values.shape
                or self._values.dtype != values.dtype or not np.array_equal(self._values, values)):
            self._array = put(values, ti.i32 if values.dtype == np.int32 else ti.f32)
            self._values, self._program = values.copy(), program
        return self._array
