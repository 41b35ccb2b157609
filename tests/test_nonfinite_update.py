"""A step whose update could turn a network's state non-finite is not applied to that network: a valid but tiny
``pdf`` (1e-30 in one element) makes its gradients overflow while the loss stays finite. The network keeps its
parameters, inference weights and every optimizer state array bit for bit, the other networks of an array step
exactly as when it is left out, and ``trainer.skipped_updates()`` counts it (``tinn.optimizers.step.Gate``)."""
import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.optimizers.adam import WHOLE_NETWORKS
from tinn.optimizers.step import GRADIENT_BOUND

from conftest import sample
from interrupts import CFG
from test_interrupted_steps import OPTIMIZERS

ADAM = {"otype": "Adam", "learning_rate": 1e-2}
NAMES = ["Adam"] + list(OPTIMIZERS)
BAD = 1                                     # the network whose gradients blow up (network 0 for K = 1)


def make(name, K, precision="float32"):
    cfg = {**CFG, "optimizer": OPTIMIZERS.get(name, ADAM)}
    return tinn.create_from_config(2, 1, cfg, seed=5, n_instances=K, precision=precision).trainer


def state(t):
    return ([t.params(), t.params_inference(), t.params_full_precision()] +
            [np.asarray(v) for v in t.optimizer.state_dict().values()])


def assert_same(a, b):
    assert len(a) == len(b)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p, q)


def batch(K, n=48, seed=0):
    r = np.random.default_rng(seed)
    x, y = r.random((n * K, 2), dtype=np.float32), r.random((n * K, 1), dtype=np.float32)
    ids = np.repeat(np.arange(K, dtype=np.int32), n)
    return x, y, (ids if K > 1 else None), np.ones((n * K, 1), np.float32)


def device(a):
    if a is None:
        return None
    out = ti.ndarray(ti.i32 if a.dtype == np.int32 else ti.f32, a.shape)
    out.from_numpy(a)
    return out


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("name", sample(NAMES, 3))
def test_a_blown_up_network_keeps_its_state_and_the_others_step(name, where, K, request):
    if where == "device":
        request.getfixturevalue("device_path")
    kind = device if where == "device" else (lambda a: a)
    x, y, ids, pdf = batch(K)
    bad_network = BAD if K > 1 else 0
    tiny = pdf.copy()
    tiny[np.flatnonzero(ids == bad_network)[3] if K > 1 else 3, 0] = 1e-30
    a, b = make(name, K), make(name, K)
    for t in (a, b):                            # a good step first: moments, counts and averages not all zero
        t.training_step(*(kind(v) for v in (x, y, ids, pdf)))
    before = state(a)
    loss = a.training_step(*(kind(v) for v in (x, y, ids, tiny)))
    assert np.isfinite(float(loss)) and float(loss) > 1e20                 # the loss is finite, its gradients not
    if K == 1:
        assert_same(state(a), before)
    else:                                       # the same gradients for the others, the bad network left out
        ctx = b.forward(*(kind(v) for v in (x, y, ids, pdf)))
        b.backward(ctx)
        b.optimizer_step(active=[k for k in range(K) if k != bad_network])
        assert_same(state(a), state(b))
    expected = np.zeros(K, np.int64)
    expected[bad_network] = 1
    np.testing.assert_array_equal(a.skipped_updates(), expected)
    assert np.isfinite(state(a)[0]).all()
    a.training_step(*(kind(v) for v in (x, y, ids, pdf)))                  # training goes on
    assert np.isfinite(a.params()).all() and a.optimizer.step_counts()[bad_network] >= 1 or name == "Batched"


NUMPY_CASES = [(n, 4) for n in NAMES if n != "Composite"] + [("Adam", WHOLE_NETWORKS)]  # (Composite: a model's)


@pytest.mark.parametrize("name,K", sample(NUMPY_CASES, 3, keep=[0, len(NUMPY_CASES) - 1]))
def test_numpy_step_leaves_a_network_with_a_non_finite_gradient(name, K):
    """``optimizer.step(params, gradients)``: the rows with an Inf, a NaN or a gradient beyond the bound are left
    as they were (two steps: Shampoo's matrices and Batched's pool step on the second); the good rows step as they
    do without the bad ones (``WHOLE_NETWORKS``: Adam's task per network on the CPU)."""
    r = np.random.default_rng(1)
    params = r.standard_normal((K, 512)).astype(np.float32)
    grads = r.standard_normal((K, 512)).astype(np.float32)
    good = params.copy()
    opt = tinn.create_optimizer(OPTIMIZERS.get(name, ADAM))
    for _ in range(2):
        opt.step(good, grads)
    grads[1, 5], grads[2, 7], grads[3, 0] = np.inf, np.nan, np.float32(GRADIENT_BOUND) * 2
    grads[0, 9] = np.float32(GRADIENT_BOUND)                # on the bound: stepped
    good_row0 = params[0].copy()
    before = params.copy()
    opt = tinn.create_optimizer(OPTIMIZERS.get(name, ADAM))
    for _ in range(2):
        opt.step(params, grads)
    np.testing.assert_array_equal(params[1:4], before[1:4])
    np.testing.assert_array_equal(params[4:], good[4:])
    np.testing.assert_array_equal(opt.skipped_updates(), [0, 2, 2, 2] + [0] * (K - 4))
    assert np.isfinite(params[0]).all() and not np.array_equal(params[0], good_row0)


def test_float16_overflow_is_still_the_loss_scales():
    """A float16 model's overflowing step is skipped by its loss scale (halved), not counted as a gated update."""
    t = make("Adam", 1, "float16")
    x, y, _, pdf = batch(1)
    pdf[3, 0] = 1e-30
    before, scale = state(t), t.loss_scale
    t.training_step(x, y, pdf=pdf)
    assert_same(state(t), before)
    assert t.loss_scaler.skipped == 1 and t.loss_scale == scale / 2
    np.testing.assert_array_equal(t.skipped_updates(), [0])
