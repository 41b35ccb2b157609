"""The device path (``tinn.runtime.program``): the MLP as Taichi kernels on ``ti.ndarray`` buffers.

On the CPU it is forced (``tinn.runtime.program.FORCE``) and checked against the host BLAS path for every
activation, width and depth the suite uses, forward, backward and second order, network arrays
included, and against the host path of every encoding, second order included; on any other arch it is
what runs, and a training step (a single network with a grid, per-dim or Composite encoding, or a
routed network array), a second order and an encoding's pass of a ti.ndarray batch are checked to call
no host BLAS and to move no batch-sized array to the host.
"""

import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray
from taichi.lang.kernel_impl import Kernel

import tinn
from tinn.batch import buffers as _buffers
from tinn.batch import batch as _kind
from tinn.runtime.memory import HostView
from tinn.networks import _kernel_mlp, _mlp_plan
from tinn.batch.batch import Batch
from tinn.batch.routing import TILE, Routing
from reference import (assert_close, mlp_backward_ref, mlp_forward_ref, mlp_second_order_ref, mlp_shapes,
                       mlp_unflatten, padded, random_weights)
from tinn.networks.activations import NAMES
from conftest import SMALL_GRID, on_path, sample, small_config_hash

on_cpu = impl.current_cfg().arch in (ti.x64, ti.arm64)
blas_exists = pytest.mark.x64_only("the host BLAS path to compare with runs only on the CPU")


def pair(build, monkeypatch):
    """The same model (same seed) on the host path and on the device path."""
    with on_path(False):
        host = build()
    with on_path(True):
        device = build()
        mlp = device
        while not hasattr(mlp, "_batch_path"):
            mlp = mlp.network
        assert type(mlp._batch_path(Batch(None, Routing(1), _kind.DEVICE))).__name__ == "KernelMLP"   # a device batch's backend
    return host, device


def compare(host, device, x, dy, instance=None, tol=2e-5):
    with on_path(False):
        y_h, ctx_h = host.forward(x, instance)
        inference_h = host.inference(x, instance)
        dx_h = host.backward(ctx_h, dy)
    with on_path(True):
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
@pytest.mark.parametrize("n_in, n_out, width, depth", sample(MLPS, 3))
def test_kernel_mlp_equals_blas_for_every_width_and_depth(rng, monkeypatch, n_in, n_out, width, depth):
    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth}
    host, device = pair(lambda: tinn.create_network(n_in, n_out, cfg), monkeypatch)
    B = 3 * TILE + 17                                  # full tiles and a partial one
    compare(host, device, rng.normal(size=(B, n_in)).astype(np.float32),
            rng.normal(size=(B, n_out)).astype(np.float32))


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


def use_mlp_kernels(monkeypatch, mlp_kernels: str):
    """Run single networks on the per-layer kernels (``"kernels"``) or on the fused shared-memory kernels
    (``"fused"``, forced onto this arch; skipped on x64, which has no shared memory)."""
    if mlp_kernels == "fused":
        arch = impl.current_cfg().arch
        if arch in (ti.x64, ti.arm64):
            pytest.skip("the fused kernels need shared memory, which the x64 backend has not")
        monkeypatch.setattr(_kernel_mlp, "FUSED_ARCHS", (arch,))
        if arch.name not in _mlp_plan.FUSED_TILINGS:
            monkeypatch.setitem(_mlp_plan.FUSED_TILINGS, arch.name, _mlp_plan.FUSED_TILINGS["vulkan"])
    else:
        monkeypatch.setattr(_kernel_mlp, "FUSED_ARCHS", ())


@pytest.mark.parametrize("mlp_kernels, n_in, n_out, width, depth, act, out_act",
                         sample([("kernels",) + c for c in CONFIGS] + [("fused",) + c for c in CONFIGS[:2]], 3))
def test_device_mlp_equals_the_reference(rng, monkeypatch, device_path, mlp_kernels, n_in, n_out, width, depth,
                                         act, out_act):
    """Outputs, dL/dx and dL/dW of the per-layer kernels, or of the fused shared-memory kernels (forced
    onto this arch; x64 has no shared memory), against float64 NumPy."""
    use_mlp_kernels(monkeypatch, mlp_kernels)
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


