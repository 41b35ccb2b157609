"""Fit a neural signed distance function (SDF) of a torus, with and without an exact Eikonal term.

    python examples/sdf_eikonal.py [--steps N] [--lam L] [--out DIR]

Data: points on the surface (f = 0) and a few points with their exact distance (they fix the sign
and scale). The Eikonal term ``lam * mean (|grad_x f| - 1)^2`` on random points of the cube asks f
to be a distance everywhere else. Both terms are one differentiable Taichi program under
``ti.ad.Tape``: the data term through ``tinn.ad.stage``, the Eikonal term through
``tinn.ad.gradient_stage``, whose reverse pass is tinn's exact second-order backward
(``backward_backward_input``), not a finite-difference approximation.

The same network is trained twice, without and with the Eikonal term; printed for each: the
mean |SDF error| on held-out points of the cube and the mean ||grad f| - 1|. Writes
``sdf_slices.png``: the slice z = 0.5 of the true SDF, the data-only fit and the Eikonal fit
(orange outside, blue inside, bands every 0.05, the surface in white).
"""
import argparse
import os
import time

import numpy as np
import taichi as ti

import tinn
from _curves import SCALE, titled
from _progress import Progress

CENTRE, MAJOR, MINOR = np.array([0.5, 0.5, 0.5]), 0.28, 0.1          # a torus around the y axis
ENCODING = {"otype": "Frequency", "n_frequencies": 4}
NETWORK = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 3, "activation": "Softplus",
           "output_activation": "None"}
OPTIMIZER = {"otype": "Adam", "learning_rate": 3e-3, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15}


def true_sdf(p):
    q = p - CENTRE
    ring = np.sqrt(q[:, 0] ** 2 + q[:, 2] ** 2) - MAJOR
    return np.sqrt(ring ** 2 + q[:, 1] ** 2) - MINOR


def surface_points(rng, n):
    u, v = rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, n)
    rad = MAJOR + MINOR * np.cos(v)
    return (CENTRE + np.stack([rad * np.cos(u), MINOR * np.sin(v), rad * np.sin(u)], -1)).astype(np.float32)


class Fit:
    """One network and the program that trains it: data term (stage), optional Eikonal term (gradient stage)."""

    def __init__(self, n_surface, n_anchors, n_eikonal, lam, eikonal: bool, seed=0):
        self.net = tinn.NetworkWithInputEncoding(3, 1, ENCODING, NETWORK, seed=seed)
        self.trainer = tinn.Trainer(self.net, tinn.create_optimizer(OPTIMIZER), tinn.create_loss({"otype": "L2"}))
        n_data = n_surface + n_anchors
        self.x = ti.Vector.field(3, ti.f32, n_data)
        self.f = ti.Vector.field(1, ti.f32, n_data, needs_grad=True)
        self.target, self.weight = ti.field(ti.f32, n_data), ti.field(ti.f32, n_data)
        self.xe = ti.Vector.field(3, ti.f32, n_eikonal)
        self.g = ti.Vector.field(3, ti.f32, n_eikonal, needs_grad=True)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.data = tinn.ad.stage(self.net, self.x, self.f)
        self.gradient = tinn.ad.gradient_stage(self.net, self.xe, self.g) if eikonal else None
        w = np.concatenate([np.full(n_surface, 1 / n_surface), np.full(n_anchors, 1 / n_anchors)])
        self.weight.from_numpy(w.astype(np.float32))
        f, target, weight, g, loss = self.f, self.target, self.weight, self.g, self.loss

        @ti.kernel
        def data_loss():
            for i in f:
                loss[None] += weight[i] * (f[i][0] - target[i]) ** 2

        @ti.kernel
        def eikonal_loss():
            for i in g:
                loss[None] += lam / n_eikonal * (g[i].norm() - 1.0) ** 2

        self._data_loss, self._eikonal_loss = data_loss, eikonal_loss

    def step(self, surface, anchors, anchor_sdf, random_points):
        self.x.from_numpy(np.concatenate([surface, anchors]))
        self.target.from_numpy(np.concatenate([np.zeros(len(surface), np.float32), anchor_sdf]))
        self.xe.from_numpy(random_points)
        self.net.zero_grad()
        with ti.ad.Tape(loss=self.loss):
            self.data()
            self._data_loss()
            if self.gradient is not None:
                self.gradient()
                self._eikonal_loss()
        self.trainer.optimizer_step()               # the loss stays in its field until someone prints it

    def evaluate(self, points):
        """Mean |f - SDF| and mean ||grad f| - 1| at ``points`` (batch API)."""
        f, ctx = self.net.forward(points)
        grad = self.net.backward(ctx, np.ones_like(f))
        return (float(np.mean(np.abs(f[:, 0] - true_sdf(points)))),
                float(np.mean(np.abs(np.linalg.norm(grad, axis=1) - 1))))


