"""Parameter memory: allocation limits, ``ti.init`` called again, many models, shared kernels; a user's fields
seen from numpy.

Cases that could kill the process run in a subprocess, so a crash fails the test instead of pytest."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import taichi as ti

import tinn
from conftest import FULL, SMALL_NET
from tinn.runtime import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = SMALL_NET
GRID = {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 10, "base_resolution": 4}
PRELUDE = f"""
import gc, json, sys, warnings
import numpy as np, taichi as ti, tinn
warnings.simplefilter("ignore")
ti.init(arch=ti.cpu, log_level=ti.ERROR)
NET, GRID = {NET!r}, {GRID!r}
x = np.random.default_rng(0).random((64, 2), dtype=np.float32)
y = np.random.default_rng(1).random((64, 3), dtype=np.float32)
"""


def run(body: str, timeout: int = 600) -> dict:
    """Run ``body`` after PRELUDE in a fresh interpreter; it prints one JSON line last."""
    path = [ROOT, os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
    with tempfile.TemporaryDirectory() as tmp:
        # its own kernel cache: nothing another process left in a shared one (or writes there meanwhile) reaches it
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TI_OFFLINE_CACHE_FILE_PATH=os.path.join(tmp, "cache"))
        script = os.path.join(tmp, "case.py")            # a file: Taichi reads kernels' source back
        with open(script, "w") as f:
            f.write(PRELUDE + textwrap.dedent(body))
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


CPU_PROCESS = pytest.mark.arch_independent("a subprocess that starts ti.cpu whatever TINN_ARCH is")
LONG_LOOP = pytest.mark.full_only("a loop of a thousand models or more (the full suite's)")


# -- sizes that cannot be allocated ---------------------------------------------------------------
@CPU_PROCESS
def test_impossible_sizes_are_refused_and_the_process_stays_healthy():
    out = run("""
        cases = {
            "n_neurons": {"encoding": {"otype": "Frequency"}, "network": {"otype": "FullyFusedMLP", "n_neurons": 2 ** 20}},
            "n_bins": {"encoding": {"otype": "OneBlob", "n_bins": 2 ** 30}, "network": NET},
            "dense_grid": {"encoding": {"otype": "DenseGrid", "n_levels": 8, "base_resolution": 64,
                                        "per_level_scale": 2.0}, "network": NET},
            "memory": {"encoding": {"otype": "Identity"}, "network": {"otype": "FullyFusedMLP", "n_neurons": 11000,
                                                                     "n_hidden_layers": 2}},
        }
        tinn.runtime.memory.available_memory = lambda: 2 ** 30      # the 1.4 GiB model does not fit
        result = {}
        for name, cfg in cases.items():
            try:
                tinn.create_from_config(4 if name == "dense_grid" else 2, 3, cfg)
                result[name] = "built"
            except Exception as e:
                result[name] = [type(e).__name__, str(e)]
            m = tinn.create_from_config(2, 3, {"encoding": GRID, "network": NET})   # still healthy
            result[name + "_next"] = float(m.trainer.training_step(x, y))
        print(json.dumps(result))
    """)
    expect = {"n_neurons": ("FullyFusedMLP", "'n_neurons': 1048576"), "n_bins": ("OneBlob", "n_bins"),
              "dense_grid": ("Grid", "Dense"), "memory": ("FullyFusedMLP", "GiB")}
    for name, words in expect.items():
        assert isinstance(out[name], list), (name, out[name])
        kind, message = out[name]
        assert kind == "ValueError", (name, out[name])
        for word in words:
            assert word in message, (name, message)
        assert np.isfinite(out[name + "_next"])


def test_field_tree_size_check_leaves_no_half_built_tree():
    from tinn.runtime.memory import FieldTree

    def place(builder):
        builder.dense(ti.i, 16).place(ti.field(ti.f32))
        builder.dense(ti.ij, (2 ** 20, 2 ** 12)).place(ti.field(ti.f32))

    with pytest.raises(ValueError, match=r"huge thing.*2\^31 - 1"):
        FieldTree(place, "huge thing")
    small = ti.field(ti.f32, shape=4)                # Taichi still materialises new fields and runs kernels
    small.fill(2.0)
    assert small.to_numpy().sum() == 8.0


# -- ti.init called again -----------------------------------------------------------------------
REINIT_CASES = {
    "model.inference": "m.network.inference(x)",
    "model.forward": "m.network.forward(x)",
    "model.backward": "m.network.backward(ctx, y)",
    "model.params": "m.network.params()",
    "model.set_params": "m.network.set_params(np.zeros(m.network.n_params, np.float32))",
    "model.gradients": "m.network.gradients()",
    "model.zero_grad": "m.network.zero_grad()",
    "model.reset_params": "m.network.reset_params(3)",
    "encoding.inference": "m.network.encoding.inference(x)",
    "network.inference": "m.network.network.inference(np.zeros((4, 16), np.float32))",
    "func_taken_before": "use(f_before)",
    "backward_func_taken_before": "use_backward(b_before)",
    "func_taken_after": "use(m.network.func)",
    "forward_func_taken_after": "use(m.network.forward_func)",
    "backward_func_taken_after": "use_backward(m.network.backward_func)",
    "jacobian_func": "use_jacobian(m.network.jacobian_func)",
    "trainer.training_step": "m.trainer.training_step(x, y)",
    "trainer.forward": "m.trainer.forward(x, y)",
    "trainer.optimizer_step": "m.trainer.optimizer_step()",
    "trainer.params_inference": "m.trainer.params_inference()",
    "trainer.save": "m.trainer.save(tmp + '/c.npz')",
    "trainer.export_tcnn": "m.trainer.export_tcnn(tmp + '/c.json')",
    "trainer.load": "m.trainer.load(tmp + '/before.npz')",
    "trainer.load_tcnn": "m.trainer.load_tcnn(tmp + '/before.json')",
    "model.backward_backward_input": "m.network.backward_backward_input(ctx, x, y)",
    "optimizer.state_dict": "m.optimizer.state_dict()",
    "optimizer.load_state_dict": "m.optimizer.load_state_dict(state)",
    "optimizer.step": "m.optimizer.step()",
    "optimizer.step_counts": "m.optimizer.step_counts()",
    "optimizer.custom_weights": "m.optimizer.custom_weights()",
    "loss.evaluate": "m.loss.evaluate(y, y)",
}


@CPU_PROCESS
def test_every_public_method_after_reinit_raises_runtime_reset_error():
    """Each public method of a model made before ``ti.init`` was called again raises RuntimeResetError. The full
    suite builds a model and re-initialises Taichi for each call; the default suite calls every method on one
    model per encoding (each call raises and changes nothing, so the next one meets the same stale model)."""
    out = run(f"""
        import tempfile
        tmp = tempfile.mkdtemp()
        cases = dict(sorted({REINIT_CASES!r}.items(), key=lambda c: "func" in c[0]))
        result, built = {{}}, None
        for name, call in cases.items():
            if {FULL!r} or built != ("func" in name):     # a new model, then ti.init again
                built = "func" in name
                ti.init(arch=ti.cpu, log_level=ti.ERROR)
                encoding = GRID if "func" in name else {{"otype": "Frequency", "n_frequencies": 2}}
                m = tinn.create_from_config(2, 3, {{"encoding": encoding, "network": NET,
                                                   "optimizer": {{"otype": "EMA"}}, "loss": {{"otype": "L2"}}}})
                m.trainer.training_step(x, y)
                _, ctx = m.network.forward(x)
                state = m.optimizer.state_dict()
                m.trainer.save(tmp + "/before.npz")
                m.trainer.export_tcnn(tmp + "/before.json")
                f_before, b_before = m.network.func, m.network.backward_func
                ti.init(arch=ti.cpu, log_level=ti.ERROR)

                @ti.kernel
                def use(f: ti.template(), out: ti.types.ndarray()):
                    out[0] = f(ti.Vector([0.5, 0.5]))[0]

                @ti.kernel
                def use_backward(f: ti.template(), out: ti.types.ndarray()):
                    out[0] = f(ti.Vector([0.5, 0.5]), ti.Vector([1.0, 0.0, 0.0]))[0]

                @ti.kernel
                def use_jacobian(f: ti.template(), out: ti.types.ndarray()):
                    out[0] = f(ti.Vector([0.5, 0.5]))[1][0, 0]

                _use, _back, _jac = use, use_backward, use_jacobian
                use = lambda f: _use(f, np.zeros(1, np.float32))
                use_backward = lambda f: _back(f, np.zeros(1, np.float32))
                use_jacobian = lambda f: _jac(f, np.zeros(1, np.float32))
            try:
                eval(call)
                result[name] = "no error"
            except tinn.RuntimeResetError:
                result[name] = "ok"
            except Exception as e:
                result[name] = type(e).__name__ + ": " + str(e)[:200]
        print(json.dumps(result))
    """)
    wrong = {name: r for name, r in out.items() if r != "ok"}
    assert not wrong, wrong
    assert set(out) == set(REINIT_CASES)


@CPU_PROCESS
def test_a_stage_of_fields_made_before_reinit_raises_runtime_reset_error():
    """Fields made before ``ti.init`` was called again, given to a stage of a new model: RuntimeResetError before
    anything reads their shape or dtype (Taichi reads those from the freed program's memory, and the process
    crashes); the new program's own fields make a stage that runs."""
    out = run("""
        old_x = ti.Vector.field(2, ti.f32, 64, needs_grad=True)
        old_y = ti.Vector.field(3, ti.f32, 64, needs_grad=True)
        old_ids = ti.field(ti.i32, 64)
        ti.init(arch=ti.cpu, log_level=ti.ERROR)
        m = tinn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
        new_x, new_y = ti.Vector.field(2, ti.f32, 64, needs_grad=True), ti.Vector.field(3, ti.f32, 64, needs_grad=True)
        new_ids = ti.field(ti.i32, 64)
        result = {}
        for name, args in {"x": (old_x, new_y), "y": (new_x, old_y), "mask": (new_x, new_y, None, old_ids)}.items():
            try:
                tinn.ad.stage(m, *args)
                result[name] = "no error"
            except tinn.RuntimeResetError as e:
                result[name] = str(e)
        new_x.from_numpy(x)
        tinn.ad.stage(m, new_x, new_y, mask=new_ids)()
        print(json.dumps({**result, "ran": bool(np.all(new_y.to_numpy() == 0))}))
    """)
    for name in ("x", "y", "mask"):
        assert out[name].startswith(f"the field {name} was made before ti.init"), out
    assert out["ran"]                                        # (a mask of zeros: every output 0)


