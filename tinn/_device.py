"""The device path: batches as ``ti.ndarray``s on the arch's device, the MLP as Taichi kernels.

On the CPU tinn computes MLP products with numpy's BLAS on host arrays (``networks/mlp.py``). On
any other arch (CUDA, Vulkan, Metal, ...) that would move every activation across the bus twice per
step, so there the MLP runs as Taichi kernels (``networks/_kernel_mlp.py``) on ``ti.ndarray``
buffers that the encoding, loss and optimizer kernels read and write directly; a ``ti.ndarray``
batch passed to the public API stays on the device, and a training step reads back three numbers (the
loss and the counts of non-finite values in its input and target).

Every encoding takes ``ti.ndarray`` batches and answers in kind (outputs, input gradients and second
order: their kernels take ndarray arguments, and the buffers come from :func:`empty_like`). The
column arithmetic of a Composite encoding is here: :func:`columns` (a slice ``a[:, begin:begin + n]``),
:func:`concatenate`, :func:`add_to_columns`, :func:`add`, :func:`multiply` and :func:`fold`
(element-wise sums and products), each numpy's own operation for numpy operands and one small
parallel kernel per operand on the device.

:func:`active` is the one place that chooses; tests set :data:`FORCE` to run the device path on
the CPU, where it is checked against the BLAS path.
"""
import weakref

import numpy as np
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray, ScalarNdarray
from taichi.lang.enums import Layout
from taichi.lang.util import cook_dtype


FORCE = False
"""Use the device path on the CPU too (read when a model is built and at every call)."""


def is_cpu() -> bool:
    """Whether Taichi runs on the host's CPU (x64 or arm64)."""
    return impl.current_cfg().arch in (ti.x64, ti.arm64)


def active() -> bool:
    """Whether batches live in ``ti.ndarray``s and the MLP runs as kernels: every arch but the CPU."""
    return FORCE or not is_cpu()


def is_device(a) -> bool:
    return isinstance(a, ti.Ndarray)


@ti.kernel
def _count_bad(a: ti.types.ndarray(dtype=ti.f32), positive: ti.i32, out: ti.types.ndarray(dtype=ti.i32, ndim=1)):
    """Elements that are NaN or +-Inf (or, with ``positive``, <= 0), of a batch of any shape."""
    for I in ti.grouped(a):
        v = a[I]
        bad = not (ti.abs(v) <= 3.4028234663852886e38)          # NaN and +-Inf fail the comparison
        if positive and not (v > 0.0):
            bad = True
        if bad:
            ti.atomic_add(out[0], 1)


def check(a, n_dims, name, dtype, *, dense=False, finite=False, positive=False) -> bool:
    """Check a ``(batch, n_dims)`` ``ti.ndarray`` (with ``dense``, or ``(K, batch_k, n_dims)``) as
    ``_runtime.as_batch`` checks numpy ones; with ``finite`` / ``positive``, whether it holds NaN or +-Inf
    (or values <= 0): counted on the device, one integer read back."""
    want = {np.float32: ti.f32, np.int32: ti.i32}[np.dtype(dtype).type]
    if a.dtype != want:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {a.dtype}")
    if len(a.shape) not in ((2, 3) if dense else (2,)) or (n_dims is not None and a.shape[-1] != n_dims):
        shape = f"(batch, {n_dims or 'dims'})" + (f" or (n_instances, batch, {n_dims or 'dims'})" if dense else "")
        raise ValueError(f"{name} must have shape {shape}, got {tuple(a.shape)}")
    if 0 in a.shape[:-1]:
        raise ValueError(f"{name} is an empty batch; a batch needs at least one sample")
    if (finite or positive) and a.shape[-1]:
        count = kept("count", lambda: buffer((1,), ti.i32))
        count.fill(0)
        _count_bad(a, int(positive), count)
        return bool(count.to_numpy()[0])
    return False


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


def buffer(shape, dtype=ti.f32):
    """A new zero-filled ``ti.ndarray`` of ``shape``; a numpy one for a shape with a 0 (Taichi has no empty
    ndarray, and an empty array has nothing to move: an ``Empty`` encoding's output without padding)."""
    shape = tuple(int(n) for n in shape)
    if 0 in shape:
        return np.zeros(shape, {ti.f32: np.float32, ti.i32: np.int32}[dtype])
    return _Buffer(dtype, shape)


def put(a: np.ndarray, dtype=ti.f32):
    """A host array as a ``ti.ndarray`` (one upload)."""
    out = buffer(a.shape, dtype)
    out.from_numpy(a)
    return out


def on_device(a):
    """``a`` as a ``ti.ndarray``: itself, or a host array uploaded once (kernels then read it where it is)."""
    return a if is_device(a) else put(np.ascontiguousarray(a, np.float32))


_scratch = {}


