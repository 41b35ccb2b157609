"""Half precision (``precision="float16"``): every component against the float64 NumPy reference (or the
float32 model) at half tolerance, float32 master weights, the dynamic loss scale's rules, checkpoints, and
``tinn.torch``'s dtype reporting. On an arch without float16 fields only the refusal is tested.
"""
import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl

import tinn
from conftest import run_funcs, sample
from tinn.runtime.program import HALF_ARCHS
from tinn.mixed_precision import LossScale
from tinn.params import FLOAT16_MAX
from reference import (EncodingRef, assert_close, mlp_backward_ref, mlp_forward_ref, mlp_shapes,
                       mlp_unflatten, padded, smooth_points)
from test_registry_sweep import ENCODING_CASES, _one_name_per_class
from test_device_path import use_mlp_kernels

HALF = impl.current_cfg().arch.name in HALF_ARCHS
needs_half = pytest.mark.skipif(not HALF, reason="this arch has no float16 fields (tinn refuses float16 there)")

EPS16 = 2.0 ** -11          # float16's unit roundoff


def f16(a):
    """``a`` rounded to float16, as float32 (beyond its range: infinite)."""
    with np.errstate(over="ignore"):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


# -- the switch ----------------------------------------------------------------------------------

def test_precision_keyword_is_checked():
    for bad in ("float64", "half", 16, None, "bf16"):
        with pytest.raises(ValueError, match="precision must be one of"):
            tinn.create_encoding(2, {"otype": "Identity"}, precision=bad)
    assert tinn.keys.check_precision("FLOAT16") == "float16" == tinn.keys.check_precision(np.float16)
    enc = tinn.create_encoding(2, {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 4})
    assert enc.store.precision == "float32" and enc.store.params.dtype == ti.f32


def test_float16_is_refused_before_any_field_where_the_arch_lacks_it(monkeypatch):
    """On an arch without float16 fields (Metal, OpenGL; here: this one, taken out of ``HALF_ARCHS``) a
    ValueError naming the arch, nothing allocated."""
    arch = impl.current_cfg().arch.name
    if HALF:
        monkeypatch.setattr(tinn.runtime.program, "HALF_ARCHS", tuple(a for a in HALF_ARCHS if a != arch))
    arenas = set(tinn.params._ARENAS)
    with pytest.raises(ValueError, match=f"float16.*runs on {arch}"):
        tinn.create_from_config(2, 1, {"encoding": {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 4},
                                       "network": {"n_neurons": 16, "n_hidden_layers": 1}}, precision="float16")
    assert set(tinn.params._ARENAS) == arenas              # no float16 arena, no field


# -- every component, against the reference --------------------------------------------------------

ENCODINGS = [pytest.param(name, id=name) for name in _one_name_per_class() if name in ENCODING_CASES]


@needs_half
@pytest.mark.parametrize("name", sample(ENCODINGS, 4))
def test_encoding_in_half_precision(name):
    """Parameters stored as float16 (``params()`` is the float16 rounding of what was set), gradients as
    float32; forward against the float64 reference at those parameters; parameter gradients against the
    reference's within float32 rounding; the input gradient equals the float32 model's at the same parameters."""
    case = ENCODING_CASES[name][0]
    enc = tinn.create_encoding(case.n_in, case.config, alignment=case.alignment, precision="float16")
    ref = EncodingRef(case.n_in, case.config)
    rng = np.random.default_rng(1)
    theta = rng.uniform(-1, 1, ref.n_params).astype(np.float32)
    if enc.n_params:
        assert enc.store.params.dtype == enc.store.inference_params.dtype == ti.f16 and enc.store.grads.dtype == ti.f32
        enc.set_params(theta)
        np.testing.assert_array_equal(enc.params(), f16(theta))
        assert not np.array_equal(enc.params(), theta)
    theta = f16(theta)
    x = smooth_points(ref, rng, 29)
    y, ctx = enc.forward(x)
    assert y.dtype == np.float32
    expected = ref.forward(x, theta, enc.n_output_dims)
    assert_close(y, expected, rtol=EPS16, atol_rel=EPS16)
    dL_dy = rng.normal(size=y.shape).astype(np.float32)
    dx = enc.backward(ctx, dL_dy)
    if enc.n_params:
        g = ref.param_grad(x, theta, dL_dy.astype(np.float64))
        assert_close(enc.gradients(), g, rtol=1e-4, atol_rel=1e-5)
    full = tinn.create_encoding(case.n_in, case.config, alignment=case.alignment)
    if enc.n_params:
        full.set_params(theta)
    _, ctx32 = full.forward(x)
    assert_close(dx, full.backward(ctx32, dL_dy), rtol=1e-5, atol_rel=1e-5)


