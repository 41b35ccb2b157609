"""Losses (tcnn ``losses/*.h``, spec §3).

``Loss.evaluate(prediction, target, pdf=None)`` returns ``(loss, dL_dprediction)``.
``prediction`` is ``(B, P)`` with ``P >= D`` (padded network outputs are allowed),
``target`` and the optional importance-sampling ``pdf`` are ``(B, D)``. Per element,
with ``N = B * D`` and ``q`` the pdf (1 without one)::

    value = l(p, t) / (q * N),     gradient = loss_scale * dl/dp (p, t) / (q * N)

Padded columns get value and gradient 0. The loss is the sum of all values, i.e. the
mean per-element loss. Each loss below only supplies ``l`` and ``dl/dp``; denominators
that tcnn treats as constants (RelativeL2's ``p^2 + 0.01``) are constants here too.
"""

import functools

import numpy as np
import taichi as ti

from ._runtime import RuntimeBound, to_numpy, as_batch, as_instances, current_program
from .config import Options, losses
from .object import Object

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)


@functools.lru_cache(maxsize=None)
def _kernel(program, cls):
    terms = cls.terms()

    @ti.kernel
    def evaluate(pred: _f32_2d, target: _f32_2d, pdf: _f32_2d, weighted: ti.template(), inv_n: _f32_1d,
                 loss_scale: ti.f32, grad: _f32_2d, row_loss: _f32_1d):
        B, D, P = pred.shape[0], target.shape[1], pred.shape[1]
        for b in range(B):
            acc = 0.0
            for d in range(D):
                scale = inv_n[b] / pdf[b, d] if ti.static(weighted) else inv_n[b]
                value, slope = terms(pred[b, d], target[b, d])
                acc += value * scale
                grad[b, d] = loss_scale * slope * scale
            for d in range(D, P):
                grad[b, d] = 0.0
            row_loss[b] = acc

    return evaluate


class Loss(Object, RuntimeBound):
    """A per-element loss; subclasses give ``terms() -> ti.func (p, t) -> (value, dvalue/dp)``."""

    def __init__(self):
        self._bind_runtime()

    @classmethod
    def from_config(cls, config, *, otype=None):
        opt = Options("loss", otype or cls.otype, config)
        opt.done()
        return cls()

    def hyperparams(self):
        return {"otype": self.otype}

    def update_hyperparams(self, config: dict):
        """Losses have no hyperparameters (as in tcnn)."""

    @staticmethod
    def terms():
        raise NotImplementedError

    def evaluate(self, prediction, target, pdf=None, *, instance=None, n_instances: int | None = None,
                 per_instance: bool = False, loss_scale: float = 1.0):
        """``(loss, dL_dprediction)``: the mean per-element loss and its gradient, shaped like ``prediction``.

        For a network array pass the samples' ``instance`` ids: every network is then
        normalised by its own sample count, and ``per_instance=True`` also returns the
        ``(n_instances,)`` per-network losses (0 for networks without samples).
        """
        self._check_runtime()
        t = as_batch(target, None, "target")
        p = as_batch(prediction, None, "prediction")
        if p.shape[0] != t.shape[0] or p.shape[1] < t.shape[1]:
            raise ValueError(f"prediction {p.shape} and target {t.shape} do not match: need the same batch and "
                             "at least as many prediction columns as target columns")
        q = np.ones((1, 1), np.float32) if pdf is None else as_batch(pdf, t.shape[1], "pdf")
        if pdf is not None and q.shape != t.shape:
            raise ValueError(f"pdf must have the target's shape {t.shape}, got {q.shape}")
        if instance is not None:
            n_instances = n_instances or int(np.max(to_numpy(instance, 'instance'))) + 1
        inst = None if instance is None else as_instances(instance, p.shape[0], n_instances)
        loss, grad, per_network = self._evaluate(p, t, q, pdf is not None, loss_scale, inst, n_instances or 1)
        if not per_instance:
            return loss, grad
        return loss, grad, per_network if per_network is not None else np.array([loss])

    def _evaluate(self, p, t, q, weighted, loss_scale, instance, n_instances=1):
        """``(loss, gradient, per-network losses or None)``.

        With ``instance``, each network's samples are normalised by that network's own
        ``N_k = B_k * D``, so a network in an array gets exactly the gradient it would get
        trained alone; the loss is then the mean of the per-network losses.
        """
        B, D = t.shape
        if instance is None:
            counts, inv_n = None, np.full(B, 1.0 / (B * D), np.float32)
        else:
            counts = np.bincount(instance, minlength=n_instances)
            inv_n = (1.0 / (counts[instance] * D)).astype(np.float32)
        grad = np.empty_like(p)
        rows = np.empty(B, np.float32)
        _kernel(current_program(), type(self))(p, t, q, weighted, inv_n, float(loss_scale), grad, rows)
        if counts is None:
            return float(rows.sum(dtype=np.float64)), grad, None
        per_network = np.bincount(instance, weights=rows, minlength=n_instances)
        return float(per_network.sum() / np.count_nonzero(counts)), grad, per_network


def _loss(name: str, doc: str):
    """Register a loss class whose ``terms`` is the decorated factory."""
    def deco(terms):
        cls = type(name + "Loss", (Loss,), {"otype": name, "terms": staticmethod(terms), "__doc__": doc})
        losses.register(name)(cls)
        return cls
    return deco


@_loss("L2", "``(p - t)^2``; gradient ``2 (p - t)``.")
def L2Loss():
    @ti.func
    def terms(p, t):
        return (p - t) ** 2, 2.0 * (p - t)
    return terms


@_loss("L1", "``|p - t|``; gradient ``sign(p - t)`` (+1 at 0, as copysign).")
def L1Loss():
    @ti.func
    def terms(p, t):
        return ti.abs(p - t), ti.select(p - t >= 0.0, 1.0, -1.0)
    return terms


@_loss("RelativeL2", "``(p - t)^2 / (p^2 + 0.01)``; gradient ``2 (p - t) / (p^2 + 0.01)`` (denominator constant).")
def RelativeL2Loss():
    @ti.func
    def terms(p, t):
        denom = p * p + 0.01
        return (p - t) ** 2 / denom, 2.0 * (p - t) / denom
    return terms
