"""Every Python block of the README and of ``docs/`` runs as written, each in its own process, from an empty
directory outside the checkout (so it can rely on nothing but the installed package).

A block preceded by ``<!-- not run: REASON -->`` is a deliberate sketch; there are at most two.
``docs/differentiable_programming.md`` marks each of its programs ``<!-- snippet: NAME -->`` and
``tests/test_differentiable_programming_guide.py`` runs them (some must crash)."""
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join("docs", "differentiable_programming.md")
BLOCK = re.compile(r"(<!-- not run: [^>]+ -->\n)?```python\n(.*?)```", re.S)


def documents():
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks():
    """``(document, line, code, sketch)`` for every ```python block."""
    found = []
    for doc in documents():
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        assert len(BLOCK.findall(text)) == text.count("```python"), f"{doc}: a ```python block is not closed"
        for m in BLOCK.finditer(text):
            found.append((doc, text.count("\n", 0, m.start(2)) + 1, m.group(2), bool(m.group(1))))
    return found


def runnable():
    return [pytest.param(code, id=f"{doc}:{line}") for doc, line, code, sketch in blocks()
            if doc != GUIDE and not sketch]


def test_the_snippets_are_found_and_few_are_sketches():
    found = blocks()
    assert sum(doc == "README.md" for doc, *_ in found) >= 3
    assert sum(sketch for *_, sketch in found) <= 2


@pytest.mark.x64_only("runs each block in a CPU subprocess; the blocks call ti.init(arch=ti.cpu)")
@pytest.mark.parametrize("code", sample(runnable(), keep=[i for i, p in enumerate(runnable()) if "torch" not in p.values[0]]))
def test_snippet_runs_from_an_empty_directory(code, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "snippet.py"             # a file: Taichi reads a kernel's source from it
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    result = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
