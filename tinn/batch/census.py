"""The census of a training step's device batch: its values and its network ids, found on the device.

A training step of device batches must not wait for the device, so nothing about its batch is read
back while it runs. Instead one kernel (:func:`_census_kernel`, launched when the step's routing is
built) looks at the batch once and leaves its findings on the device for the kernels after it:

* ``x``'s first row holding NaN or +-Inf (``facts[X_ROW]``; ``NONE`` when there is none);
* for a routed batch, the ids' range, each network's sample count, the ids clamped into range (what
  the model's kernels read, so a bad id never indexes outside the parameters), the samples sorted by
  network and cut into tiles of at most ``TILE`` samples of one network (``Routing.tiles``), and each
  network's loss normaliser ``1 / (count * D)`` (``tinn.batch.loss_value.normaliser``);
* a training step's ``target`` and ``pdf`` rows holding NaN or +-Inf, or a ``pdf`` <= 0 (``facts[TARGET_ROW]``,
  ``facts[PDF_ROW]``);
* the step *mask*: 1 for a network that got samples, 0 for the others, and 0 for every network when
  anything in the batch is bad, so the optimizer leaves every parameter and all its state untouched.

For the first bad call of a trainer (or of an object's inferences) the census writes what was wrong into their
fault record (:class:`~tinn.batch.faults.Faults`), so the kernels after it (the model's, the loss's, the optimizer's)
only compute. How and when a bad batch is reported is ``tinn.batch.faults``' story: the ``ValueError`` comes when the
step's loss is read, or at the trainer's next call that reads from the device, whichever is first.

The kernel's jobs are ``ti.func`` functions, run in order (:func:`_census_kernel`), on named argument groups: what it does
(:data:`Jobs`, compile-time), a routed batch's arrays (:data:`Routed`), a step's (:data:`Step`) and the fault record
(``faults.Record``).

An inference's census writes no mask or normalisers, and sorts no tiles unless asked (the per-layer MLP kernels
read each sample's network directly; ``Census.tiles`` sorts on first use, with one more launch and no read-back).
"""

from collections import namedtuple
from dataclasses import dataclass

import taichi as ti

from ..runtime.types import F32_1D, F32_2D, F32_ANY, I32_1D, I32_2D
from . import buffers as _buffers
from .faults import ID_HI, ID_LO, N_ACTIVE, N_FACTS, NONE, PDF_ROW, TARGET_ROW, X_ROW, Record, bad, record_fault
from .loss_value import normaliser

TILE = 128
"""Samples per tile on the device path (a weight gradient is summed over a tile, then added once)."""

SCAN = 256
"""Networks per parallel task of the prefix sums over the networks (the serial pass runs over tasks)."""

Jobs = namedtuple("Jobs", "dense routed sort checks step settle")
"""What one launch of :func:`_census_kernel` does (compile-time): ``dense``, flatten a dense ``(K, B_k, n)`` batch;
``routed``, check, clamp (and with ``sort`` or ``step`` count) network ids; ``sort``, sort the routed samples into
tiles; ``checks``, 1 checks ``target`` too, 2 ``target`` and ``pdf``; ``step``, write the step's mask and
normalisers; ``settle``, write a bad batch into the fault record."""

Routed = ti.types.argpack(counts=I32_1D, safe=I32_1D, cursor=I32_1D, order=I32_1D, offsets=I32_2D, totals=I32_2D,
                          tiles=I32_2D)
"""A routed batch's arrays: ``counts`` ``(K,)``, the ids clamped into range ``safe`` ``(B,)``, and the sort's atomic
``cursor`` ``(K,)``, sorted ``order`` ``(B,)``, ``offsets`` ``(2, K + 1)`` (first sample, first tile of each network),
per-task ``totals`` and the ``tiles`` table ``(n_tiles, 3)`` (see ``Routing.tiles``)."""

