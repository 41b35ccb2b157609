"""Checkpoint corruption sweep: a load that fails leaves the trainer bit-identical.

A trainer A and its twin B train identically; A is saved. Every damaged file below must be
refused with ``ValueError`` (a handful of bit flips land in zip metadata that does not
change the content and may load: then A must still be bit-identical, having loaded the
same state). After each attempt A is compared bit for bit with its snapshot (parameters,
inference weights, every optimizer state array, step counters, hyperparameters); after
every few attempts A and B train one more identical step and must stay equal.
"""
import json
import os
import random
import zipfile

import numpy as np
import pytest

import tinn

CONFIG = {"loss": {"otype": "L2"},
          "encoding": {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6,
                       "base_resolution": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1},
          "optimizer": {"otype": "Ema", "decay": 0.9, "nested": {"otype": "Lookahead", "n_steps": 2,
                                                                  "nested": {"otype": "Adam", "learning_rate": 1e-2}}}}
AVERAGE = {**CONFIG, "optimizer": {"otype": "Average", "n_samples": 8, "nested": {"otype": "Adam"}}}
K = 2


def batch(step):
    rng = np.random.default_rng(step)
    x = rng.random((64, 2), dtype=np.float32)
    return x, rng.random((64, 3), dtype=np.float32), np.repeat(np.int32([0, 1]), 32)


def snapshot(model):
    t = model.trainer
    return {"params": model.network.params(), "inference": t.params_inference(),
            "optimizer": json.dumps(t.optimizer.hyperparams()), "loss": json.dumps(t.loss.hyperparams()),
            "steps": t.optimizer.step_counts(),
            **{f"state.{k}": v for k, v in t.optimizer.state_dict().items()}}


def assert_same(a, b, what=""):
    assert a.keys() == b.keys(), what
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), f"{what}: {key}"
        else:
            assert a[key] == b[key], f"{what}: {key}"


class Twins:
    def __init__(self, config, path):
        self.a, self.b = (tinn.create_from_config(2, 3, config, n_instances=K) for _ in range(2))
        self.step = 0
        for _ in range(3):
            self.train()
        self.path = path
        self.a.trainer.save(path)
        self.raw = path.read_bytes()
        with np.load(path) as npz:
            self.arrays = {k: npz[k] for k in npz.files}
        self.header = json.loads(self.arrays["header"].tobytes())
        self.saved = snapshot(self.a)

    def train(self):
        for m in (self.a, self.b):
            m.trainer.training_step(*batch(self.step))
        self.step += 1

    def attempt(self, bad, what, train=False, may_load=False):
        """Load ``bad`` into A: refused (or, if ``may_load``, the same content) and A unchanged."""
        try:
            self.a.trainer.load(bad)
            loaded = True
        except ValueError:
            loaded = False
        assert may_load or not loaded, f"{what}: loaded"
        assert_same(snapshot(self.a), self.saved, what)
        if train:                                        # trains on exactly like its twin, then back to the file
            self.train()
            assert_same(snapshot(self.a), snapshot(self.b), what + " (next step)")
            for m in (self.a, self.b):
                m.trainer.load(self.path)
            assert_same(snapshot(self.a), self.saved, what + " (restored)")
        return loaded

    def write(self, tmp, name, arrays=None, header=None, raw=None):
        path = tmp / f"{name}.npz"
        if raw is not None:
            path.write_bytes(raw)
            return path
        arrays = dict(self.arrays if arrays is None else arrays)
        if header is not None:
            arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
        np.savez(path, **arrays)
        return path


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return Twins(CONFIG, tmp_path_factory.mktemp("ckpt") / "good.npz")


