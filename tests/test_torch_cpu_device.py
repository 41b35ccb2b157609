"""``python -m tinn.torch --device cpu SCRIPT``: a tinycudann script that hard-codes CUDA runs on a machine
without CUDA, for that run only; without the flag such a script stops with a line naming it.

tcnn's own ``samples/mlp_learning_an_image_pytorch.py`` (an unchanged copy in ``tests/clients/``, with
``tests/clients/common.py`` standing in for tcnn's ``scripts/common.py``) is the client."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tinn.torch._cuda_on_cpu import cuda_on_cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "tests", "clients", "mlp_learning_an_image_pytorch.py")
IMAGE = os.path.join(ROOT, "data", "images", "default.jpg")
CONFIG = os.path.join(ROOT, "tinn", "configs", "config_hash.json")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
CPU_ONLY = pytest.mark.x64_only("runs torch on the CPU; nothing device-specific in tinn")


@CPU_ONLY
def test_every_way_of_asking_for_cuda_gets_the_cpu():
    cuda = torch.device("cuda")
    with cuda_on_cpu():
        made = [torch.zeros(2, device="cuda"), torch.rand(2, 3, device=cuda), torch.tensor([1.0], device="cuda:0"),
                torch.linspace(0, 1, 5, device=cuda), torch.ones(2, device=0), torch.arange(3).cuda(),
                torch.arange(3).to("cuda"), torch.arange(3).to(cuda, torch.float64), torch.arange(3).to(0),
                torch.arange(3).to(device="cuda", dtype=torch.float16)]
        module = torch.nn.Linear(2, 2).cuda()
        other = torch.nn.Linear(2, 2).to(cuda)
        torch.cuda.synchronize()
        torch.cuda.set_device(0)
        with torch.cuda.device(0):
            inside = torch.zeros(1, device="cuda")
    assert all(t.device.type == "cpu" for t in made + [inside])
    assert [t.dtype for t in made[-3:-1]] == [torch.float64, torch.int64] and made[-1].dtype == torch.float16
    assert torch.equal(made[2], torch.tensor([1.0])) and torch.equal(made[3], torch.linspace(0, 1, 5))
    assert all(p.device.type == "cpu" for p in list(module.parameters()) + list(other.parameters()))


@CPU_ONLY
def test_a_warning_of_a_torch_call_names_the_callers_line():
    """torch's C++ warnings name the innermost Python frame: inside the mode that is the mode's, so the mode
    shows them at the line that made the call."""
    with pytest.warns(UserWarning, match="To copy construct from a tensor") as caught:
        with cuda_on_cpu():
            line = sys._getframe().f_lineno + 1
            torch.tensor([1.0, 2.0], device="cuda").new_tensor(torch.ones(2))
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


@CPU_ONLY
@NO_CUDA
def test_the_mapping_ends_with_the_run():
    with cuda_on_cpu():
        pass
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(2, device="cuda")
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.synchronize()


def _psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2) / 255.0 ** 2
    return -10 * np.log10(mse)


def _run(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    return subprocess.run([sys.executable, "-m", "tinn.torch", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@CPU_ONLY
@NO_CUDA
@pytest.mark.full_only("a cold process training tcnn's sample; the mapping's own tests run by default")
def test_tcnns_own_pytorch_sample_trains_unchanged_with_device_cpu(tmp_path):
    """11 steps at tcnn's batch of 2^16: its loss falls (about 30 -> 0.5) and its final picture is closer to
    the reference than its first one (still far: about 6 dB against 5.6); it writes only into its working
    directory."""
    import imageio.v3 as iio
    done = _run(tmp_path, "--device", "cpu", SAMPLE, IMAGE, CONFIG, "11", "result.jpg")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    losses = {int(i): float(v) for i, v in re.findall(r"Step#(\d+): loss=([0-9.e+-]+)", done.stdout)}
    assert sorted(losses) == [0, 10] and losses[10] < 0.2 * losses[0], losses
    assert sorted(os.listdir(tmp_path)) == ["0.jpg", "10.jpg", "reference.jpg", "result.jpg"]
    reference = iio.imread(tmp_path / "reference.jpg")
    assert _psnr(iio.imread(tmp_path / "result.jpg"), reference) > _psnr(iio.imread(tmp_path / "0.jpg"), reference)


@CPU_ONLY
@NO_CUDA
def test_without_the_flag_a_script_that_asks_for_cuda_is_told_about_it(tmp_path):
    done = _run(tmp_path, SAMPLE, IMAGE, CONFIG, "11")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "asks for CUDA" in last and "python -m tinn.torch --device cpu" in last and SAMPLE in last, last


@pytest.mark.parametrize("argv, message", [(["--device", "cuda", "x.py"], "--device takes only 'cpu'"),
                                           (["--device"], "--device takes only 'cpu'"),
                                           (["--device=cpu"], "usage: python -m tinn.torch [--device cpu]")])
def test_the_device_flag_is_checked(argv, message):
    from tinn.torch.__main__ import main
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(argv)
