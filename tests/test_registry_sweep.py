"""Registry sweep: every registered encoding otype, loss otype and activation against the spec's formulas.

The tests iterate over ``tinn.registry.encodings.names()``, ``tinn.registry.losses.names()`` and
``tinn.networks.activations.NAMES``, so a component registered later is swept automatically,
and the sweep FAILS for a registered name that has no representative case below: add one
(a config small enough to compile fast) and, if it is a new formula, a reference in
``tests/reference.py``.

For every encoding case: output width and parameter count, forward values against the
float64 NumPy reference (padding included), ``inference == forward``, the input gradient
against central finite differences of the reference (float64), the parameter gradient
against the reference's, and the ``hyperparams()`` round trip. For every loss: value and
gradient against §3.2 with and without a pdf, padded columns, finite differences where the
gradient column is the true derivative. For every activation: value and derivative, as a
hidden and as an output activation.
"""
from collections import namedtuple

import numpy as np
import pytest

import tinn
from tinn.networks.activations import NAMES as ACTIVATION_NAMES
from conftest import run_funcs, sample
from reference import (ACTIVATIONS, LOSSES_WITH_TRUE_GRADIENT, EncodingRef, act_grad_ref, act_ref, assert_close,
                       assert_within, fd_gradient, fd_input_gradient, loss_ref, oneblob_ref, smooth_points,
                       triangle_wave_kink_distance, triangle_wave_ref)

# ---------------------------------------------------------------------------------------------
# Encodings
# ---------------------------------------------------------------------------------------------

Case = namedtuple("Case", "n_in config alignment")

_GRID = {"n_levels": 2, "n_features_per_level": 2, "base_resolution": 4, "per_level_scale": 2.0}

ENCODING_CASES = {   # registered otype (aliases too) -> representative cases
    "Identity": [Case(3, {"otype": "Identity", "scale": 2.5, "offset": -0.75}, 16)],
    "Frequency": [Case(2, {"otype": "Frequency", "n_frequencies": 3}, 0)],
    "OneBlob": [Case(2, {"otype": "OneBlob", "n_bins": 4}, 16),
                Case(1, {"otype": "OneBlob", "n_bins": 64}, 0)],                  # K > 32 (spec §8 A2)
    "TriangleWave": [Case(2, {"otype": "TriangleWave", "n_frequencies": 4}, 16)],
    "SphericalHarmonics": [Case(3, {"otype": "SphericalHarmonics", "degree": 3}, 16),   # 9 values, then 7 ones
                           Case(3, {"otype": "SphericalHarmonics", "degree": 8}, 0)],   # all 64 table entries
    "Empty": [Case(3, {"otype": "Empty"}, 16)],
    "HashGrid": [Case(2, {"otype": "HashGrid", **_GRID, "n_levels": 3, "log2_hashmap_size": 6}, 16)],
    "Grid": [Case(3, {"otype": "Grid", "type": "Hash", **_GRID, "n_features_per_level": 1, "log2_hashmap_size": 7,
                      "per_level_scale": 1.5, "interpolation": "Smoothstep"}, 0)],
    "Permutohedral": [Case(3, {"otype": "Permutohedral", **_GRID, "log2_hashmap_size": 6}, 16)],
    "DenseGrid": [Case(2, {"otype": "DenseGrid", **_GRID}, 0)],
    "TiledGrid": [Case(2, {"otype": "TiledGrid", **_GRID, "n_features_per_level": 4, "base_resolution": 3}, 16)],
    "Composite": [
        # Concatenation: OneBlob (2 wide) is padded with 1 to the grid's alignment 4; the composite's own
        # padding to 16 goes to the last (grid) part, filled with 0.
        Case(3, {"otype": "Composite", "nested": [
            {"otype": "OneBlob", "n_bins": 2, "n_dims_to_encode": 1},
            {"otype": "HashGrid", **_GRID, "n_features_per_level": 4, "log2_hashmap_size": 6}]}, 16),
        # Sum: both 4 wide, each padded (with 1) to 16, so the padding sums to 2.
        Case(2, {"otype": "Composite", "reduction": "Sum", "nested": [
            {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 1},
            {"otype": "TriangleWave", "n_frequencies": 4}]}, 16),
        Case(2, {"otype": "Composite", "reduction": "Product", "nested": [
            {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 1},
            {"otype": "TriangleWave", "n_frequencies": 4}]}, 0),
        # Explicit, overlapping input slices: dim 1 feeds both (tinn sums their input gradients).
        Case(3, {"otype": "Composite", "nested": [
            {"otype": "Identity", "scale": 0.5, "n_dims_to_encode": 2, "dims_to_encode_begin": 0},
            {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2, "dims_to_encode_begin": 1}]}, 0),
        # A 0-dim entry is dropped; Empty swallows the remaining two dims (dL/dx = 0 there).
        Case(4, {"otype": "Composite", "nested": [
            {"otype": "Identity", "n_dims_to_encode": 0},
            {"otype": "TriangleWave", "n_frequencies": 2, "n_dims_to_encode": 2},
            {"otype": "Empty"}]}, 16),
    ],
    "NRC": [Case(9, {"otype": "NRC", "n_frequencies": 3, "n_bins": 2}, 16)],
    "OneBlobFrequency": [Case(8, {"otype": "OneBlobFrequency"}, 0)],            # defaults F = 12, K = 4
}

