"""Losses (tcnn ``losses/*.h``).

``Loss.evaluate(prediction, target, pdf=None)`` returns ``(loss, dL_dprediction)``.
``prediction`` is ``(B, P)`` with ``P >= D`` (padded network outputs are allowed),
``target`` and the optional importance-sampling ``pdf`` are ``(B, D)``. Per element,
with ``N = B * D`` and ``q`` the pdf (1 without one)::

    value = l(p, t) / (q * N),     gradient = loss_scale * dl/dp (p, t) / (q * N)

Padded columns get value and gradient 0. The loss is the sum of all values, i.e. the
mean per-element loss. Each loss below only supplies ``l`` and ``dl/dp`` as a ``ti.func``
``terms(p, t, q, c) -> (l, dl/dp)``; ``c`` is an optional per-sample quantity computed
from the whole prediction row (RelativeL2Luminance's luminance), ``q`` is only needed by
Variance. Denominators that tcnn treats as constants (RelativeL2's ``p^2 + 0.01``,
RelativeL1's, Smape's, the luminance) are constants here too, so those gradients are
*not* the derivative of the value. No loss has JSON keys.

``target`` and ``pdf`` must be finite and ``pdf > 0``: anything else is a ``ValueError`` naming
the first offending row, before any kernel runs. A non-finite ``prediction`` (a diverged
network) is not an error: it gives a non-finite loss, as in tcnn.
"""

import numpy as np
import taichi as ti

from .batch.batch import Batch, as_batch, callers_kind, callers_loss
from .batch.loss_value import sums_of
from .keys import Options
from .object import Object
from .registry import losses
from .runtime.program import RuntimeBound, is_cpu
from .runtime.kernels import specialised
from .runtime.types import F32_1D, F32_2D, I32_1D

ROWS_PER_TASK = 256
"""Samples per task of the loss kernel on the CPU, summed in a register before one atomic add (16 on GPUs)."""


@specialised
def _kernel(cls, rows_per_task: int):
    terms = cls.terms()
    has_context = cls.context is not None
    context = cls.context() if has_context else None

    @ti.func
    def row(pred: ti.template(), target: ti.template(), pdf: ti.template(), weighted: ti.template(), inv_n,
            loss_scale, grad: ti.template(), b):
        """Sample b's value and gradients (``grad[b, :]``, padded columns 0); returns its loss."""
        D, P = target.shape[1], pred.shape[1]
        acc = 0.0
        c = 0.0
        if ti.static(has_context):
            c = context(pred, b, D)
        for d in range(D):
            q = pdf[b, d] if ti.static(weighted) else 1.0
            scale = inv_n / q
            value, slope = terms(pred[b, d], target[b, d], q, c)
            acc += value * scale
            grad[b, d] = loss_scale * slope * scale
        for d in range(D, P):
            grad[b, d] = 0.0
        return acc

    @ti.kernel
    def evaluate(pred: F32_2D, target: F32_2D, pdf: F32_2D, weighted: ti.template(), ids: I32_1D,
                 routed: ti.template(), inv: F32_1D, loss_scale: ti.f32, grad: F32_2D, rows: F32_1D,
                 on_device: ti.template(), sums: F32_1D, n_tasks: ti.i32):
        """Per sample b of network k = ids[b]: the loss ``sum_d l(p, t) * inv[k] / q`` and its gradient. On the
        host every sample's loss goes to ``rows``; on the device (``on_device``) they are summed per network into
        ``sums`` (``rows_per_task`` samples per task, one atomic add per run of one network)."""
        B = pred.shape[0]
        if ti.static(not on_device):
            for b in range(B):
                k = ids[b] if ti.static(routed) else 0
                rows[b] = row(pred, target, pdf, weighted, inv[k], loss_scale, grad, b)
        else:
            for k in range(sums.shape[0]):
                sums[k] = 0.0
            for task in range(n_tasks):                  # ceil(B / rows_per_task), from the host (SPIR-V)
                acc, current = 0.0, 0
                for b in range(task * rows_per_task, ti.min(task * rows_per_task + rows_per_task, B)):
                    k = ids[b] if ti.static(routed) else 0
                    if k != current:
                        ti.atomic_add(sums[current], acc)
                        acc, current = 0.0, k
                    acc += row(pred, target, pdf, weighted, inv[k], loss_scale, grad, b)
                ti.atomic_add(sums[current], acc)

    return evaluate


