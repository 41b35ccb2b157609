"""Parameter memory: one flat buffer per model, as tcnn's Trainer owns it, packed into shared arenas.

A :class:`ParamStore` is a model's parameters, inference weights and gradients: columns
``[offset, offset + n_params)`` of three Taichi fields of shape ``(n_instances, width)``, in tcnn's
order (network matrices, then encoding parameters). Components are bound to their own columns,
like tcnn's ``set_params(params + offset, inference_params + offset, gradients + offset)``; their
kernels and ``ti.func``s take the fields and absolute column offsets, so a model can be called from
inside a user's Taichi kernel, and models of one config share compiled kernels.

The three fields of many stores live in one field tree (an arena *chunk*): stores with the same
``n_instances`` are packed side by side into chunks that grow geometrically, and a dropped store's
columns are reused. The number of field trees therefore grows with memory, not with models (Taichi's
CPU backend allows 512). See ``docs/memory.md``.

:func:`allocate` is the one moment memory is created: it sizes a model's store, binds every
component to its columns and draws the initial parameters.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import taichi as ti

from .runtime.commit import commit
from .runtime.program import RuntimeBound, current_program, require_half
from .runtime.kernels import copy_columns, fill_columns, rows_copy
from .runtime.memory import MAX_ELEMENTS, FieldTree, check_allocation, host_views, register_views

VIEW_MIN = 1 << 18
"""Floats from which a block of all instances' parameters is used in place instead of copied (1 MiB)."""

GAP = 1040
"""Floats between a chunk's arrays (4160 bytes: one cache line past a 4 KiB page). Arrays a power of
two apart map ``params[i]`` and ``grads[i]`` to the same cache sets, which made Adam 2-4x slower."""

ALIGN = 16
"""Stores start on a 64-byte boundary (a cache line)."""

DTYPES = {"float32": (ti.f32, ti.f32, ti.f32), "float16": (ti.f16, ti.f16, ti.f32)}
"""A store's precision (``tinn.keys.PRECISIONS``, checked there) and the dtypes of its fields: parameters,
inference weights, gradients. Gradients are float32 at either precision: they are sums of many partial sums
(per block and per sample on a GPU), which a float16 accumulator would round away."""

KEPT_ACTIVATIONS = {"float32": ti.f32, "float16": ti.f16}
"""The dtype of the device buffers in which a model of a precision keeps an MLP's hidden activations: each hidden
layer's output, which the next layer reads, and the pre-activations the backward differentiates at. As in tcnn's
half-precision build the forward rounds every hidden output to float16 (the host path holds the same rounded
values in float32 arrays, ``tinn.networks._mlp_host.round_to_half``); an MLP's input (an encoding's output), its
outputs, its gradients and everything per-sample funcs hold in registers stay float32."""

FLOAT16_MAX = float(np.finfo(np.float16).max)

CHUNK_MIN, CHUNK_MAX = 1 << 18, 1 << 24
"""Floats per array of an arena's first chunk (1 MiB) and the most a later one grows to (64 MiB);
a store larger than that gets a chunk of its own size."""


