"""Network arrays: K networks in one object, each sample routed to its own (DESIGN "Network arrays")."""
import numpy as np
import pytest

import tinn

CONFIG = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "l2_reg": 0.0},
          "encoding": {"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 7, "base_resolution": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2}}
K = 4


@pytest.fixture
def data(rng):
    return rng.random((K, 32, 2), dtype=np.float32), rng.random((K, 32, 3), dtype=np.float32)


def singles_like(array_model):
    """K single-network models starting from the array's instance parameters."""
    models = [tinn.create_from_config(2, 3, CONFIG) for _ in range(K)]
    for k, m in enumerate(models):
        m.network.set_params(array_model.network.params()[k])
    return models


def test_shapes_of_parameters_and_outputs(data):
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    n = model.network.n_params
    assert model.network.params().shape == (K, n)
    assert model.network.gradients().shape == (K, n)
    x, _ = data
    assert model.network.inference(x).shape == (K, 32, 3)                          # dense batch
    ids = np.repeat(np.arange(K, dtype=np.int32), 32)
    assert model.network.inference(x.reshape(-1, 2), ids).shape == (K * 32, 3)      # routed batch


def test_instances_start_different_and_set_params_per_instance(data):
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    p = model.network.params()
    assert not np.array_equal(p[0], p[1])
    p[2] = 0.5
    model.network.set_params(p)
    np.testing.assert_array_equal(model.network.params()[2], np.full(p.shape[1], 0.5, np.float32))


def test_joint_training_equals_training_each_alone(data):
    """Adam, l2_reg 0, equal counts: the array ends where K separately trained networks end."""
    x, y = data
    array = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    singles = singles_like(array)
    for _ in range(4):
        array.trainer.training_step(x, y)
        for k, m in enumerate(singles):
            m.trainer.training_step(x[k], y[k])
    for k, m in enumerate(singles):
        np.testing.assert_allclose(array.network.params()[k], m.network.params(), rtol=1e-5, atol=1e-6)


def test_outputs_and_gradients_equal_single_networks(data, rng):
    x, _ = data
    array = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    singles = singles_like(array)
    dy = rng.normal(size=(K, 32, 3)).astype(np.float32)
    out, ctx = array.network.forward(x)
    dx = array.network.backward(ctx, dy)
    for k, m in enumerate(singles):
        o, c = m.network.forward(x[k])
        np.testing.assert_allclose(out[k], o, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx[k], m.network.backward(c, dy[k]), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(array.network.gradients()[k], m.network.gradients(), rtol=1e-4, atol=1e-6)


def test_networks_without_samples_are_left_exactly_as_they_were(data):
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    model.trainer.training_step(x, y)                                   # give every network Adam state
    before = model.network.params().copy()
    ids = np.repeat(np.array([0, 2], np.int32), 32)
    xs = np.concatenate([x[0], x[2]])
    ys = np.concatenate([y[0], y[2]])
    for _ in range(3):
        model.trainer.training_step(xs, ys, instance=ids)
        grads = model.network.gradients()
        assert not grads[[1, 3]].any() and grads[[0, 2]].any()      # idle networks: zero gradients
    after = model.network.params()
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[3], before[3])
    assert not np.array_equal(after[0], before[0]) and not np.array_equal(after[2], before[2])


def test_unbalanced_shuffled_routing_equals_sorted_routing(rng):
    counts = [5, 0, 40, 11]
    ids = np.repeat(np.arange(K, dtype=np.int32), counts)
    x = rng.random((len(ids), 2), dtype=np.float32)
    y = rng.random((len(ids), 3), dtype=np.float32)
    perm = rng.permutation(len(ids))
    a = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    b = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    for _ in range(3):
        loss_a = a.trainer.training_step(x, y, instance=ids)
        loss_b = b.trainer.training_step(x[perm], y[perm], instance=ids[perm])
        assert loss_a == pytest.approx(loss_b, rel=1e-5)
    np.testing.assert_allclose(a.network.params(), b.network.params(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.network.inference(x[perm], ids[perm]), a.network.inference(x, ids)[perm],
                               rtol=1e-6, atol=1e-7)


def test_skewed_routing_is_cut_into_row_blocks_and_matches_single_networks(rng):
    """One network with far more samples than the others: the grouped stack stays a small multiple of
    the batch (its samples are cut into several row blocks), and outputs, input gradients and summed
    weight gradients still equal those of each network alone."""
    from tinn.batch.routing import Routing
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2}
    n = 300
    counts = np.full(n, 3)
    counts[[7, 123]] = [20_000, 0]
    ids = np.repeat(np.arange(n, dtype=np.int32), counts)
    rng.shuffle(ids)
    groups = Routing(len(ids), n, ids).groups
    assert groups.row_group is not None and groups.n_rows * groups.size <= 3 * len(ids)
    net = tinn.create_network(4, 3, cfg, n_instances=n)
    x = rng.uniform(-1, 1, (len(ids), 4)).astype(np.float32)
    dy = rng.normal(size=(len(ids), 3)).astype(np.float32)
    y, ctx = net.forward(x, ids)
    dx = net.backward(ctx, dy)
    params, grads = net.params(), net.gradients()
    np.testing.assert_array_equal(grads[123], 0)                     # no samples: zero gradient
    for k in (7, 0, n - 1):
        single = tinn.create_network(4, 3, cfg)
        single.set_params(params[k])
        mine = ids == k
        y_k, ctx_k = single.forward(x[mine])
        np.testing.assert_allclose(y[mine], y_k, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx[mine], single.backward(ctx_k, dy[mine]), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(grads[k], single.gradients(), rtol=1e-4, atol=1e-5 * np.abs(grads[k]).max())


def test_per_network_losses(data, rng):
    """Per-network losses of a dense batch and of the same samples routed in shuffled order both equal
    the losses of the networks trained alone; the loss is their mean."""
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    routed = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    singles = singles_like(model)
    loss, per_network = model.trainer.training_step(x, y, per_instance=True)
    order = rng.permutation(x.shape[0] * x.shape[1])
    ids = np.repeat(np.arange(K, dtype=np.int32), x.shape[1])[order]
    loss_routed, per_routed = routed.trainer.training_step(x.reshape(-1, 2)[order], y.reshape(-1, 3)[order],
                                                           ids, per_instance=True)
    assert per_network.shape == (K,)
    expected = [m.trainer.training_step(x[k], y[k]) for k, m in enumerate(singles)]
    for losses, mean in ((per_network, loss), (per_routed, loss_routed)):
        np.testing.assert_allclose(losses, expected, rtol=1e-5)
        assert mean == pytest.approx(np.mean(expected), rel=1e-5)


def test_routing_errors(data):
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    flat = x.reshape(-1, 2)
    with pytest.raises(ValueError, match="instance="):
        model.network.inference(flat)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        model.network.inference(flat, np.full(len(flat), 4, np.int32))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        model.network.inference(flat, np.full(len(flat), -1, np.int32))
    with pytest.raises(TypeError, match="int32"):
        model.network.inference(flat, np.zeros(len(flat), np.float32))
    with pytest.raises(ValueError, match="shape"):
        model.network.inference(flat, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="dense batch"):
        model.network.inference(x[:3])
    with pytest.raises(ValueError, match="n_instances"):
        tinn.create_from_config(2, 3, CONFIG, n_instances=0)


@pytest.mark.parametrize("in_place", [True, False], ids=["weights-in-place", "weights-copied"])
def test_many_networks_cut_into_blocks(rng, monkeypatch, in_place):
    """Enough networks that the host path cuts them into several blocks, spread over the threads:
    every instance's outputs, input gradients and weight gradients against the NumPy reference, with the
    weights and gradients used in the store's memory and with them copied."""
    monkeypatch.setattr(tinn.params, "VIEW_MIN", 0 if in_place else 1 << 62)
    from reference import assert_close, mlp_backward_ref, mlp_forward_ref, mlp_shapes, mlp_unflatten, padded
    from tinn.networks._mlp_host import SAMPLES_PER_BLOCK as ROWS_PER_BLOCK
    S = 8
    n = 2 * ROWS_PER_BLOCK // S + 3
    net = tinn.create_network(4, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1},
                              n_instances=n)
    x = rng.uniform(-1, 1, (n, S, 4)).astype(np.float32)
    dy = rng.normal(size=(n, S, 3)).astype(np.float32)
    y, ctx = net.forward(x)
    dx = net.backward(ctx, dy)
    params, grads, shapes = net.params(), net.gradients(), mlp_shapes(4, 16, 1, 3)
    for k in range(n):
        Ws = mlp_unflatten(params[k], shapes)
        y_ref, zs, hs = mlp_forward_ref(x[k], Ws, "ReLU", "None")
        dWs, dx_ref = mlp_backward_ref(Ws, zs, hs, padded(dy[k], y_ref.shape[1], 0.0), "ReLU", "None")
        assert_close(y[k], y_ref[:, :3], rtol=1e-5, atol=1e-6)
        assert_close(dx[k], dx_ref, rtol=1e-4, atol_rel=1e-5)
        for g, dW in zip(mlp_unflatten(grads[k], shapes), dWs):
            assert_close(g, dW, rtol=1e-4, atol_rel=1e-5, atol=1e-7)


@pytest.mark.x64_only("parameter views are host memory, which only the x64 backend has")
def test_parameter_views_share_the_store_memory(rng, monkeypatch):
    """The in-place views the host path uses are the fields themselves: reads see kernel writes and
    writes reach the fields (parameters and gradients, any run of instances, any offset)."""
    from tinn.params import ParamStore
    store = ParamStore(5, 7)
    o = store.offset
    rows = np.arange(5, dtype=np.int32)
    values = rng.normal(size=(5, 7)).astype(np.float32)
    store.write(store.params, o, values)
    assert store.rows_view(store.params, o + 2, 4, rows) is None      # a small block is copied instead
    monkeypatch.setattr(tinn.params, "VIEW_MIN", 0)
    np.testing.assert_array_equal(store.rows_view(store.params, o + 2, 4, rows), values[:, 2:6])
    np.testing.assert_array_equal(store.rows_view(store.params, o, 7, rows[1:4]), values[1:4])   # a run
    assert store.rows_view(store.params, o, 7, rows[[0, 2]]) is None   # not a run of instances: copied
    store.rows_view(store.grads, o + 1, 3, rows)[:] = 2.5
    expected = np.zeros((5, 7), np.float32)
    expected[:, 1:4] = 2.5
    np.testing.assert_array_equal(store.read(store.grads, o, 7), expected)
    np.testing.assert_array_equal(store.read(store.params, o, 7), values)


def test_optimizer_step_updates_exactly_the_networks_it_is_given(data):
    """``optimizer_step(active=ids)`` steps those networks only, whatever the last backward reached;
    ``active=None`` steps all of them (it never re-uses the routing of an earlier batch)."""
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    ids = np.repeat(np.arange(K, dtype=np.int32), 32)
    model.trainer.backward(model.trainer.forward(x.reshape(-1, 2), y.reshape(-1, 3), ids))
    before = model.network.params()
    model.trainer.optimizer_step(active=[1, 3])
    after = model.network.params()
    for k in range(K):
        assert np.array_equal(after[k], before[k]) == (k in (0, 2)), k
    np.testing.assert_array_equal(model.optimizer.step_counts(), [0, 1, 0, 1])

    two = ids[ids < 2]                                       # a batch reaching networks 0 and 1 only
    model.trainer.backward(model.trainer.forward(x[:2].reshape(-1, 2), y[:2].reshape(-1, 3), two))
    model.trainer.optimizer_step()
    np.testing.assert_array_equal(model.optimizer.step_counts(), [1, 2, 1, 2])
    with pytest.raises(ValueError, match="active"):
        model.trainer.optimizer_step(active=[K])


def test_training_step_steps_only_the_networks_that_got_samples(data):
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    before = model.network.params()
    ids = np.repeat(np.array([0, 2], np.int32), 32)
    model.trainer.training_step(x[[0, 2]].reshape(-1, 2), y[[0, 2]].reshape(-1, 3), ids)
    after = model.network.params()
    for k in range(K):
        assert np.array_equal(after[k], before[k]) == (k in (1, 3)), k
    np.testing.assert_array_equal(model.optimizer.step_counts(), [1, 0, 1, 0])


def test_a_routed_step_counts_the_samples_per_network_once(data, monkeypatch):
    """The routing of a batch is described once and carried in the context: one ``bincount`` of the
    instance ids per training step on the host path (forward grouping, loss normalisation, backward,
    optimizer); none on the device path, where the step's census counts the samples on the device."""
    x, y = data
    model = tinn.create_from_config(2, 3, CONFIG, n_instances=K)
    ids = np.random.default_rng(3).permutation(np.repeat(np.arange(K, dtype=np.int32), 32))
    calls = []
    real = np.bincount

    def counting(a, weights=None, minlength=0):
        if weights is None:                  # a count (the loss also sums its row losses per network)
            calls.append(len(a))
        return real(a, weights, minlength)
    monkeypatch.setattr(np, "bincount", counting)
    model.trainer.training_step(x.reshape(-1, 2), y.reshape(-1, 3), ids)
    assert calls == ([] if tinn.runtime.program.active() else [len(ids)])
