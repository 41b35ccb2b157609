"""The batch operations on the host path: numpy batches, each operation numpy's own.

:data:`HOST` has the methods of ``tinn.batch.device_ops.DEVICE`` (same names, same results) for numpy
batches; ``tinn.batch.batch.ops_of`` picks it for anything that is not a ``ti.ndarray``. Arrays that arrive as
``ti.ndarray``s or torch tensors on the host path become numpy here (:func:`to_numpy`), in place where
their memory is the host's (:func:`ndarray_view`).
"""
import ctypes

import numpy as np
import taichi as ti
from taichi.lang import impl

from ..runtime.program import check_live, current_program

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
