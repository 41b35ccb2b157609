#!/usr/bin/env python3
"""A NeRF training step through ``tinn.ad.stage`` against the same step written with the batch API.

Workload: ``examples/nerf.py``'s renderer and field (HashGrid + MLP density, SH + MLP colour, every sample
of R rays x S samples in an occupied grid), random rays and targets, Adam; each variant trains its own
copy of the two networks. One step (``Renderer.loss_and_gradients`` and both optimizer steps) of:

* ``stage``: the example as it is: the networks as ``tinn.ad.stage``s under ``ti.ad.Tape``;
* ``batch``: the same program with each stage replaced by what a user writes with the batch API: a
  ``ti.ad.grad_replaced`` function that reads the field into numpy, calls ``network.forward`` and
  writes the output back, and its reverse, which reads ``y.grad`` and calls ``network.backward``.

The variants alternate within each round; figures are medians over the rounds of ms per step. Each
variant's launches and elements moved between host and device per step are counted once
(``tinn.runtime.probe``). ``--device-path`` runs tinn's device path on this arch (``tinn.runtime.program.FORCE``: on
the CPU, the kernels a GPU runs). ``--host-cost`` times instead the Tape of one stage call (forward and reverse) on 64
elements of a tiny network (Frequency + a 16-wide MLP), where the kernels have almost nothing to do: its time
per launch is the host's cost of a launch, tinn's Python between the launches included.

    python benchmarks/bench_stage.py [--rays 1024] [--samples 32] [--rounds 5] [--steps 5] [--device-path]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import taichi as ti
from taichi.lang.kernel_impl import Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import tinn  # noqa: E402
from tinn.runtime import program as _program
from tinn.runtime import probe as _probe
import nerf  # noqa: E402


class BatchStage:
    """``y[I] = network(x[I])`` over the mask, written with the batch API in numpy (a user's stage)."""

    def __init__(self, network, x, y, mask):
        self.network, self.x, self.y, self.mask = network, x, y, mask
        self.ctx = self.rows = None
        launch = ti.ad.grad_replaced(self.forward)
        ti.ad.grad_for(launch)(self.backward)
        self.active = None
        self._launch = launch

    def __call__(self):
        self._launch()

    def forward(self):
        self.rows = np.flatnonzero(self.mask.to_numpy().reshape(-1))
        x = np.ascontiguousarray(self.x.to_numpy().reshape(-1, self.x.n)[self.rows])
        y, self.ctx = self.network.forward(x)
        full = np.zeros((self.mask.shape[0] * self.mask.shape[1], self.y.n), np.float32)
        full[self.rows] = y
        self.y.from_numpy(full.reshape(self.y.shape + (self.y.n,)))

    def backward(self):
        dy = np.ascontiguousarray(self.y.grad.to_numpy().reshape(-1, self.y.n)[self.rows])
        self.y.grad.fill(0)
        needs_dx = self.x.snode.ptr.has_adjoint()
        dx = self.network.backward(self.ctx, dy, input_gradient=needs_dx, mode="accumulate")
        if needs_dx:                                   # the colour stage's features reach the density network
            total = self.x.grad.to_numpy().reshape(-1, self.x.n)
            total[self.rows] += dx
            self.x.grad.from_numpy(total.reshape(self.x.shape + (self.x.n,)))


def renderer(args, seed, batch_api):
    density_net, colour_net = nerf.make_field(1)
    for net in (density_net, colour_net):
        net.reset_params(seed)
    trainers = [tinn.Trainer(n, tinn.create_optimizer(nerf.OPTIMIZER), tinn.create_loss({"otype": "L2"}))
                for n in (density_net, colour_net)]
    occupancy = nerf.OccupancyGrid(16, 1.0)
    r = nerf.Renderer(density_net, colour_net, args.rays, args.samples, -1.5, 1.5, occupancy)
    if batch_api:
        r.density = BatchStage(density_net, r.pts, r.h, r.mask)
        r.colour_stage = BatchStage(colour_net, r.colour_in, r.rgb, r.mask)
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(args.rays, 3)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    r.set_rays((-2.5 * d).astype(np.float32), d, rng.random((args.rays, args.samples), dtype=np.float32))
    r.target.from_numpy(rng.random((args.rays, 3), dtype=np.float32))

    def step():
        r.loss_and_gradients()
        for t, active in zip(trainers, r.active()):
            t.optimizer_step(active=active)
    return step, r


def measure(args):
    variants = {"stage": renderer(args, 1, False), "batch": renderer(args, 1, True)}
    counts = {}
    for name, (step, r) in variants.items():
        step()                                         # compiles
        with _probe.counting() as seen:
            step()
        r.mean_loss(1)                                 # a read: the device has finished
        counts[name] = {"launches": seen.launches, "moved": seen.moved}
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (step, r) in variants.items():
            r.mean_loss(1)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            r.mean_loss(args.steps)                        # wait for the device
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    result = {name: {"ms": statistics.median(t), **counts[name]} for name, t in times.items()}
    result["stage / batch"] = result["stage"]["ms"] / result["batch"]["ms"]
    return result


def host_cost(args):
    """µs per Tape of one stage call on 64 elements (routed to 4 networks, a quarter masked), its launches,
    and µs per launch; the same for an empty kernel launched from Python."""
    net = tinn.NetworkWithInputEncoding(2, 1, {"otype": "Frequency", "n_frequencies": 2},
                                        {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1},
                                        n_instances=4)
    x, y = ti.Vector.field(2, ti.f32, 64, needs_grad=True), ti.Vector.field(1, ti.f32, 64, needs_grad=True)
    instance, mask, loss = ti.field(ti.i32, 64), ti.field(ti.i32, 64), ti.field(ti.f32, (), needs_grad=True)
    x.from_numpy(np.random.default_rng(0).random((64, 2), dtype=np.float32))
    instance.from_numpy((np.arange(64) % 4).astype(np.int32))
    mask.from_numpy((np.arange(64) % 4 != 3).astype(np.int32))
    stage = tinn.ad.stage(net, x, y, instance=instance, mask=mask)

    @ti.kernel
    def total():
        for i in y:
            loss[None] += y[i][0]

    @ti.kernel
    def empty():
        pass

    def tape():                                        # (no clearing of every field's .grad: the stage alone)
        with ti.ad.Tape(loss=loss, clear_gradients=False):
            stage()
            total()

    def timed(f, n=50):
        """Median µs per call of ``f``, and of that the µs spent inside Taichi's launches (the kernels' run
        included: on the CPU a launch returns when its kernel has run)."""
        f()
        ti.sync()
        runs, inside = [], []
        launch = Kernel.__call__
        spent = [0.0]

        def call(kernel, *a, **kw):
            start = time.perf_counter()
            try:
                return launch(kernel, *a, **kw)
            finally:
                spent[0] += time.perf_counter() - start
        Kernel.__call__ = call
        try:
            for _ in range(args.rounds):
                spent[0] = 0.0
                start = time.perf_counter()
                for _ in range(n):
                    f()
                ti.sync()
                runs.append((time.perf_counter() - start) / n * 1e6)
                inside.append(spent[0] / n * 1e6)
        finally:
            Kernel.__call__ = launch
        return statistics.median(runs), statistics.median(inside)

    with _probe.counting() as seen:
        tape()
    (us, inside), (bare, _) = timed(tape), timed(empty)
    return {"µs per Tape": us, "µs in launches": inside, "µs of Python between launches": us - inside,
            "launches": seen.launches, "µs of Python per launch": (us - inside) / seen.launches,
            "µs per empty launch": bare, "moved": seen.moved, "kernels": dict(seen.kernels)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rays", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--device-path", action="store_true", help="tinn's device path on this arch")
    ap.add_argument("--host-cost", action="store_true", help="time a tiny stage's Tape instead (launches' cost)")
    args = ap.parse_args()
    tinn.init(getattr(ti, args.arch))
    _program.FORCE = args.device_path
    out = {"arch": args.arch, "device_path": _program.active()}
    if args.host_cost:
        out["host cost"] = host_cost(args)
    else:
        out.update(rays=args.rays, samples=args.samples, step=measure(args))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