def kept(key, make):
    """A buffer kept for this Taichi program under ``key`` (creating a ``ti.ndarray`` costs about a
    quarter of a millisecond of Python, so the few that every step needs are made once)."""
    prog = id(impl.get_runtime().prog)
    if _scratch.get("program") != prog:
        _scratch.clear()
        _scratch["program"] = prog
    if key not in _scratch:
        if len(_scratch) > 16:
            _scratch.clear()
            _scratch["program"] = prog
        _scratch[key] = make()
    return _scratch[key]


class Pool:
    """Device buffers that outlive their user: a buffer taken for an ``owner`` (a forward pass's context)
    comes back when the owner is garbage collected, and the next request of its shape gets it instead of
    a new allocation. At most two free buffers of a shape and four shapes are kept (a training loop asks
    for the same few shapes again and again)."""

    def __init__(self):
        self._free = {}

    def take(self, shape, owner):
        shape = tuple(shape)
        free = self._free.get(shape) or []
        out = free.pop() if free else buffer(shape)
        weakref.finalize(owner, self._give_back, shape, out)
        return out

    def _give_back(self, shape, buf):
        if shape not in self._free:
            if len(self._free) >= 4:                # a new batch size: forget the oldest shape
                del self._free[next(iter(self._free))]
            self._free[shape] = []
        if len(self._free[shape]) < 2:
            self._free[shape].append(buf)


class Mirror:
    """A small host array that kernels only read (a mask of networks, a learning rate per network, a
    table), as a kernel argument: on the device path a ``ti.ndarray`` uploaded again only when its values
    change, on the CPU the host array itself. (On CUDA a numpy kernel argument costs a device allocation,
    two copies and two waits for the whole device at every launch.)"""

    def __init__(self):
        self._values = self._array = self._program = None

    def __call__(self, values: np.ndarray):
        if not active():
            return values
        program = impl.get_runtime().prog
        if (program is not self._program or self._values is None or self._values.shape != values.shape
                or self._values.dtype != values.dtype or not np.array_equal(self._values, values)):
            self._array = put(values, ti.i32 if values.dtype == np.int32 else ti.f32)
            self._values, self._program = values.copy(), program
        return self._array


def empty_like(a, shape=None):
    """A new float32 buffer of ``a``'s kind (``ti.ndarray`` or numpy), of ``a``'s shape or ``shape``."""
    shape = a.shape if shape is None else shape
    return buffer(shape) if is_device(a) else np.empty(shape, np.float32)


def full_like(a, value: float, shape=None):
    """A new float32 batch of ``a``'s kind, of ``a``'s shape or ``shape``, every element ``value``."""
    shape = a.shape if shape is None else shape
    if not is_device(a):
        return np.full(shape, value, np.float32)
    out = buffer(shape)
    out.fill(value)
    return out


def contiguous(a):
    """``a`` as a kernel argument: a ``ti.ndarray`` as it is, a numpy array C-contiguous."""
    return a if is_device(a) else np.ascontiguousarray(a)


def host(a) -> np.ndarray:
    """A numpy array of ``a`` (a download for a ``ti.ndarray``)."""
    return a.to_numpy() if is_device(a) else a


def same_kind(a, like):
    """``a`` as the kind of array ``like`` is (a device output handed back to a host caller)."""
    return a if is_device(like) or not is_device(a) else a.to_numpy()


@ti.kernel
def _regroup(flat: ti.types.ndarray(dtype=ti.f32, ndim=2), dense: ti.types.ndarray(dtype=ti.f32, ndim=3),
             to_dense: ti.template()):
    """``dense[k, b, j]`` is ``flat[k * B + b, j]`` (``B = dense.shape[1]``), copied one way or the other."""
    for k, b, j in ti.ndrange(dense.shape[0], dense.shape[1], dense.shape[2]):
        if ti.static(to_dense):
            dense[k, b, j] = flat[k * dense.shape[1] + b, j]
        else:
            flat[k * dense.shape[1] + b, j] = dense[k, b, j]


def flatten(a):
    """A dense ``(K, B, n)`` batch as ``(K * B, n)``, of ``a``'s kind (a copy on the device)."""
    k, b, n = a.shape
    if not is_device(a):
        return a.reshape(k * b, n)
    out = buffer((k * b, n))
    if n:
        _regroup(out, a, False)
    return out


def unflatten(a, dense: tuple):
    """A ``(K * B, n)`` batch as dense ``(K, B, n)`` (``dense = (K, B)``), of ``a``'s kind (a copy on the device)."""
    if not is_device(a):
        return a.reshape(tuple(dense) + (-1,))
    out = buffer(tuple(dense) + (a.shape[1],))
    if a.shape[1]:
        _regroup(a, out, True)
    return out


