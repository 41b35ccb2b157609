"""On the CPU tinn's kernels, and a user's kernel calling a per-sample func, compile without Taichi's CFG pass
(``tinn.runtime.compiling``): each is compiled once, the program's settings never change, a user's other kernels and
every autodiff kernel compile as Taichi compiles them, and what they compute is what Taichi's own compile computes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import taichi as ti

from tinn.runtime import compiling

TESTS = os.path.dirname(os.path.abspath(__file__))

pytestmark = [pytest.mark.skipif(not compiling.APPLIED["patched"], reason="Taichi's compile is not wrapped here"),
              pytest.mark.arch_independent("processes of their own on the CPU, where the lean compile applies")]

_SCRIPT = """
import json, sys
import numpy as np, taichi as ti
import tinn
from conftest import SMALL_CONFIG
from taichi.lang.kernel_impl import Kernel
from tinn.runtime import compiling

ti.init(arch=ti.cpu, log_level=ti.ERROR, offline_cache=True, offline_cache_file_path=sys.argv[1])
materialized, lean = [], []
materialize, compile_lean = Kernel.materialize, compiling._compile_lean

def counting(kernel, key=None, **kwargs):
    if (key or (kernel.func, 0, kernel.autodiff_mode)) not in kernel.compiled_kernels:
        materialized.append(kernel.func.__name__)
    return materialize(kernel, key, **kwargs)

def recording(kernel, key):
    lean.append(kernel.func.__name__)
    compile_lean(kernel, key)

Kernel.materialize, compiling._compile_lean = counting, recording
rng = np.random.default_rng(0)
m = tinn.create_from_config(2, 3, SMALL_CONFIG, seed=1)
x = rng.random((64, 2), dtype=np.float32)
loss = m.trainer.training_step(x, rng.random((64, 3), dtype=np.float32))
bf = m.network.backward_func
dx = ti.ndarray(ti.f32, (64, 2))

@ti.kernel
def calls_a_func(x: ti.types.ndarray(), dx: ti.types.ndarray()):
    for b in range(x.shape[0]):
        g = bf(ti.Vector([x[b, 0], x[b, 1]]), ti.Vector([1.0, -1.0, 0.5]))
        dx[b, 0], dx[b, 1] = g[0], g[1]

p = ti.field(ti.f32, 64, needs_grad=True)
total = ti.field(ti.f32, (), needs_grad=True)

@ti.kernel
def squares():
    for i in p:
        total[None] += p[i] ** 2

calls_a_func(x, dx)
p.from_numpy(x[:, 0])
with ti.ad.Tape(loss=total):
    squares()
out = {"loss": float(loss), "dx": dx.to_numpy().tolist(), "grad": p.grad.to_numpy().tolist(), "x": x[:, 0].tolist(),
       "materialized": materialized, "lean": lean, "cfg_optimization": ti.lang.impl.current_cfg().cfg_optimization}
ti.reset()                                          # writes the offline cache
print(json.dumps(out))
"""


def _run(tmp_path, name: str, **env) -> dict:
    """The script in a process of its own with an empty offline cache; its output and the kernels the cache holds."""
    cache, script = tmp_path / name, tmp_path / f"{name}.py"
    script.write_text(_SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k != "TINN_CFG_OPTIMIZATION"}
    run = subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=300,
                         env={**environ, "PYTHONPATH": TESTS, **env})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    out["cached"] = sum(f.endswith(".tic") for _, _, files in os.walk(cache) for f in files)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("compiling")
    return _run(tmp_path, "lean"), _run(tmp_path, "as_taichi_compiles", TINN_CFG_OPTIMIZATION="1")


def test_tinn_kernels_and_a_user_kernel_calling_a_func_compile_lean_once(runs):
    """The lean compile is the only compile of its kernel: the cache holds as many kernels as Taichi's own compile
    leaves (a launch that missed the lean kernel would compile and cache the kernel again). The user's kernel
    calling ``backward_func`` and tinn's kernels are lean; the user's other kernel, its Tape's reverse kernel and
    Taichi's own helpers are not, and the program keeps its CFG setting."""
    lean, taichi = runs
    assert taichi["lean"] == [] and taichi["cached"] == lean["cached"] >= len(lean["materialized"]) > 5, (lean, taichi)
    assert "calls_a_func" in lean["lean"] and "squares" not in lean["lean"], lean["lean"]
    assert {"forward", "scatter"} <= set(lean["lean"]) and "ext_arr_to_matrix" not in lean["lean"], lean["lean"]
    assert lean["materialized"].count("squares") == 2                  # the primal and the Tape's reverse
    assert lean["cfg_optimization"] is True


def test_lean_kernels_compute_what_taichis_compile_computes(runs):
    """The training step's loss and the func's input gradients as Taichi's own compile gives them, and the Tape's
    gradient of sum p^2 is 2 p."""
    lean, taichi = runs
    assert lean["loss"] == pytest.approx(taichi["loss"], rel=1e-6)
    np.testing.assert_allclose(lean["dx"], taichi["dx"], rtol=1e-5, atol=1e-7)
    assert lean["grad"] == pytest.approx([2 * v for v in lean["x"]], rel=1e-6)


def test_other_taichi_versions_and_the_switch_are_left_alone(monkeypatch):
    monkeypatch.setitem(compiling.APPLIED, "patched", False)
    monkeypatch.setattr(ti, "__version__", (1, 7, 3))
    assert compiling.apply() is False
    monkeypatch.setattr(ti, "__version__", compiling.TAICHI_VERSION)
    monkeypatch.setenv("TINN_CFG_OPTIMIZATION", "1")
    assert compiling.apply() is False
