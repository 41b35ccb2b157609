"""Files at the edges: tcnn snapshots written whole or not at all and read strictly, checkpoints saved through
symlinks with their permissions, stale temporary files, huge and deeply nested archives, and the torch bridge
after ``ti.reset()``."""
import io
import json
import os
import resource
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import zipfile

import numpy as np
import pytest

from tinn import _files

from interrupts import Interrupt, batch, full_state, line_events, model, same


@pytest.fixture
def trained():
    m = model()
    x, y = batch()
    m.trainer.training_step(x, y)
    return m


def _snapshot(m, tmp_path, **changes):
    """A variant of ``m``'s tcnn snapshot with top-level keys replaced; its path."""
    good = tmp_path / "good.json"
    m.trainer.export_tcnn(good)
    data = json.loads(good.read_text())
    data.update(changes)
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(data))
    return path


def _float_bytes(values) -> list:
    return list(np.asarray(values, "<f4").tobytes())


# -- export_tcnn ---------------------------------------------------------------------------------------------
def test_export_tcnn_that_fails_keeps_the_previous_snapshot_and_names_the_path(trained, tmp_path):
    path = tmp_path / "snap.json"
    trained.trainer.export_tcnn(path)
    good = path.read_bytes()
    trained.trainer.training_step(*batch(seed=1))
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, limits[1]))      # a full disk (EFBIG)
    try:
        with pytest.raises(OSError) as err:
            trained.trainer.export_tcnn(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert str(path) in str(err.value) and "tcnn snapshot" in str(err.value)
    assert path.read_bytes() == good
    assert os.listdir(tmp_path) == ["snap.json"]


def test_export_tcnn_interrupted_anywhere_keeps_the_previous_snapshot(trained, tmp_path):
    path = tmp_path / "snap.json"
    trained.trainer.export_tcnn(path)
    good = path.read_bytes()
    trained.trainer.training_step(*batch(seed=1))
    n_events = line_events(lambda: trained.trainer.export_tcnn(path))
    path.write_bytes(good)
    for at in range(1, n_events + 1):
        assert Interrupt(at).run(lambda: trained.trainer.export_tcnn(path))
        data = path.read_bytes()
        if data != good:                                    # replaced whole: the new snapshot loads
            trained.trainer.load_tcnn(path)
            path.write_bytes(good)
    trained.trainer.export_tcnn(path)                       # removes what an interrupted export left
    assert os.listdir(tmp_path) == ["snap.json"]


# -- load_tcnn -------------------------------------------------------------------------------------------------
def _bad_snapshots(m):
    n = m.trainer.n_params
    good = _float_bytes(m.trainer.params_inference())
    nan = _float_bytes(np.full(n, np.nan))
    return {
        "NaN": ({"params_binary": {"bytes": nan, "subtype": None}}, "non-finite"),
        "Inf": ({"params_binary": {"bytes": _float_bytes(np.full(n, -np.inf)), "subtype": None}}, "non-finite"),
        "half Inf": ({"params_type": "__half", "params_binary": {
            "bytes": list(np.full(n, np.inf, "<f2").tobytes()), "subtype": None}}, "non-finite"),
        "bytes as floats": ({"params_binary": {"bytes": [b + 0.5 for b in good], "subtype": None}}, "float"),
        "bytes as strings": ({"params_binary": {"bytes": [str(b) for b in good], "subtype": None}}, "str"),
        "bytes as booleans": ({"params_binary": {"bytes": [bool(b % 2) for b in good], "subtype": None}}, "bool"),
        "bytes out of range": ({"params_binary": {"bytes": [256] + good[1:], "subtype": None}}, "0..255"),
        "huge integer": ({"params_binary": {"bytes": [2 ** 70] + good[1:], "subtype": None}}, "0..255"),
        "short": ({"params_binary": {"bytes": good[:-1], "subtype": None}}, "bytes"),
        "params_type a list": ({"params_type": ["float"]}, "params_type"),
        "params_type unknown": ({"params_type": "double"}, "params_type"),
        "n_params a bool": ({"n_params": True}, "n_params"),
        "n_params a float": ({"n_params": float(n)}, "n_params"),
        "n_params another model's": ({"n_params": n + 1}, "params"),
        "bytes not a list": ({"params_binary": {"bytes": "abc"}}, "params_binary"),
    }


def test_load_tcnn_refuses_bad_values_and_types_and_changes_nothing(trained, tmp_path):
    before = full_state(trained)
    for name, (changes, match) in _bad_snapshots(trained).items():
        with pytest.raises(ValueError, match=match):
            trained.trainer.load_tcnn(_snapshot(trained, tmp_path, **changes))
        assert same(full_state(trained), before), name


def test_load_tcnn_refuses_special_large_and_deep_files(trained, tmp_path):
    before = full_state(trained)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5_000 + "]" * 5_000)
    big = tmp_path / "big.json"                             # a valid JSON value far larger than a snapshot can be
    big.write_bytes(b"[" + b"0," * (64 * trained.trainer.n_params + 65536) + b"0]")
    cases = [(fifo, "regular file"), (tmp_path, "regular file"), (deep, "nested"), (big, "bytes")]
    if os.path.exists("/dev/zero"):
        cases.append(("/dev/zero", "regular file"))
    for path, match in cases:
        start = time.perf_counter()
        with pytest.raises(ValueError, match=match):
            trained.trainer.load_tcnn(path)
        assert time.perf_counter() - start < 5, path
        assert same(full_state(trained), before), path
    with pytest.raises(FileNotFoundError, match="missing.json"):         # as load: the OSError naming the path
        trained.trainer.load_tcnn(tmp_path / "missing.json")


