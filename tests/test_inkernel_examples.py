"""The differentiable-programming examples run in a short mode and their error falls."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(out, script, *args):
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, *arch,
                             "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.full_only("a second in-kernel example's training run; the default suite runs the SDF one and checks "
                       "tinn.ad's stages in test_ad")
def test_raymarch_density_learns_the_volume_and_the_gain(tmp_path):
    out = run_example(tmp_path, "raymarch_density.py", "--steps", "60", "--rays", "256", "--samples", "32",
                      "--views", "12", "--size", "16")
    psnr = [float(v) for v in re.findall(r"held-out PSNR\s+([\d.]+) dB", out)]
    gains = [float(v) for v in re.findall(r"gain ([\d.]+) \(true", out)]
    assert len(psnr) >= 2 and psnr[-1] > psnr[0] + 5, out
    assert gains[-1] < gains[0], out                   # the gain moves from 1 towards the true 0.8
    assert (tmp_path / "raymarch_views.png").exists()


@pytest.mark.full_only("the raymarch example a second time, routed")
def test_raymarch_density_with_routed_micro_networks(tmp_path):
    out = run_example(tmp_path, "raymarch_density.py", "--steps", "40", "--rays", "256", "--samples", "32",
                      "--views", "12", "--size", "16", "--instances", "8")
    psnr = [float(v) for v in re.findall(r"held-out PSNR\s+([\d.]+) dB", out)]
    assert len(psnr) >= 2 and psnr[-1] > psnr[0] + 3, out


@pytest.mark.full_only("the SDF example's training run; the default suite checks its arguments here and in "
                       "test_examples_output, and tinn.ad's gradient stage with an Eikonal loss in test_ad")
def test_sdf_eikonal_fits_and_the_eikonal_term_helps(tmp_path):
    out = run_example(tmp_path / "new", "sdf_eikonal.py", "--steps", "60", "--surface", "512", "--eikonal", "512")
    errors = {name: [float(v) for v in re.findall(rf"\[{re.escape(name)}\] step .*?SDF error\| ([\d.]+)", out)]
              for name in ("data only", "data + Eikonal")}
    for name, err in errors.items():
        assert len(err) >= 2 and err[-1] < 0.5 * err[0], (name, out)
    final = dict(re.findall(r"^(data[^:]*?)\s*: mean \|SDF error\| [\d.]+, mean \|\|grad f\| - 1\| ([\d.]+)", out, re.M))
    assert float(final["data + Eikonal"]) < float(final["data only"]), out
    assert (tmp_path / "new" / "sdf_slices.png").exists()          # --out created


@pytest.mark.x64_only("argument checking before Taichi starts; nothing device-specific")
def test_sdf_eikonal_rejects_an_uncreatable_out_before_training(tmp_path):
    (tmp_path / "file").write_text("")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "sdf_eikonal.py"), "--out",
                             str(tmp_path / "file" / "sub")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--out: cannot create" in result.stderr
    assert "[Taichi] Starting" not in result.stdout + result.stderr
