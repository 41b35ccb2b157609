"""Scenes for the NeRF examples: a NeRF-synthetic folder (``transforms_{train,test}.json``), read or
rendered once with Mitsuba 3, and the camera rays, metrics and image writers both examples share.

The layout is the NeRF-synthetic one (Mildenhall et al. 2020): ``camera_angle_x`` (horizontal field of
view, radians) and ``frames``, each with ``file_path`` (relative, without ``.png``) and
``transform_matrix`` (4x4 camera-to-world, OpenGL axes: the camera looks down -z, +y up, +x right).
Images are RGBA; the examples composite them on a white background, as NeRF does.
"""
import argparse
import json
import os
import time

import numpy as np
from _curves import titled
from _progress import Progress

WHITE = np.ones(3, np.float32)
STEPS, RAYS, SAMPLES = 400, 2048, 64                # the default run, shared by both examples


class Views:
    """``images (N, H, W, 3)`` float32 in [0, 1], ``c2w (N, 4, 4)`` and the focal length in pixels."""

    def __init__(self, images, c2w, focal):
        self.images, self.c2w, self.focal = images, c2w.astype(np.float32), float(focal)
        self.n, self.height, self.width = images.shape[:3]

    def rays(self):
        """Origins and unit directions ``(N * H * W, 3)`` of every pixel, and the colours ``(N * H * W, 3)``."""
        o, d = camera_rays(self.c2w, self.height, self.width, self.focal)
        return o, d, self.images.reshape(-1, 3)


def camera_rays(c2w, height, width, focal):
    """Pixel-centre rays ``(len(c2w) * H * W, 3)`` of pinhole cameras in NeRF's convention."""
    i, j = np.meshgrid(np.arange(width, dtype=np.float32) + 0.5, np.arange(height, dtype=np.float32) + 0.5)
    cam = np.stack([(i - 0.5 * width) / focal, -(j - 0.5 * height) / focal, -np.ones_like(i)], -1).reshape(-1, 3)
    d = np.einsum("nij,pj->npi", c2w[:, :3, :3], cam)
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    o = np.broadcast_to(c2w[:, None, :3, 3], d.shape)
    return np.ascontiguousarray(o.reshape(-1, 3), np.float32), np.ascontiguousarray(d.reshape(-1, 3), np.float32)


def look_at(position, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)):
    """Camera-to-world (OpenGL axes) of a camera at ``position`` looking at ``target``, z up."""
    p = np.asarray(position, np.float64)
    f = np.asarray(target, np.float64) - p
    f /= np.linalg.norm(f)
    r = np.cross(f, up)
    r /= np.linalg.norm(r)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = r, np.cross(r, f), -f, p
    return m


def orbit(n, radius=4.0, elevation_deg=30.0, rng=None):
    """``n`` camera-to-world matrices on a sphere of ``radius`` around the origin: a turntable at one
    elevation, or random azimuths and elevations in [10, 60] degrees when ``rng`` is given."""
    if rng is None:
        azimuth, elevation = np.linspace(0, 2 * np.pi, n, endpoint=False), np.full(n, np.radians(elevation_deg))
    else:
        azimuth, elevation = rng.uniform(0, 2 * np.pi, n), np.radians(rng.uniform(10, 60, n))
    pos = radius * np.stack([np.cos(azimuth) * np.cos(elevation), np.sin(azimuth) * np.cos(elevation),
                             np.sin(elevation)], -1)
    return np.stack([look_at(p) for p in pos])


