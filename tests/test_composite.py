"""Composite, NRC and Empty encodings (spec §1.7) beyond the registry sweep: dim resolution and its errors,
parameter binding inside NetworkWithInputEncoding (§2.5), network arrays and nesting.

Expected values come from ``tests/reference.py`` (float64, written from the spec).
"""
import warnings

import numpy as np
import pytest

import tinn
from conftest import SMALL_GRID
from reference import (EncodingRef, assert_close, fd_input_gradient, mlp_backward_ref, mlp_forward_ref, mlp_shapes,
                       mlp_unflatten, padded, random_weights, smooth_points)

GRID = SMALL_GRID


# ---------------------------------------------------------------------------------------------
# Dim resolution (§1.7) and its errors
# ---------------------------------------------------------------------------------------------

def test_unspecified_entry_takes_the_remaining_dims_and_zero_dim_entries_are_dropped():
    enc = tinn.create_encoding(5, {"otype": "Composite", "nested": [
        {"otype": "Identity", "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 2, "n_dims_to_encode": 0},
        {"otype": "Frequency", "n_frequencies": 1},
        {"otype": "TriangleWave", "n_frequencies": 2, "n_dims_to_encode": 1}]})
    assert [type(e).__name__ for e in enc.nested] == ["IdentityEncoding", "FrequencyEncoding", "TriangleWaveEncoding"]
    assert enc.slices == [(0, 2), (2, 2), (4, 1)]
    assert enc.n_output_dims == 2 + 4 + 2
    x = np.random.default_rng(0).random((4, 5)).astype(np.float32)
    y = enc.inference(x)
    np.testing.assert_allclose(y, EncodingRef(5, enc.hyperparams()).forward(x, np.zeros(0), 8), atol=1e-6)
    np.testing.assert_allclose(y[:, :2], x[:, :2], atol=0)


def test_nested_keys_are_not_reported_as_unknown():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tinn.create_encoding(3, {"otype": "Composite", "nested": [
            {"otype": "Identity", "n_dims_to_encode": 1, "dims_to_encode_begin": 2},
            {"otype": "Identity", "n_dims_to_encode": 2, "dims_to_encode_begin": 0}]})


@pytest.mark.parametrize("n_in, config, match", [
    (3, {"otype": "Composite"}, "nested"),
    (3, {"otype": "Composite", "nested": {"otype": "Identity"}}, "nested"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity"}, {"otype": "Frequency"}]}, "only one"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 4}]}, "more than"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 2, "dims_to_encode_begin": 0},
                                          {"otype": "Identity"}]}, "every entry"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 2, "dims_to_encode_begin": 2}]},
     "beyond"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": -1}]}, "must be >= 0"),
    (3, {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 0}]}, "no nested"),
    (3, {"otype": "Composite", "reduction": "Max", "nested": [{"otype": "Identity"}]}, "reduction"),
    (3, {"otype": "Composite", "reduction": "Sum", "nested": [{"otype": "Identity", "n_dims_to_encode": 1},
                                                              {"otype": "Frequency", "n_frequencies": 1}]},
     "equal output width"),
    (3, {"otype": "Composite", "nested": [{"otype": "NoSuchEncoding"}]}, "valid otypes"),
    (7, {"otype": "NRC"}, "at least 8"),
    (9, {"otype": "NRC", "n_bins": 3}, "power of two"),
])
def test_composite_errors_name_the_problem(n_in, config, match):
    with pytest.raises(ValueError, match=match):
        tinn.create_encoding(n_in, config)


def test_reductions_are_case_insensitive():
    enc = tinn.create_encoding(2, {"otype": "composite", "reduction": "product", "nested": [
        {"otype": "Identity", "n_dims_to_encode": 1}, {"otype": "Identity"}]})
    assert enc.hyperparams()["reduction"] == "Product"
    x = np.array([[0.5, 0.25]], np.float32)
    np.testing.assert_array_equal(enc.inference(x), [[0.125]])


