"""Nothing lost, nothing hidden, nothing hangs: step counters at their ends, interrupts anywhere in a step or a
snapshot load, processes forked after Taichi started, worker threads, and Taichi reset under a torch graph.

Interrupts are injected as a Ctrl-C lands: a ``KeyboardInterrupt`` raised at a Python line event (``sys.settrace``),
here at line events of tinn's own code during the call, one call per event: every event in the full suite on the
CPU, an evenly spread sample otherwise (``EVERY``)."""
import os
import pickle
import select
import threading

import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl

import tinn
from tinn.optimizers.step import STEP_CEILING, STEP_LIMIT

from conftest import FULL, sample
from interrupts import CFG, Interrupt, batch, full_state, line_events, model, same, weights

ON_CPU = impl.current_cfg().arch in (ti.x64, ti.arm64)
EVERY = 1 if FULL and ON_CPU else 25
"""Interrupt every line event in the full suite on the CPU; every 25th in the default suite and on other
archs (a step through Mesa's software Vulkan driver is slow; the CPU pass covers every event)."""


# -- 1. step counters ------------------------------------------------------------------------------------
def _counters_edited(m, tmp_path, value):
    """A checkpoint of ``m`` with every step counter set to ``value``."""
    good, bad = tmp_path / "good.npz", tmp_path / f"counters-{value}.npz"
    m.trainer.save(good)
    with np.load(good) as f:
        arrays = {k: (np.full_like(f[k], value) if f[k].dtype.kind in "iu" and k != "header" else f[k]) for k in f}
    np.savez(bad, **arrays)
    return bad


def test_checkpoint_counters_beyond_the_limit_are_refused(tmp_path):
    m = model()
    x, y = batch()
    m.trainer.training_step(x, y)
    before = full_state(m)
    for value in (STEP_LIMIT + 1, 2 ** 31 - 2, 2 ** 31 - 1):
        with pytest.raises(ValueError, match="counters outside"):
            m.trainer.load(_counters_edited(m, tmp_path, value))
        assert same(full_state(m), before)
    with pytest.raises(ValueError, match="step counts in"):
        state = m.trainer.optimizer.state_dict()
        state["matrix_steps"] = np.full_like(state["matrix_steps"], STEP_LIMIT + 1)
        m.trainer.optimizer.load_state_dict(state)
    assert same(full_state(m), before)


def test_checkpoint_counters_at_the_limit_keep_training(tmp_path):
    m = model()
    x, y = batch()
    m.trainer.training_step(x, y)
    m.trainer.load(_counters_edited(m, tmp_path, STEP_LIMIT))
    for _ in range(2):
        assert np.isfinite(m.trainer.training_step(x, y))
    state = m.trainer.optimizer.state_dict()
    for key in ("current_step", "matrix_steps"):
        assert np.all(state[key] == STEP_LIMIT + 2), key
    assert state["param_steps"].max() == STEP_LIMIT + 2         # (hash entries no sample reached are not stepped)
    assert state["param_steps"].min() >= STEP_LIMIT
    assert np.isfinite(m.trainer.params()).all()


def test_step_counters_saturate_instead_of_wrapping():
    """Counters that reached the ceiling (a run of two billion steps) stay there; the step stays finite and the
    bias correction is its converged value: the update equals one from a count a million steps lower."""
    x, y = batch()
    a, b = model(), model()
    for m, count in ((a, STEP_CEILING), (b, STEP_CEILING - 10 ** 6)):
        m.trainer.training_step(x, y)
        opt = m.trainer.optimizer
        for counter in (opt.matrix_steps, opt.param_steps, opt.steps_array()):
            counter.from_numpy(np.full(counter.shape, count, np.int32))
    for _ in range(3):
        a.trainer.training_step(x, y)
        b.trainer.training_step(x, y)
    counts = a.trainer.optimizer.state_dict()
    assert all(np.all(counts[k] == STEP_CEILING) for k in ("current_step", "matrix_steps", "param_steps"))
    assert np.isfinite(a.trainer.params()).all()
    np.testing.assert_array_equal(a.trainer.params(), b.trainer.params())


# -- 3. interrupts leave no hidden state -----------------------------------------------------------------------
def test_interrupt_at_every_line_of_a_training_step_leaves_no_hidden_state():
    """After a step interrupted anywhere the weights are those before or after it, and the next step gives
    exactly what it gives without the interruption (the reference ``ref``, a twin never interrupted)."""
    x, y = batch()
    a, ref = model(), model()
    a.trainer.training_step(x, y)
    ref.trainer.training_step(x, y)
    warm = model()
    warm.trainer.training_step(x, y)
    n_events = line_events(lambda: warm.trainer.training_step(x, y))       # a step after the first
    assert n_events > 200
    trajectory = [weights(ref)]

    def reference(i):                       # the weights after i steps of the reference
        while len(trajectory) <= i:
            ref.trainer.training_step(x, y)
            trajectory.append(weights(ref))
        return trajectory[i]

    i, interrupted, points = 0, 0, range(1, n_events + 1, EVERY)
    for at in points:
        interrupted += Interrupt(at).run(lambda: a.trainer.training_step(x, y))
        got = weights(a)
        if np.array_equal(got, reference(i)):
            a.trainer.training_step(x, y)
            got = weights(a)
        i += 1
        assert np.array_equal(got, reference(i)), f"interrupted at line event {at}"
    assert interrupted == len(points)
    assert same(full_state(a), full_state(ref)), "hidden optimizer state differs after the interrupted steps"


