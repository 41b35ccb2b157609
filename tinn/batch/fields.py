"""Moving the elements of a user's Taichi fields into tinn's batches and back, for ``tinn.ad``'s stages: a
stage call takes the elements (``take``: all, or where its ``mask`` is not 0), runs the network on them
(``forward``), writes the outputs (``put``) and, in its reverse pass, takes the outputs' ``.grad`` and adds
``dL/dx`` to the inputs' (``take_gradient``, ``add_gradient``).

:class:`HostMoves` (the CPU) reads the fields into numpy batches and writes them back (on x64 through views of
their own memory, ``_Memory``). On the device path (:class:`DeviceMoves`) nothing batch-sized leaves the device:
:func:`_survey` ranks the taken elements (an exclusive prefix sum of the mask in row-major order) and checks their
values and ids, and its four counters are the call's one read-back; :func:`_gather` / :func:`_scatter` copy between
the fields and ``ti.ndarray`` batches of the taken elements, the census routes them, and :func:`_take_gradient` /
:func:`_add_gradient` move ``y.grad`` and ``dL/dx``. ``Taken.active`` is then the survey's device mask of the
networks reached.
"""
import numpy as np
import taichi as ti

from ..runtime import memory as _memory
from ..runtime.types import ANY_2D, I32_1D
from . import buffers as _buffers
from .batch import Batch
from .census import SCAN, Request
from .faults import NONE
from .ops import DEVICE
from .routing import Routing, check_id_range

N_TAKEN, ID_LO, ID_HI, BAD = range(4)
"""Slots of a device survey's ``facts`` (int32): elements taken, the ids' range, the first element whose x
is not finite (``NONE``: none)."""


def index_offset(f) -> tuple:
    """The index of the first element of the field ``f`` along each axis (``ti.field(..., offset=...)``; zeros for
    none): element r in row-major order has the index ``np.unravel_index(r, f.shape)`` plus this."""
    return tuple(f.snode.ptr.offset) or (0,) * len(f.shape)


def _not_finite(x, flat: int):
    """The ``ValueError`` for element ``flat`` (row-major) of the field ``x``, whose value is not finite."""
    index = tuple(int(i) + o for i, o in zip(np.unravel_index(flat, x.shape), index_offset(x)))
    value = x[index if len(index) > 1 else index[0]]
    raise ValueError(f"x must be finite: element {index} holds {value.to_numpy()}")


class Taken:
    """The elements one call took: ``n`` of them, their inputs ``x`` ``(n, n_input_dims)`` and network ids
    ``inst`` (``None`` for one network) as a batch of the path's kind, where they sit in the fields (``where``:
    host flat indices, ``None`` for all of them; a device ``(size,)`` int32 position of each element in the
    batch, -1 for an element left out) and the networks they reach (``active``). On the CPU, ``memory`` reads and
    writes the stage's fields (``_Memory``)."""

    memory = None

    def __init__(self, n, x, inst, where, active):
        self.n, self.x, self.inst, self.where, self.active = n, x, inst, where, active


class _Memory:
    """A stage call's fields as numpy on the CPU: views of their own memory where
    :func:`~tinn.runtime.memory.field_views` gives them (x64, fields placed with a shape: one small launch, no
    compile per field), else Taichi's ``to_numpy`` / ``from_numpy`` / ``fill``."""

    def __init__(self, stage):
        fields = [stage.x, stage.out, stage.out.grad] + [f for f in (stage.mask, stage.instance) if f is not None]
        if stage._x_grad:
            fields.append(stage.x.grad)
        views = _memory.field_views(fields)
        self._views = None if views is None else {id(f): v for f, v in zip(fields, views)}

    def read(self, field) -> np.ndarray:
        """A copy of ``field``'s values, as ``field.to_numpy()``."""
        return field.to_numpy() if self._views is None else np.array(self._views[id(field)])

    def write(self, field, values):
        """``field``'s values = ``values`` (its ``to_numpy`` shape), as ``field.from_numpy``."""
        if self._views is None:
            field.from_numpy(values)
        else:
            self._views[id(field)][...] = values

    def zero(self, field):
        """``field``'s values = 0, as ``field.fill(0)``."""
        if self._views is None:
            field.fill(0)
        else:
            self._views[id(field)][...] = 0