def test_nrc_preset_layout():
    """§1.7: TriangleWave(F) on dims 0–2, OneBlob(K) on 3–7, Identity on the rest; 8 dims drop the Identity."""
    enc = tinn.create_encoding(10, {"otype": "OneBlobFrequency", "n_frequencies": 2, "n_bins": 8})
    assert [(type(e).__name__, s) for e, s in zip(enc.nested, enc.slices)] == [
        ("TriangleWaveEncoding", (0, 3)), ("OneBlobEncoding", (3, 5)), ("IdentityEncoding", (8, 2))]
    assert enc.n_output_dims == 6 + 40 + 2
    assert len(tinn.create_encoding(8, {"otype": "NRC"}).nested) == 2


def test_nested_composites():
    """A composite inside a composite: slices, padding and parameters compose (Frequency pads to the grid's 2)."""
    cfg = {"otype": "Composite", "nested": [
        {"otype": "Composite", "n_dims_to_encode": 3, "nested": [
            {"otype": "TriangleWave", "n_frequencies": 3, "n_dims_to_encode": 1}, {**GRID}]},
        {"otype": "Frequency", "n_frequencies": 1}]}
    enc = tinn.create_encoding(4, cfg, alignment=16)
    ref = EncodingRef(4, cfg)
    assert enc.required_output_alignment == 2 and enc.n_params == ref.n_params
    assert enc.n_output_dims == ref.padded_width(16) == 16
    rng = np.random.default_rng(1)
    theta = rng.uniform(-1, 1, enc.n_params).astype(np.float32)
    enc.set_params(theta)
    x = smooth_points(ref, rng, 17)
    y, ctx = enc.forward(x)
    assert_close(y, ref.forward(x, theta, 16), rtol=1e-5, atol=1e-6)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    dx = enc.backward(ctx, dL_dy)
    assert_close(enc.gradients(), ref.param_grad(x, theta, dL_dy), rtol=1e-4, atol_rel=1e-5)
    assert_close(dx, fd_input_gradient(lambda z: ref.forward(z, theta, 16, exact=True), x, dL_dy, 1e-6),
                 rtol=1e-3, atol_rel=1e-4)
    rebuilt = tinn.create_encoding(4, enc.hyperparams(), alignment=16)
    assert rebuilt.hyperparams() == enc.hyperparams()


def test_nested_parameters_are_initialised_in_order_from_one_generator():
    """§1.7: the nested encodings draw their initial parameters one after the other from the composite's rng."""
    cfg = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2}, {**GRID, "n_levels": 1}]}
    enc = tinn.create_encoding(4, cfg, seed=11)
    first = tinn.create_encoding(2, GRID, seed=11)
    second_alone = tinn.create_encoding(2, {**GRID, "n_levels": 1}, seed=11)
    p = enc.params()
    assert p.shape == (first.n_params + second_alone.n_params,)
    np.testing.assert_array_equal(p[:first.n_params], first.params())
    second = p[first.n_params:]
    assert np.abs(second).max() <= 1e-4 and not np.array_equal(second, second_alone.params())
    np.testing.assert_array_equal(enc.nested[1].params(), second)          # the nested view is the same slice


# ---------------------------------------------------------------------------------------------
# Inside NetworkWithInputEncoding (§2.5): alignment 16, parameters bound at an offset
# ---------------------------------------------------------------------------------------------

NWIE_ENCODING = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2},
                                                  {"otype": "Frequency", "n_frequencies": 2}]}
NWIE_NETWORK = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh",
                "output_activation": "None"}


@pytest.fixture(scope="module")
def nwie():
    return tinn.NetworkWithInputEncoding(3, 2, NWIE_ENCODING, NWIE_NETWORK)


