"""Lookahead (tcnn ``optimizers/lookahead.h``; Zhang et al. 2019).

Keys: ``nested`` ({} -> Adam) and ``Lookahead.KEYS``.

Before each nested step, with ``s = nested.step_counts()`` (per instance)::

    if s == 0:             slow = w
    if s mod n_steps == 0: w = (1 - alpha) slow + alpha w;  slow = w

then the nested step runs. ``inference()`` reads the slow weights. They start as a
copy of the weights (tcnn leaves them uninitialised until the first step).
State: ``weights_lookahead`` plus ``nested.*``.
"""
import numpy as np
import taichi as ti

from ..registry import optimizers
from ..keys import CLOSED_UNIT, POSITIVE_INT, Key
from .optimizer import I32_1D
from .wrapper import Wrapper, copy_kernel


@optimizers.register("Lookahead")
class Lookahead(Wrapper):
    otype = "Lookahead"
    KEYS = {"alpha": Key(0.5, CLOSED_UNIT, "how far the slow weights move toward the fast ones"),
            "n_steps": Key(16, POSITIVE_INT, "fast steps between synchronisations")}
    STATE = ("weights_lookahead",)

    def _allocate_state(self, builder):
        self.weights_lookahead = ti.field(ti.f32)
        builder.dense(ti.ij, (self.n_instances, self.n_params)).place(self.weights_lookahead)

    def _setup(self):
        slow, K, n = self.weights_lookahead, self.n_instances, self.n_params
        W, wo = self._slot.params, self._slot.p_off

        @ti.kernel
        def lookahead(copy: I32_1D, blend: I32_1D, alpha: ti.f32):
            for k, i in ti.ndrange(K, n):
                if copy[k]:
                    slow[k, i] = W[k, wo + i]
                if blend[k]:
                    w = slow[k, i] * (1.0 - alpha) + W[k, wo + i] * alpha
                    W[k, wo + i] = w
                    slow[k, i] = w

        self._lookahead = lookahead
        copy_kernel(slow, 0, W, wo, K, n)(np.ones(K, np.int32))

    def _before(self, active):
        if self.n_params:
            s = self.nested.step_counts()
            on = active != 0
            copy, blend = on & (s == 0), on & (s % self.hparams["n_steps"] == 0)
            self._lookahead(copy.astype(np.int32), blend.astype(np.int32), self.hparams["alpha"])

    def _custom(self):
        return (self.weights_lookahead, 0) if self.n_params else None
