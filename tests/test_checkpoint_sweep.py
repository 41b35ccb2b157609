"""Every optimizer x option combination through a checkpoint: ``save`` then ``load`` (into the trainer that saved
and into a fresh one) restores everything, and the next step after the load equals the next step without one;
``export_tcnn`` then ``load_tcnn`` where tcnn's format holds the state (the trained weights are the inference
weights: optimizers without averaged weights).

Options: precision float32 / float16, one network / an array of 3, loss L2 / RelativeL2. By default every optimizer
runs once, the options rotating; ``TINN_FULL=1`` runs every combination."""
import itertools

import numpy as np
import pytest

import tinn
from conftest import sample

BASE = {"encoding": {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
                     "base_resolution": 4},
        "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}
ADAM = {"otype": "Adam", "learning_rate": 1e-2}
SGD = {"otype": "SGD", "learning_rate": 1e-2}


def composite(nested):
    """A Composite whose first slice is the MLP's first layer, the second the rest of the parameters."""
    def config(layer_sizes, n_params):
        first = layer_sizes[0][0] * layer_sizes[0][1]
        return {"otype": "Composite", "nested": [{**nested[0], "n_params_to_optimize": first},
                                                 {**nested[1], "n_params_to_optimize": n_params - first}]}
    return config


OPTIMIZERS = {
    "Adam": ADAM, "SGD": SGD,
    "Novograd": {"otype": "Novograd", "learning_rate": 1e-2},
    "Shampoo": {"otype": "Shampoo", "learning_rate": 1e-2},
    "EMA": {"otype": "EMA", "decay": 0.9, "nested": ADAM},
    "Average": {"otype": "Average", "n_samples": 3, "nested": ADAM},
    "Batched": {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
    "ExponentialDecay": {"otype": "ExponentialDecay", "decay_base": 0.5, "decay_start": 1, "decay_interval": 1,
                         "nested": ADAM},
    "Lookahead": {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2, "nested": ADAM},
    "Composite(Adam, SGD)": composite([ADAM, SGD]),
    "Composite(EMA(SGD), ExponentialDecay(Adam))": composite([
        {"otype": "EMA", "decay": 0.9, "nested": SGD},
        {"otype": "ExponentialDecay", "decay_base": 0.5, "decay_start": 1, "decay_interval": 1, "nested": ADAM}]),
}
OPTIONS = list(itertools.product(("float32", "float16"), (1, 3), ("L2", "RelativeL2")))
ALL = [(name, *opts) for name in OPTIMIZERS for opts in OPTIONS]
IDS = ["-".join(map(str, c)) for c in ALL]
CASES = sample(ALL, keep=[i * len(OPTIONS) + i % len(OPTIONS) for i in range(len(OPTIMIZERS))])


def test_every_registered_optimizer_is_swept():
    swept = {"Composite" if callable(config) else config["otype"] for config in OPTIMIZERS.values()}
    assert {o.lower() for o in tinn.registry.optimizers.names()} == {o.lower() for o in swept}


def model(name, precision, K, loss, seed=3):
    optimizer = OPTIMIZERS[name]
    if callable(optimizer):
        probe = tinn.create_from_config(2, 1, {**BASE, "loss": {"otype": loss}, "optimizer": ADAM}, n_instances=K)
        optimizer = optimizer(probe.network.layer_sizes(), probe.network.n_params)
    return tinn.create_from_config(2, 1, {**BASE, "loss": {"otype": loss}, "optimizer": optimizer},
                                   n_instances=K, precision=precision, seed=seed)


def batch(K, seed):
    r = np.random.default_rng(seed)
    x, y = r.random((96, 2), dtype=np.float32), r.random((96, 1), dtype=np.float32) + 0.5
    return x, y, (None if K == 1 else (np.arange(96) % K).astype(np.int32))


def step(m, seed):
    x, y, instance = batch(m.network.n_instances, seed)
    m.trainer.training_step(x, y, instance)


def state(m):
    t = m.trainer
    out = {"params": t.params(), "masters": t.params_full_precision(), "inference": t.params_inference(),
           "scale": t.loss_scale, **{f"optimizer.{k}": v for k, v in t.optimizer.state_dict().items()}}
    return out


def assert_same(a, b, what):
    assert a.keys() == b.keys(), what
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}: {key}")


@pytest.mark.parametrize("name,precision,K,loss", CASES, ids=IDS)
def test_save_load_round_trip_and_next_step(name, precision, K, loss, tmp_path):
    path = tmp_path / "ckpt.npz"
    a = model(name, precision, K, loss)
    for i in range(3):
        step(a, i)
    a.trainer.save(path)
    saved = state(a)
    for target in (a, model(name, precision, K, loss, seed=11)):     # the trainer that saved, and a fresh one
        if target is a:
            step(a, 3)                                                # moved on: load must take it back
        target.trainer.load(path)
        assert_same(state(target), saved, f"{name} loaded")
    fresh = target
    step(a, 3)
    step(fresh, 3)
    assert_same(state(fresh), state(a), f"{name}: the step after a load")


@pytest.mark.parametrize("name,precision,K,loss", CASES, ids=IDS)
def test_export_tcnn_load_tcnn_round_trip(name, precision, K, loss, tmp_path):
    """Every network's inference weights come back as training and inference weights; where those were the
    trained weights (no averaged ones) and float32 (a float16 snapshot does not hold the float32 master weights), the
    next step equals the next step without the round trip."""
    a = model(name, precision, K, loss)
    for i in range(2):
        step(a, i)
    before = state(a)
    b = model(name, precision, K, loss, seed=11)
    for k in range(K):
        path = tmp_path / f"net{k}.json"
        a.trainer.export_tcnn(path, None if K == 1 else k)
        b.trainer.load_tcnn(path, None if K == 1 else k)
        a.trainer.load_tcnn(path, None if K == 1 else k)
    np.testing.assert_array_equal(b.trainer.params(), before["inference"])
    np.testing.assert_array_equal(b.trainer.params_inference(), before["inference"])
    if a.trainer.optimizer.inference_weights() is None and precision == "float32":
        assert_same(state(a), before, f"{name} after its own snapshot")
        c = model(name, precision, K, loss)
        for i in range(2):
            step(c, i)
        step(a, 2)
        step(c, 2)
        assert_same(state(a), state(c), f"{name}: the step after load_tcnn")
