"""The permutohedral encoding beyond the registry sweep (which checks D = 3's forward, dL/dx, dL/dθ, funcs and
hyperparams): any input dims, the second order, a network array, the device path and bad configs."""
import numpy as np
import pytest

import tinn
from conftest import sample
from reference import EncodingRef, assert_close, fd_input_gradient, second_order_fd, smooth_points

CFG = {"otype": "Permutohedral", "n_levels": 2, "n_features_per_level": 2, "base_resolution": 4,
       "per_level_scale": 2.0, "log2_hashmap_size": 6}          # the sweep's case: its kernels are shared
ALIGN = 16


def random_encoding(D, rng, n_instances=1):
    enc = tinn.create_encoding(D, CFG, alignment=ALIGN, n_instances=n_instances)
    theta = rng.uniform(-1, 1, (n_instances, enc.n_params)).astype(np.float32)
    enc.set_params(theta if n_instances > 1 else theta[0])
    return enc, EncodingRef(D, CFG), theta


@pytest.mark.parametrize("D", sample([1, 8], keep=[1]))
def test_forward_at_any_number_of_dims(D):
    """D + 1 vertices per level at the ends of the range of dims (the reference solves the barycentric
    weights from the simplex it finds and checks that it encloses the point)."""
    rng = np.random.default_rng(D)
    enc, ref, theta = random_encoding(D, rng)
    x = rng.uniform(-0.5, 1.5, (64, D)).astype(np.float32)          # the features are continuous: any x
    assert_close(enc.inference(x), ref.forward(x, theta[0], enc.n_output_dims), rtol=1e-5, atol_rel=1e-5)


def test_second_order_against_finite_differences():
    """dL2/d(dL/dy) and dL2/dx (0: the weights are linear in x inside a simplex) against differences of the
    reference's input gradient; dL2/dθ by linearity: L2 is linear in θ, so <dL2/dθ, θ'> = L2 at θ'."""
    rng = np.random.default_rng(11)
    enc, ref, theta = random_encoding(3, rng)
    width, x = enc.n_output_dims, smooth_points(ref, rng, 9)
    dL_dy = rng.normal(size=(9, width)).astype(np.float32)
    v = rng.normal(size=(9, 3)).astype(np.float32)

    def input_grad(th):
        return lambda z, dy: fd_input_gradient(lambda w: ref.forward(w, th, width), z, dy, 3e-6)

    _, ctx = enc.forward(x)
    d_dy, d_x = enc.backward_backward_input(ctx, v, dL_dy)
    r_dy, r_x = second_order_fd(input_grad(theta[0]), x, dL_dy, v, 3e-6)
    assert_close(d_dy, r_dy, rtol=1e-3, atol_rel=1e-4, atol=1e-5)
    np.testing.assert_array_equal(d_x, 0.0)
    assert np.abs(r_x).max() < 1e-3 * np.abs(r_dy).max()
    other = rng.uniform(-1, 1, enc.n_params)
    expected = (v * input_grad(other)(x.astype(np.float64), dL_dy.astype(np.float64))).sum()
    assert np.dot(enc.gradients(), other) == pytest.approx(expected, rel=1e-3)


def test_network_array_routes_each_sample_to_its_table():
    """Three instances: each sample's features and gradients are its own instance's."""
    rng = np.random.default_rng(5)
    enc, ref, theta = random_encoding(3, rng, n_instances=3)
    x = smooth_points(ref, rng, 48)
    inst = rng.integers(0, 3, 48).astype(np.int32)
    dL_dy = rng.normal(size=(48, enc.n_output_dims)).astype(np.float32)
    y, ctx = enc.forward(x, inst)
    enc.backward(ctx, dL_dy, input_gradient=False)
    grads = enc.gradients().reshape(3, -1)
    for k in range(3):
        mine = inst == k
        assert_close(y[mine], ref.forward(x[mine], theta[k], enc.n_output_dims), rtol=1e-5, atol_rel=1e-5)
        assert_close(grads[k], ref.param_grad(x[mine], theta[k], dL_dy[mine].astype(np.float64)),
                     rtol=1e-4, atol_rel=1e-5)


@pytest.mark.full_only("the permutohedral device kernels' own compile; the default suite runs Permutohedral's "
                       "per-sample funcs (test_registry_sweep) and a grid's device path")
def test_device_path_equals_the_host_path(set_path):
    """Forward, both backwards and the second order of the device path's kernels (any-input funcs, atomic
    adds) equal the CPU path's."""
    rng = np.random.default_rng(2)
    x = smooth_points(EncodingRef(3, CFG), rng, 64)
    dL_dy = rng.normal(size=(64, 16)).astype(np.float32)
    v = rng.normal(size=(64, 3)).astype(np.float32)

    def run():
        enc, _, _ = random_encoding(3, np.random.default_rng(0))
        y, ctx = enc.forward(x)
        dx = enc.backward(ctx, dL_dy)
        g = enc.gradients()
        d_dy, _ = enc.backward_backward_input(ctx, v, dL_dy)
        return [np.asarray(a) for a in (y, dx, g, d_dy, enc.gradients())]

    host = run()
    set_path(True)
    for a, b in zip(run(), host):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


@pytest.mark.x64_only("config validation")
def test_more_than_eight_input_dims_are_refused():
    with pytest.raises(ValueError, match="1 to 8 input dims"):
        tinn.create_encoding(9, CFG)
