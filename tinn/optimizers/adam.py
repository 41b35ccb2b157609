"""Adam, generalised to AdaBound (tcnn ``optimizers/adam.h``).

Keys: see ``Adam.KEYS`` (listed in the class docstring). Per parameter, with its own step count ``t``::

    g   = grad / loss_scale + l2 * w                (clipped to gradient_clipping_magnitude)
    m   = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
    a_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    w   = (1 - relative_decay a_t) w - copysign(absolute_decay a_t, w) - clamp(a_t / (sqrt(v) + eps), lo, hi) m

A non-matrix parameter whose gradient is exactly 0 is skipped entirely (no moment
decay, no step count): tcnn's sparse Adam for hash grids.
State: ``current_step`` (per instance, AdaBound's t), ``first_moments``,
``second_moments``, ``matrix_steps`` (per instance: matrix parameters always step together)
and ``param_steps`` (per non-matrix parameter).
"""
import math
from functools import partial

import numpy as np
import taichi as ti

from ..keys import NON_NEGATIVE, Key
from ..registry import optimizers
from ..runtime.program import is_cpu
from ..runtime.kernels import ARENA, FLAT, at, flat_args, set_at, specialised
from .step import count_skipped, counted, gate, gate_args, one_minus_pow, within_bound
from .optimizer import (ABSOLUTE_DECAY, EPSILON, F32_1D, I32_1D, LEARNING_RATE, RELATIVE_DECAY, Optimizer, beta,
                        l2_reg, zeros)

KEYS = {
    "learning_rate": LEARNING_RATE,
    "beta1": beta(0.9, "first-moment decay"),
    "beta2": beta(0.999, "second-moment decay"),
    "epsilon": EPSILON,
    "l2_reg": l2_reg(1e-8),
    "non_matrix_l2_reg": Key(0.0, NON_NEGATIVE, "l2_reg of the non-matrix params"),
    "non_matrix_learning_rate_factor": Key(1.0, NON_NEGATIVE, "multiplies the learning rate of non-matrix params"),
    "relative_decay": RELATIVE_DECAY,
    "absolute_decay": ABSOLUTE_DECAY,
    "adabound": Key(False, doc="clamp the step size as AdaBound"),
    "clipping_magnitude": Key(0.0, NON_NEGATIVE, "clamp the weights to [-c, c] (0: off)"),
    "gradient_clipping_magnitude": Key(0.0, NON_NEGATIVE, "clamp the gradients to [-c, c] (0: off)"),
    "optimize_matrix_params": Key(True, doc="update the matrix (MLP weight) params"),
    "optimize_non_matrix_params": Key(True, doc="update the non-matrix (e.g. grid) params"),
    "skip_zero_grad_non_matrix_params": Key(True, doc="leave non-matrix params with a zero gradient untouched"),
}


FLT_MAX = float(np.finfo(np.float32).max)
CHUNK = 1024
"""Parameters per parallel task on the CPU: each task runs over contiguous memory, which the compiler
vectorises. On a GPU a task is a thread, so there a task takes ``GPU_CHUNK`` parameters."""
GPU_CHUNK = 8
WHOLE_NETWORKS = 64
WHOLE_PARAMS = 1 << 15
"""On the CPU, an array of at least ``WHOLE_NETWORKS`` networks of at most ``WHOLE_PARAMS`` parameters each steps a
whole network's matrix parameters per task: the task checks the network's gradients (the step's gate) just before
its update reads them again from the cache, instead of a pass of its own over every gradient in memory."""


BIAS_TABLE = 1 << 22
"""Most entries of the host's bias-correction table (16 MiB of float32)."""


def _converged(beta1: float, beta2: float) -> int:
    """A step count from which ``sqrt(1 - beta2^t) / (1 - beta1^t)`` rounds to 1 in float32:
    ``beta1^t`` and ``beta2^t / 2`` below 2^-26 (a few steps of margin included)."""
    def steps(beta):
        return 1 if beta <= 0 else math.ceil(-26 * math.log(2) / math.log(beta)) + 4
    return max(steps(beta1), steps(beta2))


