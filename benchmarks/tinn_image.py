#!/usr/bin/env python3
"""tinn on tiny-cuda-nn's `mlp_learning_an_image` workload, with the peers' output protocol.

Trains ``config_hash.json`` on random bilinear lookups of the image (the example's own
sampling kernel), then runs inference over every pixel centre. The last stdout line is a
JSON dict with ``train_samples_per_s``, ``infer_samples_per_s``, ``ms_per_step_median``,
``final_loss``, ``psnr``, ``startup_s``, ``peak_rss_mib`` (``train_samples_per_s`` and ``ms_per_step`` count
the timed steps until the device has finished them; ``ms_per_step_median`` is the host's time per call,
on a GPU the time to queue a step once the device's queue is full), and what one call costs the host after the
warm-up: ``launches_per_step`` / ``read_backs_per_step`` of a training step (the batch's draw not
counted) and ``infer_launches_per_call`` / ``infer_read_backs_per_call`` of one inference call.

``--arch`` picks the Taichi arch (``cpu``, ``cuda``, ``vulkan``, ...). On a GPU arch the batches are
drawn on the device into ``ti.ndarray``s (as tcnn's sample draws them on the GPU), so a step moves
nothing across the bus but the loss.
"""
import argparse
import contextlib
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
from _launches import per_call  # noqa: E402
from mlp_learning_an_image import bilinear_lookup, pixel_centres  # noqa: E402


@ti.kernel
def draw_batch(image: ti.types.ndarray(dtype=ti.f32, ndim=3), xy: ti.types.ndarray(dtype=ti.f32, ndim=2),
               rgb: ti.types.ndarray(dtype=ti.f32, ndim=2)):
    """Random positions in [0, 1)^2 and the image there, bilinear, on the device (the example's lookup)."""
    H, W = image.shape[0], image.shape[1]
    for b in range(xy.shape[0]):
        u, v = ti.random(ti.f32), ti.random(ti.f32)
        xy[b, 0], xy[b, 1] = u, v
        px, py = u * W - 0.5, v * H - 0.5
        fx, fy = ti.floor(px), ti.floor(py)
        tx, ty = px - fx, py - fy
        x0, y0 = ti.cast(fx, ti.i32), ti.cast(fy, ti.i32)
        x1, y1 = ti.math.clamp(x0 + 1, 0, W - 1), ti.math.clamp(y0 + 1, 0, H - 1)
        x0, y0 = ti.math.clamp(x0, 0, W - 1), ti.math.clamp(y0, 0, H - 1)
        for c in ti.static(range(3)):
            top = image[y0, x0, c] * (1.0 - tx) + image[y0, x1, c] * tx
            bottom = image[y1, x0, c] * (1.0 - tx) + image[y1, x1, c] * tx
            rgb[b, c] = top * (1.0 - ty) + bottom * ty


