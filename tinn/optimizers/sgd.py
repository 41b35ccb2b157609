"""SGD (tcnn ``optimizers/sgd.h``): ``w <- w - lr * (g + l2_reg * w)`` for every parameter.

No matrix/non-matrix distinction.
State: ``current_step``.
"""
import taichi as ti

from .._kernels import ARENA, arena_kernel
from ..registry import optimizers
from .optimizer import F32_1D, I32_1D, LEARNING_RATE, Optimizer, l2_reg


@arena_kernel
def _sgd_step(P: ARENA, po: ti.i32, G: ARENA, go: ti.i32, n: ti.i32, active: I32_1D,
              loss_scale: ti.f32, lr: ti.f32, lr_scale: F32_1D, l2_reg: ti.f32):
    for k, i in ti.ndrange(active.shape[0], n):
        if active[k]:
            w = P[k, po + i]
            P[k, po + i] = w - lr * lr_scale[k] * (G[k, go + i] / loss_scale + l2_reg * w)


@optimizers.register("SGD")
class SGD(Optimizer):
    otype = "SGD"
    KEYS = {"learning_rate": LEARNING_RATE, "l2_reg": l2_reg(1e-8)}

    def update(self, step):
        s = self.slot
        _sgd_step(s.params, s.p_off, s.grads, s.g_off, s.n, step.mask, step.loss_scale, self.learning_rate,
                  self.lr_scale(step), self.hparams["l2_reg"])