@specialised
def _adam_kernel(flags: tuple, flat: bool, whole: bool):
    """The update of one slot of ``n`` parameters, the first ``n_matrix`` of them matrix parameters (both
    arguments at run time: one kernel serves models of every size).

    ``P``, ``I``, ``G`` are parameter memory as :func:`~tinn.runtime.kernels.flat_rows` gives it: ``flat`` arrays with
    their row strides (x64), or fields.

    ``flags`` are the hyperparameters that switch code on or off (compile-time, so the common case
    is a branch-free loop): adabound, gradient clipping, weight clipping, decay, optimize matrix
    params, optimize non-matrix params, skip zero non-matrix gradients, and ``mirror``: also write
    each stepped weight to ``I[k, io + i]`` (the model's inference weights, filled in the same pass
    instead of a copy after the step). Matrix parameters share their network's step count;
    non-matrix ones keep their own (they skip zero gradients). The kernel counts the optimizer's
    steps too (``steps[k] += active[k]``, saturating, after the updates), so a step is one launch; as a step's
    first kernel it first evaluates the step's gate (``step.py``: ``active`` from ``source`` and the gradients
    ``G[k, cgo + i]``, ``i < cn``).
    """
    adabound, gclip_on, wclip_on, decay_on, opt_matrix, opt_non_matrix, skip_zero, mirror = flags
    chunk = CHUNK if is_cpu() else GPU_CHUNK

    @ti.func
    def bias_at(bias: ti.template(), t, beta1, beta2):
        """``sqrt(1 - beta2^t) / (1 - beta1^t)`` from the host's table; past its end the table's last
        entry (1 once the correction has converged in float32, ``converged``), else computed here."""
        last = bias.shape[0] - 1
        b = bias[ti.min(t, last)]
        if t > last and bias[last] != 1.0:
            T = ti.cast(t, ti.f32)
            b = ti.sqrt(one_minus_pow(beta2, T)) / one_minus_pow(beta1, T)
        return b

    @ti.func
    def adabound_step(steps: ti.template(), k):
        """AdaBound's ``t``: the optimizer's step count, this step included (only AdaBound reads it)."""
        T = 0.0
        if ti.static(adabound):
            T = ti.cast(steps[k] + 1, ti.f32)
        return T

    @ti.func
    def update(w, g, m0, v0, a_t, T, beta1, beta2, eps, rel_decay, abs_decay, wclip, gclip):
        """``(w, m, v)`` after one Adam/AdaBound step with bias-corrected rate ``a_t``."""
        if ti.static(gclip_on):
            g = ti.math.clamp(g, -gclip, gclip)
        m = beta1 * m0 + (1.0 - beta1) * g
        v = beta2 * v0 + (1.0 - beta2) * g * g
        eta = ti.min(a_t / (ti.sqrt(v) + eps), FLT_MAX)
        if ti.static(adabound):
            eta = ti.math.clamp(eta, 0.1 - 0.1 / ((1.0 - beta2) * T + 1.0), 0.1 + 0.1 / ((1.0 - beta2) * T))
        if ti.static(decay_on):
            w = (1.0 - rel_decay * a_t) * w - ti.select(w < 0.0, -1.0, 1.0) * abs_decay * a_t
        w -= eta * m
        if ti.static(wclip_on):
            w = ti.math.clamp(w, -wclip, wclip)
        return w, m, v

    Rows = FLAT if flat else ARENA

    @ti.kernel
    def step(P: Rows, ps: ti.i32, po: ti.i32, I: Rows, is_: ti.i32, io: ti.i32, G: Rows, gs: ti.i32, go: ti.i32,
             m: F32_1D, v: F32_1D,
             matrix_steps: I32_1D, param_steps: I32_1D, active: I32_1D, steps: I32_1D, bias: F32_1D,
             source: I32_1D, cgo: ti.i32, cn: ti.i32, skipped: I32_1D,
             inv_scale: ti.f32, lr: ti.f32, lr_scale: F32_1D, beta1: ti.f32, beta2: ti.f32, eps: ti.f32, l2_reg: ti.f32,
             nm_l2_reg: ti.f32, nm_lr_factor: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32, wclip: ti.f32,
             gclip: ti.f32, n_matrix: ti.i32, n: ti.i32):
        if ti.static(not whole):
            gate(source, G, gs, cgo, cn, inv_scale, active)
        n_nm = n - n_matrix
        span = chunk                                        # matrix parameters per task
        if ti.static(whole):
            span = n_matrix
        m_tasks, nm_tasks = (n_matrix + span - 1) // span, (n_nm + chunk - 1) // chunk
        if ti.static(opt_matrix):
            for task in range(active.shape[0] * m_tasks):
                k, c = task // m_tasks, task % m_tasks
                if ti.static(whole):                        # the gate of this network, its gradients then cached
                    active[k] = ti.cast(source[k] != 0 and within_bound(G, gs, k, cgo, cn, inv_scale), ti.i32)
                if active[k] != 0:
                    a_t, T = lr * lr_scale[k] * bias_at(bias, matrix_steps[k] + 1, beta1, beta2), adabound_step(steps, k)
                    mv = k * n                              # this network's moments
                    for i in range(c * span, ti.min(c * span + span, n_matrix)):
                        w = at(P, ps, k, po + i)
                        g = at(G, gs, k, go + i) * inv_scale + l2_reg * w
                        w, m[mv + i], v[mv + i] = update(
                            w, g, m[mv + i], v[mv + i], a_t, T, beta1, beta2, eps, rel_decay, abs_decay, wclip, gclip)
                        set_at(P, ps, k, po + i, w)
                        if ti.static(mirror):
                            set_at(I, is_, k, io + i, w)
        if ti.static(opt_non_matrix):
            for task in range(active.shape[0] * nm_tasks):
                k, c = task // nm_tasks, task % nm_tasks
                if active[k] != 0:
                    a_k, T = lr * lr_scale[k] * nm_lr_factor, adabound_step(steps, k)
                    mv, sv, first = k * n, k * n_nm, n_matrix      # this network's moments and step counts
                    for j in range(c * chunk, ti.min(c * chunk + chunk, n_nm)):
                        i, s = first + j, sv + j
                        w0, g = at(P, ps, k, po + i), at(G, gs, k, go + i) * inv_scale
                        run = not (skip_zero and g == 0.0)
                        t = counted(param_steps[s], ti.cast(run, ti.i32))
                        a_t = a_k * bias_at(bias, t, beta1, beta2)
                        w, mi, vi = update(w0, g + nm_l2_reg * w0, m[mv + i], v[mv + i], a_t, T,
                                           beta1, beta2, eps, rel_decay, abs_decay, wclip, gclip)
                        set_at(P, ps, k, po + i, ti.select(run, w, w0))    # a skipped parameter keeps all it had
                        if ti.static(mirror):
                            set_at(I, is_, k, io + i, ti.select(run, w, w0))
                        m[mv + i] = ti.select(run, mi, m[mv + i])
                        v[mv + i] = ti.select(run, vi, v[mv + i])
                        param_steps[s] = t
        for k in range(active.shape[0]):                    # after the updates, which read the old counts
            if ti.static(opt_matrix):
                matrix_steps[k] = counted(matrix_steps[k], active[k])
            steps[k] = counted(steps[k], active[k])
            count_skipped(source, active, skipped, k)

    return step


