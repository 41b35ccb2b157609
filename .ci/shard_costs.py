#!/usr/bin/env python3
"""Measured seconds per test file and arch, for splitting CI's passes into parts of equal time.

    PYTEST_ADDOPTS="--durations=0 --durations-min=0.5" bash .ci/run > ci.log
    python .ci/shard_costs.py ci.log > tests/shard_costs.json

Reads pytest's "slowest durations" lines (setup, call and teardown of each test) from the logs given (a whole
``.ci/run`` output, or single pytest logs), attributes each log section to its arch by Taichi's
``Starting on arch=...`` line, and prints ``{"cpu": {file: seconds}, "vulkan": {...}}`` (x64 counts as cpu).
``tests/conftest.py`` reads that file for ``TINN_SHARD``.
"""
import json
import re
import sys
from collections import defaultdict

DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+\.py)")
ARCH = re.compile(r"Starting on arch=(\w+)")


def costs(lines) -> dict:
    out, arch = defaultdict(lambda: defaultdict(float)), "cpu"
    for line in lines:
        m = ARCH.search(line)
        if m:
            arch = "cpu" if m.group(1) in ("x64", "arm64") else m.group(1)
            continue
        m = DURATION.match(line)
        if m:
            out[arch][m.group(2)] += float(m.group(1))
    return {a: {f: round(s, 1) for f, s in sorted(files.items())} for a, files in sorted(out.items())}


if __name__ == "__main__":
    lines = []
    for path in sys.argv[1:]:
        with open(path) as f:
            lines.extend(f)
    json.dump(costs(lines), sys.stdout, indent=1)
    print()