# -- many models --------------------------------------------------------------------------------
@CPU_PROCESS
@LONG_LOOP
def test_ten_thousand_models_alive_in_a_few_field_trees():
    out = run("""
        import time
        small = {"encoding": {"otype": "Identity"}, "network": NET}
        models = [tinn.create_from_config(2, 3, {**small, "optimizer": {"otype": "EMA" if i % 2 else "Adam"}})
                  for i in range(10_000)]
        same = all(np.array_equal(models[0].network.params(), m.network.params()) for m in models[::997])
        losses = [float(models[i].trainer.training_step(x, y)) for i in (0, 1, 5_000, 9_999)]
        trees = ti.lang.impl.get_runtime().prog.get_snode_tree_size()
        print(json.dumps({"losses": losses, "trees": trees, "same_init": same}))
    """)
    assert np.all(np.isfinite(out["losses"]))
    assert out["losses"][0] == out["losses"][2]              # same seed, same data: the same first step
    assert out["same_init"]
    assert out["trees"] < 32, out["trees"]                  # Taichi's CPU backend allows 512


@CPU_PROCESS
@LONG_LOOP
def test_more_grid_models_alive_than_taichi_has_field_trees():
    out = run("""
        models = [tinn.create_from_config(2, 3, {"encoding": GRID, "network": NET, "optimizer": {"otype": "EMA"}})
                  for _ in range(1_000)]
        outputs = [m.network.inference(x) for m in models]          # every grid's kernels in use
        loss = float(models[-1].trainer.training_step(x, y))
        print(json.dumps({"same": all(np.array_equal(outputs[0], o) for o in outputs), "loss": loss,
                          "trees": ti.lang.impl.get_runtime().prog.get_snode_tree_size()}))
    """)
    assert out["same"] and np.isfinite(out["loss"])
    assert out["trees"] < 32, out["trees"]


