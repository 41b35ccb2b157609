"""The batch operations on the device path: ``ti.ndarray`` batches, each operation a small parallel kernel.

:data:`DEVICE` has the methods of ``tinn.batch.host_ops.HOST`` (same names, same results) for batches that stay
on the device: new buffers, column slices and concatenations, element-wise folds, the dense
``(K, B, n)`` <-> ``(K * B, n)`` regrouping, a count of non-finite values and a sum, each read back
only where a number must reach the host. ``tinn.batch.batch.ops_of`` picks it for a ``ti.ndarray`` batch.
"""
import numpy as np
import taichi as ti

from ..runtime.types import F32_2D, F32_3D, F32_ANY, I32_1D
from .buffers import buffer, dense_ids, kept, put, zeros_i32
from .host_ops import BatchOps

_COPY, _ADD, _MULTIPLY = 0, 1, 2


@ti.kernel
def _count_bad(a: F32_ANY, positive: ti.i32, out: I32_1D):
    """Elements that are NaN or +-Inf (or, with ``positive``, <= 0), of a batch of any shape."""
    for I in ti.grouped(a):
        v = a[I]
        bad = not (ti.abs(v) <= 3.4028234663852886e38)          # NaN and +-Inf fail the comparison
        if positive and not (v > 0.0):
            bad = True
        if bad:
            ti.atomic_add(out[0], 1)


@ti.kernel
def _regroup(flat: F32_2D, dense: F32_3D, to_dense: ti.template()):
    """``dense[k, b, j]`` is ``flat[k * B + b, j]`` (``B = dense.shape[1]``), copied one way or the other."""
    for k, b, j in ti.ndrange(dense.shape[0], dense.shape[1], dense.shape[2]):
        if ti.static(to_dense):
            dense[k, b, j] = flat[k * dense.shape[1] + b, j]
        else:
            flat[k * dense.shape[1] + b, j] = dense[k, b, j]


@ti.kernel
def _columns(src: F32_2D, src_col: ti.i32, dst: F32_2D, dst_col: ti.i32, n: ti.i32, op: ti.template()):
    """``dst[b, dst_col + j] = src[b, src_col + j]`` (``_COPY``), ``dst[..] + src[..]`` (``_ADD``) or
    ``dst[..] * src[..]`` (``_MULTIPLY``) for every row b and j < n: one parallel loop over (b, j)."""
    for b, j in ti.ndrange(dst.shape[0], n):
        v = src[b, src_col + j]
        if ti.static(op == _ADD):
            v = dst[b, dst_col + j] + v
        elif ti.static(op == _MULTIPLY):
            v = dst[b, dst_col + j] * v
        dst[b, dst_col + j] = v