@pytest.mark.parametrize("K", [7, 700], ids=["K7", "K700"])         # 700: the census's scan over several blocks
@pytest.mark.parametrize("ids_on_device", [False, True])
def test_tiles_cover_each_network_once(rng, ids_on_device, K):
    """Routing.tiles: every sample in exactly one tile, tiles of at most TILE samples of one network,
    a network's tiles consecutive; and the counts."""
    inst = np.concatenate([np.full(300, 3), np.full(5, 0), rng.integers(0, K - 1, 400)]).astype(np.int32)
    rng.shuffle(inst)
    routing = Routing(len(inst), K, _buffers.put(inst, ti.i32) if ids_on_device else inst)
    np.testing.assert_array_equal(routing.counts, np.bincount(inst, minlength=K))
    table, order = (a.to_numpy() for a in routing.tiles)
    assert sorted(order.tolist()) == list(range(len(inst)))
    seen = np.zeros(len(inst), int)
    for start, end, k in table:
        assert 0 < end - start <= TILE
        assert (inst[order[start:end]] == k).all()
        seen[order[start:end]] += 1
    assert (seen == 1).all()
    assert (np.diff(table[:, 2]) >= 0).all() and len(table) == sum(-(-c // TILE) for c in np.bincount(inst))


@blas_exists
@pytest.mark.parametrize("loss", sample(["RelativeL2", "L1"], 1))
def test_device_training_equals_host_training(rng, monkeypatch, loss):
    """config_hash's model (hash grid, 64-wide MLP; ``small_config_hash``) trained for a few steps on both paths,
    with SGD (Adam's first steps move every weight by about the learning rate whatever its gradient's size, so a
    gradient near 0 that rounds to the other sign on the other path would move its weight 2e-2 the other way)."""
    config = small_config_hash()
    config["loss"] = {"otype": loss}
    config["optimizer"] = {"otype": "SGD", "learning_rate": 1.0}
    host, device = pair(lambda: tinn.create_from_config(2, 3, config), monkeypatch)
    for _ in range(4):
        x = rng.random((1000, 2), dtype=np.float32)
        t = rng.random((1000, 3), dtype=np.float32)
        with on_path(False):
            loss_h = host.trainer.training_step(x, t)
        with on_path(True):
            loss_d = device.trainer.training_step(_buffers.put(x), _buffers.put(t))
        assert loss_d == pytest.approx(loss_h, rel=1e-4)
    np.testing.assert_allclose(device.network.params(), host.network.params(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("otype, extra", [("Adam", {}), ("Adam", {"adabound": True}), ("SGD", {})])
def test_optimizer_arrays_on_the_device_follow_their_changes(rng, otype, extra):
    """The optimizer's small arrays (which networks step, learning rates, Adam's bias table and step counts)
    are device copies on the device path, uploaded only when they change: three networks stepped under
    changing masks, with the learning rate lowered halfway, end bit-identical to the CPU's own path, step
    counts included."""
    K, n = 3, 40
    start = rng.normal(size=(K, n)).astype(np.float32)
    grads = [rng.normal(size=(K, n)).astype(np.float32) for _ in range(6)]
    masks = [None, [1], [0, 2], [0, 2], None, [2]]
    results = []
    for device in (False, True):
        with on_path(device):
            opt = tinn.create_optimizer({"otype": otype, "learning_rate": 1e-2, **extra})
            params = start.copy()
            for i, (g, active) in enumerate(zip(grads, masks)):
                if i == 3:
                    opt.learning_rate = 1e-3
                opt.step(params, g, active=active)
            results.append((params, opt.state_dict()))
    (p_host, state_host), (p_device, state_device) = results
    assert not np.array_equal(p_host, start)
    np.testing.assert_array_equal(p_device, p_host)
    assert state_device.keys() == state_host.keys()
    for key in state_host:
        np.testing.assert_array_equal(state_device[key], state_host[key], err_msg=key)
    np.testing.assert_array_equal(state_host["current_step"], [4, 3, 5])


def compare_second_order(host, device, x, v, dy, instance=None, tol=1e-4):
    """``backward_backward_input`` on both paths: dL2/d(dL_dy), dL2/dx and dL2/dparams agree (to ``tol`` of the
    largest value); the parameter gradients are not all 0."""
    results = []
    for model, on_device in ((host, False), (device, True)):
        with on_path(on_device):
            _, ctx = model.forward(x, instance)
            d_dy, d_x = model.backward_backward_input(ctx, v, dy)
            results.append((_kind.host(d_dy), _kind.host(d_x), model.gradients()))
    for got, want in zip(results[1], results[0]):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(np.abs(want).max(), 1e-6))
    assert np.abs(results[0][2]).max() > 0


@blas_exists
@pytest.mark.parametrize("order", sample([1, 2], keep=[1]))
@pytest.mark.parametrize("activation", sample(NAMES, 4))
@pytest.mark.parametrize("output_activation", sample(["None", "Sigmoid", "Sine"], keep=["None"]))
def test_kernel_mlp_equals_blas_for_every_activation(rng, monkeypatch, order, activation, output_activation):
    """First order (outputs, dL/dx, dL/dW) or second order (backward_backward_input) of both paths."""
    cfg = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": activation,
           "output_activation": output_activation}
    host, device = pair(lambda: tinn.create_network(6, 3, cfg), monkeypatch)
    x = (0.3 if activation == "Exponential" else 1.0) * rng.normal(size=(300, 6)).astype(np.float32)
    dy = rng.normal(size=(300, 3)).astype(np.float32)
    if order == 1:
        compare(host, device, x, dy)
    else:
        compare_second_order(host, device, x, rng.normal(size=(300, 6)).astype(np.float32), dy)


@blas_exists
@pytest.mark.parametrize("n_in, n_out, width, depth", sample([MLPS[i] for i in (0, 1, 3, 5, 7)], 2))
def test_kernel_second_order_equals_blas_for_widths_and_depths(rng, monkeypatch, n_in, n_out, width, depth):
    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth, "activation": "Softplus",
           "output_activation": "Tanh"}
    host, device = pair(lambda: tinn.create_network(n_in, n_out, cfg), monkeypatch)
    B = 3 * TILE + 17
    compare_second_order(host, device, rng.normal(size=(B, n_in)).astype(np.float32),
                         rng.normal(size=(B, n_in)).astype(np.float32), rng.normal(size=(B, n_out)).astype(np.float32))


@blas_exists
@pytest.mark.parametrize("routing", ["shuffled", "skewed", "dense"])
def test_kernel_second_order_equals_blas_for_network_arrays(rng, monkeypatch, routing):
    K, B = 5, 700
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "SiLU",
           "output_activation": "Sigmoid"}
    host, device = pair(lambda: tinn.create_network(4, 3, cfg, n_instances=K), monkeypatch)
    if routing == "dense":
        shape = (K, B // K)
        compare_second_order(host, device, rng.normal(size=shape + (4,)).astype(np.float32),
                             rng.normal(size=shape + (4,)).astype(np.float32),
                             rng.normal(size=shape + (3,)).astype(np.float32))
        return
    inst = rng.integers(0, K, B).astype(np.int32)
    if routing == "skewed":                        # one network with many tiles, one with none
        inst = np.where(rng.random(B) < 0.8, 2, inst % 4).astype(np.int32)
    compare_second_order(host, device, rng.normal(size=(B, 4)).astype(np.float32),
                         rng.normal(size=(B, 4)).astype(np.float32), rng.normal(size=(B, 3)).astype(np.float32), inst)


@blas_exists
@pytest.mark.full_only("a hash grid model's second-order kernels, compiled twice (test_second_order checks the "
                       "grid model's second order against finite differences by default)")
def test_kernel_second_order_through_a_hash_grid_equals_blas(rng, monkeypatch):
    """NetworkWithInputEncoding: the MLP's two halves around the grid's second order, on device batches."""
    enc = {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 12, "base_resolution": 4}
    net = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "Tanh",
           "output_activation": "Softplus"}
    host, device = pair(lambda: tinn.NetworkWithInputEncoding(3, 2, enc, net), monkeypatch)
    B = 2 * TILE + 5
    x, v, dy = (rng.random((B, 3), dtype=np.float32), rng.normal(size=(B, 3)).astype(np.float32),
                rng.normal(size=(B, 2)).astype(np.float32))
    with on_path(True):
        _, ctx = device.forward(_buffers.put(x))
        results = device.backward_backward_input(ctx, _buffers.put(v), _buffers.put(dy))
    assert all(isinstance(r, ti.Ndarray) for r in results)
    compare_second_order(host, device, x, v, dy, tol=2e-4)