@CPU_PROCESS
@pytest.mark.full_only("a fresh process; the default suite counts the compiles of later models in-process "
                       "(test_reliability's six models, test_compiled_once)")
def test_a_second_model_of_one_config_compiles_no_kernel():
    out = run("""
        from taichi.lang import impl
        encoding = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2}, {"otype": "Frequency"}]}
        cfg = {"encoding": encoding, "network": NET, "optimizer": {"otype": "EMA", "nested": {"otype": "Adam"}},
               "loss": {"otype": "RelativeL2"}}
        def build_and_step():
            m = tinn.create_from_config(2, 3, cfg)
            m.trainer.training_step(x, y)
            m.network.inference(x)
            return m
        first = build_and_step()
        before = impl.get_runtime().get_num_compiled_functions()
        second = build_and_step()
        print(json.dumps({"before": before, "after": impl.get_runtime().get_num_compiled_functions(),
                          "same": bool(np.array_equal(first.network.params(), second.network.params())),
                          "offsets": [first.network.store.offset, second.network.store.offset]}))
    """)
    assert out["before"] > 0
    assert out["after"] == out["before"], out
    assert out["same"]
    assert out["offsets"][0] != out["offsets"][1]             # two stores in one arena chunk


@CPU_PROCESS
@pytest.mark.full_only("a model of 2^17-entry levels compiled cold twice; the default suite's second-model check "
                       "above shares a chunk")
