"""The image example's sampler against bilinear filtering written out in NumPy, and the examples' runs."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from mlp_learning_an_image import bilinear_lookup, pixel_centres  # noqa: E402


def reference_bilinear(image, xy):
    """Texel centres at (i + 0.5) / W; the four neighbours clamped to the image, as a CUDA texture does."""
    H, W, _ = image.shape
    px, py = xy[:, 0].astype(np.float64) * W - 0.5, xy[:, 1].astype(np.float64) * H - 0.5
    x0, y0 = np.floor(px), np.floor(py)
    tx, ty = (px - x0)[:, None], (py - y0)[:, None]
    x0, y0 = x0.astype(int), y0.astype(int)
    xa, xb = np.clip(x0, 0, W - 1), np.clip(x0 + 1, 0, W - 1)
    ya, yb = np.clip(y0, 0, H - 1), np.clip(y0 + 1, 0, H - 1)
    img = image.astype(np.float64)
    top = img[ya, xa] * (1 - tx) + img[ya, xb] * tx
    bottom = img[yb, xa] * (1 - tx) + img[yb, xb] * tx
    return top * (1 - ty) + bottom * ty


def test_bilinear_lookup_matches_the_reference(rng):
    image = rng.random((7, 11, 3), dtype=np.float32)
    xy = np.concatenate([rng.random((500, 2), dtype=np.float32),
                         np.array([[0, 0], [1, 1], [0.999, 0.001]], np.float32)])
    rgb = np.empty((len(xy), 3), np.float32)
    bilinear_lookup(image, xy, rgb)
    np.testing.assert_allclose(rgb, reference_bilinear(image, xy), atol=2e-6)


def test_pixel_centres_reproduce_the_image(rng):
    image = rng.random((5, 4, 3), dtype=np.float32)
    rgb = np.empty((20, 3), np.float32)
    bilinear_lookup(image, pixel_centres(5, 4), rgb)
    np.testing.assert_allclose(rgb.reshape(image.shape), image, atol=2e-6)


@pytest.mark.parametrize("script, args", [
    ("mlp_learning_an_image.py", ["--steps", "2", "--batch", "4096"]),
    ("network_array_image.py", ["--seconds", "1"]),
])
def test_example_runs(tmp_path, script, args):
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, *arch, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PSNR" in result.stdout
