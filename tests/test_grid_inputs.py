"""Grid encodings on any finite input (spec §1.6.4–§1.6.6), against the NumPy reference.

tcnn forms ``p = floor(scale·x + 0.5)`` as an int, casts it to uint32 and reduces the vertex index
modulo the level's table size, so every x whose position fits in int32 has a defined result: a
negative coordinate wraps to a large unsigned one, a coordinate beyond the grid runs into other rows
or hashes. Here every grid type, dimension and interpolation is compared with ``tests/reference.py``
(written from the spec) on inputs from [-100, 100], [-1, 0), [1, 4) and next to every boundary
(0, 1, cell boundaries, the int32 limit); beyond the int32 range the result must be finite and
every read and write must stay in the level's own table.
"""
import subprocess
import sys
import textwrap
import zlib
from collections import namedtuple

import numpy as np
import pytest
import taichi as ti

import tinn
from reference import (assert_close, fd_input_gradient, grid_geometry, grid_input_grad_ref, grid_off_boundaries,
                       grid_param_grad_ref, grid_ref, padded)
from conftest import run_funcs, sample
from test_encodings import random_params

Case = namedtuple("Case", "type D interpolation F base b log2_T")
TYPES = ("Hash", "Dense", "Tiled")
INTERPOLATIONS = ("Nearest", "Linear", "Smoothstep")


def make_case(grid_type, D, interpolation):
    """Three small levels; the Hash grids' finest level is hashed (T = 2^(3D) < res^D), the Tiled grids'
    finer levels wrap (entries = 3^D); F varies with D so that 1, 2 and 4 features are covered."""
    F = {1: 4, 2: 2, 3: 1, 4: 2}[D]
    if grid_type == "Hash":
        return Case("Hash", D, interpolation, F, 4, 2.0, 3 * D)
    if grid_type == "Dense":
        return Case("Dense", D, interpolation, F, 3, 1.7, 19)
    return Case("Tiled", D, interpolation, F, 3, 1.5, 19)


CASES = {f"{t}-{D}d-{i}": make_case(t, D, i) for t in TYPES for D in (1, 2, 3, 4) for i in INTERPOLATIONS}
COVERING = ("Hash-4d-Nearest", "Dense-1d-Smoothstep", "Tiled-2d-Linear", "Dense-3d-Linear")
"""The default suite's cases: every type, dimension and interpolation at least once (the full suite runs all)."""
N_LEVELS = 3


def compiled(names):
    """Cases whose kernels a test compiles: a 4-D hash or dense grid's take 2-10 min through llvmpipe, so on Vulkan
    those run only with TINN_LONG_COMPILES=1 (the tiled 4-D cases keep four dimensions covered there)."""
    slow = pytest.mark.long_compile("a 4-D hash or dense grid's kernels: minutes through llvmpipe")
    return [pytest.param(n, marks=slow) if n.split("-")[:2] in (["Hash", "4d"], ["Dense", "4d"]) else n for n in names]


_encodings = {}


def encoding(name):
    """(encoding, reference levels, case): one tinn object per case (its kernels compile once)."""
    if name not in _encodings:
        c = CASES[name]
        cfg = {"otype": "Grid", "type": c.type, "n_levels": N_LEVELS, "n_features_per_level": c.F,
               "base_resolution": c.base, "per_level_scale": c.b, "interpolation": c.interpolation,
               "log2_hashmap_size": c.log2_T}
        enc = tinn.create_encoding(c.D, cfg)
        _encodings[name] = (enc, grid_geometry(c.D, c.type, N_LEVELS, c.log2_T, c.base, c.b), c)
    return _encodings[name]


def int32_limit(levels):
    """The largest |x| whose position fits in int32 at every level (a little inside, float32)."""
    return np.float32((2 ** 31 - 1024) / float(max(level.scale for level in levels)))


def boundary_values(levels, rng):
    """Values next to every boundary: 0 and 1 (both sides, by one ulp), cell boundaries pos = m of every
    level for positive and negative m (both sides), and the int32 limit of the finest level."""
    f32 = np.float32
    vals = [0.0, -0.0, 1.0, 0.5, -1.0, -1e-30, np.nextafter(f32(0), f32(-1)), np.nextafter(f32(0), f32(1)),
            np.nextafter(f32(1), f32(0)), np.nextafter(f32(1), f32(2))]
    for level in levels:
        for m in list(rng.integers(-200, 200, 6)) + [0, 1, int(level.res) - 1, int(level.res), int(level.res) + 1]:
            x = f32((m - 0.5) / float(level.scale))
            vals += [x, np.nextafter(x, f32(-np.inf)), np.nextafter(x, f32(np.inf))]
    lim = int32_limit(levels)
    vals += [lim, -lim, np.nextafter(lim, f32(0)), -np.nextafter(lim, f32(0)), lim / f32(3)]
    return np.array(vals, np.float32)


