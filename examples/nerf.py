"""Instant-NGP's NeRF recipe in Taichi with tinn: a radiance field learned from photographs of a scene.

    python examples/nerf.py [--data DIR] [--steps N] [--instances K] [--compare] [--no-render] [--out DIR]

The field (tiny-cuda-nn's NeRF layout): a density network, HashGrid + MLP with 16 outputs, ``sigma =
exp(h_0)`` and 15 geometric features ``h_1..15``; a colour network, SphericalHarmonics (degree 4) of the
view direction next to those features (a Composite encoding) + MLP, ``rgb = sigmoid(.)``. The volume
renderer is Taichi kernels differentiated by ``ti.ad.Tape``, with the two networks as ``tinn.ad.stage``s
between them::

    samples -> [density stage] -> sigma_i delta_i, colour input -> [colour stage] -> scan -> composite -> loss

``S`` stratified samples per ray between the ray's entry and exit of the scene's box, ``delta = (t_far -
t_near) / S``; ``tau_i = sum_{j<=i} sigma_j delta_j`` by a log-step scan (one parallel kernel per level, so
Taichi's reverse mode is exact), ``T_i = exp(-(tau_i - sigma_i delta_i))``, ``w_i = T_i (1 - exp(-sigma_i
delta_i))``, ``C = sum_i w_i c_i + T_S * white``. An occupancy grid (``sigma`` at jittered cell centres,
decayed maximum, Instant-NGP's rule) masks the samples in empty cells out of both stages: they cost no
network evaluation and contribute nothing. ``--instances K`` (a cube: 8, 27, 64) routes each sample to
one of K micro-networks by position, KiloNeRF-style: the box is cut into K cells, each with its own
density and colour network seeing coordinates local to its cell; their MLPs are KiloNeRF's tiny ones (32
wide) and their hash tables are sized so that the K networks hold as many parameters as the one, within
10 %. ``--compare`` trains both, interleaved for the same time, and prints held-out PSNR, render time per
view and training speed side by side (``_nerf_compare.py``).

Data: ``--data DIR`` is a NeRF-synthetic folder (``transforms_{train,test}.json``, e.g. the lego scene);
without it a scene is rendered with Mitsuba 3 (``pip install tinn[nerf]``) once into ``--scene`` (by
default ``nerf_scene`` in ``--out``) and read from there afterwards. Prints the held-out PSNR; writes into
``--out`` ``nerf_test.png`` (held-out views above, renders below, each row titled) and, unless
``--no-render``, ``nerf_turntable.gif``.
"""
import argparse
import math
import os
import time

import numpy as np
import taichi as ti

import tinn
import nerf_data
from tinn.encodings.grid import level_geometry
from sdf_eikonal import ensure_out_dir

N_FEATURES = 15                                 # geometric features the density network passes on
DENSITY_NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
               "n_hidden_layers": 1}
COLOUR_NET = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
              "n_hidden_layers": 2}
ARRAY_NEURONS = 32                              # an array's micro-networks: KiloNeRF's width (its MLPs are 32 wide)
DIRECTION = {"otype": "Composite", "nested": [{"otype": "SphericalHarmonics", "degree": 4, "n_dims_to_encode": 3},
                                              {"otype": "Identity"}]}
OPTIMIZER = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15}
LOSS_EVERY = 25                                 # steps between two reads of the loss (a wait for the device)
MAX_LOG_SIGMA = 15.0                            # sigma = exp(min(h_0, 15)): Instant-NGP's truncated exp


def grid_config(log2_hashmap_size=17, n_levels=12, base_resolution=16, finest_resolution=512):
    return {"otype": "HashGrid", "n_levels": n_levels, "n_features_per_level": 2,
            "log2_hashmap_size": log2_hashmap_size, "base_resolution": base_resolution,
            "per_level_scale": (finest_resolution / base_resolution) ** (1 / (n_levels - 1))}


