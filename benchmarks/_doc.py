"""What a benchmark's ``--render`` needs: where a run happened (date, commit, CPU) and the rewrite of the lines
between a document's ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` marker comments (``docs/performance.md``
by default), so that a table a benchmark writes is generated from its JSON output, not typed."""
import datetime
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFORMANCE = os.path.join(ROOT, "docs", "performance.md")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(argv) -> dict:
    """Date, commit, CPU, its logical cores and the command of this run (``argv``: the script's arguments)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return dict(date=datetime.date.today().isoformat(), commit=commit or "unknown", cpu=cpu_name(),
                cores=os.cpu_count(), command=" ".join(["python", _relative(argv[0]), *argv[1:]]))


def _relative(path: str) -> str:
    """``path`` relative to the checkout where it lies inside it (``benchmarks/bench_image.py``)."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def heading(machine: dict) -> str:
    """The line above a rendered table: ``Measured on DATE at commit `C` on CPU (N cores): `COMMAND`.``"""
    where = machine.get("cpu", "?") + (f" ({machine['cores']} logical cores)" if machine.get("cores") else "")
    return f"Measured on {machine['date']} at commit `{machine['commit']}` on {where}: `{machine['command']}`."


def replace_between(path: str, name: str, text: str):
    """Rewrite the lines between ``path``'s one ``<!-- NAME:begin -->`` and one ``<!-- NAME:end -->`` line with
    ``text``; ``ValueError`` (the file untouched) without exactly one such pair."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    if doc.count(begin) != 1 or doc.count(end) != 1 or doc.index(begin) > doc.index(end):
        raise ValueError(f"{path}: needs one '{begin}' line before one '{end}' line")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + text.rstrip("\n") + "\n" + end + tail)
