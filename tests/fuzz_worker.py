"""Worker process of the config fuzzer (``test_config_fuzz.py``): runs cases read from stdin.

Each input line is a JSON case ``{"id", "n_in", "n_out", "n_instances", "seed", "batch", "config"}``;
each output line reports ``{"id", "status", "detail"}`` with status

* ``ok`` — built, two training steps and an inference, every loss and output finite;
* ``nonfinite`` — as ``ok`` but some loss or output is NaN/Inf;
* ``clear`` — a ``TypeError`` / ``ValueError`` raised by a frame inside tinn;
* ``unclear`` — any other exception, or one raised outside tinn.

A crash or hang kills the worker: the parent sees no answer and reports the case.
Composite optimizer slices written as ``"auto"`` are sized from the model (its network's
parameters, then the rest), so such cases can train.
"""
import json
import os
import resource
import sys
import time
import traceback
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_LIMIT = 6 << 30             # a size check that fails to refuse shows up as an error, not a dead host


def decode(value):
    """Arguments that JSON cannot carry: ``{"np": "int64", "v": 2}`` is ``np.int64(2)``."""
    if isinstance(value, dict) and set(value) == {"np", "v"}:
        return getattr(np, value["np"])(value["v"])
    return value


def resolve_slices(config, n_network, n_total):
    opt = config.get("optimizer")
    if isinstance(opt, dict) and opt.get("otype") == "Composite" and isinstance(opt.get("nested"), list):
        sizes = [n_network, n_total - n_network]
        for entry, size in zip(opt["nested"], sizes):
            if isinstance(entry, dict) and entry.get("n_params_to_optimize") == "auto":
                entry["n_params_to_optimize"] = size


def run(case, tinn):
    config, n_in, n_out = case["config"], decode(case["n_in"]), decode(case["n_out"])
    kwargs = {"n_instances": decode(case["n_instances"]), "seed": decode(case["seed"])}
    if "auto" in json.dumps(config.get("optimizer")):
        net = tinn.NetworkWithInputEncoding(n_in, n_out, config.get("encoding"), config.get("network"), **kwargs)
        resolve_slices(config, net.network.n_params, net.n_params)
    model = tinn.create_from_config(n_in, n_out, config, **kwargs)
    K, B = model.network.n_instances, case["batch"]
    rng = np.random.default_rng(case["id"])
    x = rng.random((B, model.network.n_input_dims), dtype=np.float32)
    y = rng.random((B, model.network.n_output_dims), dtype=np.float32)
    instance = None if K == 1 else (np.arange(B) % K).astype(np.int32)
    losses = [model.trainer.training_step(x, y, instance) for _ in range(2)]
    out = model.network.inference(x, instance)
    finite = bool(np.isfinite(losses).all() and np.isfinite(out).all())
    return ("ok" if finite else "nonfinite"), f"losses {losses}"


def inside_tinn(exc) -> bool:
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(os.path.join(ROOT, "tinn") + os.sep)


def main():
    answers = os.fdopen(os.dup(1), "w", buffering=1)     # the protocol; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    sys.path.insert(0, ROOT)
    import taichi as ti
    import tinn
    ti.init(arch=ti.cpu, offline_cache=True, log_level=ti.ERROR)
    warnings.simplefilter("ignore")
    print(json.dumps({"ready": True}), file=answers)
    for line in sys.stdin:
        case = json.loads(line)
        started = time.perf_counter()
        try:
            status, detail = run(case, tinn)
        except (TypeError, ValueError) as e:
            status = "clear" if inside_tinn(e) else "unclear"
            detail = f"{type(e).__name__}: {e}" if status == "clear" else traceback.format_exc(limit=-3)
        except Exception as e:                     # noqa: BLE001 (every other failure is reported)
            status, detail = "unclear", traceback.format_exc(limit=-3) or repr(e)
        print(json.dumps({"id": case["id"], "status": status, "detail": detail[:2000],
                          "seconds": round(time.perf_counter() - started, 3)}), file=answers)


if __name__ == "__main__":
    main()