def test_truncated_files(twins, tmp_path):
    n = len(twins.raw)
    lengths = sorted({0, 1, 4, 10, 22, 30, 100, 1000, n // 4, n // 3, n // 2, 3 * n // 4, n - 200, n - 22, n - 1}
                     | set(range(0, n, max(1, n // 40))))
    for i, length in enumerate(lengths):
        twins.attempt(twins.write(tmp_path, "trunc", raw=twins.raw[:length]), f"truncated at {length}",
                      train=i % 8 == 0)


def test_single_bit_flips(twins, tmp_path):
    rng = random.Random(20261124)
    loaded = 0
    for i in range(300):
        pos, bit = rng.randrange(len(twins.raw)), rng.randrange(8)
        raw = bytearray(twins.raw)
        raw[pos] ^= 1 << bit
        loaded += twins.attempt(twins.write(tmp_path, "flip", raw=bytes(raw)), f"bit {bit} of byte {pos}",
                                train=i % 30 == 0, may_load=True)
    assert loaded < 30                                  # only flips in metadata that does not matter may load


def _edit(header, *keys, value):
    h = json.loads(json.dumps(header))
    d = h
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    return h


HEADER_EDITS = {
    "n_params+1": ("n_params", lambda v: v + 1), "n_instances=1": ("n_instances", lambda v: 1),
    "n_instances=true": ("n_instances", lambda v: True), "format": ("format", lambda v: "other"),
    "version": ("version", lambda v: 2), "lr=-1": ("optimizer", "nested", "nested", "learning_rate", lambda v: -1.0),
    "lr=nan": ("optimizer", "nested", "nested", "learning_rate", lambda v: float("nan")),
    "lr=fast": ("optimizer", "nested", "nested", "learning_rate", lambda v: "fast"),
    "l2_reg=inf": ("optimizer", "nested", "nested", "l2_reg", lambda v: float("inf")),
    "alpha=nan": ("optimizer", "nested", "alpha", lambda v: float("nan")),
    "decay=2": ("optimizer", "decay", lambda v: 2.0), "inner otype": ("optimizer", "nested", "nested", "otype",
                                                                       lambda v: "SGD"),
    "outer otype": ("optimizer", "otype", lambda v: "Average"), "loss otype": ("loss", "otype", lambda v: "L1"),
    "loss list": ("loss", lambda v: ["L2"]), "model": ("model", "network", "n_neurons", lambda v: 8),
    "n_steps=0": ("optimizer", "nested", "n_steps", lambda v: 0),
}


def test_header_edits(twins, tmp_path):
    for i, (name, (*keys, change)) in enumerate(HEADER_EDITS.items()):
        d = twins.header
        for k in keys[:-1]:
            d = d[k]
        header = _edit(twins.header, *keys, value=change(d[keys[-1]]))
        twins.attempt(twins.write(tmp_path, "header", header=header), name, train=i % 4 == 0)
    for name, raw in {"not json": b"{", "not utf-8": b"\xff\xfe", "a list": b"[]"}.items():
        arrays = {**twins.arrays, "header": np.frombuffer(raw, np.uint8)}
        twins.attempt(twins.write(tmp_path, "header", arrays=arrays), name)
    twins.attempt(twins.write(tmp_path, "header", arrays={**twins.arrays, "header": twins.arrays["header"]
                                                            .astype(np.int8)}), "int8 header")
    twins.attempt(twins.write(tmp_path, "header", arrays={k: v for k, v in twins.arrays.items() if k != "header"}),
                  "no header", train=True)


def test_arrays_of_wrong_shape_dtype_or_values(twins, tmp_path):
    a = twins.arrays
    state = sorted(k for k in a if k.startswith("optimizer."))
    counter = next(k for k in state if a[k].dtype.kind in "iu")
    moments = next(k for k in state if k.endswith("first_moments"))
    cases = {
        "params float64": {"params": a["params"].astype(np.float64)},
        "params short": {"params": a["params"][:, :-1]},
        "params transposed": {"params": np.ascontiguousarray(a["params"].T)},
        "params NaN": {"params": np.where(np.arange(a["params"].size).reshape(a["params"].shape) == 5, np.nan,
                                          a["params"]).astype(np.float32)},
        "params inf": {"params": np.full_like(a["params"], np.inf)},
        "inference NaN": {"inference_params": np.full_like(a["inference_params"], np.nan)},
        "moments NaN": {moments: np.full_like(a[moments], np.nan)},
        "counter negative": {counter: np.full_like(a[counter], -5)},
        "counter huge": {counter: np.full_like(a[counter], 10 ** 12) if a[counter].dtype == np.int64
                         else np.full_like(a[counter], -1)},
        "counter int32": {counter: a[counter].astype(np.int32 if a[counter].dtype == np.int64 else np.int64)},
        "state as object": {moments: np.array([None], dtype=object)},
    }
    for i, (name, change) in enumerate(cases.items()):
        twins.attempt(twins.write(tmp_path, "arrays", arrays={**a, **change}), name, train=i % 3 == 0)
    twins.attempt(twins.write(tmp_path, "missing", arrays={k: v for k, v in a.items() if k != moments}), "missing")
    twins.attempt(twins.write(tmp_path, "extra", arrays={**a, "optimizer.extra": a[moments]}), "extra member")


def test_duplicate_members(twins, tmp_path):
    path = tmp_path / "dup.npz"
    path.write_bytes(twins.raw)
    with zipfile.ZipFile(path, "a") as zf, pytest.warns(UserWarning, match="Duplicate"):
        with zf.open("params.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros_like(twins.arrays["params"]))
    twins.attempt(path, "duplicate params.npy", train=True)


def test_declared_sizes_are_bounded(twins, tmp_path):
    path = tmp_path / "bomb.npz"                    # a member inflating to 64 MiB from a few KiB on disk
    arrays = {**twins.arrays, "params": np.zeros((K, 1 << 23), np.float32)}
    np.savez_compressed(path, **arrays)
    twins.attempt(path, "oversized member")
    huge = tmp_path / "huge.npz"                    # an .npy header claiming 2^40 values
    with zipfile.ZipFile(huge, "w") as zf:
        for k, v in twins.arrays.items():
            with zf.open(f"{k}.npy", "w") as f:
                if k == "params":
                    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                             "shape": (1 << 20, 1 << 20)})
                else:
                    np.lib.format.write_array(f, v)
    twins.attempt(huge, "header claiming 4 TiB")


def test_non_regular_files_are_never_read(twins, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                                 # a reader would block forever
    twins.attempt(fifo, "fifo")
    twins.attempt("/dev/zero", "/dev/zero")
    twins.attempt(tmp_path, "a directory", train=True)
    with pytest.raises(FileNotFoundError):
        twins.a.trainer.load(tmp_path / "missing.npz")


def test_failed_load_keeps_average_state(tmp_path):
    """The header says Average.n_samples = 4, the arrays hold 8 snapshots: refused, nothing reallocated."""
    twins = Twins(AVERAGE, tmp_path / "average.npz")
    header = _edit(twins.header, "optimizer", "n_samples", value=4)
    twins.attempt(twins.write(tmp_path, "n_samples", header=header), "n_samples 8 -> 4", train=True)
    arrays = dict(twins.arrays)                     # a consistent file with n_samples = 4 loads, and resizes
    arrays["optimizer.weights_samples"] = arrays["optimizer.weights_samples"][:4]
    path = twins.write(tmp_path, "four", arrays=arrays, header=header)
    twins.a.trainer.load(path)
    assert twins.a.optimizer.hyperparams()["n_samples"] == 4
    assert twins.a.optimizer.state_dict()["weights_samples"].shape[0] == 4


def test_save_names_the_target_and_leaves_no_temporary(twins, tmp_path):
    target = tmp_path / "missing-dir" / "model.npz"
    with pytest.raises(FileNotFoundError, match="missing-dir"):
        twins.a.trainer.save(target)
    with pytest.raises(IsADirectoryError) as err:
        twins.a.trainer.save(tmp_path)
    assert str(tmp_path) in str(err.value)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tinn-")]