class NdarrayOps(BatchOps):
    """Operations on float32 ``ti.ndarray`` batches ``(batch, n)`` (``(K, B, n)`` where dense)."""

    kind = "ti.ndarray"

    @staticmethod
    def empty(shape):
        """A new float32 batch of ``shape`` (zero-filled: Taichi has no uninitialised ndarray)."""
        return buffer(shape)

    @staticmethod
    def full(shape, value: float):
        """A new float32 batch of ``shape``, every element ``value``."""
        out = buffer(shape)
        out.fill(value)
        return out


    @staticmethod
    def contiguous(a):
        """``a`` as a kernel argument: a ``ti.ndarray`` as it is (a host operand made C-contiguous)."""
        return a if isinstance(a, ti.Ndarray) else np.ascontiguousarray(a)

    @staticmethod
    def host(a) -> np.ndarray:
        """A numpy copy of ``a`` (one download)."""
        return a.to_numpy()

    @staticmethod
    def adopt(a):
        """A batch of either kind as a ``ti.ndarray``: itself, or a host array uploaded once."""
        return a if isinstance(a, ti.Ndarray) else put(np.ascontiguousarray(a, np.float32))

    def columns(self, a, begin: int, n: int):
        """``a[:, begin:begin + n]``, ``(batch, n)``, as a new batch."""
        out = buffer((a.shape[0], n))
        if n:
            _columns(a, begin, out, 0, n, _COPY)
        return out

    @staticmethod
    def add_to_columns(dst, begin: int, src):
        """``dst[:, begin:begin + n] += src`` for a ``(batch, n)`` ``src``, in place."""
        if src.shape[1]:
            _columns(src, 0, dst, begin, src.shape[1], _ADD)

    @staticmethod
    def concatenate(parts: list):
        """``[p_0 | p_1 | ...]``, ``(batch, sum of widths)``."""
        out, column = buffer((parts[0].shape[0], sum(p.shape[1] for p in parts))), 0
        for p in parts:
            if p.shape[1]:
                _columns(p, 0, out, column, p.shape[1], _COPY)
            column += p.shape[1]
        return out

    @staticmethod
    def fold(arrays: list, op: str):
        """``a_0 + a_1 + ...`` (``op`` "+") or ``a_0 * a_1 * ...`` ("*") element-wise in float32, left to
        right, of one or more batches of one shape: one kernel per operand."""
        out = buffer(arrays[0].shape)
        for i, a in enumerate(arrays):
            if a.shape[1]:
                _columns(a, 0, out, 0, a.shape[1], _COPY if i == 0 else _ADD if op == "+" else _MULTIPLY)
        return out

    def add(self, a, b):
        """``a + b`` element-wise."""
        return self.fold([a, b], "+")

    def multiply(self, a, b):
        """``a * b`` element-wise."""
        return self.fold([a, b], "*")

    def copy_into(self, dst, src):
        """``dst[...] = src`` for two batches of one shape (one copy kernel); returns ``dst``."""
        if len(dst.shape) == 3:
            _regroup(self.flatten(src) if len(src.shape) == 3 else src, dst, True)
        elif dst.shape[1]:
            _columns(src, 0, dst, 0, dst.shape[1], _COPY)
        return dst

    @staticmethod
    def flatten(a):
        """A dense ``(K, B, n)`` batch as ``(K * B, n)`` (a copy)."""
        k, b, n = a.shape
        out = buffer((k * b, n))
        if n:
            _regroup(out, a, False)
        return out

    @staticmethod
    def unflatten(a, dense: tuple):
        """A ``(K * B, n)`` batch as dense ``(K, B, n)`` (``dense = (K, B)``; a copy)."""
        out = buffer(tuple(dense) + (a.shape[1],))
        if a.shape[1]:
            _regroup(a, out, True)
        return out

    @staticmethod
    def dense_ids(k: int, b: int):
        """The ids of a dense ``(k, b, n)`` batch: ``k`` repeated ``b`` times, ``(k * b,)`` int32 (kept)."""
        return dense_ids(k, b)

    @staticmethod
    def put_ids(instance):
        """Network ids as an int32 ``ti.ndarray``: a device array as it is, host ids uploaded once."""
        return instance if isinstance(instance, ti.Ndarray) else put(np.ascontiguousarray(instance, np.int32), ti.i32)

    @staticmethod
    def no_ids():
        """The one-element ids a kernel takes for a single network's batch (unread; kept)."""
        return zeros_i32()

    @staticmethod
    def unused(shape: tuple, dtype=np.int32):
        """A ``ti.ndarray`` of ``shape`` for a kernel argument that is not read (kept per program)."""
        dtype = ti.i32 if np.dtype(dtype) == np.int32 else ti.f32
        return kept(("unused", tuple(shape), dtype), lambda: buffer(shape, dtype))

    @staticmethod
    def has_bad(a, positive: bool = False) -> bool:
        """Whether a float32 batch holds NaN or +-Inf (with ``positive``, also values <= 0): counted on the
        device, one integer read back."""
        count = kept("count", lambda: buffer((1,), ti.i32))
        count.fill(0)
        _count_bad(a, int(positive), count)
        return bool(count.to_numpy()[0])


DEVICE = NdarrayOps()

