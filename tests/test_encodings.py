"""Encodings (spec §1.0–1.2, §1.6) against independent NumPy references.

The references (``tests/reference.py``) are written from ``shared/spec/TCNN_REFERENCE.md``;
nothing here computes an expected value with tinn code. Forward values are compared
with a float64 evaluation of the formula, analytic gradients with central finite
differences of that reference (float64) or with the reference's own gradient,
which is itself checked against finite differences first. Every registered encoding
is also swept in ``tests/test_registry_sweep.py``.
"""
from collections import namedtuple

import numpy as np
import pytest

import tinn
from conftest import sample
from reference import (assert_close, assert_within, coherent_prime_hash, fd_input_gradient, frequency_grad_ref,
                       frequency_ref, grid_geometry, grid_index, grid_param_grad_ref, grid_ref, identity_grad_ref,
                       identity_ref, interior_points, next_multiple, padded)


# ---------------------------------------------------------------------------------------------
# §1.1 Identity
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale, offset", [(1.0, 0.0), (2.5, -0.75)])
@pytest.mark.parametrize("batch", [1, 3, 257])
def test_identity_forward_backward(scale, offset, batch):
    rng = np.random.default_rng(batch)
    cfg = {"otype": "Identity"} if (scale, offset) == (1.0, 0.0) else {"otype": "Identity", "scale": scale,
                                                                       "offset": offset}
    enc = tinn.create_encoding(3, cfg)
    assert enc.n_output_dims == 3 and enc.n_params == 0
    x = rng.uniform(-1, 2, (batch, 3)).astype(np.float32)   # Identity is defined for any real input (§0.3)
    y, ctx = enc.forward(x)
    assert y.shape == (batch, 3) and y.dtype == np.float32
    assert_close(y, identity_ref(x, scale, offset), rtol=1e-6, atol=1e-6)
    assert_close(enc.inference(x), y, rtol=0, atol=0)
    dL_dy = rng.normal(size=(batch, 3)).astype(np.float32)
    dx = enc.backward(ctx, dL_dy)
    assert_close(dx, identity_grad_ref(dL_dy, scale), rtol=1e-6, atol=1e-7)
    # The reference gradient is the derivative of the reference forward.
    assert_close(identity_grad_ref(dL_dy, scale),
                 fd_input_gradient(lambda z: identity_ref(z, scale, offset), x, dL_dy, 1e-4), rtol=1e-8, atol=1e-9)


