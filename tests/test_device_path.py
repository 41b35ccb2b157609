"""The device path (``tinn._device``): the MLP as Taichi kernels on ``ti.ndarray`` buffers.

On the CPU it is forced (``tinn._device.FORCE``) and checked against the host BLAS path for every
activation, width and depth the suite uses, forward and backward, network arrays included, and
against the host path of every encoding, second order included; on any other arch it is what runs,
and a training step (a grid, per-dim or Composite encoding) or an encoding's pass of a ti.ndarray
batch is checked to call no host BLAS and to move no batch-sized array to the host.
"""
import contextlib

import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray
from taichi.lang.kernel_impl import Kernel

import tinn
from tinn import _device
from tinn.networks import _kernel_mlp
from tinn.networks._kernel_mlp import TILE, tiles
from reference import assert_close, mlp_backward_ref, mlp_forward_ref, mlp_unflatten, padded, random_weights
from tinn.networks.activations import NAMES

on_cpu = impl.current_cfg().arch in (ti.x64, ti.arm64)
blas_exists = pytest.mark.x64_only("the host BLAS path to compare with runs only on the CPU")


@pytest.fixture
def device_path(monkeypatch):
    """Build (and run) models on the device path on any arch."""
    monkeypatch.setattr(_device, "FORCE", True)


@contextlib.contextmanager
def path(device: bool):
    """Run on the device path (``FORCE``) or on the CPU's own path."""
    before = _device.FORCE
    _device.FORCE = device
    try:
        yield
    finally:
        _device.FORCE = before


def pair(build, monkeypatch):
    """The same model (same seed) on the host path and on the device path."""
    with path(False):
        host = build()
    with path(True):
        device = build()
        mlp = device
        while not hasattr(mlp, "_batch_path"):
            mlp = mlp.network
        assert type(mlp._batch_path()).__name__ == "KernelMLP"       # chosen at its first use
    return host, device


def compare(host, device, x, dy, instance=None, tol=2e-5):
    with path(False):
        y_h, ctx_h = host.forward(x, instance)
        inference_h = host.inference(x, instance)
        dx_h = host.backward(ctx_h, dy)
    with path(True):
        y_d, ctx_d = device.forward(x, instance)
        inference_d = device.inference(x, instance)
        dx_d = device.backward(ctx_d, dy)
    np.testing.assert_allclose(y_d, y_h, rtol=tol, atol=tol * np.abs(y_h).max())
    np.testing.assert_allclose(inference_d, inference_h, rtol=tol, atol=tol * np.abs(y_h).max())
    np.testing.assert_allclose(dx_d, dx_h, rtol=tol, atol=tol * np.abs(dx_h).max())
    g_h, g_d = host.gradients(), device.gradients()
    np.testing.assert_allclose(g_d, g_h, rtol=tol, atol=tol * np.abs(g_h).max())
    assert np.abs(g_h).max() > 0


MLPS = [(n_in, out, width, depth) for n_in, out, width, depth in [
    (5, 3, 16, 1), (16, 1, 16, 0), (32, 3, 64, 2), (7, 4, 8, 3), (16, 16, 128, 5), (3, 2, 24, 10), (8, 5, 7, 2),
    (32, 20, 32, 1)]]


@blas_exists
@pytest.mark.parametrize("n_in, n_out, width, depth", MLPS)
def test_kernel_mlp_equals_blas_for_every_width_and_depth(rng, monkeypatch, n_in, n_out, width, depth):
    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth}
    host, device = pair(lambda: tinn.create_network(n_in, n_out, cfg), monkeypatch)
    B = 3 * TILE + 17                                  # full tiles and a partial one
    compare(host, device, rng.normal(size=(B, n_in)).astype(np.float32),
            rng.normal(size=(B, n_out)).astype(np.float32))