def make_field(instances=1, grid=None):
    """The density and colour networks (arrays of ``instances`` networks). With an array each micro-network
    covers a cell of the box, so its grid is coarser by the cells per axis, its MLPs are KiloNeRF's tiny ones
    (``ARRAY_NEURONS`` wide) and its table is sized so that the K networks together hold about as many
    parameters as the one network (:func:`array_grid`)."""
    density_net, colour_net = DENSITY_NET, COLOUR_NET
    if instances > 1:
        density_net, colour_net = dict(DENSITY_NET, n_neurons=ARRAY_NEURONS), dict(COLOUR_NET, n_neurons=ARRAY_NEURONS)
        if grid is None:
            grid = array_grid(instances)
    density = tinn.NetworkWithInputEncoding(3, 1 + N_FEATURES, grid or grid_config(), density_net,
                                            n_instances=instances)
    colour = tinn.NetworkWithInputEncoding(3 + N_FEATURES, 3, DIRECTION, colour_net, n_instances=instances)
    return density, colour


def _mlp_params(n_in, n_out, width, n_hidden_layers):
    """FullyFusedMLP's parameter count: input and output widths padded to 16."""
    pad = lambda n: -(-n // 16) * 16                                # noqa: E731
    return pad(n_in) * width + (n_hidden_layers - 1) * width * width + width * pad(n_out)


def field_params(instances, grid, neurons):
    """The parameters of all ``instances`` density + colour networks with this grid and MLP width."""
    _, entries = level_geometry(3, "Hash", grid["n_levels"], grid["log2_hashmap_size"], grid["base_resolution"],
                                grid["per_level_scale"])
    grid_width = grid["n_levels"] * grid["n_features_per_level"]
    mlps = (_mlp_params(grid_width, 1 + N_FEATURES, neurons, DENSITY_NET["n_hidden_layers"]) +
            _mlp_params(16 + N_FEATURES, 3, neurons, COLOUR_NET["n_hidden_layers"]))
    return instances * (entries * grid["n_features_per_level"] + mlps)


def array_grid(instances):
    """The hash grid of each of ``instances`` micro-networks: its cell's share of the one network's
    resolutions, and the table size and level count (12 if it can be) that bring the K networks' parameters
    closest to the one network's (within 10 %)."""
    cells = round(instances ** (1 / 3))
    target = field_params(1, grid_config(), DENSITY_NET["n_neurons"])
    candidates = []
    for n_levels in (12, 11, 13, 10, 14):                           # in order of preference
        grids = [grid_config(log2, n_levels, max(16 // cells, 2), max(512 // cells, 4)) for log2 in range(6, 20)]
        miss, grid = min(((abs(field_params(instances, g, ARRAY_NEURONS) / target - 1), g) for g in grids),
                         key=lambda c: c[0])
        if miss <= 0.1:
            return grid
        candidates.append((miss, grid))
    return min(candidates, key=lambda c: c[0])[1]


class OccupancyGrid(nerf_data.OccupancyGrid):
    """The occupancy grid with its cells in a Taichi field (1 = occupied) for the sampling kernel."""

    def __init__(self, res, step, decay=0.95):
        super().__init__(res, step, decay)
        self.field = ti.field(ti.i32, (res, res, res))
        self.field.fill(1)

    def update(self, density_at, rng):
        fraction = super().update(density_at, rng)
        self.field.from_numpy(self.occupied.astype(np.int32))
        return fraction


class Renderer:
    """The user's differentiable program for ``n_rays`` rays of ``n_samples`` samples in the box
    ``[lo, hi]^3``: fields, kernels and the two networks as ``tinn.ad.stage``s."""

    def __init__(self, density_net, colour_net, n_rays, n_samples, lo, hi, occupancy):
        R, S = n_rays, n_samples
        self.n_rays, self.n_samples, self.lo, self.hi = R, S, lo, hi
        self.density_net, self.colour_net, self.occupancy = density_net, colour_net, occupancy
        self.cells = cells = round(density_net.n_instances ** (1 / 3))
        self.o, self.d = ti.Vector.field(3, ti.f32, R), ti.Vector.field(3, ti.f32, R)
        self.target = ti.Vector.field(3, ti.f32, R)
        self.jitter = ti.field(ti.f32, (R, S))
        self.delta = ti.field(ti.f32, R)
        self.pts = ti.Vector.field(3, ti.f32, (R, S))                 # fixed sample points: no gradient
        self.mask, self.instance = ti.field(ti.i32, (R, S)), ti.field(ti.i32, (R, S))
        self.h = ti.Vector.field(1 + N_FEATURES, ti.f32, (R, S), needs_grad=True)
        self.colour_in = ti.Vector.field(3 + N_FEATURES, ti.f32, (R, S), needs_grad=True)
        self.rgb = ti.Vector.field(3, ti.f32, (R, S), needs_grad=True)
        self.sd = ti.field(ti.f32, (R, S), needs_grad=True)             # sigma_i delta_i
        n_levels = max(1, (S - 1).bit_length())
        self.tau = [ti.field(ti.f32, (R, S), needs_grad=True) for _ in range(n_levels)]
        self.weight = ti.field(ti.f32, (R, S), needs_grad=True)
        self.colour = ti.Vector.field(3, ti.f32, R, needs_grad=True)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.loss_total = ti.field(ti.f32, ())          # the losses summed on the device until read
        routed = cells > 1
        self.density = tinn.ad.stage(density_net, self.pts, self.h, instance=self.instance if routed else None,
                                     mask=self.mask)
        self.colour_stage = tinn.ad.stage(colour_net, self.colour_in, self.rgb,
                                          instance=self.instance if routed else None, mask=self.mask)
        self._build_kernels()

    def _build_kernels(self):
        R, S, cells = self.n_rays, self.n_samples, self.cells
        lo, size = ti.Vector([self.lo] * 3), self.hi - self.lo
        o, d, jitter, delta, pts, mask, instance = self.o, self.d, self.jitter, self.delta, self.pts, self.mask, \
            self.instance
        h, colour_in, rgb, sd, weight, colour, target, loss = self.h, self.colour_in, self.rgb, self.sd, \
            self.weight, self.colour, self.target, self.loss
        occ, res, last = self.occupancy.field, self.occupancy.res, self.tau[-1]

        @ti.kernel
        def sample_points():
            """Sample j of ray r at t_near + (j + jitter) delta inside the box; its occupancy cell, and its
            micro-network's cell with the point local to that cell."""
            for r, j in pts:
                inv = 1.0 / d[r]
                ta, tb = (lo - o[r]) * inv, (lo + size - o[r]) * inv
                t_near = ti.max(ti.min(ta, tb).max(), 0.0)
                t_far = ti.max(ta, tb).min()
                dt = ti.max(t_far - t_near, 0.0) / S
                if j == 0:
                    delta[r] = dt
                q = (o[r] + (t_near + (j + jitter[r, j]) * dt) * d[r] - lo) / size
                q = ti.min(ti.max(q, 0.0), 1.0 - 1e-6)
                g = ti.cast(ti.floor(q * res), ti.i32)
                mask[r, j] = int(dt > 0.0) * occ[g]
                cell = ti.cast(ti.floor(q * cells), ti.i32)
                instance[r, j] = (cell[2] * cells + cell[1]) * cells + cell[0]
                pts[r, j] = q * cells - ti.cast(cell, ti.f32)

        @ti.kernel
        def features():
            """sigma delta and the colour network's input (direction mapped to [0, 1], then features)."""
            for r, j in h:
                dd = 0.5 * (d[r] + 1.0)
                if mask[r, j] != 0:
                    sd[r, j] = ti.exp(ti.min(h[r, j][0], MAX_LOG_SIGMA)) * delta[r]
                    colour_in[r, j] = ti.Vector([dd[0], dd[1], dd[2]] +
                                                [h[r, j][k] for k in ti.static(range(1, 1 + N_FEATURES))])
                else:
                    sd[r, j] = 0.0
                    colour_in[r, j] = ti.Vector.zero(ti.f32, 3 + N_FEATURES)

        @ti.kernel
        def scan_level(src: ti.template(), dst: ti.template(), offset: ti.i32):
            """One level of an inclusive prefix sum along the samples (Hillis-Steele)."""
            for r, j in src:
                v = src[r, j]
                if j >= offset:
                    v += src[r, j - offset]
                dst[r, j] = v

        @ti.kernel
        def background():
            for r in colour:
                colour[r] = ti.exp(-last[r, S - 1]) * ti.Vector([1.0, 1.0, 1.0])

        @ti.kernel
        def composite():
            """w_i = T_i (1 - exp(-sigma_i delta_i)), T_i = exp(-sum_{j<i} sigma_j delta_j); C += w_i c_i."""
            for r, j in sd:
                w = ti.exp(-(last[r, j] - sd[r, j])) * (1.0 - ti.exp(-sd[r, j]))
                weight[r, j] = w
                colour[r] += w / (1.0 + ti.exp(-rgb[r, j]))

        @ti.kernel
        def mse():
            for r in colour:
                e = colour[r] - target[r]
                loss[None] += e.dot(e) / (3 * R)

        total = self.loss_total

        @ti.kernel
        def add_loss():
            total[None] += loss[None]

        self._sample_points, self._features, self._scan_level = sample_points, features, scan_level
        self._background, self._composite, self._mse = background, composite, mse
        self._add_loss = add_loss

    def set_rays(self, o, d, jitter):
        self.o.from_numpy(o)
        self.d.from_numpy(d)
        self.jitter.from_numpy(jitter)
        self._sample_points()

    def render(self):
        """The forward program (inside a Tape, Taichi records it); the colours are in ``self.colour``."""
        self.density()
        self._features()
        self.colour_stage()
        src = self.sd
        for level, dst in enumerate(self.tau):
            self._scan_level(src, dst, 1 << level)
            src = dst
        self._background()
        self._composite()

    def loss_and_gradients(self):
        """Tape over the program; afterwards both networks hold their gradients. The loss is added to a sum
        on the device, not read (:meth:`mean_loss` reads it)."""
        self.density_net.zero_grad()                   # the Tape clears Taichi's .grad fields, not tinn's
        self.colour_net.zero_grad()
        with ti.ad.Tape(loss=self.loss):                # (which sets the loss to 0 first)
            self.render()
            self._mse()
        self._add_loss()

    def mean_loss(self, steps):
        """The mean loss of the last ``steps`` steps (one read of the device), then a new sum."""
        mean = float(self.loss_total[None]) / steps
        self.loss_total[None] = 0.0
        return mean

    def active(self):
        """The networks each network's stage reached in the last batch, for its trainer (``None`` without an
        array; on the device path a mask that stays there)."""
        return self.density.active, self.colour_stage.active

    def density_at(self, q):
        """sigma at normalised points ``q (n, 3)``, through the batch inference (the occupancy update)."""
        cell = np.minimum((q * self.cells).astype(np.int32), self.cells - 1)
        inst = ((cell[:, 2] * self.cells + cell[:, 1]) * self.cells + cell[:, 0]).astype(np.int32)
        local = np.ascontiguousarray(q * self.cells - cell, np.float32)
        h0 = self.density_net.inference(local, inst if self.cells > 1 else None)[:, 0]
        return np.exp(np.minimum(h0, MAX_LOG_SIGMA))

    def render_rays(self, o, d):
        """Colours ``(n, 3)`` of the given rays (mid-point samples), in chunks of ``n_rays``."""
        n, out = self.n_rays, []
        mid = np.full((n, self.n_samples), 0.5, np.float32)
        for s in range(0, len(o), n):
            k = min(n, len(o) - s)
            oo, dd = np.zeros((n, 3), np.float32), np.tile(np.float32([0, 0, 1]), (n, 1))
            oo[:k], dd[:k] = o[s:s + k], d[s:s + k]
            self.set_rays(oo, dd, mid)
            self.render()
            out.append(self.colour.to_numpy()[:k])
        return np.concatenate(out)


def render_images(renderer, c2w, height, width, focal):
    o, d = nerf_data.camera_rays(c2w, height, width, focal)
    return renderer.render_rays(o, d).reshape(len(c2w), height, width, 3)


class Field:
    """A radiance field in training: its networks (one, or an array of ``instances``), their trainers, the
    occupancy grid, the renderer and the random stream of its ray batches; the seconds it has trained."""

    def __init__(self, args, instances):
        self.instances = instances
        self.density_net, self.colour_net = make_field(instances)
        self.trainers = [tinn.Trainer(n, tinn.create_optimizer(OPTIMIZER), tinn.create_loss({"otype": "L2"}))
                         for n in (self.density_net, self.colour_net)]
        self.occupancy = OccupancyGrid(args.occupancy, nerf_data.occupancy_step(args.bound, args.samples))
        self.renderer = Renderer(self.density_net, self.colour_net, args.rays, args.samples, -args.bound, args.bound,
                                 self.occupancy)
        self.n_params = (self.density_net.n_params + self.colour_net.n_params) * instances
        self.rng, self.rays, self.samples = np.random.default_rng(args.seed), args.rays, args.samples
        self.step, self.seconds, self.occupied = 0, 0.0, 1.0

    def train(self, steps, data, log):
        """``steps`` more training steps on the rays ``data = (o, d, colour)``; the loss is read (a wait for
        the device) every ``LOSS_EVERY`` steps and at the last, and logged."""
        start, last = time.perf_counter(), self.step + steps
        o, d, c = data
        for step in range(self.step + 1, last + 1):
            idx = self.rng.integers(0, len(o), self.rays)
            self.renderer.set_rays(o[idx], d[idx], self.rng.random((self.rays, self.samples), dtype=np.float32))
            self.renderer.target.from_numpy(c[idx])
            self.renderer.loss_and_gradients()
            for t, active in zip(self.trainers, self.renderer.active()):
                t.optimizer_step(active=active)
            self.occupied = nerf_data.update_occupancy(step, self.occupancy, self.renderer.density_at, self.rng)
            if step % LOSS_EVERY == 0 or step == last:
                log.add(step, self.renderer.mean_loss(step - log.n_steps), self.occupied)
        self.step = last
        self.seconds += time.perf_counter() - start

    def render_images(self, c2w, test):
        return render_images(self.renderer, c2w, test.height, test.width, test.focal)

    def describe(self):
        return (f"{self.instances} network(s) of {self.density_net.n_params} + {self.colour_net.n_params} "
                f"parameters ({self.n_params} in all)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    nerf_data.add_arguments(ap)
    ap.add_argument("--instances", type=nerf_data.positive, default=1,
                    help="K micro-networks, one per cell of a cube of cells (K = 1, 8, 27, 64, ...)")
    ap.add_argument("--compare", action="store_true",
                    help="train one network for --steps and --instances K micro-networks (8 if not given) for the "
                         "same time, interleaved; print both side by side and write nerf_compare.png/.json")
    ap.add_argument("--arch", default="cpu", choices=["cpu", "vulkan", "cuda", "metal", "gpu"], help="Taichi arch")
    args = ap.parse_args(argv)
    nerf_data.check_arguments(ap, args)
    if args.compare and args.instances == 1:
        args.instances = 8
    cells = round(args.instances ** (1 / 3))
    if cells ** 3 != args.instances:
        ap.error(f"--instances must be a cube (1, 8, 27, 64, ...), got {args.instances}")
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    ensure_out_dir(ap, args.out)
    train, test = nerf_data.load_scene(args, ap)
    tinn.init(getattr(ti, args.arch))
    if args.compare:
        from _nerf_compare import compare
        return compare(args, train, test, Field)
    field = Field(args, args.instances)
    print(f"{train.n} training views, {test.n} held-out views at {train.width}x{train.height}; {field.describe()}")
    log = nerf_data.TrainingLog(args.steps)
    field.train(args.steps, train.rays(), log)
    return nerf_data.report(args, "nerf", log, test, lambda c2w: field.render_images(c2w, test))


if __name__ == "__main__":
    main()
