"""The MLP's plan (``MLP.plan``): the layout of §2.2 written once and read by every backend, and what it
buys on the device path: models of one config share the compiled kernels (the fused ones included),
an overwrite pass zeroes its gradients without a launch of its own, and a training step's MLP launches
are held (a test fails if they grow).
"""
from collections import Counter

import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.batch import buffers as _buffers
from tinn.runtime import kernels as _kernels
from tinn.runtime.probe import counting
from tinn.networks import _kernel_mlp
from compiles import compilations
from reference import assert_close, mlp_backward_ref, mlp_forward_ref, mlp_shapes, mlp_unflatten, padded, random_weights
from test_device_path import use_mlp_kernels

MLP_KERNELS = {name for name, f in vars(_kernel_mlp).items() if hasattr(f, "_primal")}
"""The per-layer kernels of the device path."""


def mlp(n_in, n_out, width, depth, act="ReLU", out_act="None", n_instances=1):
    return tinn.create_network(n_in, n_out, {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": depth,
                                             "activation": act, "output_activation": out_act},
                               n_instances=n_instances)


@pytest.mark.parametrize("n_in, n_out, width, depth", [(5, 3, 16, 1), (16, 1, 16, 0), (7, 20, 8, 3), (3, 16, 24, 2)])
def test_plan_is_the_spec_layout(n_in, n_out, width, depth):
    """Rows computed (the output matrix: only n_output_dims), columns, starts, activations, width and
    n_params against §2.2's shapes."""
    net = mlp(n_in, n_out, width, depth, "Tanh", "Sigmoid")
    shapes = mlp_shapes(n_in, width, depth, n_out)
    plan = net.plan
    starts = np.cumsum([0] + [r * c for r, c in shapes])
    assert net.layer_sizes() == shapes
    assert plan.n_params == net.n_params == starts[-1]
    assert [layer.start for layer in plan.layers] == list(starts[:-1])
    assert [layer.cols for layer in plan.layers] == [c for _, c in shapes]
    assert [layer.rows for layer in plan.layers] == [r for r, _ in shapes[:-1]] + [n_out]
    assert [layer.activation for layer in plan.layers] == ["Tanh"] * depth + ["Sigmoid"]
    assert plan.width == max([n_in, n_out] + [width] * (depth > 0))
    assert plan.padding_start == starts[-2] + n_out * shapes[-1][1]


def test_models_of_one_config_have_one_plan():
    a, b = mlp(5, 3, 16, 2), mlp(5, 3, 16, 2)
    assert a.plan == b.plan and hash(a.plan) == hash(b.plan)
    assert mlp(5, 3, 16, 2, out_act="Sigmoid").plan != a.plan
    assert mlp(5, 4, 16, 2).plan != a.plan                     # same stored sizes, one more row computed


@pytest.mark.parametrize("mlp_kernels", ["kernels", "fused"])
def test_a_second_model_of_one_config_compiles_nothing(rng, monkeypatch, device_path, mlp_kernels):
    """Forward and backward of a second model of one config build no kernels (``_kernels.COMPILED``) and
    compile none (the fused kernels are those of the first model: one per plan and tile size)."""
    use_mlp_kernels(monkeypatch, mlp_kernels)
    B, config = 3 * 32 + 5, (6, 3, 24, 2, "SiLU", "Sigmoid")
    x, dy = rng.normal(size=(B, 6)).astype(np.float32), rng.normal(size=(B, 3)).astype(np.float32)

    def step(net):
        _, ctx = net.forward(x)
        net.backward(ctx, dy)
        return getattr(ctx, "fused", None)

    first = step(mlp(*config))
    built = _kernels.COMPILED["count"]
    second_model = mlp(*config)
    with compilations() as compiled:
        second = step(second_model)
    assert compiled == [] and _kernels.COMPILED["count"] == built
    assert second is first and (first is not None) == (mlp_kernels == "fused")


