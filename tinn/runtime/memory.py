"""Taichi field memory: sizes checked before anything is allocated, field trees freed with their owner,
and a zero-copy host view of a field.

Taichi's CPU backend allows a limited number of field trees (512): objects share trees
(``tinn.params`` packs every parameter store into a few arenas) wherever they can.
"""
import ctypes
import math
import os
import threading
import weakref

import numpy as np
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang.field import ScalarField

try:
    import resource
except ImportError:                             # Windows
    resource = None

from .program import current_program
from .types import U64_1D, U64_2D

MAX_ELEMENTS = 2 ** 31 - 1
"""The most values one Taichi array can address (its indices are 32-bit)."""


def available_memory() -> int:
    """Bytes of memory the process can still obtain: the system's ``MemAvailable`` (total memory where
    unknown), and under an address-space limit (``ulimit -v``, ``RLIMIT_AS``) no more than the limit less
    the address space the process holds already (Taichi's runtime and every field it reserved included)."""
    return min(_system_available(), _address_space_left())


def _system_available() -> int:
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


def _address_space_left() -> int:
    """``RLIMIT_AS`` less the process's ``VmSize`` (unlimited: 2^62)."""
    if resource is None:                        # not a POSIX system
        return 1 << 62
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return 1 << 62
    try:
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return 1 << 62
    return max(0, limit - used)


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


THREAD_RULE = (
    "tinn needs new Taichi field memory here, and Taichi creates fields only on the thread that called ti.init "
    "(this is thread {thread!r}): build the first model of each config on that thread, usually the main thread. "
    "Later models of that config, which share its memory, and every training step and inference may run in "
    "any thread")


class FieldTree:
    """Fields placed by one ``ti.FieldsBuilder``, freed when the owner is garbage collected.

    Sizes are checked before Taichi sees them, and a failed allocation leaves no unfinalised
    builder or unplaced field behind, so the process stays usable. Taichi's CPU and CUDA backends
    place fields only from the thread that called ``ti.init``: elsewhere a ``RuntimeError`` states
    that rule (``THREAD_RULE``) instead of Taichi's internal assertion (which Taichi would also print: off the
    main thread its log is quiet while the fields are placed).
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
        try:
            self._tree = _finalize(builder)
        except RuntimeError as e:
            if "main_thread_id_" not in str(e):
                raise
            _discard(builder, impl.get_runtime())
            raise RuntimeError(THREAD_RULE.format(thread=threading.current_thread().name)) from None

    def __del__(self):
        try:
            if impl.get_runtime().prog is self._program:
                self._tree.destroy()
        except Exception:  # interpreter shutdown or a runtime that is already gone
            pass


_LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "critical")


def _finalize(builder):
    """``builder.finalize()``; off the main thread with Taichi's log at "critical" meanwhile, so that Taichi does
    not print the assertion that :data:`THREAD_RULE` replaces."""
    if threading.current_thread() is threading.main_thread():
        return builder.finalize()
    level = next((name for name in _LOG_LEVELS if _ti_core.logging_effective(name)), "critical")
    _ti_core.set_logging_level("critical")
    try:
        return builder.finalize()
    finally:
        _ti_core.set_logging_level(level)


def _discard(builder, runtime):
    """Forget a builder whose placement failed, and the fields declared for it that were never placed
    (Taichi would otherwise refuse every later kernel; tinn declares fields only right before placing them)."""
    runtime.unfinalized_fields_builder.pop(builder, None)
    runtime.global_vars[:] = [v for v in runtime.global_vars if v.ptr.snode() is not None]


@ti.kernel
def _addresses(f: ti.template(), i: ti.i32, j: ti.i32, out: U64_1D):
    out[0] = ti.get_addr(f, [0, 0])
    out[1] = ti.get_addr(f, [0, j])
    out[2] = ti.get_addr(f, [i, 0])


def host_memory() -> bool:
    """Whether field memory is host memory that numpy can view (the x64 backend, where Taichi's
    ``get_addr`` gives host addresses)."""
    return impl.current_cfg().arch == ti.x64


class HostView(np.ndarray):
    """A field's own memory seen from numpy (:func:`host_views`): a kernel argument that copies nothing."""


def host_views(fields) -> list | None:
    """The memory of 2-D float32 fields placed in one field tree, each under its own ``dense`` node
    directly below the root, as numpy arrays (no copy), on the x64 backend; ``None`` elsewhere, if any field
    has another element type (a float16 store's chunk) or if the layout is not row-major and contiguous.

    One small kernel, compiled for the first field, finds the tree's address; the others lie at their
    dense nodes' offsets in the root cell (``offset_bytes_in_parent_cell``), so a tree costs one compile
    however many arrays it holds. The views are valid while the tree lives: its owner keeps them and
    never hands them out.
    """
    first = fields[0]
    if not host_memory() or any(f.dtype != ti.f32 for f in fields):
        return None
    rows, cols = first.shape
    i, j = min(1, rows - 1), min(1, cols - 1)
    out = np.zeros(3, np.uint64)
    _addresses(first, i, j, out)
    base, right, down = (int(a) for a in out)
    if right - base != 4 * j or down - base != 4 * cols * i:
        return None
    root = base - first.snode.parent().ptr.offset_bytes_in_parent_cell
    views = []
    for f in fields:
        if f.shape != first.shape:
            return None
        memory = (ctypes.c_float * (rows * cols)).from_address(root + f.snode.parent().ptr.offset_bytes_in_parent_cell)
        views.append(np.frombuffer(memory, np.float32).reshape(rows, cols).view(HostView))
    return views


_VIEWS: dict = {}
"""``id(field)`` -> (the field, weakly; its host view; the Taichi program whose memory it is) for every field viewed
so far."""


