"""Learn a 2-D image with a tinn model: tiny-cuda-nn's ``mlp_learning_an_image`` sample on any CPU.

    python examples/mlp_learning_an_image.py [IMAGE] [CONFIG] [--steps N] [--batch B] [--out DIR] [--gui]

Each step draws ``batch`` random coordinates in [0, 1)^2, looks their colours up in
the image with bilinear filtering (pixel centres at ``(i + 0.5) / W``, clamped at the
edges, like tcnn's CUDA texture), and runs one training step. Snapshots of the full
image are written at steps 10, 100, 1000, 2000, ... and at the end, each with its PSNR
against the reference (the image itself, evaluated at pixel centres); the PSNR is also
measured every 100 steps, and ``curves.png`` beside the snapshots plots the loss of every
step and the PSNRs. Progress (step, that step's loss, the last PSNR measured and its step, time
left) is shown at least every few seconds; tcnn's ``Step#N`` lines give the mean loss since the
last one. Pixel values are used as stored (``v / 255``), and grayscale images are learnt as RGB.
Everything is written into ``--out``.
"""
import argparse
import functools
import importlib.util
import math
import os
import sys
import time

T_START = time.perf_counter()

import imageio.v3 as iio  # noqa: E402
import numpy as np  # noqa: E402

from _curves import Panel, write_curves  # noqa: E402
from _progress import Progress  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_IMAGE = os.path.join(ROOT, "data", "images", "default.jpg")
DEFAULT_CONFIG = "config_hash"
ARCHS = ("cpu", "cuda", "vulkan", "metal", "opengl", "gles", "amdgpu", "dx11", "gpu")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".exr", ".bmp", ".tif", ".tiff", ".gif", ".webp", ".hdr")


def shipped_configs():
    """The names of the configs shipped in ``tinn/configs``, found without importing tinn (and so Taichi)."""
    spec = importlib.util.find_spec("tinn")
    folder = os.path.join(os.path.dirname(spec.origin), "configs")
    return sorted(name.removesuffix(".json") for name in os.listdir(folder) if name.endswith(".json"))


def load_image(path):
    """The image as float32 (H, W, 3) in [0, 1]; grayscale becomes RGB, alpha is dropped."""
    img = np.asarray(iio.imread(path))
    if img.ndim == 2:
        img = img[:, :, None]
    img = img[:, :, :3]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    scale = 65535.0 if img.dtype == np.uint16 else 255.0
    return np.ascontiguousarray(img.astype(np.float32) / scale)


def bilinear_lookup(image, xy, rgb):
    """rgb[b] = image at xy[b] = (x right, y down) in [0, 1]^2, bilinear, clamped to the edges.

    ``image`` (H, W, 3), ``xy`` (B, 2), ``rgb`` (B, 3), float32; a Taichi kernel built on first use.
    """
    _bilinear_kernel()(image, xy, rgb)


@functools.lru_cache(maxsize=None)
def _bilinear_kernel():
    import taichi as ti            # imported when needed: --help and argument errors never start Taichi

    @ti.kernel
    def lookup(image: ti.types.ndarray(dtype=ti.math.vec3, ndim=2), xy: ti.types.ndarray(dtype=ti.math.vec2, ndim=1),
               rgb: ti.types.ndarray(dtype=ti.math.vec3, ndim=1)):
        H, W = image.shape[0], image.shape[1]
        for b in range(xy.shape[0]):
            p = xy[b] * ti.math.vec2(W, H) - 0.5
            corner = ti.floor(p)
            t = p - corner
            x0, y0 = ti.cast(corner[0], ti.i32), ti.cast(corner[1], ti.i32)
            x1, y1 = ti.math.clamp(x0 + 1, 0, W - 1), ti.math.clamp(y0 + 1, 0, H - 1)
            x0, y0 = ti.math.clamp(x0, 0, W - 1), ti.math.clamp(y0, 0, H - 1)
            top = image[y0, x0] * (1.0 - t[0]) + image[y0, x1] * t[0]
            bottom = image[y1, x0] * (1.0 - t[0]) + image[y1, x1] * t[0]
            rgb[b] = top * (1.0 - t[1]) + bottom * t[1]

    return lookup


