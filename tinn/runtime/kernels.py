"""Kernel plumbing shared by every component: one way to build a kernel specialised to a config,
chunking, and the row/column copies of parameter memory.

:func:`specialised` caches a kernel factory per Taichi program and per configuration constants, and
forgets the kernels of a program once ``ti.init`` has replaced it. Kernels take parameter memory as
``ARENA`` arguments (:func:`arena_kernel`) and offsets as runtime arguments, so that every model of one
config runs the same compiled kernel, whichever arena chunk (``tinn.params``) holds its parameters.

The copies (``rows_copy``, ``copy_columns``, ``fill_columns``) run in the fields' own memory as numpy operations
where the fields have host views (float32 fields on x64) and the other arrays are numpy: no kernel to compile or
launch. Otherwise they are kernels, one parallel loop over (row, block of ``CHUNK`` columns) on the CPU:
contiguous work per task that the compiler vectorises. On a GPU a task is one element (a warp's threads then touch
consecutive memory), and no thread runs a long serial loop (Mesa's software Vulkan driver stops a shader
invocation after 65,535 loop iterations).
"""

import functools
import inspect
import types

import numpy as np
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang.any_array import AnyArray
from taichi.lang.field import Field
from taichi.types.annotations import Template

from .program import current_program, is_cpu
from .memory import view_of
from .types import F32_1D, F32_2D, I32_1D


CHUNK = 1024
"""Columns per parallel task of the copies on the CPU (:func:`columns_per_task`)."""

COMPILED = {"count": 0}
"""How many kernel factories :func:`specialised` has run (tests check that models of one config share them)."""


def specialised(factory):
    """Decorator: ``factory(*constants)`` builds kernels for one configuration; the result is cached
    per live Taichi program and per ``constants`` (hashable), and dropped when the program changes."""
    cache = {"program": None, "kernels": {}}

    @functools.wraps(factory)
    def get(*constants):
        program = current_program()
        if cache["program"] is not program:
            cache["program"], cache["kernels"] = program, {}
        kernels = cache["kernels"].get(constants)
        if kernels is None:
            kernels = cache["kernels"][constants] = factory(*constants)
            COMPILED["count"] += 1
        return kernels

    return get


class _ArenaArray(Template):
    """The annotation of a kernel argument that is a 2-D float32 field of parameter memory (an arena
    chunk's array, :mod:`tinn.params`): see :func:`arena_kernel`."""


ARENA = _ArenaArray()


def cast_to(array):
    """Inside a kernel, as ``ti.static(cast_to(a))(value)``: ``value`` rounded to the element type of ``a``,
    an ``ARENA`` argument (a field's own type, float16 or float32; float32 for the ndarray view
    :func:`arena_kernel` hands in its place: only float32 fields are viewed) or an ndarray argument."""
    if isinstance(array, AnyArray):
        dtype = _ti_core.get_external_tensor_element_type(array.ptr)
    else:
        dtype = getattr(array, "dtype", ti.f32)
    if str(dtype) not in _CASTS:
        @ti.func
        def cast(value):
            return ti.cast(value, dtype)
        _CASTS[str(dtype)] = cast
    return _CASTS[str(dtype)]


_CASTS: dict = {}
"""One cast func per element type (its name) for :func:`cast_to`."""


def arena_kernel(func):
    """``ti.kernel`` for a kernel whose ``ARENA`` arguments are 2-D float32 fields of parameter memory.

    Taichi compiles a kernel once per field given to a ``ti.template()`` argument, so a model placed
    in a new arena chunk would compile every such kernel again. On the x64 backend the kernel instead
    takes each field's memory as a 2-D ndarray (the field's own memory, viewed without a copy:
    ``_memory.view_of``), and one compiled kernel serves every chunk and every model. Elsewhere
    (or for a field numpy cannot view) the arguments stay templates."""
    names = [name for name, p in inspect.signature(func).parameters.items() if isinstance(p.annotation, _ArenaArray)]
    positions = [i for i, name in enumerate(inspect.signature(func).parameters) if name in names]
    on_fields, on_views = ti.kernel(func), []

    def viewing():
        if not on_views:                           # the same function, its ARENA arguments 2-D ndarrays
            copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__,
                                      func.__closure__)
            copy.__qualname__, copy.__module__, copy.__doc__ = func.__qualname__, func.__module__, func.__doc__
            copy.__annotations__ = {**func.__annotations__, **{name: F32_2D for name in names}}
            on_views.append(ti.kernel(copy))
        return on_views[0]

    @functools.wraps(func)
    def call(*args):
        views = [view_of(args[i]) if isinstance(args[i], Field) else args[i] for i in positions]
        if all(v is not None for v in views):
            args = list(args)
            for i, view in zip(positions, views):
                args[i] = view
            return viewing()(*args)
        return on_fields(*args)

    call._primal = on_fields._primal               # a kernel, as ``ti.kernel``'s wrapper says (its field version)
    return call


def flat_rows(field):
    """``(array, stride)`` for a kernel whose long contiguous loops walk rows of parameter memory: on x64 the
    float32 field's memory as one flat array and its row length, else ``(field, 0)`` (a field, or a float16
    one, stays itself). Such a kernel takes the array as a ``FLAT`` argument where it is flat and reads
    element ``[k, j]`` with :func:`at` / :func:`set_at`. (In Taichi's generated code every access to a 2-D
    ndarray after a store loads its row length from the launch arguments again and multiplies it out; a flat
    array's access does not: Adam's step over a 2-D view ran 1.4x slower than over the field or a flat array.)"""
    view = view_of(field) if isinstance(field, Field) else None
    return (field, 0) if view is None else (view.reshape(-1), view.shape[1])


