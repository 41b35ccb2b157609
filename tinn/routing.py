"""Network arrays: grouping a routed batch by the network each sample belongs to.

``Groups`` is a counting sort of the per-sample ``instance`` ids. It gathers a
``(batch, n)`` array into a zero-padded ``(R, S, n)`` stack of row blocks, so a
network's weights are read once per block and batched GEMMs handle all networks at
once. Usually each network that received samples gets one block (R = G networks,
S = the largest count). When counts are so uneven that padding every network to the
largest would waste much of the stack, a network's samples are cut into several
blocks of S rows each (S chosen to minimise padded rows plus a fixed cost per block),
so the stack stays within a small multiple of the batch whatever the routing.
Padding rows are zero and contribute nothing to weight gradients.
"""
from __future__ import annotations

import numpy as np

BLOCK_COST = 32
"""The fixed cost of one more row block (a product call per layer, a copy of its weights), counted in
sample rows, when choosing the block size for uneven counts."""


def _block_size(counts: np.ndarray) -> int:
    """The rows per block that minimise ``padded rows + BLOCK_COST * blocks`` over the largest count
    and the powers of two below it."""
    largest = int(counts.max())
    candidates = [largest] + [1 << e for e in range(largest.bit_length()) if (1 << e) < largest]
    costs = [int(((counts + c - 1) // c).sum()) * (c + BLOCK_COST) for c in candidates]
    return candidates[int(np.argmin(costs))]


class Groups:
    def __init__(self, instance: np.ndarray | None, n_instances: int, batch: int):
        self.batch = batch
        self.row_group = None                      # group of each row block; None: one block per group
        if instance is None:                       # one network, samples in order
            self.active = np.zeros(1, np.int32)
            self.size = batch
            self._slots = None
            return
        counts = np.bincount(instance, minlength=n_instances)
        self.active = np.flatnonzero(counts).astype(np.int32)
        counts = counts[self.active]
        self.size = _block_size(counts)
        if self.size == counts.max() and batch == len(self.active) * self.size and np.all(instance[:-1] <= instance[1:]):
            self._slots = None                     # already grouped, equal counts: a reshape suffices
            return
        blocks = (counts + self.size - 1) // self.size
        first_block = np.cumsum(blocks) - blocks
        if self.size < counts.max():
            self.row_group = np.repeat(np.arange(len(self.active)), blocks)
            self.first_row = first_block
        group_of = np.zeros(n_instances, np.int64)
        group_of[self.active] = np.arange(len(self.active))
        order = np.argsort(instance, kind="stable")
        starts = np.zeros(n_instances, np.int64)
        starts[self.active] = np.cumsum(counts) - counts
        sorted_ids = instance[order]
        position = np.arange(batch) - starts[sorted_ids]          # rank of the sample within its network
        row = first_block[group_of[sorted_ids]] + position // self.size
        self._slots = np.empty(batch, np.int64)
        self._slots[order] = row * self.size + position % self.size   # slot of sample b in the flat stack

    @property
    def n_groups(self) -> int:
        """Networks that received samples."""
        return len(self.active)

    @property
    def n_rows(self) -> int:
        """Row blocks of the stack."""
        return self.n_groups if self.row_group is None else len(self.row_group)

    def gather(self, a: np.ndarray) -> np.ndarray:
        """``(batch, n)`` -> ``(R, S, n)``, zero-padded."""
        if self._slots is None:
            return a.reshape(self.n_rows, self.size, -1)
        out = np.zeros((self.n_rows * self.size, a.shape[1]), a.dtype)
        out[self._slots] = a
        return out.reshape(self.n_rows, self.size, -1)

    def scatter(self, a: np.ndarray) -> np.ndarray:
        """``(R, S, n)`` -> ``(batch, n)`` in the original sample order."""
        flat = a.reshape(-1, a.shape[-1])
        return flat if self._slots is None else flat[self._slots]

    def per_row(self, a: np.ndarray) -> np.ndarray:
        """Per-group values ``(G, ...)`` -> one per row block ``(R, ...)``."""
        return a if self.row_group is None else a[self.row_group]

    def sum_rows(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Per-row-block values -> summed per group along ``axis``."""
        return a if self.row_group is None else np.add.reduceat(a, self.first_row, axis=axis)