def test_interrupt_at_every_line_of_load_tcnn_loads_all_or_nothing(tmp_path):
    """Training and inference weights both the snapshot's, or both as they were (Adam keeps them equal)."""
    x, y = batch()
    m = model()
    m.trainer.training_step(x, y)
    snapshot, previous = tmp_path / "snap.json", tmp_path / "previous.json"
    m.trainer.export_tcnn(snapshot)
    loaded = m.trainer.params_inference()
    m.trainer.training_step(x, y)
    m.trainer.export_tcnn(previous)
    old = full_state(m)
    warm = model()
    warm.trainer.load_tcnn(snapshot)
    n_events = line_events(lambda: warm.trainer.load_tcnn(snapshot))
    assert n_events > 50
    for at in range(1, n_events + 1, EVERY):
        assert Interrupt(at).run(lambda: m.trainer.load_tcnn(snapshot))
        state = full_state(m)
        if not same(state, old):
            np.testing.assert_array_equal(m.trainer.params(), loaded, err_msg=f"line event {at}")
            np.testing.assert_array_equal(m.trainer.params_inference(), loaded, err_msg=f"line event {at}")
            assert same(state[1:], old[1:]), f"optimizer state changed at line event {at}"
            m.trainer.load_tcnn(previous)
            assert same(full_state(m), old)


@pytest.mark.parametrize("kind", sample(["stage", "gradient_stage"], keep=["stage"]))
def test_interrupt_at_every_line_of_a_tape_iteration_leaves_no_hidden_state(kind):
    """A user's loop: ``zero_grad``, a ``ti.ad.Tape`` around a ``tinn.ad.stage`` (or a ``gradient_stage`` and an
    Eikonal loss) and a loss kernel, then ``optimizer_step``. Interrupted at any line of tinn's code, the weights
    are those before or after the iteration, and the next iteration gives exactly what it gives without the
    interruption. (Every third line, for time: each line of the stage's own code runs in the training step's test
    too; the gradient stage on the CPU only.)"""
    if kind == "gradient_stage" and not ON_CPU:
        pytest.skip("the gradient stage's iteration through Mesa's software Vulkan driver is too slow")
    x_np, _ = batch()
    runs = []
    for seed in (3, 3):
        m = model(seed)
        x = ti.Vector.field(2, ti.f32, len(x_np), needs_grad=True)
        y = ti.Vector.field(1 if kind == "stage" else 2, ti.f32, len(x_np), needs_grad=True)
        loss = ti.field(ti.f32, (), needs_grad=True)
        x.from_numpy(x_np)

        @ti.kernel
        def total(y: ti.template(), loss: ti.template()):
            for i in y:
                loss[None] += (y[i][0] - 0.5) ** 2 if ti.static(y.n == 1) else (y[i].norm() - 1.0) ** 2

        stage = tinn.ad.stage(m.network, x, y) if kind == "stage" else tinn.ad.gradient_stage(m.network, x, y)

        def iteration(m=m, stage=stage, y=y, loss=loss, total=total):
            m.network.zero_grad()
            loss[None] = 0.0
            with ti.ad.Tape(loss=loss):
                stage()
                total(y, loss)
            m.trainer.optimizer_step()

        iteration()
        runs.append((m, iteration))
    (a, step_a), (ref, step_ref) = runs
    n_events = line_events(step_ref)            # (an iteration of the reference: the twin takes one too)
    step_a()
    assert n_events > 50 and np.array_equal(weights(a), weights(ref))
    trajectory = [weights(ref)]

    def reference(i):
        while len(trajectory) <= i:
            step_ref()
            trajectory.append(weights(ref))
        return trajectory[i]

    i = 0
    for at in range(1, n_events + 1, 3 * EVERY):
        assert Interrupt(at).run(step_a)
        got = weights(a)
        if np.array_equal(got, reference(i)):
            step_a()
            got = weights(a)
        i += 1
        assert np.array_equal(got, reference(i)), f"interrupted at line event {at}"


