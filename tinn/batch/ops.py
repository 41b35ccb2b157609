"""The operations on a batch of each kind, side by side: :data:`HOST` for numpy batches (each operation numpy's
own) and :data:`DEVICE` for ``ti.ndarray`` batches that stay on the device (each a small parallel kernel), on one
base, :class:`BatchOps`. Same names, same results: new buffers, column slices and concatenations, element-wise folds,
the dense ``(K, B, n)`` <-> ``(K * B, n)`` regrouping, a check for non-finite values; the device's read back only
where a number must reach the host. ``tinn.batch.batch.ops_of`` picks one for a batch.

Arrays that arrive as ``ti.ndarray``s or torch tensors on the host path become numpy here (:func:`to_numpy`), in
place where their memory is the host's (:func:`ndarray_view`).
"""
import ctypes

import numpy as np
import taichi as ti
from taichi.lang import impl

from ..runtime.program import check_live, current_program
from ..runtime.types import F32_2D, F32_3D, F32_ANY, I32_1D
from .buffers import buffer, dense_ids, kept, put, zeros_i32

_HOST_TYPES = {"f32": (ctypes.c_float, np.float32), "i32": (ctypes.c_int32, np.int32)}


def ndarray_view(a) -> np.ndarray | None:
    """A scalar f32 or i32 ``ti.ndarray``'s own memory as a numpy array (no copy) on the x64 backend,
    where its data lives in host memory; ``None`` elsewhere. The view keeps the ndarray alive."""
    types = _HOST_TYPES.get(str(a.dtype))
    if impl.current_cfg().arch != ti.x64 or types is None or tuple(getattr(a, "element_shape", ()) or ()):
        return None
    n = int(np.prod(a.shape))
    memory = (types[0] * n).from_address(current_program().get_ndarray_data_ptr_as_int(a.arr))
    memory.owner = a                              # the numpy view -> the memory -> the ndarray
    return np.frombuffer(memory, types[1]).reshape(a.shape)


def to_numpy(a, name):
    """A batch as a numpy array: numpy as is, a ``ti.ndarray`` in place on the x64 backend (a copy
    elsewhere), a torch tensor through ``.numpy()`` (in place for CPU tensors; one that requires grad is refused, as its
    gradients would be lost)."""
    if isinstance(a, np.ndarray):
        return a
    if isinstance(a, ti.Ndarray):
        check_live(a, name)
        view = ndarray_view(a)
        return a.to_numpy() if view is None else view
    if type(a).__module__.startswith("torch"):
        if a.requires_grad:
            raise TypeError(f"{name} is a torch tensor that requires grad: tinn's native API does not record torch's "
                            f"autograd, so gradients would be lost. Train through the tinn.torch modules (tinycudann's), "
                            f"or pass {name}.detach()")
        try:
            return a.cpu().numpy()
        except TypeError:                           # a dtype numpy lacks (bfloat16, float8, ...)
            raise TypeError(f"{name} must have dtype float32 (int32 for network ids), got {a.dtype} "
                            f"(convert with .float())") from None
    raise TypeError(f"{name} must be a numpy array, a ti.ndarray or a torch tensor, not {type(a).__name__}")


class BatchOps:
    """What the operations of both kinds share: written once, on each kind's ``empty``, ``full`` and
    ``flatten``."""

    def empty_like(self, a, shape=None):
        """A new float32 batch of ``a``'s shape or ``shape``."""
        return self.empty(a.shape if shape is None else shape)

    def full_like(self, a, value: float, shape=None):
        """A new float32 batch of ``a``'s shape or ``shape``, every element ``value``."""
        return self.full(a.shape if shape is None else shape, value)

    def rows(self, a):
        """A batch as ``(samples, n)``: a dense ``(K, B, n)`` one flattened, a flat one as it is."""
        return self.flatten(a) if len(a.shape) == 3 else a


