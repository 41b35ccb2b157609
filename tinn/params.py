"""One flat parameter buffer per model, as tcnn's Trainer owns it.

A :class:`ParamStore` holds ``params`` and ``grads`` as Taichi fields of shape
``(n_instances, n_params)`` in tcnn's order (network matrices, then encoding
parameters). Components receive an offset into it, like tcnn's
``set_params(params + offset, ...)``; kernels and ``ti.func``s read the fields
directly, so a model can be called from inside a user's Taichi kernel.
"""

import numpy as np
import taichi as ti

from ._runtime import FieldTree, RuntimeBound, host_view


# Copies between a field slice and a numpy array: one parallel loop over (row, element), so no
# thread runs a long serial loop (on a GPU that would be one thread doing the whole copy, and Mesa's
# software Vulkan driver silently stops any thread after 65,535 loop iterations).
@ti.kernel
def _read_rows(src: ti.template(), offset: ti.i32, rows: ti.types.ndarray(dtype=ti.i32, ndim=1),
               out: ti.types.ndarray(dtype=ti.f32, ndim=2)):
    for g, i in ti.ndrange(out.shape[0], out.shape[1]):
        out[g, i] = src[rows[g], offset + i]


@ti.kernel
def _add_rows(dst: ti.template(), offset: ti.i32, rows: ti.types.ndarray(dtype=ti.i32, ndim=1),
              src: ti.types.ndarray(dtype=ti.f32, ndim=2)):
    for g, i in ti.ndrange(src.shape[0], src.shape[1]):
        dst[rows[g], offset + i] = dst[rows[g], offset + i] + src[g, i]


@ti.kernel
def _write_rows(dst: ti.template(), offset: ti.i32, rows: ti.types.ndarray(dtype=ti.i32, ndim=1),
                src: ti.types.ndarray(dtype=ti.f32, ndim=2)):
    for g, i in ti.ndrange(src.shape[0], src.shape[1]):
        dst[rows[g], offset + i] = src[g, i]


VIEW_MIN = 1 << 18
"""Floats from which a block of all instances' parameters is used in place instead of copied (1 MiB)."""

GAP = 1040
"""Floats between the parameter and gradient arrays (4160 bytes: one cache line past a 4 KiB page)."""


class ParamStore(RuntimeBound):
    """Parameters and gradients of ``n_instances`` networks with ``n_params`` each."""

    def __init__(self, n_instances: int, n_params: int):
        self._bind_runtime()
        self.n_instances, self.n_params = n_instances, n_params
        self.params = ti.field(ti.f32)
        self.grads = ti.field(ti.f32)
        def place(builder):
            # Separate arrays, so that a kernel reading one does not drag the other through the cache, and
            # a gap between them that is not a power of two: arrays a power of two apart map params[i] and
            # grads[i] to the same cache sets, which made Adam 2-4x slower on large network arrays.
            builder.dense(ti.ij, (n_instances, n_params)).place(self.params)
            builder.dense(ti.i, GAP).place(ti.field(ti.f32))
            builder.dense(ti.ij, (n_instances, n_params)).place(self.grads)

        self._tree = FieldTree(place)
        self.inference_params = self.params
        self._views = {}

    def use_inference_params(self, field=None):
        """Make ``inference()`` read ``field`` (an optimizer's averaged weights; tcnn's
        ``custom_weights``) instead of the training parameters; ``None`` restores them."""
        self.inference_params = self.params if field is None else field

    def zero_grad(self):
        self.grads.fill(0)

    def _all(self):
        return np.arange(self.n_instances, dtype=np.int32)

    def read(self, field, offset: int, n: int) -> np.ndarray:
        return self.read_rows(field, offset, n, self._all())

    def write(self, field, offset: int, values: np.ndarray):
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(self.n_instances, -1)
        if values.shape[1]:
            _write_rows(field, offset, self._all(), values)

    def set(self, offset: int, values: np.ndarray):
        """Set parameters: the training weights and, if separate, the inference weights too."""
        self.write(self.params, offset, values)
        if self.inference_params is not self.params:
            self.write(self.inference_params, offset, values)

    def read_rows(self, field, offset: int, n: int, rows: np.ndarray) -> np.ndarray:
        """``field[rows, offset : offset + n]`` for the instances ``rows`` (int32, distinct)."""
        out = np.empty((len(rows), n), np.float32)
        if n:
            _read_rows(field, offset, rows, out)
        return out

    def rows_view(self, field, offset: int, n: int, rows: np.ndarray) -> np.ndarray | None:
        """``field[rows, offset : offset + n]`` as a numpy view of the field's own memory (``params`` or
        ``grads``), where that is possible and worth it: the x64 backend, every instance in order and at
        least ``VIEW_MIN`` floats. Else ``None``: copy with :meth:`read_rows` / :meth:`write_rows`."""
        if len(rows) != self.n_instances or len(rows) * n < VIEW_MIN or (field is not self.params and
                                                                        field is not self.grads):
            return None
        if id(field) not in self._views:
            self._views[id(field)] = host_view(field)
        view = self._views[id(field)]
        return None if view is None else view[:, offset:offset + n]

    def write_rows(self, field, offset: int, rows: np.ndarray, values: np.ndarray):
        """``field[rows, offset : offset + n] = values`` for distinct instance ids ``rows``."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), -1)
        if values.shape[1]:
            _write_rows(field, offset, rows, values)

    def add_rows(self, field, offset: int, rows: np.ndarray, values: np.ndarray):
        """``field[rows, offset : offset + n] += values`` for distinct instance ids ``rows``."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), -1)
        if values.shape[1]:
            _add_rows(field, offset, rows, values)