def finite_inputs(levels, D, rng, n=96):
    """Rows from [-100, 100], [-1, 0), [1, 4), and rows mixing boundary values across dims."""
    bvals = boundary_values(levels, rng)
    parts = [rng.uniform(-100, 100, (n, D)), rng.uniform(-1, 0, (n, D)), rng.uniform(1, 4, (n, D)),
             rng.choice(bvals, (4 * n, D)), np.repeat(bvals[:, None], D, axis=1)]
    return np.concatenate([p.astype(np.float32) for p in parts])


@pytest.mark.parametrize("name", sample(compiled(CASES), keep=COVERING))
def test_grid_matches_the_uint32_formula_on_finite_inputs(name):
    """Forward, parameter gradient and input gradient equal the reference on out-of-range and boundary inputs."""
    enc, levels, c = encoding(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    theta = random_params(enc, 1)
    x = finite_inputs(levels, c.D, rng)
    raw = N_LEVELS * c.F
    y, ctx = enc.forward(x)
    assert_close(y, padded(grid_ref(x, theta, levels, c.F, c.interpolation), enc.n_output_dims, 0.0),
                 rtol=1e-5, atol=1e-6)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    dx = enc.backward(ctx, dL_dy)
    assert_close(enc.gradients(), grid_param_grad_ref(x, dL_dy, levels, c.F, c.interpolation, enc.n_params),
                 rtol=1e-4, atol_rel=1e-5)
    assert_close(dx, grid_input_grad_ref(x, theta, dL_dy[:, :raw], levels, c.F, c.interpolation),
                 rtol=1e-4, atol_rel=1e-5)


@pytest.mark.parametrize("name", ["Hash-2d-Linear", "Dense-3d-Smoothstep", "Tiled-1d-Linear", "Hash-4d-Smoothstep",
                                  "Dense-2d-Smoothstep", "Tiled-3d-Smoothstep"])
def test_reference_input_gradient_is_the_derivative_of_the_reference(name):
    """The reference's analytic dL/dx (used above) equals central differences of its forward, off cell
    boundaries, also at negative coordinates and beyond 1 (float64; h = 1e-6, scale·h ≪ margin)."""
    _, levels, c = encoding(name)
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 4, (400, c.D))
    x = x[grid_off_boundaries(x, levels, 0.01)][:40]
    theta = rng.uniform(-1, 1, c.F * sum(level.entries for level in levels))
    dL_dy = rng.normal(size=(len(x), N_LEVELS * c.F))
    fd = fd_input_gradient(lambda z: grid_ref(z, theta, levels, c.F, c.interpolation, exact=True), x, dL_dy, 1e-6)
    analytic = grid_input_grad_ref(x, theta, dL_dy, levels, c.F, c.interpolation, exact=True)
    assert_close(analytic, fd, rtol=1e-5, atol_rel=1e-6)


def level_constant_params(enc, levels, F):
    """θ of level l, feature f = (l + 1) + f / 4: any read inside the level's table gives that value."""
    theta = np.empty(enc.n_params, np.float32)
    for l, level in enumerate(levels):
        block = theta[level.offset * F:(level.offset + level.entries) * F].reshape(level.entries, F)
        block[:] = (l + 1) + np.arange(F) / 4
    enc.set_params(theta)
    return theta


