"""Grid second order (spec §1.6.6): ``backward_backward_input`` against the reference and finite differences.

For L2 = Σ_b <G_b, dL/dx_b>, with dL/dx the first-order input gradient for the output gradient dL/dy,
the call returns dL2/d(dL/dy) and dL2/dx and writes dL2/dθ. Expected values: dL2/d(dL/dy) = J·G with
the reference Jacobian; dL2/dθ from the reference's corner slopes (itself checked against finite
differences in θ); dL2/dx by central differences of the reference's first-order input gradient (float64)
and of tinn's own first-order backward (float32, looser tolerance). Every interpolation at every
dimension, each grid type with each interpolation, routed network arrays and padded outputs.
"""
import numpy as np
import pytest

import tinn
from conftest import sample
from reference import (assert_close, grid_geometry, grid_input_grad_ref, grid_jacobian_ref, grid_off_boundaries,
                       grid_second_order_param_grad_ref)
from test_grid_inputs import N_LEVELS, encoding
from test_encodings import random_params

TYPES = ("Hash", "Dense", "Tiled")
INTERPOLATIONS = ("Nearest", "Linear", "Smoothstep")
# every dimension with every interpolation; each interpolation meets every grid type
SECOND_ORDER_CASES = [f"{TYPES[(D + i) % 3]}-{D}d-{interp}" for D in (1, 2, 3, 4)
                      for i, interp in enumerate(INTERPOLATIONS)]


def smooth_points(levels, D, rng, n, lo=-1.5, hi=2.5):
    """Points in [lo, hi)^D (outside [0, 1] too) whose cell fractions stay ≥ 0.02 from 0 and 1 at every level."""
    pts = []
    while sum(len(p) for p in pts) < n:
        x = rng.uniform(lo, hi, (8 * n, D)).astype(np.float32)
        pts.append(x[grid_off_boundaries(x, levels, 0.02)])
    return np.concatenate(pts)[:n]


def second_order_loss_ref(x, theta, G, dL_dy, levels, F, interp):
    """L2 = Σ_b <G_b, dL/dx_b> of the reference (float64, exact positions)."""
    return (G * grid_input_grad_ref(x, theta, dL_dy, levels, F, interp, exact=True)).sum()


def hessian_vector_fd(x, theta, G, dL_dy, levels, F, interp, h=1e-6):
    """dL2/dx by central differences of the reference's first-order input gradient (float64)."""
    out = np.zeros(x.shape)
    x = x.astype(np.float64)
    for d in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, d] = h
        plus = (G * grid_input_grad_ref(x + e, theta, dL_dy, levels, F, interp, exact=True)).sum(1)
        minus = (G * grid_input_grad_ref(x - e, theta, dL_dy, levels, F, interp, exact=True)).sum(1)
        out[:, d] = (plus - minus) / (2 * h)
    return out


@pytest.mark.parametrize("name", ["Hash-2d-Smoothstep", "Dense-3d-Linear", "Tiled-1d-Smoothstep"])
def test_reference_second_order_param_gradient_is_the_derivative_of_L2(name):
    """L2 is linear in θ: the reference's dL2/dθ equals central differences of L2 in θ (float64)."""
    _, levels, c = encoding(name)
    rng = np.random.default_rng(2)
    n_params = c.F * sum(level.entries for level in levels)
    x = smooth_points(levels, c.D, rng, 9)
    theta = rng.uniform(-1, 1, n_params)
    G, dL_dy = rng.normal(size=(9, c.D)), rng.normal(size=(9, N_LEVELS * c.F))
    g = grid_second_order_param_grad_ref(x, G, dL_dy, levels, c.F, c.interpolation, n_params, exact=True)
    for i in np.flatnonzero(g)[:30]:
        e = np.zeros(n_params)
        e[i] = 1e-3
        fd = (second_order_loss_ref(x, theta + e, G, dL_dy, levels, c.F, c.interpolation)
              - second_order_loss_ref(x, theta - e, G, dL_dy, levels, c.F, c.interpolation)) / 2e-3
        assert abs(fd - g[i]) < 1e-8 * max(1.0, abs(g[i]))


