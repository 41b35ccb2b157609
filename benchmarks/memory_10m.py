#!/usr/bin/env python3
"""Peak memory of one huge batch: a training step (``train``) or inference (``infer``) on 10 M samples of
``config_hash``, beyond what the process held just before the call (its inputs included there).

    python benchmarks/memory_10m.py train
    python benchmarks/memory_10m.py infer
"""
import os
import resource
import sys

import numpy as np
import taichi as ti

import tinn

N = 10_000_000
CONFIG = "config_hash"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "train"
    tinn.init(arch=ti.cpu, log_level=ti.WARN)
    model = tinn.create_from_config(2, 3, CONFIG)
    rng = np.random.default_rng(0)
    small = rng.random((1 << 16, 2), dtype=np.float32)
    model.trainer.training_step(small, rng.random((1 << 16, 3), dtype=np.float32))    # compile both paths
    model.network.inference(small)
    x = rng.random((N, 2), dtype=np.float32)
    y = rng.random((N, 3), dtype=np.float32) if what == "train" else None
    before = rss_mib()
    if what == "train":
        model.trainer.training_step(x, y)
    else:
        model.network.inference(x)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    outputs = 0 if what == "train" else N * 3 * 4 / 2**20
    print(f"{what}: {peak - before:.0f} MiB beyond the inputs at the peak (of which {outputs:.0f} MiB outputs)")


if __name__ == "__main__":
    main()