class HostOps(BatchOps):
    """Operations on float32 numpy batches ``(batch, n)`` (``(K, B, n)`` where dense)."""

    kind = "numpy"

    def __init__(self):
        self._unused = {}

    @staticmethod
    def empty(shape):
        """A new float32 batch of ``shape`` (uninitialised)."""
        return np.empty(shape, np.float32)

    @staticmethod
    def full(shape, value: float):
        """A new float32 batch of ``shape``, every element ``value``."""
        return np.full(shape, value, np.float32)

    @staticmethod
    def contiguous(a):
        """``a`` as a kernel argument: C-contiguous (a copy only if it is not)."""
        return np.ascontiguousarray(a)

    @staticmethod
    def host(a) -> np.ndarray:
        """``a`` itself."""
        return a

    @staticmethod
    def adopt(a):
        """A batch of either kind as a numpy array: itself, or a ``ti.ndarray`` downloaded."""
        return a.to_numpy() if isinstance(a, ti.Ndarray) else a

    @staticmethod
    def columns(a, begin: int, n: int):
        """``a[:, begin:begin + n]``, ``(batch, n)``, as a new contiguous batch."""
        return np.ascontiguousarray(a[:, begin:begin + n])

    @staticmethod
    def add_to_columns(dst, begin: int, src):
        """``dst[:, begin:begin + n] += src`` for a ``(batch, n)`` ``src``, in place."""
        dst[:, begin:begin + src.shape[1]] += src

    @staticmethod
    def concatenate(parts: list):
        """``[p_0 | p_1 | ...]``, ``(batch, sum of widths)``."""
        return np.concatenate(parts, axis=1)

    @staticmethod
    def fold(arrays: list, op: str):
        """``a_0 + a_1 + ...`` (``op`` "+") or ``a_0 * a_1 * ...`` ("*") element-wise in float32, left to
        right, of one or more batches of one shape (in place into a copy: no stacking)."""
        out = np.array(arrays[0], np.float32)
        accumulate = np.add if op == "+" else np.multiply
        for a in arrays[1:]:
            accumulate(out, a, out=out)
        return out

    @staticmethod
    def add(a, b):
        """``a + b`` element-wise."""
        return a + b

    @staticmethod
    def multiply(a, b):
        """``a * b`` element-wise."""
        return a * b

    @staticmethod
    def copy_into(dst, src):
        """``dst[...] = src`` for two batches of one shape; returns ``dst``."""
        np.copyto(dst, src.reshape(dst.shape))
        return dst

    @staticmethod
    def flatten(a):
        """A dense ``(K, B, n)`` batch as ``(K * B, n)`` (a view)."""
        k, b, n = a.shape
        return a.reshape(k * b, n)

    @staticmethod
    def unflatten(a, dense: tuple):
        """A ``(K * B, n)`` batch as dense ``(K, B, n)`` (``dense = (K, B)``; a view)."""
        return a.reshape(tuple(dense) + (-1,))

    @staticmethod
    def dense_ids(k: int, b: int):
        """The ids of a dense ``(k, b, n)`` batch: ``k`` repeated ``b`` times, ``(k * b,)`` int32."""
        return np.repeat(np.arange(k, dtype=np.int32), b)

    @staticmethod
    def put_ids(instance):
        """Network ids as a contiguous int32 numpy array."""
        return np.ascontiguousarray(instance, np.int32)

    def no_ids(self):
        """The one-element ids a kernel takes for a single network's batch (unread; kept)."""
        return self.unused((1,), np.int32)

    def unused(self, shape: tuple, dtype=np.int32):
        """A zero array of ``shape`` for a kernel argument that is not read (kept, one per shape and dtype)."""
        key = (tuple(shape), np.dtype(dtype))
        if key not in self._unused:
            self._unused[key] = np.zeros(shape, dtype)
        return self._unused[key]

    @staticmethod
    def has_bad(a, positive: bool = False) -> bool:
        """Whether a batch holds NaN or +-Inf (with ``positive``, also values <= 0): two vectorised
        reductions without temporaries (min and max, which propagate NaN and cannot overflow)."""
        if not a.size:
            return False
        lo, hi = a.min(), a.max()
        return not (np.isfinite(hi) and (lo > 0 if positive else np.isfinite(lo)))


HOST = HostOps()


# -- the device path -------------------------------------------------------------------------------------------
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

