"""A routed batch sorted by network on the host, for the MLP's batched products (``tinn.batch.routing``'s
``Routing.groups``).

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
import numpy as np
import taichi as ti

from ..runtime.types import F32_2D, I32_1D, I64_1D

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
    """A routed batch (its :class:`~tinn.batch.routing.Routing`) sorted by network into a zero-padded ``(R, S, n)``
    stack of row blocks."""

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
