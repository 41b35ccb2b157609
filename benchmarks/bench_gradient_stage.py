#!/usr/bin/env python3
"""An Eikonal step through ``tinn.ad.gradient_stage`` against the same step written with the batch API.

Model: ``config_hash`` with Softplus and one output (an SDF), 3-D points. One step of each variant, alternating in
every round; prints the medians (ms) and their ratio:

* ``stage``: ``g = ∇ₓ f(x)`` by ``tinn.ad.gradient_stage`` under ``ti.ad.Tape``, the loss ``mean (|g| - 1)²`` in a
  user kernel, the reverse through the stage (parameter gradients of the loss);
* ``batch``: ``forward``, ``backward(ctx, 1)`` for g, the loss's gradient in numpy, ``backward_backward_input``.

    python benchmarks/bench_gradient_stage.py [--points 65536] [--rounds 7] [--arch cpu]
"""
import argparse
import json

import numpy as np
import taichi as ti

import tinn
from _timing import alternating_medians


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=1 << 16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--arch", default="cpu")
    args = ap.parse_args()
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN)
    config = tinn.load_config("config_hash")
    config["network"] = dict(config["network"], activation="Softplus")
    net, n = tinn.create_from_config(3, 1, config).network, args.points
    points = np.random.default_rng(0).random((n, 3), dtype=np.float32)
    x = ti.Vector.field(3, ti.f32, n, needs_grad=True)
    g = ti.Vector.field(3, ti.f32, n, needs_grad=True)
    loss = ti.field(ti.f32, (), needs_grad=True)
    x.from_numpy(points)
    gradient = tinn.ad.gradient_stage(net, x, g)

    @ti.kernel
    def eikonal():
        for i in g:
            loss[None] += (g[i].norm() - 1.0) ** 2 / n

    def stage():
        net.zero_grad()
        with ti.ad.Tape(loss=loss):
            gradient()
            eikonal()
        ti.sync()

    ones = np.ones((n, 1), np.float32)

    def batch():
        _, ctx = net.forward(points)
        dx = net.backward(ctx, ones)
        norm = np.maximum(np.linalg.norm(dx, axis=1, keepdims=True), 1e-12)
        net.backward_backward_input(ctx, (2 * (norm - 1) / norm * dx / n).astype(np.float32), ones)

    med = alternating_medians({"stage": stage, "batch": batch}, args.rounds)
    for name, ms in med.items():
        print(f"{name:6s} {ms:8.1f} ms")
    print(f"stage / batch: {med['stage'] / med['batch']:.2f}")
    print(json.dumps({"points": n, "ms": med}))


if __name__ == "__main__":
    main()