def test_identity_padding_is_one_after_the_values():
    """§1.0: create_encoding(..., alignment=16) pads 3 → 16 columns with 1; padded gradients are ignored."""
    rng = np.random.default_rng(1)
    enc = tinn.create_encoding(3, {"otype": "Identity", "scale": 0.5, "offset": 0.25}, alignment=16)
    assert enc.n_output_dims == enc.padded_output_width == 16
    x = rng.random((5, 3)).astype(np.float32)
    y, ctx = enc.forward(x)
    assert y.shape == (5, 16)
    assert_close(y, padded(identity_ref(x, 0.5, 0.25), 16, 1.0), rtol=1e-6, atol=1e-7)
    dL_dy = rng.normal(size=(5, 16)).astype(np.float32)     # non-zero on the padded columns too
    assert_close(enc.backward(ctx, dL_dy), identity_grad_ref(dL_dy[:, :3], 0.5), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# §1.2 Frequency
# ---------------------------------------------------------------------------------------------


def frequency_phase_error(x, F):
    """Bound on the float32 error of the phase 2^f·π·x (+π/2), per output column.

    A float32 implementation rounds the phase, whose magnitude is up to 2^f·π·|x|, to 24 bits,
    so at f = 11 (the 12th frequency) the phase alone is uncertain by ~2.4e-4 radians: sin/cos of
    it cannot match the float64 reference to 1e-6. We allow 4 half-ulps of the phase plus 1e-6.
    """
    mag = np.abs(x.astype(np.float64)).max(initial=1.0)
    cols = [2.0 ** f * np.pi * mag + s * np.pi / 2 for f in range(F) for s in range(2)]
    return np.tile(np.array(cols) * 2.0 ** -22, x.shape[1]) + 1e-6


def test_frequency_worked_example():
    """§1.2: x = 0.3, F = 2 → [0.809017, 0.587785, 0.951057, −0.309017]."""
    enc = tinn.create_encoding(1, {"otype": "Frequency", "n_frequencies": 2})
    assert enc.n_output_dims == 4 and enc.n_params == 0
    y = enc.inference(np.array([[0.3]], np.float32))
    np.testing.assert_allclose(y[0], [0.809017, 0.587785, 0.951057, -0.309017], atol=1e-6)
    np.testing.assert_allclose(frequency_ref(np.array([[0.3]]), 2)[0], [0.809017, 0.587785, 0.951057, -0.309017],
                               atol=1e-6)


@pytest.mark.parametrize("n_dims, F, alignment, batch, span", [
    (2, 5, 0, 257, 1.0), (3, 12, 16, 3, 1.0), (1, 3, 16, 1, 1.0), (2, 4, 16, 9000, 1.0),
    (2, 12, 0, 70_000, 8.0)])   # several blocks of host sines, three restarts of the doubling, |x| up to 8
def test_frequency_forward_and_padding(n_dims, F, alignment, batch, span):
    """Raw width n·2F; with alignment 16 the padding is 1, placed after the values (§1.0)."""
    rng = np.random.default_rng(F)
    cfg = {"otype": "Frequency", "n_frequencies": F}
    enc = tinn.create_encoding(n_dims, cfg, alignment=alignment)
    raw = n_dims * 2 * F
    width = next_multiple(raw, alignment) if alignment else raw
    assert enc.n_output_dims == enc.padded_output_width == width
    x = (span * (2 * rng.random((batch, n_dims)) - 1) if span > 1 else rng.random((batch, n_dims))).astype(np.float32)
    y, _ = enc.forward(x)
    assert y.shape == (batch, width)
    atol = np.concatenate([frequency_phase_error(x, F), np.full(width - raw, 1e-7)])
    assert_within(y, padded(frequency_ref(x, F), width, 1.0), atol)
    assert_close(enc.inference(x), y, rtol=0, atol=0)


def test_frequency_reference_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.random((16, 2))
    dL_dy = rng.normal(size=(16, 2 * 2 * 6))
    assert_close(frequency_grad_ref(x, dL_dy, 6), fd_input_gradient(lambda z: frequency_ref(z, 6), x, dL_dy, 1e-6),
                 rtol=1e-6, atol_rel=1e-7)


@pytest.mark.parametrize("n_dims, F, alignment, batch", [(2, 5, 0, 257), (3, 12, 16, 3), (1, 3, 16, 1)])
def test_frequency_backward(n_dims, F, alignment, batch):
    """dL/dx vs the reference gradient; dL/dy on padded columns is ignored (§1.0)."""
    rng = np.random.default_rng(10 + F)
    enc = tinn.create_encoding(n_dims, {"otype": "Frequency", "n_frequencies": F}, alignment=alignment)
    raw = n_dims * 2 * F
    x = rng.random((batch, n_dims)).astype(np.float32)
    dL_dy = rng.normal(size=(batch, enc.n_output_dims)).astype(np.float32)
    _, ctx = enc.forward(x)
    dx = enc.backward(ctx, dL_dy)
    assert dx.shape == x.shape
    expected = frequency_grad_ref(x, dL_dy[:, :raw], F)
    # Each term 2^f·π·cos(phase) inherits the float32 phase error (see frequency_phase_error).
    err = frequency_phase_error(x, F)[:raw]
    term_scale = np.tile([2.0 ** f * np.pi for f in range(F) for _ in range(2)], n_dims)
    atol = (np.abs(dL_dy[:, :raw]) * term_scale * err).reshape(batch, n_dims, 2 * F).sum(-1)
    assert_within(dx, expected, atol + 1e-5 * np.abs(expected) + 1e-6)
    assert enc.backward(ctx, dL_dy, input_gradient=False) is None


# ---------------------------------------------------------------------------------------------
# §1.6 Grid encodings: the reference reproduces the spec's numbers
# ---------------------------------------------------------------------------------------------

def test_coherent_prime_hash_examples():
    """§1.6.4: hash(5,7) = 1401181138, hash(100,200,300) = 3655970992, and their table slots."""
    assert int(coherent_prime_hash([5, 7])) == 1401181138
    assert int(coherent_prime_hash([5, 7])) % 2 ** 15 == 21458
    assert int(coherent_prime_hash([5, 7])) % 2 ** 19 == 283602
    assert int(coherent_prime_hash([100, 200, 300])) == 3655970992
    assert int(coherent_prime_hash([100, 200, 300])) % 2 ** 15 == 12464
    assert int(coherent_prime_hash([100, 200, 300])) % 2 ** 19 == 110768


CONFIG_HASH_TABLE = [  # §1.6.9: level, scale (fp32, as printed), resolution, entries, hashed, entry offset
    (0, 15, 16, 256, False, 0), (1, 23, 24, 576, False, 256), (2, 35, 36, 1296, False, 832),
    (3, 53, 54, 2920, False, 2128), (4, 79.99999, 81, 6568, False, 5048), (5, 120.5, 122, 14888, False, 11616),
    (6, 181.25, 183, 32768, True, 26504), (7, 272.375, 274, 32768, True, 59272),
    (8, 409.062, 411, 32768, True, 92040), (9, 614.094, 616, 32768, True, 124808),
    (10, 921.64, 923, 32768, True, 157576), (11, 1382.96, 1384, 32768, True, 190344),
    (12, 2074.94, 2076, 32768, True, 223112), (13, 3112.91, 3114, 32768, True, 255880),
    (14, 4669.87, 4671, 32768, True, 288648), (15, 7005.3, 7007, 32768, True, 321416),
]

CONFIG_HASH_ENCODING = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                        "base_resolution": 16, "per_level_scale": 1.5, "fixed_point_pos": False}


