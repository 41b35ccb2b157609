"""The grid's parameter-gradient paths on the CPU (spec §1.6.6), against the reference and each other.

While threads × instances × n_params floats fit in ``grid.SCRATCH_BUDGET_BYTES``, each thread adds its
share of the batch into a private table and the tables are summed; beyond it each level's gradients
are owned by one thread that adds the whole batch in sample order. Both must give the reference's
gradients, overwrite and accumulate, routed or not; the scratch path is bit-identical run to run for a
thread count, the level path for any thread count.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tinn
from tinn.encodings import grid as grid_module
from conftest import sample
from reference import assert_close, grid_geometry, grid_param_grad_ref

CASES = {   # D, type, interpolation, F, log2_T
    "hash-2d-linear": (2, "Hash", "Linear", 2, 6),
    "hash-3d-smoothstep": (3, "Hash", "Smoothstep", 1, 9),
    "dense-1d-nearest": (1, "Dense", "Nearest", 4, 19),
    "tiled-4d-linear": (4, "Tiled", "Linear", 2, 19),
}
N_LEVELS, BASE, B = 3, 3, 1.7

pytestmark = pytest.mark.x64_only("private per-thread tables and the level path are the CPU's backward; other "
                                  "archs add with atomics")


def build(name, n_instances, scratch):
    """An encoding whose kernels use the private tables (default budget) or the level path (call with the
    budget patched to 0: the budget is read at every kernel lookup)."""
    D, grid_type, interp, F, log2_T = CASES[name]
    cfg = {"otype": "Grid", "type": grid_type, "n_levels": N_LEVELS, "n_features_per_level": F,
           "base_resolution": BASE, "per_level_scale": B, "interpolation": interp, "log2_hashmap_size": log2_T}
    enc = tinn.create_encoding(D, cfg, n_instances=n_instances)
    assert enc._get_kernels().private == scratch
    return enc, grid_geometry(D, grid_type, N_LEVELS, log2_T, BASE, B), F, interp


def reference_grads(x, dy, inst, K, levels, F, interp, n_params):
    if inst is None:
        return grid_param_grad_ref(x, dy, levels, F, interp, n_params)
    return np.stack([grid_param_grad_ref(x[inst == k], dy[inst == k], levels, F, interp, n_params)
                     for k in range(K)])


@pytest.mark.parametrize("name, K", sample([(name, K) for name in CASES for K in (1, 3)], keep=[1, 4]))   # hash-2d K=3, dense-1d K=1
def test_scratch_and_level_paths_match_the_reference(name, K):
    rng = np.random.default_rng(len(name) + K)
    D = CASES[name][0]
    width = build(name, K, True)[0].n_output_dims
    batches = []
    for n, lo, hi in ((700, -1.5, 2.5), (257, 0.0, 1.0)):
        x = rng.uniform(lo, hi, (n, D)).astype(np.float32)
        inst = None if K == 1 else rng.integers(0, K - (n < 300), n).astype(np.int32)   # 2nd: network K-1 idle
        batches.append((x, rng.normal(size=(n, width)).astype(np.float32), inst))
    results = []
    for scratch in (True, False):
        results.append(gradients_of_one_path(name, K, scratch, batches))
    assert_close(results[1], results[0], rtol=1e-5, atol_rel=1e-6)


def gradients_of_one_path(name, K, scratch, batches):
    with pytest.MonkeyPatch.context() as mp:
        if not scratch:
            mp.setattr(grid_module, "SCRATCH_BUDGET_BYTES", 0)
        enc, levels, F, interp = build(name, K, scratch)
        theta = np.random.default_rng(1).uniform(-1, 1, (K, enc.n_params)).astype(np.float32)
        enc.set_params(theta if K > 1 else theta[0])
        (x1, g1, i1), (x2, g2, i2) = batches
        r1 = reference_grads(x1, g1, i1, K, levels, F, interp, enc.n_params)
        r2 = reference_grads(x2, g2, i2, K, levels, F, interp, enc.n_params)
        _, c1 = enc.forward(x1, i1)
        _, c2 = enc.forward(x2, i2)
        enc.backward(c1, g1, input_gradient=False)
        assert_close(enc.gradients(), r1, rtol=1e-4, atol_rel=1e-5)
        enc.backward(c2, g2, input_gradient=False, mode="accumulate")
        assert_close(enc.gradients(), r1 + r2, rtol=1e-4, atol_rel=1e-5)
        enc.backward(c2, g2, input_gradient=False)            # overwrite (with K = 3 one network is idle)
        assert_close(enc.gradients(), r2, rtol=1e-4, atol_rel=1e-5)
        enc.backward(c1, g1, input_gradient=False)
        first = enc.gradients()
        enc.backward(c1, g1, input_gradient=False)
        np.testing.assert_array_equal(enc.gradients(), first)  # same data, same bits
        return first


SCRIPT = """
import hashlib, sys, numpy as np, taichi as ti, tinn
from tinn.encodings import grid
threads, budget = int(sys.argv[1]), int(sys.argv[2])
ti.init(arch=ti.cpu, log_level=ti.ERROR, cpu_max_num_threads=threads)
grid.SCRATCH_BUDGET_BYTES = budget
enc = {"otype": "HashGrid", "n_levels": 6, "log2_hashmap_size": 12, "base_resolution": 4}
model = tinn.create_from_config(2, 2, {"encoding": enc, "network": {"otype": "FullyFusedMLP", "n_neurons": 16,
                                                                   "n_hidden_layers": 1}})
rng = np.random.default_rng(0)
for _ in range(4):
    model.trainer.training_step(rng.uniform(-0.5, 1.5, (3001, 2)).astype(np.float32),
                                rng.random((3001, 2), dtype=np.float32))
print(model.network.encoding._get_kernels().private, hashlib.sha256(model.network.params().tobytes()).hexdigest())
"""


@pytest.mark.full_only("five cold training processes; test_determinism checks repeatability by default")
def test_training_is_bit_identical_per_path():
    """Same seed and data: the level path gives the same bits with 1, 2 or 3 threads; the scratch path
    the same bits in two processes with the same thread count (each run in its own process)."""
    runs = {"level-1": (1, 0), "level-2": (2, 0), "level-3": (3, 0), "scratch-2a": (2, 1 << 30),
            "scratch-2b": (2, 1 << 30)}
    procs = {k: subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT), str(t), str(b)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, (t, b) in runs.items()}
    out = {}
    for k, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        out[k] = stdout.split()[-2:]
    assert {out[k][0] for k in ("level-1", "level-2", "level-3")} == {"False"}
    assert out["scratch-2a"][0] == out["scratch-2b"][0] == "True"
    assert out["level-1"][1] == out["level-2"][1] == out["level-3"][1]
    assert out["scratch-2a"][1] == out["scratch-2b"][1]