ENCODING_NAMES = tinn.registry.encodings.names()
ENCODING_PARAMS = [pytest.param(name, i, id=f"{name}-{i}")
                   for name in ENCODING_NAMES for i in range(len(ENCODING_CASES.get(name, [None])))]
ENCODING_SAMPLE = sample(ENCODING_PARAMS, keep=[j for j, p in enumerate(ENCODING_PARAMS) if p.values[1] == 0])
"""The forward's sweep: every registered otype's first case by default (each case compiles its kernels), all in
the full suite."""


def _one_name_per_class():
    """Aliases share a class (HashGrid / Grid / DenseGrid / TiledGrid, NRC / OneBlobFrequency): test one name each."""
    seen, names = set(), []
    for name in ENCODING_NAMES:
        cls = tinn.registry.encodings.lookup({"otype": name})[1]
        if cls not in seen:
            seen.add(cls)
            names.append(name)
    return names


CLASS_NAMES = _one_name_per_class()
GRADIENT_SAMPLE = sample(ENCODING_PARAMS, keep=[j for j, p in enumerate(ENCODING_PARAMS)
                                                if p.values[1] == 0 and p.values[0] in CLASS_NAMES])
"""The gradients' sweep: by default the first case of one name per class (the grid aliases' other types and
dimensions: test_encodings' covering sample), all in the full suite."""


@pytest.fixture(scope="module")
def encoding_case():
    """``encoding_case(name, i)`` -> (case, tinn encoding, reference): one tinn object per case, built once
    for this module's tests (kernels compile once)."""
    built = {}

    def get(name, i):
        if name not in ENCODING_CASES:
            pytest.fail(f"encoding otype {name!r} is registered but has no case in ENCODING_CASES "
                        "(tests/test_registry_sweep.py): add a representative config and a reference")
        if (name, i) not in built:
            case = ENCODING_CASES[name][i]
            enc = tinn.create_encoding(case.n_in, case.config, alignment=case.alignment)
            built[name, i] = (case, enc, EncodingRef(case.n_in, case.config))
        return built[name, i]

    return get


def set_random_params(enc, ref, rng):
    """Parameters of order 1 (the ±1e-4 grid init would make every comparison trivially small)."""
    theta = rng.uniform(-1, 1, ref.n_params).astype(np.float32)
    enc.set_params(theta)
    return theta


def test_every_encoding_case_is_registered():
    """No stale entries: every case names a registered otype."""
    assert set(ENCODING_CASES) <= set(ENCODING_NAMES), set(ENCODING_CASES) - set(ENCODING_NAMES)


@pytest.mark.parametrize("name, i", ENCODING_PARAMS)
def test_encoding_sizes(encoding_case, name, i):
    """Padded output width (§1.0 set_alignment, §1.7 for composites) and parameter count."""
    case, enc, ref = encoding_case(name, i)
    assert enc.n_input_dims == case.n_in
    assert enc.n_output_dims == enc.padded_output_width == ref.padded_width(case.alignment)
    assert enc.n_params == ref.n_params
    assert enc.params().shape == enc.gradients().shape == (ref.n_params,)


