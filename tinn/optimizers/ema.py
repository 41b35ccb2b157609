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
The debias factors are computed in the kernel from the nested step counts where they live
(a device step reads nothing back).
State: ``weights_ema`` plus ``nested.*``.
"""
import taichi as ti

from ..keys import Key
from ..params import Buffer
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel, copy_columns
from .optimizer import F32_2D, I32_1D, beta, zeros
from .step import one_minus_pow
from .wrapper import Wrapper


@arena_kernel
def _ema_step(E: ARENA, eo: ti.i32, W: ARENA, wo: ti.i32, n: ti.i32, active: I32_1D,
              steps: I32_1D, decay: ti.f32, debias: F32_2D):
    """The average of the networks with ``active[k]`` and ``t = steps[k] > 0``; ``debias[k]`` holds
    ``(1 - d^(t-1), 1 / (1 - d^t))``, computed once per network first."""
    for k in range(active.shape[0]):
        T = ti.cast(steps[k], ti.f32)
        debias[k, 0] = one_minus_pow(decay, T - 1.0)
        debias[k, 1] = 1.0 / one_minus_pow(decay, T)
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k] and steps[k] > 0:
            E[k, eo + i] = (E[k, eo + i] * decay * debias[k, 0] + W[k, wo + i] * (1.0 - decay)) * debias[k, 1]


@optimizers.register("Ema")
class EMA(Wrapper):
    otype = "EMA"
    KEYS = {"decay": beta(0.99, "decay of the moving average"),
            "full_precision": Key(False, doc="accepted and reported; tinn's average is float32 always")}
    STATE = ("weights_ema",)

    def create_state(self):
        self.weights_ema = E = Buffer(self.n_instances, self.n_params, "EMA weights")
        copy_columns(E.field, E.offset, *self.nested_weights(), self.n_params, self.all_networks())
        self._debias = zeros((self.n_instances, 2), ti.f32)

    def after_nested(self, step):
        if self.n_params:
            E = self.weights_ema
            _ema_step(E.field, E.offset, *self.nested_weights(), self.n_params, step.mask,
                      self.nested.steps_array(), self.hparams["decay"], self._debias)

    def inference_weights(self):
        return (self.weights_ema.field, self.weights_ema.offset) if self.n_params else None
