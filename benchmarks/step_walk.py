"""How far one call travels through the package: the files of ``tinn/`` it enters and its moves between them.

    python benchmarks/step_walk.py [--json]

Traces (``sys.settrace``) a warm call of each kind on the CPU, with a routed network array of the
``config_hash`` model (K = 4, batch 1024): a training step on the host path, the same step of ``ti.ndarray`` batches on the
device path (forced on the CPU), and an inference. ``files``: the distinct files of ``tinn/`` whose lines ran; ``moves``:
consecutive lines of tinn's code that lie in different files (a call into another file and its return count
two); ``returns``: the moves into a file the call had already left (every move but the first entry of each
file). Fewer moves and returns is a call a reader can follow without going back to a file already left.
"""
import argparse
import importlib
import json
import os
import sys

import numpy as np
import taichi as ti

import tinn

TINN = os.path.dirname(tinn.__file__) + os.sep
CONFIG = {"encoding": {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
                       "base_resolution": 16, "per_level_scale": 1.5},
          "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2},
          "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}


def _device_switch():
    for name in ("tinn.runtime.program", "tinn.runtime.device", "tinn._device"):   # (its place in older trees)
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "FORCE"):
            return module
    raise ImportError("no device switch module")


def _ndarray(a: np.ndarray):
    out = ti.ndarray(ti.i32 if a.dtype == np.int32 else ti.f32, a.shape)
    out.from_numpy(a)
    return out


def trace(call) -> dict:
    files, moves, returns, last = set(), [0], [0], [None]

    def line(frame, event, arg):
        if event == "line":
            f = frame.f_code.co_filename
            if last[0] is not None and last[0] != f:
                moves[0] += 1
                returns[0] += f in files
            files.add(f)
            last[0] = f
        return line

    def on_call(frame, event, arg):
        return line if frame.f_code.co_filename.startswith(TINN) else None

    sys.settrace(on_call)
    try:
        call()
    finally:
        sys.settrace(None)
    return {"files": len(files), "moves": moves[0], "returns": returns[0],
            "entered": sorted(os.path.relpath(f, TINN) for f in files)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    ti.init(arch=ti.cpu, log_level=ti.WARN)
    device = _device_switch()
    rng = np.random.default_rng(0)
    K, B = 4, 1024
    x, y = rng.random((B, 3), dtype=np.float32), rng.random((B, 3), dtype=np.float32)
    ids = rng.integers(0, K, B).astype(np.int32)
    model = tinn.create_from_config(3, 3, CONFIG, n_instances=K)
    calls = {"routed host step": lambda: model.trainer.training_step(x, y, ids),
             "inference": lambda: model.network.inference(x, ids)}
    results = {}
    for name, call in calls.items():
        call()                                                    # compiled and warm
        results[name] = trace(call)
    device.FORCE = True
    on_device = [_ndarray(a) for a in (x, y, ids)]
    step = lambda: model.trainer.training_step(*on_device)
    step()
    results["routed device step"] = trace(step)
    device.FORCE = False
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'call':<22} {'files':>6} {'moves':>6} {'returns':>8}")
    for name, r in results.items():
        print(f"{name:<22} {r['files']:>6} {r['moves']:>6} {r['returns']:>8}")


if __name__ == "__main__":
    main()
