#!/usr/bin/env python3
"""The permutohedral encoding against HashGrid: table lookups per sample, time per training step at
d = 2, 3, 4, 6, and the loss after equal training time on a 4-D and a 6-D regression task.

Both encodings take the same keys (L = 8 levels, F = 2, 2^16 entries, N_min = 8, b = 1.5) under the
same MLP (64 neurons, 2 hidden layers, ReLU), trained by Adam (lr 1e-2) on batches of 2^12 samples with
an L2 loss. HashGrid takes 1 to 4 dims; at d = 6 its stand-in is a Composite of two 3-D HashGrids (each
on half the inputs), the usual way round that limit. The regression target is
``f(x) = prod_d sin(2 pi x_d + d) + 0.5 sum_d cos(3 pi x_d)``; the loss is measured on 2^14 held-out samples.

    python benchmarks/permutohedral.py --seconds 20
"""
import argparse
import time

import numpy as np
import taichi as ti

import tinn

KEYS = {"n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 16, "base_resolution": 8,
        "per_level_scale": 1.5}
NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
       "n_hidden_layers": 2}
BATCH = 1 << 12


def encoding(name, d):
    """The config of ``name`` on d dims and its table lookups per sample."""
    L = KEYS["n_levels"]
    if name == "Permutohedral":
        return {"otype": "Permutohedral", **KEYS}, L * (d + 1)
    if d <= 4:
        return {"otype": "HashGrid", **KEYS}, L * 2 ** d
    half = d // 2
    parts = [{"otype": "HashGrid", "n_dims_to_encode": n, **KEYS} for n in (half, d - half)]
    return {"otype": "Composite", "nested": parts}, L * (2 ** half + 2 ** (d - half))


def target(x):
    d = x.shape[1]
    return (np.prod(np.sin(2 * np.pi * x + np.arange(d)), axis=1)
            + 0.5 * np.cos(3 * np.pi * x).sum(1))[:, None].astype(np.float32)


def model(name, d):
    config = {"encoding": encoding(name, d)[0], "network": NET, "loss": {"otype": "L2"},
              "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}
    return tinn.create_from_config(d, 1, config, seed=1)


def step_time(name, d, rng, steps=5):
    m = model(name, d)
    x = rng.random((BATCH, d), dtype=np.float32)
    y = target(x)
    m.trainer.training_step(x, y)                     # compiles
    t = time.perf_counter()
    for _ in range(steps):
        m.trainer.training_step(x, y)
    return (time.perf_counter() - t) / steps


def loss_after(name, d, seconds, rng):
    """(held-out L2 loss, steps) after ``seconds`` of training (the first step, which compiles, not counted)."""
    m = model(name, d)
    xs = rng.random((BATCH, d), dtype=np.float32)
    m.trainer.training_step(xs, target(xs))
    steps, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        xs = rng.random((BATCH, d), dtype=np.float32)
        m.trainer.training_step(xs, target(xs))
        steps += 1
    x = np.random.default_rng(99).random((1 << 14, d), dtype=np.float32)
    return float(np.mean((m.network.inference(x)[:, :1] - target(x)) ** 2)), steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="training time per config of the regression")
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--skip-steps", action="store_true", help="only the regression")
    args = ap.parse_args()
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN)
    rng = np.random.default_rng(0)
    print("| d | encoding | lookups / sample | ms / step (batch 4096) |")
    print("|---|---|---|---|")
    for d in () if args.skip_steps else (2, 3, 4, 6):
        for name in ("HashGrid", "Permutohedral"):
            label = name if d <= 4 or name == "Permutohedral" else "2 x HashGrid(3)"
            print(f"| {d} | {label} | {encoding(name, d)[1]} | {1e3 * step_time(name, d, rng):.1f} |", flush=True)
    print(f"\n| d | encoding | steps in {args.seconds:g} s | held-out L2 loss |")
    print("|---|---|---|---|")
    for d in (4, 6):
        for name in ("HashGrid", "Permutohedral"):
            label = name if d <= 4 or name == "Permutohedral" else "2 x HashGrid(3)"
            loss, steps = loss_after(name, d, args.seconds, rng)
            print(f"| {d} | {label} | {steps} | {loss:.4f} |", flush=True)


if __name__ == "__main__":
    main()
