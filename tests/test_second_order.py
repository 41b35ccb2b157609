"""Second order, tcnn's ``backward_backward_input``: for L2 = <dL_ddLdinput, dL/dinput> it returns
dL2/d(dL_doutput) and dL2/dinput and writes dL2/dparams to the gradients.

Every result is checked against central finite differences (float64) of an independent first-order backward:
the NumPy reference of the MLP (``tests/reference.py``, itself checked against finite differences of its
forward in test_networks.py) and, for encodings, finite differences of the reference forward. tinn computes
in float32; the tolerances below (relative 2e-3, absolute 2e-4 of the largest expected value) allow for
float32 products and sums over up to a few hundred terms, far below any formula error.
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import sample
from tinn.batch import buffers as _buffers
from tinn.batch import batch as _kind
from tinn.networks import activations
from reference import (ACTIVATIONS, EncodingRef, act_grad_ref, act_ref, act_second_ref, assert_close,
                       fd_gradient, fd_input_gradient, mlp_backward_ref, mlp_forward_ref, mlp_second_order_ref,
                       mlp_shapes, mlp_unflatten, padded, random_weights, second_order_fd, smooth_points)

RTOL, ATOL_REL = 2e-3, 2e-4


# ---------------------------------------------------------------------------------------------
# Activations' second derivatives
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_second_derivative(name):
    """The reference act'' equals central differences of the reference act'; tinn's Taichi and NumPy act''
    equal the reference (and its act, act' too)."""
    z = np.linspace(-2.3, 2.1, 45) + 0.0137                     # avoids z = 0 (the kinks)
    h = 1e-6
    assert_close(act_second_ref(name, z), (act_grad_ref(name, z + h) - act_grad_ref(name, z - h)) / (2 * h),
                 rtol=1e-6, atol=1e-7)

    act = activations.ACTIVATIONS[name]

    @ti.kernel
    def evaluate(z: ti.types.ndarray(), out: ti.types.ndarray()):
        for i in range(z.shape[0]):
            out[0, i] = activations.value(name, z[i])
            out[1, i] = activations.derivative(name, z[i])
            out[2, i] = activations.second_derivative(name, z[i])

    z32 = z.astype(np.float32)
    out = np.zeros((3, len(z)), np.float32)
    evaluate(z32, out)
    expected = [act_ref(name, z32.astype(np.float64)), act_grad_ref(name, z32.astype(np.float64)),
                act_second_ref(name, z32.astype(np.float64))]
    for got, want in zip(out, expected):
        assert_close(got, want, rtol=1e-5, atol=1e-6)
    host = np.zeros_like(z32) if act.host_second is None else activations.host_second(act, z32.copy())
    assert host.dtype == np.float32
    assert_close(host, expected[2], rtol=1e-5, atol=1e-6)
    assert (act.host_second is None) == act.from_output == (name in ("None", "ReLU", "LeakyReLU"))


# ---------------------------------------------------------------------------------------------
# MLP
# ---------------------------------------------------------------------------------------------

def check_mlp_second_order(n_in, n_out, n_neurons, n_hidden_layers, act, out_act, batch, n_instances=1, seed=0):
    rng = np.random.default_rng(seed)
    net = tinn.create_network(n_in, n_out, {"otype": "CutlassMLP", "n_neurons": n_neurons,
                                            "n_hidden_layers": n_hidden_layers, "activation": act,
                                            "output_activation": out_act}, n_instances=n_instances)
    shapes = mlp_shapes(n_in, n_neurons, n_hidden_layers, n_out)
    params = np.stack([random_weights(shapes, rng) for _ in range(n_instances)])
    net.set_params(params if n_instances > 1 else params[0])
    x = rng.uniform(-1, 1, (batch, n_in)).astype(np.float32)
    instance = rng.integers(0, n_instances, batch).astype(np.int32) if n_instances > 1 else None
    dL_dy = rng.normal(size=(batch, n_out)).astype(np.float32)
    v = rng.normal(size=(batch, n_in)).astype(np.float32)

    _, ctx = net.forward(x, instance)
    d_dy, d_x = net.backward_backward_input(ctx, v, dL_dy)
    assert d_dy.shape == (batch, n_out) and d_x.shape == (batch, n_in)
    assert d_dy.dtype == np.float32 and d_x.dtype == np.float32
    grads = net.gradients().reshape(n_instances, -1)
    ids = np.zeros(batch, np.int32) if instance is None else instance
    for k in range(n_instances):
        rows = ids == k
        r_dy, r_x, r_params = mlp_second_order_ref(x[rows], params[k], shapes, dL_dy[rows], v[rows], act, out_act,
                                                   n_out)
        assert_close(d_dy[rows], r_dy, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-6)
        assert_close(d_x[rows], r_x, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-6)
        assert_close(grads[k], r_params, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-6)
    return net


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_mlp_hidden_activation(act):
    check_mlp_second_order(5, 3, 8, 2, act, "None", batch=7)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_mlp_output_activation(act):
    """Every output activation, behind curved (Tanh) hidden layers so that both adjoints meet."""
    check_mlp_second_order(5, 3, 8, 1, "Tanh", act, batch=7)


def test_mlp_without_hidden_layers():
    check_mlp_second_order(4, 2, 8, 0, "ReLU", "Sigmoid", batch=5)


@pytest.mark.full_only("float64 finite differences over two host blocks (the other MLP checks take one block)")
def test_mlp_batch_cut_into_blocks():
    """A batch over several host blocks and partial sums (split along the samples)."""
    from tinn.networks._mlp_host import SAMPLES_PER_BLOCK
    check_mlp_second_order(3, 2, 6, 1, "Softplus", "Tanh", batch=2 * SAMPLES_PER_BLOCK + 5)


def test_mlp_routed_array():
    """A network array with routed (shuffled) instance ids: each network's gradients are its own samples'."""
    check_mlp_second_order(4, 2, 6, 2, "Sine", "Softplus", batch=40, n_instances=3, seed=3)


def test_modes_and_errors():
    """accumulate adds, overwrite replaces; bad arguments raise before anything changes."""
    rng = np.random.default_rng(4)
    net = tinn.create_network(4, 2, {"n_neurons": 8, "n_hidden_layers": 1, "activation": "Tanh"})
    x1, x2 = rng.uniform(-1, 1, (6, 4)).astype(np.float32), rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    (v1, v2), (g1, g2) = [rng.normal(size=a.shape).astype(np.float32) for a in (x1, x2)], \
        [rng.normal(size=(len(a), 2)).astype(np.float32) for a in (x1, x2)]
    _, c1 = net.forward(x1)
    _, c2 = net.forward(x2)
    net.backward_backward_input(c1, v1, g1)
    first = net.gradients()
    net.backward_backward_input(c2, v2, g2)
    second = net.gradients()
    net.backward_backward_input(c1, v1, g1, mode="accumulate")
    assert_close(net.gradients(), first + second, rtol=1e-5, atol=1e-7)
    net.backward_backward_input(c1, v1, g1)
    np.testing.assert_array_equal(net.gradients(), first)

    before = net.gradients()
    with pytest.raises(ValueError, match="dL_ddLdinput"):
        net.backward_backward_input(c1, v1[:, :3], g1)
    with pytest.raises(ValueError, match="samples"):
        net.backward_backward_input(c1, v2, g1)
    with pytest.raises(TypeError, match="float32"):
        net.backward_backward_input(c1, v1.astype(np.float64), g1)
    with pytest.raises(ValueError, match="dL_doutput"):
        net.backward_backward_input(c1, v1, g1[:, :1])
    with pytest.raises(ValueError, match="mode"):
        net.backward_backward_input(c1, v1, g1, mode="ignore")
    other = tinn.create_network(4, 2, {"n_neurons": 8, "n_hidden_layers": 1})
    with pytest.raises(ValueError, match="ctx"):
        other.backward_backward_input(c1, v1, g1)
    np.testing.assert_array_equal(net.gradients(), before)


# ---------------------------------------------------------------------------------------------
# Encodings without parameters
# ---------------------------------------------------------------------------------------------

H_ENCODING = 3e-6
"""Step of both nested central differences (the reference's input gradient, then its derivative): inside
TriangleWave's kink margin of 1e-5 (smooth_points), and its float64 rounding (~1e-16 / h^2 ~ 1e-5 of the
outputs' scale) stays far below the tolerances."""

ENCODINGS = {
    "Identity": (3, {"otype": "Identity", "scale": 0.5, "offset": 0.25}, 16),
    "Frequency": (2, {"otype": "Frequency", "n_frequencies": 3}, 16),
    "TriangleWave": (2, {"otype": "TriangleWave", "n_frequencies": 4}, 0),
    "OneBlob": (2, {"otype": "OneBlob", "n_bins": 8}, 0),
    "SphericalHarmonics": (3, {"otype": "SphericalHarmonics", "degree": 3}, 16),
    "SphericalHarmonics5": (3, {"otype": "SphericalHarmonics", "degree": 5}, 32),
    "SphericalHarmonics8": (3, {"otype": "SphericalHarmonics", "degree": 8}, 0),
    "Empty": (2, {"otype": "Empty"}, 16),
    "Concatenation": (5, {"otype": "Composite", "nested": [
        {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 1},
        {"otype": "Empty", "n_dims_to_encode": 1},
        {"otype": "Identity", "scale": 2.0}]}, 16),
    "Sum": (4, {"otype": "Composite", "reduction": "Sum", "nested": [
        {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 2}]}, 0),
    "Product": (3, {"otype": "Composite", "reduction": "Product", "nested": [
        {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 1, "dims_to_encode_begin": 0},
        {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 1, "dims_to_encode_begin": 1},
        {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 1, "dims_to_encode_begin": 0}]}, 0),
    "NRC": (9, {"otype": "NRC", "n_frequencies": 3, "n_bins": 4}, 16),
}


def encoding_second_order_ref(ref, x, width, dL_dy, v):
    """(dL2/d(dL_dy), dL2/dx) from central differences of the reference forward's input gradient."""
    def input_grad(z, dy):
        return fd_input_gradient(lambda w: ref.forward(w, np.zeros(0), width), z, dy, H_ENCODING)
    return second_order_fd(input_grad, x, dL_dy, v, H_ENCODING)


@pytest.mark.parametrize("name", sample(ENCODINGS, keep=[n for n in ENCODINGS
                                                  if n not in ("SphericalHarmonics5", "SphericalHarmonics8", "NRC")]))
def test_encoding(name):
    n_in, cfg, alignment = ENCODINGS[name]
    enc = tinn.create_encoding(n_in, cfg, alignment=alignment)
    ref = EncodingRef(n_in, enc.hyperparams())
    width = enc.n_output_dims
    rng = np.random.default_rng(len(name))
    x = smooth_points(ref, rng, 9)
    dL_dy = rng.normal(size=(9, width)).astype(np.float32)
    v = rng.normal(size=(9, n_in)).astype(np.float32)
    _, ctx = enc.forward(x)
    d_dy, d_x = enc.backward_backward_input(ctx, v, dL_dy)
    assert d_dy.shape == (9, width) and d_x.shape == (9, n_in)
    assert d_dy.dtype == np.float32 and d_x.dtype == np.float32
    r_dy, r_x = encoding_second_order_ref(ref, x, width, dL_dy, v)
    assert_close(d_dy, r_dy, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)
    assert_close(d_x, r_x, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)
    if ref.raw < width:                                   # padded outputs are constants
        np.testing.assert_array_equal(d_dy[:, ref.raw:], 0.0)


# ---------------------------------------------------------------------------------------------
# NetworkWithInputEncoding
# ---------------------------------------------------------------------------------------------

NWIE = {
    # name: (n_in, n_out, encoding, network, n_instances)
    "frequency-softplus": (2, 3, {"otype": "Frequency", "n_frequencies": 2},
                           {"n_neurons": 8, "n_hidden_layers": 2, "activation": "Softplus",
                            "output_activation": "Sigmoid"}, 1),
    "oneblob-relu": (2, 2, {"otype": "OneBlob", "n_bins": 4},
                     {"n_neurons": 8, "n_hidden_layers": 1, "activation": "ReLU"}, 1),
    "composite-tanh-array": (3, 2, {"otype": "Composite", "nested": [
        {"otype": "SphericalHarmonics", "degree": 2, "n_dims_to_encode": 3}]},
        {"n_neurons": 6, "n_hidden_layers": 1, "activation": "Tanh", "output_activation": "Softplus"}, 3),
}


@pytest.mark.parametrize("name", sample(list(NWIE), keep=["frequency-softplus", "composite-tanh-array"]))
def test_network_with_input_encoding(name):
    """dL2/d(dL_dy), dL2/dx and dL2/dparams [network | encoding] against central differences of the composed
    reference's first-order backward (network analytic, encoding by differences of its forward); routed over
    3 networks in the array case."""
    n_in, n_out, enc_cfg, net_cfg, K = NWIE[name]
    model = tinn.NetworkWithInputEncoding(n_in, n_out, enc_cfg, net_cfg, n_instances=K)
    ref = EncodingRef(n_in, model.encoding.hyperparams())
    width = model.encoding.n_output_dims
    shapes = mlp_shapes(width, net_cfg["n_neurons"], net_cfg["n_hidden_layers"], n_out)
    n_net = sum(r * c for r, c in shapes)
    act, out_act = net_cfg["activation"], net_cfg.get("output_activation", "None")
    rng = np.random.default_rng(11)
    params = np.stack([np.concatenate([random_weights(shapes, rng), rng.uniform(-1, 1, ref.n_params)])
                       for _ in range(K)]).astype(np.float32)
    model.set_params(params if K > 1 else params[0])
    batch = 8
    x = smooth_points(ref, rng, batch)
    instance = rng.integers(0, K, batch).astype(np.int32) if K > 1 else None
    dL_dy = rng.normal(size=(batch, n_out)).astype(np.float32)
    v = rng.normal(size=(batch, n_in)).astype(np.float32)
    _, ctx = model.forward(x, instance)
    d_dy, d_x = model.backward_backward_input(ctx, v, dL_dy)
    grads = model.gradients().reshape(K, -1)

    def input_grad(p, z, dy):
        Ws, theta = mlp_unflatten(p[:n_net], shapes), p[n_net:]
        _, zs, hs = mlp_forward_ref(ref.forward(z, theta, width, exact=True), Ws, act, out_act)
        d_e = mlp_backward_ref(Ws, zs, hs, padded(dy, shapes[-1][0], 0.0), act, out_act)[1]
        return fd_input_gradient(lambda w: ref.forward(w, theta, width, exact=True), z, d_e, H_ENCODING)

    ids = np.zeros(batch, np.int32) if instance is None else instance
    for k in range(K):
        rows = ids == k
        p = params[k].astype(np.float64)
        r_dy, r_x = second_order_fd(lambda z, dy: input_grad(p, z, dy), x[rows], dL_dy[rows], v[rows], H_ENCODING)
        r_params = fd_gradient(lambda q: (v[rows] * input_grad(q, x[rows].astype(np.float64), dL_dy[rows])).sum(),
                               p, 1e-5)
        assert_close(d_dy[rows], r_dy, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)
        assert_close(d_x[rows], r_x, rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)
        assert_close(grads[k, :n_net], r_params[:n_net], rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)
        assert_close(grads[k, n_net:], r_params[n_net:], rtol=RTOL, atol_rel=ATOL_REL, atol=1e-5)


def test_dense_array_batch_equals_the_routed_one():
    """A dense (K, B, n) batch gives (K, B, ...) results equal to the same samples routed by instance ids."""
    rng = np.random.default_rng(12)
    net = tinn.create_network(4, 2, {"n_neurons": 8, "n_hidden_layers": 1, "activation": "SiLU"}, n_instances=2)
    x = rng.uniform(-1, 1, (2, 5, 4)).astype(np.float32)
    v = rng.normal(size=(2, 5, 4)).astype(np.float32)
    g = rng.normal(size=(2, 5, 2)).astype(np.float32)
    _, ctx = net.forward(x)
    d_dy, d_x = net.backward_backward_input(ctx, v, g)
    dense_grads = net.gradients()
    assert d_dy.shape == (2, 5, 2) and d_x.shape == (2, 5, 4)
    ids = np.repeat(np.arange(2, dtype=np.int32), 5)
    _, ctx = net.forward(x.reshape(10, 4), ids)
    r_dy, r_x = net.backward_backward_input(ctx, v.reshape(10, 4), g.reshape(10, 2))
    np.testing.assert_allclose(d_dy.reshape(10, 2), r_dy, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(d_x.reshape(10, 4), r_x, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dense_grads, net.gradients(), rtol=1e-6, atol=1e-7)


def test_networks_a_batch_does_not_reach_get_zero_gradients():
    """overwrite: the networks of an array that no sample reached end with zero gradients; accumulate keeps them."""
    rng = np.random.default_rng(13)
    net = tinn.create_network(4, 2, {"n_neurons": 8, "n_hidden_layers": 1, "activation": "Tanh"}, n_instances=3)
    x = rng.uniform(-1, 1, (12, 4)).astype(np.float32)
    v, g = rng.normal(size=(12, 4)).astype(np.float32), rng.normal(size=(12, 2)).astype(np.float32)
    _, ctx = net.forward(x, (np.arange(12) % 3).astype(np.int32))
    net.backward_backward_input(ctx, v, g)
    everywhere = net.gradients()
    assert np.all(np.abs(everywhere).max(axis=1) > 0)
    ids = np.where(np.arange(12) % 2 == 0, 0, 2).astype(np.int32)
    _, ctx = net.forward(x, ids)
    net.backward_backward_input(ctx, v, g, mode="accumulate")
    np.testing.assert_array_equal(net.gradients()[1], everywhere[1])
    net.backward_backward_input(ctx, v, g)
    np.testing.assert_array_equal(net.gradients()[1], 0.0)
    assert np.abs(net.gradients()[[0, 2]]).max() > 0


@pytest.mark.x64_only("the host path to compare with runs only on the CPU")
@pytest.mark.full_only("a grid model's second order compiled on both paths; test_device_path compares the paths "
                       "by default")
def test_grid_model_on_the_device_path_equals_the_host_path(set_path):
    """A hash grid under an MLP: the grid's first-order backward of dL2/de runs on the device path, and its
    result joins the host second order; numpy and ti.ndarray batches give the host path's results."""
    cfg = ({"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
            "base_resolution": 4, "per_level_scale": 1.5},
           {"n_neurons": 16, "n_hidden_layers": 2, "activation": "Tanh"})
    rng = np.random.default_rng(14)
    x, v = rng.random((50, 3), dtype=np.float32), rng.normal(size=(50, 3)).astype(np.float32)
    g = rng.normal(size=(50, 2)).astype(np.float32)
    results = {}
    for kind, device_path in (("host", False), ("numpy", True), ("ti.ndarray", True)):
        set_path(device_path)
        model = tinn.NetworkWithInputEncoding(3, 2, *cfg, seed=3)
        put = _buffers.put if kind == "ti.ndarray" else np.asarray
        _, ctx = model.forward(put(x))
        d_dy, d_x = model.backward_backward_input(ctx, put(v), put(g))
        results[kind] = [_kind.host(d_dy), _kind.host(d_x), model.gradients()]
    for kind in ("numpy", "ti.ndarray"):
        for got, want in zip(results[kind], results["host"]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