@pytest.mark.parametrize("mlp_kernels, n_instances", sample([("kernels", 1), ("kernels", 3), ("fused", 1)], 2))
def test_device_second_order_equals_the_reference(monkeypatch, device_path, mlp_kernels, n_instances):
    """dL2/d(dL_dy), dL2/dx and dL2/dW of the device path (per-layer kernels, routed over an array, or after
    a pass of the fused kernels) against float64 NumPy (finite differences of the reference backward); the
    gradients of a first-order backward before it are overwritten."""
    use_mlp_kernels(monkeypatch, mlp_kernels)
    rng = np.random.default_rng(7)
    n_in, n_out, width, depth, act, out_act, B = 4, 3, 8, 2, "Tanh", "Sigmoid", 2 * 32 + 9
    net = tinn.create_network(n_in, n_out, {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth,
                                            "activation": act, "output_activation": out_act},
                              n_instances=n_instances)
    shapes = mlp_shapes(n_in, width, depth, n_out)
    params = np.stack([random_weights(shapes, rng) for _ in range(n_instances)])
    net.set_params(params if n_instances > 1 else params[0])
    x = rng.uniform(-1, 1, (B, n_in)).astype(np.float32)
    instance = rng.integers(0, n_instances, B).astype(np.int32) if n_instances > 1 else None
    dy, v = rng.normal(size=(B, n_out)).astype(np.float32), rng.normal(size=(B, n_in)).astype(np.float32)
    _, ctx = net.forward(x, instance)
    net.backward(ctx, dy)                         # gradients that the second order's overwrite must replace
    d_dy, d_x = net.backward_backward_input(ctx, v, dy)
    grads = net.gradients().reshape(n_instances, -1)
    kind = type(ctx.fused).__name__ if getattr(ctx, "fused", None) is not None else "kernels"
    assert kind == {"kernels": "kernels", "fused": "FusedKernels"}[mlp_kernels]
    ids = np.zeros(B, np.int32) if instance is None else instance
    for k in range(n_instances):
        rows = ids == k
        r_dy, r_x, r_params = mlp_second_order_ref(x[rows], params[k], shapes, dy[rows], v[rows], act, out_act, n_out)
        assert_close(d_dy[rows], r_dy, rtol=2e-3, atol_rel=2e-4, atol=1e-6)
        assert_close(d_x[rows], r_x, rtol=2e-3, atol_rel=2e-4, atol=1e-6)
        assert_close(grads[k], r_params, rtol=2e-3, atol_rel=2e-4, atol=1e-6)


