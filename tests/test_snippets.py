"""Every Python block of the README and of ``docs/`` runs as written, from an empty directory outside the checkout
(so it can rely on nothing but the installed package): in the full suite each in a process of its own; in the
default suite the blocks without torch one after another in one process (each from its own empty directory, as
its own ``__main__``), which saves a Python and Taichi start per block.

A block preceded by ``<!-- not run: REASON -->`` is a deliberate sketch; there are at most two.
``docs/differentiable_programming.md`` marks each of its programs ``<!-- snippet: NAME -->`` and
``tests/test_differentiable_programming_guide.py`` runs them (some must crash)."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import FULL, sample

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


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TINN_ARCH", None)
    return env


def _script(code, folder):
    """``code`` as ``folder / "snippet.py"`` (a file: Taichi reads a kernel's source from it) and an empty ``work``
    folder beside it to run in."""
    (folder / "work").mkdir(parents=True)
    script = folder / "snippet.py"
    script.write_text(code)
    return script


ONE_PROCESS = """
import json, os, runpy, sys, traceback
for script in sys.argv[1:]:
    os.chdir(os.path.join(os.path.dirname(script), "work"))
    error = ""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        error = "" if e.code in (None, 0) else f"exit status {e.code}"
    except BaseException:
        error = traceback.format_exc()[-3000:]
    print(json.dumps([script, error]), flush=True)
"""


@pytest.fixture(scope="module")
def run_in_one_process(tmp_path_factory):
    """``run(code)``: the default suite's blocks (those it selects) run together in one process at the first
    call; returns the block's traceback, or ``""``."""
    done = {}

    def run(code):
        if not done:
            codes = [p.values[0] for p in runnable() if "torch" not in p.values[0]]
            scripts = {code: str(_script(code, tmp_path_factory.mktemp("snippet"))) for code in codes}
            result = subprocess.run([sys.executable, "-c", ONE_PROCESS, *scripts.values()], env=_env(),
                                    capture_output=True, text=True, timeout=900)
            errors = dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("[\""))
            for c, script in scripts.items():
                done[c] = errors.get(script, f"did not run (exit status {result.returncode}): "
                                             f"{result.stderr[-3000:]}")
        return done[code]
    return run


@pytest.mark.x64_only("runs each block in a CPU subprocess; the blocks call ti.init(arch=ti.cpu)")
@pytest.mark.parametrize("code", sample(runnable(), keep=[i for i, p in enumerate(runnable()) if "torch" not in p.values[0]]))
def test_snippet_runs_from_an_empty_directory(code, tmp_path, run_in_one_process):
    if not FULL and "torch" not in code:
        error = run_in_one_process(code)
        assert not error, error
        return
    script = _script(code, tmp_path)
    result = subprocess.run([sys.executable, str(script)], cwd=script.parent / "work", env=_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
