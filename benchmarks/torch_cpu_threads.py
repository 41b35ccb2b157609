#!/usr/bin/env python3
"""tcnn's PyTorch sample under ``python -m tinn.torch --device cpu`` with each thread setting, interleaved.

Every round runs the unchanged sample (``tests/clients/mlp_learning_an_image_pytorch.py``, 11 steps at its
batch of 2^16) once per setting, each in a fresh process, in turn, so load on the machine hits all settings
alike; the figure of a run is the sample's own ``Step#10 ... time=`` line: the wall time of steps 1-10.
Prints the median per setting and its ratio to the fastest. A setting is environment variables, or a
line the script runs before the sample (as a user's own script would: ``torch.set_num_threads(n)``, or
``tinn.init(cpu_max_num_threads=n)`` for Taichi's threads). ``before:SETTING`` runs the setting with the
checkout given by ``--before DIR`` (e.g. ``git worktree add /tmp/before HEAD~1``), in the same rounds.

    python benchmarks/torch_cpu_threads.py --rounds 3
    python benchmarks/torch_cpu_threads.py --rounds 3 --before /tmp/before --settings default before:default
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "tests", "clients", "mlp_learning_an_image_pytorch.py")
IMAGE = os.path.join(ROOT, "data", "images", "default.jpg")
CONFIG = os.path.join(ROOT, "tinn", "configs", "config_hash.json")

# name: (environment, line run before the sample)
SETTINGS = {
    "default": ({}, ""),
    "OMP_NUM_THREADS=1": ({"OMP_NUM_THREADS": "1"}, ""),
    "OMP_NUM_THREADS=2": ({"OMP_NUM_THREADS": "2"}, ""),
    "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, ""),
    "torch.set_num_threads(1)": ({}, "import torch; torch.set_num_threads(1)"),
    "torch.set_num_threads(2)": ({}, "import torch; torch.set_num_threads(2)"),
    "cpu_max_num_threads=1": ({}, "import tinn; tinn.init(cpu_max_num_threads=1)"),
    "OMP_NUM_THREADS=1,cpu_max_num_threads=1": ({"OMP_NUM_THREADS": "1"},
                                                "import tinn; tinn.init(cpu_max_num_threads=1)"),
}

# The sample as a user's script that sets threads first: runs the unchanged file as __main__.
WRAPPER = """{line}
import runpy, sys
sys.argv[0] = {sample!r}
sys.path.insert(0, {sample_dir!r})
runpy.run_path({sample!r}, run_name="__main__")
"""


def run_once(name: str, tinn_dir: str, workdir: str) -> float:
    """Seconds of the sample's steps 1-10 under setting ``name``, with the tinn in ``tinn_dir``."""
    env_extra, line = SETTINGS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TINN_ARCH")}
    env.update(env_extra)
    env["PYTHONPATH"] = tinn_dir + os.pathsep + os.environ.get("PYTHONPATH", "")
    script = SAMPLE
    if line:
        script = os.path.join(workdir, "with_setting.py")
        with open(script, "w") as f:
            f.write(WRAPPER.format(line=line, sample=SAMPLE, sample_dir=os.path.dirname(SAMPLE)))
    done = subprocess.run([sys.executable, "-m", "tinn.torch", "--device", "cpu", script, IMAGE, CONFIG, "11"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    found = re.search(r"Step#10: loss=\S+ time=(\d+)", done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{name}: rc {done.returncode}\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}")
    return int(found.group(1)) * 1e-6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS),
                    choices=list(SETTINGS) + [f"before:{name}" for name in SETTINGS])
    ap.add_argument("--before", default="", help="the checkout whose tinn runs the before:SETTING settings")
    ap.add_argument("--json", action="store_true", help="also print the raw times as JSON")
    args = ap.parse_args()

    times = {name: [] for name in args.settings}
    load = []
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for name in args.settings:
                before = name.startswith("before:")
                if before and not args.before:
                    ap.error(f"{name} needs --before DIR")
                checkout = os.path.abspath(args.before if before else ROOT)
                times[name].append(run_once(name.removeprefix("before:"), checkout, workdir))
                load.append(os.getloadavg()[0])
                print(f"round {r + 1}: {name:42s} {times[name][-1]:6.2f} s per 10 steps", flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = min(medians.values())
    print(f"\nmedians of {args.rounds} rounds (1-min load average during the runs: "
          f"{min(load):.1f}-{max(load):.1f} on {os.cpu_count()} CPUs)")
    for name, m in medians.items():
        print(f"  {name:42s} {m:6.2f} s per 10 steps   {m / best:5.2f}x the fastest")
    if args.json:
        print(json.dumps({"times_s": times, "medians_s": medians, "load_avg_1min": load}))


if __name__ == "__main__":
    main()
