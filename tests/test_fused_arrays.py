"""Network arrays through the fused MLP kernels (``_fused_mlp``, forced onto this arch by ``use_mlp_kernels``;
x64 has no shared memory and skips): a block owns whole networks (a dense batch's network k is block k, a routed
batch's networks are runs of its samples sorted by network) and writes their gradients without atomics.

Checked against float64 NumPy per network (outputs, dL/dx, dL/dW), against the per-layer kernels over
training steps (routed with uneven counts and networks without samples, and dense), and by the launches of
an array's step (the fused kernels, no per-layer kernel).
"""
import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.batch import buffers as _buffers
from tinn.batch.census import TILE
from tinn.runtime.probe import counting
from tinn.networks import _fused_mlp, _kernel_mlp
from reference import assert_close, mlp_backward_ref, mlp_forward_ref, mlp_shapes, mlp_unflatten, padded, random_weights
from test_device_path import use_mlp_kernels

K = 5


def ids_of(routing: str, B: int, rng) -> np.ndarray:
    """``shuffled``: every network, in any order; ``skewed``: network 2 holds most samples (several routing
    tiles and a part-tile), networks 3 and 4 none, network 1 a handful."""
    if routing == "shuffled":
        return rng.integers(0, K, B).astype(np.int32)
    ids = np.where(rng.random(B) < 0.85, 2, 0)
    ids[rng.choice(B, 5, replace=False)] = 1
    return ids.astype(np.int32)


def host(a) -> np.ndarray:
    return a.to_numpy() if isinstance(a, ti.Ndarray) else np.asarray(a)


@pytest.mark.parametrize("routing", ["shuffled", "skewed", "dense"])
@pytest.mark.parametrize("n_in, n_out, width, depth, act, out_act", [(7, 3, 13, 2, "Tanh", "None"),
                                                                     (5, 2, 64, 1, "ReLU", "Sigmoid")])
def test_fused_array_equals_the_reference(rng, monkeypatch, device_path, routing, n_in, n_out, width, depth, act,
                                          out_act):
    """Outputs, dL/dx and every network's dL/dW of an array's pass through the fused kernels against float64
    NumPy run on each network's own samples; a network without samples gets zero gradients (overwrite)."""
    use_mlp_kernels(monkeypatch, "fused")
    net = tinn.create_network(n_in, n_out, {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth,
                                            "activation": act, "output_activation": out_act}, n_instances=K)
    shapes = mlp_shapes(n_in, width, depth, n_out)
    params = np.stack([random_weights(shapes, rng) for _ in range(K)])
    net.set_params(params)
    net.backward(net.forward(rng.normal(size=(9, n_in)).astype(np.float32), np.arange(9, dtype=np.int32) % K)[1],
                 np.ones((9, n_out), np.float32))          # gradients in every row, which the overwrite must replace
    B = 3 * TILE + 41
    if routing == "dense":
        S = B // K
        x, dy = (rng.normal(size=(K, S, n)).astype(np.float32) for n in (n_in, n_out))
        ids, instance, flat = np.repeat(np.arange(K), S), None, lambda a: a.reshape(K * S, -1)
    else:
        x, dy = (rng.normal(size=(B, n)).astype(np.float32) for n in (n_in, n_out))
        ids = instance = ids_of(routing, B, rng)
        flat = lambda a: a                                  # noqa: E731
    y, ctx = net.forward(x, instance)
    assert isinstance(ctx.fused, _fused_mlp.FusedKernels)
    dx = net.backward(ctx, dy, input_gradient=True)
    check_array(flat(x), flat(host(y)), flat(dy), flat(host(dx)), net, params, ids, (act, out_act))


def check_array(x, y, dy, dx, net, params, ids, acts):
    """Each network's outputs, dL/dx and dL/dW (``net``'s gradients) against float64 NumPy on its own samples."""
    n_out, shapes, grads = y.shape[1], net.layer_sizes(), net.gradients().reshape(K, -1)
    for k in range(K):
        rows = ids == k
        Ws = mlp_unflatten(params[k], shapes)
        y_ref, zs, hs = mlp_forward_ref(x[rows], Ws, *acts)
        dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dy[rows], y_ref.shape[1], 0.0), *acts)
        assert_close(y[rows], y_ref[:, :n_out], rtol=1e-4, atol_rel=1e-5, atol=1e-6)
        assert_close(dx[rows], dx_ref, rtol=1e-4, atol_rel=1e-5, atol=1e-6)
        assert_close(grads[k], np.concatenate([dW.ravel() for dW in dWs]), rtol=1e-4, atol_rel=1e-5, atol=1e-7)
    assert not grads[:, net.plan.padding_start:].any()


