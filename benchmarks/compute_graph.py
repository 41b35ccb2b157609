#!/usr/bin/env python3
"""Taichi's compute graphs (``ti.graph.GraphBuilder``) against Python launches of the same kernels.

A tinn-like step of N launches over ``ti.ndarray`` batches (a cycle of four small kernels, each with
three ndarray arguments and one scalar, as tinn's average launch has; with ``empty``, four empty
kernels of the same signature, the launches' cost alone) is run two ways, alternating in ``--rounds``
rounds of ``--calls`` calls (median per round, median of the rounds):

* ``python``: N kernel calls from Python, then ``ti.sync()``;
* ``graph``: one ``Graph.run`` of the same N dispatches (built and compiled once), then ``ti.sync()``.

It also tries what a graph accepts (``requirements``): a field as a ``ti.template()`` argument, a
compile-time constant, a field read as a global, a kernel returning a value, a numpy array at run time.

    python benchmarks/compute_graph.py --arch cpu --launches 1 4 16 64
    python benchmarks/compute_graph.py --arch vulkan
"""
import argparse
import json
import statistics
import time

import numpy as np
import taichi as ti

ND = ti.types.ndarray(dtype=ti.f32, ndim=2)


@ti.kernel
def encode(x: ND, a: ND, out: ND, scale: ti.f32):
    for i, j in out:
        out[i, j] = ti.sin(scale * x[i, j % x.shape[1]]) + a[i, j]


@ti.kernel
def layer(h: ND, w: ND, out: ND, bias: ti.f32):
    for i, j in out:
        s = bias
        for k in range(h.shape[1]):
            s += w[j, k] * h[i, k]
        out[i, j] = ti.max(s, 0.0)


@ti.kernel
def loss(y: ND, target: ND, grad: ND, scale: ti.f32):
    for i, j in y:
        grad[i, j] = scale * (y[i, j] - target[i, j])


@ti.kernel
def update(w: ND, g: ND, m: ND, lr: ti.f32):
    for i, j in w:
        m[i, j] = 0.9 * m[i, j] + 0.1 * g[i % g.shape[0], j % g.shape[1]]
        w[i, j] -= lr * m[i, j]


@ti.kernel
def nothing(a: ND, b: ND, c: ND, s: ti.f32):
    pass


CYCLES = {"work": (encode, layer, loss, update), "empty": (nothing,) * 4}
SLOTS = (("x", "a", "h", "scale"), ("h", "w", "y", "bias"), ("y", "x", "g", "scale"), ("w", "g", "m", "lr"))
"""The arguments of the cycle's four launches, by name."""


def step_arrays(batch, width):
    """The arrays of the step: name -> ndarray (named in ``SLOTS``)."""
    shapes = {"x": (batch, width), "a": (batch, width), "h": (batch, width), "w": (width, width),
              "y": (batch, width), "g": (batch, width), "m": (width, width)}
    arrays = {}
    for name, shape in shapes.items():
        arrays[name] = ti.ndarray(ti.f32, shape)
        arrays[name].from_numpy(np.random.default_rng(len(arrays)).random(shape, dtype=np.float32) * 0.1)
    return arrays


SCALARS = {"scale": 0.5, "bias": 0.01, "lr": 1e-3}


def launches(cycle, n):
    """The first n launches of the repeated cycle: (kernel, argument names)."""
    return [(CYCLES[cycle][i % 4], SLOTS[i % 4]) for i in range(n)]


def python_step(arrays, n, cycle="work"):
    """n launches from Python, then a sync."""
    values = {**arrays, **SCALARS}
    calls = [(kernel, [values[a] for a in names]) for kernel, names in launches(cycle, n)]

    def run():
        for kernel, args in calls:
            kernel(*args)
        ti.sync()
    return run


