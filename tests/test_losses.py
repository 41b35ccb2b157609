"""Losses against the formulas of spec §3: value l(p, t) / (q N), gradient dl/dp / (q N), N = B * D.

The reference is ``tests/reference.py`` ``loss_ref``; every registered loss is also swept in
``tests/test_registry_sweep.py``.
"""
import numpy as np
import pytest

import tinn
from reference import loss_ref as reference


@pytest.mark.parametrize("otype", ["L2", "L1", "RelativeL2"])
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_matches_formula(otype, weighted, rng):
    B, D, P = 37, 3, 16
    pred = rng.normal(size=(B, P)).astype(np.float32)
    target = rng.normal(size=(B, D)).astype(np.float32)
    pdf = rng.uniform(0.5, 2.0, size=(B, D)).astype(np.float32) if weighted else None
    loss = tinn.create_loss({"otype": otype})
    value, grad = loss.evaluate(pred, target, pdf)
    ref_value, ref_grad = reference(otype, pred[:, :D], target, pdf if weighted else np.ones_like(target))
    assert value == pytest.approx(ref_value.sum(), rel=1e-5)
    np.testing.assert_allclose(grad[:, :D], ref_grad, rtol=1e-5, atol=1e-9)
    assert grad.shape == pred.shape
    assert not grad[:, D:].any(), "padded output columns get no gradient"


@pytest.mark.parametrize("otype", ["L2", "L1"])
def test_loss_gradient_is_derivative_of_value(otype, rng):
    """The reported gradient is d(loss)/dp: central differences of the float64 reference."""
    B, D = 5, 3
    pred = rng.normal(size=(B, D))
    target = rng.normal(size=(B, D))
    ones = np.ones((B, D))
    _, grad = tinn.create_loss({"otype": otype}).evaluate(pred.astype(np.float32), target.astype(np.float32))
    h = 1e-6
    fd = np.zeros_like(pred)
    for idx in np.ndindex(pred.shape):
        plus, minus = pred.copy(), pred.copy()
        plus[idx] += h
        minus[idx] -= h
        fd[idx] = (reference(otype, plus, target, ones)[0].sum() - reference(otype, minus, target, ones)[0].sum()) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-7)


def test_relative_l2_treats_denominator_as_constant(rng):
    """tcnn's RelativeL2 gradient omits the derivative of p^2 + 0.01 (spec §3.2)."""
    pred = np.array([[0.5]], np.float32)
    target = np.array([[0.2]], np.float32)
    _, grad = tinn.create_loss({"otype": "RelativeL2"}).evaluate(pred, target)
    assert grad[0, 0] == pytest.approx(2 * 0.3 / (0.25 + 0.01), rel=1e-6)


def test_loss_names_are_case_insensitive():
    assert tinn.create_loss({"otype": "relativel2"}).hyperparams() == {"otype": "RelativeL2"}
    assert tinn.create_loss({}).hyperparams() == {"otype": "RelativeL2"}


@pytest.mark.parametrize("layout", ["routed", "dense"])
def test_host_and_device_normalisers_are_twins(layout, rng):
    """The loss normaliser ``1 / (B_k D)`` has a host form (numpy, ``loss_value.normalisers``) and a device twin
    (``loss_value.normaliser``, written by a step's census): both give each network of an array 1 / (its samples
    x D), and 0 to a network without samples."""
    import taichi as ti
    from tinn.batch.batch import Batch
    from tinn.batch.buffers import put
    from tinn.batch.census import Request
    from tinn.batch.loss_value import normalisers
    K, D = 4, 3
    if layout == "routed":
        ids = rng.integers(0, K - 1, 50).astype(np.int32)           # the last network gets no sample
        x = rng.random((50, 2), dtype=np.float32)
        counts = np.bincount(ids, minlength=K)
    else:
        ids, x, counts = None, rng.random((K, 6, 2), dtype=np.float32), np.full(K, 6)
    want = np.array([1.0 / (c * D) if c else 0.0 for c in counts])
    np.testing.assert_allclose(normalisers(Batch.of(x, ids, K).routing, D), want, rtol=1e-6)
    device = Batch.of(put(x), None if ids is None else put(ids, ti.i32), K, census=Request(D))
    np.testing.assert_allclose(device.census.inv.to_numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("call", ["training_step", "forward"])
def test_a_step_refuses_targets_narrower_than_the_loss_needs(call):
    """Luminance losses read three target columns (``min_dims``): a trainer's step refuses two, as
    ``Loss.evaluate`` does, before anything runs (no parameter changes)."""
    config = {"loss": {"otype": "RelativeL2Luminance"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
              "encoding": {"otype": "Identity"}, "network": {"otype": "CutlassMLP", "n_neurons": 16,
                                                            "n_hidden_layers": 1}}
    model = tinn.create_from_config(2, 2, config, seed=0)
    x = np.random.default_rng(0).random((64, 2), dtype=np.float32)
    before = model.network.params().copy()
    with pytest.raises(ValueError, match="needs targets with at least 3 dims, got 2"):
        getattr(model.trainer, call)(x, x)
    with pytest.raises(ValueError, match="needs targets with at least 3 dims, got 2"):
        model.loss.evaluate(x, x)
    assert np.array_equal(model.network.params(), before)