class _Seam:
    """Records what crosses to the host: numpy products, batch-sized arrays read back or handed to
    kernels, and tinn's kernels that get any numpy argument (on CUDA each such launch allocates, copies
    to the device and back, and waits for the device twice)."""

    COPY_KERNELS = ("ndarray_to_ext_arr", "ext_arr_to_ndarray")        # Taichi's own to_numpy / from_numpy

    def __init__(self, monkeypatch, batch):
        self.products, self.downloads, self.host_arguments, self.numpy_launches = [], [], [], []
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
            name = kernel.func.__name__
            for a in list(args) + list(kwargs.values()):
                if not isinstance(a, np.ndarray) or isinstance(a, HostView):     # (a field's own memory on x64)
                    continue
                if a.size >= batch:
                    seam.host_arguments.append((name, a.shape))
                if name not in seam.COPY_KERNELS:
                    seam.numpy_launches.append((name, a.shape))
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
    back and hand no numpy array to any of tinn's kernels (the optimizer's masks, rates and tables are
    device copies kept between steps); only the loss comes back, and it falls."""
    B = 1 << 15                                                   # more than the model has parameter rows
    x, t = _buffers.put(rng.random((B, n_in), dtype=np.float32)), _buffers.put(rng.random((B, 3), dtype=np.float32))
    first = model.trainer.training_step(x, t)                     # compiles outside the instrumented steps
    seam = _Seam(monkeypatch, B)
    losses = [model.trainer.training_step(x, t) for _ in range(3)]
    assert seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    assert seam.numpy_launches == []
    assert float(losses[-1]) < float(first)


ARRAY_CONFIG = {"encoding": {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 12},
                "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2},
                "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "SGD", "learning_rate": 1.0}}


@blas_exists
def test_device_array_training_equals_host_training(rng, monkeypatch):
    """A routed network array trained on both paths, its ids on the device for the device path: the
    per-network losses and the parameters of every network agree (networks 5 and 7 get no samples)."""
    K, B = 8, 3000
    host, device = pair(lambda: tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K), monkeypatch)
    for _ in range(3):
        x = rng.random((B, 2), dtype=np.float32)
        t = rng.random((B, 3), dtype=np.float32)
        inst = rng.choice([0, 1, 2, 3, 4, 6], B, p=[0.5, 0.2, 0.1, 0.1, 0.05, 0.05]).astype(np.int32)
        with on_path(False):
            loss_h, per_h = host.trainer.training_step(x, t, inst, per_instance=True)
        with on_path(True):
            loss_d, per_d = device.trainer.training_step(_buffers.put(x), _buffers.put(t), _buffers.put(inst, ti.i32),
                                                         per_instance=True)
        assert loss_d == pytest.approx(loss_h, rel=1e-4)
        np.testing.assert_allclose(per_d, per_h, rtol=1e-4)
        assert per_h[5] == per_h[7] == 0
    np.testing.assert_allclose(device.network.params(), host.network.params(), rtol=1e-3, atol=1e-5)


def test_a_network_array_step_on_the_device_stays_there(rng, monkeypatch, device_path):
    """A routed network array's step with its batch and ids on the device: no host BLAS, nothing
    batch-sized read back or handed to a kernel as numpy; only the loss and per-network figures (K values)
    come back. Its result equals a step of the same batch with the ids from the host."""
    K, B = 16, 1 << 15
    models = [tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K) for _ in range(2)]
    x, t = _buffers.put(rng.random((B, 2), dtype=np.float32)), _buffers.put(rng.random((B, 3), dtype=np.float32))
    inst = rng.integers(0, K - 1, B).astype(np.int32)                      # the last network gets no samples
    ids = _buffers.put(inst, ti.i32)
    first = models[0].trainer.training_step(x, t, ids)                   # compiles outside the instrumented steps
    assert first == pytest.approx(models[1].trainer.training_step(x, t, inst), rel=1e-5)
    seam = _Seam(monkeypatch, B)
    losses = [models[0].trainer.training_step(x, t, ids, per_instance=True) for _ in range(3)]
    assert seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    loss, per_network = losses[-1]
    assert loss < first and per_network[K - 1] == 0 and (per_network[:-1] > 0).all()


@blas_exists
@pytest.mark.full_only("a second array config's kernels on both paths; the default suite compares a routed array's "
                       "paths and runs a dense batch's device step")
def test_dense_device_array_equals_host_array(rng, monkeypatch):
    """A dense ``(K, S, n)`` batch as ti.ndarrays on the device path and as numpy on the host path: the
    losses, outputs, input gradients, second order (all ``(K, S, n)``) and the trained parameters agree."""
    K, S = 6, 700
    host, device = pair(lambda: tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K), monkeypatch)
    x, t = rng.random((K, S, 2), dtype=np.float32), rng.random((K, S, 3), dtype=np.float32)
    dy, v = rng.normal(size=(K, S, 3)).astype(np.float32), rng.normal(size=(K, S, 2)).astype(np.float32)
    for _ in range(3):
        with on_path(False):
            loss_h, per_h = host.trainer.training_step(x, t, per_instance=True)
        with on_path(True):
            loss_d, per_d = device.trainer.training_step(_buffers.put(x), _buffers.put(t), per_instance=True)
        assert loss_d == pytest.approx(loss_h, rel=1e-4)
        np.testing.assert_allclose(per_d, per_h, rtol=1e-4)
    np.testing.assert_allclose(device.network.params(), host.network.params(), rtol=1e-3, atol=1e-5)
    with on_path(False):
        y_h, ctx = host.network.forward(x)
        dx_h = host.network.backward(ctx, dy)
        second_h = host.network.backward_backward_input(ctx, v, dy)
    with on_path(True):
        y_d, ctx = device.network.forward(_buffers.put(x))
        dx_d = device.network.backward(ctx, _buffers.put(dy))
        second_d = device.network.backward_backward_input(ctx, _buffers.put(v), _buffers.put(dy))
    for d, h in [(y_d, y_h), (dx_d, dx_h), *zip(second_d, second_h)]:
        assert isinstance(d, ti.Ndarray) and d.shape == h.shape
        assert_close(d.to_numpy(), h, rtol=2e-3, atol_rel=2e-4, atol=1e-6)


def test_a_dense_network_array_step_on_the_device_stays_there(rng, monkeypatch, device_path):
    """A dense ``(K, S, n)`` ti.ndarray batch's step: no host BLAS, nothing batch-sized read back or handed to
    a kernel as numpy (the batch is flattened and its ids made on the device), the loss falls."""
    K, S = 16, 1 << 11
    model = tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K)
    x, t = _buffers.put(rng.random((K, S, 2), dtype=np.float32)), _buffers.put(rng.random((K, S, 3), dtype=np.float32))
    first = model.trainer.training_step(x, t)                   # compiles outside the instrumented steps
    seam = _Seam(monkeypatch, K * S)
    losses = [model.trainer.training_step(x, t) for _ in range(3)]
    y = model.network.inference(x)
    assert seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    assert losses[-1] < first and isinstance(y, ti.Ndarray) and y.shape == (K, S, 3)


def test_a_device_output_gradient_of_another_batch_is_refused(rng, device_path):
    """backward with a ti.ndarray dL_doutput whose batch is not the forward pass's raises before any kernel
    runs (a kernel would read past its end); the gradients stay as they were."""
    net = tinn.create_network(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
    _, ctx = net.forward(_buffers.put(rng.random((256, 2), dtype=np.float32)))
    net.backward(ctx, _buffers.put(rng.random((256, 3), dtype=np.float32)))
    before = net.gradients().copy()
    for rows in (128, 257):
        with pytest.raises(ValueError, match="dL_doutput has"):
            net.backward(ctx, _buffers.put(np.ones((rows, 3), np.float32)))
    np.testing.assert_array_equal(net.gradients(), before)


@pytest.mark.parametrize("bad, error", [(np.float32, TypeError), ("short", ValueError), ("negative", ValueError),
                                        ("large", ValueError)])
def test_device_ids_are_checked_before_any_update(rng, device_path, bad, error):
    """A device ids array of a wrong kind, dtype or shape is refused before any kernel runs; ids out of range are
    found on the device (the step reads nothing back), the update is skipped and the error comes with the loss."""
    model = tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=4)
    before = model.network.params().copy()
    x, t = _buffers.put(rng.random((64, 2), dtype=np.float32)), _buffers.put(rng.random((64, 3), dtype=np.float32))
    ids = {np.float32: _buffers.put(np.zeros(64, np.float32)), "short": _buffers.put(np.zeros(63, np.int32), ti.i32),
           "negative": _buffers.put(np.full(64, -1, np.int32), ti.i32),
           "large": _buffers.put(np.full(64, 4, np.int32), ti.i32)}[bad]
    if error is TypeError or bad == "short":              # the kind, dtype and shape: before any kernel runs
        with pytest.raises(error, match="instance"):
            model.trainer.training_step(x, t, ids)
    else:                                                  # the values: on the device, raised when the loss is read
        loss = model.trainer.training_step(x, t, ids)
        with pytest.raises(error, match="instance ids must lie in"):
            float(loss)
    np.testing.assert_array_equal(model.network.params(), before)


def test_a_second_order_on_the_device_stays_there(rng, monkeypatch, device_path):
    """On the device path backward_backward_input of an MLP (curved layers: both adjoints) on ti.ndarray
    batches calls no host BLAS, reads nothing batch-sized back and hands no batch-sized numpy array to a
    kernel; its results are ti.ndarrays."""
    B = 1 << 15
    net = tinn.create_network(2, 3, {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 3,
                                     "activation": "Softplus", "output_activation": "Sigmoid"})
    x, v = _buffers.put(rng.random((B, 2), dtype=np.float32)), _buffers.put(rng.normal(size=(B, 2)).astype(np.float32))
    dy = _buffers.put(rng.normal(size=(B, 3)).astype(np.float32))
    _, ctx = net.forward(x)
    net.backward_backward_input(ctx, v, dy)                      # compiles outside the instrumented call
    seam = _Seam(monkeypatch, B)
    _, ctx = net.forward(x)
    d_dy, d_x = net.backward_backward_input(ctx, v, dy)
    assert seam.products == [] and seam.downloads == [] and seam.host_arguments == []
    assert isinstance(d_dy, ti.Ndarray) and isinstance(d_x, ti.Ndarray)
    assert d_dy.shape == (B, 3) and d_x.shape == (B, 2)


@pytest.mark.parametrize("config", sample(["config_hash", "config"], 1))
def test_a_training_step_on_the_device_stays_there(rng, monkeypatch, device_path, config):
    """On the device path a step of a ti.ndarray batch calls no host BLAS, reads nothing batch-sized
    back and hands no numpy array to tinn's kernels (Adam, and SGD); only the loss comes back."""
    model = tinn.create_from_config(2, 3, small_config_hash()) if config == "config_hash" else \
        tinn.create_from_config(2, 3, {"encoding": {"otype": "HashGrid", "n_levels": 4},
                                       "network": {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 3},
                                       "loss": {"otype": "L2"}, "optimizer": {"otype": "SGD", "learning_rate": 0.1}})
    assert_steps_stay_on_the_device(model, 2, rng, monkeypatch)