def graph_step(arrays, n, cycle="work"):
    """The same n launches as one compiled graph, then a sync."""
    symbols = {name: ti.graph.Arg(ti.graph.ArgKind.NDARRAY, name, ti.f32, ndim=2) for name in arrays}
    symbols.update({name: ti.graph.Arg(ti.graph.ArgKind.SCALAR, name, ti.f32) for name in SCALARS})
    builder = ti.graph.GraphBuilder()
    for kernel, names in launches(cycle, n):
        builder.dispatch(kernel, *[symbols[a] for a in names])
    graph = builder.compile()
    values = {**arrays, **SCALARS}

    def run():
        graph.run(values)
        ti.sync()
    return run


def same_result(batch, width, n):
    """Whether the graph and the Python launches leave the same arrays (from the same start)."""
    out = []
    for make in (python_step, graph_step):
        arrays = step_arrays(batch, width)
        make(arrays, n)()
        out.append({k: v.to_numpy() for k, v in arrays.items()})
    return all(np.allclose(out[0][k], out[1][k], rtol=1e-5, atol=1e-6) for k in out[0])


def median_us(fn, calls):
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


FIELD = None


@ti.kernel
def with_template(f: ti.template(), out: ND):
    for i, j in out:
        out[i, j] = f[i]


@ti.kernel
def with_constant(out: ND, c: ti.template()):
    for i, j in out:
        out[i, j] = c


@ti.kernel
def with_global(out: ND):
    for i, j in out:
        out[i, j] = FIELD[i]


@ti.kernel
def with_return(a: ND) -> ti.f32:
    return a[0, 0]


def requirements():
    """What a graph dispatch or run accepts: True, or the error Taichi raises."""
    global FIELD
    FIELD = ti.field(ti.f32, 8)
    out = ti.graph.Arg(ti.graph.ArgKind.NDARRAY, "out", ti.f32, ndim=2)
    trials = {
        "field as a ti.template() argument": lambda b: b.dispatch(with_template, FIELD, out),
        "compile-time constant (ti.template())": lambda b: b.dispatch(with_constant, out, 3),
        "field read as a global": lambda b: b.dispatch(with_global, out),
        "kernel returning a value": lambda b: b.dispatch(with_return, out),
    }
    found = {}
    for name, trial in trials.items():
        try:
            builder = ti.graph.GraphBuilder()
            trial(builder)
            builder.compile().run({"out": ti.ndarray(ti.f32, (8, 2))})
            ti.sync()
            found[name] = True
        except Exception as e:  # noqa: BLE001 - the point is to report what Taichi raises
            found[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    try:
        builder = ti.graph.GraphBuilder()
        builder.dispatch(with_global, out)
        builder.compile().run({"out": np.zeros((8, 2), np.float32)})
        found["numpy array at run time"] = True
    except Exception as e:  # noqa: BLE001
        found["numpy array at run time"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--launches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    settings = dict(cpu_max_num_threads=args.threads) if args.arch == "cpu" else {}
    ti.init(arch=getattr(ti, args.arch), log_level=ti.WARN, **settings)
    result = {"arch": args.arch, "batch": args.batch, "same_result": same_result(args.batch, args.width, 8)}
    arrays = step_arrays(args.batch, args.width)
    rows = []
    for cycle, n in ((c, n) for c in CYCLES for n in args.launches):
        ways = {"python": python_step(arrays, n, cycle), "graph": graph_step(arrays, n, cycle)}
        for fn in ways.values():
            for _ in range(5):
                fn()
        rounds = {w: [] for w in ways}
        for _ in range(args.rounds):
            for w, fn in ways.items():
                rounds[w].append(median_us(fn, args.calls))
        us = {w: statistics.median(r) for w, r in rounds.items()}
        rows.append({"kernels": cycle, "launches": n,
                     "python_us": round(us["python"], 1), "graph_us": round(us["graph"], 1),
                     "python_over_graph": round(us["python"] / us["graph"], 2),
                     "python_rounds_us": [round(v, 1) for v in rounds["python"]],
                     "graph_rounds_us": [round(v, 1) for v in rounds["graph"]]})
    result["timings"] = rows
    result["requirements"] = requirements()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