def load_split(folder, split, downscale=1, limit=None):
    """The views of ``transforms_{split}.json`` in ``folder``, composited on white, ``downscale``d by
    averaging ``downscale x downscale`` blocks; the first ``limit`` frames when given."""
    import imageio.v2 as imageio
    path = os.path.join(folder, f"transforms_{split}.json")
    with open(path) as f:
        meta = json.load(f)
    frames = meta["frames"][:limit]
    images, c2w = [], []
    reading = Progress(len(frames), f"reading {split}")
    for k, frame in enumerate(frames):
        name = os.path.join(folder, frame["file_path"])
        img = imageio.imread(name if name.endswith(".png") else name + ".png").astype(np.float32) / 255.0
        if img.shape[-1] == 4:
            img = img[..., :3] * img[..., 3:] + (1 - img[..., 3:]) * WHITE
        h, w = img.shape[0] // downscale * downscale, img.shape[1] // downscale * downscale
        img = img[:h, :w, :3].reshape(h // downscale, downscale, w // downscale, downscale, 3).mean((1, 3))
        images.append(img)
        c2w.append(np.array(frame["transform_matrix"], np.float32))
        reading.update(k + 1)
    width = images[0].shape[1]
    focal = 0.5 * width / np.tan(0.5 * float(meta["camera_angle_x"]))
    return Views(np.stack(images).astype(np.float32), np.stack(c2w), focal)


# --- a scene rendered with Mitsuba 3 -----------------------------------------------------------------------

FOV_X = 0.6911112070083618                          # NeRF-synthetic's camera_angle_x (about 39.6 degrees)


def mitsuba_scene():
    """Four diffuse objects (a checkered box, a red and a green ball, a yellow slab) under an environment and
    a sun; everything inside [-1, 1]^3, the NeRF-synthetic camera distance is 4."""
    import mitsuba as mi

    def diffuse(rgb):
        return {"type": "diffuse", "reflectance": {"type": "rgb", "value": rgb}}

    T = mi.ScalarTransform4f
    checker = {"type": "diffuse", "reflectance": {
        "type": "checkerboard", "color0": {"type": "rgb", "value": [0.1, 0.25, 0.8]},
        "color1": {"type": "rgb", "value": [0.95, 0.95, 0.9]}, "to_uv": T().scale([4, 4, 1])}}
    return {
        "type": "scene",
        "integrator": {"type": "path", "max_depth": 4, "hide_emitters": True},
        "env": {"type": "constant", "radiance": {"type": "rgb", "value": 0.45}},
        "sun": {"type": "directional", "direction": [-0.4, -0.3, -1.0], "irradiance": {"type": "rgb", "value": 2.2}},
        "box": {"type": "cube", "bsdf": checker,
                "to_world": T().translate([-0.3, -0.25, -0.35]).rotate([0, 0, 1], 30).scale([0.42, 0.42, 0.42])},
        "red": {"type": "sphere", "center": [0.45, 0.1, -0.35], "radius": 0.42, "bsdf": diffuse([0.85, 0.12, 0.1])},
        "green": {"type": "sphere", "center": [-0.25, -0.2, 0.4], "radius": 0.3, "bsdf": diffuse([0.15, 0.7, 0.2])},
        "slab": {"type": "cube", "bsdf": diffuse([0.95, 0.75, 0.1]),
                 "to_world": T().translate([0.2, 0.55, -0.62]).rotate([0, 0, 1], -20).scale([0.5, 0.2, 0.15])},
    }


def render_mitsuba(folder, size=200, n_train=100, n_test=20, spp=16, seed=0):
    """Render the scene from ``n_train`` + ``n_test`` random views into ``folder`` (RGBA PNGs and
    ``transforms_{train,test}.json``); returns the seconds it took."""
    import imageio.v2 as imageio
    import mitsuba as mi
    mi.set_variant("scalar_rgb")
    scene = mi.load_dict(mitsuba_scene())
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    splits = {"train": orbit(n_train, rng=rng), "test": orbit(n_test, rng=rng)}
    done, total = 0, n_train + n_test
    rendering = Progress(total, "rendering with Mitsuba")
    for split, poses in splits.items():
        os.makedirs(os.path.join(folder, split), exist_ok=True)
        frames = []
        for k, c2w in enumerate(poses):
            to_world = c2w @ np.diag([-1.0, 1.0, -1.0, 1.0])        # Mitsuba's camera: +z forward, +x left
            sensor = mi.load_dict({
                "type": "perspective", "fov": float(np.degrees(FOV_X)), "fov_axis": "x",
                "to_world": mi.ScalarTransform4f(to_world.tolist()),
                "sampler": {"type": "independent", "sample_count": spp},
                "film": {"type": "hdrfilm", "width": size, "height": size, "pixel_format": "rgba",
                         "rfilter": {"type": "box"}}})
            img = np.array(mi.render(scene, sensor=sensor, seed=done), np.float32)
            rgb = np.clip(img[..., :3], 0, None)
            srgb = np.where(rgb <= 0.0031308, 12.92 * rgb, 1.055 * np.power(rgb, 1 / 2.4) - 0.055)
            rgba = np.concatenate([np.clip(srgb, 0, 1), np.clip(img[..., 3:], 0, 1)], -1)
            imageio.imwrite(os.path.join(folder, split, f"r_{k}.png"), (rgba * 255 + 0.5).astype(np.uint8))
            frames.append({"file_path": f"./{split}/r_{k}", "transform_matrix": c2w.tolist()})
            done += 1
            rendering.update(done)
        with open(os.path.join(folder, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": FOV_X, "frames": frames}, f, indent=1)
    return time.perf_counter() - start


class OccupancyGrid:
    """``res^3`` cells over the box: a cell is occupied while its decayed maximum density is above
    ``min(mean, threshold)`` (Instant-NGP), ``threshold`` the density that makes one sample's alpha 0.01."""

    def __init__(self, res, step, decay=0.95):
        self.res, self.decay = res, decay
        self.threshold = -np.log(1 - 0.01) / step
        self.density = np.full(res ** 3, np.inf, np.float32)           # all occupied until the first update
        self.occupied = np.ones((res, res, res), bool)

    def update(self, density_at, rng):
        """``density_at(q)`` gives sigma at normalised points ``q (n, 3)`` in [0, 1)^3, one per cell
        (uniform in the cell); returns the occupied fraction."""
        idx = np.stack(np.meshgrid(*[np.arange(self.res)] * 3, indexing="ij"), -1).reshape(-1, 3)
        q = ((idx + rng.random(idx.shape)) / self.res).astype(np.float32)
        new = density_at(q)
        old = np.where(np.isfinite(self.density), self.density * self.decay, 0.0)
        self.density = np.maximum(old, new).astype(np.float32)
        self.occupied = (self.density > min(self.threshold, float(self.density.mean()))).reshape((self.res,) * 3)
        return float(self.occupied.mean())


def positive(text):
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return v


def add_arguments(ap):
    """The arguments both NeRF examples take (scene, sampling, training, output)."""
    ap.add_argument("--data", help="a NeRF-synthetic folder (transforms_train.json, ...) instead of the Mitsuba scene")
    ap.add_argument("--scene", default=os.path.join("OUT", "nerf_scene"),
                    help="where the Mitsuba scene is rendered once and cached (OUT: the --out directory)")
    ap.add_argument("--render-size", type=positive, default=200, help="Mitsuba image size (pixels per side)")
    ap.add_argument("--spp", type=positive, default=16, help="Mitsuba samples per pixel")
    ap.add_argument("--downscale", type=positive, default=2, help="train and test on images this many times smaller")
    ap.add_argument("--test-views", type=positive, default=20, help="held-out views to evaluate")
    ap.add_argument("--steps", type=positive, default=STEPS, help="training steps")
    ap.add_argument("--rays", type=positive, default=RAYS, help="rays per training step")
    ap.add_argument("--samples", type=positive, default=SAMPLES, help="samples per ray")
    ap.add_argument("--bound", type=float, default=1.5, help="the scene's box is [-bound, bound]^3")
    ap.add_argument("--occupancy", type=positive, default=32, help="occupancy grid cells per axis")
    ap.add_argument("--turntable", type=positive, default=24, help="frames of the turntable GIF")
    ap.add_argument("--no-render", action="store_true", help="skip the turntable GIF (the held-out renders are kept)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the training run")
    ap.add_argument("--out", default="out", help="directory for the held-out renders and the turntable GIF")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line last")


def check_arguments(ap, args):
    if not args.bound > 0:
        ap.error("--bound must be positive")
    parts = args.scene.split(os.sep)
    if parts[0] == "OUT":                               # the default: the cache lives under --out
        args.scene = os.path.join(args.out, *parts[1:])


def load_scene(args, parser):
    """The training and held-out views: ``--data``, or the Mitsuba scene rendered once into ``--scene``."""
    folder = args.data
    if folder is None:
        folder = args.scene
        if not os.path.exists(os.path.join(folder, "transforms_test.json")):
            try:
                import mitsuba  # noqa: F401
            except ImportError:
                parser.error("rendering the default scene needs Mitsuba 3 (pip install 'tinn[nerf]'), "
                             "or pass --data DIR, a NeRF-synthetic folder")
            seconds = render_mitsuba(folder, size=args.render_size, spp=args.spp)
            print(f"rendered the scene with Mitsuba into {folder} in {seconds:.1f} s")
    elif not os.path.exists(os.path.join(folder, "transforms_train.json")):
        parser.error(f"--data: {folder!r} has no transforms_train.json")
    train = load_split(folder, "train", args.downscale)
    test = load_split(folder, "test", args.downscale, limit=args.test_views)
    return train, test


def occupancy_step(bound, samples):
    """The length of a sample step along the box's diagonal: the occupancy grid's threshold step."""
    return 2 * bound * np.sqrt(3) / samples


class TrainingLog:
    """The training loss step by step: a progress bar, and the time at which the training PSNR (of the
    mean loss over the last 25 steps) first reached each of ``MILESTONES`` dB (the time-to-PSNR figures)."""

    MILESTONES = (20, 25, 28, 30)

    def __init__(self, steps, clock=None, show=True):
        """``steps``: the steps to make (``None``: a run for a time); ``clock``: the seconds trained so far
        (default: since now); ``show``: print the progress (else the caller does)."""
        self.steps, self.start, self.losses, self.reached = steps, time.perf_counter(), [], {}
        self.clock = clock if clock is not None else (lambda: time.perf_counter() - self.start)
        self.progress = Progress(steps, "training") if show else None
        self.train_psnr = 0.0

    @property
    def n_steps(self):
        """The steps logged so far."""
        return len(self.losses)

    def add(self, step, loss, occupied):
        """``loss``: the mean loss of the steps since the last call (each of them gets it), up to ``step``."""
        self.losses.extend([loss] * (step - len(self.losses)))
        self.train_psnr = train_psnr = -10 * np.log10(max(np.mean(self.losses[-25:]), 1e-10))
        elapsed = self.clock()
        for m in self.MILESTONES:
            if train_psnr >= m and m not in self.reached and len(self.losses) >= 25:
                self.reached[m] = elapsed
        if self.progress is not None:
            self.progress.update(step, PSNR=f"{train_psnr:.2f}dB", occupied=f"{occupied:.0%}")

    def seconds(self):
        return self.clock()

    def summary(self):
        return "training PSNR " + (", ".join(f"{m} dB at {t:.0f} s" for m, t in self.reached.items()) or
                                   f"below {self.MILESTONES[0]} dB")


def update_occupancy(step, grid, density_at, rng):
    """Instant-NGP's schedule: every 16 steps from step 64 on; the occupied fraction."""
    if step % 16 == 0 and step >= 64:
        grid.update(density_at, rng)
    return float(grid.occupied.mean())


def report(args, prefix, log, test, render_images):
    """Held-out PSNR (and the mean colour's, a trivial baseline), the renders and the turntable."""
    train_seconds, start = log.seconds(), time.perf_counter()
    predictions = render_images(test.c2w)
    score = psnr(predictions, test.images)
    print(f"held-out PSNR {score:.2f} dB over {test.n} views (mean-colour baseline "
          f"{psnr(test.images.mean((0, 1, 2)), test.images):.2f} dB); training {train_seconds:.1f} s "
          f"({log.summary()}), rendering {time.perf_counter() - start:.1f} s")
    render_seconds = time.perf_counter() - start
    turntable = None if args.no_render else render_turntable(render_images, args.turntable)
    for path in save_results(args.out, prefix, test.images, predictions, turntable, score):
        print(f"wrote {path}")
    if args.json:
        print(json.dumps(dict(psnr=score, baseline_psnr=psnr(test.images.mean((0, 1, 2)), test.images),
                              train_s=train_seconds, render_s=render_seconds,
                              psnr_reached_at_s={str(m): t for m, t in log.reached.items()})))
    return score


def psnr(a, b):
    return float(10 * np.log10(1.0 / np.mean((np.asarray(a, np.float64) - b) ** 2)))


def to_uint8(img):
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def render_turntable(render_images, n):
    """``n`` frames ``(n, H, W, 3)`` around the scene, one render at a time with progress."""
    frames, rendering = [], Progress(n, "turntable")
    for k, c2w in enumerate(orbit(n)):
        frames.append(render_images(c2w[None])[0])
        rendering.update(k + 1)
    return np.stack(frames)


def enlarged(img, min_width):
    """``img`` repeated pixel by pixel until it is at least ``min_width`` wide (titles fit above it)."""
    k = max(1, -(-min_width // img.shape[1]))
    return img.repeat(k, 0).repeat(k, 1)


def test_picture(targets, predictions, score, k=8):
    """Up to ``k`` held-out views above their renders, each row titled (the renders' PSNR in the title)."""
    k = min(k, len(targets))
    rows = [enlarged(to_uint8(np.concatenate(list(views[:k]), 1)), 400) for views in (targets, predictions)]
    return np.concatenate([titled(rows[0], "HELD-OUT VIEWS (TARGETS)"),
                           titled(rows[1], f"RENDERS OF THE SAME VIEWS (PSNR {score:.2f} DB)")], 0)


def save_results(out, prefix, targets, predictions, turntable, score):
    """``{prefix}_test.png`` (:func:`test_picture`) and, unless ``turntable`` is ``None``,
    ``{prefix}_turntable.gif``; the paths written."""
    import imageio.v2 as imageio
    paths = [os.path.join(out, f"{prefix}_test.png")]
    imageio.imwrite(paths[0], test_picture(targets, predictions, score))
    if turntable is not None:
        paths.append(os.path.join(out, f"{prefix}_turntable.gif"))
        imageio.mimsave(paths[1], [to_uint8(f) for f in turntable], duration=0.08, loop=0)
    return paths
