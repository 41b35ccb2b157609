#!/usr/bin/env python3
"""The MLP of config_hash.json (32 -> 64 -> 64 -> 3, ReLU): tinn's forward + backward against
numpy's BLAS doing the same products, in GFLOP/s, in one process, in alternating rounds.

tinn computes the products 32x64, 64x64 and 64x3 (the rows of tcnn's output layer padded to 16
meet zero gradients, so tinn skips them): per sample 2 * 6336 FLOPs forward and 2 * 2 * 6336
backward (input and weight gradients of every layer). "numpy" does exactly these products with
numpy's own threading and no activations; tinn's time includes its activations. "numpy, padded"
does tcnn's padded 64x16 output product instead, for reference.

    python benchmarks/bench_mlp.py --batches 16 18 --reps 5 --rounds 3
"""
import argparse
import statistics
import time

import numpy as np
import taichi as ti

import tinn

N_IN, WIDTH, N_OUT = 32, 64, 3


def layers(n_out):
    return [(WIDTH, N_IN), (WIDTH, WIDTH), (n_out, WIDTH)]


def flops(batch, shapes):
    return 2 * batch * 3 * sum(r * c for r, c in shapes)


def numpy_step(x, dy, weights):
    hs = [x]
    for w in weights:
        hs.append(hs[-1] @ w.T)
    g = dy
    for i in reversed(range(len(weights))):
        _ = g.T @ hs[i]
        g = g @ weights[i]
    return g


def block_medians(fns, reps, rounds=3):
    """Median time of each function over ``rounds`` rounds; in a round each function runs a warm-up call
    and then ``reps`` timed calls in a row (OpenBLAS's threads keep spinning for a while after numpy's
    threaded calls, which would slow whatever runs right after them)."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            fn()
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 18])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tinn.init(log_level=ti.WARN)
    net = tinn.create_network(N_IN, N_OUT, {"otype": "FullyFusedMLP", "n_neurons": WIDTH, "n_hidden_layers": 2})
    rng = np.random.default_rng(0)
    exact = [rng.standard_normal(s).astype(np.float32) for s in layers(N_OUT)]
    padded = exact[:-1] + [rng.standard_normal((16, WIDTH)).astype(np.float32)]
    print("| batch | tinn GFLOP/s | numpy BLAS GFLOP/s | tinn / numpy | numpy, padded output GFLOP/s |")
    print("|---|---|---|---|---|")
    for b in args.batches:
        x = rng.random((1 << b, N_IN), dtype=np.float32)
        dy = rng.standard_normal((1 << b, N_OUT)).astype(np.float32)
        dy16 = rng.standard_normal((1 << b, 16)).astype(np.float32)

        def tinn_step():
            _, ctx = net.forward(x)
            net.backward(ctx, dy)

        t_tinn, t_numpy, t_padded = block_medians(
            [tinn_step, lambda: numpy_step(x, dy, exact), lambda: numpy_step(x, dy16, padded)], args.reps, args.rounds)
        f, f16 = flops(1 << b, layers(N_OUT)) / 1e9, flops(1 << b, layers(16)) / 1e9
        print(f"| 2^{b} | {f / t_tinn:.1f} | {f / t_numpy:.1f} | {t_numpy / t_tinn:.2f}× | {f16 / t_padded:.1f} |")


if __name__ == "__main__":
    main()
