"""Learn a 3-D density field from 2-D renderings, through a differentiable ray marcher written in Taichi.

    python examples/raymarch_density.py [--steps N] [--instances K] [--out DIR]

The volume is a few Gaussian blobs in the unit cube, seen by orthographic cameras around it;
a pixel is ``gain * (1 - exp(-sum_j sigma(p_j) dt))`` (absorption only). The marcher is ordinary
Taichi kernels that Taichi differentiates under ``ti.ad.Tape``; the density network
(``sigma = softplus(raw)``, HashGrid + MLP, or ``--instances K`` micro-networks, one per cell of a
K^(1/3)-cube, KiloNeRF-style) is a ``tinn.ad.stage`` between them, trained through tinn's batch
backward. The sensor ``gain`` is a user parameter (a Taichi field) learned jointly from its
Tape gradient: it starts at 1 and the images were taken with 0.8.

Prints the training loss, the held-out views' PSNR and the learned gain; writes
``raymarch_views.png`` (held-out targets above, predictions below).
"""
import argparse
import os
import time

import numpy as np
import taichi as ti

import tinn
from _curves import titled
from _progress import Progress
from sdf_eikonal import ensure_out_dir

BLOBS = [((0.35, 0.40, 0.45), 0.10, 30.0), ((0.65, 0.60, 0.55), 0.14, 18.0),
         ((0.55, 0.30, 0.70), 0.07, 40.0), ((0.35, 0.70, 0.30), 0.08, 25.0)]
TRUE_GAIN = 0.8
HALF = 0.9                           # rays start HALF before the cube's centre and march 2 * HALF
GRID = {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 15,
        "base_resolution": 4, "per_level_scale": 1.6}
MICRO = {"otype": "Frequency", "n_frequencies": 3}
NET = {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2, "activation": "ReLU",
       "output_activation": "None"}
OPTIMIZER = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15}


def cameras(n_views, size, elevation_offset=0.0):
    """Origins and directions ``(n_views * size^2, 3)`` of orthographic views around the cube."""
    o, d = [], []
    u = ((np.arange(size) + 0.5) / size * 2 - 1) * 0.75
    U, V = np.meshgrid(u, u, indexing="xy")
    for v in range(n_views):
        theta = 2 * np.pi * (v + 0.5 * elevation_offset) / n_views
        phi = 0.5 * np.sin(3.1 * v + elevation_offset)
        fwd = np.array([np.cos(theta) * np.cos(phi), np.sin(phi), np.sin(theta) * np.cos(phi)])
        right = np.cross(fwd, [0.0, 1.0, 0.0])
        right /= np.linalg.norm(right)
        up = np.cross(right, fwd)
        centre = 0.5 + U.reshape(-1, 1) * right + V.reshape(-1, 1) * up
        o.append(centre - HALF * fwd)
        d.append(np.broadcast_to(fwd, centre.shape))
    return np.concatenate(o).astype(np.float32), np.concatenate(d).astype(np.float32)


@ti.func
def true_density(p):
    s = 0.0
    for c, r, peak in ti.static(BLOBS):
        q = p - ti.Vector(c)
        s += peak * ti.exp(-q.dot(q) / (2.0 * r * r))
    return s


