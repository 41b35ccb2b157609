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


def test_pytorch_example_learns_as_the_native_one(tmp_path):
    torch_psnr = _final_psnr("mlp_learning_an_image_pytorch.py", tmp_path, 30, 4096)
    native_psnr = _final_psnr("mlp_learning_an_image.py", tmp_path, 30, 4096)
    assert torch_psnr > 12.0
    assert abs(torch_psnr - native_psnr) < 1.5, (torch_psnr, native_psnr)
