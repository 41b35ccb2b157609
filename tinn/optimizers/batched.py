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
from .optimizer import I32_1D, Slot
from .wrapper import Wrapper


@optimizers.register("Batched")
class Batched(Wrapper):
    otype = "Batched"
    KEYS = {"batch_size_multiplier": Key(16, POSITIVE_INT, "calls whose gradients are averaged into one step")}
    STATE = ("averaged_gradients",)
    COUNTS_STEPS = True

    def _allocate_state(self, builder):
        self.averaged_gradients = ti.field(ti.f32)
        builder.dense(ti.ij, (self.n_instances, self.n_params)).place(self.averaged_gradients)

    def _nested_slot(self, slot):
        if not self.n_params:
            return slot
        return Slot(slot.store, slot.params, slot.p_off, self.averaged_gradients, 0, slot.n)

    def _setup(self):
        pool, K, n = self.averaged_gradients, self.n_instances, self.n_params
        G, go = self._slot.grads, self._slot.g_off

        @ti.kernel
        def accumulate(active: I32_1D, first: I32_1D, multiplier: ti.i32):
            for k, i in ti.ndrange(K, n):
                if active[k]:
                    if first[k]:
                        pool[k, i] = 0.0
                    pool[k, i] += G[k, go + i] / ti.cast(multiplier, ti.f32)

        self._accumulate = accumulate

    def _update(self, active, loss_scale, lr_scale):
        N = self.hparams["batch_size_multiplier"]
        if self.n_params:
            self._accumulate(active, (self._steps % N == 0).astype(np.int32), N)
        self._steps += active
        fire = (active != 0) & (self._steps % N == 0)
        if fire.any():
            self.nested._update(fire.astype(np.int32), loss_scale, lr_scale)