@pytest.mark.parametrize("n_instances", [1, 3])
def test_a_second_model_in_a_chunk_of_its_own_compiles_no_kernel_of_tinn(n_instances):
    """A model too big to share its arena chunk: the second one, in a new chunk, compiles none of tinn's
    kernels for its creation, first step, inference and per-sample funcs (only the user's kernels that
    capture them, and the one small kernel that finds the new chunk's address on the CPU). Both models
    train alike (same seed, same data), so the shared kernels work on each model's own memory."""
    out = run(f"""
        ti.init(arch=ti.cpu, offline_cache=False, log_level=ti.ERROR)
        from compiles import compilations
        K = {n_instances}
        big = {{**GRID, "n_levels": 2, "log2_hashmap_size": 17, "base_resolution": 16, "per_level_scale": 64.0}}
        cfg = {{"encoding": big, "network": NET, "optimizer": {{"otype": "Adam"}}, "loss": {{"otype": "L2"}}}}
        xs, ys = (np.broadcast_to(a, (K,) + a.shape).copy() if K > 1 else a for a in (x, y))
        ids = np.arange(len(x), dtype=np.int32) % K
        def build_and_use():
            m = tinn.create_from_config(2, 3, cfg, n_instances=K)
            m.trainer.training_step(xs, ys)
            net = m.network
            f, ff, bf, jf = net.func, net.forward_func, net.backward_func, net.jacobian_func
            out = np.zeros((len(x), 3 + 3 + 2 + 6), np.float32)
            # one user kernel per func: Taichi's compile time grows faster than a kernel's size
            @ti.kernel
            def user_func(x: ti.types.ndarray(), ids: ti.types.ndarray(), out: ti.types.ndarray()):
                for b in range(x.shape[0]):
                    y1, y2 = f(ti.Vector([x[b, 0], x[b, 1]]), ids[b]), ff(ti.Vector([x[b, 0], x[b, 1]]), ids[b])
                    for i in ti.static(range(3)):
                        out[b, i], out[b, 3 + i] = y1[i], y2[i]
            @ti.kernel
            def user_backward(x: ti.types.ndarray(), ids: ti.types.ndarray(), out: ti.types.ndarray()):
                for b in range(x.shape[0]):
                    dx = bf(ti.Vector([x[b, 0], x[b, 1]]), ti.Vector([1.0, 0.0, 0.0]), ids[b])
                    out[b, 6], out[b, 7] = dx[0], dx[1]
            @ti.kernel
            def user_jacobian(x: ti.types.ndarray(), ids: ti.types.ndarray(), out: ti.types.ndarray()):
                for b in range(x.shape[0]):
                    y3, J = jf(ti.Vector([x[b, 0], x[b, 1]]), ids[b])
                    for i in ti.static(range(3)):
                        for d in ti.static(range(2)):
                            out[b, 8 + 2 * i + d] = J[i, d]
            for user_kernel in (user_func, user_backward, user_jacobian):
                user_kernel(x, ids, out)
            return m, net.inference(xs), out
        first = build_and_use()
        with compilations() as names:
            second = build_and_use()
        print(json.dumps({{"compiled": names, "n_params": first[0].network.n_params,
                          "same": all(bool(np.array_equal(a, b)) for a, b in zip(first[1:], second[1:])),
                          "params_same": bool(np.array_equal(first[0].network.params(), second[0].network.params())),
                          "chunks": [id(m.network.store._chunk) for m in (first[0], second[0])]}}))
    """)
    assert out["n_params"] * n_instances > tinn.params.CHUNK_MIN
    assert out["chunks"][0] != out["chunks"][1]                 # the second model got a chunk of its own
    assert sorted(out["compiled"]) == ["_addresses", "user_backward", "user_func", "user_jacobian"], out["compiled"]
    assert out["same"] and out["params_same"]


