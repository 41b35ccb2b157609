"""The per-sample funcs of the in-kernel API: forward_func, backward_func, jacobian_func, zero_grad.

(func and backward_func against the batch API for every encoding and activation: test_user_kernels.py.)
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import SMOOTH_NET, sample
from reference import EncodingRef, fd_input_gradient, mlp_forward_ref, mlp_shapes, mlp_unflatten, smooth_points

NET = SMOOTH_NET
GRID = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 8,
        "base_resolution": 4, "per_level_scale": 1.5}
AVERAGING = {
    "EMA": {"otype": "EMA", "decay": 0.5, "nested": {"otype": "SGD", "learning_rate": 0.5}},
    "Average": {"otype": "Average", "n_samples": 4, "nested": {"otype": "SGD", "learning_rate": 0.5}},
    "Lookahead": {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2, "nested": {"otype": "SGD", "learning_rate": 0.5}},
}


def per_sample(model, kind, x, dy=None, instance=None):
    """Run one of the model's funcs over a batch in a kernel of our own; returns numpy arrays."""
    n_in, n_out = model.n_input_dims, model.n_output_dims
    f = getattr(model, kind)
    inst = np.zeros(len(x), np.int32) if instance is None else instance
    dy = np.zeros((len(x), n_out), np.float32) if dy is None else dy
    y = np.zeros((len(x), n_out), np.float32)
    dx = np.zeros((len(x), n_in), np.float32)
    J = np.zeros((len(x), n_out, n_in), np.float32)

    @ti.kernel
    def run(x: ti.types.ndarray(), dy: ti.types.ndarray(), inst: ti.types.ndarray(), y: ti.types.ndarray(),
            dx: ti.types.ndarray(), J: ti.types.ndarray()):
        for b in range(x.shape[0]):
            xv = ti.Vector([x[b, i] for i in ti.static(range(n_in))])
            if ti.static(kind == "backward_func"):
                g = f(xv, ti.Vector([dy[b, i] for i in ti.static(range(n_out))]), inst[b])
                for i in ti.static(range(n_in)):
                    dx[b, i] = g[i]
            elif ti.static(kind == "jacobian_func"):
                out, jac = f(xv, inst[b])
                for i in ti.static(range(n_out)):
                    y[b, i] = out[i]
                    for d in ti.static(range(n_in)):
                        J[b, i, d] = jac[i, d]
            else:
                out = f(xv, inst[b])
                for i in ti.static(range(n_out)):
                    y[b, i] = out[i]

    run(x, dy, inst, y, dx, J)
    return {"func": y, "forward_func": y, "backward_func": dx, "jacobian_func": (y, J)}[kind]


def trained_model(optimizer, rng, encoding=GRID, steps=4):
    config = {"loss": {"otype": "L2"}, "optimizer": optimizer, "encoding": encoding, "network": NET}
    model = tinn.create_from_config(2, 3, config)
    x = rng.random((64, 2), dtype=np.float32)
    y = rng.random((64, 3), dtype=np.float32)
    for _ in range(steps):
        model.trainer.training_step(x, y)
    return model, x