def register_views(fields, views):
    """Remember ``views[i]`` as the host memory of ``fields[i]`` (:func:`view_of`) while the field lives."""
    program = impl.get_runtime().prog
    for f, v in zip(fields, views):
        key = id(f)
        _VIEWS[key] = (weakref.ref(f, lambda _, key=key: _VIEWS.pop(key, None)), v, program)


def view_of(field) -> np.ndarray | None:
    """A 2-D float32 field's memory as a numpy array (x64 only, else ``None``): the view its owner
    registered, or one made now (a compile of the address kernel for this field) and kept while the
    field lives. ``None`` too for a field of a Taichi program that ``ti.init`` has replaced (its memory is
    freed: the callers' kernels then report it, as for any field of an old program)."""
    entry = _VIEWS.get(id(field))
    if entry is not None and entry[0]() is field:
        return entry[1] if entry[2] is impl.get_runtime().prog else None
    views = host_views([field])
    if views is not None:
        register_views([field], views)
        return views[0]
    return None


def _scalar_fields(fields):
    """The scalar fields of ``fields`` in turn: a scalar field itself, a Vector field's components."""
    return [s for f in fields
            for s in ([f] if isinstance(f, ScalarField) else [f.get_scalar_field(j) for j in range(f.n)])]


@ti.kernel
def _corners(fields: ti.template(), out: U64_2D):
    """``out[k, 0]``: the address of the first element of scalar field k (:func:`_scalar_fields`); ``out[k, 1 + d]``:
    of its element one step along axis d (the first again on an axis of 1); ``out[k, 1 + len(shape)]``: of its last."""
    for _ in range(1):
        for k in ti.static(range(len(_scalar_fields(fields)))):
            f = ti.static(_scalar_fields(fields)[k])
            dims = ti.static(len(f.shape))
            out[k, 0] = ti.get_addr(f, ti.static([0] * dims))
            for d in ti.static(range(dims)):
                out[k, 1 + d] = ti.get_addr(f, ti.static([min(1, f.shape[d] - 1) * (e == d) for e in range(dims)]))
            out[k, 1 + dims] = ti.get_addr(f, ti.static([s - 1 for s in f.shape]))


_VIEWABLE = {ti.f32: np.float32, ti.i32: np.int32}


def _dense_below_a_root(f) -> bool:
    """Whether the scalar field ``f`` sits in a ``dense`` node of all its axes directly below a tree's root (how
    ``ti.field(..., shape)`` and ``ti.Vector.field(..., shape)`` place a field and its ``.grad``), with no index
    offset: its addresses are then linear in its index, and its first element's index is 0."""
    dense = f.snode.ptr.parent
    return (dense is not None and dense.type == _ti_core.SNodeType.dense and dense.parent is not None
            and dense.parent.type == _ti_core.SNodeType.root and dense.num_active_indices() == len(f.shape)
            and not any(f.snode.ptr.offset))


def _view(field, corners):
    """``field``'s memory as a numpy array of ``field.shape`` (``+ (n,)`` for a Vector field) from its scalar fields'
    :func:`_corners`, or ``None`` unless those are the addresses of such a strided array."""
    shape, first = tuple(field.shape), [int(c[0]) for c in corners]
    item = np.dtype(_VIEWABLE[field.dtype]).itemsize
    if first[0] < 1 << 16:                       # not the memory of a live tree (a field of a replaced program)
        return None
    strides = [int(corners[0][1 + d]) - first[0] if n > 1 else item for d, n in enumerate(shape)]
    step = first[1] - first[0] if len(first) > 1 else item
    if step < item or any(s < item for s in strides):
        return None
    for j, c in enumerate(corners):
        if (first[j] != first[0] + j * step or int(c[1 + len(shape)]) != first[j] + sum(
                (n - 1) * s for n, s in zip(shape, strides)) or any(
                n > 1 and int(c[1 + d]) - first[j] != s for d, (n, s) in enumerate(zip(shape, strides)))):
            return None
    end = first[-1] + sum((n - 1) * s for n, s in zip(shape, strides)) + item
    memory = (ctypes.c_char * (end - first[0])).from_address(first[0])
    full = shape + (() if isinstance(field, ScalarField) else (len(first),))
    return np.ndarray(full, _VIEWABLE[field.dtype], memory, 0,
                      tuple(strides) + (() if isinstance(field, ScalarField) else (step,)))


def field_views(fields) -> list | None:
    """A user's Taichi fields as numpy arrays of their own memory (no copy), each of ``f.shape`` (``+ (f.n,)`` for a
    Vector field), on the x64 backend; ``None`` elsewhere, or unless every field is float32 or int32 and placed as
    ``ti.field`` / ``ti.Vector.field`` with a shape place it (:func:`_dense_below_a_root`).

    One launch of :func:`_corners`, compiled once per tuple of fields, finds where each scalar field starts, steps
    and ends; a view is made only if these are the addresses of a strided array. The views are valid while the
    fields' tree lives: take them for one use.
    """
    if not host_memory() or not fields:
        return None
    scalars = _scalar_fields(fields)
    if any(f.dtype not in _VIEWABLE for f in fields) or not all(_dense_below_a_root(s) for s in scalars):
        return None
    corners = np.zeros((len(scalars), 2 + max(len(f.shape) for f in fields)), np.uint64)
    _corners(tuple(fields), corners)
    views, row = [], 0
    for f in fields:
        n = 1 if isinstance(f, ScalarField) else f.n
        view = _view(f, corners[row:row + n])
        if view is None:
            return None
        views.append(view)
        row += n
    return views


def next_multiple(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple
