#!/usr/bin/env python3
"""Two checkouts of tinn, step against step: is one slower than the other?

On a shared, noisy machine, runs of one checkout after the other drift by ±15 %. Here a worker process per
checkout holds one model and waits; the controller asks each in turn for one call (a training step, an
inference, or one phase of a step: ``fwd``, ``fb`` = forward + backward, ``opt`` = the optimizer step),
alternating which goes first, so that both see the same machine at nearly the same moment. A ratio of
the two workers' median times is one *pair*; ``--pairs`` fresh pairs of processes are started, since
some costs (where a process's memory lands) differ from process to process. Prints each pair and the
median of the pair ratios (new / old time: below 1 is faster).

    python benchmarks/compare_checkouts.py OLD_CHECKOUT NEW_CHECKOUT --workload arrays --k 4096 --samples 64
    python benchmarks/compare_checkouts.py OLD NEW --workload image --modes train infer --pairs 6
    python benchmarks/compare_checkouts.py OLD NEW --workload grid --modes fwd bwd fb --samples 262144

Workloads: ``arrays`` (``bench_network_array.py``'s: K networks, S samples each, a dense batch),
``image`` (``config_hash.json`` at a batch of 2^16 random samples) and ``grid`` (``config_hash.json``'s
HashGrid alone: ``fwd`` its forward, ``bwd`` its backward to the parameters, ``fb`` both). Each checkout runs
its own tinn.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ARRAY_CONFIG = {"loss": {"otype": "RelativeL2"},
                "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                              "l2_reg": 0.0},
                "encoding": {"otype": "Frequency", "n_frequencies": 4},
                "network": {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2}}


def worker(workload: str, k: int, samples: int):
    """Build the model, then time one call per line of stdin (``train``, ``infer``, ``fwd``, ``fb``, ``opt``;
    ``grid``: ``fwd``, ``bwd``, ``fb``)."""
    import numpy as np
    import taichi as ti
    import tinn
    tinn.init(arch=ti.cpu, log_level=ti.ERROR)
    rng = np.random.default_rng(0)
    old = os.path.join("data", "config_hash.json")         # where checkouts before the shipped configs kept it
    if workload == "grid":
        config = tinn.load_config(old if os.path.isfile(old) else "config_hash")["encoding"]
        grid = tinn.create_encoding(2, config)
        x = rng.random((samples, 2), dtype=np.float32)
        dy = rng.standard_normal((samples, grid.n_output_dims), dtype=np.float32)
        ctx = grid.forward(x)[1]
        calls = {"fwd": lambda: grid.forward(x), "bwd": lambda: grid.backward(ctx, dy, input_gradient=False),
                 "fb": lambda: grid.backward(grid.forward(x)[1], dy, input_gradient=False)}
        for _ in range(3):
            calls["fb"]()
        return serve(calls)
    if workload == "image":
        model = tinn.create_from_config(2, 3, old if os.path.isfile(old) else "config_hash")
        x, y = rng.random((samples, 2), dtype=np.float32), rng.random((samples, 3), dtype=np.float32)
    else:
        model = tinn.create_from_config(2, 3, ARRAY_CONFIG, n_instances=k)
        x, y = rng.random((k, samples, 2), dtype=np.float32), rng.random((k, samples, 3), dtype=np.float32)
    trainer = model.trainer
    calls = {"train": lambda: trainer.training_step(x, y), "infer": lambda: model.network.inference(x),
             "fwd": lambda: trainer.forward(x, y), "fb": lambda: trainer.backward(trainer.forward(x, y)),
             "opt": trainer.optimizer_step}
    for _ in range(3):
        calls["train"]()
        calls["infer"]()
    serve(calls)


def serve(calls):
    """Time one call per line of stdin, once ``ready`` is printed."""
    print("ready", flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        calls[line.strip()]()
        print(f"time {time.perf_counter() - t}", flush=True)


def start(root: str, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--workload", args.workload, "--k", str(args.k),
           "--samples", str(args.samples)]
    proc = subprocess.Popen(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=root), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    while proc.stdout.readline().strip() != "ready":           # Taichi's banner comes first
        if proc.poll() is not None:
            raise SystemExit(f"the worker of {root} exited with {proc.returncode}")
    return proc


def ask(proc, mode: str) -> float:
    proc.stdin.write(mode + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    while not line.startswith("time "):
        line = proc.stdout.readline()
    return float(line.split()[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", nargs="?")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--workload", choices=("arrays", "image", "grid"), default="arrays")
    ap.add_argument("--k", type=int, default=4096, help="networks (arrays)")
    ap.add_argument("--samples", type=int, default=None, help="per network (arrays: 64), or the batch (image: 2^16)")
    ap.add_argument("--modes", nargs="+", default=["train", "infer"], choices=("train", "infer", "fwd", "bwd", "fb", "opt"))
    ap.add_argument("--calls", type=int, default=30, help="timed calls per mode and worker")
    ap.add_argument("--pairs", type=int, default=6, help="pairs of worker processes")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.samples = args.samples or (64 if args.workload == "arrays" else 1 << 16)
    if args.worker:
        return worker(args.workload, args.k, args.samples)
    ratios = {mode: [] for mode in args.modes}
    for pair in range(args.pairs):
        procs = {"old": start(args.old, args), "new": start(args.new, args)}
        times = {(name, mode): [] for name in procs for mode in args.modes}
        for i in range(args.calls):
            for mode in args.modes:
                for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    times[(name, mode)].append(ask(procs[name], mode))
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
        line = []
        for mode in args.modes:
            old, new = (statistics.median(times[(name, mode)]) for name in ("old", "new"))
            ratios[mode].append(new / old)
            line.append(f"{mode} {1e3 * old:.1f} / {1e3 * new:.1f} ms ({new / old:.3f})")
        print(f"pair {pair}: " + "; ".join(line), flush=True)
    for mode, r in ratios.items():
        print(f"{mode}: new / old time, median of {len(r)} pairs {statistics.median(r):.3f} "
              f"(pairs {min(r):.3f}-{max(r):.3f})")


if __name__ == "__main__":
    main()
