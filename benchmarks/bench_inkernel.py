#!/usr/bin/env python3
"""Training through a user's Taichi ray marcher: ``tinn.ad.stage`` against the batch API and per-sample funcs.

Workload: examples/raymarch_density.py's scene (Gaussian blobs in the unit cube, orthographic views,
pixel = gain * (1 - exp(-sum sigma dt)), sigma = softplus(network)), R rays per step with S jittered
samples, HashGrid + MLP (or ``--instances K`` routed micro-networks), Adam. One training step of:

* ``stage``: the example's program: sampling kernel, ``tinn.ad.stage`` under ``ti.ad.Tape`` with the
  compositing kernels differentiated by Taichi, ``trainer.optimizer_step()``;
* ``batch``: the same step written against the batch API: sample points and composite in NumPy,
  ``network.forward`` / ``network.backward`` on the points inside the cube, ``optimizer_step()``;
* ``per-sample``: user kernels calling ``forward_func`` per sample and a hand-written backward kernel
  calling ``backward_func`` per sample (parameter gradients by atomics), ``optimizer_step()``.

Each path trains its own copy of the model (same initial parameters, same rays). The paths alternate
within each round; the figures are medians over all rounds of rays/s per step.

    python benchmarks/bench_inkernel.py [--rays 1024] [--samples 48] [--rounds 5] [--steps 5]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import taichi as ti

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import tinn  # noqa: E402
from raymarch_density import GRID, HALF, MICRO, NET, OPTIMIZER, Marcher, cameras, render_views  # noqa: E402


def model(instances):
    encoding = GRID if instances == 1 else MICRO
    net = tinn.NetworkWithInputEncoding(3, 1, encoding, NET, n_instances=instances, seed=7)
    return net, tinn.Trainer(net, tinn.create_optimizer(OPTIMIZER), tinn.create_loss({"otype": "L2"}))


def softplus(v):
    return np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))


class BatchPath:
    """The step against the batch API, with the marcher's sampling and compositing in NumPy."""

    def __init__(self, net, trainer, samples, cells):
        self.net, self.trainer, self.S, self.cells, self.gain = net, trainer, samples, cells, 1.0

    def step(self, o, d, jitter, target):
        S, dt = self.S, np.float32(2 * HALF / self.S)
        p = o[:, None, :] + ((np.arange(S, dtype=np.float32) + jitter) * dt)[..., None] * d[:, None, :]
        inside = (p >= 0).all(-1) & (p < 1).all(-1)
        pts = p[inside]
        ray = np.nonzero(inside)[0]
        inst = None
        if self.cells > 1:
            cell = np.clip(np.floor(pts * self.cells).astype(np.int32), 0, self.cells - 1)
            inst = ((cell[:, 2] * self.cells + cell[:, 1]) * self.cells + cell[:, 0]).astype(np.int32)
            pts = (pts * self.cells - cell).astype(np.float32)
        raw, ctx = self.net.forward(np.ascontiguousarray(pts), inst)
        raw = raw[:, 0]
        tau = np.bincount(ray, weights=softplus(raw) * dt, minlength=len(o))
        opacity = 1 - np.exp(-tau)
        pixel = self.gain * opacity
        dL_dpixel = 2 * (pixel - target) / len(o)
        g = (dL_dpixel * self.gain * (1 - opacity))[ray] / (1 + np.exp(-raw)) * dt
        self.net.backward(ctx, g.astype(np.float32)[:, None], input_gradient=False)
        self.trainer.optimizer_step(active=None if inst is None else np.unique(inst))
        return float(np.mean((pixel - target) ** 2)), float(np.sum(dL_dpixel * opacity))


class StagePath:
    def __init__(self, net, trainer, rays, samples, cells):
        self.marcher, self.trainer = Marcher(net, rays, samples, cells), trainer
        self.marcher.gain[None] = 1.0

    def step(self, o, d, jitter, target):
        m = self.marcher
        m.set_rays(o, d, jitter)
        m.target.from_numpy(target)
        loss = m.loss_and_gradients()
        self.trainer.optimizer_step(active=m.density.active)
        return loss, float(m.gain.grad[None])