ARRAY_CONFIG = {"encoding": {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 12},
                "network": {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2},
                "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}


@pytest.mark.parametrize("routing", ["skewed", "dense"])
def test_fused_array_training_equals_the_per_layer_kernels(rng, monkeypatch, device_path, routing):
    """Three training steps of a grid + MLP array on device batches (a trainer's step: the census's runs), one model
    on the fused kernels and one on the per-layer kernels: losses and parameters agree."""
    models = [tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K, seed=3) for _ in range(2)]
    B = 4 * TILE + 77
    for _ in range(3):
        if routing == "dense":
            x, t, ids = rng.random((K, B // K, 2), np.float32), rng.random((K, B // K, 3), np.float32), None
        else:
            x, t = rng.random((B, 2), np.float32), rng.random((B, 3), np.float32)
            ids = _buffers.put(ids_of(routing, B, rng), ti.i32)
        losses = []
        for model, kernels in zip(models, ["fused", "kernels"]):
            use_mlp_kernels(monkeypatch, kernels)
            losses.append(float(model.trainer.training_step(_buffers.put(x), _buffers.put(t), ids)))
        assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert_close(models[0].network.params(), models[1].network.params(), rtol=1e-3, atol_rel=1e-4, atol=1e-6)


def test_an_array_step_launches_the_fused_kernels(rng, monkeypatch, device_path):
    """A routed array's training step launches the fused forward and backward once each, no per-layer kernel."""
    use_mlp_kernels(monkeypatch, "fused")
    model = tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=K)
    B = 2 * TILE + 5
    x, t = _buffers.put(rng.random((B, 2), np.float32)), _buffers.put(rng.random((B, 3), np.float32))
    ids = _buffers.put(ids_of("skewed", B, rng), ti.i32)
    model.trainer.training_step(x, t, ids)
    with counting() as seen:
        model.trainer.training_step(x, t, ids)
    per_layer = {name for name, f in vars(_kernel_mlp).items() if hasattr(f, "_primal")}
    assert seen.kernels["forward"] >= 1 and seen.kernels["backward"] >= 1      # the grid's kernels share the names
    assert not per_layer & set(seen.kernels)


def test_second_order_after_a_fused_array_pass(rng, monkeypatch, device_path):
    """An array's second order after a fused pass (recomputed by the per-layer kernels) equals the one after a
    per-layer pass: dL2/d(dL_dy), dL2/dx and the parameter gradients."""
    net = tinn.create_network(4, 3, {"otype": "FullyFusedMLP", "n_neurons": 8, "n_hidden_layers": 2,
                                     "activation": "Tanh", "output_activation": "Sigmoid"}, n_instances=K)
    B = TILE + 37
    x, v = (rng.uniform(-1, 1, (B, 4)).astype(np.float32) for _ in range(2))
    dy, ids = rng.normal(size=(B, 3)).astype(np.float32), ids_of("skewed", B, rng)
    results = []
    for kernels in ("fused", "kernels"):
        use_mlp_kernels(monkeypatch, kernels)
        _, ctx = net.forward(x, ids)
        assert (getattr(ctx, "fused", None) is not None) == (kernels == "fused")
        d_dy, d_x = net.backward_backward_input(ctx, v, dy)
        results.append([host(d_dy), host(d_x), net.gradients().copy()])
    for fused, kernels in zip(*results):
        assert_close(fused, kernels, rtol=1e-5, atol_rel=1e-6, atol=1e-7)


@pytest.mark.parametrize("routing", ["skewed", "dense"])
def test_fused_array_inference_into_a_buffer(rng, monkeypatch, device_path, routing):
    """An array's inference through the fused kernels (no activations kept), written into the caller's
    ``ti.ndarray``, equals the per-layer kernels' inference."""
    net = tinn.create_network(6, 4, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2,
                                     "activation": "SiLU"}, n_instances=K)
    B = 2 * TILE + 19
    if routing == "dense":
        x, instance = _buffers.put(rng.normal(size=(K, B // K, 6)).astype(np.float32)), None
    else:
        x, instance = _buffers.put(rng.normal(size=(B, 6)).astype(np.float32)), ids_of(routing, B, rng)
    use_mlp_kernels(monkeypatch, "kernels")
    expected = host(net.inference(x, instance))
    use_mlp_kernels(monkeypatch, "fused")
    out = _buffers.buffer(expected.shape)
    with counting() as seen:
        y = net.inference(x, instance, out=out)
    assert y is out and seen.kernels["forward"] == 1
    assert_close(host(out), expected, rtol=1e-5, atol_rel=1e-6, atol=1e-7)
