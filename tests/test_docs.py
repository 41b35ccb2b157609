"""The user docs hold together: the README stays a short user's page that keeps its two set-up commands,
every relative link of the README and of ``docs/`` points at a file that exists (and at a heading that
exists, for a link into a markdown file with ``#anchor``), and ``benchmarks/gpu_suite.py --render``
has its one pair of markers in ``docs/performance.md``."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SETUP = "pip install -e . && python examples/mlp_learning_an_image.py"
TESTS = 'pip install -e ".[test]" && python -m pytest -q -n 2 tests'


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def documents():
    docs = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return ["README.md", os.path.join("benchmarks", "README.md")] + sorted(os.path.relpath(p, ROOT) for p in docs)


def slug(heading):
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_the_readme_is_short_and_keeps_its_two_set_up_commands():
    text = read("README.md")
    assert len(text.splitlines()) <= 300
    assert f"    {SETUP}\n" in text and f"    {TESTS}\n" in text
    assert "python -m pytest -q tests" in read(os.path.join(".ci", "run"))


@pytest.mark.parametrize("doc", documents())
def test_every_relative_link_points_at_a_file(doc):
    text = re.sub(r"```.*?```", "", read(doc), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):                  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{doc}: broken links {broken}"


MACHINE = dict(date="2030-01-02", commit="abc1234", cpu="Some CPU", cores=2, command="python benchmarks/x.py --json")
RESULTS = {
    "bench_image": dict(summary={f"{impl}@{1 << 16}": dict(
        train_samples_per_s=2e6 if impl == "tinn" else 1e6, ms_per_step_median=30.0, infer_samples_per_s=None,
        psnr=30.0, peak_rss_mib=200.0, launches_per_step=7, read_backs_per_step=0) for impl in ("tinn", "torch")},
        runs={}, impls=["tinn", "torch"], batches=[1 << 16], reps=3, steps=20, threads=2, arch="cpu", machine=MACHINE),
    "bench_network_array": {**{f"{impl}@K=4096,S=64": dict(
        train_samples_per_s=4e6 if impl == "tinn" else 2e6, infer_samples_per_s=1e7, launches_per_step=3,
        read_backs_per_step=0, infer_launches_per_call=1, infer_read_backs_per_call=0) for impl in ("tinn", "torch")},
        "reps": 3, "steps": 5, "threads": 2, "arch": "cpu", "machine": MACHINE},
}


@pytest.mark.parametrize("name", ["gpu_suite", "bench_image", "bench_network_array"])
def test_a_benchmark_renders_its_table_into_performance_md(name):
    text = read(os.path.join("docs", "performance.md"))
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)
    assert begin not in read("README.md")
    usage = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{name}.py"), "--help"],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "docs/performance.md" in usage.stdout


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_the_rendered_table_comes_from_the_json_with_its_provenance(name, tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(RESULTS[name]))
    doc = tmp_path / "performance.md"
    doc.write_text(f"# t\n<!-- {name}:begin -->\nold\n<!-- {name}:end -->\nafter\n")
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{name}.py"), "--render",
                    str(tmp_path / "run.json"), "--doc", str(doc)], check=True, capture_output=True, timeout=120)
    text = doc.read_text()
    body = text.split(f"<!-- {name}:begin -->\n")[1].split(f"<!-- {name}:end -->")[0]
    assert text.endswith(f"<!-- {name}:end -->\nafter\n") and "old" not in body
    assert body.startswith("Measured on 2030-01-02 at commit `abc1234` on Some CPU (2 logical cores): "
                           "`python benchmarks/x.py --json`.")
    assert "| tinn |" in body and "| torch |" in body and "2.00×" in body
