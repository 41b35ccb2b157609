"""What the grid kernels read at run time: the levels' geometry and the CPU's private gradient tables.

Every grid of a Taichi program keeps its levels' geometry (scale, resolution, table size, entry offset) in one
shared table, and the bounds of its runs of levels (levels of one index mode, ``_grid_kernels``) in another:
a kernel is handed the row of a grid's bounds (``gb``) and reads the rest, so that grids of another resolution,
scale or table size run the kernels already compiled. A full table opens another (whose kernels then compile
once more): ``ROWS`` levels hold hundreds of grids.
"""
import contextlib

import taichi as ti

from ..runtime.kernels import specialised
from ..runtime.memory import FieldTree, check_allocation

ROWS = 4096
"""Levels (and run bounds) one table holds."""
MIN_SCRATCH = 1 << 18
"""Fewest columns per network of the private gradient tables: grids up to that size share one compiled scatter."""


class Tables:
    """One program's geometry table ``geometry`` (a row per level) and run bounds ``bounds``: the rows
    ``bounds[gb], ..., bounds[gb + R]`` of a grid of R runs are where its runs start, then its last level + 1."""

    def __init__(self):
        self.geometry = ti.types.struct(scale=ti.f32, res=ti.u32, size=ti.u32, offset=ti.u32).field()
        self.bounds = ti.field(ti.i32)

        def place(builder):
            builder.dense(ti.i, ROWS).place(self.geometry)
            builder.dense(ti.i, ROWS).place(self.bounds)

        self.tree = FieldTree(place, "grid encoding tables")
        self.rows, self.levels_used, self.bounds_used = {}, 0, 0

    def add(self, levels: tuple, starts: tuple):
        """``(bounds row, row of level 0)`` of a grid of ``levels`` (scale, res, size, offset), its runs starting
        at the levels ``starts``; ``None`` if the table is full. Grids of the same geometry share their rows."""
        key = (levels, starts)
        if key not in self.rows:
            if self.levels_used + len(levels) > ROWS or self.bounds_used + len(starts) + 1 > ROWS:
                return None
            g0, gb = self.levels_used, self.bounds_used
            for l, (scale, res, size, offset) in enumerate(levels):
                self.geometry[g0 + l] = dict(scale=scale, res=res, size=size, offset=offset)
            for r, start in enumerate(starts + (len(levels),)):
                self.bounds[gb + r] = g0 + start
            self.levels_used += len(levels)
            self.bounds_used += len(starts) + 1
            self.rows[key] = gb, g0
        return self.rows[key]


class Bound:
    """A grid's kernels: its kind's (``_grid_kernels._Kernels``) with its geometry (the bounds row ``gb`` of its
    table, ``n`` parameters per network, its output's padded ``width``, the table rows ``bounds`` of its runs'
    first levels and of its last level + 1, the largest table of its levels summed per block, its ``levels``
    themselves and the ``scratch`` columns per network of its private gradient tables)."""

    def __init__(self, kernels, gb: int, n: int, width: int, bounds: tuple, block_size: int, levels: tuple,
                 scratch: int):
        self.kernels, self.gb, self.n, self.width, self.bounds = kernels, gb, n, width, bounds
        self.block_size, self.levels, self.scratch = block_size, levels, scratch
        self.private, self.cpu = kernels.private, kernels.cpu
        self.block_levels = sum(stop - first for (_, shared), first, stop in zip(kernels.kinds, bounds, bounds[1:])
                                if shared)
        self.features_into = kernels.features_into_of(bounds)

    def forward(self, weights, base, x, inst, y, routed):
        self.kernels.forward(weights, base, self.gb, x, inst, y, routed)

    def backward_input(self, weights, base, x, inst, dy, dx, routed):
        self.kernels.per_sample_backward(weights, base, self.gb, x, inst, dy, dx, routed, False, x, dx)

    def backward_backward(self, weights, base, x, inst, g, dy, d_dy, dx, routed):
        self.kernels.per_sample_backward(weights, base, self.gb, x, inst, dy, dx, routed, True, g, d_dy)

    def backward_params(self, G, base, x, inst, dy, routed, overwrite, g=None):
        self.kernels.backward_params(self, G, base, x, inst, dy, routed, overwrite, g)

    def sample_funcs(self, weights, grads, base: int):
        return self.kernels.sample_funcs(weights, grads, base, self.bounds, self.levels, self.width)


@specialised
def tables(index: int) -> Tables:
    """The program's ``index``-th table (a new one when the ones before are full)."""
    return Tables()


def place(levels: tuple, starts: tuple):
    """``(table index, bounds row, row of level 0)`` of a grid's geometry, added to the first table with room."""
    index = 0
    while True:
        rows = tables(index).add(levels, starts)
        if rows is not None:
            return (index,) + rows
        index += 1


class Scratch:
    """The CPU workers' private gradient tables of the grids of ``K`` networks: a float32 field ``[worker, k, i]``
    per capacity (columns per network, ``scratch_capacity``), shared by every grid of at most that many parameters
    (the scatter and the reduction take it as a template argument: they compile once per capacity). They are zero
    between backward passes: the pass that fills them (the scatter) is followed by the reduction that empties them.
    A pass cut short between the two (an exception, a KeyboardInterrupt) leaves them ``dirty``, and the next pass
    zeroes them first, so that no gradient of an interrupted pass reaches a later one."""

    def __init__(self, n_workers: int, K: int):
        self.n_workers, self.K = n_workers, K
        self.fields, self.dirty, self._trees = {}, set(), []

    @contextlib.contextmanager
    def filling(self, capacity: int):
        """Run the scatter and the reduction inside, given the field of ``capacity`` columns: the tables are zero
        at the start, whatever came before."""
        if capacity not in self.fields:
            shape = (self.n_workers, self.K, capacity)
            check_allocation("a grid encoding's private gradient tables", [shape])
            field = ti.field(ti.f32)
            self._trees.append(FieldTree(lambda builder: builder.dense(ti.ijk, shape).place(field),
                                         "grid encoding gradient tables"))     # a new field is zero
            self.fields[capacity] = field
        field = self.fields[capacity]
        if capacity in self.dirty:
            field.fill(0.0)
        self.dirty.add(capacity)
        yield field
        self.dirty.discard(capacity)


def scratch_capacity(n: int) -> int:
    """Columns per network of the private tables of a grid of ``n`` parameters: the power of two at or above
    ``n`` (at least ``MIN_SCRATCH``), so that grids of other sizes share them and their kernels."""
    return max(MIN_SCRATCH, 1 << (n - 1).bit_length())


@specialised
def scratch(n_workers: int, K: int) -> Scratch:
    """The program's private gradient tables of ``n_workers`` workers and ``K`` networks."""
    return Scratch(n_workers, K)