STEP_ENCODINGS = {
    "Frequency": (2, {"otype": "Frequency", "n_frequencies": 4}),
    "OneBlob": (2, {"otype": "OneBlob", "n_bins": 16}),
    "Composite": (4, {"otype": "Composite", "nested": [
        {"otype": "HashGrid", "n_levels": 4, "n_dims_to_encode": 2},
        {"otype": "OneBlob", "n_bins": 8, "n_dims_to_encode": 1},
        {"otype": "Frequency", "n_frequencies": 4}]}),
}


@pytest.mark.parametrize("name", sample(STEP_ENCODINGS, keep=["Composite"]))     # nests the other two
def test_a_training_step_with_any_encoding_stays_on_the_device(rng, monkeypatch, device_path, name):
    """As above, for models whose encoding is not a grid alone: per-dim encodings and a Composite (its
    slices, concatenation and nested grid) keep the batch on the device too."""
    n_in, encoding = STEP_ENCODINGS[name]
    model = tinn.create_from_config(n_in, 3, {"encoding": encoding, "loss": {"otype": "L2"},
                                              "network": {"otype": "CutlassMLP", "n_neurons": 32,
                                                          "n_hidden_layers": 2}})
    assert_steps_stay_on_the_device(model, n_in, rng, monkeypatch)


