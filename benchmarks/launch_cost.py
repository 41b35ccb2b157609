#!/usr/bin/env python3
"""What a device-path training step costs the host, against bare launches of the same kernels.

Model: a tiny ``Frequency`` encoding (4 frequencies) + a 16-wide MLP (one hidden layer, 3 outputs), L2,
Adam, on the device path (``tinn.runtime.program.FORCE = True``) with ``ti.ndarray`` batches of ``--batch``
samples: at 256 samples the kernels do almost nothing, so a step's time is what the host spends launching.

One step is recorded (every kernel launch with its arguments), then five loops are timed, alternating in
``--rounds`` rounds of ``--steps`` calls each (median per round, then the median of the rounds):

* ``step``: ``trainer.training_step(x, target)``;
* ``replay``: the recorded launches again, the same kernels with the same argument objects (tinn's
  Python between them removed: the time of Taichi's launches and of the kernels themselves);
* ``empty twins``: the same launches of empty kernels with the same signatures and arguments (Taichi's
  per-launch cost alone: argument checks, template lookup, argument setting);
* ``bare``: as many launches of an empty kernel without arguments (the floor of a launch).
* ``graph of twins``: the empty twins as one Taichi compute graph (``ti.graph``), their template
  parameters left out and the launches with a host array (Taichi's read-back copies) too, as a graph
  requires: what launching the step's kernels at once would cost.

``--profile`` adds a cProfile of ``--steps`` steps: a step's time split into Taichi's launches, buffer
creation, read-backs and tinn's own Python, and tinn's heaviest functions (file:line).

    python benchmarks/launch_cost.py --rounds 7 --steps 200 --profile
    python benchmarks/launch_cost.py --arch vulkan
"""
import argparse
import cProfile
import importlib.util
import json
import os
import pstats
import statistics
import tempfile
import time
from collections import Counter

import numpy as np
import taichi as ti
from taichi.lang.kernel_impl import Kernel
from taichi.types.annotations import Template

import tinn
from tinn.batch import buffers as _buffers
from tinn.runtime import program as _program
from tinn.runtime import probe as _probe

CONFIG = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
          "encoding": {"otype": "Frequency", "n_frequencies": 4},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}


def record(fn):
    """The ``(kernel, args, kwargs)`` of every launch made by ``fn()``, in order."""
    launches, real = [], Kernel.__call__

    def call(kernel, *args, **kwargs):
        launches.append((kernel, args, kwargs))
        return real(kernel, *args, **kwargs)

    Kernel.__call__ = call
    try:
        fn()
    finally:
        Kernel.__call__ = real
    return launches


def empty_twins(kernels, folder, templates=True):
    """For each kernel, an empty ``@ti.kernel`` with the same parameters and annotations (written to a
    module in ``folder``: Taichi reads a kernel's source); without ``templates``, its ``ti.template()``
    parameters left out (as a compute graph needs)."""
    kept = [[a for a in k.arguments if templates or not isinstance(a.annotation, Template)] for k in kernels]
    lines = ["import taichi as ti", ""]
    for i, arguments in enumerate(kept):
        params = ", ".join(f"{a.name}: ANNOTATIONS[{i}][{j}]" for j, a in enumerate(arguments))
        lines += ["@ti.kernel", f"def twin_{i}({params}):", "    pass", ""]
    name = f"launch_cost_twins_{'all' if templates else 'graph'}"
    path = os.path.join(folder, name + ".py")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.ANNOTATIONS = [[a.annotation for a in arguments] for arguments in kept]
    spec.loader.exec_module(module)
    return [getattr(module, f"twin_{i}") for i in range(len(kernels))]


def graph_of_twins(launches, folder):
    """One compute graph of the empty twins (templates left out) of every launch that a graph can hold
    (none with a host array: Taichi's read-back copies), bound to the recorded arrays and numbers; returns
    a call that runs it and syncs, and how many launches it holds."""
    held = [(k, a) for k, a, kw in launches if not kw and not any(isinstance(v, np.ndarray) for v in a)]
    kernels = list(dict.fromkeys(k for k, _ in held))
    twin = dict(zip(kernels, empty_twins(kernels, folder, templates=False)))
    builder, values = ti.graph.GraphBuilder(), {}
    for i, (kernel, args) in enumerate(held):
        symbols = []
        for j, (a, v) in enumerate(zip(kernel.arguments, args)):
            if isinstance(a.annotation, Template):
                continue
            name = f"launch{i}_{a.name}"
            if isinstance(v, ti.Ndarray):
                symbols.append(ti.graph.Arg(ti.graph.ArgKind.NDARRAY, name, v.dtype, ndim=len(v.shape)))
            else:
                symbols.append(ti.graph.Arg(ti.graph.ArgKind.SCALAR, name, a.annotation))
            values[name] = v
        builder.dispatch(twin[kernel], *symbols)
    graph = builder.compile()

    def run():
        graph.run(values)
        ti.sync()
    return run, len(held)


@ti.kernel
def nothing():
    pass


def median_ms(fn, steps):
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def loops(model, x, y, folder):
    """The five timed loops (see the module docstring), the recorded launches, their empty twins, and how
    many launches the graph holds."""
    step = lambda: model.trainer.training_step(x, y)  # noqa: E731
    for _ in range(5):                                # compiled, buffers kept, small tables uploaded
        step()
    launches = record(step)
    kernels = list(dict.fromkeys(k for k, _, _ in launches))
    twin = dict(zip(kernels, empty_twins(kernels, folder)))
    twins = [(twin[k], a, kw) for k, a, kw in launches]

    def replay(calls):
        def run():
            for kernel, args, kwargs in calls:
                kernel(*args, **kwargs)
            ti.sync()
        return run

    def bare():
        for _ in launches:
            nothing()
        ti.sync()

    def stepped():
        step()
        ti.sync()

    in_graph, n_graph = graph_of_twins(launches, folder)
    return {"step": stepped, "replay": replay([(k.__call__, a, kw) for k, a, kw in launches]),
            "empty twins": replay([(k, a, kw) for k, a, kw in twins]), "bare": bare,
            "graph of twins": in_graph}, launches, twins, n_graph


