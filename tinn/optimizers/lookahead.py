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
from .._kernels import copy_columns
from ..params import Buffer
from .optimizer import I32_1D
from .wrapper import Wrapper


@ti.kernel
def _lookahead_step(slow: ti.template(), so: ti.i32, W: ti.template(), wo: ti.i32, n: ti.i32, copy: I32_1D,
                    blend: I32_1D, alpha: ti.f32):
    for k, i in ti.ndrange(copy.shape[0], n):
        if copy[k]:
            slow[k, so + i] = W[k, wo + i]
        if blend[k]:
            w = slow[k, so + i] * (1.0 - alpha) + W[k, wo + i] * alpha
            W[k, wo + i] = w
            slow[k, so + i] = w


@optimizers.register("Lookahead")
class Lookahead(Wrapper):
    otype = "Lookahead"
    KEYS = {"alpha": Key(0.5, CLOSED_UNIT, "how far the slow weights move toward the fast ones"),
            "n_steps": Key(16, POSITIVE_INT, "fast steps between synchronisations")}
    STATE = ("weights_lookahead",)

    def create_state(self):
        self.weights_lookahead = slow = Buffer(self.n_instances, self.n_params, "Lookahead weights")
        copy_columns(slow.field, slow.offset, self.slot.params, self.slot.p_off, self.n_params,
                     np.ones(self.n_instances, np.int32))

    def before_nested(self, active):
        if self.n_params:
            s = self.nested.step_counts()
            on = active != 0
            copy, blend = on & (s == 0), on & (s % self.hparams["n_steps"] == 0)
            slow, s = self.weights_lookahead, self.slot
            _lookahead_step(slow.field, slow.offset, s.params, s.p_off, s.n, copy.astype(np.int32),
                            blend.astype(np.int32), self.hparams["alpha"])

    def inference_weights(self):
        return (self.weights_lookahead.field, self.weights_lookahead.offset) if self.n_params else None