class Marcher:
    """The user's program for a batch of ``n_rays`` rays with ``n_samples`` samples each: fields, the
    marcher's kernels and the network as a ``tinn.ad.stage``."""

    def __init__(self, network, n_rays, n_samples, cells):
        self.n_rays, self.n_samples, self.cells = n_rays, n_samples, cells
        shape = (n_rays, n_samples)
        self.o, self.d = ti.Vector.field(3, ti.f32, n_rays), ti.Vector.field(3, ti.f32, n_rays)
        self.jitter = ti.field(ti.f32, shape)
        self.pts = ti.Vector.field(3, ti.f32, shape)                  # no gradient asked: the rays are fixed
        self.instance, self.inside = ti.field(ti.i32, shape), ti.field(ti.i32, shape)
        self.raw = ti.Vector.field(1, ti.f32, shape, needs_grad=True)
        self.tau = ti.field(ti.f32, n_rays, needs_grad=True)
        self.pixel = ti.field(ti.f32, n_rays, needs_grad=True)
        self.target = ti.field(ti.f32, n_rays)
        self.gain = ti.field(ti.f32, (), needs_grad=True)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.density = tinn.ad.stage(network, self.pts, self.raw, instance=self.instance if cells > 1 else None,
                                     mask=self.inside)
        dt = 2 * HALF / n_samples
        o, d, jitter, pts, instance, inside = self.o, self.d, self.jitter, self.pts, self.instance, self.inside
        raw, tau, pixel, target, gain, loss = self.raw, self.tau, self.pixel, self.target, self.gain, self.loss

        @ti.kernel
        def sample_points():
            """Sample j of ray r at t = (j + jitter) dt; the cell's network and the point local to its cell."""
            for r, j in pts:
                p = o[r] + (j + jitter[r, j]) * dt * d[r]
                inside[r, j] = int(p.min() >= 0.0 and p.max() < 1.0)
                cell = ti.min(ti.max(ti.cast(ti.floor(p * cells), ti.i32), 0), cells - 1)
                instance[r, j] = (cell[2] * cells + cell[1]) * cells + cell[0]
                pts[r, j] = p * cells - ti.cast(cell, ti.f32)

        @ti.kernel
        def render_truth():
            for r, j in pts:
                p = o[r] + (j + jitter[r, j]) * dt * d[r]
                if p.min() >= 0.0 and p.max() < 1.0:
                    tau[r] += true_density(p) * dt

        @ti.kernel
        def reset():
            for r in tau:
                tau[r] = 0.0

        @ti.kernel
        def composite():                        # one sample per parallel iteration: Taichi's AD is exact here
            for r, j in raw:
                if inside[r, j]:
                    v = raw[r, j][0]
                    tau[r] += (ti.max(v, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(v)))) * dt

        @ti.kernel
        def shade():
            for r in pixel:
                pixel[r] = gain[None] * (1.0 - ti.exp(-tau[r]))

        @ti.kernel
        def mse():
            for r in pixel:
                loss[None] += (pixel[r] - target[r]) ** 2 / n_rays

        self._sample_points, self._render_truth = sample_points, render_truth
        self._reset, self._composite, self._shade, self._mse = reset, composite, shade, mse

    def set_rays(self, o, d, jitter):
        self.o.from_numpy(o)
        self.d.from_numpy(d)
        self.jitter.from_numpy(jitter)
        self._sample_points()

    def render(self):
        """The forward program (inside a Tape, Taichi records it)."""
        self._reset()
        self.density()
        self._composite()
        self._shade()

    def render_truth(self):
        self._reset()
        self._render_truth()
        self.gain[None] = TRUE_GAIN
        self._shade()
        return self.pixel.to_numpy()

    def loss_and_gradients(self):
        """Tape over the program; afterwards ``gain.grad`` and the network's gradients are set."""
        self.density.network.zero_grad()           # the Tape clears Taichi's .grad fields, not tinn's gradients
        with ti.ad.Tape(loss=self.loss):
            self.render()
            self._mse()
        return float(self.loss[None])


def render_views(marcher, o, d, truth: bool):
    """Images of the given rays (mid-point samples), in chunks of the marcher's size."""
    n, out = marcher.n_rays, []
    gain = float(marcher.gain[None])
    for s in range(0, len(o), n):
        oo, dd = np.zeros((n, 3), np.float32), np.zeros((n, 3), np.float32)
        oo[:len(o) - s], dd[:len(o) - s] = o[s:s + n], d[s:s + n]
        marcher.set_rays(oo, dd, np.full((n, marcher.n_samples), 0.5, np.float32))
        if truth:
            out.append(marcher.render_truth()[:len(o) - s])
        else:
            marcher.render()
            out.append(marcher.pixel.to_numpy()[:len(o) - s])
    marcher.gain[None] = gain
    return np.concatenate(out)


def psnr(a, b):
    return float(10 * np.log10(1.0 / np.mean((a - b) ** 2)))


def views_picture(rows, titles):
    """Rows of grey views side by side, 4x4 pixels per pixel (easier to see), each row under its title."""
    pictures = []
    for r, title in zip(rows, titles):
        row = (np.clip(np.concatenate(list(r), axis=1), 0, 1) * 255).astype(np.uint8).repeat(4, 0).repeat(4, 1)
        pictures.append(titled(np.repeat(row[..., None], 3, -1), title))
    return np.concatenate(pictures, axis=0)


