"""``benchmarks/gpu_suite.py`` end to end without a GPU: every part at toy sizes on the CPU, one JSON file and
a markdown table, and the table of ``docs/performance.md`` rewritten between its markers and nowhere else."""
import json
import os
import subprocess
import sys

import pytest

from test_nerf import write_sphere_scene

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "benchmarks", "gpu_suite.py")
PARTS = {"image_1024_float32", "image_profile_1024_float32", "image_1024_float16", "image_profile_1024_float16",
         "torch_image_1024", "arrays", "nerf", "nerf_pytorch", "startup", "tests"}
pytestmark = pytest.mark.full_only("a chain of benchmark processes (the GPU suite's own check)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    write_sphere_scene(str(tmp / "scene"), size=16, n_train=4, n_test=1)
    out = tmp / "results.json"
    proc = subprocess.run([sys.executable, SUITE, "--arch", "cpu", "--quick", "--out", str(out),
                           "--nerf-data", str(tmp / "scene")], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return tmp, out, json.load(f)


@pytest.mark.x64_only("the suite's own check, at toy sizes on the CPU")
def test_every_part_runs_and_reports(run):
    _, _, results = run
    assert set(results["parts"]) == PARTS
    assert {k for k, v in results["parts"].items() if v["status"] != "ok"} == set()
    parts = results["parts"]
    assert parts["image_1024_float16"]["result"]["precision"] == "float16"
    assert parts["image_1024_float32"]["result"]["train_samples_per_s"] > 0
    assert parts["image_profile_1024_float32"]["result"]["profile"], "the kernel profiler's rows"
    assert "tinn@K=8,S=16" in parts["arrays"]["result"]
    assert parts["nerf"]["result"]["psnr"] > 0 and parts["nerf_pytorch"]["result"]["train_s"] > 0
    assert set(parts["startup"]["result"]["startup"]) == {"cold", "warm"}
    assert parts["tests"]["result"] == {"passed": 1}
    assert set(results["machine"]) >= {"date", "commit", "gpu", "driver", "arch"}


@pytest.mark.x64_only("the suite's own check, at toy sizes on the CPU")
def test_the_table_and_its_rewrite(run):
    tmp, out, results = run
    table = (tmp / "results.md").read_text()
    assert table.startswith(f"Measured on {results['machine']['date']} at commit `{results['machine']['commit']}`")
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| workload (`config_hash` unless said) | tinn | PyTorch | tinn / PyTorch |"
    assert all(row.count("|") == 5 for row in rows) and len(rows) >= 9
    doc = tmp / "performance.md"
    doc.write_text("# title\nbefore\n<!-- gpu_suite:begin -->\nold table\n<!-- gpu_suite:end -->\nafter\n")
    subprocess.run([sys.executable, SUITE, "--render", str(out), "--doc", str(doc)], check=True, cwd=ROOT,
                   capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert doc.read_text() == ("# title\nbefore\n<!-- gpu_suite:begin -->\n" + table +
                                  "<!-- gpu_suite:end -->\nafter\n")
    doc.write_text("no markers\n")
    bad = subprocess.run([sys.executable, SUITE, "--render", str(out), "--doc", str(doc)], cwd=ROOT,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert bad.returncode != 0 and "gpu_suite:begin" in bad.stderr and doc.read_text() == "no markers\n"
