"""A step is whole or not taken, for every optimizer and precision: a Ctrl-C (a ``KeyboardInterrupt`` raised at a
line event of tinn's code, ``interrupts.Interrupt``) anywhere in ``training_step``, ``optimizer_step`` or a numpy
``optimizer.step(params, gradients)`` leaves the trainer (training, master and inference weights, loss scale, all
optimizer state) as it was before the call or as it is after it, and the next step gives exactly what it gives
without the interrupt. By default a spread of line events per optimizer; ``TINN_FULL=1`` on the CPU: every one."""
import os
import signal
from functools import partial

import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.runtime.commit import commit

from conftest import FULL
from interrupts import CFG, Interrupt, batch, line_events

POINTS = 30                     # line events interrupted per case by default (spread over the step)
ADAM = {"otype": "Adam", "learning_rate": 1e-2}
OPTIMIZERS = {
    "SGD": {"otype": "SGD", "learning_rate": 1e-2},
    "Novograd": {"otype": "Novograd", "learning_rate": 1e-2},
    "Shampoo": {"otype": "Shampoo", "learning_rate": 1e-2},
    "EMA": {"otype": "EMA", "decay": 0.9, "nested": ADAM},
    "Average": {"otype": "Average", "n_samples": 3, "nested": ADAM},
    "Batched": {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
    "ExponentialDecay": {"otype": "ExponentialDecay", "decay_base": 0.5, "decay_start": 1, "decay_interval": 1,
                         "nested": {"otype": "SGD", "learning_rate": 1e-2}},
    "Lookahead": {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2, "nested": ADAM},
    "Composite": {"otype": "Composite", "nested": [
        {"otype": "EMA", "decay": 0.9, "nested": {"otype": "SGD", "learning_rate": 1e-2}, "n_params_to_optimize": 256},
        {**ADAM, "n_params_to_optimize": 256}]},
}
CASES = [(name, "float32") for name in OPTIMIZERS] + [("Adam", "float16"), ("EMA", "float16")]


def make(name, precision, seed=3):
    cfg = {**CFG, "optimizer": OPTIMIZERS.get(name, ADAM)}
    return tinn.create_from_config(2, 1, cfg, seed=seed, precision=precision)


def state(m):
    t = m.trainer
    return ([t.params(), t.params_full_precision(), t.params_inference(), np.array(t.loss_scale)] +
            [np.asarray(v) for v in t.optimizer.state_dict().values()] +
            ([np.array(list(t.loss_scaler.state().values()))] if t.loss_scaler else []))


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))


def points(n_events, offset):
    """The line events to interrupt: every one in the full suite on the CPU, else a spread of ``POINTS`` (a step
    through Mesa's software Vulkan driver is slow; the CPU pass covers every event)."""
    if FULL and ti.lang.impl.current_cfg().arch in (ti.x64, ti.arm64):
        return range(1, n_events + 1)
    stride = max(n_events // POINTS, 1)
    return range(1 + offset % stride, n_events + 1, stride)


def sweep(a, ref, call, at_points, state=state):
    """Interrupt ``call`` on ``a`` at each of ``at_points``; ``ref`` (a twin, never interrupted) gives the states
    after 0, 1, 2, ... calls."""
    trajectory = [state(ref)]

    def reference(i):
        while len(trajectory) <= i:
            call(ref)
            trajectory.append(state(ref))
        return trajectory[i]

    i = interrupted = 0
    for at in at_points:
        interrupted += Interrupt(at).run(lambda: call(a))       # (a step may run a few lines fewer than another)
        got = state(a)
        if same(got, reference(i)):                     # not taken: take it now
            call(a)
            got = state(a)
        i += 1
        assert same(got, reference(i)), f"neither the old nor the new state after an interrupt at line event {at}"
    assert interrupted >= 0.9 * len(at_points)


@pytest.mark.parametrize("name,precision", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_interrupted_training_step_is_all_or_nothing(name, precision):
    x, y = batch()

    def step(m):
        m.trainer.training_step(x, y)

    a, ref, warm = make(name, precision), make(name, precision), make(name, precision)
    for m in (a, ref, warm):
        step(m)
    n_events = line_events(lambda: step(warm))
    assert n_events > 50
    sweep(a, ref, step, points(n_events, len(name)))


@pytest.mark.parametrize("name,precision", [("EMA", "float32"), ("Composite", "float32"), ("Adam", "float16")])
def test_interrupted_optimizer_step_is_all_or_nothing(name, precision):
    """``optimizer_step`` alone (after one backward pass: the same gradients every time)."""
    x, y = batch()
    a, ref, warm = make(name, precision), make(name, precision), make(name, precision)
    for m in (a, ref, warm):
        m.trainer.training_step(x, y)
        m.trainer.backward(m.trainer.forward(x, y))
    n_events = line_events(lambda: warm.trainer.optimizer_step())
    sweep(a, ref, lambda m: m.trainer.optimizer_step(), points(n_events, 1))


@pytest.mark.parametrize("name", ["EMA", "ExponentialDecay", "Shampoo"])
def test_interrupted_numpy_step_is_all_or_nothing(name):
    """``optimizer.step(params, gradients)``: the caller's array and the optimizer's state change together."""
    grads = np.random.default_rng(1).normal(size=(2, 48)).astype(np.float32)

    class Arrays:                                   # a bare optimizer and the caller's parameters
        def __init__(self):
            self.optimizer = tinn.create_optimizer(OPTIMIZERS[name])
            self.params = np.random.default_rng(0).normal(size=(2, 48)).astype(np.float32)
            self.optimizer.allocate(48, [(6, 8)], 2)
            self.optimizer.step(self.params, grads)

    def call(s):
        s.optimizer.step(s.params, grads)

    def arrays_state(s):
        return [s.params.copy()] + [np.asarray(v) for v in s.optimizer.state_dict().values()]

    warm = Arrays()
    n_events = line_events(lambda: call(warm))
    sweep(Arrays(), Arrays(), call, points(n_events, 2), arrays_state)


def test_a_commit_runs_whole_or_not_at_all_and_holds_a_real_sigint_to_its_end():
    ran, failed = [], set()

    def phase(i, fail=None):
        if fail == "before" and i not in failed:
            failed.add(i)
            raise KeyboardInterrupt                 # as a Ctrl-C before the phase changed anything (once)
        ran.append(i)
        if fail == "sigint":
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        commit([partial(phase, 0, "before"), partial(phase, 1)])
    assert ran == []                                # the first phase interrupted: nothing taken
    failed.clear()
    with pytest.raises(KeyboardInterrupt):
        commit([partial(phase, 0), partial(phase, 1, "before"), partial(phase, 2)])
    assert ran == [0, 1, 2]                         # after the first: the rest runs, then the interrupt
    ran.clear()
    # Python's own SIGINT handler, as in a terminal (a job that its shell started in the background, as CI's are,
    # inherits SIGINT ignored, and Python then installs no handler: a Ctrl-C cannot reach it there)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            commit([partial(phase, 0, "sigint"), partial(phase, 1), partial(phase, 2)])
        assert ran == [0, 1, 2]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