class Loss(Object, RuntimeBound):
    """A per-element loss; subclasses give ``terms() -> ti.func (p, t, q, c) -> (value, dvalue/dp)``.

    ``context``, if not None, is a factory of a ``ti.func (prediction, b, D) -> f32`` evaluated once
    per sample; its result is the ``c`` passed to ``terms``. ``min_dims`` is the least target width.
    """

    context = None
    min_dims = 1

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
        """``(loss, dL_dprediction)``: the mean per-element loss and its gradient, shaped like ``prediction``
        (and of its kind: numpy, or ``ti.ndarray``).

        For a network array pass the samples' ``instance`` ids (of ``n_instances`` networks; the largest id + 1
        by default): every network is then normalised by its own sample count, and ``per_instance=True`` also
        returns the ``(n_instances,)`` per-network losses (0 for networks without samples).
        """
        self._check_runtime()
        t = as_batch(target, None, "target", finite=True)
        p = as_batch(prediction, None, "prediction")
        if p.shape[0] != t.shape[0] or p.shape[-1] < t.shape[-1]:
            raise ValueError(f"prediction {p.shape} and target {t.shape} do not match: need the same batch and "
                             "at least as many prediction columns as target columns")
        self._check_width(t.shape[-1])
        q = None if pdf is None else as_batch(pdf, t.shape[-1], "pdf", positive=True)
        if q is not None and q.shape != t.shape:
            raise ValueError(f"pdf must have the target's shape {t.shape}, got {q.shape}")
        batch = Batch.of(p, instance, 1 if instance is None else n_instances)
        loss, grad, per_network = self._evaluate(p, t, q, batch, loss_scale)
        loss, per_network = callers_loss(loss, per_network, prediction)
        grad = callers_kind(grad, prediction)
        return (loss, grad, per_network) if per_instance else (loss, grad)

    def _check_width(self, dims: int):
        """``ValueError`` unless targets of ``dims`` columns are enough for this loss (``min_dims``)."""
        if dims < self.min_dims:
            raise ValueError(f"loss '{self.otype}' needs targets with at least {self.min_dims} dims, got {dims}")

    def _evaluate(self, p, t, q, batch: Batch, loss_scale):
        """``(loss, gradient, per-network losses)`` of checked ``(size, P)`` predictions ``p``, ``(size, D)`` targets
        ``t`` and pdf ``q`` (or ``None``) of ``batch``'s kind (on the device the per-network losses are read when
        someone reads them: :class:`~tinn.batch.loss_value.PerNetwork`).

        With a routed batch, each network's samples are normalised by that network's own
        ``N_k = B_k * D``, so a network in an array gets exactly the gradient it would get
        trained alone; the loss is then the mean of the per-network losses. A dense batch
        (network k owns the k-th of K equal runs of samples) is the same with equal counts. A chunk
        of a larger batch (``batch.routing.whole``) is normalised by the whole batch's counts, so the
        chunks' losses and gradients add up to the whole batch's.

        One path for every batch: the batch's loss sums (``tinn.batch.loss_value.sums_of``) give the normalisers,
        say where the kernel leaves the losses and how they become the loss: on the host per sample, then per
        network in float64; on the device the kernel's own per-network sums, and the loss is a
        :class:`~tinn.batch.loss_value.LossValue`, read when someone reads it (a trainer's step's batch has a census:
        reading the loss reports what the census found, ``tinn.batch.faults``).
        """
        B, D = t.shape
        ops, weighted = batch.ops, q is not None
        sums_kind = sums_of(batch)
        (inv, rows, sums), (ids, routed) = sums_kind.arrays(B, D), batch.kernel_ids()
        q = ops.unused((1, 1), np.float32) if q is None else q
        grad = ops.empty_like(p)
        per_task = ROWS_PER_TASK if is_cpu() else 16
        _kernel(type(self), per_task)(p, t, q, weighted, ids, routed, inv, float(loss_scale), grad, rows,
                                      batch.on_device, sums, -(-B // per_task))
        loss, per_network = sums_kind.losses(rows, sums)
        return loss, grad, per_network


def _loss(name: str, doc: str, **attrs):
    """Register a loss class whose ``terms`` is the decorated factory (``attrs``: ``context``, ``min_dims``)."""
    def deco(terms):
        attrs.update(otype=name, terms=staticmethod(terms), __doc__=doc)
        if attrs.get("context") is not None:
            attrs["context"] = staticmethod(attrs["context"])
        cls = type(name + "Loss", (Loss,), attrs)
        losses.register(name)(cls)
        return cls
    return deco


@ti.func
def squared_error(p, t):
    """``((p - t)^2, 2 (p - t))``: the value and derivative the L2 family divides by its denominator."""
    return (p - t) ** 2, 2.0 * (p - t)


@ti.func
def absolute_error(p, t):
    """``(|p - t|, sign(p - t))`` with copysign's +1 at 0: the L1 family's numerators."""
    return ti.abs(p - t), ti.select(p - t >= 0.0, 1.0, -1.0)


@_loss("L2", "``(p - t)^2``; gradient ``2 (p - t)``.")
def L2Loss():
    @ti.func
    def terms(p, t, q, c):
        return squared_error(p, t)
    return terms


@_loss("L1", "``|p - t|``; gradient ``sign(p - t)`` (+1 at 0, as copysign).")
def L1Loss():
    @ti.func
    def terms(p, t, q, c):
        return absolute_error(p, t)
    return terms


@_loss("RelativeL2", "``(p - t)^2 / (p^2 + 0.01)``; gradient ``2 (p - t) / (p^2 + 0.01)`` (denominator constant).")
def RelativeL2Loss():
    @ti.func
    def terms(p, t, q, c):
        value, slope = squared_error(p, t)
        denom = p * p + 0.01
        return value / denom, slope / denom
    return terms


@_loss("RelativeL1", "``|p - t| / (|p| + 0.01)``; gradient ``sign(p - t) / (|p| + 0.01)`` (denominator constant).")
def RelativeL1Loss():
    @ti.func
    def terms(p, t, q, c):
        value, slope = absolute_error(p, t)
        denom = ti.abs(p) + 0.01
        return value / denom, slope / denom
    return terms


@_loss("Mape", "Mean absolute percentage error ``|p - t| / (|t| + 0.01)``; gradient ``sign(p - t) / (|t| + 0.01)``.")
def MapeLoss():
    @ti.func
    def terms(p, t, q, c):
        value, slope = absolute_error(p, t)
        denom = ti.abs(t) + 0.01
        return value / denom, slope / denom
    return terms


@_loss("Smape", "Symmetric MAPE ``|p - t| / ((|t| + |p|) / 2 + 0.01)``; gradient ``sign(p - t)`` over the same "
                "(constant) denominator.")
def SmapeLoss():
    @ti.func
    def terms(p, t, q, c):
        value, slope = absolute_error(p, t)
        denom = 0.5 * (ti.abs(t) + ti.abs(p)) + 0.01
        return value / denom, slope / denom
    return terms


def _luminance():
    @ti.func
    def luminance(pred: ti.template(), b, D):
        """0.299 r + 0.587 g + 0.114 b of the prediction row; with D >= 6, (r, g, b) = (p0 + p3, p1 + p4, p2 + p5)."""
        r, g, bl = pred[b, 0], pred[b, 1], pred[b, 2]
        if D >= 6:
            r, g, bl = r + pred[b, 3], g + pred[b, 4], bl + pred[b, 5]
        return 0.299 * r + 0.587 * g + 0.114 * bl
    return luminance


@_loss("RelativeL2Luminance", "``(p - t)^2 / (Lum^2 + 0.01)``, Lum the luminance of the sample's predicted colour "
                              "(its first 3 dims, or dims 0-2 plus 3-5 when D >= 6); gradient ``2 (p - t) / "
                              "(Lum^2 + 0.01)`` (Lum constant). Needs D >= 3.", context=_luminance, min_dims=3)
def RelativeL2LuminanceLoss():
    @ti.func
    def terms(p, t, q, c):
        value, slope = squared_error(p, t)
        denom = c * c + 0.01
        return value / denom, slope / denom
    return terms


@_loss("CrossEntropy", "``-t ln(p)``; gradient ``-t / p``. Expects p > 0 (no softmax, no clamping).")
def CrossEntropyLoss():
    @ti.func
    def terms(p, t, q, c):
        return -t * ti.log(p), -t / p
    return terms


@_loss("Variance", "Importance-sampling variance (Neural Importance Sampling): ``t^2 (1/p - 1/q)``, so the "
                   "stored value is ``t^2 / (q N) (1/p - 1/q)``; gradient ``-t^2 / p^2``. Expects p > 0.")
def VarianceLoss():
    @ti.func
    def terms(p, t, q, c):
        return t * t * (1.0 / p - 1.0 / q), -t * t / (p * p)
    return terms