@pytest.mark.parametrize("name", sample(compiled(CASES), keep=COVERING))
def test_grid_beyond_int32_stays_in_each_level(name):
    """Positions beyond int32 (|x| up to 3.4e38, mixed with ordinary coordinates): outputs are finite and read
    only the level's own table; the parameter gradient of each level sums to that level's dL/dy (the corner
    weights sum to 1), so every write landed in the level's own table; the input gradient is finite."""
    enc, levels, c = encoding(name)
    rng = np.random.default_rng(5)
    level_constant_params(enc, levels, c.F)
    huge = np.float32(10.0) ** rng.uniform(8, 38.5, (256, c.D)).astype(np.float32)
    huge = np.where(rng.random((256, c.D)) < 0.5, -huge, huge)
    x = np.where(rng.random((256, c.D)) < 0.3, rng.uniform(-2, 3, (256, c.D)), huge).astype(np.float32)
    x[:4] = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, 2.0 ** 31, -2.0 ** 31], np.float32)[:, None]
    y, ctx = enc.forward(x)
    expected = np.repeat(np.arange(1, N_LEVELS + 1), c.F) + np.tile(np.arange(c.F) / 4, N_LEVELS)
    assert_close(y[:, :N_LEVELS * c.F], np.broadcast_to(expected, (len(x), N_LEVELS * c.F)), rtol=1e-5)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    dx = enc.backward(ctx, dL_dy)
    assert np.isfinite(dx).all()
    assert (np.abs(dx) <= 1e-3).all()       # equal values at every corner: no slope
    g = enc.gradients()
    for l, level in enumerate(levels):
        per_feature = g[level.offset * c.F:(level.offset + level.entries) * c.F].reshape(-1, c.F).sum(0)
        assert_close(per_feature, dL_dy[:, l * c.F:(l + 1) * c.F].astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    random_params(enc, 2)
    y, ctx = enc.forward(x)
    assert np.isfinite(y).all() and np.isfinite(enc.backward(ctx, dL_dy)).all()


@pytest.mark.parametrize("name", sample(compiled(["Hash-1d-Linear", "Hash-2d-Smoothstep", "Hash-3d-Nearest",
                                                  "Hash-4d-Linear", "Dense-1d-Smoothstep", "Dense-2d-Nearest",
                                                  "Dense-3d-Linear", "Dense-4d-Smoothstep", "Tiled-1d-Nearest",
                                                  "Tiled-2d-Linear", "Tiled-3d-Smoothstep", "Tiled-4d-Nearest"]),
                                         keep=("Hash-2d-Smoothstep", "Dense-3d-Linear", "Tiled-1d-Nearest")))
def test_grid_funcs_on_finite_inputs(name):
    """The per-sample func / backward_func equal the reference on out-of-range inputs too, and stay in each
    level's table beyond int32."""
    enc, levels, c = encoding(name)
    rng = np.random.default_rng(7)
    theta = random_params(enc, 3)
    x = finite_inputs(levels, c.D, rng, n=32)
    dy = rng.normal(size=(len(x), enc.n_output_dims)).astype(np.float32)
    y, dx, g = run_funcs(enc, x, dy)
    raw = N_LEVELS * c.F
    assert_close(y, padded(grid_ref(x, theta, levels, c.F, c.interpolation), enc.n_output_dims, 0.0),
                 rtol=1e-5, atol=1e-6)
    assert_close(dx, grid_input_grad_ref(x, theta, dy[:, :raw], levels, c.F, c.interpolation), rtol=1e-4, atol_rel=1e-5)
    assert_close(g, grid_param_grad_ref(x, dy, levels, c.F, c.interpolation, enc.n_params), rtol=1e-4, atol_rel=1e-5)
    level_constant_params(enc, levels, c.F)
    huge = np.array([[3e38] * c.D, [-3e38] * c.D, [1e12] * c.D, [-7e9] * c.D], np.float32)
    y, dx, g = run_funcs(enc, huge, dy[:4])
    expected = np.repeat(np.arange(1, N_LEVELS + 1), c.F) + np.tile(np.arange(c.F) / 4, N_LEVELS)
    assert_close(y[:, :raw], np.broadcast_to(expected, (4, raw)), rtol=1e-6)
    assert np.isfinite(dx).all()
    for l, level in enumerate(levels):
        per_feature = g[level.offset * c.F:(level.offset + level.entries) * c.F].reshape(-1, c.F).sum(0)
        assert_close(per_feature, dy[:4, l * c.F:(l + 1) * c.F].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


TRAINING_SCRIPT = """
import numpy as np, taichi as ti, tinn, sys
ti.init(arch=ti.cpu, log_level=ti.ERROR)
rng = np.random.default_rng(0)
net = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
for grid_type in ("Hash", "Dense", "Tiled"):
    for D in (2, 3):
        enc = {"otype": "Grid", "type": grid_type, "n_levels": 4, "log2_hashmap_size": 10, "base_resolution": 4}
        model = tinn.create_from_config(D, 2, {"encoding": enc, "network": net})
        for step in range(6):
            x = rng.uniform(-100, 100, (512, D)).astype(np.float32)
            x[::5] = rng.uniform(-1, 0, (len(x[::5]), D))
            x[1::5] = rng.uniform(1, 4, (len(x[1::5]), D))
            x[2::7] = np.float32(3e38) * np.sign(rng.normal(size=(len(x[2::7]), D)))
            loss = model.trainer.training_step(x, rng.random((512, 2), dtype=np.float32))
            assert np.isfinite(loss), (grid_type, D, step, loss)
        assert np.isfinite(model.network.params()).all(), (grid_type, D)
        assert np.isfinite(model.network.inference(x)).all(), (grid_type, D)
model = tinn.create_from_config(2, 3, sys.argv[1])
for step in range(20):                                       # tcnn's config_hash on inputs in [-1, 1]
    model.trainer.training_step(rng.uniform(-1, 1, (4096, 2)).astype(np.float32),
                                rng.random((4096, 3), dtype=np.float32))
assert np.isfinite(model.network.params()).all()
print("trained")
"""


@pytest.mark.arch_independent("the subprocess starts ti.cpu whatever TINN_ARCH is")
@pytest.mark.full_only("a cold process training a hash grid; the in-process tests check the same inputs' values")
def test_training_on_out_of_range_inputs_in_a_subprocess():
    """Training steps on inputs far outside [0, 1] (a crash would kill pytest, so they run in a child process)."""
    config = "config_hash"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(TRAINING_SCRIPT), config],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained" in result.stdout