def test_grid_geometry_reproduces_config_hash_table():
    """§1.6.9 table, and the float32 subtlety of §1.6.2 (level 3: scale 53.0 → res 54, not 55)."""
    levels = grid_geometry(2, "Hash", 16, 15, 16, 1.5)
    for (l, scale, res, entries, hashed, offset), level in zip(CONFIG_HASH_TABLE, levels):
        assert abs(float(level.scale) - scale) <= 5e-4 * max(1.0, scale / 100), l
        assert (level.res, level.entries, level.hashed, level.offset) == (res, entries, hashed, offset), l
    # Level 4: the table prints 79.99999 (tcnn's exp2f); a correctly rounded float32 exp2 (spec §8 A4) gives
    # exactly 80.0. Both give res 81, which is what sizes and indexes the level.
    assert levels[3].scale == np.float32(53.0) and levels[3].res == 54
    assert levels[-1].offset + levels[-1].entries == 354184


def test_config_hash_grid_n_params():
    """§1.6.9: 708,368 parameters, output width 32 (no padding at alignment 16)."""
    enc = tinn.create_encoding(2, CONFIG_HASH_ENCODING)
    assert enc.n_params == 708368 == 2 * sum(level.entries for level in grid_geometry(2, "Hash", 16, 15, 16, 1.5))
    assert enc.n_output_dims == 32
    assert tinn.create_encoding(2, CONFIG_HASH_ENCODING, alignment=16).n_output_dims == 32