def per_launch(launches, twins, calls):
    """Each launch of a step: its arguments by kind, the median µs of it alone (synchronised) and of its
    empty twin alone."""
    rows = []
    for (kernel, args, kwargs), (twin, _, _) in zip(launches, twins):
        values = (*args, *kwargs.values())
        kinds = {"ndarrays": sum(isinstance(v, (ti.Ndarray, np.ndarray)) for v in values),
                 "fields": sum(isinstance(v, ti.Field) for v in values)}
        kinds["scalars"] = len(values) - kinds["ndarrays"] - kinds["fields"]
        alone = {name: round(1e3 * median_ms(lambda: (k(*args, **kwargs), ti.sync()), calls), 2)
                 for name, k in (("real_us", kernel.__call__), ("twin_us", twin))}
        rows.append({"kernel": kernel.func.__name__, **kinds, **alone})
    return rows


def argument_costs(rows):
    """Least squares of an empty launch's µs on its argument counts (Taichi's copy kernels left out, their
    host-array argument costs more): a launch's base cost and the cost of each ndarray, field and scalar."""
    rows = [r for r in rows if r["kernel"] not in _probe.COPY_KERNELS]
    kinds = ("ndarrays", "fields", "scalars")
    a = np.array([[1.0] + [r[k] for k in kinds] for r in rows])
    fit = np.linalg.lstsq(a, np.array([r["twin_us"] for r in rows]), rcond=None)[0]
    return {name: round(float(v), 2) for name, v in zip(("base",) + kinds, fit)}


def profile(model, x, y, steps):
    """A step's time (ms) by where it goes, and tinn's heaviest functions by their own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        model.trainer.training_step(x, y)
    ti.sync()
    prof.disable()
    stats = pstats.Stats(prof).stats                  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    per_step = lambda s: 1e3 * s / steps  # noqa: E731

    def total(pick, column):
        return per_step(sum(v[column] for k, v in stats.items() if pick(*k)))

    tinn_dir = os.path.dirname(tinn.__file__)
    taichi_call = lambda name: f"<built-in method taichi._lib.core.taichi_python.{name}>"  # noqa: E731
    buffers = (taichi_call("create_ndarray"), taichi_call("delete_ndarray"))
    parts = {
        "step (under the profiler)": total(lambda f, l, n: n == "training_step", 3),
        "all kernel launches (Kernel.__call__)":
            total(lambda f, l, n: n == "__call__" and f.endswith("kernel_impl.py"), 3),
        "  of which Taichi's C++ launch, kernel run included": total(lambda f, l, n: n == taichi_call("launch_kernel"), 2),
        "read-backs (to_numpy, its copy kernel included)": total(lambda f, l, n: n == "_ndarray_to_numpy", 3),
        "buffer creation and release (C++)": total(lambda f, l, n: n in buffers, 2),
        "tinn's own Python (self time in tinn/)": total(lambda f, l, n: f.startswith(tinn_dir), 2),
    }
    mine = sorted(((v[2], v[1], k) for k, v in stats.items() if k[0].startswith(tinn_dir)), reverse=True)[:12]
    hot = [{"where": f"tinn/{os.path.relpath(f, tinn_dir)}:{l} {n}", "self_ms_per_step": round(per_step(t), 4),
            "calls_per_step": c / steps} for t, c, (f, l, n) in mine]
    return {k: round(v, 4) for k, v in parts.items()}, hot


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="timed calls per loop and round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    settings = dict(cpu_max_num_threads=args.threads) if args.arch == "cpu" else {}
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN, **settings)
    _program.FORCE = True
    model = tinn.create_from_config(2, 3, CONFIG)
    rng = np.random.default_rng(0)
    x = _buffers.put(rng.random((args.batch, 2), dtype=np.float32))
    y = _buffers.put(rng.random((args.batch, 3), dtype=np.float32))
    with tempfile.TemporaryDirectory() as folder:
        timed, launches, twins, n_graph = loops(model, x, y, folder)
        for fn in timed.values():                     # compile everything, first touch
            for _ in range(5):
                fn()
        rounds = {name: [] for name in timed}
        for _ in range(args.rounds):
            for name, fn in timed.items():
                rounds[name].append(median_ms(fn, args.steps))
        launch_rows = per_launch(launches, twins, args.steps)
    ms = {name: statistics.median(r) for name, r in rounds.items()}
    n = len(launches)
    result = {
        "arch": args.arch, "batch": args.batch, "launches_per_step": n,
        "kernels": dict(sorted(Counter(k.func.__name__ for k, _, _ in launches).items())),
        "ms_per_call": {k: round(v, 4) for k, v in ms.items()},
        "rounds_ms": {k: [round(v, 4) for v in r] for k, r in rounds.items()},
        "graph_launches": n_graph,
        "us_per_launch": {**{k: round(1e3 * ms[k] / n, 2) for k in ("replay", "empty twins", "bare")},
                          "graph of twins": round(1e3 * ms["graph of twins"] / n_graph, 2)},
        "step_over": {k: round(ms["step"] / ms[k], 2) for k in ("replay", "empty twins", "bare")},
        "per_launch": launch_rows,
        "empty_launch_us_fit": argument_costs(launch_rows),
    }
    if args.profile:
        result["profile_ms_per_step"], result["tinn_hot_spots"] = profile(model, x, y, args.steps * args.rounds)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
