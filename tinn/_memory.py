"""Taichi field memory: sizes checked before anything is allocated, field trees freed with their owner,
and a zero-copy host view of a field.

Taichi's CPU backend allows a limited number of field trees (512): objects share trees
(``tinn.params`` packs every parameter store into a few arenas) wherever they can.
"""
import ctypes
import math
import os

import numpy as np
import taichi as ti
from taichi.lang import impl

try:
    import resource
except ImportError:                             # Windows
    resource = None

from ._program import current_program
from ._types import U64_1D

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


class FieldTree:
    """Fields placed by one ``ti.FieldsBuilder``, freed when the owner is garbage collected.

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


@ti.kernel
def _addresses(f: ti.template(), i: ti.i32, j: ti.i32, out: U64_1D):
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
