"""EMA (tcnn ``optimizers/ema.h``): a bias-corrected moving average of the weights for inference.

Keys: ``nested`` ({} -> Adam) and ``EMA.KEYS``. Registered as ``Ema`` (and ``EMA``);
``hyperparams()`` reports ``"EMA"``.

After the nested step, with ``t = nested.step_counts()`` (per instance, >= 1)::

    E_t = (d (1 - d^(t-1)) E_{t-1} + (1 - d) w) / (1 - d^t)

``w`` are the nested optimizer's inference weights if it has any, else the trained
weights. ``E`` is what ``inference()`` reads. tinn keeps ``E`` in float32 always, so
``full_precision`` is accepted and reported but changes nothing. Differences from
tcnn: ``E`` starts as a copy of the weights (tcnn: zeros; irrelevant after the first
step, since ``E_1 = w``), and an instance whose nested optimizer has not stepped yet
(``t = 0``, e.g. under ``Batched``) keeps ``E`` (tcnn divides by zero).
State: ``weights_ema`` plus ``nested.*``.
"""
import numpy as np
import taichi as ti

from ..registry import optimizers
from ..keys import Key
from .._kernels import copy_columns
from ..params import Buffer
from .optimizer import F32_1D, I32_1D, beta
from .wrapper import Wrapper


@ti.kernel
def _ema_step(E: ti.template(), eo: ti.i32, W: ti.template(), wo: ti.i32, n: ti.i32, active: I32_1D, decay: ti.f32,
              debias_old: F32_1D, debias_new: F32_1D):
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k]:
            E[k, eo + i] = (E[k, eo + i] * decay * debias_old[k] + W[k, wo + i] * (1.0 - decay)) * debias_new[k]


@optimizers.register("Ema")
class EMA(Wrapper):
    otype = "EMA"
    KEYS = {"decay": beta(0.99, "decay of the moving average"),
            "full_precision": Key(False, doc="accepted and reported; tinn's average is float32 always")}
    STATE = ("weights_ema",)

    def create_state(self):
        self.weights_ema = E = Buffer(self.n_instances, self.n_params, "EMA weights")
        copy_columns(E.field, E.offset, *self.nested_weights(), self.n_params, np.ones(self.n_instances, np.int32))

    def after_nested(self, active):
        if not self.n_params:
            return
        t = self.nested.step_counts()
        d = np.float32(self.hparams["decay"])
        one = np.float32(1)
        debias_old = one - np.power(np.float64(d), np.maximum(t - 1, 0)).astype(np.float32)
        with np.errstate(divide="ignore"):
            debias_new = one / (one - np.power(np.float64(d), t).astype(np.float32))
        mask = (active != 0) & (t > 0)
        E = self.weights_ema
        _ema_step(E.field, E.offset, *self.nested_weights(), self.n_params, mask.astype(np.int32), d, debias_old,
                  debias_new.astype(np.float32))

    def inference_weights(self):
        return (self.weights_ema.field, self.weights_ema.offset) if self.n_params else None