@pytest.mark.parametrize("name, i", ENCODING_SAMPLE)
@pytest.mark.parametrize("batch", [1, 37])
def test_encoding_forward(encoding_case, name, i, batch):
    """Forward (with padding) vs the float64 reference; inference equals forward."""
    case, enc, ref = encoding_case(name, i)
    rng = np.random.default_rng(batch)
    theta = set_random_params(enc, ref, rng)
    x = smooth_points(ref, rng, batch)
    y, _ = enc.forward(x)
    assert y.shape == (batch, enc.n_output_dims) and y.dtype == np.float32
    expected = ref.forward(x, theta, enc.n_output_dims)
    tol = (ref.float32_error(x, enc.n_output_dims) + 1e-5 * np.abs(expected)
           + 2e-6 * np.abs(expected).max(initial=0.0) + 1e-6)
    assert_within(y, expected, tol)
    np.testing.assert_array_equal(enc.inference(x), y)


@pytest.mark.parametrize("name, i", GRADIENT_SAMPLE)
def test_encoding_input_gradient(encoding_case, name, i):
    """dL/dx vs central differences (float64) of the reference; dL/dy on padded columns is ignored. The input
    gradient alone (``_input_gradient``: ``tinn.ad.gradient_stage``'s forward) is the same, and leaves the
    parameter gradients as they were."""
    case, enc, ref = encoding_case(name, i)
    rng = np.random.default_rng(3)
    theta = set_random_params(enc, ref, rng)
    x = smooth_points(ref, rng, 33)
    dL_dy = rng.normal(size=(33, enc.n_output_dims)).astype(np.float32)
    _, ctx = enc.forward(x)
    dx = enc.backward(ctx, dL_dy)
    assert dx.shape == x.shape and dx.dtype == np.float32
    fd = fd_input_gradient(lambda z: ref.forward(z, theta, enc.n_output_dims, exact=True), x, dL_dy, 1e-6)
    assert_close(dx, fd, rtol=1e-3, atol_rel=1e-4, atol=1e-6)
    gradients = enc.gradients()
    g = ctx.batch.ops.adopt(dL_dy) if dL_dy.shape[1] else dL_dy    # the batch's kind (Taichi has no empty ndarray)
    alone = enc._input_gradient(ctx, g)
    assert_close(tinn.batch.batch.host(alone), fd, rtol=1e-3, atol_rel=1e-4, atol=1e-6)
    np.testing.assert_array_equal(enc.gradients(), gradients)
    assert enc.backward(ctx, dL_dy, input_gradient=False) is None


@pytest.mark.parametrize("name, i", GRADIENT_SAMPLE)
def test_encoding_param_gradient(encoding_case, name, i):
    """Parameter gradients vs the reference's (grids: scatter of interpolation weights, §1.6.6; composites:
    the nested gradients in order, §1.7); 'accumulate' adds, 'overwrite' replaces."""
    case, enc, ref = encoding_case(name, i)
    rng = np.random.default_rng(4)
    theta = set_random_params(enc, ref, rng)
    x = smooth_points(ref, rng, 41)
    dL_dy = rng.normal(size=(41, enc.n_output_dims)).astype(np.float32)
    _, ctx = enc.forward(x)
    enc.backward(ctx, dL_dy, input_gradient=False)
    expected = ref.param_grad(x, theta, dL_dy.astype(np.float64))
    assert expected.shape == (enc.n_params,)
    assert_close(enc.gradients(), expected, rtol=1e-4, atol_rel=1e-5)
    if enc.n_params:
        enc.backward(ctx, dL_dy, input_gradient=False, mode="accumulate")
        assert_close(enc.gradients(), 2 * expected, rtol=1e-4, atol_rel=1e-5)


@pytest.mark.parametrize("name, i", ENCODING_PARAMS)
def test_encoding_hyperparams_round_trip(encoding_case, name, i):
    """create_encoding(hyperparams()) rebuilds the same encoding: same hyperparams, params (same seed), outputs."""
    case, enc, ref = encoding_case(name, i)
    hp = enc.hyperparams()
    assert tinn.registry.encodings.lookup(hp)[1] is type(enc)
    first = tinn.create_encoding(case.n_in, case.config, alignment=case.alignment, seed=7)
    rebuilt = tinn.create_encoding(case.n_in, hp, alignment=case.alignment, seed=7)
    assert type(rebuilt) is type(enc) and rebuilt.hyperparams() == hp == first.hyperparams()
    assert rebuilt.n_output_dims == enc.n_output_dims and rebuilt.n_params == enc.n_params
    np.testing.assert_array_equal(rebuilt.params(), first.params())
    enc.set_params(rebuilt.params())
    x = smooth_points(ref, np.random.default_rng(5), 9)
    np.testing.assert_array_equal(rebuilt.inference(x), enc.inference(x))


