"""Taichi runtime plumbing: who owns ``ti.init``, and what a batch looks like.

tinn never calls ``ti.init`` itself. Every object records the Taichi program it
was built in; calling it after ``ti.init`` ran again (which frees every field)
raises :class:`RuntimeResetError` instead of crashing the process.

Batches cross the public API as row-major ``(batch, dims)`` float32 arrays:
numpy arrays, ``ti.ndarray``s or torch tensors. :func:`as_batch` checks and
converts them to contiguous numpy arrays *before* any kernel runs.
"""
import contextlib
import ctypes
import math
import os

import numpy as np
import taichi as ti
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray
from taichi.lang.exception import TaichiCompilationError

from . import _device
from ._device import is_cpu  # noqa: F401  (re-exported: the components ask the runtime)


class RuntimeResetError(RuntimeError):
    """A tinn object was used after ``ti.init`` was called again."""


class _TracedRuntimeResetError(RuntimeResetError, TaichiCompilationError):
    """Raised while a user's kernel is compiled: Taichi passes compilation errors on with their type."""


def guarded(owner, func, n_args: int):
    """``func`` (a per-sample ``ti.func`` of ``owner`` taking ``n_args`` arguments plus the instance ``k``)
    that first checks, while the user's kernel is compiled, that ``owner``'s fields belong to the live
    Taichi program: :class:`RuntimeResetError` instead of touching freed fields (which aborts the
    process). The func keeps ``owner``, and so its parameter memory, alive."""

    def check():
        try:
            owner._check_runtime()
        except RuntimeResetError as e:
            raise _TracedRuntimeResetError(str(e)) from None

    if n_args == 1:
        @ti.func
        def guarded_func(x, k=0):
            ti.static(check())
            return func(x, k)
    else:
        @ti.func
        def guarded_func(x, dy, k=0):
            ti.static(check())
            return func(x, dy, k)
    return guarded_func


def init(arch=None, *, keep_large_buffers: bool = True, **kwargs):
    """Call ``ti.init`` with the settings tinn's CPU kernels are tuned for.

    A convenience only: any ``ti.init`` works. Keyword arguments are passed on
    (``offline_cache=True`` by default keeps compiled kernels across runs).
    ``keep_large_buffers`` asks glibc's malloc to recycle large blocks instead of
    returning them to the system after every step; a training step allocates its
    activations afresh, and zero-filling new pages otherwise costs about a third
    of a step on the CPU. It changes the allocator for the whole process.
    """
    settings = dict(offline_cache=True)
    settings.update(kwargs)
    if keep_large_buffers:
        _keep_large_buffers()
    return ti.init(arch=ti.cpu if arch is None else arch, **settings)


def _keep_large_buffers():
    """glibc ``mallopt``: serve large blocks from the heap and keep freed memory for reuse."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):      # not glibc: nothing to tune
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_MMAP_THRESHOLD, 1 << 30)
    mallopt(M_TRIM_THRESHOLD, 1 << 31)
    mallopt(M_TOP_PAD, 1 << 28)


def next_multiple(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def current_program():
    """The live Taichi program; a clear error before ``ti.init``."""
    prog = impl.get_runtime().prog
    if prog is None:
        raise RuntimeError("Taichi is not initialised: call ti.init(...) (or tinn.init()) before creating tinn objects")
    return prog


@ti.kernel
def _addresses(f: ti.template(), i: ti.i32, j: ti.i32, out: ti.types.ndarray(dtype=ti.u64, ndim=1)):
    out[0] = ti.get_addr(f, [0, 0])
    out[1] = ti.get_addr(f, [0, j])
    out[2] = ti.get_addr(f, [i, 0])


def host_view(field) -> np.ndarray | None:
    """A 2-D float32 field's own memory as a numpy array (no copy) on the x64 backend (the one where
    Taichi's ``get_addr`` gives host addresses), or ``None`` elsewhere or if the layout is not row-major
    and contiguous.

    The view is valid while the field's tree lives: its owner keeps it and never hands it out.
    Compiles a small kernel per field (about 0.07 s), so owners ask only for large fields.
    """
    if impl.current_cfg().arch != ti.x64:
        return None
    rows, cols = field.shape
    i, j = min(1, rows - 1), min(1, cols - 1)
    out = np.zeros(3, np.uint64)
    _addresses(field, i, j, out)
    base, right, down = (int(a) for a in out)
    if right - base != 4 * j or down - base != 4 * cols * i:
        return None
    memory = (ctypes.c_float * (rows * cols)).from_address(base)
    return np.frombuffer(memory, np.float32).reshape(rows, cols)


class RuntimeBound:
    """Mixin: remembers the Taichi program an object's fields live in."""

    def _bind_runtime(self):
        self._program = current_program()

    def _check_runtime(self):
        prog = impl.get_runtime().prog
        if prog is None:
            raise RuntimeError("Taichi is not initialised: call ti.init(...) before using tinn objects")
        if prog is not self._program:
            raise RuntimeResetError(
                f"this {type(self).__name__} was built before ti.init was called again, which freed its "
                "Taichi fields; build it anew after ti.init")