def test_tcnn_test_grid_cu_n_params():
    """§1.6.9: tcnn's test_grid.cu — 3-D, base 32, b 1.5, T 2^16, 20 levels → 2,555,904 params."""
    cfg = {"otype": "HashGrid", "n_levels": 20, "n_features_per_level": 2, "log2_hashmap_size": 16,
           "base_resolution": 32, "per_level_scale": 1.5}
    levels = grid_geometry(3, "Hash", 20, 16, 32, 1.5)
    assert levels[0].entries == 32 ** 3 and not levels[0].hashed
    assert levels[1].hashed and levels[2].hashed
    assert 2 * sum(level.entries for level in levels) == 2555904
    assert tinn.create_encoding(3, cfg).n_params == 2555904


@pytest.mark.parametrize("otype, D, expected_type", [("DenseGrid", 2, "Dense"), ("TiledGrid", 3, "Tiled"),
                                                     ("HashGrid", 3, "Hash"), ("Grid", 2, "Hash")])
def test_grid_otype_sets_default_type(otype, D, expected_type):
    """§1.6: the otype only changes the default ``type``; n_params follows §1.6.3 for that type.

    Dense's default per_level_scale is exp(ln(256 / N_min) / (L − 1)) (here 8 → res 4, 32, 256).
    """
    cfg = {"otype": otype, "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 10, "base_resolution": 4}
    if expected_type != "Dense":
        cfg["per_level_scale"] = 2.0
    b = np.exp(np.log(256 / 4) / 2) if expected_type == "Dense" else 2.0
    levels = grid_geometry(D, expected_type, 3, 10, 4, b)
    if expected_type == "Dense":
        assert [level.res for level in levels] == [4, 32, 256]
    assert tinn.create_encoding(D, cfg).n_params == 2 * sum(level.entries for level in levels)


def test_grid_names_are_case_insensitive():
    """§0.4: otype and ``type`` values match case-insensitively ("tiled" caps every level at N_min^D = 16)."""
    cfg = {"otype": "hashgrid", "type": "tiled", "n_levels": 2, "n_features_per_level": 1, "base_resolution": 4,
           "per_level_scale": 2.0, "interpolation": "smoothstep"}
    assert tinn.create_encoding(2, cfg).n_params == 32 == sum(level.entries
                                                              for level in grid_geometry(2, "Tiled", 2, 19, 4, 2.0))


def test_grid_n_features_alternative_to_n_levels():
    """§1.6.1: n_features = L · F may replace n_levels; giving both is an error."""
    base = {"otype": "HashGrid", "n_features_per_level": 2, "log2_hashmap_size": 8, "base_resolution": 4}
    enc = tinn.create_encoding(2, {**base, "n_features": 8})
    assert enc.n_output_dims == 8
    assert enc.n_params == 2 * sum(level.entries for level in grid_geometry(2, "Hash", 4, 8, 4, 2.0))
    with pytest.raises(ValueError):
        tinn.create_encoding(2, {**base, "n_features": 8, "n_levels": 4})


def test_grid_init_range():
    """§1.6.3: every parameter uniform in [−1e−4, 1e−4]."""
    enc = tinn.create_encoding(2, {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2,
                                   "log2_hashmap_size": 10, "base_resolution": 16})
    p = enc.params()
    assert p.shape == (enc.n_params,) and p.dtype == np.float32
    assert np.abs(p).max() <= 1e-4
    assert p.max() > 0.95e-4 and p.min() < -0.95e-4                 # the whole range is used
    assert abs(p.mean()) < 0.1e-4 and abs(p.std() - 1e-4 / np.sqrt(3)) < 0.1e-4   # uniform: σ = a/√3
    assert len(np.unique(p)) > 0.99 * p.size


# ---------------------------------------------------------------------------------------------
# §1.6 Grid encodings: tinn vs the reference
# ---------------------------------------------------------------------------------------------

GridCase = namedtuple("GridCase", "D otype type interpolation n_levels F log2_T base b alignment")

GRID_CASES = {
    "hash-2d-linear": GridCase(2, "HashGrid", "Hash", "Linear", 4, 2, 8, 8, 1.5, 0),
    "hash-3d-linear-pad16": GridCase(3, "Grid", "Hash", "Linear", 4, 1, 10, 4, 2.0, 16),
    "hash-2d-smoothstep-align6": GridCase(2, "HashGrid", "Hash", "Smoothstep", 2, 4, 6, 6, 1.5, 6),
    "hash-2d-nearest": GridCase(2, "HashGrid", "Hash", "Nearest", 4, 2, 8, 8, 2.0, 0),
    "hash-3d-nearest": GridCase(3, "HashGrid", "Hash", "Nearest", 6, 2, 8, 16, 2.0, 0),
    "dense-2d-linear-pad16": GridCase(2, "DenseGrid", "Dense", "Linear", 3, 2, 19, 4, 1.5, 16),
    "dense-3d-smoothstep": GridCase(3, "DenseGrid", "Dense", "Smoothstep", 3, 2, 19, 3, 2.0, 0),
    "tiled-2d-linear": GridCase(2, "TiledGrid", "Tiled", "Linear", 3, 2, 19, 4, 2.0, 0),
    "tiled-3d-nearest": GridCase(3, "TiledGrid", "Tiled", "Nearest", 3, 1, 19, 3, 1.5, 0),
    "hash-1d-linear": GridCase(1, "HashGrid", "Hash", "Linear", 4, 2, 4, 8, 2.0, 0),
    "hash-4d-linear": GridCase(4, "HashGrid", "Hash", "Linear", 3, 2, 8, 2, 2.0, 0),
}
SMOOTH_CASES = [k for k, c in GRID_CASES.items() if c.interpolation != "Nearest"]
NEAREST_CASES = [k for k, c in GRID_CASES.items() if c.interpolation == "Nearest"]
DEFAULT_GRIDS = ["hash-3d-linear-pad16", "hash-2d-smoothstep-align6", "dense-2d-linear-pad16", "tiled-3d-nearest",
                 "hash-1d-linear"]
"""The default suite's covering sample of the grid cases (each compiles the grid's kernels): every type,
interpolation, 1-3 D, padding and alignment; the full suite runs all (4-D: test_grid_inputs by default)."""

def grid_config(case):
    cfg = {"otype": case.otype, "n_levels": case.n_levels, "n_features_per_level": case.F,
           "base_resolution": case.base, "per_level_scale": case.b, "interpolation": case.interpolation}
    if case.type == "Hash":
        cfg["log2_hashmap_size"] = case.log2_T
    return cfg


@pytest.fixture(scope="module")
def grid():
    """``grid(name)`` -> (encoding, reference levels, case): one tinn object per case, built once for this
    module's tests (kernels compile per object)."""
    built = {}

    def get(name):
        if name not in built:
            case = GRID_CASES[name]
            enc = tinn.create_encoding(case.D, grid_config(case), alignment=case.alignment)
            built[name] = (enc, grid_geometry(case.D, case.type, case.n_levels, case.log2_T, case.base, case.b), case)
        return built[name]

    return get


def random_params(enc, seed):
    """Parameters of order 1 (the ±1e-4 init would make every comparison trivially small)."""
    p = np.random.default_rng(seed).uniform(-1, 1, enc.n_params).astype(np.float32)
    enc.set_params(p)
    return p


@pytest.mark.parametrize("name", list(GRID_CASES))
def test_grid_sizes(grid, name):
    """n_params = F · Σ entries_l (§1.6.3); width L·F padded to lcm(alignment, F) with zeros (§1.0)."""
    enc, levels, case = grid(name)
    assert enc.n_params == case.F * sum(level.entries for level in levels)
    raw = case.n_levels * case.F
    width = next_multiple(raw, np.lcm(case.alignment, case.F)) if case.alignment else raw
    assert enc.n_output_dims == enc.padded_output_width == width


def test_grid_cases_cover_dense_and_hashed_levels(grid):
    """Sanity of the test matrix: the Hash cases mix dense-indexed and hashed levels (§1.6.4)."""
    for name in ("hash-2d-linear", "hash-3d-linear-pad16", "hash-2d-smoothstep-align6", "hash-2d-nearest",
                 "hash-1d-linear", "hash-4d-linear"):
        hashed = [level.hashed for level in grid(name)[1]]
        assert any(hashed) and not all(hashed), name
    assert all(level.hashed for level in grid("hash-3d-nearest")[1])
    # hash-2d-nearest level 1: 16² = 256 = T entries, so it is still indexed densely ("hashmap_size < stride").
    assert grid("hash-2d-nearest")[1][1].entries == 256 and not grid("hash-2d-nearest")[1][1].hashed
    # Tiled: entries capped at N_min^D, so the finer levels repeat periodically.
    assert [level.entries for level in grid("tiled-2d-linear")[1]] == [16, 16, 16]


@pytest.mark.parametrize("name", sample(list(GRID_CASES), keep=DEFAULT_GRIDS))
@pytest.mark.parametrize("batch", [1, 3, 257])
def test_grid_forward(grid, name, batch):
    """Forward vs §1.6.5; padded columns are 0; inference equals forward."""
    enc, levels, case = grid(name)
    rng = np.random.default_rng(batch)
    p = random_params(enc, 1)
    if case.interpolation == "Nearest":     # Nearest jumps at cell boundaries: stay off them
        x = interior_points(rng, batch, case.D, levels, margin=1e-3)
    else:
        x = rng.random((batch, case.D)).astype(np.float32)
    y, _ = enc.forward(x)
    assert y.shape == (batch, enc.n_output_dims) and y.dtype == np.float32
    assert_close(y, padded(grid_ref(x, p, levels, case.F, case.interpolation), enc.n_output_dims, 0.0),
                 rtol=1e-5, atol=1e-6)
    assert_close(enc.inference(x), y, rtol=0, atol=0)


@pytest.mark.full_only("a 4-D grid of its own; 4-D inputs run in test_grid_inputs by default")
def test_grid_4d_x_at_the_upper_edge(grid):
    """Inputs at the edge of [0, 1]: corners reach res_l and the dense index wraps by mod (§1.6.4)."""
    enc, levels, case = grid("hash-4d-linear")
    p = random_params(enc, 2)
    x = np.array([[0.999, 0.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    assert_close(enc.inference(x), grid_ref(x, p, levels, case.F, case.interpolation), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dense-2d-linear-pad16", "dense-3d-smoothstep"])
def test_dense_grid_corner_reaching_resolution_wraps(grid, name):
    """§1.6.4: at x near 1 a corner coordinate equals res_l; its dense index runs into the next row, mod entries."""
    enc, levels, case = grid(name)
    p = random_params(enc, 3)
    x = np.full((3, case.D), 0.3, np.float32)
    x[0, 0] = 0.999
    x[1, -1] = 0.999
    x[2, :] = 0.999
    corner_hits = [np.floor(level.scale * np.float32(0.999) + np.float32(0.5)) + 1 == level.res for level in levels]
    assert any(corner_hits)     # the case really exercises the wrap
    y = enc.inference(x)
    assert_close(y, padded(grid_ref(x, p, levels, case.F, case.interpolation), enc.n_output_dims, 0.0),
                 rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sample(list(GRID_CASES), keep=DEFAULT_GRIDS))
def test_grid_param_gradient(grid, name):
    """§1.6.6: parameter gradient = scatter of weight·dL/dy (np.add.at); padded dL/dy is ignored."""
    enc, levels, case = grid(name)
    rng = np.random.default_rng(5)
    random_params(enc, 4)
    x = interior_points(rng, 257, case.D, levels, margin=1e-3)
    dL_dy = rng.normal(size=(257, enc.n_output_dims)).astype(np.float32)   # includes padded columns
    _, ctx = enc.forward(x)
    assert enc.backward(ctx, dL_dy, input_gradient=False) is None
    expected = grid_param_grad_ref(x, dL_dy, levels, case.F, case.interpolation, enc.n_params)
    g = enc.gradients()
    assert g.shape == (enc.n_params,) and g.dtype == np.float32
    assert_close(g, expected, rtol=1e-4, atol_rel=1e-5)


def test_grid_reference_gradient_is_the_derivative_of_the_reference(grid):
    """The forward is linear in θ, so the scatter of weights equals finite differences in θ (float64)."""
    enc, levels, case = grid("hash-2d-smoothstep-align6")
    rng = np.random.default_rng(6)
    x = rng.random((7, 2))
    p = rng.uniform(-1, 1, enc.n_params)
    dL_dy = rng.normal(size=(7, case.n_levels * case.F))
    g = grid_param_grad_ref(x.astype(np.float32), dL_dy, levels, case.F, case.interpolation, enc.n_params)
    touched = np.flatnonzero(g)[:40]
    for i in touched:
        e = np.zeros_like(p)
        e[i] = 1e-3
        L = [(grid_ref(x.astype(np.float32), q, levels, case.F, case.interpolation) * dL_dy).sum() for q in (p + e, p - e)]
        assert abs((L[0] - L[1]) / 2e-3 - g[i]) < 1e-8 * max(1.0, abs(g[i]))


@pytest.mark.parametrize("name", sample(SMOOTH_CASES, keep=[n for n in DEFAULT_GRIDS if n in SMOOTH_CASES]))
def test_grid_input_gradient(grid, name):
    """§1.6.6: analytic dL/dx vs central differences (h = 1e−4, float64) of the reference, off cell boundaries."""
    enc, levels, case = grid(name)
    rng = np.random.default_rng(7)
    p = random_params(enc, 8)
    x = interior_points(rng, 64, case.D, levels, margin=0.01)   # scale·h ≤ 0.0063 < margin
    dL_dy = rng.normal(size=(64, enc.n_output_dims)).astype(np.float32)
    _, ctx = enc.forward(x)
    dx = enc.backward(ctx, dL_dy)
    assert dx.shape == x.shape and dx.dtype == np.float32
    raw = case.n_levels * case.F
    fd = fd_input_gradient(lambda z: grid_ref(z, p, levels, case.F, case.interpolation, exact=True),
                           x, dL_dy[:, :raw].astype(np.float64), 1e-4)
    assert_close(dx, fd, rtol=1e-3, atol_rel=1e-4)


@pytest.mark.parametrize("name", NEAREST_CASES)
def test_grid_nearest_input_gradient_is_zero(grid, name):
    """§1.6.5: Nearest has zero input gradient."""
    enc, levels, case = grid(name)
    rng = np.random.default_rng(9)
    random_params(enc, 9)
    x = interior_points(rng, 16, case.D, levels, margin=1e-3)
    _, ctx = enc.forward(x)
    dx = enc.backward(ctx, rng.normal(size=(16, enc.n_output_dims)).astype(np.float32))
    np.testing.assert_array_equal(dx, np.zeros_like(x))


@pytest.mark.parametrize("name", sample(["hash-2d-linear", "dense-3d-smoothstep", "hash-3d-nearest"],
                                         keep=["hash-2d-linear", "hash-3d-nearest"]))
def test_grid_gradient_modes(grid, name):
    """§5.3: mode='accumulate' adds to the parameter gradients; the default 'overwrite' replaces them."""
    enc, levels, case = grid(name)
    rng = np.random.default_rng(11)
    random_params(enc, 10)
    x1 = interior_points(rng, 20, case.D, levels, margin=1e-3)
    x2 = interior_points(rng, 9, case.D, levels, margin=1e-3)
    g1 = rng.normal(size=(20, enc.n_output_dims)).astype(np.float32)
    g2 = rng.normal(size=(9, enc.n_output_dims)).astype(np.float32)
    ref1 = grid_param_grad_ref(x1, g1, levels, case.F, case.interpolation, enc.n_params)
    ref2 = grid_param_grad_ref(x2, g2, levels, case.F, case.interpolation, enc.n_params)
    _, c1 = enc.forward(x1)
    _, c2 = enc.forward(x2)                 # two contexts alive at once
    enc.backward(c1, g1)
    enc.backward(c2, g2, mode="accumulate")
    assert_close(enc.gradients(), ref1 + ref2, rtol=1e-4, atol_rel=1e-5)
    enc.backward(c2, g2)
    assert_close(enc.gradients(), ref2, rtol=1e-4, atol_rel=1e-5)
    enc.backward(c1, g1, mode="overwrite")
    assert_close(enc.gradients(), ref1, rtol=1e-4, atol_rel=1e-5)


# ---------------------------------------------------------------------------------------------
# §1.6.3 parameter layout: params[(offset_l + index) · F + f]
# ---------------------------------------------------------------------------------------------

def layout_probe(enc, levels, case, level, p):
    """Set θ_i = i and read, with Nearest at x = p / scale_l (pos = p + 0.5), the flat parameter index per output."""
    enc.set_params(np.arange(enc.n_params, dtype=np.float32))      # exact in float32 (n_params < 2^24)
    x = (np.array(p, np.float64) / np.float64(levels[level].scale)).astype(np.float32)[None]
    assert (np.floor(levels[level].scale * x + np.float32(0.5)) == np.array(p)).all()
    return x, enc.inference(x)[0]


def test_grid_layout_2d_hash_example(grid):
    """The hashed level of a 2-D grid reads entry hash(5,7) mod T = 1401181138 mod 256 at p = (5, 7)."""
    enc, levels, case = grid("hash-2d-nearest")
    F = case.F
    assert levels[3].hashed and levels[3].entries == 256
    x, y = layout_probe(enc, levels, case, 3, [5, 7])
    expected_entry = 1401181138 % 256
    np.testing.assert_array_equal(y[3 * F:4 * F], [(levels[3].offset + expected_entry) * F + f for f in range(F)])
    # Every level: y_{l,f} = params[(offset_l + index_l(floor(scale_l·x + 0.5)))·F + f].
    for l, level in enumerate(levels):
        idx = grid_index(np.floor(level.scale * x + np.float32(0.5)).astype(np.int64), level)[0]
        np.testing.assert_array_equal(y[l * F:(l + 1) * F], (level.offset + idx) * F + np.arange(F))


def test_grid_layout_3d_hash_example(grid):
    """At p = (100, 200, 300) the finest 3-D level reads entry 3655970992 mod 256."""
    enc, levels, case = grid("hash-3d-nearest")
    F = case.F
    assert levels[5].scale == 511 and levels[5].hashed
    x, y = layout_probe(enc, levels, case, 5, [100, 200, 300])
    np.testing.assert_array_equal(y[5 * F:6 * F], [(levels[5].offset + 3655970992 % 256) * F + f for f in range(F)])
    for l, level in enumerate(levels):
        idx = grid_index(np.floor(level.scale * x + np.float32(0.5)).astype(np.int64), level)[0]
        np.testing.assert_array_equal(y[l * F:(l + 1) * F], (level.offset + idx) * F + np.arange(F))


def test_grid_layout_dense_and_tiled(grid):
    """Dense index Σ_d p_d·res^d, and Tiled's periodic index mod N_min^D, at a known vertex."""
    enc, levels, case = grid("tiled-3d-nearest")
    x, y = layout_probe(enc, levels, case, 2, [5, 1, 3])
    level = levels[2]
    assert level.entries == 27 and level.res > 3                      # the finest level tiles
    assert y[2] == level.offset + (5 + 1 * level.res + 3 * level.res ** 2) % 27
    assert y[0] == levels[0].offset + grid_index(np.floor(levels[0].scale * x + np.float32(0.5)).astype(np.int64),
                                                 levels[0])[0]
