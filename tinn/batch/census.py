"""The census of a training step's device batch: its values and its network ids, found on the device.

A training step of device batches must not wait for the device, so nothing about its batch is read
back while it runs. Instead one kernel (:func:`_census_kernel`, launched when the step's routing is
built) looks at the batch once and leaves its findings on the device for the kernels after it:

* ``x``'s first row holding NaN or +-Inf (``facts[X_ROW]``; ``NONE`` when there is none);
* for a routed batch, the ids' range, each network's sample count, the ids clamped into range (what
  the model's kernels read, so a bad id never indexes outside the parameters), the samples sorted by
  network and cut into tiles of at most ``TILE`` samples of one network (``Routing.tiles``), and each
  network's loss normaliser ``1 / (count * D)``;
* a training step's ``target`` and ``pdf`` rows holding NaN or +-Inf, or a ``pdf`` <= 0 (``facts[TARGET_ROW]``,
  ``facts[PDF_ROW]``);
* the step *mask*: 1 for a network that got samples, 0 for the others, and 0 for every network when
  anything in the batch is bad, so the optimizer leaves every parameter and all its state untouched.

For the first bad call of a trainer (or of an object's inferences) the census writes what was wrong into their
fault record (:class:`Faults`), so the kernels after it (the model's, the loss's, the optimizer's) only compute.
The loss value (:class:`~tinn.batch.loss_value.LossValue`) and the trainer's reads settle them: the ``ValueError``
comes when the step's loss is read, or at the trainer's next call that reads from the device, whichever is first.

An inference's census writes no mask or normalisers, and sorts no tiles unless asked (the per-layer MLP kernels
read each sample's network directly; ``Census.tiles`` sorts on first use, with one more launch and no read-back).
"""

from dataclasses import dataclass

import numpy as np
import taichi as ti

from ..runtime.types import F32_1D, F32_2D, F32_ANY, I32_1D, I32_2D
from . import buffers as _buffers

X_ROW, TARGET_ROW, PDF_ROW, ID_LO, ID_HI, N_ACTIVE = range(6)
"""Slots of a census's ``facts`` (int32): the first bad row of each array, the ids' range, the networks with samples."""

N_FACTS = 6
TILE = 128
"""Samples per tile on the device path (a weight gradient is summed over a tile, then added once)."""
NONE = 2 ** 31 - 1
"""A first bad row of an array that has none."""

SCAN = 256
"""Networks per parallel task of the prefix sums over the networks (the serial pass runs over tasks)."""

NAMES = {X_ROW: "x", TARGET_ROW: "target", PDF_ROW: "pdf"}

RECORD_FACTS = 3
"""Where a fault record's copy of the bad call's ``facts`` starts (:class:`Faults`: a flag, the call's number and a
dense batch's samples per network come first)."""


@ti.func
def _rows(a: ti.template()):
    """The rows of a ``(B, n)`` array, or of a dense ``(K, B_k, n)`` one read as ``(K B_k, n)``."""
    n = a.shape[0]
    if ti.static(len(a.shape) == 3):
        n *= a.shape[1]
    return n


