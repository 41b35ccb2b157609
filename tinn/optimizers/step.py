"""One optimizer step as a value, its commit, and the small kernels every optimizer shares.

A top-level ``Optimizer.step()`` builds one :class:`Step` and hands it down through
``_phases(step)`` to every nested optimizer and to ``update(step)``; a wrapper that changes
what its nested optimizer sees (Batched's mask, ExponentialDecay's learning-rate scale) hands
down ``dataclasses.replace(step, ...)``. Nothing is toggled on the optimizer objects.

A step is planned first and then run at one commit point (:func:`commit`): ``_phases(step)`` changes nothing
and returns the step's phases, calls that each change state all at once (one kernel launch, their last line) or
can run again (a copy); :func:`commit` runs them in order, and once one has run, an interrupt (or any exception)
no longer stops the step: the remaining phases run, then the exception is raised. A step is thus whole or not
taken at all.

Every table in a :class:`Step` is a kernel argument: on the device path a ``ti.ndarray``, so a
device step hands no numpy array to any kernel and reads nothing back.
"""
import _signal                  # signal.signal and signal.getsignal without their enum conversion (~20 us a step)
import threading
from dataclasses import dataclass

import taichi as ti

from ..batch import buffers as _buffers
from ..runtime.types import I32_1D


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


def commit(phases):
    """Run ``phases`` (zero-argument calls, module docstring) as one step: all or, if the first is interrupted, none.

    A ``KeyboardInterrupt`` from a real SIGINT waits until the phases have run (on the main thread, while Python's
    default handler is installed); any exception raised in a phase after the first has run is raised after the
    remaining phases ran."""
    deferred = _defer_sigint()
    done = 0
    try:
        while done < len(phases):
            phases[done](); done += 1                   # noqa: E702 (one line: no interrupt between the two)
    except BaseException:
        while 0 < done < len(phases):
            phases[done](); done += 1                   # noqa: E702
        raise
    finally:
        _resume_sigint(deferred)


_pending = []                   # SIGINTs that arrived during a commit


def _hold(signum, frame):
    _pending.append(signum)


def _defer_sigint() -> bool:
    """Hold SIGINT back (``True``) if this is the main thread and Python's default handler is installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if _signal.getsignal(_signal.SIGINT) not in (_signal.default_int_handler, _hold):
        return False                                    # the user's own handler
    _signal.signal(_signal.SIGINT, _hold)
    return True


def _resume_sigint(deferred: bool):
    """Put the default handler back; a SIGINT held meanwhile raises ``KeyboardInterrupt`` now."""
    if deferred:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        if _pending:
            _pending.clear()
            raise KeyboardInterrupt


STEP_LIMIT = 2 ** 30           # the largest step count a checkpoint or state dict may hold
STEP_CEILING = 2 ** 31 - 2     # where counters stop: one below int32's end, so that ``count + 1`` never wraps


@ti.func
def counted(count, stepped):
    """``count + 1`` where ``stepped != 0`` (else ``count``), saturating at ``STEP_CEILING``: a counter never wraps."""
    one = ti.cast(stepped != 0, ti.i32)
    return ti.min(count, STEP_CEILING - one) + one


@ti.kernel
def _count(steps: I32_1D, mask: I32_1D):
    for k in range(steps.shape[0]):
        steps[k] = counted(steps[k], mask[k])


def count_steps(steps, mask):
    """``steps[k] += mask[k]`` (saturating at ``STEP_CEILING``): the per-network step counter, counted where it
    lives."""
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