MAX_ELEMENTS = 2 ** 31 - 1
"""The most values one Taichi array can address (its indices are 32-bit)."""


def available_memory() -> int:
    """Bytes of memory the system can still hand out (``MemAvailable``; total memory where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_allocation(what: str, shapes, itemsize: int = 4):
    """Refuse, before anything is allocated, arrays of ``shapes`` that cannot be addressed (more than
    2^31 - 1 values in one array) or that need more memory than the machine has: ``ValueError``
    naming ``what`` and the size."""
    total = 0
    for shape in shapes:
        n = math.prod(int(s) for s in shape)
        if n > MAX_ELEMENTS:
            raise ValueError(f"{what}: an array of shape {tuple(int(s) for s in shape)} holds {n:,} values, more than "
                             f"the {MAX_ELEMENTS:,} (2^31 - 1) one Taichi array can address")
        total += n * itemsize
    if total > available_memory():
        raise ValueError(f"{what} needs {total / 2 ** 30:,.1f} GiB, more than the "
                         f"{available_memory() / 2 ** 30:,.1f} GiB of memory available")


class _CheckedBuilder:
    """A ``ti.FieldsBuilder`` whose ``dense`` refuses sizes :func:`check_allocation` refuses."""

    def __init__(self, builder, what: str):
        self._builder, self._what, self._shapes = builder, what, []

    def dense(self, axes, shape):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        check_allocation(self._what, self._shapes + [shape])
        self._shapes.append(shape)
        return self._builder.dense(axes, shape)


class FieldTree:
    """Fields placed by one ``ti.FieldsBuilder``, freed when the owner is garbage collected.

    Taichi's CPU backend allows a limited number of field trees (512): objects share trees
    (``tinn.params`` packs every parameter store into a few arenas) wherever they can.
    Sizes are checked before Taichi sees them, and a failed allocation leaves no unfinalised
    builder or unplaced field behind, so the process stays usable.
    """

    def __init__(self, place, what: str = "tinn fields"):
        """``place(builder)`` declares the fields; they exist once this returns."""
        self._program = current_program()
        builder = ti.FieldsBuilder()
        try:
            place(_CheckedBuilder(builder, what))
        except BaseException:
            _discard(builder, impl.get_runtime())
            raise
        self._tree = builder.finalize()

    def __del__(self):
        try:
            if impl.get_runtime().prog is self._program:
                self._tree.destroy()
        except Exception:  # interpreter shutdown or a runtime that is already gone
            pass


def _discard(builder, runtime):
    """Forget a builder whose placement failed, and the fields declared for it that were never placed
    (Taichi would otherwise refuse every later kernel; tinn declares fields only right before placing them)."""
    runtime.unfinalized_fields_builder.pop(builder, None)
    runtime.global_vars[:] = [v for v in runtime.global_vars if v.ptr.snode() is not None]


def _tag_ndarrays():
    """Make every ``ti.ndarray`` remember the Taichi program it was made in (``_tinn_program``). ``ti.init`` frees
    the ndarrays of the program before, and Taichi cannot tell: a freed one's allocation id may name a live
    ndarray of the new program, whose memory it would then read."""
    made = Ndarray.__init__
    if getattr(made, "remembers_program", False):
        return

    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self._tinn_program = impl.get_runtime().prog
    __init__.remembers_program = True
    Ndarray.__init__ = __init__


_tag_ndarrays()


def check_live(a, name: str):
    """:class:`RuntimeResetError` for a ``ti.ndarray`` made before ``ti.init`` was called again."""
    program = getattr(a, "_tinn_program", None)
    if program is not None and program is not impl.get_runtime().prog:
        raise RuntimeResetError(f"the ti.ndarray {name} was made before ti.init was called again, which freed it; "
                                "make it anew after ti.init")


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
        return a.cpu().numpy()
    raise TypeError(f"{name} must be a numpy array, a ti.ndarray or a torch tensor, not {type(a).__name__}")


_HOST_TYPES = {"f32": (ctypes.c_float, np.float32), "i32": (ctypes.c_int32, np.int32)}


def callers_kind(a, caller):
    """A result ``a`` as the kind of array the caller passed (``caller``): the one seam where the host
    path's numpy results become ``ti.ndarray``s for a caller that passed one (written through a view of
    the new ndarray's memory on x64, uploaded elsewhere). Device results and numpy callers pass as they are."""
    if a is None or not isinstance(caller, ti.Ndarray) or isinstance(a, ti.Ndarray) or not a.size:
        return a                                  # (an empty result stays numpy: Taichi has no empty ndarray)
    out = _device.buffer(a.shape)
    view = ndarray_view(out)
    if view is None:
        out.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    else:
        view[...] = a
    return out


