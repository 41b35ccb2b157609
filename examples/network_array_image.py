"""Learn an image with a grid of tiny networks, one per tile (KiloNeRF in 2-D), in one tinn object.

    python examples/network_array_image.py [IMAGE] [CONFIG] [--tiles T] [--batch B] [--seconds S]

The image is cut into T x T tiles; network ``ty * T + tx`` sees the coordinates local to
its tile, and every training sample is routed to the network of the tile it falls in
(``instance=``). The same config then trains ONE network whose width is chosen to have the
same total parameter count, for the same wall-clock time, and both PSNRs are printed. Writes both
reconstructions (``network_array_{array,single}.jpg``) and, side by side with their titles,
``network_array_compare.png``.
"""
import argparse
import os
import sys
import time

import imageio.v3 as iio
import numpy as np
import taichi as ti

import tinn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _curves import titled  # noqa: E402
from _progress import Progress, clock  # noqa: E402
from mlp_learning_an_image import bilinear_lookup, load_image, pixel_centres, psnr, write_jpg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def to_tiles(xy, tiles):
    """Tile-local coordinates in [0, 1)^2 and the tile (network) index of each point."""
    cell = np.minimum((xy * tiles).astype(np.int32), tiles - 1)
    local = (xy * tiles - cell).astype(np.float32)
    return local, (cell[:, 1] * tiles + cell[:, 0]).astype(np.int32)


def width_for(n_params, config):
    """The MLP width whose parameter count is closest to n_params (same depth and encoding)."""
    def count(width):
        cfg = dict(config, network=dict(config["network"], n_neurons=width))
        return tinn.NetworkWithInputEncoding(2, 3, cfg["encoding"], cfg["network"]).n_params
    return min(range(8, 1025, 8), key=lambda w: abs(count(w) - n_params))


def train(name, model, image, coords, batch, seconds, route):
    rng = np.random.default_rng(0)
    xy = np.empty((batch, 2), np.float32)
    target = np.empty((batch, 3), np.float32)
    steps, t_start = 0, time.perf_counter()
    progress = Progress(None, f"  [{name}] training")
    while time.perf_counter() - t_start < seconds:
        rng.random(out=xy, dtype=np.float32)
        bilinear_lookup(image, xy, target)
        x, instance = route(xy)
        loss = model.trainer.training_step(x, target, instance)
        steps += 1
        elapsed = time.perf_counter() - t_start
        progress.update(steps, loss=f"{loss:.5f}", samples_per_s=f"{steps * batch / elapsed / 1e6:.3f}M",
                        left=clock(max(seconds - elapsed, 0)))
    progress.close()
    elapsed = time.perf_counter() - t_start
    x, instance = route(coords)
    result = np.concatenate([model.network.inference(x[s:s + (1 << 18)],
                                                     None if instance is None else instance[s:s + (1 << 18)])
                             for s in range(0, len(x), 1 << 18)]).reshape(image.shape)
    return steps, steps * batch / elapsed, psnr(result, image), result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("image", nargs="?", default=os.path.join(ROOT, "data", "images", "default.jpg"),
                    help="image to learn")
    ap.add_argument("config", nargs="?", default="config_network_array",
                    help="tcnn JSON config file, or the name of a config shipped with tinn")
    ap.add_argument("--tiles", type=int, default=16, help="tiles per side: tiles^2 networks")
    ap.add_argument("--batch", type=int, default=1 << 16, help="samples per step")
    ap.add_argument("--seconds", type=float, default=30.0, help="training time of each model")
    ap.add_argument("--out", default="out", help="folder for the two reconstructions")
    ap.add_argument("--arch", default="cpu", help="Taichi arch (cpu, cuda, vulkan, metal, ...)")
    args = ap.parse_args()

    tinn.init(arch=getattr(ti, args.arch), log_level=ti.WARN)
    image = load_image(args.image)
    coords = pixel_centres(*image.shape[:2])
    config = tinn.load_config(args.config)
    os.makedirs(args.out, exist_ok=True)

    K = args.tiles ** 2
    array = tinn.create_from_config(2, 3, config, n_instances=K)
    total = K * array.network.n_params
    width = width_for(total, config)
    big_config = dict(config, network=dict(config["network"], n_neurons=width))
    big = tinn.create_from_config(2, 3, big_config)
    print(f"{K} networks of {array.network.n_params} parameters ({total} in all) "
          f"against one network of width {width} with {big.network.n_params} parameters; "
          f"{args.seconds:g} s of training each, batch {args.batch}")

    results, images = {}, []
    for name, model, route in (("array", array, lambda xy: to_tiles(xy, args.tiles)),
                               ("single", big, lambda xy: (xy, None))):
        steps, speed, quality, image_out = train(name, model, image, coords, args.batch, args.seconds, route)
        write_jpg(os.path.join(args.out, f"network_array_{name}.jpg"), image_out)
        results[name] = (steps, speed, quality)
        images.append(image_out)
    print(f"{'model':8s} {'steps':>6s} {'M samples/s':>12s} {'PSNR dB':>8s}")
    for name, (steps, speed, quality) in results.items():
        print(f"{name:8s} {steps:6d} {speed / 1e6:12.3f} {quality:8.2f}")
    path = os.path.join(args.out, "network_array_compare.png")
    titles = [f"{K} NETWORKS, ONE PER TILE: {results['array'][2]:.2f} DB, {results['array'][0]} STEPS",
              f"ONE NETWORK OF WIDTH {width}: {results['single'][2]:.2f} DB, {results['single'][0]} STEPS"]
    iio.imwrite(path, compare_picture(images, titles, f"{args.seconds:g} S OF TRAINING EACH, ABOUT "
                                                      f"{total} PARAMETERS EACH"))
    print(f"wrote {path}")


def compare_picture(images, titles, title):
    """The reconstructions side by side, each under its title, under ``title``."""
    panels = [titled((np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8), t) for img, t in zip(images, titles)]
    gap = np.full((panels[0].shape[0], 12, 3), 255, np.uint8)
    return titled(np.concatenate([panels[0], gap, panels[1]], 1), title)


if __name__ == "__main__":
    main()