def flat_args(*fields):
    """``(flat, [(array, stride), ...])``: every field as :func:`flat_rows` gives it if all of them are flat,
    else every field itself with stride 0 (a kernel takes all of them flat or none)."""
    rows = [flat_rows(f) for f in fields]
    flat = all(stride for _, stride in rows)
    return flat, (rows if flat else [(f, 0) for f in fields])


FLAT = F32_1D
"""The annotation of a :func:`flat_rows` array where it is flat (``ARENA`` where it is a field)."""


@ti.func
def at(A: ti.template(), stride, k, j):
    """Element ``[k, j]`` of a :func:`flat_rows` array: ``A[k * stride + j]`` flat, ``A[k, j]`` for a field."""
    v = 0.0
    if ti.static(len(A.shape) == 1):
        v = A[k * stride + j]
    else:
        v = A[k, j]
    return v


@ti.func
def set_at(A: ti.template(), stride, k, j, v):
    """``A[k, j] = v`` for a :func:`flat_rows` array (rounded to a float16 field's type)."""
    if ti.static(len(A.shape) == 1):
        A[k * stride + j] = v
    else:
        A[k, j] = ti.static(cast_to(A))(v)


def columns_per_task() -> int:
    """``CHUNK`` columns per parallel task of a copy on the CPU, one on a GPU (read when a kernel compiles)."""
    return CHUNK if is_cpu() else 1


def static_chunks(items, size: int = 32):
    """``items`` cut into consecutive lists of at most ``size``: static loops of at most 32 iterations
    (Taichi warns about longer unrolled loops)."""
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _host_view(field, *arrays):
    """``field``'s memory as numpy (:func:`~tinn.runtime.memory.view_of`) when it has such a view (a float32 field on
    x64) and ``arrays`` are numpy arrays: the copies below then run as numpy operations, no kernel; else ``None``."""
    if not isinstance(field, Field) or not all(isinstance(a, np.ndarray) for a in arrays):
        return None
    return view_of(field)


def rows_copy(field, offset: int, rows, values, mode: int):
    """Between ``field[rows[g], offset + i]`` and ``values[g, i]`` (rows distinct): mode 0 reads into ``values``, 1
    writes them, 2 adds them (rounded to the field's dtype: float16 for a half-precision store). In the field's own
    memory where it has a host view (:func:`_host_view`), else by a kernel."""
    view = _host_view(field, rows, values)
    if view is None:
        return _rows_copy(field, offset, rows, values, mode)
    columns = view[:, offset:offset + values.shape[1]]
    if mode == 0:
        values[...] = columns[rows]
    elif mode == 1:
        columns[rows] = values
    else:
        columns[rows] += values


@arena_kernel
def _rows_copy(field: ARENA, offset: ti.i32, rows: I32_1D, values: F32_2D, mode: ti.template()):
    n = values.shape[1]
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(values.shape[0] * tasks):
        g, c = t // tasks, t % tasks
        r = rows[g]
        for i in range(c * C, ti.min(c * C + C, n)):
            if ti.static(mode == 0):
                values[g, i] = field[r, offset + i]
            elif ti.static(mode == 1):
                field[r, offset + i] = ti.static(cast_to(field))(values[g, i])
            else:
                total = field[r, offset + i] + values[g, i]
                field[r, offset + i] = ti.static(cast_to(field))(total)


@arena_kernel
def _copy_columns_kernel(dst: ARENA, dst_off: ti.i32, src: ARENA, src_off: ti.i32, n: ti.i32, active: I32_1D):
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(active.shape[0] * tasks):
        k, c = t // tasks, t % tasks
        if active[k]:
            for i in range(c * C, ti.min(c * C + C, n)):
                dst[k, dst_off + i] = ti.static(cast_to(dst))(src[k, src_off + i])


def copy_columns(dst, dst_off: int, src, src_off: int, n: int, active):
    """``dst[k, dst_off + i] = src[k, src_off + i]`` for ``i < n`` and every ``k`` with ``active[k] != 0``
    (``active``: an int32 kernel array, numpy or a ``ti.ndarray``: an optimizer's mask). In the fields' own memory
    where both have host views and ``active`` is numpy, else by a kernel."""
    if not n:
        return
    source, target = _host_view(src, active), _host_view(dst, active)
    if source is None or target is None:
        return _copy_columns_kernel(dst, dst_off, src, src_off, n, active)
    rows = np.flatnonzero(active)
    if len(rows) == len(active):
        rows = slice(None)
    target[rows, dst_off:dst_off + n] = source[rows, src_off:src_off + n]


@arena_kernel
def _fill_columns_kernel(dst: ARENA, offset: ti.i32, n: ti.i32, n_rows: ti.i32, value: ti.f32):
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(n_rows * tasks):
        k, c = t // tasks, t % tasks
        for i in range(c * C, ti.min(c * C + C, n)):
            dst[k, offset + i] = ti.static(cast_to(dst))(value)


def _fill_columns(dst, offset: int, n: int, n_rows: int, value: float):
    view = _host_view(dst)
    if view is None:
        return _fill_columns_kernel(dst, offset, n, n_rows, value)
    view[:n_rows, offset:offset + n] = value


def fill_columns(dst, offset: int, n: int, n_rows: int, value: float):
    """``dst[k, offset + i] = value`` for ``k < n_rows``, ``i < n`` (in the field's own memory where it has a host
    view, else by a kernel)."""
    if n:
        _fill_columns(dst, offset, n, n_rows, value)