def ndarray_view(a) -> np.ndarray | None:
    """A scalar f32 or i32 ``ti.ndarray``'s own memory as a numpy array (no copy) on the x64 backend,
    where its data lives in host memory; ``None`` elsewhere. The view keeps the ndarray alive."""
    types = _HOST_TYPES.get(str(a.dtype))
    if impl.current_cfg().arch != ti.x64 or types is None or tuple(getattr(a, "element_shape", ()) or ()):
        return None
    n = int(np.prod(a.shape))
    buffer = (types[0] * n).from_address(current_program().get_ndarray_data_ptr_as_int(a.arr))
    buffer.owner = a                              # the numpy view -> the buffer -> the ndarray
    return np.frombuffer(buffer, types[1]).reshape(a.shape)


_VALUES_CHECKED: set = set()


@contextlib.contextmanager
def values_checked(*arrays):
    """Within the block, :func:`as_batch` does not check these arrays' values again: a trainer checks a
    step's batch once, then composes public calls that would each check it (on the device a read-back
    each)."""
    ids = {id(a) for a in arrays if a is not None} - _VALUES_CHECKED
    _VALUES_CHECKED.update(ids)
    try:
        yield
    finally:
        _VALUES_CHECKED.difference_update(ids)


def as_batch(a, n_dims, name: str = "x", *, dtype=np.float32, allow_dense: bool = False, finite: bool = False,
             positive: bool = False) -> np.ndarray:
    """Check a ``(batch, n_dims)`` array and return it as a contiguous numpy array.

    ``n_dims=None`` accepts any width.
    With ``allow_dense`` a ``(K, batch_k, n_dims)`` array is accepted too and
    returned unchanged in shape (the caller flattens it). ``finite`` rejects NaN and
    ±Inf, ``positive`` also values <= 0 (see :func:`check_values`), unless the array's values were
    checked already (:func:`values_checked`).
    """
    if id(a) in _VALUES_CHECKED:
        finite = positive = False
    if isinstance(a, ti.Ndarray) and len(a.shape) in (2, 3) and _device.active():
        # the device path computes on it where it is; a bad batch is searched on the host for its row
        check_live(a, name)
        if _device.check(a, n_dims, name, dtype, dense=allow_dense, finite=finite, positive=positive):
            check_values(a.to_numpy(), name, positive=positive)
        return a
    arr = to_numpy(a, name)
    if arr.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {arr.dtype} "
                        f"(convert with .astype(np.{np.dtype(dtype).name}))")
    ndims = (2, 3) if allow_dense else (2,)
    if arr.ndim not in ndims or (n_dims is not None and arr.shape[-1] != n_dims):
        want = f"(batch, {n_dims or 'dims'})" + (f" or (n_instances, batch, {n_dims})" if allow_dense else "")
        raise ValueError(f"{name} must have shape {want}, got {tuple(arr.shape)}")
    if 0 in arr.shape[:-1]:                      # (batch, 0) is fine: an Empty encoding's output
        raise ValueError(f"{name} is an empty batch; a batch needs at least one sample")
    arr = np.ascontiguousarray(arr)
    if finite or positive:
        check_values(arr, name, positive=positive)
    return arr


def check_values(arr: np.ndarray, name: str, *, positive: bool = False):
    """``ValueError`` naming the first row of a batch that holds NaN or ±Inf (or, with ``positive``,
    a value <= 0). Two vectorised reductions without temporaries (min and max, which propagate NaN
    and cannot overflow) decide; only a failing batch is searched for its row."""
    if not arr.size:
        return
    lo, hi = arr.min(), arr.max()
    if np.isfinite(hi) and (lo > 0 if positive else np.isfinite(lo)):
        return
    rows = arr.reshape(-1, arr.shape[-1])
    bad = ~np.isfinite(rows)
    if positive:
        bad |= ~(rows > 0)
    first = int(np.flatnonzero(bad.any(axis=1))[0])
    where = first if arr.ndim == 2 else tuple(int(i) for i in np.unravel_index(first, arr.shape[:-1]))
    value = rows[first][bad[first]][0]
    rule = "finite and > 0" if positive else "finite"
    raise ValueError(f"{name} must be {rule}: row {where} holds {value}")


def as_instances(instance, batch: int, n_instances: int) -> np.ndarray | None:
    """Check the per-sample routing array ``instance`` (int32, shape ``(batch,)``)."""
    if instance is None:
        if n_instances != 1:
            raise ValueError(f"this object holds {n_instances} networks: pass instance=(batch,) int32 ids "
                             "or a dense (n_instances, batch, dims) array")
        return None
    arr = to_numpy(instance, "instance")
    if arr.dtype != np.int32:
        raise TypeError(f"instance must have dtype int32, got {arr.dtype}")
    if arr.shape != (batch,):
        raise ValueError(f"instance must have shape ({batch},), got {tuple(arr.shape)}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= n_instances:
        raise ValueError(f"instance ids must lie in [0, {n_instances}), got values in [{lo}, {hi}]")
    return np.ascontiguousarray(arr)
