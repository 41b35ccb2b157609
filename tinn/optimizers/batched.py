"""Batched (tcnn ``optimizers/batched.h``): average gradients over several calls, then step.

Keys: ``nested`` ({} -> Adam) and ``Batched.KEYS`` (``batch_size_multiplier`` N).

Every call adds ``grad / N`` to a float32 pool (the first call of each group of N
resets it); after every N-th call the nested optimizer steps once on the pool
(``loss_scale`` passed through). ``step_counts()`` counts calls (per instance); the
inference weights are the nested optimizer's. One kernel adds to the pool, counts the call and
writes the mask of the networks whose group is complete (``fire``), with which the nested
optimizer then steps: nothing is read back, and a network outside ``fire`` is left untouched.
State: ``current_step``, ``averaged_gradients`` plus ``nested.*`` (tcnn also keeps a
half-precision copy of the pool; tinn is float32 throughout).
"""
import dataclasses
from functools import partial

import taichi as ti

from ..keys import POSITIVE_INT, Key
from ..params import Buffer
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel
from .optimizer import I32_1D, Slot, zeros
from .step import count_skipped, counted, gate, gate_args
from .wrapper import Wrapper


@arena_kernel
def _accumulate(pool: ARENA, po: ti.i32, G: ARENA, go: ti.i32, n: ti.i32, active: I32_1D,
                steps: I32_1D, fire: I32_1D, multiplier: ti.i32, source: I32_1D, CG: ARENA, cgo: ti.i32, cn: ti.i32,
                skipped: I32_1D, inv_scale: ti.f32):
    """The step's first kernel: its gate (``step.py``; a gated network's call is not counted), then ``pool += G /
    N`` (reset on a group's first call, ``steps[k] % N == 0``); then count the call and set ``fire[k]`` for the
    networks whose ``N``-th call this was."""
    gate(source, CG, 0, cgo, cn, inv_scale, active)
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k]:
            if steps[k] % multiplier == 0:
                pool[k, po + i] = 0.0
            pool[k, po + i] += G[k, go + i] / ti.cast(multiplier, ti.f32)
    for k in range(active.shape[0]):
        steps[k] = counted(steps[k], active[k])
        fire[k] = ti.cast(active[k] != 0 and steps[k] % multiplier == 0, ti.i32)
        count_skipped(source, active, skipped, k)


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

    def _set_slot(self, slot, layer_sizes):
        super()._set_slot(slot, layer_sizes)
        self._fire = zeros((self.n_instances,), ti.i32)

    def _phases(self, step):
        """Every call adds to the pool; the nested optimizer steps on every N-th call of an instance."""
        return [partial(self._accumulate, step)] + self.nested._phases(dataclasses.replace(step, mask=self._fire,
                                                                                            gate=None))

    def _accumulate(self, step):
        s = self.slot
        pool, po = (self.averaged_gradients.field, self.averaged_gradients.offset) if self.n_params else (s.grads, 0)
        _accumulate(pool, po, s.grads, s.g_off, s.n, step.mask, self._steps, self._fire,
                    self.hparams["batch_size_multiplier"], *gate_args(step, s.grads, self._skipped),
                    1.0 / step.loss_scale)