@CPU_PROCESS
@LONG_LOOP
def test_creating_and_dropping_models_keeps_memory_flat():
    out = run("""
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
        cfg = {"encoding": {"otype": "Frequency", "n_frequencies": 4}, "network": NET, "optimizer": {"otype": "EMA"}}
        marks = {}
        for i in range(1_000):
            m = tinn.create_from_config(2, 3, cfg)
            m.trainer.training_step(x, y)
            del m
            if i in (99, 999):
                gc.collect()
                marks[i] = rss()
        print(json.dumps({"trees": ti.lang.impl.get_runtime().prog.get_snode_tree_size(), **marks}))
    """)
    assert out["999"] - out["99"] < 20, out                  # MB; a leak of 1 MB per model would show 900
    assert out["trees"] < 8


def test_inference_weights_are_one_buffer_for_every_component(rng):
    """After an early inference() and EMA training, the grid's and the MLP's funcs both read the EMA
    weights: func equals inference(), and both differ from the training weights' forward()."""
    model = tinn.NetworkWithInputEncoding(2, 3, GRID, NET)
    x = rng.random((256, 2), dtype=np.float32)
    model.inference(x)                                       # builds the grid's kernels before the optimizer
    trainer = tinn.Trainer(model, tinn.create_optimizer({"otype": "EMA", "decay": 0.9,
                                                         "nested": {"otype": "Adam", "learning_rate": 1e-2}}),
                           tinn.create_loss({"otype": "L2"}))
    for _ in range(5):
        trainer.training_step(x, rng.random((256, 3), dtype=np.float32))
    f, ff = model.func, model.forward_func
    ef = model.encoding.func

    @ti.kernel
    def run_funcs(xs: ti.types.ndarray(dtype=ti.f32, ndim=2), out: ti.types.ndarray(dtype=ti.f32, ndim=2),
                  out_train: ti.types.ndarray(dtype=ti.f32, ndim=2), enc: ti.types.ndarray(dtype=ti.f32, ndim=2)):
        for b in range(xs.shape[0]):
            p = ti.Vector([xs[b, 0], xs[b, 1]])
            y, yt, e = f(p), ff(p), ef(p)
            for j in ti.static(range(3)):
                out[b, j], out_train[b, j] = y[j], yt[j]
            for j in ti.static(range(8)):
                enc[b, j] = e[j]

    out, out_train, enc = (np.zeros((256, w), np.float32) for w in (3, 3, 8))
    run_funcs(x, out, out_train, enc)
    np.testing.assert_allclose(out, model.inference(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_train, model.forward(x)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(enc, model.encoding.inference(x)[:, :8], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(trainer.params_inference(), trainer.optimizer.custom_weights(), rtol=0, atol=0)
    assert np.abs(out - out_train).max() > 1e-4              # EMA weights are not the training weights


# -- a user's fields seen from numpy --------------------------------------------------------------
X64_ONLY = "views of field memory exist on the x64 backend (elsewhere the callers copy through Taichi)"


def test_field_views_are_the_fields_own_memory(rng):
    """Fields placed with a shape (a Vector field and its ``.grad``, one laid out SoA, int32 ids): each view is the
    field's ``to_numpy()``, and what is written through it is what Taichi reads."""
    if not memory.host_memory():
        pytest.skip(X64_ONLY)
    aos = ti.Vector.field(3, ti.f32, (4, 5), needs_grad=True)
    soa = ti.Vector.field(2, ti.f32, 6, layout=ti.Layout.SOA)
    ids = ti.field(ti.i32, 7)
    fields = [aos, aos.grad, soa, ids]
    for f in fields:
        shape = f.to_numpy().shape
        values = rng.integers(-9, 9, shape) if f is ids else rng.normal(size=shape)
        f.from_numpy(values.astype(np.int32 if f is ids else np.float32))
    views = memory.field_views(fields)
    assert views is not None
    for f, v in zip(fields, views):
        np.testing.assert_array_equal(v, f.to_numpy())
        new = (v * 2 + 1).astype(v.dtype)
        v[...] = new
        np.testing.assert_array_equal(f.to_numpy(), new)


def test_field_views_refuse_fields_laid_out_otherwise():
    """Blocks of a dense in a dense, a sparse node, float64: no views (the callers copy through Taichi); off x64,
    no views at all."""
    blocked, plain = ti.field(ti.f32), ti.field(ti.f32, 8)
    ti.root.dense(ti.i, 2).dense(ti.i, 4).place(blocked)
    cases = [[blocked], [ti.field(ti.f64, 8)], [plain, blocked]]
    if memory.host_memory():                     # (sparse nodes exist on the CPU and CUDA)
        sparse = ti.field(ti.f32)
        ti.root.pointer(ti.i, 2).dense(ti.i, 4).place(sparse)
        cases.append([sparse])
    else:
        cases.append([plain])
    for fields in cases:
        assert memory.field_views(fields) is None
