"""Novograd (tcnn ``optimizers/novograd.h``; Ginsburg et al. 2019).

Per matrix layer l (``layer_sizes``), with this step's gradient ``g = grad / loss_scale``::

    n_l = sum_{i in l} g_i^2
    v_l = b2 v_l + (1 - b2) n_l                      b2 = 0 on an instance's first step, else beta2
    m_i = b1 m_i + (1 - b1) g_i / (sqrt(v_l) + eps)  b1 = 0 on the first step, else beta1
    w_i = (1 - r lr) w_i - copysign(a lr, w_i) - lr m_i

No bias correction, no L2. Non-matrix parameters are not updated at all (as in tcnn).
tcnn never clears the buffer that accumulates ``n_l``, so its norm grows
over layers and steps; tinn uses the intended per-layer norm of the current gradient.
State: ``current_step``, ``first_moments``, ``per_layer_second_moments`` ``(K, n_layers)``.
"""
import numpy as np
import taichi as ti

from ..batch import buffers as _buffers
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel
from .optimizer import (ABSOLUTE_DECAY, EPSILON, F32_1D, F32_2D, I32_1D, LEARNING_RATE, RELATIVE_DECAY, Optimizer,
                        beta, zeros)


@arena_kernel
def _novograd_step(P: ARENA, po: ti.i32, G: ARENA, go: ti.i32, n_matrix: ti.i32, m: F32_2D,
                   v: F32_2D, layer_start: I32_1D, layer_of: I32_1D, active: I32_1D, steps: I32_1D,
                   loss_scale: ti.f32, lr: ti.f32, lr_scale: F32_1D, beta1: ti.f32, beta2: ti.f32, eps: ti.f32, rel_decay: ti.f32,
                   abs_decay: ti.f32):
    for k, l in ti.ndrange(active.shape[0], v.shape[1]):
        if active[k]:
            norm = 0.0
            for i in range(layer_start[l], layer_start[l + 1]):
                g = G[k, go + i]
                norm += g * g
            b2 = ti.select(steps[k] == 1, 0.0, beta2)
            v[k, l] = b2 * v[k, l] + (1.0 - b2) * norm / loss_scale / loss_scale
    for k, i in ti.ndrange(active.shape[0], n_matrix):
        if active[k]:
            b1 = ti.select(steps[k] == 1, 0.0, beta1)
            g = G[k, go + i] / loss_scale
            mi = b1 * m[k, i] + (1.0 - b1) * g / (ti.sqrt(v[k, layer_of[i]]) + eps)
            m[k, i] = mi
            w = P[k, po + i]
            a = lr * lr_scale[k]
            decayed = (1.0 - rel_decay * a) * w - ti.select(w < 0.0, -1.0, 1.0) * abs_decay * a
            P[k, po + i] = decayed - a * mi


@optimizers.register("Novograd")
class Novograd(Optimizer):
    otype = "Novograd"
    KEYS = {"learning_rate": LEARNING_RATE, "beta1": beta(0.9, "first-moment decay"),
            "beta2": beta(0.999, "per-layer second-moment decay"), "epsilon": EPSILON,
            "relative_decay": RELATIVE_DECAY, "absolute_decay": ABSOLUTE_DECAY}
    STATE = ("first_moments", "per_layer_second_moments")

    def create_state(self):
        K, sizes = self.n_instances, [r * c for r, c in self.layer_sizes]
        self.first_moments = zeros((K, self.n_params), ti.f32)
        self.per_layer_second_moments = zeros((K, len(sizes)), ti.f32) if sizes else np.zeros((K, 0), np.float32)
        if self.n_matrix:
            self._layer_start = _buffers.put(np.cumsum([0] + sizes).astype(np.int32), ti.i32)    # kernel tables
            self._layer_of = _buffers.put(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes), ti.i32)

    def update(self, step):
        if self.n_matrix:
            h, s = self.hparams, self.slot
            _novograd_step(s.params, s.p_off, s.grads, s.g_off, self.n_matrix, self.first_moments,
                           self.per_layer_second_moments, self._layer_start, self._layer_of, step.mask,
                           self._steps, step.loss_scale, self.learning_rate, self.lr_scale(step),
                           h["beta1"], h["beta2"],
                           h["epsilon"], h["relative_decay"], h["absolute_decay"])