Step = ti.types.argpack(mask=I32_1D, inv=F32_1D, n_dims=ti.i32)
"""A training step's ``mask`` ``(K,)`` and loss normalisers ``inv`` ``(K,)`` of ``n_dims`` target columns."""

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


# -- the census's jobs, in the order its kernel runs them (top-level loops run in order, each finished before the next)
@ti.func
def _flatten(source: ti.template(), x: ti.template()):
    """``x[k * B_k + b] = source[k, b]``: a dense ``(K, B_k, n)`` batch flattened network by network."""
    for k, b, j in ti.ndrange(source.shape[0], source.shape[1], source.shape[2]):
        x[k * source.shape[1] + b, j] = source[k, b, j]


@ti.func
def _start(jobs: ti.template(), facts: ti.template(), routed: ti.template()):
    """The findings before any sample is seen: no bad row, an empty id range, no counts."""
    if ti.static(jobs.routed and (jobs.sort or jobs.step)):          # an unsorted inference needs no counts
        for k in range(routed.counts.shape[0]):
            routed.counts[k] = 0
            routed.cursor[k] = 0
    for _ in range(1):
        for i in range(N_FACTS):
            facts[i] = NONE
        facts[ID_HI], facts[N_ACTIVE] = -NONE - 1, 0


@ti.func
def _check_samples(jobs: ti.template(), x: ti.template(), ids: ti.template(), facts: ti.template(),
                   routed: ti.template()):
    """The first bad row of ``x``; a routed batch's id range, its ids clamped into ``[0, K)`` (``safe``) and, where
    needed, each network's count."""
    for b in range(x.shape[0]):
        if row_is_bad(x, b, False):
            ti.atomic_min(facts[X_ROW], b)
        if ti.static(jobs.routed):
            k = ids[b]
            ti.atomic_min(facts[ID_LO], k)
            ti.atomic_max(facts[ID_HI], k)
            inside = 0 <= k < routed.counts.shape[0]
            routed.safe[b] = ti.select(inside, k, 0)
            if ti.static(jobs.sort or jobs.step):
                if inside:
                    ti.atomic_add(routed.counts[k], 1)


@ti.func
def _check_targets(jobs: ti.template(), target: ti.template(), pdf: ti.template(), facts: ti.template()):
    """The first bad row of a training step's ``target`` and ``pdf`` (``jobs.checks``: 1 ``target``, 2 both)."""
    if ti.static(jobs.checks > 0):
        for b in range(_rows(target)):
            if row_is_bad(target, b, False):
                ti.atomic_min(facts[TARGET_ROW], b)
            if ti.static(jobs.checks > 1):
                if row_is_bad(pdf, b, True):
                    ti.atomic_min(facts[PDF_ROW], b)


@ti.func
def _sort(counts: ti.template(), ids: ti.template(), cursor: ti.template(), order: ti.template(),
          offsets: ti.template(), totals: ti.template(), tiles: ti.template()):
    """The routed samples (network ids ``ids``, an id outside ``[0, K)`` placed nowhere) sorted by network into
    ``order`` and cut into ``tiles``: prefix sums of the ``counts`` (samples and tiles) within tasks of ``SCAN``
    networks, then over the tasks, then each sample's place."""
    K = counts.shape[0]
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
    for b in range(ids.shape[0]):
        place(ids, offsets, cursor, order, b)
    for t in range(tiles.shape[0]):
        tile_row(offsets, tiles, t)


@ti.func
def _record(jobs: ti.template(), source: ti.template(), x: ti.template(), target: ti.template(), pdf: ti.template(),
            facts: ti.template(), values: ti.template(), n_instances, record: ti.template(), call):
    """The first bad value of each bad row; with ``jobs.settle``, a bad batch written into the fault record."""
    for _ in range(1):
        record_bad_value(x, facts[X_ROW], False, values, X_ROW)
        if ti.static(jobs.checks > 0):
            record_bad_value(target, facts[TARGET_ROW], False, values, TARGET_ROW)
        if ti.static(jobs.checks > 1):
            record_bad_value(pdf, facts[PDF_ROW], True, values, PDF_ROW)
        if ti.static(jobs.settle):
            per_network = 0
            if ti.static(jobs.dense):
                per_network = source.shape[1]
            record_fault(facts, values, n_instances, record, call, per_network)


