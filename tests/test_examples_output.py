"""The examples talk and show: progress at least every few seconds (plain lines off a terminal, a tqdm bar
on one where tqdm is installed), ``--help`` gives every option's default, outputs go into ``--out`` only,
the image example draws its loss and PSNR curves, and every picture says what its panels and axes are
(:func:`has_text` finds a title in a picture's pixels)."""
import io
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)

import _progress  # noqa: E402
from _curves import SCALE, Panel, draw_panel, titled  # noqa: E402
from pictures import has_text  # noqa: E402

SCRIPTS = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py") and not f.startswith("_") and f != "nerf_data.py")
CPU_ONLY = pytest.mark.x64_only("runs examples in CPU subprocesses; nothing device-specific")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_progress_lines_come_every_few_seconds_and_at_the_end(monkeypatch):
    clock, out = Clock(), io.StringIO()
    monkeypatch.setattr(_progress.time, "perf_counter", clock)
    progress = _progress.Progress(100, "training", every=3.0, stream=out)
    shown = []
    for step in range(1, 101):
        clock.now += 0.5                           # 0.5 s per step
        before = out.getvalue().count("\n")
        progress.update(step, loss=1.0 / step, PSNR="20.00dB")
        if out.getvalue().count("\n") > before:
            shown.append(step)
    progress.close()
    assert shown == [1] + list(range(7, 100, 6)) + [100]          # the first, every 3 s (6 steps), the last
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "training: step 1/100 loss=1 PSNR=20.00dB 2.00 steps/s elapsed 0s"     # no ETA yet
    assert lines[1] == "training: step 7/100 loss=0.1429 PSNR=20.00dB 2.00 steps/s elapsed 4s ETA 46s"
    assert lines[-1] == "training: step 100/100 loss=0.01 PSNR=20.00dB 2.00 steps/s elapsed 50s ETA 0s"


def test_the_time_left_leaves_out_the_first_step(monkeypatch):
    """A first step of 30 s (compiling), then 0.5 s a step: 10 steps left take 5 s, not 10 x 30.5 / 11."""
    clock, out = Clock(), io.StringIO()
    monkeypatch.setattr(_progress.time, "perf_counter", clock)
    progress = _progress.Progress(21, "training", every=0.0, stream=out)
    clock.now += 30.0
    progress.update(1)
    for step in range(2, 12):
        clock.now += 0.5
        progress.update(step)
    assert out.getvalue().splitlines()[-1].endswith("elapsed 35s ETA 5s")


def test_a_timed_loop_shows_no_eta(monkeypatch):
    clock, out = Clock(), io.StringIO()
    monkeypatch.setattr(_progress.time, "perf_counter", clock)
    progress = _progress.Progress(None, "training", stream=out)
    clock.now += 2.0
    progress.update(4, loss="0.5")
    assert out.getvalue() == "training: step 4 loss=0.5 2.00 steps/s elapsed 2s\n"


def test_on_a_terminal_with_tqdm_installed_progress_is_a_tqdm_bar(monkeypatch):
    calls = []

    class FakeTqdm:
        def __init__(self, **kwargs):
            calls.append(("new", kwargs["total"], kwargs["desc"]))

        def update(self, n):
            calls.append(("update", n))

        def set_postfix_str(self, s, refresh=True):
            calls.append(("postfix", s))

        def write(self, s, file=None):
            calls.append(("write", s))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    progress = _progress.Progress(3, "training", stream=terminal)
    progress.update(1, loss="0.5")
    progress.write("Step#1")
    progress.update(3, loss="0.25")
    assert calls == [("new", 3, "training"), ("postfix", "loss=0.5"), ("update", 1), ("write", "Step#1"),
                     ("postfix", "loss=0.25"), ("update", 2), ("close",)]
    assert terminal.getvalue() == ""


def test_clock_reads_like_a_clock():
    assert [_progress.clock(s) for s in (4.4, 59.6, 185, 3725)] == ["4s", "1m00s", "3m05s", "1h02m"]


def test_a_curve_is_drawn_where_its_values_are():
    """A rising line over a log axis: its pixels climb from the bottom-left to the top-right corner of the
    plot area, and the panel is otherwise white and grey."""
    colour = (200, 0, 0)
    xs = np.arange(1, 101)
    img = draw_panel(Panel("LOSS", xs, 10.0 ** (xs / 25.0), log=True), 400, 200, colour)
    ys, px = np.nonzero(np.all(img == colour, axis=-1))
    assert len(px) > 300
    order = np.argsort(px)
    slope = np.polyfit(px[order], ys[order], 1)[0]
    assert slope < -0.2                                          # image rows grow downward: the line climbs
    residual = ys - np.polyval(np.polyfit(px, ys, 1), px)
    assert np.abs(residual).max() < 4                            # log10 of 10^(x/25) is a straight line
    assert set(map(tuple, img.reshape(-1, 3))) <= {colour, (255, 255, 255), (225, 225, 225), (40, 40, 40)}


