"""Trainer checkpoints (save/load), tcnn snapshot interop and hyperparameter updates mid-training."""
import json
import os

import numpy as np
import pytest

import tinn

ADAM = {"otype": "Adam", "learning_rate": 1e-2}
WRAPPED = {"otype": "Ema", "decay": 0.9, "nested": {"otype": "ExponentialDecay", "decay_start": 2,
                                                    "decay_interval": 2, "decay_base": 0.5, "nested": ADAM}}
BASE = {"loss": {"otype": "L2"}, "encoding": {"otype": "Frequency", "n_frequencies": 2},
        "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


def model_with(optimizer, **kwargs):
    return tinn.create_from_config(2, 3, {**BASE, "optimizer": optimizer}, **kwargs)


def data(seed=0, n=64):
    rng = np.random.default_rng(seed)
    return rng.random((n, 2), dtype=np.float32), rng.random((n, 3), dtype=np.float32)


def train(model, steps, seed=0, instance=None):
    for i in range(steps):
        x, y = data(seed + i)
        model.trainer.training_step(x, y, instance)


def snapshot(model):
    t = model.trainer
    return {"params": model.network.params(), "inference": t.params_inference(),
            "optimizer": t.optimizer.hyperparams(), "loss": t.loss.hyperparams(),
            **{f"state.{k}": v for k, v in t.optimizer.state_dict().items()}}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("optimizer", [ADAM, WRAPPED], ids=["Adam", "Ema(ExponentialDecay(Adam))"])
def test_resumed_training_is_bit_identical(optimizer, tmp_path):
    path = tmp_path / "ckpt.npz"
    a = model_with(optimizer)
    train(a, 3)
    a.trainer.save(path)
    saved = snapshot(a)
    train(a, 3, seed=3)
    b = model_with(optimizer, seed=99)                       # other initial weights: load must replace them
    b.trainer.load(path)
    assert_same(snapshot(b), saved)
    train(b, 3, seed=3)
    assert_same(snapshot(b), snapshot(a))
    x, _ = data(10)
    np.testing.assert_array_equal(a.network.inference(x), b.network.inference(x))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A trained wrapper-optimizer model and its checkpoint."""
    model = model_with(WRAPPED)
    train(model, 2)
    path = tmp_path_factory.mktemp("ckpt") / "model.npz"
    model.trainer.save(path)
    return model, path


def damaged_files(path, tmp):
    raw = path.read_bytes()
    files = {"truncated": raw[: len(raw) // 2], "empty": b"", "garbage": os.urandom(2000)}
    flipped = bytearray(raw)
    flipped[len(raw) // 3] ^= 0xFF                           # inside an array's data: the zip CRC catches it
    files["corrupted"] = bytes(flipped)
    out = {}
    for name, content in files.items():
        out[name] = tmp / f"{name}.npz"
        out[name].write_bytes(content)
    with np.load(path) as npz:                               # a pickled (object) header must never be unpickled
        arrays = {k: npz[k] for k in npz.files}
    arrays["header"] = np.array([{"format": "tinn-checkpoint"}], dtype=object)
    out["pickled"] = tmp / "pickled.npz"
    np.savez(out["pickled"], **arrays)
    return out


def test_damaged_files_raise_and_leave_the_trainer_unchanged(saved, tmp_path):
    model, path = saved
    train(model, 1, seed=5)                                  # differs from the file now
    before = snapshot(model)
    for name, bad in damaged_files(path, tmp_path).items():
        with pytest.raises(ValueError):
            model.trainer.load(bad)
        assert_same(snapshot(model), before)
    with pytest.raises((ValueError, FileNotFoundError)):
        model.trainer.load(tmp_path / "missing.npz")


@pytest.mark.parametrize("other, match", [
    ({"network": {"otype": "FullyFusedMLP", "n_neurons": 8, "n_hidden_layers": 1}}, "n_params"),
    ({"network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh"}},
     "model config"),
    ({"optimizer": {"otype": "Lookahead", "nested": ADAM}}, "optimizer"),
    ({"optimizer": {"otype": "Ema", "decay": 0.9, "nested": ADAM}}, "optimizer"),
    ({"optimizer": {**WRAPPED, "nested": {**WRAPPED["nested"], "nested": {"otype": "Adam", "beta1": 0.5}}}},
     None),
    ({"loss": {"otype": "L1"}}, "loss"),
    ({"n_instances": 3}, "n_instances"),
], ids=["n_params", "activation", "optimizer", "optimizer-nesting", "hyperparams-only", "loss", "n_instances"])
def test_mismatched_checkpoints_raise_and_leave_the_trainer_unchanged(saved, other, match, tmp_path):
    model, _ = saved
    config = {**BASE, "optimizer": WRAPPED, **{k: v for k, v in other.items() if k != "n_instances"}}
    foreign = tinn.create_from_config(2, 3, config, n_instances=other.get("n_instances", 1))
    path = tmp_path / "foreign.npz"
    foreign.trainer.save(path)
    before = snapshot(model)
    if match is None:                  # same structure, other hyperparameter values: loaded from the file
        fresh = model_with(WRAPPED)
        fresh.trainer.load(path)
        assert_same(snapshot(fresh), snapshot(foreign))
        return
    with pytest.raises(ValueError, match=match):
        model.trainer.load(path)
    assert_same(snapshot(model), before)


def test_checkpoint_format_is_plain_npz_with_a_json_header(saved):
    model, path = saved
    with np.load(path, allow_pickle=False) as npz:
        header = json.loads(npz["header"].tobytes().decode())
        assert header["format"] == "tinn-checkpoint" and header["version"] == 1
        assert header["optimizer"] == model.optimizer.hyperparams() and header["n_instances"] == 1
        assert header["model"] == model.network.hyperparams()
        assert npz["params"].shape == (1, model.network.n_params)
        assert "optimizer.nested.learning_rate_factor" in npz.files
        assert "optimizer.nested.nested.first_moments" in npz.files
        assert not np.array_equal(npz["params"], npz["inference_params"])   # EMA weights saved too


def test_network_array_save_load_resumes_bit_identically(tmp_path):
    """K = 3 networks, network 1 without samples in some steps; routed batches."""
    def routed(step):
        x, y = data(step, 96)
        inst = np.repeat(np.int32([0, 1, 2]), 32)
        if step % 2:
            inst[32:64] = 2                                   # network 1 gets nothing
        return x, y, inst

    a = model_with(WRAPPED, n_instances=3)
    for s in range(3):
        a.trainer.training_step(*routed(s))
    a.trainer.save(tmp_path / "array.npz")
    b = model_with(WRAPPED, n_instances=3, seed=5)
    b.trainer.load(tmp_path / "array.npz")
    for s in range(3, 6):
        a.trainer.training_step(*routed(s))
        b.trainer.training_step(*routed(s))
    assert_same(snapshot(a), snapshot(b))
    assert list(a.optimizer.step_counts()) == [6, 3, 6]
    a.trainer.export_tcnn(tmp_path / "net1.json", instance=1)
    b.trainer.load_tcnn(tmp_path / "net1.json", instance=2)
    np.testing.assert_array_equal(b.trainer.params_inference()[2], a.trainer.params_inference()[1])
    np.testing.assert_array_equal(b.network.params()[0], a.network.params()[0])
    with pytest.raises(ValueError, match="instance"):
        a.trainer.export_tcnn(tmp_path / "x.json")


def test_tcnn_snapshot_round_trip(tmp_path):
    a = tinn.create_from_config(2, 3, "config")
    x, y = data(0, 256)
    losses = [a.trainer.training_step(x, y) for _ in range(3)]   # tcnn's config.json: OneBlob 64 bins, 128x5 MLP
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    path = tmp_path / "tcnn.json"
    a.trainer.export_tcnn(path)
    snap = json.loads(path.read_text())
    assert snap["n_params"] == a.network.n_params and snap["params_type"] == "float"
    assert snap["params_binary"]["subtype"] is None and len(snap["params_binary"]["bytes"]) == 4 * snap["n_params"]
    raw = np.frombuffer(bytes(snap["params_binary"]["bytes"]), "<f4")
    np.testing.assert_array_equal(raw, a.trainer.params_inference())      # tcnn's flat order = tinn's store
    b = tinn.create_from_config(2, 3, "config", seed=3)
    b.trainer.load_tcnn(path)
    np.testing.assert_array_equal(b.network.params(), a.network.params())
    np.testing.assert_array_equal(b.network.inference(x), a.network.inference(x))

    half = {"n_params": snap["n_params"], "params_type": "__half",
            "params_binary": {"bytes": list(raw.astype("<f2").tobytes()), "subtype": None}}
    b.trainer.load_tcnn(half)
    np.testing.assert_array_equal(b.network.params(), raw.astype(np.float16).astype(np.float32))

    before = b.network.params()
    bad = [{**snap, "n_params": snap["n_params"] - 1},
           {**half, "params_type": "double"},
           {**snap, "params_binary": {"bytes": snap["params_binary"]["bytes"][:-4], "subtype": None}},
           {**half, "params_binary": {"bytes": [256] * (2 * snap["n_params"]), "subtype": None}},
           {"n_params": 3}]
    for obj in bad:
        with pytest.raises(ValueError):
            b.trainer.load_tcnn(obj)
    (tmp_path / "broken.json").write_text(path.read_text()[:1000])
    with pytest.raises(ValueError):
        b.trainer.load_tcnn(tmp_path / "broken.json")
    np.testing.assert_array_equal(b.network.params(), before)


def test_update_hyperparams_mid_training(tmp_path):
    model = model_with(ADAM)
    train(model, 2)
    model.trainer.update_hyperparams({"optimizer": {"learning_rate": 0.0}, "loss": {}})
    assert model.optimizer.learning_rate == 0.0
    frozen = model.network.params()
    train(model, 2, seed=2)
    np.testing.assert_array_equal(model.network.params(), frozen)          # lr 0: no change
    model.trainer.update_hyperparams({"optimizer": {"learning_rate": 0.05, "beta1": 0.5}})
    assert model.trainer.hyperparams()["optimizer"]["beta1"] == 0.5
    train(model, 1, seed=4)
    assert not np.array_equal(model.network.params(), frozen)
    with pytest.raises(ValueError, match="beta1"):
        model.trainer.update_hyperparams({"optimizer": {"beta1": 2.0}})
    assert model.trainer.hyperparams()["optimizer"]["beta1"] == 0.5

    model.trainer.save(tmp_path / "updated.npz")                           # hyperparameters travel with the file
    fresh = model_with(ADAM)
    fresh.trainer.load(tmp_path / "updated.npz")
    assert fresh.optimizer.hyperparams() == model.optimizer.hyperparams()

    decayed = model_with(WRAPPED)
    train(decayed, 5)                                                      # factor x 0.5 at s = 2 and s = 4
    assert decayed.optimizer.learning_rate == pytest.approx(1e-2 * 0.25)
    decayed.trainer.update_hyperparams({"optimizer": {"learning_rate": 1e-3}})
    assert decayed.optimizer.learning_rate == pytest.approx(1e-3)
    assert decayed.optimizer.hyperparams()["nested"]["nested"]["learning_rate"] == pytest.approx(4e-3)
