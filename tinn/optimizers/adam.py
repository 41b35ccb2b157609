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
"""
import numpy as np
import taichi as ti

from ..config import Options, optimizers
from .optimizer import Optimizer

_i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

DEFAULTS = {
    "learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "l2_reg": 1e-8,
    "non_matrix_l2_reg": 0.0, "non_matrix_learning_rate_factor": 1.0, "relative_decay": 0.0, "absolute_decay": 0.0,
    "adabound": False, "clipping_magnitude": 0.0, "gradient_clipping_magnitude": 0.0,
    "optimize_matrix_params": True, "optimize_non_matrix_params": True, "skip_zero_grad_non_matrix_params": True,
}
_RULES = {
    "beta1": (lambda v: 0 <= v < 1, "must lie in [0, 1)"), "beta2": (lambda v: 0 <= v < 1, "must lie in [0, 1)"),
    "epsilon": (lambda v: v >= 0, "must be >= 0"), "learning_rate": (lambda v: v >= 0, "must be >= 0"),
}


@optimizers.register("Adam")
class Adam(Optimizer):
    otype = "Adam"
    _has_state = True

    def __init__(self, **hparams):
        super().__init__()
        unknown = set(hparams) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"Adam got unknown hyperparameters {sorted(unknown)}")
        self.hparams = {**DEFAULTS, **hparams}

    @classmethod
    def from_config(cls, config, *, otype="Adam"):
        opt = Options("optimizer", otype, config)
        values = {}
        for key, default in DEFAULTS.items():
            check, rule = _RULES.get(key, (None, ""))
            values[key] = opt.get(key, default, bool if isinstance(default, bool) else float, check=check, rule=rule)
        opt.done()
        return cls(**values)

    def _allocate_state(self, builder):
        self.m, self.v, self.param_steps, self.steps = ti.field(ti.f32), ti.field(ti.f32), ti.field(ti.i32), \
            ti.field(ti.i32)
        builder.dense(ti.ij, (self.n_instances, self.n_params)).place(self.m, self.v, self.param_steps)
        builder.dense(ti.i, self.n_instances).place(self.steps)

    def _build_kernels(self):
        params, grads, m, v, param_steps, steps = (self._store.params, self._store.grads, self.m, self.v,
                                                   self.param_steps, self.steps)
        K, n, n_matrix = self.n_instances, self.n_params, self.n_matrix
        FLT_MAX = float(np.finfo(np.float32).max)

        @ti.kernel
        def step(active: _i32_1d, loss_scale: ti.f32, lr: ti.f32, beta1: ti.f32, beta2: ti.f32, eps: ti.f32,
                 l2_reg: ti.f32, nm_l2_reg: ti.f32, nm_lr_factor: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32,
                 adabound: ti.i32, wclip: ti.f32, gclip: ti.f32, opt_matrix: ti.i32, opt_non_matrix: ti.i32,
                 skip_zero: ti.i32):
            for k in range(K):
                steps[k] += active[k]
            for k, i in ti.ndrange(K, n):
                g = grads[k, i] / loss_scale
                is_matrix = i < n_matrix
                run = active[k] != 0
                if is_matrix:
                    run = run and opt_matrix != 0
                else:
                    run = run and opt_non_matrix != 0 and not (skip_zero != 0 and g == 0.0)
                if run:
                    w = params[k, i]
                    g += (l2_reg if is_matrix else nm_l2_reg) * w
                    if gclip != 0.0:
                        g = ti.math.clamp(g, -gclip, gclip)
                    mi = beta1 * m[k, i] + (1.0 - beta1) * g
                    vi = beta2 * v[k, i] + (1.0 - beta2) * g * g
                    m[k, i], v[k, i] = mi, vi
                    t = param_steps[k, i] + 1
                    param_steps[k, i] = t
                    a_i = lr * (1.0 if is_matrix else nm_lr_factor)
                    a_t = a_i * ti.sqrt(1.0 - ti.pow(beta2, ti.cast(t, ti.f32))) / (
                        1.0 - ti.pow(beta1, ti.cast(t, ti.f32)))
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
                    params[k, i] = w

        self._step = step

    def _kernel_step(self, active, loss_scale):
        h = self.hparams
        self._step(active, loss_scale, h["learning_rate"], h["beta1"], h["beta2"], h["epsilon"], h["l2_reg"],
                   h["non_matrix_l2_reg"], h["non_matrix_learning_rate_factor"], h["relative_decay"],
                   h["absolute_decay"], int(h["adabound"]), h["clipping_magnitude"],
                   h["gradient_clipping_magnitude"], int(h["optimize_matrix_params"]),
                   int(h["optimize_non_matrix_params"]), int(h["skip_zero_grad_non_matrix_params"]))
