"""The user docs hold together: the README stays a short user's page that keeps its two set-up commands,
every relative link of the README and of ``docs/`` points at a file that exists (and at a heading that
exists, for a link into a markdown file with ``#anchor``), and ``benchmarks/gpu_suite.py --render``
has its one pair of markers in ``docs/performance.md``."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SETUP = "pip install -e . && python examples/mlp_learning_an_image.py"
TESTS = 'pip install -e ".[test]" && python -m pytest -q tests'


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
    assert f"python -m pytest -q tests" in read(os.path.join(".ci", "run"))


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


def test_the_gpu_suite_renders_into_performance_md():
    text = read(os.path.join("docs", "performance.md"))
    begin, end = "<!-- gpu_suite:begin -->", "<!-- gpu_suite:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end)
    assert begin not in read("README.md")
    usage = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--help"],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "docs/performance.md" in usage.stdout