@pytest.mark.parametrize("name", sample(SECOND_ORDER_CASES, keep=["Dense-1d-Nearest", "Tiled-1d-Linear", "Hash-1d-Smoothstep",
                                                                 "Hash-2d-Linear"]))   # every type and interpolation; 2-D cross terms
def test_grid_backward_backward_input(name):
    enc, levels, c = encoding(name)
    rng = np.random.default_rng(11)
    theta = random_params(enc, 12).astype(np.float64)
    B, raw = 48, N_LEVELS * c.F
    x = smooth_points(levels, c.D, rng, B)
    G = rng.normal(size=(B, c.D)).astype(np.float32)
    dL_dy = rng.normal(size=(B, enc.n_output_dims)).astype(np.float32)
    _, ctx = enc.forward(x)
    dx1 = enc.backward(ctx, dL_dy)
    first = enc.gradients()
    d_dy, dx = enc.backward_backward_input(ctx, G, dL_dy, mode="accumulate")
    assert d_dy.shape == (B, enc.n_output_dims) and dx.shape == (B, c.D)
    assert d_dy.dtype == dx.dtype == np.float32
    second_ref = grid_second_order_param_grad_ref(x, G, dL_dy, levels, c.F, c.interpolation, enc.n_params)
    assert_close(enc.gradients(), first + second_ref, rtol=1e-4, atol_rel=1e-5)
    d_dy2, dx2 = enc.backward_backward_input(ctx, G, dL_dy)                       # overwrite
    np.testing.assert_array_equal(d_dy2, d_dy)
    np.testing.assert_array_equal(dx2, dx)
    assert_close(enc.gradients(), second_ref, rtol=1e-4, atol_rel=1e-5)
    # dL2/d(dL/dy) = J G (0 in padded columns)
    J = grid_jacobian_ref(x, theta, levels, c.F, c.interpolation)
    assert_close(d_dy[:, :raw], np.einsum("bjd,bd->bj", J, G), rtol=1e-4, atol_rel=1e-5)
    assert not d_dy[:, raw:].any()
    if c.interpolation == "Nearest":                 # piecewise constant: every second-order term is 0
        assert not d_dy.any() and not dx.any() and not enc.gradients().any()
        return
    # dL2/dx against finite differences of the reference's first-order input gradient (float64) ...
    fd = hessian_vector_fd(x, theta, G.astype(np.float64), dL_dy[:, :raw].astype(np.float64), levels, c.F,
                           c.interpolation)
    assert_close(dx, fd, rtol=1e-3, atol_rel=1e-4)
    # ... and of tinn's own first-order backward (float32: h = 1e-3 / scale_max keeps the cells, rounding of
    # dL/dx (~1e-7 relative) over 2h allows 1e-2 of the largest value)
    h = np.float32(1e-3 / max(level.scale for level in levels))
    fd32 = np.zeros_like(dx, dtype=np.float64)
    for d in range(c.D):
        e = np.zeros_like(x)
        e[:, d] = h
        grads = []
        for z in (x + e, x - e):
            _, cz = enc.forward(z)
            grads.append((G.astype(np.float64) * enc.backward(cz, dL_dy, mode="accumulate")).sum(1))
        fd32[:, d] = (grads[0] - grads[1]) / (2 * np.float64(h))
    assert_close(dx, fd32, rtol=1e-2, atol_rel=1e-2)
    assert_close(dx1, grid_input_grad_ref(x, theta, dL_dy[:, :raw], levels, c.F, c.interpolation), rtol=1e-4,
                 atol_rel=1e-5)


@pytest.mark.parametrize("grid_type, interp", sample([("Hash", "Smoothstep"), ("Dense", "Linear"), ("Tiled", "Smoothstep")],
                                                    keep=[1]))
