"""Every program in docs/differentiable_programming.md runs, each in its own process (each calls ti.init).

The programs with stages (``tinn.ad``) run on the device path too (``tinn.runtime.program.FORCE``: the stages'
kernels between the fields and tinn's batches). A block marked ``expect=crash`` shows code that kills the process in Taichi 1.7.4 (an adstack overflow):
it must still do so, or the guide is out of date. The others assert their own claims (the "wrong" programs
assert that their gradients are wrong). Every program calls ``ti.init(arch=ti.cpu)``: the tests run in the CPU pass
only; the default suite runs a spread sample of the programs, the full suite (``TINN_FULL=1``) all of them.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "differentiable_programming.md")


def snippets():
    text = open(GUIDE, encoding="utf-8").read()
    found = re.findall(r"<!-- snippet: (\w+)( expect=crash)? -->\n```python\n(.*?)```", text, re.S)
    assert len(found) == text.count("```python"), "every python block of the guide must carry a snippet marker"
    return [pytest.param(code, bool(crash), id=name) for name, crash, code in found]


DEVICE_PATH = "import tinn.runtime.program\ntinn.runtime.program.FORCE = True\n"


def stage_snippets():
    return [p for p in snippets() if "tinn.ad." in p.values[0] and not p.values[1]]


pytestmark = pytest.mark.arch_independent("each program starts ti.cpu whatever TINN_ARCH is")


@pytest.mark.parametrize("code, crashes", sample(snippets(), 2))
def test_guide_program(code, crashes, tmp_path):
    run_program(code, crashes, tmp_path)


@pytest.mark.parametrize("code, crashes", sample(stage_snippets(), 1))
def test_guide_program_with_stages_on_the_device_path(code, crashes, tmp_path):
    run_program(DEVICE_PATH + code, crashes, tmp_path)


def run_program(code, crashes, tmp_path):
    path = tmp_path / "snippet.py"
    path.write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env=env)
    if crashes:
        assert result.returncode != 0, "this Taichi no longer crashes here: update the guide"
    else:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
