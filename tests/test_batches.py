"""Batches stay where they are: a ti.ndarray is read in place on the CPU (no host copy)."""
import gc

import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.batch.batch import as_batch, as_instances

CONFIG = {"encoding": {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 6, "base_resolution": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


@pytest.mark.x64_only("ti.ndarray memory is host memory only on x64")
def test_a_ti_ndarray_batch_is_read_in_place(rng):
    x = rng.random((6, 2), dtype=np.float32)
    arr = ti.ndarray(ti.f32, (6, 2))
    arr.from_numpy(x)
    view = as_batch(arr, 2)
    np.testing.assert_array_equal(view, x)
    arr.from_numpy(2 * x)                                   # the same memory, not a copy
    np.testing.assert_array_equal(view, 2 * x)
    ids = ti.ndarray(ti.i32, (6,))
    ids.from_numpy(np.arange(6, dtype=np.int32) % 3)
    np.testing.assert_array_equal(as_instances(ids, 6, 3), np.arange(6) % 3)
    del arr
    gc.collect()
    np.testing.assert_array_equal(view, 2 * x)             # the view keeps the ndarray alive


def test_ti_ndarray_batches_train_like_numpy_ones(rng):
    x, y = rng.random((40, 2), dtype=np.float32), rng.random((40, 3), dtype=np.float32)
    a, b = tinn.create_from_config(2, 3, CONFIG), tinn.create_from_config(2, 3, CONFIG)
    xs, ys = ti.ndarray(ti.f32, (40, 2)), ti.ndarray(ti.f32, (40, 3))
    xs.from_numpy(x)
    ys.from_numpy(y)
    for _ in range(2):
        assert a.trainer.training_step(xs, ys) == b.trainer.training_step(x, y)
    np.testing.assert_array_equal(a.network.params(), b.network.params())
    out = a.network.inference(xs)               # on the device path a ti.ndarray batch stays one
    out = out.to_numpy() if isinstance(out, ti.Ndarray) else out
    np.testing.assert_array_equal(out, b.network.inference(x))
    bad = ti.ndarray(ti.f32, (40, 2))
    bad.from_numpy(np.where(np.arange(80).reshape(40, 2) == 9, np.nan, x).astype(np.float32))
    if tinn.runtime.program.active():                  # the device path: found there, reported by the next read
        a.network.inference(bad)
        with pytest.raises(ValueError, match="x must be finite: row 4 holds nan .in inference call"):
            a.network.params()
    else:
        with pytest.raises(ValueError, match="x must be finite: row 4"):
            a.network.inference(bad)