def test_grid_backward_backward_input_routed_and_padded(grid_type, interp):
    """A routed array of 3 grids (one idle in the second call) with an output padded to 8 columns."""
    D, F, K = 3, 1, 3
    cfg = {"otype": "Grid", "type": grid_type, "n_levels": N_LEVELS, "n_features_per_level": F, "base_resolution": 3,
           "per_level_scale": 1.5, "interpolation": interp, "log2_hashmap_size": 8}
    enc = tinn.create_encoding(D, cfg, alignment=8, n_instances=K)
    levels = grid_geometry(D, grid_type, N_LEVELS, 8, 3, 1.5)
    assert enc.n_output_dims == 8
    rng = np.random.default_rng(21)
    theta = rng.uniform(-1, 1, (K, enc.n_params)).astype(np.float32)
    enc.set_params(theta)
    for n_active in (K, K - 1):
        x = smooth_points(levels, D, rng, 90)
        inst = rng.integers(0, n_active, 90).astype(np.int32)
        G = rng.normal(size=(90, D)).astype(np.float32)
        dL_dy = rng.normal(size=(90, 8)).astype(np.float32)
        _, ctx = enc.forward(x, inst)
        enc.backward(ctx, dL_dy)                   # non-zero gradients underneath: overwrite must replace them
        d_dy, dx = enc.backward_backward_input(ctx, G, dL_dy)
        raw = N_LEVELS * F
        for k in range(K):
            m = inst == k
            ref = grid_second_order_param_grad_ref(x[m], G[m], dL_dy[m], levels, F, interp, enc.n_params)
            assert_close(enc.gradients()[k], ref, rtol=1e-4, atol_rel=1e-5, atol=1e-6)
            J = grid_jacobian_ref(x[m], theta[k], levels, F, interp)
            assert_close(d_dy[m, :raw], np.einsum("bjd,bd->bj", J, G[m]), rtol=1e-4, atol_rel=1e-5)
            fd = hessian_vector_fd(x[m], theta[k].astype(np.float64), G[m].astype(np.float64),
                                   dL_dy[m, :raw].astype(np.float64), levels, F, interp)
            assert_close(dx[m], fd, rtol=1e-3, atol_rel=1e-4)
        assert not d_dy[:, raw:].any()
    # a dense (K, B, D) batch gives the same results in its own layout
    x = smooth_points(levels, D, rng, K * 10).reshape(K, 10, D)
    G = rng.normal(size=(K, 10, D)).astype(np.float32)
    dL_dy = rng.normal(size=(K, 10, 8)).astype(np.float32)
    _, ctx = enc.forward(x)
    d_dy, dx = enc.backward_backward_input(ctx, G, dL_dy)
    assert d_dy.shape == (K, 10, 8) and dx.shape == (K, 10, D)
    g_dense = enc.gradients()
    inst = np.repeat(np.arange(K, dtype=np.int32), 10)
    _, ctx = enc.forward(x.reshape(-1, D), inst)
    d_dy_r, dx_r = enc.backward_backward_input(ctx, G.reshape(-1, D), dL_dy.reshape(-1, 8))
    np.testing.assert_array_equal(d_dy.reshape(-1, 8), d_dy_r)
    np.testing.assert_array_equal(dx.reshape(-1, D), dx_r)
    np.testing.assert_array_equal(enc.gradients(), g_dense)


def test_grid_backward_backward_input_checks_its_arguments():
    enc, levels, c = encoding("Hash-2d-Linear")
    x = np.random.default_rng(0).random((5, 2), dtype=np.float32)
    _, ctx = enc.forward(x)
    dy = np.zeros((5, enc.n_output_dims), np.float32)
    with pytest.raises(ValueError):
        enc.backward_backward_input(ctx, np.zeros((4, 2), np.float32), dy)
    with pytest.raises(ValueError):
        enc.backward_backward_input(ctx, np.zeros((5, 3), np.float32), dy)
    with pytest.raises(ValueError):
        enc.backward_backward_input(ctx, np.zeros((5, 2), np.float32), dy, mode="add")