def test_composite_with_hash_grid_in_network_with_input_encoding(nwie):
    """Widths: grid 4 + frequency 4 = 8, aligned to 16 by padding the last part (Frequency, fill 1).
    Parameters: [network | grid]; forward, parameter gradients and dL/dx vs the composed references."""
    ref = EncodingRef(3, NWIE_ENCODING)
    width = ref.padded_width(16)
    assert nwie.encoding.n_output_dims == width == 16 and nwie.network.n_input_dims == 16
    shapes = mlp_shapes(16, 16, 1, 2)
    n_net = sum(r * c for r, c in shapes)
    assert nwie.n_params == n_net + ref.n_params and nwie.encoding.n_params == ref.n_params
    assert nwie.encoding.nested[0]._offset == nwie.store.offset + n_net      # bound into the model's store

    rng = np.random.default_rng(2)
    params = np.concatenate([random_weights(shapes, rng), rng.uniform(-1, 1, ref.n_params).astype(np.float32)])
    nwie.set_params(params)
    np.testing.assert_array_equal(nwie.encoding.params(), params[n_net:])
    np.testing.assert_array_equal(nwie.encoding.nested[0].params(), params[n_net:])
    Ws, theta = mlp_unflatten(params[:n_net], shapes), params[n_net:]

    def model(x, exact=False):
        return mlp_forward_ref(ref.forward(x, theta, width, exact), Ws, "Tanh", "None")

    x = smooth_points(ref, rng, 29)
    y, ctx = nwie.forward(x)
    y_ref, zs, hs = model(x)
    assert_close(y, y_ref[:, :2], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(nwie.inference(x), y)

    dL_dy = rng.normal(size=(29, 2)).astype(np.float32)
    dx = nwie.backward(ctx, dL_dy)
    dWs, d_enc = mlp_backward_ref(Ws, zs, hs, padded(dL_dy, 16, 0.0), "Tanh", "None")
    expected = np.concatenate([d.ravel() for d in dWs] + [ref.param_grad(x, theta, d_enc)])
    assert_close(nwie.gradients(), expected, rtol=1e-4, atol_rel=1e-5)
    fd = fd_input_gradient(lambda z: model(z, exact=True)[0][:, :2], x, dL_dy, 1e-6)
    assert_close(dx, fd, rtol=1e-3, atol_rel=1e-4)


def test_composite_model_trains(nwie):
    """create_from_config with a composite encoding: a few Adam steps lower the loss (grid parameters move)."""
    config = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
              "encoding": NWIE_ENCODING, "network": NWIE_NETWORK}
    model = tinn.create_from_config(3, 2, config)
    rng = np.random.default_rng(3)
    x = rng.random((64, 3)).astype(np.float32)
    target = np.stack([np.sin(4 * x[:, 0]), x[:, 1] * x[:, 2]], axis=1).astype(np.float32)
    before = model.network.encoding.params().copy()
    losses = [model.trainer.training_step(x, target) for _ in range(20)]
    assert losses[-1] < losses[0]
    assert not np.array_equal(model.network.encoding.params(), before)


def test_composite_network_array():
    """n_instances = 2: each sample reads its own network's grid parameters (routing passes through the composite)."""
    cfg = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2}, {"otype": "Identity"}]}
    enc = tinn.create_encoding(3, cfg, n_instances=2)
    ref = EncodingRef(3, cfg)
    rng = np.random.default_rng(4)
    theta = rng.uniform(-1, 1, (2, enc.n_params)).astype(np.float32)
    enc.set_params(theta)
    x = smooth_points(ref, rng, 12)
    inst = (np.arange(12) % 2).astype(np.int32)
    y = enc.inference(x, inst)
    for k in range(2):
        assert_close(y[inst == k], ref.forward(x[inst == k], theta[k], enc.n_output_dims), rtol=1e-5, atol=1e-6)
    _, ctx = enc.forward(x, inst)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    enc.backward(ctx, dL_dy, input_gradient=False)
    g = enc.gradients()
    for k in range(2):
        assert_close(g[k], ref.param_grad(x[inst == k], theta[k], dL_dy[inst == k]), rtol=1e-4, atol_rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Empty (§1.7)
# ---------------------------------------------------------------------------------------------

def test_empty_encoding():
    """Raw width 0; padded columns are 1 (spec §8 A6); dL/dx = 0; no parameters."""
    enc = tinn.create_encoding(3, {"otype": "Empty"})
    assert enc.n_output_dims == 0 and enc.n_params == 0
    x = np.random.default_rng(5).random((4, 3)).astype(np.float32)
    y, ctx = enc.forward(x)
    assert y.shape == (4, 0)
    np.testing.assert_array_equal(enc.backward(ctx, np.zeros((4, 0), np.float32)), np.zeros((4, 3)))
    enc.set_padded_output_width(5)
    y, ctx = enc.forward(x)
    np.testing.assert_array_equal(y, np.ones((4, 5)))
    np.testing.assert_array_equal(enc.backward(ctx, np.ones((4, 5), np.float32)), np.zeros((4, 3)))