# -- 2. fork ------------------------------------------------------------------------------------------------
def _in_fork_child(work, timeout=60.0):
    """Run ``work()`` in a child forked from this process (Taichi initialised); its result or exception, pickled
    back; ``None`` if it did not answer within ``timeout`` seconds (the child is then killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                             # the child: report and leave at once
        os.close(read)
        try:
            try:
                result = ("ok", work())
            except BaseException as e:                       # noqa: BLE001 (reported to the parent)
                result = ("error", type(e).__name__, str(e))
            os.write(write, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], timeout)
        if not ready:
            os.kill(pid, 9)
            return None
        data = b""
        while chunk := os.read(read, 1 << 16):
            data += chunk
        return pickle.loads(data)
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.parametrize("call", ["inference", "training_step", "create_from_config", "init"])
def test_a_forked_child_gets_a_clear_error_and_the_parent_keeps_working(call):
    x, y = batch()
    m = model()
    expected = m.network.inference(x)
    work = {"inference": lambda: m.network.inference(x), "training_step": lambda: m.trainer.training_step(x, y),
            "create_from_config": lambda: model(), "init": lambda: tinn.init()}[call]
    result = _in_fork_child(work)
    assert result is not None, "the forked child hung"
    assert result[:2] == ("error", "ForkedProcessError"), result
    assert "spawn" in result[2] and "multiprocessing_context='spawn'" in result[2]
    np.testing.assert_array_equal(m.network.inference(x), expected)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.x64_only("the child starts a CPU program and compares with the parent's CPU inference")
def test_a_forked_child_that_starts_taichi_anew_can_use_new_models():
    x, y = batch()
    m = model()
    expected = model().network.inference(x)

    def work():
        ti.reset()
        ti.init(arch=ti.cpu, log_level=ti.ERROR)
        fresh = model()
        try:
            m.network.inference(x)
            old = "no error"
        except tinn.RuntimeResetError:
            old = "RuntimeResetError"
        return fresh.network.inference(x), old

    result = _in_fork_child(work, timeout=300.0)
    assert result is not None, "the forked child hung"
    assert result[0] == "ok", result
    inferred, old = result[1]
    np.testing.assert_array_equal(inferred, expected)
    assert old == "RuntimeResetError"                      # objects from before the fork stay refused


# -- 6. threads and re-init -------------------------------------------------------------------------------------
def test_first_model_of_a_config_in_a_worker_thread_works_or_names_the_thread_rule(capfd):
    """(Taichi's own assertion about the thread is not printed either.)"""
    cfg = {**CFG, "encoding": {**CFG["encoding"], "n_levels": 3, "per_level_scale": 1.7}}
    x, y = batch()
    out = {}

    def build():
        try:
            out["loss"] = model(cfg=cfg).trainer.training_step(x, y)
        except Exception as e:                              # noqa: BLE001 (checked below)
            out["error"] = e

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    if "error" in out:
        assert isinstance(out["error"], RuntimeError) and "thread that called ti.init" in str(out["error"])
        assert "main_thread_id_" not in capfd.readouterr().err
    else:
        assert np.isfinite(out["loss"])
    main = model(cfg=cfg)                                   # the main thread, and then the worker, still work
    assert np.isfinite(main.trainer.training_step(x, y))
    out.clear()
    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert "error" not in out and np.isfinite(out["loss"])


# -- 7. cheap models --------------------------------------------------------------------------------------------
def test_six_models_of_one_config_compile_no_kernel_of_their_own_whatever_chunk_they_land_in():
    """Models of ``config_hash``'s size, some kept and some dropped, so that later ones land in new chunks and in
    chunks emptied by others: after the first, each compiles at most the address probe of a new chunk
    (``_addresses``, docs/memory.md), never a kernel of its own, and trains as a first model of its seed does.
    Off the CPU (no host memory: kernels take the chunk's fields, docs/memory.md) a model that lands in a chunk
    already used compiles nothing, and one that opens a chunk compiles only kernels that take parameter memory,
    once for that chunk (which chunks exist depends on what ran before in the process: both cases are told apart)."""
    from compiles import compilations, takes_parameter_memory
    from tinn.runtime.memory import host_memory
    cfg = {"encoding": {"otype": "HashGrid", "n_levels": 16, "log2_hashmap_size": 15, "per_level_scale": 1.5},
           "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2}}
    x, y = np.random.default_rng(0).random((1024, 2), dtype=np.float32), np.zeros((1024, 3), np.float32)
    kept, losses, used = [], [], set()
    for i in range(6):
        with compilations() as names:
            m = tinn.create_from_config(2, 3, cfg, seed=i)
            losses.append(m.trainer.training_step(x, y))
            m.network.inference(x)
            m.trainer.training_step(x, y)
        chunk = id(m.network.store._chunk)
        if i and host_memory():
            assert set(names) <= {"_addresses"}, (i, names)
        elif i and chunk in used:
            assert names == [], (i, names)
        elif i:
            assert all(takes_parameter_memory(k) for k in names.kernels), (i, names)
        used.add(chunk)
        if i % 2 == 0:
            kept.append(m)
        del m
    fresh = tinn.create_from_config(2, 3, cfg, seed=5)
    assert fresh.trainer.training_step(x, y) == losses[5]
