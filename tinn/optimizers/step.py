"""One optimizer step as a value, its gate, and the small kernels every optimizer shares.

A top-level ``Optimizer.step()`` builds one :class:`Step` and hands it down through
``_phases(step)`` to every nested optimizer and to ``update(step)``; a wrapper that changes
what its nested optimizer sees (Batched's mask, ExponentialDecay's learning-rate scale) hands
down ``dataclasses.replace(step, ...)``. Nothing is toggled on the optimizer objects.

A step is planned first and then run at one commit point (:func:`tinn.runtime.commit.commit`): ``_phases(step)`` changes nothing
and returns the step's phases, calls that each change state all at once (one kernel launch, their last line) or
can run again (a copy); ``commit`` runs them in order, and once one has run, an interrupt (or any exception)
no longer stops the step: the remaining phases run, then the exception is raised. A step is thus whole or not
taken at all.

Every table in a :class:`Step` is a kernel argument: on the device path a ``ti.ndarray``, so a
device step hands no numpy array to any kernel and reads nothing back.

A network whose update could turn its state non-finite is not stepped (:class:`Gate`): the step's first kernel
(whichever optimizer's it is) first checks every gradient of the networks the caller asked for, and writes the
mask that every phase of the step then reads (``Step.mask``) without them; it counts them in the optimizer's
``skipped`` array. Nothing is read back and no kernel is added.
"""
from dataclasses import dataclass, replace

import taichi as ti

from ..batch import buffers as _buffers
from ..runtime.kernels import ARENA, arena_kernel, at, columns_per_task
from ..runtime.types import I32_1D


@dataclass(frozen=True)
class Step:
    """One step of the networks with ``mask[k] != 0``.

    ``mask``: int32 ``(K,)`` (numpy on the CPU host path, else a ``ti.ndarray``); ``loss_scale``: the
    gradients are divided by it; ``lr_scale``: ``None`` or float32 ``(K,)`` multiplying each network's
    learning rate (a wrapper's schedule); ``publish_to``: ``None`` or ``(field, offset)`` where the
    update also writes each stepped weight (the model's inference weights, instead of a copy after); ``gate``:
    ``None``, or the :class:`Gate` that the step's first kernel evaluates into ``mask`` (a phase that launches that
    kernel hands its later phases ``dataclasses.replace(step, gate=None)``).
    """

    mask: object
    loss_scale: float = 1.0
    lr_scale: object = None
    publish_to: tuple | None = None
    gate: object = None


GRADIENT_BOUND = 2.0 ** 48
"""The largest gradient magnitude (divided by the loss scale) a step applies: its square, and the sum of 2^32 such
squares (a layer's norm, Novograd), stay finite in float32 (``FLT_MAX`` ~ 2^128), so no optimizer's moments,
norms or updates overflow from finite state. A network with a larger, Inf or NaN gradient is not stepped."""


@dataclass(frozen=True)
class Gate:
    """What the first kernel of a step checks: the caller's mask ``source`` (int32 ``(K,)``, the networks to step),
    the gradients ``grads[k, g_off + i]``, ``i < n`` (a field: the top-level optimizer's slot), and ``skipped``, the
    int32 ``(K,)`` count of the updates not applied. It writes ``Step.mask[k] = source[k]`` unless a gradient of
    network ``k`` times ``inv_scale`` is NaN, +-Inf or beyond :data:`GRADIENT_BOUND` (:func:`gate`)."""

    source: object
    grads: object
    g_off: int
    n: int
    skipped: object


def gate_args(step: Step, grads, skipped) -> tuple:
    """``(source, grads, g_off, n, skipped)`` for a first kernel's :func:`gate` (``step.gate``'s), or arguments that
    leave ``step.mask`` as it is (a later kernel: ``source`` is the mask itself, no gradient checked)."""
    g = step.gate
    return (step.mask, grads, 0, 0, skipped) if g is None else (g.source, g.grads, g.g_off, g.n, g.skipped)


def later(step: Step) -> Step:
    """``step`` for the phases after the one that evaluated its gate."""
    return step if step.gate is None else replace(step, gate=None)


@ti.func
def gate(source: ti.template(), G: ti.template(), gs, go, n, inv_scale, mask: ti.template()):
    """The first loops of a step's first kernel: ``mask[k] = source[k]``, then 0 for a network ``k`` with a gradient
    ``G[k, go + i] * inv_scale`` (``i < n``; :func:`~tinn.runtime.kernels.at`'s ``G`` and stride ``gs``) that is
    not within :data:`GRADIENT_BOUND` (NaN and +-Inf included). ``n = 0`` and ``source`` the mask: nothing changes."""
    for k in range(mask.shape[0]):
        mask[k] = source[k]
    C = ti.static(columns_per_task())
    tasks = (n + C - 1) // C
    for t in range(mask.shape[0] * tasks):
        k, c = t // tasks, t % tasks
        if source[k] != 0 and not within_bound(G, gs, k, go + c * C, ti.min(C, n - c * C), inv_scale):
            mask[k] = 0


@ti.func
def within_bound(G: ti.template(), gs, k, go, n, inv_scale) -> ti.i32:
    """Whether every ``G[k, go + i] * inv_scale``, ``i < n``, lies within :data:`GRADIENT_BOUND` (not NaN): the
    largest magnitude's bits against the bound's (an integer maximum, without branches; NaN's bits lie above
    +Inf's)."""
    largest = 0
    for i in range(go, go + n):
        largest = ti.max(largest, ti.bit_cast(at(G, gs, k, i), ti.i32) & 0x7FFFFFFF)
    return largest <= ti.bit_cast(ti.cast(GRADIENT_BOUND / inv_scale, ti.f32), ti.i32)


@ti.func
def count_skipped(source: ti.template(), mask: ti.template(), skipped: ti.template(), k):
    """``skipped[k] += 1`` if network ``k`` was asked for but gated out (saturating; in a kernel's last loop)."""
    skipped[k] = counted(skipped[k], ti.cast(source[k] != 0 and mask[k] == 0, ti.i32))


STEP_LIMIT = 2 ** 30           # the largest step count a checkpoint or state dict may hold
STEP_CEILING = 2 ** 31 - 2     # where counters stop: one below int32's end, so that ``count + 1`` never wraps


@ti.func
def counted(count, stepped):
    """``count + 1`` where ``stepped != 0`` (else ``count``), saturating at ``STEP_CEILING``: a counter never wraps."""
    one = ti.cast(stepped != 0, ti.i32)
    return ti.min(count, STEP_CEILING - one) + one


@arena_kernel
def _count(steps: I32_1D, mask: I32_1D, source: I32_1D, G: ARENA, go: ti.i32, n: ti.i32, skipped: I32_1D,
           inv_scale: ti.f32):
    gate(source, G, 0, go, n, inv_scale, mask)
    for k in range(steps.shape[0]):
        steps[k] = counted(steps[k], mask[k])
        count_skipped(source, mask, skipped, k)


def count_steps(steps, step: Step, grads, skipped):
    """``steps[k] += mask[k]`` (saturating at ``STEP_CEILING``): the per-network step counter, counted where it
    lives; the step's first kernel, if ``step.gate`` is set (``grads``, ``skipped``: the optimizer's, for a later
    one)."""
    _count(steps, step.mask, *gate_args(step, grads, skipped), 1.0 / step.loss_scale)


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
