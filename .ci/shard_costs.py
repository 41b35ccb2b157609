#!/usr/bin/env python3
"""Measured seconds per test file and arch, for splitting CI's passes into parts of equal time.

On a quiet machine (other jobs make every figure several times larger, and unevenly):

    TINN_CI_JUNIT=/tmp/ci-junit bash .ci/run > ci.log
    python .ci/shard_costs.py /tmp/ci-junit/*.xml > tests/shard_costs.json

or from pytest's "slowest durations" lines:

    PYTEST_ADDOPTS="--durations=0 --durations-min=0" bash .ci/run > ci.log
    python .ci/shard_costs.py ci.log > tests/shard_costs.json

The default suite's seconds (the README's command, CPU; ``tests/conftest.py`` hands xdist's workers the longest
files first by them) come from a JUnit file named ``default.xml``:

    python -m pytest -q tests -p no:cacheprovider --junitxml=/tmp/ci-junit/default.xml

A JUnit XML file (``pytest --junitxml``) counts for the arch its name starts with (``.ci/run`` names them
``cpu-1.xml``, ``vulkan-3.xml``; ``default.xml`` counts as ``default``); a log is split into sections by Taichi's ``Starting on arch=...`` line.
Setup, call and teardown of every test count. ``--keep OLD.json`` keeps OLD's figure for a file and arch the
inputs do not measure (say which in the commit; OLD's ``_estimated`` note lists the figures that are not
measurements). Prints ``{"cpu": {file: seconds}, "vulkan": {...}}`` (x64
counts as cpu); ``tests/conftest.py`` reads it for ``TINN_SHARD``.
"""
import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

DURATION = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+\.py)")
ARCH = re.compile(r"Starting on arch=(\w+)")


def _arch(name: str) -> str:
    return "cpu" if name in ("x64", "arm64", "cpu") else name


def from_log(lines, out):
    arch = "cpu"
    for line in lines:
        m = ARCH.search(line)
        if m:
            arch = _arch(m.group(1))
            continue
        m = DURATION.match(line)
        if m:
            out[arch][m.group(2)] += float(m.group(1))


def test_file(classname: str) -> str:
    """``tests.test_memory`` or ``tests.test_memory.TestClass`` -> ``tests/test_memory.py``."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        if parts[n - 1].startswith("test_"):
            return "/".join(parts[:n]) + ".py"
    return "/".join(parts) + ".py"


def from_junit(path, out):
    arch = _arch(re.match(r"[a-z0-9]+", os.path.basename(path)).group(0))
    for case in ET.parse(path).getroot().iter("testcase"):
        out[arch][case.get("file") or test_file(case.get("classname", ""))] += float(case.get("time", 0))


def costs(paths, keep=None) -> dict:
    out = defaultdict(lambda: defaultdict(float))
    for path in paths:
        if path.endswith(".xml"):
            from_junit(path, out)
        else:
            with open(path) as f:
                from_log(f, out)
    for arch, files in (keep or {}).items():
        if arch.startswith("_"):                # notes, such as which figures are estimates
            continue
        for f, seconds in files.items():
            out[arch].setdefault(f, seconds)
    return {a: {f: round(s, 1) for f, s in sorted(files.items())} for a, files in sorted(out.items())}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="JUnit XML files (arch-prefixed names) or pytest logs")
    parser.add_argument("--keep", help="a previous shard_costs.json whose figures fill what the inputs lack")
    args = parser.parse_args()
    keep = None
    if args.keep:
        with open(args.keep) as f:
            keep = json.load(f)
    json.dump(costs(args.inputs, keep), sys.stdout, indent=1)
    print()