# -- worked examples of the spec, through the reference and through tinn ------------------------

def test_oneblob_worked_examples():
    """§1.4, K = 4: x = 0.30 → [0.31744, 0.674, 0.00856, 0]; x = 0.05 wraps into the last bin."""
    x = np.array([[0.30], [0.05]], np.float32)
    expected = [[0.31744, 0.674, 0.00856, 0.0], [0.674, 0.00856, 0.0, 0.31744]]
    np.testing.assert_allclose(oneblob_ref(x, 4), expected, atol=6e-4)
    y = tinn.create_encoding(1, {"otype": "OneBlob", "n_bins": 4}).inference(x)
    np.testing.assert_allclose(y, expected, atol=6e-4)
    np.testing.assert_allclose(y, oneblob_ref(x, 4), atol=1e-6)
    np.testing.assert_allclose(y.sum(1), 1.0, atol=1e-6)                     # one dim's outputs sum to 1


def test_triangle_wave_worked_example_and_negative_inputs():
    """§1.3: x = 0.3, F = 4 → [0.4, −0.8, 0.6, 0.8]; the slope is right for negative v too (C's % parity)."""
    enc = tinn.create_encoding(1, {"otype": "TriangleWave", "n_frequencies": 4})
    x = np.array([[0.3]], np.float32)
    np.testing.assert_allclose(triangle_wave_ref(x, 4)[0], [0.4, -0.8, 0.6, 0.8], atol=1e-6)   # x is float32
    np.testing.assert_allclose(enc.inference(x)[0], [0.4, -0.8, 0.6, 0.8], atol=1e-6)
    rng = np.random.default_rng(6)
    x = rng.uniform(-2.0, -0.01, (64, 1)).astype(np.float32)
    x = x[triangle_wave_kink_distance(x, 4) > 1e-4]                        # off the kinks of every k < 4
    dL_dy = rng.normal(size=(len(x), 4)).astype(np.float32)
    _, ctx = enc.forward(x)
    assert_close(enc.backward(ctx, dL_dy), fd_input_gradient(lambda z: triangle_wave_ref(z, 4), x, dL_dy, 1e-6),
                 rtol=1e-5, atol=1e-5)


def test_spherical_harmonics_table_values():
    """§1.5 constants at the poles: v = (0, 0, 1) gives Y(l, 0) = K(l, 0)·P_l(1), every m ≠ 0 vanishes;
    v = (1, 0, 0) gives the sectoral Y(l, l) = constant·1 and tcnn's sign convention."""
    enc = tinn.create_encoding(3, {"otype": "SphericalHarmonics", "degree": 8})
    y = enc.inference(np.array([[0.5, 0.5, 1.0], [1.0, 0.5, 0.5]], np.float32))   # input = (v + 1) / 2
    zonal = {0: 0.28209479177387814, 2: 0.48860251190291992, 6: 0.31539156525251999 * 2,
             12: 0.3731763325901154 * 2, 20: 0.10578554691520431 * 8, 30: 0.1169503224534236 * 8,
             42: 0.063569202267628425 * 16, 56: 0.068284276912004949 * 16}
    np.testing.assert_allclose(y[0], [zonal.get(i, 0.0) for i in range(64)], rtol=1e-6, atol=1e-7)
    sectoral = {3: -0.48860251190291992, 8: 0.54627421529603959, 15: -0.59004358992664352,
                24: 0.62583573544917614, 35: -0.65638205684017015, 48: 0.6831841051919143,
                63: -0.70716273252459616}
    for i, value in sectoral.items():
        assert y[1, i] == pytest.approx(value, rel=1e-6)
    assert y[1, 0] == pytest.approx(0.28209479177387814, rel=1e-6) and y[1, 6] == pytest.approx(-0.31539156525251999)