def param_bytes(store) -> int:
    """Bytes of the model's parameters, inference weights and gradients: 2 + 2 + 4 per parameter for a float16
    model (its gradients are float32), 12 for a float32 one (the float32 master weights of a float16 model
    belong to its trainer and are not counted)."""
    return store.n_instances * store.n_params * (8 if store.precision == "float16" else 12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--steps", type=int, default=50, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    ap.add_argument("--image", default=C.DEFAULT_IMAGE)
    ap.add_argument("--config", default="config_hash")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--infer-chunk", type=int, default=1 << 18)
    ap.add_argument("--no-infer", action="store_true")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--precision", default="float32", choices=("float32", "float16"),
                    help="the model's parameter precision (float16: master weights and a loss scale)")
    ap.add_argument("--arch", default="cpu", help="Taichi arch: cpu, cuda, vulkan, metal, ...")
    ap.add_argument("--kernel-profile", action="store_true",
                    help="time every kernel (Taichi's kernel profiler: it waits for each one, so the step "
                         "times of this run are not the figures) and print the table to stderr")
    args = ap.parse_args()

    settings = dict(cpu_max_num_threads=args.threads) if args.arch == "cpu" else dict(device_memory_fraction=0.5)
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN, random_seed=args.seed,
              kernel_profiler=args.kernel_profile, **settings)
    on_device = args.arch != "cpu"
    img, desc = C.load_image(args.image)
    H, W, _ = img.shape
    model = tinn.create_from_config(2, 3, args.config, seed=args.seed, precision=args.precision)
    if on_device:
        img_d, xy_d, target_d = ti.ndarray(ti.f32, img.shape), ti.ndarray(ti.f32, (args.batch, 2)), ti.ndarray(ti.f32, (args.batch, 3))
        img_d.from_numpy(img)

        def draw():
            draw_batch(img_d, xy_d, target_d)
            return xy_d, target_d
    else:
        rng = np.random.default_rng(args.seed)
        xy = np.empty((args.batch, 2), np.float32)
        target = np.empty((args.batch, 3), np.float32)

        def draw():
            rng.random(out=xy, dtype=np.float32)
            bilinear_lookup(img, xy, target)
            return xy, target

    def train_step():
        return model.trainer.training_step(*draw())

    t = time.perf_counter()
    for i in range(args.warmup):
        loss = train_step()
        if i == 0:
            startup = time.perf_counter() - T0
    ti.sync()
    warmup_s = time.perf_counter() - t
    times = []
    with C.CpuMonitor() as mon:
        start = time.perf_counter()
        for _ in range(args.steps):
            t = time.perf_counter()
            loss = train_step()
            times.append(time.perf_counter() - t)
        ti.sync()                   # the steps are done when the device is (a step only queues its kernels)
        wall = time.perf_counter() - start
    if args.kernel_profile:
        ti.sync()
        with contextlib.redirect_stdout(sys.stderr):
            print(f"kernels of the {args.steps} timed steps and the {args.warmup} warm-up steps:")
            ti.profiler.print_kernel_profiler_info("count")
    batch = draw()
    step_cost = per_call(lambda: model.trainer.training_step(*batch))
    result = {
        "impl": "tinn", "batch": args.batch, "steps": args.steps,
        "train_samples_per_s": args.batch * args.steps / wall,
        "infer_samples_per_s": None, "final_loss": float(loss), "psnr": None,
        "ms_per_step": 1e3 * wall / args.steps, "ms_per_step_median": 1e3 * float(np.median(times)),
        "ms_per_step_min": 1e3 * min(times), "warmup_s": warmup_s, "startup_s": startup,
        "threads": args.threads, "arch": args.arch, "image": desc, "train_foreign_cores": round(mon.foreign_cores, 3),
        "train_self_cores": round(mon.self_cores, 3),
        "launches_per_step": step_cost["launches"], "read_backs_per_step": step_cost["read_backs"],
    }
    if not args.no_infer:
        coords = pixel_centres(H, W)
        chunks = [coords[s:s + args.infer_chunk] for s in range(0, len(coords), args.infer_chunk)]
        if on_device:                       # inputs and outputs stay on the device, as the PyTorch peer's
            chunks = [tinn.batch.buffers.put(np.ascontiguousarray(c)) for c in chunks]
        for _ in range(2):      # warm-up: the first pass compiles the inference kernels (the inference weights are
            for c in chunks:    # a field of their own) and the read-back's copy kernel; the pass after runs slow too
                tinn.batch.batch.host(model.network.inference(c))
        with C.CpuMonitor() as imon:
            outs = [model.network.inference(c) for c in chunks]
            ti.sync()
        out = np.concatenate([tinn.batch.batch.host(o) for o in outs])
        infer_cost = per_call(lambda: model.network.inference(chunks[0]))
        result.update(infer_launches_per_call=infer_cost["launches"], infer_read_backs_per_call=infer_cost["read_backs"])
        result.update(infer_samples_per_s=len(coords) / imon.wall, infer_pixels=len(coords),
                      infer_foreign_cores=round(imon.foreign_cores, 3), psnr=C.psnr(out.reshape(H, W, 3), img))
    result["precision"] = args.precision
    result["param_bytes"] = param_bytes(model.network.store)
    result["peak_rss_mib"] = round(C.peak_rss_mib(), 1)
    C.emit(result)


if __name__ == "__main__":
    main()