@pytest.mark.parametrize("name", sample(list(AVERAGING), 1))
def test_forward_func_reads_the_training_weights_under_averaging_optimizers(name, rng):
    model, x = trained_model(AVERAGING[name], rng)
    net = model.network
    y_train, _ = net.forward(x)
    y_infer = net.inference(x)
    assert not np.allclose(y_train, y_infer, atol=1e-3), "the averaged weights should differ from the training ones"
    np.testing.assert_allclose(per_sample(net, "forward_func", x), y_train, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(per_sample(net, "func", x), y_infer, rtol=1e-5, atol=1e-6)


def test_backward_func_differentiates_the_training_weights_encoding_included(rng):
    """Under EMA the batch backward works at the training weights (grid included); so must backward_func."""
    model, x = trained_model(AVERAGING["EMA"], rng)
    net = model.network
    dy = rng.normal(size=(len(x), 3)).astype(np.float32)
    _, ctx = net.forward(x)
    dx_batch = net.backward(ctx, dy)
    grads_batch = net.gradients()
    net.zero_grad()
    dx = per_sample(net, "backward_func", x, dy)
    np.testing.assert_allclose(dx, dx_batch, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.gradients(), grads_batch, rtol=1e-4, atol=1e-6)


def reference_model(model, enc_cfg):
    """float64 reference of a NetworkWithInputEncoding (tests/reference.py), from the model's parameters."""
    p = model.params().astype(np.float64)
    width = model.encoding.padded_output_width
    shapes = mlp_shapes(width, NET["n_neurons"], NET["n_hidden_layers"], model.n_output_dims)
    n_mlp = sum(r * c for r, c in shapes)
    Ws = mlp_unflatten(p[:n_mlp], shapes)
    enc = EncodingRef(model.n_input_dims, enc_cfg)

    def f(x):                                              # exact: grid positions in float64 (for differences)
        return mlp_forward_ref(enc.forward(x, p[n_mlp:], width, exact=True), Ws, NET["activation"],
                               NET["output_activation"])[0][:, :model.n_output_dims]
    return f, enc


@pytest.mark.parametrize("enc_cfg", sample([GRID, {"otype": "Frequency", "n_frequencies": 3},
                                            {"otype": "Identity", "scale": 0.5, "offset": 0.1}], keep=[0]),
                         ids=["HashGrid", "Frequency", "Identity"])
def test_jacobian_func_against_finite_differences(enc_cfg, rng):
    model = tinn.NetworkWithInputEncoding(2, 2, enc_cfg, NET)        # 2-D: the suite's grid kind, compiled once
    p = model.params()
    n_mlp = model.network.n_params
    p[n_mlp:] = rng.normal(0, 0.5, p[n_mlp:].shape).astype(np.float32)     # a grid worth differentiating
    model.set_params(p)
    ref, enc = reference_model(model, enc_cfg)
    x = smooth_points(enc, rng, 40)
    model.zero_grad()
    y, J = per_sample(model, "jacobian_func", x)
    np.testing.assert_allclose(y, ref(x), rtol=1e-4, atol=1e-5)
    for i in range(model.n_output_dims):                  # row i of J is the gradient of output i
        e = np.zeros((len(x), model.n_output_dims))
        e[:, i] = 1.0
        fd = fd_input_gradient(ref, x, e, 1e-6)
        np.testing.assert_allclose(J[:, i, :], fd, rtol=2e-3, atol=2e-3 * np.abs(fd).max())
    assert not np.any(model.gradients()), "jacobian_func must not touch the parameter gradients"


@pytest.mark.long_compile("jacobian_func of an array and of each component: about 4 min")
@pytest.mark.full_only("jacobian_func of a routed array and of each component; the default suite runs a model's")
def test_jacobian_func_of_a_network_array_and_of_components(rng):
    """Routed: each sample's Jacobian is its own network's; components alone equal their vjps."""
    model = tinn.NetworkWithInputEncoding(2, 3, GRID, NET, n_instances=3)
    model.set_params(model.params() + rng.normal(0, 0.3, model.params().shape).astype(np.float32))
    x = rng.random((30, 2), dtype=np.float32)
    inst = rng.integers(0, 3, 30).astype(np.int32)
    y, J = per_sample(model, "jacobian_func", x, instance=inst)
    np.testing.assert_allclose(y, model.inference(x, inst), rtol=1e-5, atol=1e-6)
    for i in range(3):                                     # J^T e_i equals the batch backward of e_i
        e = np.zeros((30, 3), np.float32)
        e[:, i] = 1.0
        _, ctx = model.forward(x, inst)
        np.testing.assert_allclose(J[:, i, :], model.backward(ctx, e), rtol=1e-4, atol=1e-5)
    single = tinn.NetworkWithInputEncoding(2, 3, GRID, NET)
    single.set_params(single.params() + rng.normal(0, 0.3, single.params().shape).astype(np.float32))
    for part in (single.network, single.encoding):
        xin = rng.random((10, part.n_input_dims), dtype=np.float32)
        y, J = per_sample(part, "jacobian_func", xin)
        dy = rng.normal(size=(10, part.n_output_dims)).astype(np.float32)
        _, ctx = part.forward(xin)
        np.testing.assert_allclose(np.einsum("bi,bid->bd", dy, J), part.backward(ctx, dy), rtol=1e-4, atol=1e-5)


def test_zero_grad_clears_what_backward_func_added(rng):
    model = tinn.NetworkWithInputEncoding(2, 3, GRID, NET)
    x = rng.random((20, 2), dtype=np.float32)
    per_sample(model, "backward_func", x, np.ones((20, 3), np.float32))
    once = model.gradients()
    assert np.abs(once).max() > 0
    per_sample(model, "backward_func", x, np.ones((20, 3), np.float32))
    np.testing.assert_allclose(model.gradients(), 2 * once, rtol=1e-5, atol=1e-7)   # funcs accumulate
    model.network.zero_grad()                              # a component clears its own slice only
    assert not np.any(model.network.gradients()) and np.any(model.encoding.gradients())
    model.zero_grad()
    assert not np.any(model.gradients())
