"""Kernel plumbing shared by every component: one way to build a kernel specialised to a config,
chunking, and the row/column copies of parameter memory.

:func:`specialised` caches a kernel factory per Taichi program and per configuration constants, and
forgets the kernels of a program once ``ti.init`` has replaced it. Kernels take fields as
``ti.template()`` arguments and offsets as runtime arguments, so that every model of one config,
whose parameters share an arena field (``tinn.params``), runs the same compiled kernel.

Copies run as one parallel loop over (row, block of ``CHUNK`` columns) on the CPU: contiguous work per
task that the compiler vectorises. On a GPU a task is one element (a warp's threads then touch
consecutive memory), and no thread runs a long serial loop (Mesa's software Vulkan driver stops a
shader invocation after 65,535 loop iterations).
"""

import functools

import taichi as ti

from ._device import is_cpu
from ._program import current_program
from ._types import F32_2D, I32_1D


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


def columns_per_task() -> int:
    """``CHUNK`` columns per parallel task of a copy on the CPU, one on a GPU (read when a kernel compiles)."""
    return CHUNK if is_cpu() else 1


def static_chunks(items, size: int = 32):
    """``items`` cut into consecutive lists of at most ``size``: static loops of at most 32 iterations
    (Taichi warns about longer unrolled loops)."""
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


@ti.kernel
def rows_copy(field: ti.template(), offset: ti.i32, rows: I32_1D, values: F32_2D, mode: ti.template()):
    """Between ``field[rows[g], offset + i]`` and ``values[g, i]``: mode 0 reads into ``values``,
    1 writes them, 2 adds them (rounded to the field's dtype: float16 for a half-precision store)."""
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
                field[r, offset + i] = ti.cast(values[g, i], field.dtype)
            else:
                field[r, offset + i] = ti.cast(field[r, offset + i] + values[g, i], field.dtype)


@ti.kernel
def _copy_columns(dst: ti.template(), dst_off: ti.i32, src: ti.template(), src_off: ti.i32, n: ti.i32,
                  active: I32_1D):
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(active.shape[0] * tasks):
        k, c = t // tasks, t % tasks
        if active[k]:
            for i in range(c * C, ti.min(c * C + C, n)):
                dst[k, dst_off + i] = ti.cast(src[k, src_off + i], dst.dtype)


def copy_columns(dst, dst_off: int, src, src_off: int, n: int, active):
    """``dst[k, dst_off + i] = src[k, src_off + i]`` for ``i < n`` and every ``k`` with ``active[k] != 0``
    (``active``: an int32 kernel array, numpy or a ``ti.ndarray``: an optimizer's mask)."""
    if n:
        _copy_columns(dst, dst_off, src, src_off, n, active)


@ti.kernel
def _fill_columns(dst: ti.template(), offset: ti.i32, n: ti.i32, n_rows: ti.i32, value: ti.f32):
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(n_rows * tasks):
        k, c = t // tasks, t % tasks
        for i in range(c * C, ti.min(c * C + C, n)):
            dst[k, offset + i] = ti.cast(value, dst.dtype)


def fill_columns(dst, offset: int, n: int, n_rows: int, value: float):
    """``dst[k, offset + i] = value`` for ``k < n_rows``, ``i < n``."""
    if n:
        _fill_columns(dst, offset, n, n_rows, value)