@blas_exists
@pytest.mark.parametrize("activation", NAMES)
@pytest.mark.parametrize("output_activation", ["None", "Sigmoid", "Sine"])
def test_kernel_mlp_equals_blas_for_every_activation(rng, monkeypatch, activation, output_activation):
    cfg = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": activation,
           "output_activation": output_activation}
    host, device = pair(lambda: tinn.create_network(6, 3, cfg), monkeypatch)
    scale = 0.3 if activation == "Exponential" else 1.0
    compare(host, device, (scale * rng.normal(size=(300, 6))).astype(np.float32),
            rng.normal(size=(300, 3)).astype(np.float32))


@blas_exists
@pytest.mark.parametrize("routing", ["shuffled", "skewed", "dense"])
def test_kernel_mlp_equals_blas_for_network_arrays(rng, monkeypatch, routing):
    K, B = 5, 700
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "Tanh"}
    host, device = pair(lambda: tinn.create_network(4, 3, cfg, n_instances=K), monkeypatch)
    if routing == "dense":
        x = rng.normal(size=(K, B // K, 4)).astype(np.float32)
        compare(host, device, x, rng.normal(size=(K, B // K, 3)).astype(np.float32))
        return
    inst = rng.integers(0, K, B).astype(np.int32)
    if routing == "skewed":                        # one network with many tiles, one with none
        inst = np.where(rng.random(B) < 0.8, 2, inst % 4).astype(np.int32)
    x = rng.normal(size=(B, 4)).astype(np.float32)
    compare(host, device, x, rng.normal(size=(B, 3)).astype(np.float32), inst)


CONFIGS = [(32, 3, 64, 2, "ReLU", "None"), (5, 2, 16, 1, "Tanh", "Sigmoid"), (16, 16, 64, 0, "SiLU", "Sine"),
           (7, 4, 24, 3, "Softplus", "None")]


@pytest.mark.parametrize("mlp_kernels, n_in, n_out, width, depth, act, out_act",
                         [("kernels",) + c for c in CONFIGS] + [("fused",) + c for c in CONFIGS[:2]])
def test_device_mlp_equals_the_reference(rng, monkeypatch, device_path, mlp_kernels, n_in, n_out, width, depth,
                                         act, out_act):
    """Outputs, dL/dx and dL/dW of the per-layer kernels, or of the fused shared-memory kernels (forced
    onto this arch; x64 has no shared memory), against float64 NumPy."""
    if mlp_kernels == "fused":
        arch = impl.current_cfg().arch
        if arch in (ti.x64, ti.arm64):
            pytest.skip("the fused kernels need shared memory, which the x64 backend has not")
        monkeypatch.setattr(_kernel_mlp, "FUSED_ARCHS", (arch,))
        monkeypatch.setitem(_kernel_mlp.FUSED_TILE, arch, _kernel_mlp.FUSED_TILE.get(arch, 32))
    else:
        monkeypatch.setattr(_kernel_mlp, "FUSED_ARCHS", ())
    net = tinn.create_network(n_in, n_out, {"otype": "FullyFusedMLP", "n_neurons": width,
                                            "n_hidden_layers": depth, "activation": act,
                                            "output_activation": out_act})
    shapes = net.layer_sizes()
    net.set_params(random_weights(shapes, rng))
    B = 5 * 64 + 11                                   # several tiles and a partial one
    x = rng.normal(size=(B, n_in)).astype(np.float32)
    dy = rng.normal(size=(B, n_out)).astype(np.float32)
    Ws = mlp_unflatten(net.params(), shapes)
    y_ref, zs, hs = mlp_forward_ref(x, Ws, act, out_act)
    dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dy, y_ref.shape[1], 0.0), act, out_act)
    y, ctx = net.forward(x)
    dx = net.backward(ctx, dy)
    assert_close(y, y_ref[:, :n_out], rtol=1e-5, atol_rel=1e-5)
    assert_close(net.inference(x), y_ref[:, :n_out], rtol=1e-5, atol_rel=1e-5)
    assert_close(dx, dx_ref, rtol=1e-4, atol_rel=1e-5)
    for g, dW in zip(mlp_unflatten(net.gradients(), shapes), dWs):
        assert_close(g, dW, rtol=1e-4, atol_rel=1e-5, atol=1e-7)
    kind = type(ctx.fused).__name__ if getattr(ctx, "fused", None) is not None else "kernels"
    assert kind == {"kernels": "kernels", "fused": "FusedKernels"}[mlp_kernels]


def test_tiles_cover_each_network_once(rng):
    inst = np.concatenate([np.full(300, 3), np.full(5, 0), rng.integers(0, 6, 400)]).astype(np.int32)
    rng.shuffle(inst)
    table, order = tiles(inst, len(inst), 7)
    assert sorted(order.tolist()) == list(range(len(inst)))
    seen = np.zeros(len(inst), int)
    for start, end, k in table:
        assert 0 < end - start <= TILE
        assert (inst[order[start:end]] == k).all()
        seen[order[start:end]] += 1
    assert (seen == 1).all()
    single, none = tiles(None, 1000, 1)
    assert none is None and single[-1].tolist() == [1000 - 1000 % TILE, 1000, 0]


@blas_exists
@pytest.mark.parametrize("loss", ["RelativeL2", "L1"])
def test_device_training_equals_host_training(rng, monkeypatch, loss):
    """config_hash's model (hash grid, 64-wide MLP) trained for a few steps on both paths."""
    config = tinn.load_config("data/config_hash.json")
    config["loss"] = {"otype": loss}
    host, device = pair(lambda: tinn.create_from_config(2, 3, config), monkeypatch)
    for _ in range(4):
        x = rng.random((1000, 2), dtype=np.float32)
        t = rng.random((1000, 3), dtype=np.float32)
        with path(False):
            loss_h = host.trainer.training_step(x, t)
        with path(True):
            loss_d = device.trainer.training_step(_device.put(x), _device.put(t))
        assert loss_d == pytest.approx(loss_h, rel=1e-4)
    np.testing.assert_allclose(device.network.params(), host.network.params(), rtol=1e-3, atol=1e-5)


class _Seam:
    """Records what crosses to the host: numpy products and batch-sized arrays read back or handed to
    kernels (a numpy kernel argument is copied to the device and back on every launch)."""

    def __init__(self, monkeypatch, batch):
        self.products, self.downloads, self.host_arguments = [], [], []
        for name in ("matmul", "dot", "einsum"):
            real = getattr(np, name)
            monkeypatch.setattr(np, name, self._wrap(real, name))
        real_call = Kernel.__call__
        seam = self

        def reader(real):
            def read(nd, *a, **k):
                if np.prod(nd.shape) >= batch:
                    seam.downloads.append(nd.shape)
                return real(nd, *a, **k)
            return read

        def call(kernel, *args, **kwargs):
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, np.ndarray) and a.size >= batch:
                    seam.host_arguments.append((kernel.func.__name__, a.shape))
            return real_call(kernel, *args, **kwargs)

        for name in ("_ndarray_to_numpy", "_ndarray_matrix_to_numpy"):        # every ndarray's to_numpy
            monkeypatch.setattr(Ndarray, name, reader(getattr(Ndarray, name)))
        monkeypatch.setattr(Kernel, "__call__", call)

    def _wrap(self, real, name):
        def wrapped(*a, **k):
            self.products.append(name)
            return real(*a, **k)
        return wrapped


def assert_steps_stay_on_the_device(model, n_in, rng, monkeypatch):
    """Three training steps of ``model`` on one ti.ndarray batch call no host BLAS, read nothing batch-sized
    back and hand no batch-sized numpy array to a kernel; only the loss comes back, and it falls."""
    B = 1 << 15                                                   # more than the model has parameter rows
    x, t = _device.put(rng.random((B, n_in), dtype=np.float32)), _device.put(rng.random((B, 3), dtype=np.float32))
    first = model.trainer.training_step(x, t)                     # compiles outside the instrumented steps
    seam = _Seam(monkeypatch, B)
    losses = [model.trainer.training_step(x, t) for _ in range(3)]
    assert seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    assert isinstance(losses[-1], float) and losses[-1] < first


@pytest.mark.parametrize("config", ["config_hash.json", "config.json"])
def test_a_training_step_on_the_device_stays_there(rng, monkeypatch, device_path, config):
    """On the device path a step of a ti.ndarray batch calls no host BLAS, reads nothing batch-sized
    back and hands no batch-sized numpy array to a kernel; only the loss comes back."""
    model = tinn.create_from_config(2, 3, f"data/{config}") if config == "config_hash.json" else \
        tinn.create_from_config(2, 3, {"encoding": {"otype": "HashGrid", "n_levels": 4},
                                       "network": {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 3},
                                       "loss": {"otype": "L2"}})
    assert_steps_stay_on_the_device(model, 2, rng, monkeypatch)


STEP_ENCODINGS = {
    "Frequency": (2, {"otype": "Frequency", "n_frequencies": 4}),
    "OneBlob": (2, {"otype": "OneBlob", "n_bins": 16}),
    "Composite": (4, {"otype": "Composite", "nested": [
        {"otype": "HashGrid", "n_levels": 4, "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 8, "n_dims_to_encode": 1},
        {"otype": "Frequency", "n_frequencies": 4}]}),
}


@pytest.mark.parametrize("name", list(STEP_ENCODINGS))
def test_a_training_step_with_any_encoding_stays_on_the_device(rng, monkeypatch, device_path, name):
    """As above, for models whose encoding is not a grid alone: per-dim encodings and a Composite (its
    slices, concatenation and nested grid) keep the batch on the device too."""
    n_in, encoding = STEP_ENCODINGS[name]
    model = tinn.create_from_config(n_in, 3, {"encoding": encoding, "loss": {"otype": "L2"},
                                              "network": {"otype": "CutlassMLP", "n_neurons": 32,
                                                          "n_hidden_layers": 2}})
    assert_steps_stay_on_the_device(model, n_in, rng, monkeypatch)


GRID = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6, "base_resolution": 4,
        "per_level_scale": 2.0}

ENCODINGS = {
    # name: (n_input_dims, config, alignment), one per otype (test_encodings, test_composite, test_second_order)
    "Identity": (3, {"otype": "Identity", "scale": 2.5, "offset": -0.75}, 16),
    "Frequency": (2, {"otype": "Frequency", "n_frequencies": 5}, 0),
    "OneBlob": (2, {"otype": "OneBlob", "n_bins": 8}, 0),
    "SphericalHarmonics": (3, {"otype": "SphericalHarmonics", "degree": 5}, 32),
    "TriangleWave": (2, {"otype": "TriangleWave", "n_frequencies": 4}, 0),
    "Empty": (2, {"otype": "Empty"}, 16),
    "HashGrid": (2, {**GRID, "interpolation": "Smoothstep"}, 0),
    "Concatenation": (5, {"otype": "Composite", "nested": [           # the Empty entry has no columns
        {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 1},
        {"otype": "Empty", "n_dims_to_encode": 1},
        {"otype": "Identity", "scale": 2.0}]}, 16),
    "Sum": (3, {"otype": "Composite", "reduction": "Sum", "nested": [
        {**GRID, "n_dims_to_encode": 2}, {"otype": "OneBlob", "n_bins": 4}]}, 0),
    "Product": (4, {"otype": "Composite", "reduction": "Product", "nested": [
        {**GRID, "n_dims_to_encode": 2}, {"otype": "OneBlob", "n_bins": 4, "n_dims_to_encode": 1},
        {"otype": "Frequency", "n_frequencies": 2}]}, 0),
    "NRC": (9, {"otype": "NRC", "n_frequencies": 3, "n_bins": 4}, 16),
}
PASSES = ("forward", "inference", "dL/dx", "dL/dparams", "dL2/d(dL/dy)", "dL2/dx", "dL2/dparams")


def encoding_and_batch(name, B):
    """The encoding ``name`` (parameters uniform in [-1, 1], so that products and gradients are not tiny) and
    a batch ``(x, dL/dy, dL2/d(dL/dx))`` of B samples."""
    n_in, cfg, alignment = ENCODINGS[name]
    enc = tinn.create_encoding(n_in, cfg, alignment=alignment)
    if not enc.n_output_dims:                   # Empty: padding only (without, it has no columns, as in Concatenation)
        enc.set_padded_output_width(alignment)
    rng = np.random.default_rng(len(name))
    if enc.n_params:
        enc.set_params(rng.uniform(-1.0, 1.0, enc.n_params).astype(np.float32))
    return enc, (rng.random((B, n_in), dtype=np.float32), rng.normal(size=(B, enc.n_output_dims)).astype(np.float32),
                 rng.normal(size=(B, n_in)).astype(np.float32))


def encoding_passes(enc, x, dy, v) -> dict:
    """Every batch pass of ``enc`` on ``(x, dL/dy, dL2/d(dL/dx))``, by name (:data:`PASSES`)."""
    y, ctx = enc.forward(x)
    out = {"forward": y, "inference": enc.inference(x), "dL/dx": enc.backward(ctx, dy),
           "dL/dparams": enc.gradients()}
    out["dL2/d(dL/dy)"], out["dL2/dx"] = enc.backward_backward_input(ctx, v, dy)
    out["dL2/dparams"] = enc.gradients()
    return out


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_an_encoding_keeps_a_device_batch_on_the_device(monkeypatch, device_path, name):
    """Forward, inference, backward and second order of a ti.ndarray batch answer in ti.ndarrays, read
    nothing batch-sized back and hand no batch-sized numpy array to a kernel."""
    B = 1 << 12                                               # more than any of these has parameters
    enc, batch = encoding_and_batch(name, B)
    x, dy, v = (_device.put(a) for a in batch)
    encoding_passes(enc, x, dy, v)                            # compiles outside the instrumented passes
    seam = _Seam(monkeypatch, B)
    out = encoding_passes(enc, x, dy, v)
    assert seam.downloads == [] and seam.host_arguments == []
    for p in PASSES:
        if "params" not in p:
            assert isinstance(out[p], Ndarray), p


@blas_exists
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_an_encoding_on_the_device_path_equals_the_host_path(name):
    """Every pass of a ti.ndarray batch on the device path (FORCE) against the same numpy batch on the
    host path: outputs, input and parameter gradients, and second order."""
    enc, batch = encoding_and_batch(name, 333)
    with path(False):
        host = encoding_passes(enc, *batch)
    with path(True):
        device = encoding_passes(enc, *(_device.put(a) for a in batch))
    for p in PASSES:
        h, d = host[p], _device.host(device[p])
        assert d.shape == h.shape, p
        np.testing.assert_allclose(d, h, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(h).max(initial=0.0)), err_msg=p)


@blas_exists
def test_a_model_with_a_composite_encoding_on_the_device_path_equals_the_host_path(rng, monkeypatch):
    """NetworkWithInputEncoding with a Composite encoding (nested grid): forward, inference, backward and
    parameter gradients on both paths; the device path hands the encoding the ti.ndarray batch."""
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
    host, device = pair(lambda: tinn.NetworkWithInputEncoding(4, 3, ENCODINGS["Product"][1], cfg), monkeypatch)
    x = rng.random((300, 4), dtype=np.float32)
    compare(host, device, x, rng.normal(size=(300, 3)).astype(np.float32), tol=1e-4)


def test_pool_reuses_a_buffer_once_its_owner_is_gone():
    class Owner:
        pass

    pool = _device.Pool()
    first_owner, second_owner = Owner(), Owner()
    a = pool.take((3, 4), first_owner)
    b = pool.take((3, 4), second_owner)            # the first owner is alive: a new buffer
    assert a is not b
    del first_owner
    c = pool.take((3, 4), Owner())
    assert c is a and pool.take((2, 4), Owner()).shape == (2, 4)
