"""Network arrays: grouping a routed batch by the network each sample belongs to.

``Groups`` is a counting sort of the per-sample ``instance`` ids. It gathers a
``(batch, n)`` array into a zero-padded ``(G, S, n)`` stack, one row block per
network that received samples (G of them, S = the largest count), so a network's
weights are read once per group and batched GEMMs handle all networks at once.
Padding rows are zero and contribute nothing to weight gradients.
"""
from __future__ import annotations

import numpy as np


class Groups:
    def __init__(self, instance: np.ndarray | None, n_instances: int, batch: int):
        self.batch = batch
        if instance is None:                       # one network, samples in order
            self.active = np.zeros(1, np.int32)
            self.size = batch
            self._slots = None
            return
        counts = np.bincount(instance, minlength=n_instances)
        self.active = np.flatnonzero(counts).astype(np.int32)
        self.size = int(counts.max())
        if batch == len(self.active) * self.size and np.all(instance[:-1] <= instance[1:]):
            self._slots = None                     # already grouped, equal counts: a reshape suffices
            return
        group_of = np.zeros(n_instances, np.int64)
        group_of[self.active] = np.arange(len(self.active))
        order = np.argsort(instance, kind="stable")
        starts = np.cumsum(counts) - counts
        sorted_ids = instance[order]
        slot = group_of[sorted_ids] * self.size + (np.arange(batch) - starts[sorted_ids])
        self._slots = np.empty(batch, np.int64)
        self._slots[order] = slot                  # slot of sample b in the flattened (G*S) stack

    @property
    def n_groups(self) -> int:
        return len(self.active)

    def gather(self, a: np.ndarray) -> np.ndarray:
        """``(batch, n)`` -> ``(G, S, n)``, zero-padded."""
        if self._slots is None:
            return a.reshape(self.n_groups, self.size, -1)
        out = np.zeros((self.n_groups * self.size, a.shape[1]), a.dtype)
        out[self._slots] = a
        return out.reshape(self.n_groups, self.size, -1)

    def scatter(self, a: np.ndarray) -> np.ndarray:
        """``(G, S, n)`` -> ``(batch, n)`` in the original sample order."""
        flat = a.reshape(-1, a.shape[-1])
        return flat if self._slots is None else flat[self._slots]
