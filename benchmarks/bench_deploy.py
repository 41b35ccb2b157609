#!/usr/bin/env python3
"""C inference through ``tinn_model.h`` against ``model.network.inference`` on the same arch (Vulkan), in one run.

``config_hash``'s model (2 inputs, 3 outputs; the weights do not change the work) is exported with
``tinn.deploy.export``; ``deploy_infer.c`` (built with gcc and ``python -m tinn.deploy --cflags --libs``) loads it
and waits. Each round then times, in turn: one C inference of the ``SIZE x SIZE`` image's pixel centres (host
arrays in and out: the copies to and from the device included), Python's inference of the same points as
``ti.ndarray``s (the device path, ``ti.sync()`` included) and of numpy arrays (host arrays in and out). The medians
and their ratios are printed as one JSON line.

    python benchmarks/bench_deploy.py [--size 512] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _doc import provenance  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import taichi as ti
    import tinn
    import tinn.deploy

    tinn.init(arch=ti.vulkan, log_level=ti.WARN)
    model = tinn.create_from_config(2, 3, "config_hash")
    net = model.network
    with tempfile.TemporaryDirectory() as tmp:
        folder, exe = os.path.join(tmp, "model"), os.path.join(tmp, "deploy_infer")
        tinn.deploy.export(model, folder)
        flags = (tinn.deploy.cflags() + " " + tinn.deploy.libs()).split()
        subprocess.run(["gcc", "-O2", os.path.join(HERE, "deploy_infer.c"), "-o", exe, *flags], check=True)
        c = subprocess.Popen([exe, folder, str(args.size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert c.stdout.readline().strip() == "ready"

        c_values = []

        def c_call():
            c.stdin.write("go\n")
            c.stdin.flush()
            seconds, y0 = c.stdout.readline().split()
            c_values.append(float(y0))
            return float(seconds)

        centres = (np.arange(args.size, dtype=np.float32) + 0.5) / args.size
        gx, gy = np.meshgrid(centres, centres)
        x = np.stack([gx.ravel(), gy.ravel()], axis=1)
        x_device, y_device = ti.ndarray(ti.f32, x.shape), ti.ndarray(ti.f32, (len(x), 3))
        x_device.from_numpy(x)

        def timed(f):
            def call():
                t = time.perf_counter()
                f()
                return time.perf_counter() - t
            return call

        def device():
            net.inference(x_device, out=y_device)
            ti.sync()

        calls = {"c": c_call, "python_device": timed(device), "python_numpy": timed(lambda: net.inference(x))}
        for f in calls.values():                     # warm-up: Python's kernels compile here
            f()
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, f in calls.items():
                times[name].append(f())
        c.stdin.close()
        c.wait()
        reference = net.inference(x[:1])[0, 0]
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    print(json.dumps({**provenance(sys.argv), "size": args.size, "rounds": args.rounds,
                      "median_ms": ms, "c_samples_per_s": len(x) / ms["c"] * 1e3,
                      "c_over_python_device": ms["python_device"] / ms["c"],
                      "c_over_python_numpy": ms["python_numpy"] / ms["c"],
                      "c_first_output_equals_python": bool(abs(c_values[-1] - reference) <= 1e-5)}))


if __name__ == "__main__":
    main()