@pytest.mark.parametrize("mlp_kernels, n_instances", [("kernels", 1), ("kernels", 3), ("fused", 1), ("fused", 3)])
def test_overwrite_zeroes_and_accumulate_adds(rng, monkeypatch, device_path, mlp_kernels, n_instances):
    """Gradients of ``mode="overwrite"`` are the reference whatever the store held (the zeroing is the first
    kernel's), ``"accumulate"`` adds to them; the padding rows of the output matrix stay 0. Shapes off the
    fused kernels' 4 x 4 register tiles (7 inputs, 13 neurons, 3 outputs)."""
    use_mlp_kernels(monkeypatch, mlp_kernels)
    n_in, n_out, width, depth, act, out_act, B = 7, 3, 13, 2, "Tanh", "None", 2 * 32 + 9
    net = mlp(n_in, n_out, width, depth, act, out_act, n_instances)
    shapes = mlp_shapes(n_in, width, depth, n_out)
    params = np.stack([random_weights(shapes, rng) for _ in range(n_instances)])
    net.set_params(params if n_instances > 1 else params[0])
    x, dy = rng.normal(size=(B, n_in)).astype(np.float32), rng.normal(size=(B, n_out)).astype(np.float32)
    ids = rng.integers(0, n_instances, B).astype(np.int32)
    instance = ids if n_instances > 1 else None
    expected = []
    for k in range(n_instances):
        Ws = mlp_unflatten(params[k], shapes)
        y, zs, hs = mlp_forward_ref(x[ids == k], Ws, act, out_act)
        dWs, _ = mlp_backward_ref(Ws, zs, hs, padded(dy[ids == k], y.shape[1], 0.0), act, out_act)
        expected.append(np.concatenate([dW.ravel() for dW in dWs]))
    expected = np.stack(expected)
    _, ctx = net.forward(x, instance)
    for mode, times in [("overwrite", 1), ("accumulate", 2), ("overwrite", 1)]:
        net.backward(ctx, dy, mode=mode)
        grads = net.gradients().reshape(n_instances, -1)
        assert_close(grads, times * expected, rtol=1e-4, atol_rel=1e-5, atol=1e-7)
        assert not grads[:, net.plan.padding_start:].any()
    assert (getattr(ctx, "fused", None) is not None) == (mlp_kernels == "fused")


def step_launches(model, x, target, instance, monkeypatch) -> Counter:
    """The MLP's kernel launches of one training step (after a first step has built everything): its
    per-layer kernels, and ``"fill"`` for each column fill of its parameters' gradients."""
    net = model.network
    while not hasattr(net, "_batch_path"):
        net = net.network
    fills, fill = [], _kernels._fill_columns

    def recording_fill(dst, offset, *args):
        fills.append(offset)
        return fill(dst, offset, *args)

    monkeypatch.setattr(_kernels, "_fill_columns", recording_fill)
    model.trainer.training_step(x, target, instance)
    fills.clear()
    with counting() as seen:
        model.trainer.training_step(x, target, instance)
    launches = Counter({name: n for name, n in seen.kernels.items() if name in MLP_KERNELS})
    launches["fill"] = fills.count(net._offset)
    return +launches                                    # without the zero counts


@pytest.mark.parametrize("out_act, n_instances", [("None", 1), ("Sigmoid", 1), ("None", 4)])
def test_a_training_step_launches_each_layers_products_only(rng, monkeypatch, device_path, out_act, n_instances):
    """A training step of a grid + MLP (config_hash's shape, batch 256) on the device path: per layer one
    forward, one weight-gradient and one input-gradient launch (the grid needs dL/dx), one derivative
    launch for an output activation other than None, and no gradient fill. Fails if the MLP's launches grow.
    (The per-layer kernels on every arch; the fused kernels' launches: ``test_fused_arrays.py``.)"""
    use_mlp_kernels(monkeypatch, "kernels")
    depth, B = 2, 256
    config = {"loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
              "encoding": {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12},
              "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": depth,
                          "output_activation": out_act}}
    model = tinn.create_from_config(2, 3, config, n_instances=n_instances)
    x = _buffers.put(rng.random((B, 2), dtype=np.float32))
    target = _buffers.put(rng.random((B, 3), dtype=np.float32))
    instance = _buffers.put(rng.integers(0, n_instances, B).astype(np.int32), ti.i32) if n_instances > 1 else None
    layers = depth + 1
    expected = Counter({"_layer_forward": layers, "_weight_grad": layers, "_input_grad": layers})
    if out_act != "None":
        expected["_times_derivative"] = 1
    assert step_launches(model, x, target, instance, monkeypatch) == expected


def test_second_order_launches_no_gradient_fill(rng, device_path):
    """An overwrite second-order call of an MLP zeroes its gradients in its first weight-gradient kernel."""
    net = mlp(4, 3, 8, 2, "Tanh", "Sigmoid")
    x, dy, v = (rng.normal(size=(70, n)).astype(np.float32) for n in (4, 3, 4))
    _, ctx = net.forward(x)
    with counting() as seen:
        net.backward_backward_input(ctx, v, dy)
    assert seen.kernels["_weight_grad"] > 0 and "_fill_columns" not in seen.kernels