def test_spherical_harmonics_padding_after_values():
    """§8 A1: tinn puts the padding (1) after the degree² values, like every other encoding."""
    enc = tinn.create_encoding(3, {"otype": "SphericalHarmonics", "degree": 3}, alignment=16)
    y = enc.inference(np.array([[0.5, 0.5, 1.0]], np.float32))
    np.testing.assert_array_equal(y[0, 9:], 1.0)
    assert y[0, 0] == pytest.approx(0.28209479177387814)


@pytest.mark.parametrize("n_in, config", [(2, {"otype": "SphericalHarmonics"}),
                                          (3, {"otype": "SphericalHarmonics", "degree": 9}),
                                          (3, {"otype": "SphericalHarmonics", "degree": 0})])
def test_spherical_harmonics_rejects_bad_configs(n_in, config):
    """§1.5: exactly 3 input dims and 1 ≤ degree ≤ 8."""
    with pytest.raises(ValueError, match="n_input_dims|degree"):
        tinn.create_encoding(n_in, config)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

LossCase = namedtuple("LossCase", "dims positive")

LOSS_CASES = {   # registered otype -> target widths to test, and whether p and t must be positive
    "L2": LossCase((3,), False),
    "L1": LossCase((3,), False),
    "RelativeL2": LossCase((3,), False),
    "RelativeL1": LossCase((3,), False),
    "Mape": LossCase((3,), False),
    "Smape": LossCase((3,), False),
    "RelativeL2Luminance": LossCase((3, 4, 6), False),                        # rgb, and D ≥ 6: rgb + rgb'
    "CrossEntropy": LossCase((3,), True),
    "Variance": LossCase((3,), True),
}
LOSS_NAMES = tinn.registry.losses.names()


def loss_case(name):
    if name not in LOSS_CASES:
        pytest.fail(f"loss otype {name!r} is registered but has no case in LOSS_CASES "
                    "(tests/test_registry_sweep.py) and no reference in tests/reference.py loss_ref")
    return LOSS_CASES[name]


def loss_inputs(case, D, rng, B=23, P=16):
    if case.positive:
        return rng.uniform(0.2, 2.0, (B, P)).astype(np.float32), rng.uniform(0.0, 2.0, (B, D)).astype(np.float32)
    return rng.normal(size=(B, P)).astype(np.float32), rng.normal(size=(B, D)).astype(np.float32)