def test_load_tcnn_rolls_back_when_a_write_fails(trained, tmp_path, monkeypatch):
    snapshot = tmp_path / "snap.json"
    trained.trainer.export_tcnn(snapshot)
    trained.trainer.training_step(*batch(seed=1))
    before = full_state(trained)
    store = trained.trainer.master_store
    writes, original = [], type(store).write

    def failing_second_write(self, *args):
        writes.append(args)
        if len(writes) == 2:
            raise MemoryError("the device ran out of memory")
        return original(self, *args)

    monkeypatch.setattr(type(store), "write", failing_second_write)
    with pytest.raises(MemoryError):
        trained.trainer.load_tcnn(snapshot)
    monkeypatch.undo()
    assert same(full_state(trained), before)


def test_json_depth_is_counted_outside_strings():
    from tinn._files import check_json_depth
    check_json_depth(b'{"a": ["[[[[\\"[[[", {"b": 1}]}', 3)
    with pytest.raises(ValueError, match="nested"):
        check_json_depth(b'{"a": ["\\\\", [{"b": []}]]}', 4)             # an escaped backslash ends no string
    check_json_depth(b'{"a": ["\\\\", [{"b": []}]]}', 5)


# -- checkpoints -------------------------------------------------------------------------------------------------
def test_save_writes_through_a_symlink(trained, tmp_path):
    target, link = tmp_path / "run42.npz", tmp_path / "latest.npz"
    trained.trainer.save(target)
    os.symlink(target, link)
    trained.trainer.training_step(*batch(seed=1))
    trained.trainer.save(link)
    assert os.path.islink(link) and os.readlink(link) == str(target)
    other = model(seed=9)
    other.trainer.load(target)
    assert same(full_state(other), full_state(trained))
    assert sorted(os.listdir(tmp_path)) == ["latest.npz", "run42.npz"]