def pixel_centres(h, w):
    ys = (np.arange(h, dtype=np.float32) + 0.5) / h
    xs = (np.arange(w, dtype=np.float32) + 0.5) / w
    gx, gy = np.meshgrid(xs, ys)
    return np.stack([gx.ravel(), gy.ravel()], axis=1)


def render(network, coords, shape, chunk=1 << 18):
    out = np.empty((len(coords), 3), np.float32)
    for s in range(0, len(coords), chunk):
        out[s:s + chunk] = network.inference(coords[s:s + chunk])
    return out.reshape(shape)


def is_snapshot(step):
    """tcnn's schedule: steps 10, 100, 1000, then every 1000."""
    return step in (10, 100) or (step >= 1000 and step % 1000 == 0)


PSNR_EVERY = 100          # steps between PSNR measurements for the curve (besides the snapshots)


def psnr(prediction, reference):
    mse = float(np.mean((np.clip(prediction, 0.0, 1.0) - reference) ** 2, dtype=np.float64))
    return 10.0 * math.log10(1.0 / max(mse, 1e-20))


def write_jpg(path, img):
    iio.imwrite(path, (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8), quality=95)


def open_window(shape, enabled):
    if not enabled:
        return None
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        print("--gui: no display found, continuing without a window")
        return None
    try:
        import taichi as ti
        return ti.GUI("tinn: mlp_learning_an_image", res=(shape[1], shape[0]))
    except Exception as e:  # no usable window system
        print(f"--gui: cannot open a window ({e}), continuing without one")
        return None