class _Chunk:
    """One field tree of arrays of ``dtypes`` (one per array), each ``(n_instances, width)`` (a store's
    ``params``, ``inference`` and ``grads``, or a buffer's one array), and the free column ranges between
    the slices placed in it."""

    def __init__(self, n_instances: int, width: int, dtypes: tuple, what: str):
        self.n_instances, self.width = n_instances, width
        self.fields = fields = [ti.field(dtype) for dtype in dtypes]

        def place(builder):
            for i, f in enumerate(fields):
                if i:
                    builder.dense(ti.i, GAP).place(ti.field(ti.f32))
                builder.dense(ti.ij, (n_instances, width)).place(f)

        self._tree = FieldTree(place, what)
        self.free = [(0, width)]                   # sorted, disjoint [start, end) ranges
        self.n_stores = 0
        self.views = host_views(fields)            # x64: what tinn's kernels take instead of the fields
        if self.views is not None:
            register_views(fields, self.views)

    def take(self, n: int):
        """The first free column range of ``n`` (aligned) columns: its start, or ``None``."""
        size = -(-max(n, 1) // ALIGN) * ALIGN
        for j, (start, end) in enumerate(self.free):
            if end - start >= size:
                self.free[j:j + 1] = [(start + size, end)] if end - start > size else []
                self.n_stores += 1
                return start
        return None

    def give(self, start: int, n: int):
        end = start + -(-max(n, 1) // ALIGN) * ALIGN
        ranges = sorted(self.free + [(start, end)])
        merged = [ranges[0]]
        for s, e in ranges[1:]:
            if s == merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self.free, self.n_stores = merged, self.n_stores - 1        # (both in one line: given back, or not)

    def view(self, field):
        """The field's memory as a float32 numpy array (x64 only; a chunk with a float16 array has none), else
        ``None``."""
        if self.views is None:
            return None
        return next(v for f, v in zip(self.fields, self.views) if f is field)


class _Arena:
    """The chunks holding every slice of ``n_instances`` rows and arrays of ``dtypes`` in one Taichi program."""

    def __init__(self, n_instances: int, dtypes: tuple):
        self.n_instances, self.dtypes, self.chunks, self.next_floats = n_instances, dtypes, [], CHUNK_MIN

    def take(self, n: int, what: str):
        for chunk in self.chunks:
            start = chunk.take(n)
            if start is not None:
                return chunk, start
        K = self.n_instances
        width = max(-(-n // ALIGN) * ALIGN, self.next_floats // K)
        width = min(width, max(MAX_ELEMENTS // K, n))            # an oversized store fails its size check
        check_allocation(what, [(K, width)] * len(self.dtypes))
        chunk = _Chunk(K, width, self.dtypes, what)
        if width * K <= CHUNK_MAX:
            self.next_floats = min(2 * self.next_floats, CHUNK_MAX)
        self.chunks.append(chunk)
        return chunk, chunk.take(n)

    def give(self, chunk: _Chunk, start: int, n: int):
        chunk.give(start, n)
        if not chunk.n_stores and chunk.n_instances * chunk.width > CHUNK_MAX and chunk is not self.chunks[-1]:
            self.chunks.remove(chunk)             # an oversized store's own chunk: its tree is freed with it


_ARENAS: dict = {}


def _arena(n_instances: int, dtypes: tuple) -> _Arena:
    """The arena of the live Taichi program for slices of ``n_instances`` rows and arrays of ``dtypes``
    (arenas of older programs are dropped: ``ti.init`` freed their fields)."""
    program = current_program()
    if _ARENAS.get("program") is not program:
        _ARENAS.clear()
        _ARENAS["program"] = program
    key = (n_instances, tuple(dtypes))
    if key not in _ARENAS:
        _ARENAS[key] = _Arena(n_instances, dtypes)
    return _ARENAS[key]


class _Slice(RuntimeBound):
    """Columns ``[offset, offset + n)`` of every array (one per dtype of ``dtypes``) of an arena chunk, given
    back when dropped."""

    HOST_COPIES = 0         # host arrays of the slice's size that filling it takes (counted by the size check)

    def __init__(self, n_instances: int, n: int, what: str, dtypes: tuple):
        self._bind_runtime()
        check_allocation(what, [(n_instances, n)] * (len(dtypes) + self.HOST_COPIES))
        self.n_instances = n_instances
        self._n = n
        self._arena = _arena(n_instances, dtypes)
        self._chunk, self.offset = self._arena.take(n, what)

    def __del__(self):
        try:
            if self._program is ti.lang.impl.get_runtime().prog:
                self._arena.give(self._chunk, self.offset, self._n)
        except Exception:  # interpreter shutdown, or a slice whose construction failed
            pass


class Buffer(_Slice):
    """A ``(n_instances, n)`` float32 array that kernels read as ``field[k, offset + i]`` (an optimizer's
    averaged weights or gradient pool), placed in a shared arena like the parameter stores."""

    def __init__(self, n_instances: int, n: int, what: str = "buffer"):
        super().__init__(n_instances, n, what, (ti.f32,))
        self.n, self.field = n, self._chunk.fields[0]
        self.fill(0.0)

    def fill(self, value: float):
        fill_columns(self.field, self.offset, self.n, self.n_instances, value)

    def to_numpy(self) -> np.ndarray:
        out = np.empty((self.n_instances, self.n), np.float32)
        if self.n:
            rows_copy(self.field, self.offset, np.arange(self.n_instances, dtype=np.int32), out, 0)
        return out

    def from_numpy(self, values: np.ndarray):
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(self.n_instances, self.n)
        if self.n:
            rows_copy(self.field, self.offset, np.arange(self.n_instances, dtype=np.int32), values, 1)


class ParamStore(_Slice):
    """Parameters, inference weights and gradients of ``n_instances`` networks with ``n_params`` each:
    ``params[k, offset + i]``, ``inference_params[k, offset + i]``, ``grads[k, offset + i]``.

    The fields are shared with other stores; every method takes absolute column offsets and touches
    only this store's columns. ``inference()`` and ``func`` read ``inference_params``: the optimizer
    fills it after each step (a copy of the trained weights, or its averaged weights).

    ``precision`` is ``"float32"`` or ``"float16"`` (``tinn.keys.PRECISIONS``): the dtype of ``params`` and
    ``inference_params``, what the model reads; ``grads`` is float32 at either precision (``DTYPES`` says
    why). A float16 store's float32 master weights belong to the trainer (``tinn.mixed_precision``).
    ``version`` counts the writes of the parameters through :meth:`set`, so that the master weights can
    follow them.
    """

    HOST_COPIES = 3         # the initial draw on the host: a component's blocks, their concatenation, all instances

    def __init__(self, n_instances: int, n_params: int, what: str = "parameter store", precision: str = "float32"):
        if precision == "float16":
            require_half(what)
        super().__init__(n_instances, n_params, what, DTYPES[precision])
        self.precision = precision
        self.n_params = n_params
        self.version = 0
        self.params, self.inference_params, self.grads = self._chunk.fields
        self.zero_grad()                          # the columns may have held a dropped store's gradients

    @property
    def end(self) -> int:
        return self.offset + self.n_params

    def _columns(self, field, offset: int, n: int):
        """Refuse columns of this store's fields outside its own (other fields, e.g. an optimizer's, are
        the caller's to index)."""
        mine = field is self.params or field is self.inference_params or field is self.grads
        if mine and (offset < self.offset or offset + n > self.end):
            raise ValueError(f"columns [{offset}, {offset + n}) lie outside this store's [{self.offset}, {self.end})")

    def _all(self):
        return np.arange(self.n_instances, dtype=np.int32)

    def zero_grad(self):
        fill_columns(self.grads, self.offset, self.n_params, self.n_instances, 0.0)

    def read(self, field, offset: int, n: int) -> np.ndarray:
        """``field[:, offset : offset + n]`` of every instance, ``(n_instances, n)``."""
        return self.read_rows(field, offset, n, self._all())

    def write(self, field, offset: int, values: np.ndarray):
        self.write_rows(field, offset, self._all(), values)

    def set(self, offset: int, values: np.ndarray):
        """Set parameters: the training weights and the inference weights (a float16 store refuses values
        beyond float16's range, ``ValueError``, before writing anything)."""
        if self.precision == "float16" and np.size(values) and np.max(np.abs(values)) > FLOAT16_MAX:
            raise ValueError(f"a parameter of magnitude {float(np.max(np.abs(values))):.6g} lies beyond float16's "
                             f"range (+-{FLOAT16_MAX:g}) of this half-precision model")
        commit([partial(self.write, self.params, offset, values),          # whole or not at all: each phase a copy
                partial(self.write, self.inference_params, offset, values), self._new_version])

    def _new_version(self):
        self.version += 1

    def publish(self, source, source_offset: int, active):
        """Fill the inference weights of the instances with ``active[k] != 0`` (int32, numpy or ``ti.ndarray``) from
        ``source[k, source_offset + i]`` (the trained weights, or an optimizer's averaged ones)."""
        copy_columns(self.inference_params, self.offset, source, source_offset, self.n_params, active)

    def read_rows(self, field, offset: int, n: int, rows: np.ndarray) -> np.ndarray:
        """``field[rows, offset : offset + n]`` for the instances ``rows`` (int32, distinct)."""
        self._columns(field, offset, n)
        out = np.empty((len(rows), n), np.float32)
        if n:
            rows_copy(field, offset, rows, out, 0)
        return out

    def rows_view(self, field, offset: int, n: int, rows: np.ndarray) -> np.ndarray | None:
        """``field[rows, offset : offset + n]`` as a numpy view of the field's own memory (``params``,
        ``grads`` or ``inference_params``), where that is possible and worth it: the x64 backend, a run of
        consecutive instances ``rows`` (ascending, as ``batch.routing.active`` lists them) and at least ``VIEW_MIN``
        floats. Else ``None``: copy with :meth:`read_rows` / :meth:`write_rows`."""
        self._columns(field, offset, n)
        if not len(rows) or rows[-1] - rows[0] != len(rows) - 1 or len(rows) * n < VIEW_MIN or not any(
                field is f for f in (self.params, self.grads, self.inference_params)):
            return None
        view = self._chunk.view(field)
        return None if view is None else view[rows[0]:rows[0] + len(rows), offset:offset + n]

    def write_rows(self, field, offset: int, rows: np.ndarray, values: np.ndarray):
        """``field[rows, offset : offset + n] = values`` for distinct instance ids ``rows``."""
        self._copy_in(field, offset, rows, values, 1)

    def add_rows(self, field, offset: int, rows: np.ndarray, values: np.ndarray):
        """``field[rows, offset : offset + n] += values`` for distinct instance ids ``rows``."""
        self._copy_in(field, offset, rows, values, 2)

    def _copy_in(self, field, offset, rows, values, mode):
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(len(rows), -1)
        self._columns(field, offset, values.shape[1])
        if values.shape[1]:
            rows_copy(field, offset, rows, values, mode)


def _parts(obj):
    """``obj`` and the components inside it, inputs first (encoding before network)."""
    for name in ("encoding", "network"):
        part = getattr(obj, name, None)
        if part is not None and part is not obj:
            yield from _parts(part)
    for part in getattr(obj, "nested", None) or ():
        if hasattr(part, "n_params"):
            yield from _parts(part)
    yield obj


def _describe(obj) -> str:
    try:
        return f"{type(obj).__name__} {obj.hyperparams()}"
    except Exception:
        return type(obj).__name__


def check_sizes(obj):
    """``ValueError`` naming the component, before anything is allocated, if a component of ``obj``
    has more parameters or a wider output than one Taichi array can address."""
    K = obj.n_instances
    for part in _parts(obj):
        width = getattr(part, "padded_output_width", 0) or 0
        if width > MAX_ELEMENTS:
            raise ValueError(f"{_describe(part)}: its output has {width:,} values per sample, more than the "
                             f"{MAX_ELEMENTS:,} (2^31 - 1) one array can address")
        if K * part.n_params > MAX_ELEMENTS:
            raise ValueError(f"{_describe(part)}: {K} x {part.n_params:,} parameters, more than the "
                             f"{MAX_ELEMENTS:,} (2^31 - 1) one array can address")


def allocate(obj, seed: int | None = None, precision: str = "float32") -> ParamStore:
    """Create ``obj``'s parameter store, bind every component to its columns and initialise it from
    ``seed`` (default: ``obj.seed``) with tcnn's pcg32 draws. Sizes that cannot be allocated, and float16
    ``precision`` on an arch without it, are refused with a ``ValueError`` before any memory is taken."""
    check_sizes(obj)
    store = ParamStore(obj.n_instances, obj.n_params, what=_describe(obj), precision=precision)
    obj.bind(store, store.offset)
    obj.reset_params(obj.seed if seed is None else seed)
    return store
