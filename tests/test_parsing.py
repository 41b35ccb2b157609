"""Taichi parses tinn's kernels faster (``tinn.runtime.parsing``) and gives what its own parser gives: every value
it remembers equals Taichi's own (source lines, node positions, the class test), a kernel compiled either way has
the same offline-cache key (the same IR), and an error inside tinn's funcs reads the same."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import taichi as ti
from taichi.lang import kernel_impl
from taichi.lang.ast import ast_transformer_utils

import tinn
from tinn.runtime import parsing

pytestmark = pytest.mark.skipif(not parsing.APPLIED["patched"], reason="Taichi's parser is not wrapped here")

TESTS = os.path.dirname(os.path.abspath(__file__))


def _compile_new_kernels():
    """Kernels no test compiled before (a config of its own), through the batch path and a user's kernel."""
    cfg = {"encoding": {"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 11, "per_level_scale": 1.37},
           "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "SiLU"},
           "optimizer": {"otype": "Adam", "learning_rate": 1e-3, "l2_reg": 1e-7}}
    m = tinn.create_from_config(2, 2, cfg)
    x = np.random.default_rng(0).random((64, 2), dtype=np.float32)
    m.trainer.training_step(x, np.zeros((64, 2), np.float32))
    jf = m.network.jacobian_func
    out = ti.ndarray(ti.f32, (64, 6))

    @ti.kernel
    def user(x: ti.types.ndarray(), out: ti.types.ndarray()):
        for b in range(x.shape[0]):
            y, J = jf(ti.Vector([x[b, 0], x[b, 1]]))
            out[b, 0], out[b, 1], out[b, 2] = y[0], J[0, 0], J[1, 1]

    user(x, out)


def test_remembered_positions_and_sources_are_the_ones_taichi_computes(monkeypatch):
    """While new kernels compile, each remembered value is compared with what Taichi's own function gives for the
    same node or function; many of them are found again (a func inlined at several places, a static loop's body)."""
    context = ast_transformer_utils.ASTTransformerContext
    remembered_pos, remembered_lines = context.get_pos_info, kernel_impl.getsourcelines
    seen = {"positions": 0, "again": 0, "sources": 0}

    def pos_info(ctx, node):
        known = len(parsing._POSITIONS)
        text = remembered_pos(ctx, node)
        assert text == parsing.TAICHI["get_pos_info"](ctx, node)
        seen["positions"] += 1
        seen["again"] += len(parsing._POSITIONS) == known
        return text

    def lines(func):
        out = remembered_lines(func)
        assert out == parsing.TAICHI["getsourcelines"](func)
        assert kernel_impl.getsourcefile(func) == parsing.TAICHI["getsourcefile"](func)
        seen["sources"] += 1
        return out

    monkeypatch.setattr(context, "get_pos_info", pos_info)
    monkeypatch.setattr(kernel_impl, "getsourcelines", lines)
    _compile_new_kernels()
    assert seen["positions"] > 1000 and seen["again"] > seen["positions"] // 2 and seen["sources"] > 10, seen


@pytest.mark.full_only("a third compile of new kernels through the parse; the other two tests compare its "
                       "positions, sources, cache keys and messages with Taichi's by default")
def test_the_class_test_is_taichis_for_tinn_frames_and_for_a_module_top_level(monkeypatch, tmp_path):
    """``_inside_class`` gives Taichi's answer: for the kernels tinn's factories decorate, and for funcs and kernels
    decorated at the top level of a module being imported (the frame it reads is importlib's), a class's included."""
    remembered = kernel_impl._inside_class
    answers = []

    def inside_class(level_of_class_stackframe):
        mine = remembered(level_of_class_stackframe + 1)           # (one frame more: this one)
        answers.append((mine, parsing.TAICHI["inside_class"](level_of_class_stackframe + 1)))
        return mine

    monkeypatch.setattr(kernel_impl, "_inside_class", inside_class)
    _compile_new_kernels()
    (tmp_path / "user_module.py").write_text(textwrap.dedent("""
        import taichi as ti

        @ti.func
        def twice(v):
            return 2 * v

        @ti.kernel
        def k() -> ti.i32:
            return twice(3)

        @ti.data_oriented
        class Owner:
            @ti.kernel
            def method(self) -> ti.i32:
                return 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_module
    assert user_module.k() == 6 and user_module.Owner().method() == 1
    assert len(answers) > 5 and all(mine == theirs for mine, theirs in answers), answers
    assert (True, True) in answers                                  # the class's kernel


def test_other_taichi_versions_are_left_alone(monkeypatch):
    monkeypatch.setitem(parsing.APPLIED, "patched", False)
    monkeypatch.setattr(ti, "__version__", (1, 7, 3))
    assert parsing.apply() is False
    monkeypatch.setattr(ti, "__version__", parsing.TAICHI_VERSION)
    monkeypatch.setenv("TINN_PLAIN_PARSE", "1")
    assert parsing.apply() is False


_SCRIPT = """
import json, os, sys
import numpy as np, taichi as ti
import tinn
from tinn.runtime import parsing
ti.init(arch=ti.cpu, log_level=ti.ERROR)
m = tinn.create_from_config(2, 3, {"encoding": {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 12},
                                   "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}})
x = np.random.default_rng(0).random((256, 2), dtype=np.float32)
loss = m.trainer.training_step(x, np.zeros((256, 3), np.float32))
f = m.network.func
@ti.kernel
def wrong() -> ti.f32:
    return f(ti.Vector([1.0, 2.0, 3.0]))[0]          # three inputs for a network of two
try:
    wrong()
    message = None
except Exception as e:
    message = type(e).__name__ + ": " + str(e)
ti.reset()
print(json.dumps({"patched": parsing.APPLIED["patched"], "loss": loss, "message": message}))
"""


def _run(tmp_path, plain: bool) -> dict:
    script = tmp_path / "script.py"                # (a file: Taichi reads the user's kernel's source)
    script.write_text(_SCRIPT)
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path / "cache"), PYTHONPATH=TESTS)
    env.pop("TINN_PLAIN_PARSE", None)
    if plain:
        env["TINN_PLAIN_PARSE"] = "1"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.x64_only("the script compiles its kernels on the CPU, in processes of its own")
@pytest.mark.full_only("three processes; the default suite checks the remembered positions in this one")
def test_kernels_parsed_either_way_share_the_offline_cache_and_errors_read_the_same(tmp_path):
    """Taichi's parser alone fills an offline cache; the faster parse then finds every kernel there (no new entry:
    each kernel's IR, which keys the cache, is the same) and trains to the same loss; a wrong call of a tinn func
    from a user's kernel gives the same message either way."""
    cache = tmp_path / "cache"
    plain = _run(tmp_path, plain=True)
    entries = sorted(p.name for p in cache.rglob("*") if p.is_file() and p.suffix != ".tcb")
    fast = _run(tmp_path, plain=False)
    assert not plain["patched"] and fast["patched"]
    assert entries and sorted(p.name for p in cache.rglob("*") if p.is_file() and p.suffix != ".tcb") == entries
    assert fast["loss"] == plain["loss"]
    assert plain["message"] and fast["message"] == plain["message"]