def slice_image(values, size):
    """Orange outside, blue inside, darker bands every 0.05, white at the surface."""
    v = values.reshape(size, size)
    outside = np.stack([np.ones_like(v), 0.6 * np.ones_like(v), 0.25 * np.ones_like(v)], -1)
    inside = np.stack([0.3 * np.ones_like(v), 0.55 * np.ones_like(v), np.ones_like(v)], -1)
    img = np.where(v[..., None] > 0, outside, inside)
    img = img * (0.75 + 0.25 * np.cos(2 * np.pi * v / 0.05)[..., None])
    img = img * (1 - np.exp(-np.abs(v) * 8))[..., None]
    return np.where(np.abs(v)[..., None] < 0.004, 1.0, img)


def ensure_out_dir(parser: argparse.ArgumentParser, path: str):
    """Create the output directory ``path`` now (before training), or exit with the parser's error."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        parser.error(f"--out: cannot create {path!r}: {e.strerror}")
    if not os.access(path, os.W_OK):
        parser.error(f"--out: {path!r} is not writable")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=600, help="training steps of each of the two fits")
    ap.add_argument("--surface", type=int, default=2048, help="surface points per step")
    ap.add_argument("--anchors", type=int, default=64, help="points with a known distance (fixed)")
    ap.add_argument("--eikonal", type=int, default=2048, help="Eikonal points per step")
    ap.add_argument("--lam", type=float, default=0.1, help="weight of the Eikonal term")
    ap.add_argument("--arch", default="cpu", help="Taichi arch (cpu, cuda, vulkan, metal, ...)")
    ap.add_argument("--out", default="out", help="directory for sdf_slices.png (created if missing)")
    args = ap.parse_args()
    ensure_out_dir(ap, args.out)
    tinn.init(getattr(ti, args.arch))

    rng = np.random.default_rng(0)
    anchors = rng.random((args.anchors, 3), dtype=np.float32)
    anchor_sdf = true_sdf(anchors).astype(np.float32)
    held_out = np.random.default_rng(1).random((8192, 3), dtype=np.float32)
    size = 128
    u = (np.arange(size) + 0.5) / size
    X, Y = np.meshgrid(u, u, indexing="xy")
    plane = np.stack([X, Y, np.full_like(X, 0.5)], -1).reshape(-1, 3).astype(np.float32)
    images = [slice_image(true_sdf(plane), size)]
    results = {}
    for name, use_eikonal in (("data only", False), ("data + Eikonal", True)):
        fit = Fit(args.surface, args.anchors, args.eikonal, args.lam, use_eikonal)
        step_rng = np.random.default_rng(2)
        start = time.perf_counter()
        progress = Progress(args.steps, f"[{name}] training")
        for step in range(1, args.steps + 1):
            fit.step(surface_points(step_rng, args.surface), anchors, anchor_sdf,
                     step_rng.random((args.eikonal, 3), dtype=np.float32))
            progress.update(step)
            if step == 1 or step % 100 == 0 or step == args.steps:
                err, eik = fit.evaluate(held_out)
                progress.write(f"[{name}] step {step:4d}: loss {float(fit.loss[None]):.5f}  "
                               f"mean |SDF error| {err:.4f}  mean ||grad f| - 1| {eik:.3f}  "
                               f"({time.perf_counter() - start:.1f} s)")
        progress.close()
        results[name] = fit.evaluate(held_out)
        images.append(slice_image(fit.net.inference(plane)[:, 0], size))
    for name, (err, eik) in results.items():
        print(f"{name:15s}: mean |SDF error| {err:.4f}, mean ||grad f| - 1| {eik:.3f} on {len(held_out)} held-out points")
    import imageio.v2 as imageio
    path = os.path.join(args.out, "sdf_slices.png")
    titles = ["TRUE SDF"] + [f"{name}, ERROR {err:.4f}" for name, (err, _) in results.items()]
    imageio.imwrite(path, slices_picture(images, titles))
    print(f"wrote {path} (true SDF | data only | data + Eikonal, slice z = 0.5)")


def slices_picture(images, titles):
    """The slices side by side, 2x2 pixels per pixel, each under its title, under a title saying what they are."""
    gap = np.full((images[0].shape[0] * 2 + 7 * SCALE + 6, 8, 3), 255, np.uint8)
    panels = [titled((np.clip(img, 0, 1) * 255).astype(np.uint8).repeat(2, 0).repeat(2, 1), title)
              for img, title in zip(images, titles)]
    row = np.concatenate([p for panel in panels for p in (panel, gap)][:-1], 1)
    return titled(row, "SLICE Z = 0.5 OF THE TORUS: SIGNED DISTANCE, BLUE INSIDE, WHITE AT 0, BANDS EVERY 0.05")


if __name__ == "__main__":
    main()
