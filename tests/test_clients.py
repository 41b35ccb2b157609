"""tinycudann clients run unchanged on tinn (``tests/clients/``: scripts modelled on torch-ngp, instant-nsr-pl
and tcnn's own PyTorch sample, each importing ``tinycudann``): in this process after
``tinn.torch.as_tinycudann()``, and as ``python -m tinn.torch SCRIPT ARGS``. Each script checks itself
(against float64 PyTorch copies of its networks, or by its loss falling) and raises if anything is off."""
import os
import runpy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import tinn.torch  # noqa: E402

CLIENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients")
ROOT = os.path.dirname(os.path.dirname(CLIENTS))


@pytest.fixture
def tinycudann(monkeypatch):
    """``import tinycudann`` gives tinn.torch for the test; ``sys.modules`` and ``sys.argv`` restored after."""
    for name in ("tinycudann", "tinycudann.modules", "dense_mlp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert tinn.torch.as_tinycudann() is tinn.torch
    import tinycudann
    assert tinycudann is tinn.torch and tinycudann.modules is tinn.torch.modules


def _run(script, *args):
    sys.argv = [os.path.join(CLIENTS, script), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


@pytest.mark.x64_only("a training run of torch-level glue; the device path has its own tests")
def test_tcnns_image_sample_trains(tinycudann, capsys):
    _run("image_client.py", "--steps", "25")
    assert "image: loss" in capsys.readouterr().out


def test_sdf_sphere_init_through_data_and_eikonal_double_backward(tinycudann, capsys):
    _run("sdf_client.py", "--steps", "3")
    assert "matches float64" in capsys.readouterr().out


@pytest.mark.x64_only("a training run of torch-level glue; the device path has its own tests")
@pytest.mark.full_only("a third tcnn client's training run; the image and SDF clients run by default")
def test_nerf_density_and_colour_networks_train(tinycudann, capsys):
    _run("nerf_client.py", "--steps", "15")
    assert "nerf: loss" in capsys.readouterr().out


@pytest.mark.x64_only("runs a subprocess on the CPU; checks the command line, nothing device-specific")
@pytest.mark.full_only("a subprocess under python -m tinn.torch; by default its main runs scripts in this process")
def test_python_m_tinn_torch_runs_a_checkpoint_client_unchanged():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    done = subprocess.run([sys.executable, "-m", "tinn.torch", os.path.join(CLIENTS, "checkpoint_client.py")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "7168 parameters loaded, outputs match" in done.stdout


@pytest.mark.x64_only("command-line usage; nothing device-specific")
def test_python_m_tinn_torch_without_a_script_says_how_to_use_it(tmp_path):
    from tinn.torch.__main__ import main
    with pytest.raises(SystemExit, match="usage: python -m tinn.torch "):
        main([])
    with pytest.raises(SystemExit, match="no such script"):
        main([str(tmp_path / "missing.py")])


@pytest.mark.x64_only("command-line usage; nothing device-specific")
def test_python_m_tinn_torch_help_prints_the_usage_and_exits_0(capsys):
    from tinn.torch.__main__ import main
    for flag in ("-h", "--help"):
        with pytest.raises(SystemExit) as done:
            main([flag])
        assert done.value.code == 0
        assert capsys.readouterr().out.startswith("usage: python -m tinn.torch ")


@pytest.mark.x64_only("command-line error handling; nothing device-specific")
def test_a_script_error_whose_str_fails_is_reported_as_the_scripts_own(tinycudann, tmp_path):
    """The CUDA hint reads ``str(error)``; an error whose ``str()`` raises passes through unchanged."""
    from tinn.torch.__main__ import main
    script = tmp_path / "bad_str.py"
    script.write_text("class BadStr(Exception):\n    def __str__(self):\n        raise RuntimeError('str fails')\n"
                      "raise BadStr()\n")
    with pytest.raises(Exception) as raised:
        main([str(script)])
    assert type(raised.value).__name__ == "BadStr"


@pytest.mark.x64_only("command-line defaults; nothing device-specific")
@pytest.mark.parametrize("environment, threads", [({}, 1), ({"OMP_NUM_THREADS": "2"}, 2),
                                                  ({"OMP_WAIT_POLICY": "PASSIVE"}, 2)], ids=["unset", "omp", "policy"])
def test_python_m_tinn_torch_runs_torch_on_one_thread_unless_the_environment_says(tinycudann, tmp_path, monkeypatch,
                                                                                  environment, threads):
    """torch's OpenMP threads spin after each operation on the cores tinn's kernels need next (docs/torch.md):
    one torch thread by default; a thread setting in the environment is left alone."""
    from tinn.torch.__main__ import TORCH_THREAD_SETTINGS, main
    for name in TORCH_THREAD_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    script, seen = tmp_path / "threads.py", tmp_path / "threads.txt"
    script.write_text("import sys, torch\nopen(sys.argv[1], 'w').write(str(torch.get_num_threads()))\n")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        main([str(script), str(seen)])
    finally:
        torch.set_num_threads(before)
    assert int(seen.read_text()) == threads


SPAWNING_SCRIPT = '''import multiprocessing as mp
import sys
import torch
import tinycudann as tcnn
from torch.utils.data import DataLoader, Dataset

class Names(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return torch.tensor(len(tcnn.__name__))

def name(_):
    import tinycudann
    return tinycudann.__name__, tinycudann.modules.__name__

if __name__ == "__main__":
    if sys.argv[1] == "loader":
        loader = DataLoader(Names(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
        print("loader", [b.tolist() for b in loader], flush=True)
    else:
        with mp.get_context("spawn").Pool(1) as pool:
            print("pool", pool.map(name, [0]), flush=True)
'''


@pytest.mark.x64_only("runs subprocesses on the CPU; checks the command line, nothing device-specific")
@pytest.mark.full_only("spawned workers under python -m tinn.torch; by default its main runs scripts in this process")
@pytest.mark.parametrize("worker", ["pool", "loader"])
def test_python_m_tinn_torch_workers_started_with_spawn_see_tinycudann(tmp_path, worker):
    """A spawned worker re-imports the script in a fresh interpreter: its ``import tinycudann`` gives tinn.torch
    too (a Pool answers, a DataLoader's worker runs; before, the Pool hung and the DataLoader's worker died)."""
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    done = subprocess.run([sys.executable, "-m", "tinn.torch", str(script), worker], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {"loader": "loader [[10, 10]]", "pool": "pool [('tinn.torch', 'tinn.torch.modules')]"}[worker]
    assert expected in done.stdout, done.stdout