GRID = SMALL_GRID

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


# The next test takes the other encodings; a grid's device batch: config_hash's step above.
@pytest.mark.parametrize("name", sample(ENCODINGS, keep=["Frequency", "TriangleWave", "Empty", "Sum", "Product"]))
def test_an_encoding_keeps_a_device_batch_on_the_device(monkeypatch, device_path, name):
    """Forward, inference, backward and second order of a ti.ndarray batch answer in ti.ndarrays, read
    nothing batch-sized back and hand no batch-sized numpy array to a kernel."""
    B = 1 << 12                                               # more than any of these has parameters
    enc, batch = encoding_and_batch(name, B)
    x, dy, v = (_buffers.put(a) for a in batch)
    encoding_passes(enc, x, dy, v)                            # compiles outside the instrumented passes
    seam = _Seam(monkeypatch, B)
    out = encoding_passes(enc, x, dy, v)
    assert seam.downloads == [] and seam.host_arguments == []
    for p in PASSES:
        if "params" not in p:
            assert isinstance(out[p], Ndarray), p


@blas_exists
@pytest.mark.parametrize("name", sample(ENCODINGS, keep=["Identity", "OneBlob", "Concatenation", "NRC"]))
def test_an_encoding_on_the_device_path_equals_the_host_path(name):
    """Every pass of a ti.ndarray batch on the device path (FORCE) against the same numpy batch on the
    host path: outputs, input and parameter gradients, and second order."""
    enc, batch = encoding_and_batch(name, 333)
    with on_path(False):
        host = encoding_passes(enc, *batch)
    with on_path(True):
        device = encoding_passes(enc, *(_buffers.put(a) for a in batch))
    for p in PASSES:
        h, d = host[p], _kind.host(device[p])
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

    pool = _buffers.Pool()
    first_owner, second_owner = Owner(), Owner()
    a = pool.take((3, 4), first_owner)
    b = pool.take((3, 4), second_owner)            # the first owner is alive: a new buffer
    assert a is not b
    del first_owner
    c = pool.take((3, 4), Owner())
    assert c is a and pool.take((2, 4), Owner()).shape == (2, 4)