@ti.func
def _write_step(jobs: ti.template(), facts: ti.template(), routed: ti.template(), step: ti.template(), B):
    """A training step's mask (networks with samples, none if the batch was bad), normalisers and active count."""
    K = step.mask.shape[0]
    for k in range(K):
        count = B // K
        if ti.static(jobs.routed):
            count = routed.counts[k]
        step.mask[k] = ti.select(not bad(facts, K) and count > 0, 1, 0)
        step.inv[k] = normaliser(count, step.n_dims)
        if count > 0:
            ti.atomic_add(facts[N_ACTIVE], 1)


@ti.kernel
def _census_kernel(jobs: ti.template(), source: F32_ANY, x: F32_2D, ids: I32_1D, target: F32_ANY, pdf: F32_ANY,
                   facts: I32_1D, values: F32_1D, routed: Routed, step: Step, record: Record, call: ti.i32):
    """The census of a batch ``x`` ``(B, n)`` (written first from the dense ``source`` ``(K, B_k, n)`` if
    ``jobs.dense``; else ``source`` is ``x``) with, if ``jobs.routed``, network ids ``ids`` ``(B,)`` of ``K``
    networks, as :data:`Jobs` says (the module docstring): its findings go to ``facts`` and ``values``, a routed
    batch's arrays to ``routed``, a step's to ``step``, a bad call to the fault ``record`` as call number ``call``.
    ``target`` and ``pdf``: ``(B, D)``, or dense ``(K, B_k, D)``."""
    if ti.static(jobs.dense):
        _flatten(source, x)
    _start(jobs, facts, routed)
    _check_samples(jobs, x, ids, facts, routed)
    _check_targets(jobs, target, pdf, facts)
    if ti.static(jobs.routed and jobs.sort):
        _sort(routed.counts, ids, routed.cursor, routed.order, routed.offsets, routed.totals, routed.tiles)
    n_instances = 1
    if ti.static(jobs.routed):
        n_instances = routed.counts.shape[0]
    _record(jobs, source, x, target, pdf, facts, values, n_instances, record, call)
    if ti.static(jobs.step):
        _write_step(jobs, facts, routed, step, x.shape[0])


def unused(shape: tuple, dtype=ti.i32):
    """A ``ti.ndarray`` of ``shape`` for an argument a kernel does not use (kept per program)."""
    return _buffers.kept(("unused", shape, dtype), lambda: _buffers.buffer(shape, dtype))


def _absent(kind):
    """The argument pack ``kind`` of a job a launch does not run (one-element arrays, never read; kept per program)."""
    def make():
        return kind(**{name: 1 if dtype is ti.i32 else unused((1,) * dtype.ndim, dtype.dtype)
                       for name, dtype in kind.members.items()})
    return _buffers.kept(("absent", kind), make)


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