@optimizers.register("Adam")
class Adam(Optimizer):
    otype = "Adam"
    KEYS = KEYS
    STATE = ("first_moments", "second_moments", "matrix_steps", "param_steps")

    def create_state(self):
        K, n = self.n_instances, self.n_params
        self.first_moments, self.second_moments = zeros((K * n,), ti.f32), zeros((K * n,), ti.f32)
        self.matrix_steps = zeros((K,), ti.i32)                             # per network
        self.param_steps = zeros((max(1, K * (n - self.n_matrix)),), ti.i32)  # per non-matrix parameter

    def param_step_counts(self) -> np.ndarray:
        """Each parameter's own step count t (tcnn keeps one per parameter): ``(n_params,)``, or
        ``(n_instances, n_params)`` for network arrays."""
        self._require_allocated()
        K, n_nm = self.n_instances, self.n_params - self.n_matrix
        counts = np.concatenate([np.repeat(self.matrix_steps.to_numpy()[:, None], self.n_matrix, axis=1),
                               self.param_steps.to_numpy()[: K * n_nm].reshape(K, n_nm)], axis=1)
        return counts[0] if K == 1 else counts

    def _bias_correction(self) -> np.ndarray:
        """``sqrt(1 - beta2^t) / (1 - beta1^t)`` for the step counts t a parameter can have, computed once
        on the host in float64 (a per-parameter pow in the kernel costs more than the rest of Adam).

        The table ends where the correction is 1 in float32 for good (about 17,000 steps for the
        default betas), or at ``BIAS_TABLE`` entries for betas so close to 1 that it converges later;
        the kernel reads the last entry beyond the end, or computes the rare later ones itself."""
        b1, b2 = self.hparams["beta1"], self.hparams["beta2"]
        cached = getattr(self, "_bias", None)
        if cached is None or cached[0] != (b1, b2):
            t = np.arange(min(_converged(b1, b2) + 2, BIAS_TABLE), dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                table = np.where(t > 0, np.sqrt(1 - b2 ** t) / (1 - b1 ** t), 0.0)
            self._bias = ((b1, b2), table.astype(np.float32))
        return self._bias[1]

    def mirrors(self) -> bool:
        """Every weight of a stepped instance is written (so the step can fill the inference weights)."""
        return bool(self.hparams["optimize_matrix_params"] and self.hparams["optimize_non_matrix_params"])

    def _phases(self, step):
        """The update counts the steps in its own kernel and evaluates the gate (without parameters: the shared
        counter)."""
        return [partial(self.update, step)] if self.n_params else super()._phases(step)

    def update(self, step):
        h, s = self.hparams, self.slot
        flags = (bool(h["adabound"]), h["gradient_clipping_magnitude"] != 0, h["clipping_magnitude"] != 0,
                 h["relative_decay"] != 0 or h["absolute_decay"] != 0, bool(h["optimize_matrix_params"]),
                 bool(h["optimize_non_matrix_params"]), bool(h["skip_zero_grad_non_matrix_params"]),
                 step.publish_to is not None)
        I, io = step.publish_to or (s.params, s.p_off)
        flat, ((P, ps), (I, is_), (G, gs)) = flat_args(s.params, I, s.grads)
        source, _, cgo, cn, skipped = gate_args(step, s.grads, self._skipped)
        whole = is_cpu() and flags[4] and self.n_matrix and self.n_instances >= WHOLE_NETWORKS and s.n <= WHOLE_PARAMS
        _adam_kernel(flags, flat, bool(whole))(
            P, ps, s.p_off, I, is_, io, G, gs, s.g_off, self.first_moments, self.second_moments, self.matrix_steps,
            self.param_steps, step.mask, self._steps, self.kernel_array("bias", self._bias_correction()),
            source, cgo, cn, skipped, 1.0 / step.loss_scale, self.learning_rate, self.lr_scale(step),
            h["beta1"], h["beta2"], h["epsilon"], h["l2_reg"], h["non_matrix_l2_reg"],
            h["non_matrix_learning_rate_factor"], h["relative_decay"], h["absolute_decay"],
            h["clipping_magnitude"], h["gradient_clipping_magnitude"], self.n_matrix, s.n)
