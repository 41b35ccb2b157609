"""Adam, generalised to AdaBound (tcnn ``optimizers/adam.h``, spec §4.2).

Keys (defaults): ``learning_rate`` (1e-3), ``beta1`` (0.9), ``beta2`` (0.999),
``epsilon`` (1e-8), ``l2_reg`` (1e-8, matrix params), ``non_matrix_l2_reg`` (0),
``non_matrix_learning_rate_factor`` (1), ``relative_decay`` (0), ``absolute_decay`` (0),
``adabound`` (false), ``clipping_magnitude`` (0 = off), ``gradient_clipping_magnitude``
(0 = off), ``optimize_matrix_params`` (true), ``optimize_non_matrix_params`` (true),
``skip_zero_grad_non_matrix_params`` (true).

Per parameter, with its own step count ``t``::

    g   = grad / loss_scale + l2 * w                (clipped to gradient_clipping_magnitude)
    m   = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
    a_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    w   = (1 - relative_decay a_t) w - copysign(absolute_decay a_t, w) - clamp(a_t / (sqrt(v) + eps), lo, hi) m

A non-matrix parameter whose gradient is exactly 0 is skipped entirely (no moment
decay, no step count): tcnn's sparse Adam for hash grids.
State: ``current_step`` (per instance, AdaBound's t), ``first_moments``,
``second_moments``, ``param_steps``.
"""
import numpy as np
import taichi as ti

from ..config import optimizers
from .optimizer import F32_1D, F32_2D, I32_1D, I32_2D, NON_NEGATIVE, UNIT_INTERVAL, Optimizer, zeros

DEFAULTS = {
    "learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "l2_reg": 1e-8,
    "non_matrix_l2_reg": 0.0, "non_matrix_learning_rate_factor": 1.0, "relative_decay": 0.0, "absolute_decay": 0.0,
    "adabound": False, "clipping_magnitude": 0.0, "gradient_clipping_magnitude": 0.0,
    "optimize_matrix_params": True, "optimize_non_matrix_params": True, "skip_zero_grad_non_matrix_params": True,
}


FLT_MAX = float(np.finfo(np.float32).max)


@ti.kernel
def _adam_step(P: ti.template(), po: ti.i32, G: ti.template(), go: ti.i32, n_matrix: ti.i32, n: ti.template(),
               m: F32_2D, v: F32_2D, param_steps: I32_2D, active: I32_1D, steps: I32_1D, bias: F32_1D,
               loss_scale: ti.f32,
               lr: F32_1D, beta1: ti.f32, beta2: ti.f32, eps: ti.f32, l2_reg: ti.f32, nm_l2_reg: ti.f32,
               nm_lr_factor: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32, adabound: ti.i32, wclip: ti.f32,
               gclip: ti.f32, opt_matrix: ti.i32, opt_non_matrix: ti.i32, skip_zero: ti.i32):
    for k, i in ti.ndrange(active.shape[0], n):          # n is a compile-time constant: no division per element
        g = G[k, go + i] / loss_scale
        is_matrix = i < n_matrix
        run = active[k] != 0
        if is_matrix:
            run = run and opt_matrix != 0
        else:
            run = run and opt_non_matrix != 0 and not (skip_zero != 0 and g == 0.0)
        if run:
            w = P[k, po + i]
            g += (l2_reg if is_matrix else nm_l2_reg) * w
            if gclip != 0.0:
                g = ti.math.clamp(g, -gclip, gclip)
            mi = beta1 * m[k, i] + (1.0 - beta1) * g
            vi = beta2 * v[k, i] + (1.0 - beta2) * g * g
            m[k, i], v[k, i] = mi, vi
            t = param_steps[k, i] + 1
            param_steps[k, i] = t
            a_i = lr[k] * (1.0 if is_matrix else nm_lr_factor)
            a_t = a_i * bias[t]
            lo, hi = 0.0, FLT_MAX
            if adabound != 0:
                T = ti.cast(steps[k], ti.f32)
                lo = 0.1 - 0.1 / ((1.0 - beta2) * T + 1.0)
                hi = 0.1 + 0.1 / ((1.0 - beta2) * T)
            eta = ti.math.clamp(a_t / (ti.sqrt(vi) + eps), lo, hi)
            decayed = (1.0 - rel_decay * a_t) * w - ti.select(w < 0.0, -1.0, 1.0) * abs_decay * a_t
            w = decayed - eta * mi
            if wclip != 0.0:
                w = ti.math.clamp(w, -wclip, wclip)
            P[k, po + i] = w


@optimizers.register("Adam")
class Adam(Optimizer):
    otype = "Adam"
    DEFAULTS = DEFAULTS
    RULES = {"beta1": UNIT_INTERVAL, "beta2": UNIT_INTERVAL, "epsilon": NON_NEGATIVE, "learning_rate": NON_NEGATIVE}
    STATE = ("first_moments", "second_moments", "param_steps")

    def _setup(self):
        K, n = self.n_instances, self.n_params
        self.first_moments, self.second_moments = zeros((K, n), ti.f32), zeros((K, n), ti.f32)
        self.param_steps = zeros((K, n), ti.i32)

    def _bias_correction(self) -> np.ndarray:
        """``sqrt(1 - beta2^t) / (1 - beta1^t)`` for every step count t a parameter can have, computed
        once on the host in float64 (a per-parameter pow in the kernel costs more than the rest of Adam)."""
        b1, b2, t_max = self.hparams["beta1"], self.hparams["beta2"], int(self._steps.max())
        cached = getattr(self, "_bias", None)
        if cached is None or cached[0] != (b1, b2) or len(cached[1]) <= t_max:
            t = np.arange(2 * t_max + 64, dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                table = np.where(t > 0, np.sqrt(1 - b2 ** t) / (1 - b1 ** t), 0.0)
            self._bias = ((b1, b2), table.astype(np.float32))
        return self._bias[1]

    def _kernel_step(self, active, loss_scale, lr):
        h, s = self.hparams, self._slot
        _adam_step(s.params, s.p_off, s.grads, s.g_off, self.n_matrix, s.n, self.first_moments,
                   self.second_moments, self.param_steps, active, self._steps.astype(np.int32),
                   self._bias_correction(), loss_scale, lr,
                   h["beta1"], h["beta2"], h["epsilon"], h["l2_reg"], h["non_matrix_l2_reg"],
                   h["non_matrix_learning_rate_factor"], h["relative_decay"],
                   h["absolute_decay"], int(h["adabound"]), h["clipping_magnitude"],
                   h["gradient_clipping_magnitude"], int(h["optimize_matrix_params"]),
                   int(h["optimize_non_matrix_params"]), int(h["skip_zero_grad_non_matrix_params"]))
