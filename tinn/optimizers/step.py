"""One optimizer step as a value, and the small kernels every optimizer shares.

A top-level ``Optimizer.step()`` builds one :class:`Step` and hands it down through
``_advance(step)`` to every nested optimizer and to ``update(step)``; a wrapper that changes
what its nested optimizer sees (Batched's mask, ExponentialDecay's learning-rate scale) hands
down ``dataclasses.replace(step, ...)``. Nothing is toggled on the optimizer objects.

Every table in a :class:`Step` is a kernel argument: on the device path a ``ti.ndarray``, so a
device step hands no numpy array to any kernel and reads nothing back.
"""
from dataclasses import dataclass

import numpy as np
import taichi as ti

from .. import _buffers
from .._types import I32_1D


@dataclass(frozen=True)
class Step:
    """One step of the networks with ``mask[k] != 0``.

    ``mask``: int32 ``(K,)`` (numpy on the CPU host path, else a ``ti.ndarray``); ``loss_scale``: the
    gradients are divided by it; ``lr_scale``: ``None`` or float32 ``(K,)`` multiplying each network's
    learning rate (a wrapper's schedule); ``publish_to``: ``None`` or ``(field, offset)`` where the
    update also writes each stepped weight (the model's inference weights, instead of a copy after).
    """

    mask: object
    loss_scale: float = 1.0
    lr_scale: object = None
    publish_to: tuple | None = None


def host_mask(n_instances: int, active) -> np.ndarray:
    """int32 ``(n_instances,)``: 1 for the network ids listed in ``active`` (all for ``None``)."""
    if active is None:
        return np.ones(n_instances, np.int32)
    ids = np.asarray(active)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)) or (
            ids.size and (ids.min() < 0 or ids.max() >= n_instances)):
        raise ValueError(f"active must be a list of network ids in [0, {n_instances}), got {active!r}")
    mask = np.zeros(n_instances, np.int32)
    mask[ids.astype(np.int64)] = 1
    return mask


def check_device_mask(mask, n_instances: int):
    """Refuse a ``ti.ndarray`` ``active`` that is not an int32 ``(n_instances,)`` mask."""
    if mask.dtype != ti.i32 or tuple(mask.shape) != (n_instances,):
        raise ValueError(f"a device 'active' must be an int32 mask of shape ({n_instances},), "
                         f"got {mask.dtype} {tuple(mask.shape)}")


@ti.kernel
def _count(steps: I32_1D, mask: I32_1D):
    for k in range(steps.shape[0]):
        steps[k] += mask[k]


def count_steps(steps, mask):
    """``steps[k] += mask[k]``: the per-network step counter, counted where it lives."""
    _count(steps, mask)


def new_counter(n_instances: int):
    """A zeroed int32 ``(n_instances,)`` kernel array for step counts (a ``ti.ndarray`` on both paths)."""
    return _buffers.buffer((n_instances,), ti.i32)


@ti.func
def one_minus_pow(beta, T):
    """``1 - beta^T`` without the cancellation of ``1 - pow(beta, T)`` for ``beta`` near 1: ``-expm1(T
    log1p(beta - 1))``, both by their series while small (``beta - 1`` is exact in float32). A GPU's
    ``pow`` is not correctly rounded, and the cancellation multiplies its error by ``1 / (1 - beta^T)``."""
    d = beta - 1.0
    u = T * ti.log(beta)
    if ti.abs(d) < 1e-2:
        u = T * (d * (1.0 - d * (0.5 - d * (1.0 / 3.0 - 0.25 * d))))
    r = 1.0 - ti.exp(u)
    if ti.abs(u) < 1e-2:
        r = -u * (1.0 + u * (0.5 + u * (1.0 / 6.0 + u / 24.0)))
    return ti.select(T == 0.0, 0.0, r)                  # beta^0 = 1, also for beta = 0