@ti.kernel
def _fill_dense_ids(ids: ti.types.ndarray(dtype=ti.i32, ndim=1), per_network: ti.i32):
    for b in range(ids.shape[0]):
        ids[b] = b // per_network


def dense_ids(k: int, b: int):
    """The ids of a dense ``(k, b, n)`` batch, ``k`` repeated ``b`` times, ``(k * b,)`` int32 (kept)."""
    def make():
        ids = buffer((k * b,), ti.i32)
        _fill_dense_ids(ids, b)
        return ids
    return kept(("dense ids", k, b), make)


def unread():
    """A ``(1, 1)`` float32 ``ti.ndarray`` for an array argument a kernel does not read (kept)."""
    return kept("unread", lambda: buffer((1, 1)))


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


# -- column arithmetic on batches (Composite's slices, concatenations and reductions) ------------------
_COPY, _ADD, _MULTIPLY = 0, 1, 2


@ti.kernel
def _columns(src: ti.types.ndarray(dtype=ti.f32, ndim=2), src_col: ti.i32,
             dst: ti.types.ndarray(dtype=ti.f32, ndim=2), dst_col: ti.i32, n: ti.i32, op: ti.template()):
    """``dst[b, dst_col + j] = src[b, src_col + j]`` (``_COPY``), ``dst[..] + src[..]`` (``_ADD``) or
    ``dst[..] * src[..]`` (``_MULTIPLY``) for every row b and j < n: one parallel loop over (b, j)."""
    for b, j in ti.ndrange(dst.shape[0], n):
        v = src[b, src_col + j]
        if ti.static(op == _ADD):
            v = dst[b, dst_col + j] + v
        elif ti.static(op == _MULTIPLY):
            v = dst[b, dst_col + j] * v
        dst[b, dst_col + j] = v


def _any_device(arrays) -> bool:
    return any(is_device(a) for a in arrays)


def columns(a, begin: int, n: int):
    """``a[:, begin:begin + n]``, ``(batch, n)``, as a new contiguous batch of ``a``'s kind."""
    if not is_device(a):
        return np.ascontiguousarray(a[:, begin:begin + n])
    out = buffer((a.shape[0], n))
    if n:
        _columns(a, begin, out, 0, n, _COPY)
    return out


def copy_into(dst, src):
    """``dst[...] = src`` for two batches of one shape and kind (a numpy copy, or one copy kernel); returns ``dst``."""
    if not is_device(dst):
        np.copyto(dst, src)
    elif len(dst.shape) == 3:
        _regroup(flatten(src) if len(src.shape) == 3 else src, dst, True)
    elif dst.shape[1]:
        _columns(src, 0, dst, 0, dst.shape[1], _COPY)
    return dst


def add_to_columns(dst, begin: int, src):
    """``dst[:, begin:begin + n] += src`` for a ``(batch, n)`` ``src``, in place; ``dst`` of either kind,
    ``src`` of ``dst``'s kind or numpy."""
    if not is_device(dst):
        dst[:, begin:begin + src.shape[1]] += src
    elif src.shape[1]:
        _columns(src, 0, dst, begin, src.shape[1], _ADD)


def concatenate(parts: list):
    """``[p_0 | p_1 | ...]``, ``(batch, sum of widths)``: numpy for numpy parts, else a ``ti.ndarray``."""
    if not _any_device(parts):
        return np.concatenate(parts, axis=1)
    out, column = buffer((parts[0].shape[0], sum(p.shape[1] for p in parts))), 0
    for p in parts:
        if p.shape[1]:
            _columns(p, 0, out, column, p.shape[1], _COPY)
        column += p.shape[1]
    return out


def add(a, b):
    """``a + b`` of two batches of one shape: numpy for numpy operands, else a ``ti.ndarray``."""
    return fold([a, b], "+") if _any_device((a, b)) else a + b


def multiply(a, b):
    """``a * b`` element-wise, of two batches of one shape: numpy for numpy operands, else a ``ti.ndarray``."""
    return fold([a, b], "*") if _any_device((a, b)) else a * b


def fold(arrays: list, op: str):
    """``a_0 + a_1 + ...`` (``op`` "+") or ``a_0 * a_1 * ...`` ("*") element-wise in float32, left to right,
    of one or more batches of one shape: numpy for numpy operands, else a ``ti.ndarray``."""
    if not _any_device(arrays):                 # in place into a copy: np.sum / np.prod's values, no stacking
        out = np.array(arrays[0], np.float32)
        accumulate = np.add if op == "+" else np.multiply
        for a in arrays[1:]:
            accumulate(out, a, out=out)
        return out
    out = buffer(arrays[0].shape)
    for i, a in enumerate(arrays):
        if a.shape[1]:
            _columns(a, 0, out, 0, a.shape[1], _COPY if i == 0 else _ADD if op == "+" else _MULTIPLY)
    return out
