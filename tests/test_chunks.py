"""Large batches run in chunks (bounded memory) with the results of one big batch."""
import numpy as np
import pytest

import tinn

CONFIG = {"loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
          "encoding": {"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 7, "base_resolution": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}
K = 5


def twins(**kwargs):
    return tinn.create_from_config(2, 3, CONFIG, **kwargs), tinn.create_from_config(2, 3, CONFIG, **kwargs)


def train_both(monkeypatch, big, chunked, batches):
    """Train ``big`` in one pass per batch and ``chunked`` in chunks of 37 samples; compare as we go."""
    for args, kwargs in batches:
        with monkeypatch.context() as m:
            m.setattr(tinn.object, "TRAINING_MEMORY", 1 << 40)
            loss, losses = big.trainer.training_step(*args, per_instance=True, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(tinn.object, "TRAINING_MEMORY", 0)
            m.setattr(tinn.object, "MIN_CHUNK", 37)
            loss_c, losses_c = chunked.trainer.training_step(*args, per_instance=True, **kwargs)
        assert loss_c == pytest.approx(loss, rel=1e-5)
        np.testing.assert_allclose(losses_c, losses, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(chunked.network.gradients(), big.network.gradients(), rtol=2e-4, atol=1e-7)
        np.testing.assert_allclose(chunked.network.params(), big.network.params(), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(chunked.optimizer.step_counts(), big.optimizer.step_counts())


def test_a_chunked_step_equals_one_big_step(rng, monkeypatch):
    big, chunked = twins()
    x, y = rng.random((300, 2), dtype=np.float32), rng.random((300, 3), dtype=np.float32)
    pdf = rng.uniform(0.5, 2.0, (300, 3)).astype(np.float32)
    train_both(monkeypatch, big, chunked, [((x, y), {}), ((x, y), {"pdf": pdf}), ((x[:50], y[:50]), {})])


@pytest.fixture(params=["copies", "in place"])
def weight_access(request, monkeypatch):
    """The host MLP reads weights and writes gradients through copies, or in the store's own memory
    (``ParamStore.rows_view``: any run of consecutive networks, as a chunk of a dense batch is)."""
    if request.param == "in place":
        monkeypatch.setattr(tinn.params, "VIEW_MIN", 0)


def test_a_chunked_routed_step_equals_one_big_step(rng, monkeypatch, weight_access):
    """Uneven counts, a network first met in a later chunk and one never met: per-network normalisation
    by the whole batch, gradients of every chunk, and the idle network untouched."""
    big, chunked = twins(n_instances=K)
    ids = np.concatenate([np.zeros(40, np.int32), rng.permutation(np.repeat(np.array([1, 2, 4], np.int32),
                                                                             [90, 7, 63]))])
    x, y = rng.random((len(ids), 2), dtype=np.float32), rng.random((len(ids), 3), dtype=np.float32)
    before = big.network.params()[3]
    train_both(monkeypatch, big, chunked, [((x, y, ids), {}), ((x, y, ids), {})])
    np.testing.assert_array_equal(chunked.network.params()[3], before)
    np.testing.assert_array_equal(chunked.optimizer.step_counts(), [2, 2, 2, 0, 2])


def test_a_chunked_dense_step_equals_one_big_step(rng, monkeypatch, weight_access):
    big, chunked = twins(n_instances=K)
    x, y = rng.random((K, 30, 2), dtype=np.float32), rng.random((K, 30, 3), dtype=np.float32)
    train_both(monkeypatch, big, chunked, [((x, y), {}), ((x, y), {})])


def test_chunked_inference_equals_one_pass(rng, monkeypatch):
    single, _ = twins()
    array, _ = twins(n_instances=K)
    x = rng.random((K, 40, 2), dtype=np.float32)
    ids = rng.integers(0, K, 200).astype(np.int32)
    flat = x.reshape(-1, 2)
    expected = [single.network.inference(flat), array.network.inference(flat, ids), array.network.inference(x)]
    monkeypatch.setattr(tinn.object, "INFERENCE_MEMORY", 0)
    monkeypatch.setattr(tinn.object, "MIN_CHUNK", 37)
    got = [single.network.inference(flat), array.network.inference(flat, ids), array.network.inference(x)]
    for e, g in zip(expected, got):
        assert g.shape == e.shape and g.flags.c_contiguous
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