class Curve:
    """The loss of every step and the PSNRs measured, drawn into one picture."""

    def __init__(self):
        self.losses, self.psnrs = [], []

    def panels(self):
        """The two charts: the loss of every step (log scale) and the PSNR of the whole image."""
        steps = np.arange(1, len(self.losses) + 1)
        at, values = zip(*self.psnrs) if self.psnrs else ((), ())
        return [Panel("TRAINING LOSS OF EACH STEP (LOG SCALE)", steps, np.array(self.losses), log=True),
                Panel("PSNR OF THE WHOLE IMAGE, DB", np.array(at), np.array(values))]

    def write(self, path):
        write_curves(path, self.panels())


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """A bad command line: one line on stderr, exit status 2 (no usage dump, no traceback)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def check_image_and_config(ap, args):
    """``ap.error`` unless ``args.image`` is a file and ``args.config`` a file or a config shipped with tinn."""
    if not os.path.isfile(args.image):
        ap.error(f"IMAGE {args.image!r} is not a file")
    if not os.path.isfile(args.config) and args.config.removesuffix(".json") not in shipped_configs():
        ap.error(f"CONFIG {args.config!r} is not a file nor a config shipped with tinn "
                 f"({', '.join(shipped_configs())})")


def parse_args(argv=None):
    ap = _Parser(description=__doc__.split("\n")[0],
                 epilog="Taichi starts only after the arguments are checked.",
                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("image", nargs="?", default=DEFAULT_IMAGE, metavar="IMAGE",
                    help="image to learn (any format imageio reads)")
    ap.add_argument("config", nargs="?", default=DEFAULT_CONFIG, metavar="CONFIG",
                    help="tcnn JSON config file (comments allowed) or the name of a config shipped with tinn: "
                         f"{', '.join(shipped_configs())}")
    ap.add_argument("--steps", type=_positive, default=1000, help="training steps")
    ap.add_argument("--batch", type=_positive, default=1 << 16, help="samples per step")
    ap.add_argument("--out", default="out", help="folder for the snapshots, reference.jpg and curves.png")
    ap.add_argument("--seed", type=int, default=1337, help="seed of the parameters and of the sampled batches")
    ap.add_argument("--precision", default="float32", choices=("float32", "float16"),
                    help="parameter precision (float16: half the parameter memory, float32 master weights and a "
                         "dynamic loss scale)")
    ap.add_argument("--gui", action="store_true", help="show the reconstruction live in a window")
    ap.add_argument("--arch", default="cpu", choices=ARCHS, metavar="ARCH",
                    help=f"Taichi arch: {', '.join(ARCHS)}")
    args = ap.parse_args(argv)
    if args.image.lower().endswith((".json", ".jsonc")) or args.image in shipped_configs():
        ap.error(f"IMAGE {args.image!r} is a JSON config: the order is IMAGE CONFIG")
    check_image_and_config(ap, args)
    if args.config.lower().endswith(IMAGE_SUFFIXES):
        ap.error(f"CONFIG {args.config!r} is an image: the order is IMAGE CONFIG")
    try:
        args.image_data = load_image(args.image)
    except Exception as e:             # whatever imageio raises for a file it cannot decode
        ap.error(f"IMAGE {args.image!r} cannot be read as an image ({type(e).__name__}: {e})")
    if min(args.image_data.shape[:2]) < 1:
        ap.error(f"IMAGE {args.image!r} is empty")
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    import taichi as ti
    import tinn

    tinn.init(arch=getattr(ti, args.arch))
    try:
        config = tinn.load_config(args.config)
    except (OSError, ValueError) as e:
        ap.error(f"CONFIG: {e}")
    image = args.image_data
    H, W, _ = image.shape
    os.makedirs(args.out, exist_ok=True)
    print(f"Image {args.image}: {W}x{H}; config {args.config}; batch {args.batch}, {args.steps} steps")

    try:
        model = tinn.create_from_config(2, 3, config, seed=args.seed, precision=args.precision)
    except (TypeError, ValueError) as e:
        ap.error(f"CONFIG {args.config!r}: {e}")
    print(f"Model: {model.network.n_params} parameters "
          f"({model.network.encoding.name} -> {model.network.network.name})")
    coords = pixel_centres(H, W)
    write_jpg(os.path.join(args.out, "reference.jpg"), image)
    window = open_window(image.shape, args.gui)

    rng = np.random.default_rng(args.seed)
    xy = np.empty((args.batch, 2), np.float32)
    target = np.empty((args.batch, 3), np.float32)
    snapshots, curve = [], Curve()
    t_train, last_print, losses = 0.0, 0, []
    progress = Progress(args.steps, "training")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        rng.random(out=xy, dtype=np.float32)
        bilinear_lookup(image, xy, target)
        losses.append(model.trainer.training_step(xy, target))
        t_train += time.perf_counter() - t0
        curve.losses.append(losses[-1])
        if step == 1:
            progress.write(f"Start-up (import to first step done): {time.perf_counter() - T_START:.1f} s")

        snapshot = is_snapshot(step) or step == args.steps
        if snapshot:
            progress.write(f"Step#{step}: loss={np.mean(losses):.6f} (mean of steps {last_print + 1}-{step}) "
                           f"steps/s={(step - last_print) / t_train:.2f} "
                           f"samples/s={(step - last_print) * args.batch / t_train:.4g} "
                           f"elapsed={time.perf_counter() - T_START:.1f}s")
            t_train, last_print, losses = 0.0, step, []
        if snapshot or step % PSNR_EVERY == 0:
            result = render(model.network, coords, image.shape)
            curve.psnrs.append((step, psnr(result, image)))
        if snapshot:
            snapshots.append(curve.psnrs[-1])
            write_jpg(os.path.join(args.out, f"{step}.jpg"), result)
            curve.write(os.path.join(args.out, "curves.png"))
            if window is not None:
                window.set_image(np.ascontiguousarray(np.rot90(result, -1)))
                window.show()
        numbers = {"step_loss": f"{curve.losses[-1]:.5f}"}          # this step's loss (Step# lines: a mean)
        if curve.psnrs:                                            # the last PSNR measured, and when
            numbers[f"PSNR(step {curve.psnrs[-1][0]})"] = f"{curve.psnrs[-1][1]:.2f}dB"
        progress.update(step, **numbers)
    progress.close()

    print("PSNR against the reference:")
    for step, value in snapshots:
        print(f"  step {step:>7d}: {value:.2f} dB  ({os.path.join(args.out, f'{step}.jpg')})")
    print(f"Final PSNR: {snapshots[-1][1]:.2f} dB")
    print(f"Loss and PSNR curves: {os.path.join(args.out, 'curves.png')}")


if __name__ == "__main__":
    main()
