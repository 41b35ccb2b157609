"""Network arrays: how a batch is spread over the networks of an array.

``Routing`` holds the facts of one batch's ids, once: built with the call's
:class:`~tinn.batch.batch.Batch` (``batch.routing``), carried in the forward context, and
read by the components (which network each sample's parameters are), the loss (per-network
normalisation), the backward pass (which networks' gradients a batch overwrites) and the
optimizer (which networks step). A batch
is one of three kinds: for a single network (no ids), *routed* (a ``(B,)`` int32
``instance`` id per sample, in any order) or *dense* (``(K, B_k, dims)``: network k owns
the k-th run of ``B_k`` samples; a dense ``ti.ndarray`` is flattened by a copy on the device).

The host path sorts a routed batch by network into row blocks for the MLP's batched products
(:class:`Groups`, made on first use: ``routing.groups``).

On the device path (``tinn.runtime.program``) a routed batch stays on the device: ``Routing.ids`` are the
ids as an int32 ``ti.ndarray`` (the caller's own, or uploaded once), ``counts`` are counted there
(``n_instances`` integers read back: the optimizer steps only networks that got samples), and
``Routing.tiles`` sorts the samples by network into *tiles* of at most ``TILE`` samples of one
network each, by kernels over the ids; the MLP reduces weight gradients and the loss sums
per-network losses one tile at a time. Within a network the order of the samples is that of the
device's atomic counters, so sums over them are not bit-identical run to run there (the device
path's gradient adds are atomic anyway).
"""

import functools

import numpy as np
import taichi as ti

from ..runtime.types import F32_2D, I32_1D, I32_2D, I64_1D
from . import buffers as _buffers
from .census import TILE, Census, place, tile_row
from .ops import DEVICE

# -- the host path: a routed batch in row blocks per network ---------------------------------------------
BLOCK_COST = 32
"""The fixed cost of one more row block (a product call per layer, a copy of its weights), counted in
sample rows, when choosing the block size for uneven counts."""