class _Arrays:
    """A census's arrays that only its call's kernels read, with their argument packs (:data:`Routed`, :data:`Step`;
    an absent job's are :func:`_absent`): kept by a trainer (or an object, for its inferences) from call to call.
    An inference's census (``final``) is read by no loss later: its ``facts`` and ``values`` are scratch too."""

    def __init__(self, B: int, K: int, routed: bool, final: bool, n_dims: int):
        i32 = ti.i32
        self.facts = self.values = None                 # (an inference's: its census's scratch)
        if final:
            self.facts, self.values = _buffers.buffer((N_FACTS,), i32), _buffers.buffer((N_FACTS,))
        self.ids = self.order = self.tiles = self.offsets = self.counts = self.mask = self.inv = None
        self.routed, self.step = _absent(Routed), _absent(Step)
        if routed:
            self.counts, self.ids, self.order = _buffers.buffer((K,), i32), _buffers.buffer((B,), i32), \
                _buffers.buffer((B,), i32)
            self.tiles = _buffers.buffer((-(-B // TILE) + min(K, B), 3), i32)   # at most one part-tile per network
            self.offsets = _buffers.buffer((2, K + 1), i32)
            self.routed = Routed(counts=self.counts, safe=self.ids, cursor=_buffers.buffer((K,), i32), order=self.order,
                                 offsets=self.offsets, tiles=self.tiles,
                                 totals=_buffers.buffer((-(-K // SCAN) + 1, 2), i32))
        if not final:
            self.mask, self.inv = _buffers.buffer((K,), i32), _buffers.buffer((K,))
            self.step = Step(mask=self.mask, inv=self.inv, n_dims=n_dims)


class Census:
    """What :func:`_census_kernel` found in one step's batch ``x`` (module docstring), as ``request``
    (:class:`Request`) asked; every array stays on the device. ``x``: ``(B, n)``, or a dense ``(K, B_k, n)``
    batch, which the kernel flattens into ``self.x`` ``(K * B_k, n)`` (the batch the model reads). ``ids``: a
    routed batch's ``(B,)`` int32 device ids (``None``: one network; a dense batch's are ``k`` repeated ``B_k``
    times). ``target`` and ``pdf``: a training step's, checked too. ``facts`` and ``values`` are this census's own,
    for a loss read later (kept too for an inference, which no loss reads)."""

    def __init__(self, x, ids, n_instances: int, request: Request, target=None, pdf=None):
        faults, reuse, final, sort = request.faults, request.reuse, request.final, request.sort
        source, dense = x, len(x.shape) == 3
        if dense:                                   # flattened by the census kernel
            x = _buffers.buffer((x.shape[0] * x.shape[1], x.shape[2]))
        B, K = x.shape[0], n_instances
        routed = ids is not None
        self.batch, self.n_instances, self.routed, self.faults = B, K, routed, faults
        self.per_network = source.shape[1] if dense else 0       # (a bad row of a dense batch is named (k, b))

        key = (B, K, routed, final, request.n_dims)
        kept = faults.kept(key, lambda: _Arrays(*key)) if reuse and faults is not None else _Arrays(*key)
        self.facts, self.values = (kept.facts, kept.values) if final else \
            (_buffers.buffer((N_FACTS,), ti.i32), _buffers.buffer((N_FACTS,)))
        self.ids, self.order, self._tiles, self._offsets, self.counts = kept.ids, kept.order, kept.tiles, \
            kept.offsets, kept.counts
        self.mask, self.inv, self._routed = kept.mask, kept.inv, kept.routed
        record, call = (faults.pack, faults.next_step()) if faults is not None else (_absent(Record), 0)
        checks = 0 if target is None else 1 if pdf is None else 2
        jobs = Jobs(dense, routed, sort, checks, not final, faults is not None)
        self.x = x
        _census_kernel(jobs, source, x, ids if routed else unused((1,)), source if target is None else target,
                       source if pdf is None else pdf, self.facts, self.values, self._routed, kept.step, record, call)
        self._sorted = sort or not routed
        self._read = None

    @property
    def tiles(self):
        """A routed batch's tile table (see ``Routing.tiles``): sorted by this census's kernel, or (a census that
        did not sort) now, by its kernel run again over the ids it clamped (one launch, nothing read back)."""
        if not self._sorted:
            jobs = Jobs(dense=False, routed=True, sort=True, checks=0, step=False, settle=False)
            _census_kernel(jobs, self.x, self.x, self.ids, self.x, self.x, self.facts, self.values, self._routed,
                           _absent(Step), _absent(Record), 0)
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
