#!/usr/bin/env python3
"""The MLP of config_hash.json (32 -> 64 -> 64 -> 16, ReLU): tinn's forward + backward against
numpy's BLAS doing the same products, in GFLOP/s, in one process.

FLOPs per sample: forward 2 * 7168, backward 2 * 2 * 7168 (input and weight gradients of every layer).
The numpy figure is the bare products (the layers' GEMMs, no activations), with numpy's own
threading; tinn's includes its activation kernels.

    python benchmarks/bench_mlp.py --batches 16 18 --reps 5
"""
import argparse
import statistics
import time

import numpy as np
import taichi as ti

import tinn

LAYERS = [(64, 32), (64, 64), (16, 64)]


def flops(batch):
    return 2 * batch * 3 * sum(r * c for r, c in LAYERS)


def numpy_step(x, weights):
    hs = [x]
    for w in weights:
        hs.append(hs[-1] @ w.T)
    g = hs[-1]
    for i in reversed(range(len(weights))):
        _ = g.T @ hs[i]
        g = g @ weights[i]
    return g


def median_time(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 18])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    tinn.init(log_level=ti.WARN)
    net = tinn.create_network(32, 3, {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2})
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((r, c)).astype(np.float32) for r, c in LAYERS]
    print("| batch | tinn MLP fwd+bwd GFLOP/s | numpy BLAS GFLOP/s | ratio |")
    print("|---|---|---|---|")
    for b in args.batches:
        x = rng.random((1 << b, 32), dtype=np.float32)
        dy = rng.standard_normal((1 << b, 16)).astype(np.float32)

        def tinn_step():
            _, ctx = net._forward(x, None)
            net._backward(ctx, dy, True)

        t_tinn = median_time(tinn_step, args.reps)
        t_numpy = median_time(lambda: numpy_step(x, weights), args.reps)
        f = flops(1 << b) / 1e9
        print(f"| 2^{b} | {f / t_tinn:.1f} | {f / t_numpy:.1f} | {t_numpy / t_tinn:.2f}× |")


if __name__ == "__main__":
    main()
