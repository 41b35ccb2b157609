"""Train tcnn's ``config_hash`` on an image for a few hundred steps and export it for C (``render.c``).

    python examples/deploy/train_and_export.py [IMAGE] [--steps 300] [--out deploy_model] [--arch cpu]
    cc examples/deploy/render.c -o render $(python -m tinn.deploy --cflags --libs)
    ./render deploy_model render.ppm

Each step draws ``batch`` random coordinates in [0, 1)^2 and their colours (bilinear lookup, pixel centres at
``(i + 0.5) / W``, as examples/mlp_learning_an_image.py). The export (``tinn.deploy.export``) writes ``--out``:
model.tcm (the Taichi AOT module, for Vulkan), params.bin (the trained weights) and model.json; ``python.png``
beside them is Python's own render at 512 x 512, for comparison with the C program's.
"""
import argparse
import os
import time

import imageio.v3 as iio
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = 512


def load_image(path):
    """float32 (H, W, 3) in [0, 1]."""
    img = np.asarray(iio.imread(path))
    img = img[:, :, None] if img.ndim == 2 else img[:, :, :3]
    img = np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img
    return img.astype(np.float32) / (65535.0 if img.dtype == np.uint16 else 255.0)


def lookup(image, xy):
    """image at xy = (x right, y down) in [0, 1]^2, bilinear, clamped at the edges: (B, 3)."""
    h, w, _ = image.shape
    px, py = xy[:, 0] * w - 0.5, xy[:, 1] * h - 0.5
    x0, y0 = np.floor(px), np.floor(py)
    fx, fy = (px - x0)[:, None], (py - y0)[:, None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    xa, xb = np.clip(x0, 0, w - 1), np.clip(x0 + 1, 0, w - 1)
    ya, yb = np.clip(y0, 0, h - 1), np.clip(y0 + 1, 0, h - 1)
    top = image[ya, xa] * (1 - fx) + image[ya, xb] * fx
    bottom = image[yb, xa] * (1 - fx) + image[yb, xb] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


def pixel_centres(size=SIZE):
    """(size * size, 2) float32: row-major pixel centres ((i + 0.5) / size, (j + 0.5) / size), x right, y down."""
    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    x, y = np.meshgrid(c, c)
    return np.stack([x.ravel(), y.ravel()], axis=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", nargs="?", default=os.path.join(ROOT, "data", "images", "default.jpg"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=2 ** 14)
    parser.add_argument("--out", default="deploy_model", help="the export's folder")
    parser.add_argument("--arch", default="cpu", help="Taichi's arch for training (the export is for Vulkan)")
    args = parser.parse_args()

    import taichi as ti
    import tinn
    import tinn.deploy

    image = load_image(args.image)
    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN)
    model = tinn.create_from_config(2, 3, "config_hash")
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        xy = rng.random((args.batch, 2), dtype=np.float32)
        loss = model.trainer.training_step(xy, lookup(image, xy))
        if step % 100 == 0 or step == args.steps:
            print(f"step {step}: loss {float(loss):.5f} ({time.perf_counter() - start:.1f} s)")
    meta = tinn.deploy.export(model, args.out)
    rendered = np.clip(model.network.inference(pixel_centres()), 0.0, 1.0).reshape(SIZE, SIZE, 3)
    iio.imwrite(os.path.join(args.out, "python.png"), (rendered * 255 + 0.5).astype(np.uint8))
    print(f"exported {meta['n_params']} parameters to {args.out}/ (model.tcm, params.bin, model.json)")


if __name__ == "__main__":
    main()