@needs_half
@needs_half
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_network_in_half_precision(device, set_path):
    """The MLP reads float16 weights, keeps its hidden activations in float16 (each hidden output rounded
    before the next layer reads it, each pre-activation rounded where the backward differentiates at it) and
    writes float32 gradients: forward and gradients against §2.2's reference at the rounded weights and
    activations, which the unrounded reference misses."""
    set_path(device)
    cfg = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "Sigmoid", "n_neurons": 16,
           "n_hidden_layers": 2}
    net = tinn.create_network(5, 3, cfg, precision="float16")
    shapes = mlp_shapes(5, 16, 2, 3)
    rng = np.random.default_rng(2)
    theta = f16(rng.normal(0, 0.5, net.n_params))
    net.set_params(theta)
    np.testing.assert_array_equal(net.params(), theta)
    x = rng.uniform(-1, 1, (37, 5)).astype(np.float32)
    Ws = mlp_unflatten(theta, shapes)
    y_ref, zs, hs = mlp_forward_ref(x, Ws, "Tanh", "Sigmoid", kept=f16)
    y, ctx = net.forward(tinn.batch.buffers.put(x) if device else x)
    y = host(y)
    assert_rounded_close(y[:, :3], y_ref[:, :3], rtol=1e-5)
    assert_close(host(net.inference(tinn.batch.buffers.put(x) if device else x)), y, rtol=0, atol=0)
    y_exact = mlp_forward_ref(x, Ws, "Tanh", "Sigmoid")[0]
    assert np.abs(y[:, :3] - y_exact[:, :3]).max() > 10 * np.abs(y[:, :3] - y_ref[:, :3]).max()
    kept = [host(a) for a in kept_activations(ctx)]
    assert kept and all(np.array_equal(f16(a), a, equal_nan=True) for a in kept)     # float16 values
    if device:
        assert all(str(a.dtype) == "f16" for a in kept_activations(ctx))            # in float16 buffers
    dL_dy = rng.normal(size=(37, 3)).astype(np.float32)
    dx = host(net.backward(ctx, tinn.batch.buffers.put(dL_dy) if device else dL_dy))
    dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dL_dy, shapes[-1][0], 0.0), "Tanh", "Sigmoid")
    assert_rounded_close(net.gradients(), np.concatenate([d.ravel() for d in dWs]), rtol=1e-5)
    assert_rounded_close(dx, dx_ref, rtol=1e-5)


