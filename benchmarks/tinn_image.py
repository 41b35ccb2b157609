#!/usr/bin/env python3
"""tinn on tiny-cuda-nn's `mlp_learning_an_image` workload, with the peers' output protocol.

Trains ``config_hash.json`` on random bilinear lookups of the image (the example's own
sampling kernel), then runs inference over every pixel centre. The last stdout line is a
JSON dict with ``train_samples_per_s``, ``infer_samples_per_s``, ``ms_per_step_median``,
``final_loss``, ``psnr``, ``startup_s`` and ``peak_rss_mib``.
"""
import argparse
import os
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import numpy as np  # noqa: E402
import taichi as ti  # noqa: E402

import _common as C  # noqa: E402
import tinn  # noqa: E402
from mlp_learning_an_image import bilinear_lookup, pixel_centres  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--steps", type=int, default=50, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    ap.add_argument("--image", default=C.DEFAULT_IMAGE)
    ap.add_argument("--config", default=os.path.join(HERE, "..", "data", "config_hash.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--infer-chunk", type=int, default=1 << 18)
    ap.add_argument("--no-infer", action="store_true")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    tinn.init(arch=ti.cpu, cpu_max_num_threads=args.threads, log_level=ti.WARN)
    img, desc = C.load_image(args.image)
    H, W, _ = img.shape
    model = tinn.create_from_config(2, 3, args.config, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    xy = np.empty((args.batch, 2), np.float32)
    target = np.empty((args.batch, 3), np.float32)

    def train_step():
        rng.random(out=xy, dtype=np.float32)
        bilinear_lookup(img, xy, target)
        return model.trainer.training_step(xy, target)

    t = time.perf_counter()
    for i in range(args.warmup):
        loss = train_step()
        if i == 0:
            startup = time.perf_counter() - T0
    warmup_s = time.perf_counter() - t
    times = []
    with C.CpuMonitor() as mon:
        for _ in range(args.steps):
            t = time.perf_counter()
            loss = train_step()
            times.append(time.perf_counter() - t)
    result = {
        "impl": "tinn", "batch": args.batch, "steps": args.steps,
        "train_samples_per_s": args.batch * args.steps / sum(times),
        "infer_samples_per_s": None, "final_loss": float(loss), "psnr": None,
        "ms_per_step": 1e3 * sum(times) / args.steps, "ms_per_step_median": 1e3 * float(np.median(times)),
        "ms_per_step_min": 1e3 * min(times), "warmup_s": warmup_s, "startup_s": startup,
        "threads": args.threads, "image": desc, "train_foreign_cores": round(mon.foreign_cores, 3),
        "train_self_cores": round(mon.self_cores, 3),
    }
    if not args.no_infer:
        coords = pixel_centres(H, W)
        out = np.empty((len(coords), 3), np.float32)
        model.network.inference(coords[: args.infer_chunk])                    # warm-up chunk
        with C.CpuMonitor() as imon:
            for s in range(0, len(coords), args.infer_chunk):
                out[s:s + args.infer_chunk] = model.network.inference(coords[s:s + args.infer_chunk])
        result.update(infer_samples_per_s=len(coords) / imon.wall, infer_pixels=len(coords),
                      infer_foreign_cores=round(imon.foreign_cores, 3), psnr=C.psnr(out.reshape(H, W, 3), img))
    result["peak_rss_mib"] = round(C.peak_rss_mib(), 1)
    C.emit(result)


if __name__ == "__main__":
    main()