@ti.kernel
def _count_slots(instance: I32_1D, first_row: I64_1D, seen: I64_1D,
                 size: ti.i64, slots: I64_1D):
    """Sample b is its network's ``p``-th (in batch order): row ``first_row + p // size``, place ``p % size``."""
    ti.loop_config(serialize=True)
    for b in range(instance.shape[0]):
        k = instance[b]
        p = seen[k]
        seen[k] = p + 1
        slots[b] = (first_row[k] + p // size) * size + p % size


@ti.kernel
def _copy_rows(source: F32_2D, slots: I64_1D, target: F32_2D, into_stack: ti.template()):
    """Row b of the batch to row ``slots[b]`` of the flat stack (``into_stack``), or back. Into the stack,
    every element of ``target`` is written (the padding zeroed first): Taichi's Vulkan runtime does not
    upload a numpy argument that a kernel only writes, but copies all of it back."""
    if ti.static(into_stack):
        for s, j in ti.ndrange(target.shape[0], target.shape[1]):
            target[s, j] = 0.0
    for b in range(slots.shape[0]):
        s = slots[b]
        for j in range(source.shape[1]):
            if ti.static(into_stack):
                target[s, j] = source[b, j]
            else:
                target[b, j] = source[s, j]


def _block_size(counts: np.ndarray) -> int:
    """The rows per block that minimise ``padded rows + BLOCK_COST * blocks`` over the largest count
    and the powers of two below it."""
    largest = int(counts.max())
    candidates = [largest] + [1 << e for e in range(largest.bit_length()) if (1 << e) < largest]
    costs = [int(((counts + c - 1) // c).sum()) * (c + BLOCK_COST) for c in candidates]
    return candidates[int(np.argmin(costs))]


class Groups:
    """A routed batch (its :class:`Routing`) sorted by network on the host into a zero-padded ``(R, S, n)`` stack
    of row blocks, for the MLP's batched products (``Routing.groups``).

    A counting sort of the per-sample ``instance`` ids gathers a ``(batch, n)`` array into the stack, so a
    network's weights are read once per block and batched GEMMs handle all networks at once. Usually each
    network that received samples gets one block (R = G networks, S = the largest count). When counts are so
    uneven that padding every network to the largest would waste much of the stack, a network's samples are cut
    into several blocks of S rows each (S chosen to minimise padded rows plus a fixed cost per block), so the
    stack stays within a small multiple of the batch whatever the routing. Padding rows are zero and contribute
    nothing to weight gradients. The sort itself and the row copies are small Taichi kernels (a serial pass of
    counters; parallel copies), several times faster than numpy's stable argsort and fancy indexing."""

    def __init__(self, routing):
        self.batch = batch = routing.batch
        self.row_group = None                      # group of each row block; None: one block per group
        self.first_row = None                      # first row block of each group, when cut into several
        instance = routing.instance
        if instance is None:                       # one network, samples in order
            self.active = np.zeros(1, np.int32)
            self.size = batch
            self._slots = None
            return
        counts = routing.counts
        self.active = np.flatnonzero(counts).astype(np.int32)
        counts = counts[self.active]
        self.size = _block_size(counts)
        equal = self.size == counts.max() and batch == len(self.active) * self.size
        if equal and (routing.dense is not None or np.all(instance[:-1] <= instance[1:])):
            self._slots = None                     # already grouped, equal counts: a reshape suffices
            return
        blocks = (counts + self.size - 1) // self.size
        first_block = np.cumsum(blocks) - blocks
        if self.size < counts.max():
            self.row_group = np.repeat(np.arange(len(self.active)), blocks)
            self.first_row = first_block
        network_row = np.zeros(routing.n_instances, np.int64)
        network_row[self.active] = first_block
        self._slots = np.empty(batch, np.int64)                     # slot of sample b in the flat stack
        _count_slots(np.ascontiguousarray(instance), network_row, np.zeros(routing.n_instances, np.int64),
                     self.size, self._slots)

    @property
    def n_groups(self) -> int:
        """Networks that received samples."""
        return len(self.active)

    @property
    def n_rows(self) -> int:
        """Row blocks of the stack."""
        return self.n_groups if self.row_group is None else len(self.row_group)

    def gather(self, a: np.ndarray) -> np.ndarray:
        """``(batch, n)`` float32 -> ``(R, S, n)``, zero-padded."""
        if self._slots is None:
            return a.reshape(self.n_rows, self.size, -1)
        out = np.empty((self.n_rows * self.size, a.shape[1]), np.float32)
        _copy_rows(np.ascontiguousarray(a, np.float32), self._slots, out, True)
        return out.reshape(self.n_rows, self.size, -1)

    def scatter(self, a: np.ndarray) -> np.ndarray:
        """``(R, S, n)`` -> ``(batch, n)`` in the original sample order."""
        flat = a.reshape(-1, a.shape[-1])
        if self._slots is None:
            return flat
        out = np.empty((self.batch, flat.shape[1]), np.float32)
        _copy_rows(np.ascontiguousarray(flat, np.float32), self._slots, out, False)
        return out

    def per_row(self, a: np.ndarray) -> np.ndarray:
        """Per-group values ``(G, ...)`` -> one per row block ``(R, ...)``."""
        return a if self.row_group is None else a[self.row_group]

    def sum_rows(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Per-row-block values -> summed per group along ``axis``."""
        return a if self.row_group is None else np.add.reduceat(a, self.first_row, axis=axis)


# -- the device path: ids counted and sorted into tiles by kernels ---------------------------------------
@ti.kernel
def _id_census(ids: I32_1D, out: I32_1D):
    """``out[:K]`` the samples of each network (ids in [0, K) only), ``out[K]`` and ``out[K + 1]`` the smallest
    and largest id, for ``K = out.shape[0] - 2`` (``out`` zero-filled)."""
    K = out.shape[0] - 2
    out[K], out[K + 1] = 2 ** 31 - 1, -2 ** 31
    for b in range(ids.shape[0]):
        k = ids[b]
        ti.atomic_min(out[K], k)
        ti.atomic_max(out[K + 1], k)
        if 0 <= k < K:
            ti.atomic_add(out[k], 1)


@ti.kernel
def _sort_ids(ids: I32_1D, offsets: I32_2D, cursor: I32_1D, order: I32_1D, tiles: I32_2D):
    """The samples sorted by network (``order``) and cut into tiles (``tiles``), as the census's kernel does it."""
    for b in range(ids.shape[0]):
        place(ids, offsets, cursor, order, b)
    for t in range(tiles.shape[0]):
        tile_row(offsets, tiles, t)


def check_id_range(lo: int, hi: int, n_instances: int):
    """The rule for network ids: every id lies in ``[0, n_instances)``, given their least ``lo`` and
    greatest ``hi`` (however they were found: on the host, or by a census on the device)."""
    if lo < 0 or hi >= n_instances:
        raise ValueError(f"instance ids must lie in [0, {n_instances}), got values in [{lo}, {hi}]")


def device_ids(instance, n_instances: int | None):
    """A device batch's ``(batch,)`` int32 ``ti.ndarray`` of ids (its kind, dtype and shape checked,
    :func:`~tinn.batch.batch.check_device_ids`): their range checked on the device together with the samples of
    each network (one read-back of ``n_instances + 2`` integers); ``n_instances=None`` takes the largest id + 1
    (the range is read first). Returns ``(ids, n_instances, counts)``, ``counts`` ``(n_instances,)`` int64."""
    if n_instances is None:                     # a census of no networks: the range alone
        span = _buffers.buffer((2,), ti.i32)
        _id_census(instance, span)
        n_instances = max(int(span.to_numpy()[1]) + 1, 1)
    census = _buffers.buffer((n_instances + 2,), ti.i32)
    _id_census(instance, census)
    census = census.to_numpy().astype(np.int64)
    check_id_range(int(census[-2]), int(census[-1]), n_instances)
    return instance, n_instances, census[:-2]


class Routing:
    """How a batch of ``batch`` samples reaches the networks of an array: facts about its ids, built once per batch.

    ``instance``: the ``(batch,)`` int32 network id of every sample (numpy, or on the device path
    a ``ti.ndarray``), or ``None`` for a single network; ``dense``: ``(K, B_k)`` when the batch came as ``(K, B_k, dims)``
    (then ``instance`` is ``k`` repeated ``B_k`` times). The derived facts are computed on
    first use and kept: ``counts`` (samples per network), ``active`` (the networks that got
    samples, ``None`` for all of them), ``tiles`` (the samples sorted by network into tiles, on the device) and
    ``groups`` (the batch sorted by network, on the host).

    ``whole`` is the batch this one is a chunk of (itself if none): a large batch is processed
    in chunks, and the loss normalises every chunk's samples by the whole batch's counts.

    ``described``: the :class:`~tinn.batch.census.Census` that found these facts on the device (a training step's
    or an inference's device batch): ``instance`` is then its ids clamped into range, and its counts and tiles
    are the census's arrays.
    """

    def __init__(self, batch: int, n_instances: int = 1, instance=None, dense=None,
                 whole: "Routing | None" = None, counts: np.ndarray | None = None, described: Census | None = None):
        self.batch, self.n_instances, self.instance, self.dense = batch, n_instances, instance, dense
        self.routed = instance is not None      # whether samples carry network ids (a network array's batch)
        self._whole, self._census = whole, described
        if counts is not None:                  # found with the ids' range (device ids)
            self.counts = counts
        if described is not None:               # the census's device ids (clamped), as they are
            self.ids = instance

    @property
    def whole(self) -> "Routing":
        """The batch this one is a chunk of, or itself (kept as ``None``: no reference cycle)."""
        return self if self._whole is None else self._whole

    def chunk(self, lo: int, hi: int) -> "Routing":
        """Samples ``lo:hi`` of this batch, as a routed batch of their own that is part of this one."""
        return Routing(hi - lo, self.n_instances, None if self.instance is None else self.instance[lo:hi],
                       whole=self)

    @functools.cached_property
    def counts(self) -> np.ndarray:
        """Samples per network, ``(n_instances,)`` int64."""
        if self.instance is None:
            return np.array([self.batch], np.int64)
        if self.dense is not None:
            return np.full(self.n_instances, self.dense[1], np.int64)
        if self._census is not None:                    # read back (a wait for the device)
            return self._census.counts.to_numpy().astype(np.int64)
        if isinstance(self.instance, np.ndarray):
            return np.bincount(self.instance, minlength=self.n_instances)
        return device_ids(self.instance, self.n_instances)[2]    # the caller's device ids, checked

    @functools.cached_property
    def active(self) -> np.ndarray | None:
        """Ids (int32) of the networks that got samples; ``None`` when every network did."""
        if self.dense is not None or self.n_instances == 1 or self.counts.all():
            return None
        return np.flatnonzero(self.counts).astype(np.int32)

    @functools.cached_property
    def ids(self):
        """The ids as an int32 ``ti.ndarray`` (the device path): the caller's own, a dense batch's (made on the
        device once per shape), or uploaded once."""
        return DEVICE.put_ids(self.instance)

    @property
    def tiles(self) -> tuple:
        """``(table, order)`` on the device: ``order`` ``(batch,)`` the samples sorted by network, ``table``
        ``(n_tiles, 3)`` int32 rows ``(start, end, k)``: samples ``order[start:end]`` of network k, at most
        ``TILE`` of them (a network's tiles are consecutive). A census's tiles were made by its kernel (the
        table then ends in empty tiles ``(0, 0, 0)``)."""
        table, order, _ = self._sorted
        return table, order

    @property
    def runs(self) -> tuple:
        """``(order, offsets)`` on the device: the samples sorted by network and ``offsets`` ``(2, n_instances + 1)``
        int32, ``offsets[0, k]`` network k's first sorted position (``offsets[0, K]`` the batch), ``offsets[1, k]``
        its first tile of :attr:`tiles`."""
        _, order, offsets = self._sorted
        return order, offsets

    @functools.cached_property
    def _sorted(self) -> tuple:
        """``(table, order, offsets)``: built from the ids by kernels; the per-network offsets of samples and of
        tiles (``2 (n_instances + 1)`` integers) are uploaded at once."""
        if self._census is not None:
            return self._census.tiles, self._census.order, self._census.offsets
        counts = self.counts
        per = -(-counts // TILE)
        offsets = np.zeros((2, self.n_instances + 1), np.int32)     # first sample, first tile of each network
        offsets[0, 1:], offsets[1, 1:] = np.cumsum(counts), np.cumsum(per)
        offsets_d = _buffers.put(offsets, ti.i32)
        cursor = _buffers.buffer((self.n_instances,), ti.i32)
        order = _buffers.buffer((self.batch,), ti.i32)
        table = _buffers.buffer((int(offsets[1, -1]), 3), ti.i32)
        _sort_ids(self.ids, offsets_d, cursor, order, table)
        return table, order, offsets_d

    @functools.cached_property
    def groups(self) -> "Groups":
        """The batch grouped by network (for the host MLP's batched products)."""
        return Groups(self)
