#!/usr/bin/env python3
"""Every GPU figure of docs/performance.md in one run (<= 8 minutes on one GPU): one JSON file, one markdown table.

    python benchmarks/gpu_suite.py [--arch cuda] [--out gpu_suite.json]       # measure
    python benchmarks/gpu_suite.py --render gpu_suite.json [--doc docs/performance.md]  # rewrite its table

Parts, each a subprocess with its own time limit (a part that fails or runs out of time is recorded as such
and the others still run; all limits together stay within ``--budget`` seconds):

* ``image``: ``benchmarks/tinn_image.py`` (``config_hash``) at batch 2^18 and 2^20, float32 and float16:
  300 timed steps and the inference of the image, then 50 steps under Taichi's kernel profiler (its table);
* ``torch_image``: ``benchmarks/peers/torch_image.py``, PyTorch's same workload, at the same batches;
* ``arrays``: ``benchmarks/bench_network_array.py``, K = 4096 networks of 64 / 256 samples, tinn and ``bmm``;
* ``nerf`` / ``nerf_pytorch``: ``examples/nerf.py`` and ``examples/nerf_pytorch.py``, the default run;
* ``startup``: ``benchmarks/compile_times.py``, cold (empty Taichi cache) and warm start-up and first steps;
* ``tests``: the device test files under ``TINN_ARCH`` = the arch (pytest-xdist's ``-n 2`` if installed).

``--arch cpu --quick`` runs every part at toy sizes (the suite's own test: ``tests/test_gpu_suite.py``).
``--render`` writes the table, with the date, commit, GPU and driver of the run, between the
``<!-- gpu_suite:begin -->`` and ``<!-- gpu_suite:end -->`` lines of ``docs/performance.md`` (or ``--doc FILE``).
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import _doc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEVICE_TESTS = ["tests/test_device_step.py", "tests/test_fused_arrays.py", "tests/test_torch_device.py",
                "tests/test_mixed_precision.py", "tests/test_optimizer_device.py", "tests/test_grid_block.py"]
QUICK_TESTS = ["tests/test_grid_block.py::test_block_budget"]


class Part:
    """One measurement: a command, its time limit, and how its output becomes a result dict."""

    def __init__(self, name, argv, limit, parse, env=None, what=""):
        self.name, self.argv, self.limit, self.parse, self.env, self.what = name, argv, limit, parse, env or {}, what

    def run(self, deadline):
        """{status: ok | failed | timeout | skipped, seconds, result, tail}, the part cut at ``deadline``."""
        limit = min(self.limit, deadline - time.monotonic())
        if limit < 5:
            return dict(status="skipped", seconds=0.0, result=None, tail="no time left in the suite's budget")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                   **self.env)
        env.pop("TINN_SHARD", None)       # a suite run inside a CI part runs its tests whole, not that part's share
        t = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, *self.argv], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return dict(status="timeout", seconds=round(time.monotonic() - t, 1), result=None, tail=out[-2000:])
        seconds = round(time.monotonic() - t, 1)
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-1500:]).strip()
        result = None
        try:
            result = self.parse(proc.stdout, proc.stderr)
        except (ValueError, KeyError, IndexError) as e:      # no result in the output: the part failed
            tail += f"\n(no result: {e})"
        ok = proc.returncode == 0 and result is not None
        return dict(status="ok" if ok else "failed", seconds=seconds, result=result, tail=tail if not ok else "")


# -- parsers of the sub-benchmarks' outputs -------------------------------------------------------------------
def last_json_line(stdout, stderr=""):
    return json.loads(stdout.strip().splitlines()[-1])


def last_json_block(stdout, stderr=""):
    """The last JSON document printed with indentation (``--json`` of bench_network_array / compile_times)."""
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def kernel_profile(stdout, stderr):
    """The run's JSON line and the kernel profiler's rows (Taichi prints ``[ 45.2%] time ... kernel``)."""
    result = last_json_line(stdout)
    rows = [line.strip() for line in (stdout + "\n" + stderr).splitlines() if re.match(r"\s*\[\s*[\d.]+%\]", line)]
    result["profile"] = rows[:25]
    return result


def pytest_summary(stdout, stderr=""):
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", stdout.splitlines()[-1])}
    if not counts:
        raise ValueError("no pytest summary line")
    return counts


# -- the parts -------------------------------------------------------------------------------------------------
def parts(args):
    quick, arch = args.quick, args.arch
    torch_device = "cuda" if arch == "cuda" else "cpu"
    batches = [1 << 10] if quick else [1 << 18, 1 << 20]
    steps, profile_steps = (3, 2) if quick else (300, 50)
    image = [os.path.join("benchmarks", "tinn_image.py"), "--arch", arch, "--warmup", "2"]
    out = []
    for batch in batches:
        for precision in ("float32", "float16"):
            tag = f"{batch}_{precision}"
            run = image + ["--batch", str(batch), "--precision", precision]
            out.append(Part(f"image_{tag}", run + ["--steps", str(steps)], 120, last_json_line,
                            what=f"tinn, batch {batch}, {precision}"))
            out.append(Part(f"image_profile_{tag}", run + ["--steps", str(profile_steps), "--no-infer",
                                                           "--kernel-profile"], 90, kernel_profile))
        out.append(Part(f"torch_image_{batch}", [os.path.join("benchmarks", "peers", "torch_image.py"), "--device",
                                                  torch_device, "--batch", str(batch), "--steps", str(steps)],
                        90, last_json_line, what=f"PyTorch, batch {batch}"))
    arrays = ["--k", "8", "--samples", "16", "--steps", "2", "--impls", "tinn"] if quick else \
        ["--k", "4096", "--samples", "64", "256", "--impls", "tinn", "torch"]
    out.append(Part("arrays", [os.path.join("benchmarks", "bench_network_array.py"), "--arch", arch, "--reps", "1",
                               "--json", *arrays], 150, last_json_block))
    if not quick:                                          # the fused MLP's tilings (S, T, blocks), timed
        out.append(Part("fused_sweep", [os.path.join("benchmarks", "fused_mlp.py"), "sweep", "--arch", arch,
                                        "--reps", "20", "--json"], 90, last_json_line))
    scene = ["--data", args.nerf_data] if args.nerf_data else []
    small = ["--steps", "4", "--rays", "64", "--samples", "8", "--occupancy", "8", "--turntable", "1",
             "--test-views", "1", "--downscale", "1"] if quick else []
    nerf_out = ["--out", os.path.join(args.scratch, "nerf"), "--json"]
    out.append(Part("nerf", [os.path.join("examples", "nerf.py"), "--arch", arch, *scene, *small, *nerf_out],
                    150, last_json_line))
    out.append(Part("nerf_pytorch", [os.path.join("examples", "nerf_pytorch.py"), "--device", torch_device, *scene,
                                     *small, *nerf_out], 90, last_json_line))
    cases = ["startup"] if quick else ["startup", "train", "inference"]
    out.append(Part("startup", [os.path.join("benchmarks", "compile_times.py"), "--arch", arch, "--json",
                                "--cases", *cases], 150, last_json_block))
    xdist = ["-n", "2"] if importlib.util.find_spec("xdist") and not quick else []
    out.append(Part("tests", ["-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist,
                              *(QUICK_TESTS if quick else DEVICE_TESTS)], 150, pytest_summary,
                    env={"TINN_ARCH": arch}))
    return out


def machine(arch):
    """Date, commit, GPU and driver of this run (``nvidia-smi`` where there is one)."""
    def output(cmd):
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    gpu = output(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    name, driver = (gpu[0].split(", ", 1) + [""])[:2] if gpu else (f"none ({arch})", "")
    return dict(date=datetime.date.today().isoformat(), commit=output(["git", "rev-parse", "--short", "HEAD"]),
                gpu=name, driver=driver, arch=arch, python=sys.version.split()[0])


# -- the table -------------------------------------------------------------------------------------------------
def fmt(value, spec=".1f"):
    return "–" if value is None else format(value, spec)


def get(results, name, key):
    part = results["parts"].get(name, {})
    return (part.get("result") or {}).get(key) if part.get("status") == "ok" else None


def ratio(a, b):
    """``a / b`` formatted as ``1.27×``, or ``–``."""
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def markdown(results):
    """The table of ``results`` (a run's JSON): workload | tinn | PyTorch | tinn / PyTorch."""
    m = results["machine"]
    rows = [f"Measured on {m['date']} at commit `{m['commit']}` on {m['gpu']}"
            + (f" (driver {m['driver']})" if m["driver"] else "") + f" by `benchmarks/gpu_suite.py`"
            + (" (--quick)" if results.get("quick") else "") + ":", "",
            "| workload (`config_hash` unless said) | tinn | PyTorch | tinn / PyTorch |", "|---|---|---|---|"]
    for batch in results["batches"]:
        t = get(results, f"image_{batch}_float32", "train_samples_per_s")
        p = get(results, f"torch_image_{batch}", "train_samples_per_s")
        ms_t = get(results, f"image_{batch}_float32", "ms_per_step")
        ms_p = get(results, f"torch_image_{batch}", "ms_per_step")
        rows.append(f"| training, batch {batch}: M samples/s (ms per step) | {fmt(t and t / 1e6)} ({fmt(ms_t, '.2f')}) "
                    f"| {fmt(p and p / 1e6)} ({fmt(ms_p, '.2f')}) | {ratio(t, p)} |")
        h = get(results, f"image_{batch}_float16", "train_samples_per_s")
        rows.append(f"| the same in float16: M samples/s, PSNR | {fmt(h and h / 1e6)}, "
                    f"{fmt(get(results, f'image_{batch}_float16', 'psnr'), '.2f')} dB | | {ratio(h, p)} |")
        rows.append(f"| then the image's inference: M samples/s (PSNR dB) | "
                    f"{fmt((get(results, f'image_{batch}_float32', 'infer_samples_per_s') or 0) / 1e6 or None)} "
                    f"({fmt(get(results, f'image_{batch}_float32', 'psnr'), '.2f')}) | "
                    f"{fmt((get(results, f'torch_image_{batch}', 'infer_samples_per_s') or 0) / 1e6 or None)} "
                    f"({fmt(get(results, f'torch_image_{batch}', 'psnr'), '.2f')}) | |")
    first = f"image_{results['batches'][0]}_float32"
    counts = [get(results, first, k) for k in ("launches_per_step", "read_backs_per_step", "infer_launches_per_call",
                                               "infer_read_backs_per_call")]
    rows.append("| launches / read-backs: a training step; an inference call | "
                f"{' / '.join(map(str, counts[:2]))}; {' / '.join(map(str, counts[2:]))} | | |")
    arrays = (results["parts"].get("arrays") or {}).get("result") or {}
    for key, value in sorted(arrays.items()):
        if key.startswith("tinn@"):
            peer = arrays.get("torch@" + key.split("@", 1)[1], {})
            for mode in ("train", "infer"):
                a, b = value.get(f"{mode}_samples_per_s"), peer.get(f"{mode}_samples_per_s")
                rows.append(f"| network arrays {key.split('@', 1)[1]}, {mode}: M samples/s | {fmt(a and a / 1e6)} | "
                            f"{fmt(b and b / 1e6)} | {ratio(a, b)} |")
    n, q = [(results["parts"].get(k) or {}).get("result") or {} for k in ("nerf", "nerf_pytorch")]
    rows.append(f"| NeRF default run: held-out PSNR dB (training s) | {fmt(n.get('psnr'), '.2f')} "
                f"({fmt(n.get('train_s'))}) | {fmt(q.get('psnr'), '.2f')} ({fmt(q.get('train_s'))}) | |")
    startup = (results["parts"].get("startup") or {}).get("result") or {}
    s = startup.get("startup", {})
    rows.append(f"| start-up to a first step done, cold / warm Taichi cache: s | "
                f"{fmt((s.get('cold') or {}).get('startup'), '.2f')} / "
                f"{fmt((s.get('warm') or {}).get('startup'), '.2f')}"
                f" | | |")
    tests = results["parts"].get("tests", {})
    counts = tests.get("result") or {}
    rows.append(f"| device tests (`TINN_ARCH={m['arch']}`) | " +
                (", ".join(f"{v} {k}" for k, v in counts.items()) or tests.get("status", "–")) + " | | |")
    failed = [k for k, v in results["parts"].items() if v["status"] != "ok"]
    if failed:
        rows += ["", "Not measured (failed, out of time or skipped): " + ", ".join(f"`{k}`" for k in failed) + "."]
    return "\n".join(rows) + "\n"


def render(results, doc):
    """Rewrite the lines between ``doc``'s ``gpu_suite`` markers with ``markdown(results)``."""
    _doc.replace_between(doc, "gpu_suite", markdown(results))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="cuda", help="Taichi arch of tinn's parts (PyTorch: cuda on cuda, else cpu)")
    ap.add_argument("--quick", action="store_true", help="toy sizes: checks the suite, measures nothing")
    ap.add_argument("--out", default="gpu_suite.json", help="the JSON file; the table goes next to it (.md)")
    ap.add_argument("--budget", type=float, default=480, help="seconds for all parts together")
    ap.add_argument("--only", nargs="+", help="run only the parts whose names start with these")
    ap.add_argument("--nerf-data", help="a NeRF-synthetic folder for the NeRF parts (default: the examples' scene)")
    ap.add_argument("--render", metavar="JSON", help="write the table of --doc from a run's JSON, measure nothing")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "performance.md"),
                    help="the markdown file whose table --render rewrites (default: docs/performance.md)")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            render(json.load(f), args.doc)
        print(f"rewrote the table of {args.doc}")
        return
    args.scratch = os.path.splitext(os.path.abspath(args.out))[0] + "_files"
    os.makedirs(args.scratch, exist_ok=True)
    deadline = time.monotonic() + args.budget
    results = dict(machine=machine(args.arch), quick=args.quick, parts={},
                   batches=[1 << 10] if args.quick else [1 << 18, 1 << 20])
    for part in parts(args):
        if args.only and not any(part.name.startswith(o) for o in args.only):
            continue
        print(f"{part.name} ...", end=" ", flush=True)
        results["parts"][part.name] = r = part.run(deadline)
        print(f"{r['status']} ({r['seconds']} s)", flush=True)
        with open(args.out, "w") as f:              # written after every part: a killed suite keeps the rest
            json.dump(results, f, indent=1)
    table = markdown(results)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