class PerSamplePath:
    """forward_func in the user's forward kernel; the marcher's backward written by hand, calling
    backward_func per sample."""

    def __init__(self, net, trainer, rays, samples, cells):
        self.net, self.trainer = net, trainer
        m = self.marcher = Marcher(net, rays, samples, cells)
        m.gain[None] = 1.0
        f, bf, dt, routed = net.forward_func, net.backward_func, 2 * HALF / samples, cells > 1
        pts, inst, inside, raw, tau, target, gain = m.pts, m.instance, m.inside, m.raw, m.tau, m.target, m.gain

        @ti.kernel
        def forward():
            for r, j in pts:
                if inside[r, j]:
                    v = f(pts[r, j], inst[r, j] if ti.static(routed) else 0)
                    raw[r, j] = v
                    tau[r] += (ti.max(v[0], 0.0) + ti.log(1.0 + ti.exp(-ti.abs(v[0])))) * dt

        @ti.kernel
        def backward():
            for r, j in pts:
                if inside[r, j]:
                    opacity = 1.0 - ti.exp(-tau[r])
                    dL_dpixel = 2.0 * (gain[None] * opacity - target[r]) / pts.shape[0]
                    g = dL_dpixel * gain[None] * (1.0 - opacity) / (1.0 + ti.exp(-raw[r, j][0])) * dt
                    bf(pts[r, j], ti.Vector([g]), inst[r, j] if ti.static(routed) else 0)

        self._forward, self._backward = forward, backward

    def step(self, o, d, jitter, target):
        m = self.marcher
        m.set_rays(o, d, jitter)
        m.target.from_numpy(target)
        m._reset()
        self._forward()
        m._shade()
        self.net.zero_grad()
        self._backward()
        self.trainer.optimizer_step()
        pixel = m.pixel.to_numpy()
        return float(np.mean((pixel - target) ** 2)), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rays", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per path per round")
    ap.add_argument("--per-sample-steps", type=int, default=1, help="timed steps of the per-sample path per round")
    ap.add_argument("--paths", nargs="+", default=["stage", "batch", "per-sample"])
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tinn.init(getattr(ti, args.arch))
    cells = round(args.instances ** (1 / 3))
    R, S = args.rays, args.samples

    scene = Marcher(model(args.instances)[0], R, S, cells)
    o_all, d_all = cameras(24, 40)
    target_all = render_views(scene, o_all, d_all, truth=True)

    paths = {}
    for name in args.paths:
        net, trainer = model(args.instances)
        paths[name] = {"stage": lambda: StagePath(net, trainer, R, S, cells),
                       "batch": lambda: BatchPath(net, trainer, S, cells),
                       "per-sample": lambda: PerSamplePath(net, trainer, R, S, cells)}[name]()
    rng = np.random.default_rng(0)

    def batch_of_rays():
        idx = rng.integers(0, len(o_all), R)
        return o_all[idx], d_all[idx], rng.random((R, S), dtype=np.float32), target_all[idx]

    # step 0 from identical parameters and rays: the paths agree on the loss and the gain's gradient
    rays = batch_of_rays()
    first = {name: p.step(*rays) for name, p in paths.items()}
    for name, (loss, dgain) in first.items():
        print(f"# step 0 {name:10s}: loss {loss:.6f}" + ("" if dgain is None else f"  dL/dgain {dgain:.6f}"))

    times = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, p in paths.items():
            n = args.per_sample_steps if name == "per-sample" else args.steps
            for _ in range(n):
                rays = batch_of_rays()
                t = time.perf_counter()
                p.step(*rays)
                times[name].append(time.perf_counter() - t)
    result = {name: {"median_ms": 1e3 * statistics.median(t), "rays_per_s": R / statistics.median(t),
                     "steps": len(t)} for name, t in times.items()}
    load = os.getloadavg()
    print(f"# {R} rays x {S} samples per step, {args.instances} network(s), {args.rounds} rounds; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for name, r in result.items():
        print(f"{name:10s} {r['median_ms']:9.1f} ms/step {r['rays_per_s']:10.0f} rays/s  ({r['steps']} steps)")
    if "stage" in result and "batch" in result:
        print(f"stage / batch rays/s: {result['stage']['rays_per_s'] / result['batch']['rays_per_s']:.2f}")
    if "per-sample" in result and "batch" in result:
        print(f"per-sample / batch rays/s: {result['per-sample']['rays_per_s'] / result['batch']['rays_per_s']:.3f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
