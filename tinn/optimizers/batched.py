"""Batched (tcnn ``optimizers/batched.h``): average gradients over several calls, then step.

Keys: ``nested`` ({} -> Adam) and ``Batched.KEYS`` (``batch_size_multiplier`` N).

Every call adds ``grad / N`` to a float32 pool (the first call of each group of N
resets it); after every N-th call the nested optimizer steps once on the pool
(``loss_scale`` passed through). ``step_counts()`` counts calls (per instance); the
inference weights are the nested optimizer's.
State: ``current_step``, ``averaged_gradients`` plus ``nested.*`` (tcnn also keeps a
half-precision copy of the pool; tinn is float32 throughout).
"""
import numpy as np
import taichi as ti

from ..registry import optimizers
from ..keys import POSITIVE_INT, Key
from ..params import Buffer
from .optimizer import I32_1D, Slot
from .wrapper import Wrapper


@ti.kernel
def _accumulate(pool: ti.template(), po: ti.i32, G: ti.template(), go: ti.i32, n: ti.i32, active: I32_1D,
                first: I32_1D, multiplier: ti.i32):
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k]:
            if first[k]:
                pool[k, po + i] = 0.0
            pool[k, po + i] += G[k, go + i] / ti.cast(multiplier, ti.f32)


@optimizers.register("Batched")
class Batched(Wrapper):
    otype = "Batched"
    KEYS = {"batch_size_multiplier": Key(16, POSITIVE_INT, "calls whose gradients are averaged into one step")}
    STATE = ("averaged_gradients",)
    COUNTS_STEPS = True

    def nested_slot(self, slot):
        """The nested optimizer steps on the pool: a buffer made here, before the nested allocation."""
        if not self.n_params:
            return slot
        self.averaged_gradients = pool = Buffer(self.n_instances, self.n_params, "Batched gradient pool")
        return Slot(slot.store, slot.params, slot.p_off, pool.field, pool.offset, slot.n)

    def _advance(self, active, loss_scale, lr_scale):
        """Every call adds to the pool; the nested optimizer steps on every N-th call of an instance."""
        N = self.hparams["batch_size_multiplier"]
        if self.n_params:
            pool, s, first = self.averaged_gradients, self.slot, (self._steps % N == 0).astype(np.int32)
            _accumulate(pool.field, pool.offset, s.grads, s.g_off, s.n, active, first, N)
        self._steps += active
        fire = (active != 0) & (self._steps % N == 0)
        if fire.any():
            self.nested._advance(fire.astype(np.int32), loss_scale, lr_scale)
