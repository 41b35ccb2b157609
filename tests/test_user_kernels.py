"""Models called from inside a user's own Taichi kernel (``func`` / ``backward_func``)."""
import numpy as np
import pytest

import tinn
from conftest import SMALL_GRID, SMOOTH_NET, run_funcs, sample

NET = SMOOTH_NET
ENCODINGS = {
    "HashGrid": SMALL_GRID,
    "Frequency": {"otype": "Frequency", "n_frequencies": 3},
    "OneBlob": {"otype": "OneBlob", "n_bins": 8},
}


def assert_funcs_equal_batch_api(model, x, dy, instance=None):
    """The in-kernel forward and backward funcs give the batch API's outputs, input and weight gradients."""
    y, dx, grads = run_funcs(model, x, dy, instance)
    np.testing.assert_allclose(y, model.inference(x, instance), rtol=1e-5, atol=1e-6)
    _, ctx = model.forward(x, instance)
    np.testing.assert_allclose(dx, model.backward(ctx, dy), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads, model.gradients(), rtol=1e-4, atol=1e-6)


@pytest.mark.long_compile("func and backward_func in one user kernel: 2-3 min per encoding")
@pytest.mark.parametrize("name", sample(ENCODINGS, keep=["HashGrid"]))
def test_funcs_equal_the_batch_api(name, rng):
    model = tinn.NetworkWithInputEncoding(2, 3, ENCODINGS[name], NET)
    x = rng.random((50, 2), dtype=np.float32)
    dy = rng.normal(size=(50, 3)).astype(np.float32)
    assert_funcs_equal_batch_api(model, x, dy)


@pytest.mark.long_compile("func and backward_func of an array in one user kernel: about 3 min")
def test_funcs_route_to_the_given_instance(rng):
    model = tinn.NetworkWithInputEncoding(2, 3, ENCODINGS["HashGrid"], NET, n_instances=3)
    x = rng.random((60, 2), dtype=np.float32)
    dy = rng.normal(size=(60, 3)).astype(np.float32)
    inst = rng.integers(0, 3, 60).astype(np.int32)
    assert_funcs_equal_batch_api(model, x, dy, inst)


def test_standalone_network_func(rng):
    net = tinn.create_network(5, 2, {"otype": "CutlassMLP", "n_neurons": 7, "n_hidden_layers": 0})
    x = rng.random((9, 5), dtype=np.float32)
    y, _, _ = run_funcs(net, x, np.zeros((9, 2), np.float32))
    np.testing.assert_allclose(y, net.inference(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", sample(tinn.networks.activations.NAMES, 4))
def test_network_funcs_equal_the_batch_api_for_every_activation(act, rng):
    """The in-kernel funcs carry their own (ti.func) activations; the batch path is checked against
    the NumPy reference in test_networks.py, so agreeing with it checks every activation here."""
    net = tinn.create_network(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 8, "n_hidden_layers": 1,
                                     "activation": act, "output_activation": act})
    x = (rng.random((20, 3), dtype=np.float32) - 0.5).astype(np.float32)
    dy = rng.normal(size=(20, 2)).astype(np.float32)
    assert_funcs_equal_batch_api(net, x, dy)


@pytest.mark.long_compile("about 3 min")
def test_func_reads_the_inference_weights_of_an_averaging_optimizer(rng):
    """With EMA the model's inference() uses the averaged weights; func must agree with it."""
    config = {"loss": {"otype": "L2"}, "optimizer": {"otype": "EMA", "decay": 0.5, "nested": {"otype": "SGD",
              "learning_rate": 0.5}}, "encoding": ENCODINGS["Frequency"], "network": NET}
    model = tinn.create_from_config(2, 3, config)
    x = rng.random((40, 2), dtype=np.float32)
    y = rng.random((40, 3), dtype=np.float32)
    for _ in range(3):
        model.trainer.training_step(x, y)
    out, _ = model.network.forward(x)                          # training weights
    y_func, _, _ = run_funcs(model.network, x, np.zeros((40, 3), np.float32))
    np.testing.assert_allclose(y_func, model.network.inference(x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, y_func, atol=1e-4), "EMA weights should differ from the training weights"
