"""Network arrays: how a batch is spread over the networks of an array.

``Routing`` describes one batch, once: built when the batch enters a model
(``DifferentiableObject.forward`` / ``inference``), carried in the forward context, and
read by every component, the loss (per-network normalisation), the backward pass (which
networks' gradients a batch overwrites) and the optimizer (which networks step). A batch
is one of three kinds: for a single network (no ids), *routed* (a ``(B,)`` int32
``instance`` id per sample, in any order) or *dense* (``(K, B_k, dims)``: network k owns
the k-th run of ``B_k`` samples).

``Groups`` is a counting sort of the per-sample ``instance`` ids. It gathers a
``(batch, n)`` array into a zero-padded ``(R, S, n)`` stack of row blocks, so a
network's weights are read once per block and batched GEMMs handle all networks at
once. Usually each network that received samples gets one block (R = G networks,
S = the largest count). When counts are so uneven that padding every network to the
largest would waste much of the stack, a network's samples are cut into several
blocks of S rows each (S chosen to minimise padded rows plus a fixed cost per block),
so the stack stays within a small multiple of the batch whatever the routing.
Padding rows are zero and contribute nothing to weight gradients. The sort itself and the
row copies are small Taichi kernels (a serial pass of counters; parallel copies), several
times faster than numpy's stable argsort and fancy indexing.
"""

import functools

import numpy as np
import taichi as ti

from ._kernels import F32_2D, I32_1D, I64_1D
from ._runtime import as_instances


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


class Routing:
    """The networks a batch of ``batch`` samples reaches, built once per batch.

    ``instance``: the ``(batch,)`` int32 network id of every sample, or ``None`` for a
    single network; ``dense``: ``(K, B_k)`` when the batch came as ``(K, B_k, dims)``
    (then ``instance`` is ``k`` repeated ``B_k`` times). The derived facts are computed on
    first use and kept: ``counts`` (samples per network), ``active`` (the networks that got
    samples, ``None`` for all of them) and ``groups`` (the batch sorted by network).

    ``whole`` is the batch this one is a chunk of (itself if none): a large batch is processed
    in chunks, and the loss normalises every chunk's samples by the whole batch's counts.
    """

    def __init__(self, batch: int, n_instances: int = 1, instance: np.ndarray | None = None, dense=None,
                 whole: "Routing | None" = None):
        self.batch, self.n_instances, self.instance, self.dense = batch, n_instances, instance, dense
        self._whole = whole

    @property
    def whole(self) -> "Routing":
        """The batch this one is a chunk of, or itself (kept as ``None``: no reference cycle)."""
        return self if self._whole is None else self._whole

    @classmethod
    def of(cls, x: np.ndarray, instance, n_instances: int) -> tuple[np.ndarray, "Routing"]:
        """A checked batch ``x`` as ``(batch, dims)`` and its routing: ``instance`` ids (checked here), or
        none for a dense ``(n_instances, B_k, dims)`` batch, which is flattened network by network."""
        if len(x.shape) == 2:                   # a numpy array or a ti.ndarray
            return x, cls(x.shape[0], n_instances, as_instances(instance, x.shape[0], n_instances))
        if x.shape[0] != n_instances:
            raise ValueError(f"a dense batch needs shape ({n_instances}, batch, {x.shape[-1]}), got {x.shape}")
        k, b = x.shape[:2]
        ids = np.repeat(np.arange(k, dtype=np.int32), b)
        return x.reshape(k * b, -1), cls(k * b, k, ids, (k, b))

    def chunk(self, lo: int, hi: int) -> "Routing":
        """Samples ``lo:hi`` of this batch, as a routed batch of their own that is part of this one."""
        return Routing(hi - lo, self.n_instances, None if self.instance is None else self.instance[lo:hi],
                       whole=self)

    @property
    def routed(self) -> bool:
        """Whether samples carry network ids (a network array's batch)."""
        return self.instance is not None

    @functools.cached_property
    def counts(self) -> np.ndarray:
        """Samples per network, ``(n_instances,)`` int64."""
        if self.instance is None:
            return np.array([self.batch], np.int64)
        if self.dense is not None:
            return np.full(self.n_instances, self.dense[1], np.int64)
        return np.bincount(self.instance, minlength=self.n_instances)

    @functools.cached_property
    def active(self) -> np.ndarray | None:
        """Ids (int32) of the networks that got samples; ``None`` when every network did."""
        if self.dense is not None or self.n_instances == 1 or self.counts.all():
            return None
        return np.flatnonzero(self.counts).astype(np.int32)

    @functools.cached_property
    def groups(self) -> "Groups":
        """The batch grouped by network (for the MLP's batched products)."""
        return Groups(self)


class Groups:
    """A routed batch sorted by network into a zero-padded ``(R, S, n)`` stack of row blocks."""

    def __init__(self, routing: Routing):
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
