"""The image example's sampler against bilinear filtering written out in NumPy, and the examples' runs."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import sample

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


@pytest.mark.parametrize("script, args", sample([
    ("mlp_learning_an_image.py", ["--steps", "2", "--batch", "4096"]),
    ("network_array_image.py", ["--seconds", "1", "--tiles", "4", "--batch", "4096"]),
], keep=[0]))
def test_example_runs(tmp_path, script, args):
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, *arch, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PSNR" in result.stdout


IMAGE_EXAMPLE = os.path.join(ROOT, "examples", "mlp_learning_an_image.py")
IMAGE, CONFIG = os.path.join(ROOT, "data", "images", "default.jpg"), "config_hash"


def run_example(*args, cwd=None):
    return subprocess.run([sys.executable, IMAGE_EXAMPLE, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_image_example_help_documents_every_argument_before_taichi_starts():
    result = run_example("--help")
    assert result.returncode == 0 and "[Taichi]" not in result.stdout + result.stderr
    for argument in ("IMAGE", "CONFIG", "--steps", "--batch", "--out", "--seed", "--gui", "--arch"):
        line = next(l for l in result.stdout.splitlines() if l.strip().startswith(argument))
        assert len(line.split()) > 2, f"{argument} is not documented: {line!r}"


ARGUMENTS_ONLY = pytest.mark.arch_independent("argument and config checks before Taichi starts")


@ARGUMENTS_ONLY
@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps: must be a positive integer"),
    (["--steps", "-3"], "--steps: must be a positive integer"),
    (["--batch", "many"], "--batch: must be a positive integer"),
    (["missing.png"], "IMAGE 'missing.png' is not a file"),
    ([IMAGE, "missing.json"], "CONFIG 'missing.json' is not a file nor a config shipped with tinn (config, "),
    ([CONFIG, IMAGE], "the order is IMAGE CONFIG"),
    ([IMAGE, IMAGE], "the order is IMAGE CONFIG"),
    ([os.path.join(ROOT, "data", "images", "LICENSE.txt")], "cannot be read as an image"),
    (["--arch", "abacus"], "--arch: invalid choice"),
], ids=["steps0", "steps-3", "batch", "missing-image", "missing-config", "swapped", "image-as-config",
        "not-an-image", "arch"])
def test_image_example_argument_errors_are_one_line(args, message, tmp_path):
    result = run_example(*args, "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert "[Taichi]" not in result.stdout                   # refused before Taichi starts


@ARGUMENTS_ONLY
@pytest.mark.parametrize("text, message", [('{"network": ', "invalid JSON at line 1"),
                                           ('{"network": {"n_neurons": "64"}}', "key 'n_neurons'")],
                         ids=["unparsable", "bad-value"])
def test_image_example_config_errors_are_one_line(text, message, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(text)
    result = run_example(IMAGE, str(config), "--steps", "1", "--out", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr
