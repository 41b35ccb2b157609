"""The PyTorch image example: its torch sampler against bilinear filtering in NumPy, and a short run that
learns about as much as the native example in the same steps."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch example needs torch (pip install -e '.[test]' installs it)")

from test_examples import ROOT, reference_bilinear  # noqa: E402
from mlp_learning_an_image_pytorch import Image  # noqa: E402


def test_torch_image_sampler_matches_the_reference(rng):
    image = rng.random((7, 11, 3), dtype=np.float32)
    xy = np.concatenate([rng.random((500, 2), dtype=np.float32),
                         np.array([[0, 0], [1, 1], [0.999, 0.001]], np.float32)])
    rgb = Image(image, "cpu")(torch.from_numpy(xy)).numpy()
    np.testing.assert_allclose(rgb, reference_bilinear(image, xy), atol=2e-6)


def _final_psnr(script, tmp_path, steps, batch):
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--steps", str(steps),
                             "--batch", str(batch), "--out", str(tmp_path / script), *arch],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
    return float(re.search(r"Final PSNR: ([0-9.]+) dB", result.stdout).group(1))


@pytest.mark.full_only("the PyTorch example's training run; the default suite checks its sampler and arguments here "
                       "and tinn.torch in test_torch")
def test_pytorch_example_learns_as_the_native_one(tmp_path):
    torch_psnr = _final_psnr("mlp_learning_an_image_pytorch.py", tmp_path, 30, 4096)
    native_psnr = _final_psnr("mlp_learning_an_image.py", tmp_path, 30, 4096)
    assert torch_psnr > 12.0
    assert abs(torch_psnr - native_psnr) < 1.5, (torch_psnr, native_psnr)


TORCH_EXAMPLES = {"mlp_learning_an_image_pytorch.py": ("image", "--steps", "--batch", "--out", "--seed", "--arch",
                                                       "--torch-threads"),
                  "distributed_image.py": ("image", "--steps", "--batch", "--instances", "--seed", "--save", "--arch"),
                  "nerf_pytorch.py": ("--data", "--steps", "--rays", "--out", "--threads", "--device")}


@pytest.fixture
def without_torch_and_taichi(tmp_path):
    """An environment where ``import torch`` and ``import taichi`` fail: what an example does before it needs them."""
    for name in ("torch", "taichi"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} imported before the arguments were "
                                                     "checked')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))


@pytest.mark.parametrize("script", sorted(TORCH_EXAMPLES))
def test_torch_examples_answer_help_and_argument_errors_before_importing_torch_or_taichi(script,
                                                                                         without_torch_and_taichi):
    def run(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], capture_output=True,
                              text=True, timeout=120, env=without_torch_and_taichi)

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    for argument in TORCH_EXAMPLES[script]:
        assert argument in helped.stdout, argument
    refused = run("--steps", "many")
    assert refused.returncode == 2 and "--steps" in refused.stderr and "Traceback" not in refused.stderr, \
        refused.stderr[-2000:]
    if script != "nerf_pytorch.py":
        missing = run("missing.png")
        assert missing.returncode == 2 and "IMAGE 'missing.png' is not a file" in missing.stderr, missing.stderr