@needs_half
@pytest.mark.parametrize("n_instances", [1, 3])
def test_fused_kernels_in_half_precision(n_instances, monkeypatch, device_path):
    """The fused shared-memory kernels (forced onto this arch; x64 has none) round each hidden output to
    float16 before the next layer reads it and keep float16 activations: each network's outputs, dL/dx and
    dL/dW against §2.2's reference at the rounded weights and activations."""
    use_mlp_kernels(monkeypatch, "fused")
    cfg = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "Sigmoid", "n_neurons": 16,
           "n_hidden_layers": 2}
    net = tinn.create_network(5, 3, cfg, n_instances=n_instances, precision="float16")
    shapes = mlp_shapes(5, 16, 2, 3)
    rng = np.random.default_rng(9)
    theta = f16(rng.normal(0, 0.5, (n_instances, net.n_params)))
    net.set_params(theta if n_instances > 1 else theta[0])
    B = 150
    x = rng.uniform(-1, 1, (B, 5)).astype(np.float32)
    dy = rng.normal(size=(B, 3)).astype(np.float32)
    ids = rng.integers(0, n_instances, B).astype(np.int32)
    args = (tinn.batch.buffers.put(x),) if n_instances == 1 else (tinn.batch.buffers.put(x), tinn.batch.buffers.put(ids, ti.i32))
    y, ctx = net.forward(*args)
    assert ctx.fused is not None and all(str(a.dtype) == "f16" for a in kept_activations(ctx))
    dx = host(net.backward(ctx, tinn.batch.buffers.put(dy)))
    y, grads = host(y), net.gradients().reshape(n_instances, -1)
    for k in range(n_instances):
        rows = ids == k
        Ws = mlp_unflatten(theta[k], shapes)
        y_ref, zs, hs = mlp_forward_ref(x[rows], Ws, "Tanh", "Sigmoid", kept=f16)
        dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dy[rows], shapes[-1][0], 0.0), "Tanh", "Sigmoid")
        assert_rounded_close(y[rows], y_ref[:, :3], rtol=1e-5)
        assert_rounded_close(dx[rows], dx_ref, rtol=1e-5)
        assert_rounded_close(grads[k], np.concatenate([d.ravel() for d in dWs]), rtol=1e-5)


@needs_half
@pytest.mark.parametrize("n_instances", sample([1, 3], keep=[3]))
def test_half_activations_agree_on_host_and_device(n_instances, set_path):
    """The host path (numpy) and the device path (kernels) round the same activations at the same points: a
    half-precision MLP's outputs, gradients and second order (dL2/d(dL_dy), dL2/dx, dL2/dW) agree within
    float32 rounding, single network and array. Not all of them: where the two float32 sums of a pre-activation
    differ in their last bit across a float16 rounding boundary, that activation rounds one float16 step apart
    and so does what depends on it (within half precision)."""
    cfg = {"otype": "CutlassMLP", "activation": "Sigmoid", "output_activation": "Tanh", "n_neurons": 16,
           "n_hidden_layers": 2}
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (53, 4)).astype(np.float32)
    dy = rng.normal(size=(53, 2)).astype(np.float32)
    v = rng.normal(size=(53, 4)).astype(np.float32)
    ids = rng.integers(0, n_instances, 53).astype(np.int32)
    theta = f16(rng.normal(0, 0.7, (n_instances, tinn.create_network(4, 2, cfg).n_params)))
    results = []
    for device in (False, True):
        set_path(device)
        net = tinn.create_network(4, 2, cfg, n_instances=n_instances, precision="float16")
        net.set_params(theta if n_instances > 1 else theta[0])
        put = tinn.batch.buffers.put if device else (lambda a: a)
        args = (put(x),) if n_instances == 1 else (put(x), tinn.batch.buffers.put(ids, ti.i32) if device else ids)
        y, ctx = net.forward(*args)
        dx = net.backward(ctx, put(dy))
        grads = net.gradients()
        d_dy, d_dx = net.backward_backward_input(ctx, put(v), put(dy))
        results.append([host(y), host(dx), grads, host(d_dy), host(d_dx), net.gradients()])
    for on_host, on_device in zip(*results):
        assert_rounded_close(on_device, on_host, rtol=1e-5)