@ti.func
def _value(a: ti.template(), b, j):
    """Element ``j`` of row ``b`` of ``a`` (rows as :func:`_rows` counts them)."""
    v = 0.0
    if ti.static(len(a.shape) == 3):
        v = a[b // a.shape[1], b % a.shape[1], j]
    else:
        v = a[b, j]
    return v


@ti.func
def row_is_bad(a: ti.template(), b, positive: ti.template()) -> ti.i32:
    """1 if row ``b`` of ``a`` holds NaN or +-Inf (or, ``positive``, a value <= 0), else 0 (the kernels keep the
    least such row with an atomic min)."""
    bad = 0
    for j in range(a.shape[ti.static(len(a.shape) - 1)]):
        v = _value(a, b, j)
        if not (ti.abs(v) <= 3.4028234663852886e38):            # NaN and +-Inf fail the comparison
            bad = 1
        if ti.static(positive):
            if not (v > 0.0):
                bad = 1
    return bad


@ti.func
def record_bad_value(a: ti.template(), row, positive: ti.template(), values: ti.template(), slot):
    """``values[slot]``: the first bad value of row ``row`` of ``a`` (nothing if ``row`` is ``NONE``)."""
    if row != NONE:
        found = 0
        for j in range(a.shape[ti.static(len(a.shape) - 1)]):
            v = _value(a, row, j)
            bad = not (ti.abs(v) <= 3.4028234663852886e38)
            if ti.static(positive):
                bad = bad or not (v > 0.0)
            if bad and found == 0:
                values[slot] = v
                found = 1


@ti.func
def bad(facts: ti.template(), n_instances) -> ti.i32:
    """Whether a census's ``facts`` name anything wrong (a bad row in x, target or pdf; an id out of range)."""
    out = facts[X_ROW] != NONE or facts[TARGET_ROW] != NONE or facts[PDF_ROW] != NONE
    if facts[ID_LO] != NONE or facts[ID_HI] != -NONE - 1:           # a routed batch
        out = out or facts[ID_LO] < 0 or facts[ID_HI] >= n_instances
    return out


@ti.func
def record_fault(facts: ti.template(), values: ti.template(), n_instances, record: ti.template(),
                 recorded: ti.template(), call, per_network):
    """Write a bad batch's ``facts`` and ``values`` into a fault record (:class:`Faults`) as call number ``call``
    (``per_network``: a dense batch's samples per network, else 0), unless the record holds an earlier one."""
    if bad(facts, n_instances) and record[0] == 0:
        record[0], record[1], record[2] = 1, call, per_network
        for i in ti.static(range(N_FACTS)):
            record[RECORD_FACTS + i], recorded[i] = facts[i], values[i]


@ti.func
def place(ids: ti.template(), offsets: ti.template(), cursor: ti.template(), order: ti.template(), b):
    """Sample ``b`` takes the next place of its network k in the sorted order: ``order[first[k] + p] = b`` for
    the p-th sample of k to arrive (atomic counters ``cursor``; ``first = offsets[0]``); an id outside
    ``[0, K)`` takes none."""
    k = ids[b]
    if 0 <= k < cursor.shape[0]:
        order[offsets[0, k] + ti.atomic_add(cursor[k], 1)] = b


@ti.func
def tile_row(offsets: ti.template(), tiles: ti.template(), t):
    """Row t of the tile table: ``(start, end, k)`` in the sorted order, k found by bisecting
    ``first_tile = offsets[1]`` (network k's tiles are ``first_tile[k] .. first_tile[k + 1] - 1``;
    ``first = offsets[0]`` ends with the batch); ``(0, 0, 0)`` past the last tile."""
    K = offsets.shape[1] - 1
    start, end, network = 0, 0, 0
    if t < offsets[1, K]:
        lo, hi = 0, K                                  # offsets[1, lo] <= t < offsets[1, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if offsets[1, mid] <= t:
                lo = mid
            else:
                hi = mid
        start = offsets[0, lo] + (t - offsets[1, lo]) * TILE
        end, network = ti.min(start + TILE, offsets[0, lo + 1]), lo
    tiles[t, 0], tiles[t, 1], tiles[t, 2] = start, end, network


@ti.kernel
def _census_kernel(source: F32_ANY, dense: ti.template(), x: F32_2D, ids: I32_1D, routed: ti.template(),
                   sort: ti.template(), n_dims: ti.i32, target: F32_ANY, pdf: F32_ANY, checks: ti.template(),
                   facts: I32_1D, values: F32_1D, counts: I32_1D, mask: I32_1D, inv: F32_1D, safe: I32_1D,
                   offsets: I32_2D, cursor: I32_1D, totals: I32_2D, order: I32_1D, tiles: I32_2D,
                   step: ti.template(), settle: ti.template(), record: I32_1D, recorded: F32_1D, call: ti.i32):
    """The census of a batch ``x`` ``(B, n)`` with, if ``routed``, network ids ``ids`` ``(B,)`` of ``K`` networks
    (the module docstring); if ``dense``, ``x`` is first written from the dense ``source`` ``(K, B_k, n)`` (row
    ``k * B_k + b`` from ``source[k, b]``; else ``source`` is ``x``). The routed samples are sorted into tiles if
    ``sort``. ``checks``: 1 checks ``target`` too, 2 ``target`` and ``pdf`` (``(B, D)``, or dense ``(K, B_k, D)``).
    If ``step``, the step's mask and normalisers are written; if ``settle``, a bad batch is written into the fault
    record ``record`` / ``recorded`` (:class:`Faults`) as call number ``call``, unless the record holds an earlier
    one. Top-level loops run in order, each finished before the next starts."""
    B, K = x.shape[0], counts.shape[0]
    if ti.static(dense):
        for k, b, j in ti.ndrange(source.shape[0], source.shape[1], source.shape[2]):
            x[k * source.shape[1] + b, j] = source[k, b, j]
    counted = ti.static(routed and (sort or step))            # an unsorted inference needs no counts
    if ti.static(counted):
        for k in range(K):
            counts[k] = 0
            cursor[k] = 0
    for _ in range(1):
        for i in range(N_FACTS):
            facts[i] = NONE
        facts[ID_HI], facts[N_ACTIVE] = -NONE - 1, 0
    for b in range(B):
        if row_is_bad(x, b, False):
            ti.atomic_min(facts[X_ROW], b)
        if ti.static(routed):
            k = ids[b]
            ti.atomic_min(facts[ID_LO], k)
            ti.atomic_max(facts[ID_HI], k)
            inside = 0 <= k < K
            safe[b] = ti.select(inside, k, 0)
            if ti.static(counted):
                if inside:
                    ti.atomic_add(counts[k], 1)
    if ti.static(checks > 0):
        for b in range(_rows(target)):
            if row_is_bad(target, b, False):
                ti.atomic_min(facts[TARGET_ROW], b)
            if ti.static(checks > 1):
                if row_is_bad(pdf, b, True):
                    ti.atomic_min(facts[PDF_ROW], b)
    if ti.static(routed and sort):
        for c in range(totals.shape[0] - 1):               # prefix sums of samples and tiles within a task
            samples, n_tiles = 0, 0
            for k in range(c * SCAN, ti.min(c * SCAN + SCAN, K)):
                samples += counts[k]
                n_tiles += (counts[k] + TILE - 1) // TILE
                offsets[0, k + 1], offsets[1, k + 1] = samples, n_tiles
            totals[c + 1, 0], totals[c + 1, 1] = samples, n_tiles
        for _ in range(1):                                  # the tasks' totals, one after the other (a running
            samples, n_tiles = 0, 0                         # sum in registers: on Vulkan, a read of an entry
            totals[0, 0], totals[0, 1] = 0, 0               # just updated in place saw the old value)
            for c in range(1, totals.shape[0]):
                samples += totals[c, 0]
                n_tiles += totals[c, 1]
                totals[c, 0], totals[c, 1] = samples, n_tiles
        for k in range(K):
            c = k // SCAN
            offsets[0, k + 1] += totals[c, 0]
            offsets[1, k + 1] += totals[c, 1]
        offsets[0, 0], offsets[1, 0] = 0, 0
        for b in range(B):
            place(ids, offsets, cursor, order, b)
        for t in range(tiles.shape[0]):
            tile_row(offsets, tiles, t)
    for _ in range(1):
        record_bad_value(x, facts[X_ROW], False, values, X_ROW)
        if ti.static(checks > 0):
            record_bad_value(target, facts[TARGET_ROW], False, values, TARGET_ROW)
        if ti.static(checks > 1):
            record_bad_value(pdf, facts[PDF_ROW], True, values, PDF_ROW)
        if ti.static(settle):
            per_network = 0
            if ti.static(dense):
                per_network = source.shape[1]
            record_fault(facts, values, K, record, recorded, call, per_network)
    if ti.static(step):                                     # a step's mask and normalisers
        for k in range(K):
            count = B // K
            if ti.static(routed):
                count = counts[k]
            mask[k] = ti.select(not bad(facts, K) and count > 0, 1, 0)
            inv[k] = ti.select(count > 0, 1.0 / ti.cast(count * n_dims, ti.f32), 0.0)
            if count > 0:
                ti.atomic_add(facts[N_ACTIVE], 1)


def unused(shape: tuple, dtype=ti.i32):
    """A ``ti.ndarray`` of ``shape`` for an argument a kernel does not use (kept per program)."""
    return _buffers.kept(("unused", shape, dtype), lambda: _buffers.buffer(shape, dtype))


@dataclass(frozen=True, eq=False)
class Request:
    """What a device batch's census is asked to do (``Batch.of(..., census=Request(...))``).

    ``n_dims``: the target's width (the normaliser's ``D``); ``faults``: the record the census writes a bad call
    into (a trainer's, or an object's for its inferences; ``None``: none); ``reuse``: the arrays that only the
    step's own kernels read (mask, counts, ids, tiles, ...) are the ``faults``' own, kept from step to step (a
    training step's: the device runs its kernels in order, so the next step's census overwrites them after this
    step's kernels have read them); ``final``: an inference's census (no mask or normalisers, and no counts
    unless it sorts); ``sort``: whether the kernel sorts a routed batch into tiles now (else
    :attr:`Census.tiles` does, when asked)."""
    n_dims: int = 1
    faults: object = None
    reuse: bool = False
    final: bool = False
    sort: bool = True


class Census:
    """What :func:`_census_kernel` found in one step's batch ``x`` (module docstring), as ``request``
    (:class:`Request`) asked; every array stays on the device. ``x``: ``(B, n)``, or a dense ``(K, B_k, n)``
    batch, which the kernel flattens into ``self.x`` ``(K * B_k, n)`` (the batch the model reads). ``ids``: a
    routed batch's ``(B,)`` int32 device ids (``None``: one network; a dense batch's are ``k`` repeated ``B_k``
    times). ``target`` and ``pdf``: a training step's, checked too. ``facts`` and ``values`` are this census's own,
    for a loss read later (kept too for an inference, which no loss reads)."""

    def __init__(self, x, ids, n_instances: int, request: Request, target=None, pdf=None):
        n_dims, faults, reuse, final, sort = request.n_dims, request.faults, request.reuse, request.final, request.sort
        source, dense = x, len(x.shape) == 3
        if dense:                                   # flattened by the census kernel
            x = _buffers.buffer((x.shape[0] * x.shape[1], x.shape[2]))
        B, K = x.shape[0], n_instances
        routed = ids is not None
        self.batch, self.n_instances, self.routed, self.faults = B, K, routed, faults
        self.per_network = source.shape[1] if dense else 0       # (a bad row of a dense batch is named (k, b))

        def buffer(name, shape, dtype=ti.f32):
            return faults.kept(name, shape, dtype) if reuse and faults is not None else _buffers.buffer(shape, dtype)

        # an inference's census (final) is read by no loss later: its facts are scratch too
        self.facts = buffer("facts", (N_FACTS,), ti.i32) if final else _buffers.buffer((N_FACTS,), ti.i32)
        self.values = buffer("values", (N_FACTS,)) if final else _buffers.buffer((N_FACTS,))
        self.counts, self.mask, self.inv = buffer("counts", (K,), ti.i32), buffer("mask", (K,), ti.i32), buffer("inv", (K,))
        if routed:
            self.ids, self.order = buffer("ids", (B,), ti.i32), buffer("order", (B,), ti.i32)
            self._tiles = buffer("tiles", (-(-B // TILE) + min(K, B), 3), ti.i32)   # at most one part-tile per network
            self._offsets = buffer("offsets", (2, K + 1), ti.i32)
            sorting = (self._offsets, buffer("cursor", (K,), ti.i32),
                       buffer("totals", (-(-K // SCAN) + 1, 2), ti.i32), self.order, self._tiles)
        else:
            self.ids = self.order = self._tiles = self._offsets = None
            sorting = (unused((1, 1)), unused((1,)), unused((1, 1)), unused((1,)), unused((1, 3)))
        settle = faults is not None
        record = (faults.record, faults.values, faults.next_step()) if settle else (unused((1,)), unused((1,), ti.f32), 0)
        checks = 0 if target is None else 1 if pdf is None else 2
        targets = (unused((1, 1), ti.f32) if target is None else target, unused((1, 1), ti.f32) if pdf is None else pdf)
        self.x, self._args = x, (n_dims, *targets, checks, self.facts, self.values, self.counts, self.mask, self.inv,
                                 self.ids if routed else unused((1,)), *sorting)
        _census_kernel(source, dense, x, ids if routed else unused((1,)), routed, sort, *self._args, not final, settle,
                       *record)
        self._sorted = sort or not routed
        self._read = None

    @property
    def tiles(self):
        """A routed batch's tile table (see ``Routing.tiles``): sorted by this census's kernel, or (a census that
        did not sort) now, by its kernel run again over the ids it clamped (one launch, nothing read back)."""
        if not self._sorted:
            _census_kernel(self.x, False, self.x, self.ids, True, True, *self._args, False, False, unused((1,)),
                           unused((1,), ti.f32), 0)
            self._sorted = True
        return self._tiles

    @property
    def offsets(self):
        """A routed batch's ``(2, n_instances + 1)`` offsets (see ``Routing.runs``), sorted as :attr:`tiles` is."""
        self.tiles
        return self._offsets

    def read(self) -> tuple:
        """``(facts, values)`` read back once (a wait for the device)."""
        if self._read is None:
            self._read = (self.facts.to_numpy(), self.values.to_numpy())
        return self._read

    def check(self):
        """``ValueError`` naming what this census found wrong, if anything."""
        facts, values = self.read()
        raise_for(facts, values, self.n_instances, "", self.per_network)


def bad_value(name: str, positive: bool, row: int, per_network: int, value, when: str = "") -> ValueError:
    """The one message for a batch's first bad row ``row`` (of the flat batch; ``(k, b)`` for a dense one of
    ``per_network`` samples per network, else 0), whichever path found it; ``when``: the deferred call."""
    rule = "finite and > 0" if positive else "finite"
    where = divmod(row, per_network) if per_network else row
    return ValueError(f"{name} must be {rule}: row {where} holds {value}{when}")


def raise_for(facts: np.ndarray, values: np.ndarray, n_instances: int, when: str, per_network: int = 0):
    """The ``ValueError`` the host check would have raised for these ``facts`` (a census's, or a fault record's)."""
    for slot in (X_ROW, TARGET_ROW, PDF_ROW):
        if facts[slot] != NONE:
            raise bad_value(NAMES[slot], slot == PDF_ROW, int(facts[slot]), per_network, values[slot], when)
    lo, hi = int(facts[ID_LO]), int(facts[ID_HI])
    if (lo != NONE or hi != -NONE - 1) and (lo < 0 or hi >= n_instances):
        raise ValueError(f"instance ids must lie in [0, {n_instances}), got values in [{lo}, {hi}]{when}")


TRAINING_STEP = "training step {} of this trainer's device batches, whose update was skipped"
"""How a trainer's :class:`Faults` name the bad step in the ``ValueError``."""


class Faults:
    """A record of the first deferred call whose device batch was bad (a census found NaN or +-Inf, a ``pdf`` <= 0,
    or an id out of range), written by that call's census: a trainer's (a bad training step) or an object's (a bad
    inference); on the device, read by :meth:`settle`. ``step`` counts the deferred calls (each census is told its
    call's number); ``event`` names one in the ``ValueError`` (``{}``: its number)."""

    def __init__(self, event: str = TRAINING_STEP):
        self.record, self.values = _buffers.buffer((RECORD_FACTS + N_FACTS,), ti.i32), _buffers.buffer((N_FACTS,))
        self.step, self._settled, self.event = 0, 0, event
        self._kept = {}

    def kept(self, name: str, shape: tuple, dtype):
        """The trainer's buffer ``name`` of ``shape`` (a census's arrays that only its step's kernels read)."""
        key = (name, shape, dtype)
        if key not in self._kept:
            if len(self._kept) > 32:                    # batch shapes changed often: start afresh
                self._kept.clear()
            self._kept[key] = _buffers.buffer(shape, dtype)
        return self._kept[key]

    def next_step(self) -> int:
        self.step += 1
        return self.step

    def settle(self, n_instances: int):
        """``ValueError`` for the first bad call since the last settle, if any (a read-back only when deferred
        calls ran since then); the record is then cleared, so each fault is raised once here."""
        if self._settled == self.step:
            return
        self._settled = self.step
        record = self.record.to_numpy()
        if record[0]:
            values = self.values.to_numpy()
            self.record.fill(0)
            raise_for(record[RECORD_FACTS:], values, n_instances, f" (in {self.event.format(int(record[1]))})",
                      int(record[2]))
