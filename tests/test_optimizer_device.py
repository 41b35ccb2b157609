"""Optimizers bound at allocate, stepped with a mask that lives on the device.

Every registered optimizer (wrappers around Adam included) steps a 3-network array of a hash grid
and an MLP under changing masks: on the forced device path with an int32 ``ti.ndarray`` mask it hands
no numpy array to any kernel and reads nothing back (Shampoo, a host computation, excepted), and it
ends bit-identical to the CPU host path stepped with the same networks as host ids. An all-zero mask
leaves every parameter and every state array, step counts included, as it was, even under NaN
gradients.
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import SMALL_GRID
from tinn.batch import buffers as _buffers
from tinn.runtime.probe import counting
from tinn.registry import optimizers

K = 3
ENCODING = SMALL_GRID
NETWORK = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1}
MASKS = [[1, 1, 1], [0, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1], [1, 1, 0]]
ADAM = {"otype": "Adam", "learning_rate": 1e-2}
HOST_ONLY = {"Shampoo"}
"""Shampoo steps on the host (its docstring): it reads the mask and the counts back."""


def model():
    return tinn.NetworkWithInputEncoding(2, 3, ENCODING, NETWORK, n_instances=K, seed=5)


def configs(n_matrix: int) -> dict:
    """One config per registered optimizer (Composite: a wrapper on the MLP, another on the grid)."""
    return {
        "SGD": {"otype": "SGD", "learning_rate": 0.5},
        "Adam": ADAM,
        "AdaBound": dict(ADAM, adabound=True),
        "Novograd": {"otype": "Novograd", "learning_rate": 1e-2},
        "Shampoo": {"otype": "Shampoo", "learning_rate": 1e-2},
        "EMA": {"otype": "EMA", "decay": 0.9, "nested": ADAM},
        "Average": {"otype": "Average", "n_samples": 3, "nested": ADAM},
        "Batched": {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
        "ExponentialDecay": {"otype": "ExponentialDecay", "decay_base": 0.5, "decay_start": 1, "decay_interval": 2,
                             "nested": ADAM},
        "Lookahead": {"otype": "Lookahead", "alpha": 0.3, "n_steps": 2, "nested": ADAM},
        "Composite": {"otype": "Composite", "nested": [
            {"otype": "EMA", "nested": ADAM, "n_params_to_optimize": n_matrix},
            {"otype": "ExponentialDecay", "decay_start": 0, "decay_interval": 1, "nested": ADAM,
             "n_params_to_optimize": 1 << 30}]},
    }


def build(name: str):
    """A fresh model and the optimizer ``name`` bound to its store."""
    m = model()
    n_matrix = sum(r * c for r, c in m.layer_sizes())
    config = configs(n_matrix)[name]
    if name == "Composite":
        config["nested"][1]["n_params_to_optimize"] = m.n_params - n_matrix
    opt = tinn.create_optimizer(config)
    opt.allocate(m.n_params, m.layer_sizes(), m.n_instances, m.store)
    return m, opt


def gradients(m, i: int) -> np.ndarray:
    g = np.random.default_rng(i).normal(size=(K, m.n_params)).astype(np.float32)
    g[:, -m.n_params // 8:] = 0                # hash-grid entries without samples (Adam's sparse skip)
    return g


def snapshot(m, opt) -> dict:
    store = m.store
    return {"params": store.read(store.params, store.offset, m.n_params),
            "inference": store.read(store.inference_params, store.offset, m.n_params),
            "counts": opt.step_counts(), **opt.state_dict()}


def train(name: str, on_device: bool, set_path, masks=MASKS):
    """``name`` stepped under ``masks`` on one path; returns the model, optimizer and what the steps did."""
    set_path(on_device)
    m, opt = build(name)
    store, seen = m.store, []
    for i, mask in enumerate(masks):
        store.write(store.grads, store.offset, gradients(m, i))
        active = _buffers.put(np.array(mask, np.int32), ti.i32) if on_device else np.flatnonzero(mask)
        with counting() as s:
            opt.step(active=active)
        seen.append(s)
    return m, opt, seen


NAMES = list(configs(0))


def test_the_cases_cover_every_registered_optimizer():
    otypes = {tinn.create_optimizer(dict(c)).otype.lower() for c in configs(0).values() if c["otype"] != "Composite"}
    assert otypes | {"composite"} == {name.lower() for name in optimizers.names()}


@pytest.mark.parametrize("name", NAMES)
def test_device_steps_take_no_numpy_argument_and_equal_host_steps(set_path, name):
    m_h, opt_h, _ = train(name, False, set_path)
    m_d, opt_d, seen = train(name, True, set_path)
    if name not in HOST_ONLY:
        assert [s.numpy_arguments for s in seen] == [[]] * len(MASKS)
        assert [s.read_backs for s in seen] == [0] * len(MASKS)
    host, device = snapshot(m_h, opt_h), snapshot(m_d, opt_d)
    assert host.keys() == device.keys()
    for key in host:
        np.testing.assert_array_equal(device[key], host[key], err_msg=key)
    start = build(name)[0].params()
    assert not np.array_equal(host["params"], start)
    calls = np.sum(MASKS, axis=0)
    np.testing.assert_array_equal(device["counts"], calls)
    if name == "Batched":                           # every second call of a network steps Adam
        np.testing.assert_array_equal(opt_d.nested.step_counts(), calls // 2)


@pytest.mark.parametrize("name", NAMES)
def test_an_all_zero_device_mask_leaves_everything_untouched(set_path, name):
    """The mask of a non-finite batch: nothing moves, not even with NaN gradients."""
    m, opt, _ = train(name, True, set_path, MASKS[:3])
    before = snapshot(m, opt)
    store = m.store
    store.write(store.grads, store.offset, np.full((K, m.n_params), np.nan, np.float32))
    zero = _buffers.put(np.zeros(K, np.int32), ti.i32)
    with counting() as seen:
        opt.step(active=zero)
    if name not in HOST_ONLY:
        assert seen.read_backs == 0 and not seen.numpy_arguments
    after = snapshot(m, opt)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_step_takes_no_model_and_checks_active_before_anything(device_path):
    m, opt = build("Adam")
    with pytest.raises(TypeError, match="allocate"):
        opt.step(m)
    with pytest.raises(RuntimeError, match="allocate"):
        tinn.create_optimizer(ADAM).step()
    before = snapshot(m, opt)
    for bad in (_buffers.put(np.ones(K, np.float32)), _buffers.put(np.ones(K + 1, np.int32), ti.i32)):
        with pytest.raises(ValueError, match="int32 mask of shape"):
            opt.step(active=bad)
    for bad in ([K], [-1], [[0]]):
        with pytest.raises(ValueError, match="network ids"):
            opt.step(active=bad)
    after = snapshot(m, opt)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_numpy_stepping_uses_a_store_of_its_own():
    """Two optimizers of one shape stepping numpy arrays do not share staging memory."""
    a, b = (tinn.create_optimizer({"otype": "SGD", "learning_rate": 1.0}) for _ in range(2))
    wa, wb = np.zeros(8, np.float32), np.zeros(8, np.float32)
    a.step(wa, np.ones(8, np.float32))
    b.step(wb, np.full(8, 2, np.float32))
    assert a.slot.store is not b.slot.store
    np.testing.assert_allclose(wa, -1, rtol=1e-6)
    np.testing.assert_allclose(wb, -2, rtol=1e-6)