def test_every_loss_case_is_registered():
    assert set(LOSS_CASES) <= set(LOSS_NAMES), set(LOSS_CASES) - set(LOSS_NAMES)


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_matches_formula(name, weighted):
    """§3.2: value and gradient per element / (q·N); padded prediction columns get gradient 0."""
    case = loss_case(name)
    rng = np.random.default_rng(7)
    loss = tinn.create_loss({"otype": name})
    for D in case.dims:
        pred, target = loss_inputs(case, D, rng)
        pdf = rng.uniform(0.5, 2.0, target.shape).astype(np.float32) if weighted else None
        value, grad = loss.evaluate(pred, target, pdf)
        ref_value, ref_grad = loss_ref(name, pred[:, :D], target, pdf if weighted else np.ones_like(target))
        assert value == pytest.approx(ref_value.sum(), rel=1e-5, abs=1e-7)
        assert grad.shape == pred.shape and grad.dtype == np.float32
        assert_close(grad[:, :D], ref_grad, rtol=1e-5, atol_rel=1e-6)
        assert not grad[:, D:].any(), "padded output columns get no gradient"
        _, scaled = loss.evaluate(pred, target, pdf, loss_scale=128.0)
        assert_close(scaled, 128.0 * grad, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_loss_gradient_vs_finite_differences(name):
    """Where §3.2's gradient is the true derivative, it equals central differences of the value (float64).
    The losses that treat a p-dependent denominator as constant must differ from them (that is tcnn's math)."""
    case = loss_case(name)
    rng = np.random.default_rng(8)
    D = case.dims[-1]
    pred, target = loss_inputs(case, D, rng, B=4, P=D)
    pdf = rng.uniform(0.5, 2.0, target.shape)
    ref_grad = loss_ref(name, pred, target, pdf)[1]
    fd = fd_gradient(lambda p: loss_ref(name, p, target, pdf)[0].sum(), pred.astype(np.float64), 1e-6)
    if name in LOSSES_WITH_TRUE_GRADIENT:
        assert_close(ref_grad, fd, rtol=1e-5, atol=1e-9)
    else:
        assert not np.allclose(ref_grad, fd, rtol=1e-3)
    _, grad = tinn.create_loss({"otype": name}).evaluate(pred, target, pdf.astype(np.float32))
    assert_close(grad, ref_grad, rtol=1e-5, atol_rel=1e-6)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_loss_hyperparams_round_trip(name):
    loss_case(name)
    loss = tinn.create_loss({"otype": name.upper()})                         # names are case-insensitive
    hp = loss.hyperparams()
    assert hp == {"otype": name}
    rebuilt = tinn.create_loss(hp)
    assert type(rebuilt) is type(loss) and rebuilt.hyperparams() == hp


def test_loss_doc_spellings():
    """§3.1: tcnn's docs say MAPE / SMAPE; the registry's names are Mape / Smape."""
    assert tinn.create_loss({"otype": "MAPE"}).hyperparams() == {"otype": "Mape"}
    assert tinn.create_loss({"otype": "SMAPE"}).hyperparams() == {"otype": "Smape"}


def test_relative_l2_luminance_needs_three_dims():
    with pytest.raises(ValueError, match="at least 3"):
        tinn.create_loss({"otype": "RelativeL2Luminance"}).evaluate(np.ones((2, 16), np.float32),
                                                                    np.ones((2, 2), np.float32))


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_activation(name):
    """§2.3 through an MLP with identity weights: y = act(act(x)) (hidden, then output activation);
    dL/dx = act'(x) · act'(act(x)) · dL/dy, vs the reference and central differences."""
    if name not in ACTIVATIONS:
        pytest.fail(f"activation {name!r} has no reference in tests/reference.py act_ref / act_grad_ref")
    net = tinn.create_network(16, 16, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1,
                                       "activation": name, "output_activation": name})
    net.set_params(np.concatenate([np.eye(16).ravel(), np.eye(16).ravel()]).astype(np.float32))
    rng = np.random.default_rng(9)
    x = rng.uniform(-2, 2, (8, 16))
    x = np.where(np.abs(x) < 0.05, 0.5, x).astype(np.float32)                  # off the ReLU kink
    y, ctx = net.forward(x)
    hidden = act_ref(name, x.astype(np.float64))
    assert_close(y, act_ref(name, hidden), rtol=1e-5, atol=1e-6)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    dx = net.backward(ctx, dL_dy)
    expected = act_grad_ref(name, x.astype(np.float64)) * act_grad_ref(name, hidden) * dL_dy
    assert_close(dx, expected, rtol=1e-4, atol=1e-6)
    fd = fd_input_gradient(lambda z: act_ref(name, act_ref(name, z)), x, dL_dy, 1e-6)
    assert_close(expected, fd, rtol=1e-5, atol=1e-7)


def test_activation_references_cover_the_registry():
    assert set(ACTIVATION_NAMES) == set(ACTIVATIONS)


# ---------------------------------------------------------------------------------------------
# In-kernel use: every encoding's func / backward_func equal its batch API
# ---------------------------------------------------------------------------------------------

# The first case of every class; every Composite case, as its func composes its nested ones per reduction.
FUNC_PARAMS = sample([pytest.param(name, i, id=f"{name}-{i}") for name in CLASS_NAMES
                      for i in range(len(ENCODING_CASES.get(name, [None]))) if i == 0 or name == "Composite"],
                     keep=CLASS_NAMES)     # every class's first case by default


@pytest.mark.parametrize("name, i", FUNC_PARAMS)
def test_encoding_funcs_equal_the_batch_api(encoding_case, name, i):
    """Per-sample func / backward_func (parameter gradients included) equal inference / backward."""
    case, enc, ref = encoding_case(name, i)
    if enc.n_output_dims == 0:
        with pytest.raises(ValueError):
            enc.func
        return
    rng = np.random.default_rng(10)
    set_random_params(enc, ref, rng)
    x = smooth_points(ref, rng, 13)
    dy = rng.normal(size=(13, enc.n_output_dims)).astype(np.float32)
    y, dx, grads = run_funcs(enc, x, dy)
    np.testing.assert_allclose(y, enc.inference(x), rtol=1e-5, atol=1e-6)
    _, ctx = enc.forward(x)
    np.testing.assert_allclose(dx, enc.backward(ctx, dy), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads, enc.gradients(), rtol=1e-4, atol=1e-6)