def test_save_keeps_the_old_mode_and_gives_a_new_file_the_umasks(trained, tmp_path):
    old_umask = os.umask(0o027)
    try:
        trained.trainer.save(tmp_path / "new.npz")
        trained.trainer.export_tcnn(tmp_path / "new.json")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "new.npz").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o640
    for mode in (0o444, 0o604):
        path = tmp_path / f"{mode:o}.npz"
        trained.trainer.save(path)
        os.chmod(path, mode)
        trained.trainer.save(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == mode


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_save_removes_what_a_killed_save_left(trained, tmp_path):
    path = tmp_path / "model.npz"
    stale = tmp_path / f".tinn-model.npz.{_dead_pid()}.abc123.tmp"
    stale.write_bytes(b"x" * 1000)
    running = tmp_path / f".tinn-model.npz.{os.getppid()}.def456.tmp"      # a process that still runs
    running.write_bytes(b"y")
    unrelated = tmp_path / f".tinn-other.npz.{_dead_pid()}.ghi789.tmp"     # another destination's
    unrelated.write_bytes(b"z")
    trained.trainer.save(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["model.npz", running.name, unrelated.name])


def test_a_save_in_progress_in_another_thread_keeps_its_temporary_file(trained, tmp_path):
    path = tmp_path / "model.npz"
    started, release = threading.Event(), threading.Event()
    errors = []

    def slow(f):
        started.set()
        release.wait(30)
        f.write(b"data")

    def writer():
        try:
            _files.write_atomically(path, slow, "cannot write")
        except Exception as e:                          # noqa: BLE001 (checked below)
            errors.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    started.wait(30)
    try:
        _files.write_atomically(tmp_path / "model.npz", lambda f: f.write(b"other"), "cannot write")
    finally:
        release.set()
        thread.join()
    assert not errors and path.read_bytes() == b"data"
    assert os.listdir(tmp_path) == ["model.npz"]


@pytest.mark.full_only("writes 60,000 zip members; the default suite runs the other hostile archives")
def test_many_duplicate_members_are_refused_quickly(trained, tmp_path):
    path = tmp_path / "model.npz"
    trained.trainer.save(path)
    many = tmp_path / "many.npz"
    with warnings.catch_warnings(), zipfile.ZipFile(path) as src, zipfile.ZipFile(many, "w") as dst:
        warnings.simplefilter("ignore")                     # zipfile warns of each duplicate name
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        buf = io.BytesIO()
        np.save(buf, np.zeros(1, np.float32))
        for i in range(60_000):
            dst.writestr(f"junk{i % 30_000}.npy", buf.getvalue())
    start = time.perf_counter()
    with pytest.raises(ValueError, match="duplicate members"):
        trained.trainer.load(many)
    assert time.perf_counter() - start < 10


def test_a_header_nested_too_deep_is_a_value_error(trained, tmp_path):
    path = tmp_path / "model.npz"
    trained.trainer.save(path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f}
    before = full_state(trained)
    for text in ("[" * 100_000 + "]" * 100_000,
                 json.dumps({**json.loads(arrays["header"].tobytes()),
                             "optimizer": json.loads('{"otype": "EMA", "nested": ' * 500 + "{}" + "}" * 500)})):
        arrays["header"] = np.frombuffer(text.encode(), np.uint8)
        np.savez(tmp_path / "deep.npz", **arrays)
        with pytest.raises(ValueError, match="nested more than"):
            trained.trainer.load(tmp_path / "deep.npz")
        assert same(full_state(trained), before)


# -- re-init under a torch graph -----------------------------------------------------------------------------------
@pytest.mark.arch_independent("a subprocess that starts ti.cpu whatever TINN_ARCH is")
@pytest.mark.full_only("a torch process; the default suite checks every public method after a re-init in "
                       "test_memory")
def test_torch_backward_after_ti_reset_raises_runtime_reset_error():
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import torch, taichi as ti, tinn, tinn.torch as tcnn
        ti.init(arch=ti.cpu, log_level=ti.WARN)
        mod = tcnn.NetworkWithInputEncoding(2, 1, {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 8},
                                            {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
        y = mod(torch.rand(64, 2, requires_grad=True))
        ti.reset()
        for call in (lambda: mod(torch.rand(8, 2)), lambda: y.sum().backward()):
            try:
                call()
            except tinn.RuntimeResetError as e:
                print("RESET", e)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("RESET") == 2, result.stdout + result.stderr