def test_host_rounding_to_half_is_numpys():
    """The host path's float16 rounding in float32 arithmetic equals numpy's conversion: ties to even, the
    largest values, overflow to infinity, NaN; below float16's normal range within 2^-25."""
    from tinn.networks._mlp_host import round_to_half
    rng = np.random.default_rng(3)
    mantissas = 1 + np.arange(2 ** 13) / 2 ** 13                 # every tie and midpoint of float16's [1, 2)
    values = np.concatenate([mantissas, -mantissas * 3.5, rng.normal(0, 30, 10000), rng.normal(0, 1e-3, 1000),
                             [0.0, -0.0, 65504.0, 65519.0, -65519.0]]).astype(np.float32)
    np.testing.assert_array_equal(round_to_half(values.copy()), f16(values))
    big = np.array([1.0, 65520.0, -1e30, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(round_to_half(big.copy()), f16(big))
    tiny = rng.uniform(-6e-5, 6e-5, 1000).astype(np.float32)
    np.testing.assert_allclose(round_to_half(tiny.copy()), f16(tiny), rtol=0, atol=2.0 ** -25)


def kept_activations(ctx):
    """What a forward pass of the MLP keeps for its backward: hidden outputs and pre-activations (host path:
    numpy arrays per layer; per-layer kernels: buffers per layer; fused kernels: one buffer of each)."""
    if hasattr(ctx, "layers"):
        kept = [a for layer in ctx.layers[:-1] for a in (layer.y, layer.z)] + [ctx.layers[-1].z]
        return [a for a in kept if a is not None]
    if getattr(ctx, "fused", None) is not None:
        return [ctx.zs, ctx.hs]
    return ctx.hs[1:-1] + ctx.zs


def assert_rounded_close(actual, expected, rtol):
    """``actual`` equals ``expected`` within ``rtol`` (and as much of the largest magnitude) but for a few
    elements: where a float32 sum in another order lands across a float16 rounding boundary from the
    reference's, an activation rounds one float16 step apart, and so does what depends on it. Every element
    stays within half precision; at least 90 % within ``rtol``."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert_close(actual, expected, rtol=4 * EPS16, atol_rel=4 * EPS16)
    tight = np.abs(actual - expected) <= rtol * (np.abs(expected) + np.abs(expected).max())
    assert tight.mean() >= 0.9, f"{tight.mean():.1%} within {rtol}"


def host(a):
    """A device buffer's values as numpy (numpy arrays as they are)."""
    return a if isinstance(a, np.ndarray) else a.to_numpy()


def assert_near(actual, expected, tol):
    """The relative distance ``|actual - expected| / |expected|`` (L2 norms) is below ``tol``: training at two
    precisions is compared so, as Adam turns a tiny gradient's rounding into a full step of either sign."""
    actual, expected = (np.asarray(a, np.float64).ravel() for a in (actual, expected))
    distance = np.linalg.norm(actual - expected) / np.linalg.norm(expected)
    assert distance < tol, f"relative distance {distance:.3g} >= {tol}"


@needs_half
@pytest.mark.parametrize("which", sample(["HashGrid", "MLP"], keep=["MLP"]))   # a half grid: the next tests
def test_per_sample_funcs_in_half_precision(which):
    """``func`` / ``backward_func`` inside a user's kernel read the float16 weights and add into the float32
    gradients: equal to the batch API's inference and backward, within float32 rounding for the encoding and
    within half precision for the MLP (a func keeps a sample's activations in float32 registers; the batch
    rounds the hidden ones to float16)."""
    if which == "HashGrid":
        obj = tinn.create_encoding(2, ENCODING_CASES["HashGrid"][0].config, precision="float16")
    else:
        obj = tinn.create_network(4, 2, {"otype": "CutlassMLP", "activation": "Sigmoid", "n_neurons": 16,
                                         "n_hidden_layers": 1}, precision="float16")
    rng = np.random.default_rng(6)
    obj.set_params(rng.uniform(-1, 1, obj.n_params).astype(np.float32))
    x = rng.random((19, obj.n_input_dims), dtype=np.float32)
    dy = rng.normal(size=(19, obj.n_output_dims)).astype(np.float32)
    y, dx, grads = run_funcs(obj, x, dy)
    _, ctx = obj.forward(x)
    dx_batch = obj.backward(ctx, dy)
    tol = 1e-5 if which == "HashGrid" else 4 * EPS16
    assert_close(y, obj.inference(x)[:, :obj.n_output_dims], rtol=tol, atol_rel=tol)
    assert_close(dx, dx_batch, rtol=10 * tol, atol_rel=tol)
    assert_close(grads, obj.gradients(), rtol=10 * tol, atol_rel=tol)


@needs_half
@pytest.mark.parametrize("device", sample([False, True], keep=[1]), ids=["host", "device"])
@pytest.mark.parametrize("which", ["HashGrid", "MLP"])
def test_half_gradients_are_float32_sums(which, device, set_path):
    """A float16 store's gradients are float32 (its weights float16), and a gradient summed from thousands of
    small per-sample contributions (per-block partial sums and atomics on the device path) matches a float64
    NumPy reference within float32 rounding: tighter than float16's rounding of the exact sums (checked)."""
    set_path(device)
    rng = np.random.default_rng(8)
    B = 1 << 14
    if which == "HashGrid":
        case = ENCODING_CASES["HashGrid"][0]
        obj = tinn.create_encoding(case.n_in, case.config, alignment=case.alignment, precision="float16")
        ref = EncodingRef(case.n_in, case.config)
    else:
        obj = tinn.create_network(4, 2, {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "None",
                                         "n_neurons": 16, "n_hidden_layers": 1}, precision="float16")
        shapes = mlp_shapes(4, 16, 1, 2)
    assert obj.store.params.dtype == obj.store.inference_params.dtype == ti.f16 and obj.store.grads.dtype == ti.f32
    theta = f16(rng.uniform(-1, 1, obj.n_params))
    obj.set_params(theta)
    x = rng.random((B, obj.n_input_dims), dtype=np.float32)
    dy = rng.uniform(0.5, 1.0, (B, obj.n_output_dims)).astype(np.float32)        # no cancellation in the sums
    _, ctx = obj.forward(tinn.batch.buffers.put(x) if device else x)
    obj.backward(ctx, tinn.batch.buffers.put(dy) if device else dy)
    if which == "HashGrid":
        exact = ref.param_grad(x, theta, dy.astype(np.float64))
    else:
        Ws = mlp_unflatten(theta, shapes)
        _, zs, hs = mlp_forward_ref(x, Ws, "Tanh", "None", kept=f16)
        dWs, _ = mlp_backward_ref(Ws, zs, hs, padded(dy, shapes[-1][0], 0.0), "Tanh", "None")
        exact = np.concatenate([d.ravel() for d in dWs])
    rtol, atol = 2e-5, 1e-6 * np.abs(exact).max()
    assert np.abs(exact).max() > 100                                             # sums of many samples
    assert (np.abs(f16(exact) - exact) > atol + rtol * np.abs(exact)).any()      # float16 would fail this
    assert_close(obj.gradients(), exact, rtol=rtol, atol=atol)


CONFIG = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
          "encoding": {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 8,
                       "base_resolution": 4, "per_level_scale": 2.0},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


def batch(seed=0, n=256, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 2), dtype=np.float32)
    return x, (scale * np.stack([np.sin(6 * x[:, 0]), x[:, 0] * x[:, 1]], 1)).astype(np.float32)


def model(precision="float16", optimizer=None, seed=3):
    cfg = dict(CONFIG, optimizer=optimizer or CONFIG["optimizer"])
    return tinn.create_from_config(2, 2, cfg, seed=seed, precision=precision)


# -- master weights and the optimizer -------------------------------------------------------------

@needs_half
@pytest.mark.parametrize("optimizer", [
    {"otype": "Adam", "learning_rate": 1e-2},
    {"otype": "EMA", "decay": 0.9, "nested": {"otype": "SGD", "learning_rate": 0.5}},
], ids=["Adam", "EMA-SGD"])
def test_master_weights_stay_float32_and_follow_float32_training(optimizer):
    """The optimizer steps float32 masters: after steps they hold values float16 cannot (so they are not the
    model's), the model's weights and inference weights are their float16 rounding, and training follows the
    float32 model's within half precision."""
    half, full = model(optimizer=optimizer), model("float32", optimizer)
    x, t = batch()
    for _ in range(5):
        loss16 = half.trainer.training_step(x, t)
        loss32 = full.trainer.training_step(x, t)
    tr = half.trainer
    masters = tr.params_full_precision()
    assert masters.dtype == np.float32 and tr.master_store.params.dtype == ti.f32
    assert not np.array_equal(masters, f16(masters))                   # float32 values, not float16 ones
    np.testing.assert_array_equal(tr.params(), f16(masters))
    store = tr.master_store
    inference = store.read(store.inference_params, store.offset, half.network.n_params)[0]
    np.testing.assert_array_equal(tr.params_inference(), f16(inference))
    assert abs(loss16 - loss32) <= 0.05 * loss32
    assert_close(masters, full.trainer.params(), rtol=0.05, atol_rel=0.02)
    assert full.trainer.loss_scale == 1.0 and full.trainer.loss_scaler is None


@needs_half
def test_network_array_in_half_precision():
    """A float16 array of 3 networks: the networks a batch reaches train as the float32 array's do (within half
    precision); the one it does not reach keeps its weights and masters."""
    x, t = batch(7)
    ids = np.random.default_rng(7).integers(0, 2, len(x)).astype(np.int32)       # network 2 gets no samples
    half, full = (tinn.create_from_config(2, 2, CONFIG, n_instances=3, seed=5, precision=p)
                  for p in ("float16", "float32"))
    before, y_before = half.trainer.params_full_precision(), full.network.inference(x, ids)
    for _ in range(3):
        loss16 = half.trainer.training_step(x, t, ids)
        loss32 = full.trainer.training_step(x, t, ids)
    masters = half.trainer.params_full_precision()
    assert masters.shape == (3, half.network.n_params)
    np.testing.assert_array_equal(masters[2], before[2])
    assert not np.array_equal(masters[:2], before[:2])
    assert abs(loss16 - loss32) <= 1e-3 * loss32
    assert_near(half.network.inference(x, ids) - y_before, full.network.inference(x, ids) - y_before, 0.1)
    np.testing.assert_array_equal(half.trainer.params(), f16(masters))


@needs_half
def test_set_params_reaches_the_masters():
    m = model()
    theta = f16(np.random.default_rng(4).normal(0, 0.1, m.network.n_params))
    m.network.set_params(theta)
    np.testing.assert_array_equal(m.trainer.params_full_precision(), theta)
    with pytest.raises(ValueError, match="float16's range"):
        m.network.set_params(np.full(m.network.n_params, 7e4, np.float32))
    np.testing.assert_array_equal(m.network.params(), theta)


@needs_half
def test_device_path_in_half_precision(set_path):
    """The device path (forced on the CPU: kernel MLP, device census and loss) trains a float16 model as the
    host path does, within half precision."""
    x, t = batch(5)
    host = model()
    losses = [host.trainer.training_step(x, t) for _ in range(3)]
    set_path(True)
    dev = model()
    xd, td = tinn.batch.buffers.put(x), tinn.batch.buffers.put(t)
    dev_losses = [float(dev.trainer.training_step(xd, td)) for _ in range(3)]
    np.testing.assert_allclose(dev_losses, losses, rtol=1e-2)
    assert dev.trainer.loss_scaler.good_steps == 3
    assert_close(dev.trainer.params_full_precision(), host.trainer.params_full_precision(), rtol=1e-2, atol_rel=1e-2)


# -- the loss scale --------------------------------------------------------------------------------

def test_loss_scale_rules():
    s = LossScale(scale=8.0, growth_interval=3)
    assert [s.update(False), s.update(False)] == [True, True] and s.scale == 8.0
    assert s.update(False) and s.scale == 16.0 and s.good_steps == 0      # the third good step in a row
    assert s.update(False) and s.update(False) and s.scale == 16.0
    assert not s.update(True) and s.scale == 8.0 and s.good_steps == 0 and s.skipped == 1
    assert [s.update(False) for _ in range(3)] == [True] * 3 and s.scale == 16.0
    for _ in range(100):
        s.update(True)
    assert s.scale == LossScale.MIN
    with pytest.raises(ValueError):
        LossScale(growth_factor=1.0)
    with pytest.raises(ValueError, match="invalid loss scale state"):
        s.check_state({"scale": 1.0, "good_steps": -1, "skipped": 0})


def optimizer_state(tr):
    return {k: np.array(v) for k, v in tr.optimizer.state_dict().items()}


@needs_half
def test_an_overflowing_step_is_skipped_and_lowers_the_scale():
    """Gradients beyond float16 at the current scale: no parameter, master or optimizer state changes and the
    scale halves; at a scale where they fit the step applies; after ``growth_interval`` good steps it doubles."""
    m = model()
    tr = m.trainer
    x, t = batch(scale=100.0)
    tr.training_step(x, t)                                  # some optimizer state to keep
    tr.loss_scaler.scale = 2.0 ** 24                        # |scale * dL/dθ| >> 65504
    before = (tr.params(), tr.params_full_precision(), tr.params_inference(), optimizer_state(tr))
    tr.training_step(x, t)
    assert tr.loss_scaler.skipped == 1 and tr.loss_scale == 2.0 ** 23 and tr.loss_scaler.good_steps == 0
    g = m.network.gradients()                               # float32: finite, but beyond float16's range
    assert np.isfinite(g).all() and np.abs(g).max() > FLOAT16_MAX
    after = (tr.params(), tr.params_full_precision(), tr.params_inference(), optimizer_state(tr))
    for a, b in zip(before[:3], after[:3]):
        np.testing.assert_array_equal(a, b)
    assert before[3].keys() == after[3].keys()
    for k in before[3]:
        np.testing.assert_array_equal(before[3][k], after[3][k])
    while tr.loss_scaler.skipped < 30 and tr.loss_scaler.good_steps == 0:
        tr.training_step(x, t)
    assert tr.loss_scaler.good_steps == 1 and tr.loss_scale < 2.0 ** 23
    assert not np.array_equal(tr.params_full_precision(), before[1])
    tr.loss_scaler.growth_interval, scale = 3, tr.loss_scale
    tr.training_step(x, t)
    tr.training_step(x, t)
    assert tr.loss_scale == 2 * scale and tr.loss_scaler.good_steps == 0


@needs_half
def test_a_finite_gradient_beyond_float16_overflows():
    """tcnn's rule: a step overflows when a scaled gradient lies beyond float16's 65504, even though the
    float32 gradients hold it exactly. The same gradients at two scales: above 65504 the step is skipped,
    below it it applies."""
    m = model()
    tr = m.trainer
    x, t = batch()
    tr.backward(tr.forward(x, t))
    top = np.abs(m.network.gradients()).max() / tr.loss_scale          # the largest unscaled gradient
    for factor, applied in ((2.0, False), (0.5, True)):
        tr.loss_scaler.scale = factor * FLOAT16_MAX / top
        before = tr.params_full_precision()
        tr.backward(tr.forward(x, t))
        g = m.network.gradients()
        assert np.isfinite(g).all() and (np.abs(g).max() > FLOAT16_MAX) == (not applied)
        tr.optimizer_step()
        assert tr.loss_scaler.skipped == 1                              # the first one was skipped
        assert np.array_equal(tr.params_full_precision(), before) == (not applied)
    assert tr.loss_scaler.skipped == 1 and tr.loss_scaler.good_steps == 1


# -- checkpoints -----------------------------------------------------------------------------------

@needs_half
def test_checkpoint_round_trip_restores_masters_and_scale(tmp_path):
    m = model()
    tr = m.trainer
    x, t = batch(1, scale=100.0)
    tr.loss_scaler.scale = 2.0 ** 24
    for _ in range(4):
        tr.training_step(x, t)
    state = tr.loss_scaler.state()
    assert state["skipped"] >= 1
    tr.save(tmp_path / "half.npz")
    resumed = [tr.training_step(x, t) for _ in range(3)]
    after = tr.params_full_precision(), tr.params(), tr.loss_scaler.state()

    other = model(seed=11)
    other.trainer.load(tmp_path / "half.npz")
    assert other.trainer.loss_scaler.state() == state
    np.testing.assert_array_equal(other.trainer.params(), f16(other.trainer.params_full_precision()))
    assert [other.trainer.training_step(x, t) for _ in range(3)] == resumed
    np.testing.assert_array_equal(other.trainer.params_full_precision(), after[0])
    np.testing.assert_array_equal(other.trainer.params(), after[1])
    assert other.trainer.loss_scaler.state() == after[2]

    full = model("float32")
    with pytest.raises(ValueError, match="precision"):
        full.trainer.load(tmp_path / "half.npz")


@needs_half
def test_tcnn_snapshot_of_a_half_model_is_half(tmp_path):
    import json
    m = model()
    m.trainer.export_tcnn(tmp_path / "snap.json")
    data = json.loads((tmp_path / "snap.json").read_text())
    assert data["params_type"] == "__half" and len(data["params_binary"]["bytes"]) == 2 * m.network.n_params
    other = model(seed=9)
    other.trainer.load_tcnn(tmp_path / "snap.json")
    np.testing.assert_array_equal(other.trainer.params_full_precision(), m.trainer.params_inference())


# -- tinn.torch --------------------------------------------------------------------------------------

@needs_half
def test_torch_reports_half_as_tinycudann():
    torch = pytest.importorskip("torch")
    import tinn.torch as tcnn
    from tinn.torch._native import Precision
    enc_cfg = CONFIG["encoding"]
    half = tcnn.NetworkWithInputEncoding(2, 2, enc_cfg, CONFIG["network"], dtype=torch.float16)
    full = tcnn.NetworkWithInputEncoding(2, 2, enc_cfg, CONFIG["network"])
    assert half.dtype == torch.float16 and half.loss_scale == 128.0 and half.params.dtype == torch.float32
    assert half.native_tcnn_module.param_precision() == half.native_tcnn_module.output_precision() == Precision.Fp16
    assert full.dtype == torch.float32 and full.loss_scale == 1.0
    assert full.native_tcnn_module.param_precision() == full.native_tcnn_module.output_precision() == Precision.Fp32
    with torch.no_grad():
        full.params.copy_(half.params)
    x = torch.from_numpy(np.random.default_rng(5).random((64, 2), dtype=np.float32))
    y16, y32 = half(x), full(x)
    assert y16.dtype == torch.float16 and y32.dtype == torch.float32
    assert_near(y16.detach().float().numpy(), y32.detach().numpy(), 5e-3)
    y16.float().square().sum().backward()
    y32.square().sum().backward()
    g16, g32 = half.params.grad, full.params.grad
    assert g16.dtype == torch.float32
    assert_near(g16.numpy(), g32.numpy(), 1e-2)

    enc = tcnn.Encoding(2, enc_cfg, dtype=torch.float16)
    assert enc.dtype == torch.float16 and enc(x).dtype == torch.float16
    assert enc.native_tcnn_module.param_precision() == Precision.Fp16
    enc32 = tcnn.Encoding(2, enc_cfg, dtype=torch.float32)
    assert enc32(x.double()).dtype == torch.float32 and tcnn.Encoding(2, enc_cfg)(x.double()).dtype == torch.float64
    with pytest.raises(ValueError, match="fp32 or fp16"):
        tcnn.Network(2, 2, CONFIG["network"], dtype=torch.bfloat16)