class HostMoves:
    """The CPU path: the fields are read into numpy batches and written back from them (the batch API's
    host arrays; on x64 a copy through memory, no bus)."""

    @staticmethod
    def take(stage) -> Taken:
        n_in, memory = stage.network.n_input_dims, _Memory(stage)
        x = memory.read(stage.x).reshape(-1, n_in)
        rows = None
        if stage.mask is not None:
            rows = np.flatnonzero(memory.read(stage.mask).reshape(-1))
            x = x[rows]
        inst = None
        if stage.instance is not None:
            inst = memory.read(stage.instance).reshape(-1)
            inst = np.ascontiguousarray(inst if rows is None else inst[rows], dtype=np.int32)
            if len(inst):
                check_id_range(int(inst.min()), int(inst.max()), stage.network.n_instances)
        x = np.ascontiguousarray(x, dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if bad.size:
            _not_finite(stage.x, int(bad[0] if rows is None else rows[bad[0]]))
        active = None if inst is None else np.flatnonzero(
            np.bincount(inst, minlength=stage.network.n_instances)).astype(np.int32)
        taken = Taken(len(x), x, inst, rows, active)
        taken.memory = memory
        return taken

    @staticmethod
    def forward(network, taken):
        return network.forward(taken.x, taken.inst)

    @staticmethod
    def put(stage, taken, values):
        """``y[I]`` = the row of ``values`` ``(n, >= y.n)`` taken from element I (``None``: none was), else 0."""
        rows, width, field = taken.where, stage.out.n, stage.out
        values = np.zeros((0, width), np.float32) if values is None else np.asarray(values)[:, :width]
        full = values if rows is None else np.zeros((int(np.prod(stage.x.shape)), width), np.float32)
        if rows is not None:
            full[rows] = values
        taken.memory.write(field, np.ascontiguousarray(full, dtype=np.float32).reshape(tuple(stage.x.shape) + (width,)))

    @staticmethod
    def take_gradient(stage, taken):
        g = taken.memory.read(stage.out.grad).reshape(-1, stage.out.n)
        taken.memory.zero(stage.out.grad)
        return np.ascontiguousarray(g if taken.where is None else g[taken.where])

    @staticmethod
    def add_gradient(stage, taken, dx):
        n_in = stage.network.n_input_dims
        total = taken.memory.read(stage.x.grad).reshape(-1, n_in)
        if taken.where is None:
            total += dx
        else:
            total[taken.where] += dx
        taken.memory.write(stage.x.grad, total.reshape(tuple(stage.x.shape) + (n_in,)))

    @staticmethod
    def ones(n):
        return np.ones((n, 1), np.float32)


# -- the device path's moves: kernels between the user's fields and tinn's ti.ndarray batches ---------------
@ti.func
def _element(f: ti.template(), r):
    """The index (a ``ti.Vector``) of element ``r`` of the field ``f`` in row-major order (:func:`index_offset`)."""
    index = ti.Vector.zero(ti.i32, ti.static(len(f.shape)))
    q = r
    for d in ti.static(range(len(f.shape))):
        axis = ti.static(len(f.shape) - 1 - d)
        index[axis] = q % f.shape[axis]
        if ti.static(index_offset(f)[axis]):
            index[axis] += index_offset(f)[axis]
        q //= f.shape[axis]
    return index


@ti.func
def _taken(mask: ti.template(), masked: ti.template(), index) -> ti.i32:
    take = 1
    if ti.static(masked):
        take = ti.select(mask[index] != 0, 1, 0)
    return take


@ti.kernel
def _survey(x: ti.template(), mask: ti.template(), instance: ti.template(), masked: ti.template(),
            routed: ti.template(), pos: I32_1D, totals: I32_1D, facts: I32_1D, active: I32_1D):
    """Which elements of ``x`` a stage takes (``mask != 0``, or all) and where each goes in the batch: ``pos[r]``
    the rank of element r among the taken ones in row-major order (an exclusive prefix sum over blocks of
    ``SCAN`` elements, the blocks' totals summed in order), -1 for one left out; ``facts`` (``N_TAKEN`` ..);
    ``active[k]`` 1 for a network (``instance``) that a taken element reaches. Top-level loops run in order."""
    K = active.shape[0]
    for k in range(K):
        active[k] = 0
    for _ in range(1):
        facts[N_TAKEN], facts[ID_LO], facts[ID_HI], facts[BAD] = 0, NONE, -NONE - 1, NONE
    for r in range(pos.shape[0]):                  # (its own loop: atomics in the blocks' serial loops were
        index = _element(x, r)                     # lost on Vulkan)
        if _taken(mask, masked, index):
            v = x[index]
            for j in ti.static(range(x.n)):
                if not (ti.abs(v[j]) <= 3.4028234663852886e38):              # NaN and +-Inf fail it
                    ti.atomic_min(facts[BAD], r)
            if ti.static(routed):
                k = instance[index]
                ti.atomic_min(facts[ID_LO], k)
                ti.atomic_max(facts[ID_HI], k)
                if 0 <= k < K:
                    active[k] = 1
    for c in range(totals.shape[0] - 1):
        count = 0
        for r in range(c * SCAN, ti.min(c * SCAN + SCAN, pos.shape[0])):
            count += _taken(mask, masked, _element(x, r))
        totals[c + 1] = count
    for _ in range(1):                             # (a running sum in registers: on Vulkan, a read of an entry
        total = 0                                  # just updated in place saw the old value)
        totals[0] = 0
        for c in range(1, totals.shape[0]):
            total += totals[c]
            totals[c] = total
    for _ in range(1):                             # (a task of its own: read in the loop above, Vulkan saw 0)
        facts[N_TAKEN] = totals[totals.shape[0] - 1]
    for c in range(totals.shape[0] - 1):
        p = totals[c]
        for r in range(c * SCAN, ti.min(c * SCAN + SCAN, pos.shape[0])):
            pos[r] = -1
            if _taken(mask, masked, _element(x, r)):
                pos[r] = p
                p += 1


@ti.kernel
def _gather(x: ti.template(), instance: ti.template(), routed: ti.template(), pos: I32_1D, rows: ANY_2D,
            ids: I32_1D):
    """``rows[pos[r]] = x[r]`` (and ``ids[pos[r]] = instance[r]``) for each taken element r."""
    for r in range(pos.shape[0]):
        p = pos[r]
        if p >= 0:
            index = _element(x, r)
            v = x[index]
            for j in ti.static(range(x.n)):
                rows[p, j] = v[j]
            if ti.static(routed):
                ids[p] = instance[index]


@ti.kernel
def _scatter(out: ti.template(), pos: I32_1D, rows: ANY_2D):
    """``out[r] = rows[pos[r], :out.n]`` for each taken element r, 0 for the others."""
    for r in range(pos.shape[0]):
        v = ti.Vector.zero(ti.f32, out.n)
        p = pos[r]
        if p >= 0:
            for j in ti.static(range(out.n)):
                v[j] = ti.cast(rows[p, j], ti.f32)
        out[_element(out, r)] = v


@ti.kernel
def _take_gradient(grad: ti.template(), pos: I32_1D, rows: ANY_2D):
    """``rows[pos[r]] = grad[r]`` for each taken element r; ``grad`` becomes 0 everywhere."""
    for r in range(pos.shape[0]):
        index = _element(grad, r)
        p = pos[r]
        if p >= 0:
            v = grad[index]
            for j in ti.static(range(grad.n)):
                rows[p, j] = v[j]
        grad[index] = ti.Vector.zero(ti.f32, grad.n)


@ti.kernel
def _add_gradient(grad: ti.template(), pos: I32_1D, rows: ANY_2D):
    """``grad[r] += rows[pos[r]]`` for each taken element r (one row per element: no atomics)."""
    for r in range(pos.shape[0]):
        p = pos[r]
        if p >= 0:
            index = _element(grad, r)
            v = grad[index]
            for j in ti.static(range(grad.n)):
                v[j] += ti.cast(rows[p, j], ti.f32)
            grad[index] = v


class DeviceMoves:
    """The device path: the fields stay on the device. A survey kernel ranks the taken elements (a prefix sum
    over the mask) and checks their values and ids, then kernels copy between the fields and ``ti.ndarray``
    batches of the taken elements only. What crosses to the host per call is the survey's four counters."""

    @staticmethod
    def take(stage) -> Taken:
        x, K = stage.x, stage.network.n_instances
        size = int(np.prod(x.shape))
        pos, facts = _buffers.buffer((size,), ti.i32), _buffers.buffer((4,), ti.i32)
        totals, active = _buffers.buffer((-(-size // SCAN) + 1,), ti.i32), _buffers.buffer((K,), ti.i32)
        masked, routed = stage.mask is not None, stage.instance is not None
        _survey(x, stage.mask if masked else x, stage.instance if routed else x, masked, routed, pos, totals, facts,
                active)
        facts = facts.to_numpy()
        if facts[BAD] != NONE:
            _not_finite(x, int(facts[BAD]))
        n = int(facts[N_TAKEN])
        if routed and n:
            check_id_range(int(facts[ID_LO]), int(facts[ID_HI]), K)
        rows = ids = None
        if n:
            rows = _buffers.buffer((n, x.n))
            ids = _buffers.buffer((n,), ti.i32) if routed else DEVICE.no_ids()
            _gather(x, stage.instance if routed else x, routed, pos, rows, ids)
        return Taken(n, rows, ids if routed else None, pos, active if routed else None)

    @staticmethod
    def forward(network, taken):
        """The network's forward on the taken rows, routed by a census on the device (values checked already)."""
        network._check_runtime()
        if taken.inst is None:
            batch = Batch(taken.x, Routing(taken.n), DEVICE)
        else:
            batch = Batch.of(taken.x, taken.inst, network.n_instances,
                             census=Request(network.n_output_dims))
        return network._forward(batch.x, batch)

    @staticmethod
    def put(stage, taken, values):
        _scatter(stage.out, taken.where, DEVICE.unused((1, stage.out.n), np.float32) if values is None else values)

    @staticmethod
    def take_gradient(stage, taken):
        rows = _buffers.buffer((max(taken.n, 1), stage.out.n))
        _take_gradient(stage.out.grad, taken.where, rows)
        return rows

    @staticmethod
    def add_gradient(stage, taken, dx):
        _add_gradient(stage.x.grad, taken.where, dx)

    @staticmethod
    def ones(n):
        return DEVICE.full((n, 1), 1.0)