def _help(script, blocked):
    """``script --help`` where ``import torch`` fails (``blocked``: a folder holding a ``torch`` that raises)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--help"], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def torch_blocked(tmp_path_factory):
    """A folder whose ``torch`` package raises ImportError: put first on PYTHONPATH, a script that imports torch
    fails."""
    folder = tmp_path_factory.mktemp("no_torch")
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text("raise ImportError('torch imported to answer --help')\n")
    return folder


def _entries(help_text):
    """The entries of an argparse help: an option's lines joined."""
    entries, body = [], help_text.split("\n\n", 2)[-1]
    for line in body.splitlines():
        if re.match(r"^  \S", line):
            entries.append(line.strip())
        elif line.startswith("    ") and entries:
            entries[-1] += " " + line.strip()
    return entries


@CPU_ONLY
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_documents_every_option_with_its_default(script, torch_blocked):
    """Every example answers ``--help`` without importing torch or starting Taichi (the torch examples parse their
    arguments first: ``--help`` is immediate), and documents each option with its default."""
    result = _help(script, torch_blocked)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Starting on arch" not in result.stdout + result.stderr, f"{script}: ti.init ran before --help"
    entries = [e for e in _entries(result.stdout) if not e.startswith("-h")]
    assert entries
    for entry in entries:
        assert "(default:" in entry, f"{script}: no default shown: {entry!r}"
        words = entry.split("(default:")[0].split()
        assert len(words) >= 3, f"{script}: no help: {entry!r}"
    out = [e for e in entries if e.startswith("--out")]
    if out:
        default = out[0].split("(default: ")[1].rstrip(")")
        assert default.split(os.sep)[0] == "out", f"{script} writes into {default!r} by default"


@CPU_ONLY
def test_the_image_example_writes_only_into_out_and_draws_its_curves(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "mlp_learning_an_image.py"), "--steps", "12",
                             "--batch", "1024"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path) == ["out"]
    assert sorted(os.listdir(tmp_path / "out")) == ["10.jpg", "12.jpg", "curves.png", "reference.jpg"]
    import imageio.v3 as iio
    curves = iio.imread(tmp_path / "out" / "curves.png")
    assert curves.ndim == 3 and curves.shape[0] > curves.shape[1] / 2          # two panels stacked
    assert "\r" not in result.stdout
    assert re.search(r"training: step 12/12 step_loss=\S+ PSNR\(step 12\)=[0-9.]+dB .* ETA 0s", result.stdout), \
        result.stdout
    assert re.search(r"Step#10: loss=\S+ \(mean of steps 1-10\)", result.stdout), result.stdout
    assert has_text(curves, "TRAINING LOSS OF EACH STEP (LOG SCALE)") and has_text(curves, "PSNR OF THE WHOLE IMAGE")


def test_has_text_finds_a_title_and_only_that_title():
    img = titled(np.zeros((20, 300, 3), np.uint8), "HELD-OUT VIEWS")
    assert has_text(img, "HELD-OUT VIEWS") and has_text(img, "OUT")
    assert not has_text(img, "HELD-OUT VIEW 2") and not has_text(img, "RENDERS")
    assert not has_text(np.zeros((20, 300, 3), np.uint8), "HELD")


def test_a_log_panel_says_so_and_labels_every_grid_line():
    """A loss falling from 1 to 1e-4 over steps 0..400: the title says LOG SCALE, the y axis reads 1, 0.1,
    0.01, 0.001 and 0.0001 at its five grid lines (log10 is linear), the x axis 0, 100, ... 400 STEPS."""
    xs = np.linspace(0, 400, 81)
    img = draw_panel(Panel("LOSS", xs, 10.0 ** (-xs / 100), log=True), 640, 220, (200, 0, 0))
    assert has_text(img, "LOSS (LOG SCALE)")
    for label in ("1", "0.1", "0.01", "0.001", "0.0001", "100", "200", "300", "400 STEPS"):
        assert has_text(img, label), label
    linear = draw_panel(Panel("PSNR DB", xs, xs / 10), 640, 220, (200, 0, 0))
    assert not has_text(linear, "LOG") and has_text(linear, "20") and has_text(linear, "30")


def test_the_image_example_titles_both_of_its_charts():
    from mlp_learning_an_image import Curve
    curve = Curve()
    curve.losses, curve.psnrs = [1.0, 0.5, 0.1], [(3, 20.0)]
    loss, psnr = curve.panels()
    assert loss.log and "LOG" in loss.title and "LOSS" in loss.title and "PSNR" in psnr.title and not psnr.log


def test_the_raymarch_and_sdf_pictures_title_their_rows_and_panels():
    import raymarch_density
    import sdf_eikonal
    views = raymarch_density.views_picture([np.zeros((4, 40, 40)), np.ones((4, 40, 40))], ["TARGETS", "PREDICTIONS"])
    assert has_text(views, "TARGETS") and has_text(views, "PREDICTIONS")
    assert views.shape == (2 * (160 + 7 * SCALE + 6), 640, 3)
    slices = sdf_eikonal.slices_picture([np.zeros((64, 64, 3))] * 3, ["TRUE SDF", "DATA ONLY", "DATA + EIKONAL"])
    for title in ("TRUE SDF", "DATA ONLY", "DATA + EIKONAL", "SLICE Z = 0.5"):
        assert has_text(slices, title), title


def test_the_network_array_picture_titles_both_reconstructions():
    import network_array_image
    img = network_array_image.compare_picture([np.zeros((64, 300, 3))] * 2, ["256 NETWORKS", "ONE NETWORK"],
                                              "30 S EACH")
    assert has_text(img, "256 NETWORKS") and has_text(img, "ONE NETWORK") and has_text(img, "30 S EACH")