def write_png(path, rows, titles):
    import imageio.v2 as imageio
    imageio.imwrite(path, views_picture(rows, titles))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=400, help="training steps")
    ap.add_argument("--rays", type=int, default=1024, help="rays per training step")
    ap.add_argument("--samples", type=int, default=48, help="samples per ray")
    ap.add_argument("--views", type=int, default=24, help="training views")
    ap.add_argument("--size", type=int, default=40, help="image size (pixels per side)")
    ap.add_argument("--instances", type=int, default=1,
                    help="K micro-networks, one per cell of a cube of cells (K = 1, 8, 27, 64, ...)")
    ap.add_argument("--arch", default="cpu", help="Taichi arch (cpu, cuda, vulkan, metal, ...)")
    ap.add_argument("--out", default="out", help="directory for raymarch_views.png (created if missing)")
    args = ap.parse_args()
    ensure_out_dir(ap, args.out)
    cells = round(args.instances ** (1 / 3))
    if cells ** 3 != args.instances:
        ap.error(f"--instances must be a cube (1, 8, 27, 64, ...), got {args.instances}")
    tinn.init(getattr(ti, args.arch))

    encoding = GRID if cells == 1 else MICRO
    network = tinn.NetworkWithInputEncoding(3, 1, encoding, NET, n_instances=args.instances)
    trainer = tinn.Trainer(network, tinn.create_optimizer(OPTIMIZER), tinn.create_loss({"otype": "L2"}))
    marcher = Marcher(network, args.rays, args.samples, cells)

    o_train, d_train = cameras(args.views, args.size)
    o_test, d_test = cameras(4, args.size, elevation_offset=1.0)            # views between the training ones
    target_train = render_views(marcher, o_train, d_train, truth=True)
    target_test = render_views(marcher, o_test, d_test, truth=True)
    marcher.gain[None] = 1.0
    print(f"{len(o_train)} training rays in {args.views} views, {len(o_test)} held-out rays; "
          f"{args.instances} network(s), {network.n_params} parameters each")

    rng = np.random.default_rng(0)
    m = v = 0.0                                                              # Adam state of the gain
    start = time.perf_counter()
    progress = Progress(args.steps, "training")
    for step in range(1, args.steps + 1):
        idx = rng.integers(0, len(o_train), args.rays)
        marcher.set_rays(o_train[idx], d_train[idx], rng.random((args.rays, args.samples), dtype=np.float32))
        marcher.target.from_numpy(target_train[idx])
        loss = marcher.loss_and_gradients()
        trainer.optimizer_step(active=marcher.density.active)         # the networks this batch reached
        g = float(marcher.gain.grad[None])
        m, v = 0.9 * m + 0.1 * g, 0.99 * v + 0.01 * g * g
        marcher.gain[None] -= 1e-2 * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.99 ** step)) + 1e-8)
        progress.update(step, loss=f"{loss:.5f}")
        if step == 1 or step % 50 == 0 or step == args.steps:
            test = render_views(marcher, o_test, d_test, truth=False)
            elapsed = time.perf_counter() - start
            progress.write(f"step {step:4d}: loss {loss:.5f}  held-out PSNR {psnr(test, target_test):5.2f} dB  "
                           f"gain {float(marcher.gain[None]):.3f} (true {TRUE_GAIN})  "
                           f"{step * args.rays / elapsed:.0f} rays/s")
    progress.close()
    test = render_views(marcher, o_test, d_test, truth=False)
    print(f"final held-out PSNR {psnr(test, target_test):.2f} dB, gain {float(marcher.gain[None]):.3f}")
    s = args.size
    path = os.path.join(args.out, "raymarch_views.png")
    write_png(path, [target_test.reshape(4, s, s), test.reshape(4, s, s)],
              ["HELD-OUT VIEWS: TRUE DENSITY (TARGETS)",
               f"LEARNED DENSITY, {args.instances} NETWORK(S), {args.steps} STEPS: {psnr(test, target_test):.2f} DB"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
