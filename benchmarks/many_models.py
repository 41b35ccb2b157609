#!/usr/bin/env python3
"""N models of one config in one process: what each costs to create, train one step and infer, and how
many Taichi kernels each compiles (``offline_cache=False``, so a compile is a compile).

For every model: ``create_s`` (``create_from_config``: memory, binding, tcnn's initial draw),
``step_s`` (one training step), ``infer_s`` (one inference call), ``init_s`` (the initial draw alone,
``reset_params`` timed again on the live model) and the names of the kernels compiled meanwhile. The
last stdout line is a JSON dict: ``total_s`` (all N models created, stepped and inferred), the first
model's figures, the later models' medians and maxima, ``compiled_after_first`` (kernel name -> how
many times, over models 2..N) and ``field_trees`` (Taichi field trees, parameter chunks and per-config tables).

    python benchmarks/many_models.py --models 100                       # config_hash
    python benchmarks/many_models.py --models 4 --log2-table 19         # a model that needs its own chunk
"""
import argparse
import collections
import json
import time

import numpy as np
import taichi as ti
from taichi.lang.kernel_impl import Kernel



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--config", default="config_hash")
    ap.add_argument("--log2-table", type=int, default=None, help="override the grid's log2_hashmap_size")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--n-instances", type=int, default=1)
    ap.add_argument("--arch", default="cpu")
    args = ap.parse_args()

    ti.init(arch=getattr(ti, args.arch), offline_cache=False, log_level=ti.WARN)
    import tinn

    config = tinn.load_config(args.config)
    if args.log2_table is not None:
        config["encoding"]["log2_hashmap_size"] = args.log2_table

    compiled = []
    materialize = Kernel.materialize

    def record(kernel, key=None, *a, **kw):
        if (key or (kernel.func, 0, kernel.autodiff_mode)) not in kernel.compiled_kernels:
            compiled.append(kernel.func.__name__)
        return materialize(kernel, key, *a, **kw)

    Kernel.materialize = record
    rng = np.random.default_rng(0)
    K = args.n_instances
    shape = (K, args.batch // K) if K > 1 else (args.batch,)
    x = rng.random(shape + (2,), dtype=np.float32)
    y = rng.random(shape + (3,), dtype=np.float32)

    rows, models = [], []
    start = time.perf_counter()
    for i in range(args.models):
        compiled.clear()
        t0 = time.perf_counter()
        model = tinn.create_from_config(2, 3, config, n_instances=K, seed=1337 + i)
        t1 = time.perf_counter()
        model.trainer.training_step(x, y)
        t2 = time.perf_counter()
        model.network.inference(x)
        t3 = time.perf_counter()
        names = list(compiled)
        models.append(model)
        rows.append({"create_s": t1 - t0, "step_s": t2 - t1, "infer_s": t3 - t2, "compiled": names})
    total = time.perf_counter() - start
    for row, model in zip(rows, models[:3]):
        t0 = time.perf_counter()
        model.network.reset_params(1337)
        row["init_s"] = time.perf_counter() - t0

    later = rows[1:]
    after = collections.Counter(name for row in later for name in row["compiled"])

    def stat(key, f):
        return round(float(f([r[key] for r in later])), 4) if later else None

    out = {"models": args.models, "n_params": int(models[0].network.n_params), "n_instances": K,
           "total_s": round(total, 2),
           "first": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[0].items()},
           "later_median": {k: stat(k, np.median) for k in ("create_s", "step_s", "infer_s")},
           "later_max": {k: stat(k, np.max) for k in ("create_s", "step_s", "infer_s")},
           "init_s": [round(r["init_s"], 4) for r in rows if "init_s" in r],
           "compiled_after_first": dict(after),
           "field_trees": ti.lang.impl.get_runtime().prog.get_snode_tree_size()}
    for i, row in enumerate(rows):
        print(f"model {i}: create {row['create_s']:.3f} s, step {row['step_s']:.3f} s, infer {row['infer_s']:.3f} s, "
              f"compiled {row['compiled']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
