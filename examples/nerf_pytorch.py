"""The NeRF of ``nerf.py`` in plain PyTorch: the time-to-PSNR baseline.

    python examples/nerf_pytorch.py [--data DIR] [--steps N] [--out DIR] [--device cuda]

The same model (a multiresolution hash grid + MLP density network with 15 features, a degree-4 spherical
harmonics + MLP colour network, no biases, tcnn's layout), the same rays, stratified samples, occupancy
grid and schedule, the same quadrature (``torch.cumsum`` for the optical depth) and the same Adam; torch's
autograd instead of Taichi's Tape and tinn's stages. Writes ``nerf_pytorch_test.png`` and
``nerf_pytorch_turntable.gif``.
"""
import argparse
import math

import numpy as np

import nerf_data


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    nerf_data.add_arguments(ap)
    ap.add_argument("--threads", type=nerf_data.positive, help="torch's CPU threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    args = ap.parse_args(argv)
    nerf_data.check_arguments(ap, args)
    return ap, args


if __name__ == "__main__":      # --help and argument errors are answered before torch and Taichi load
    AP, ARGS = parse_args()

import torch  # noqa: E402

from sdf_eikonal import ensure_out_dir  # noqa: E402
from nerf import DENSITY_NET, COLOUR_NET, MAX_LOG_SIGMA, N_FEATURES, OPTIMIZER, grid_config  # noqa: E402

PRIMES = (1, 2654435761, 805459861)


class HashGrid(torch.nn.Module):
    """A multiresolution hash grid as Instant-NGP's: level l at resolution ``floor(base * scale^l)``,
    position ``x * (res - 1) + 0.5``, 8 corners interpolated trilinearly, looked up densely while ``(res + 1)^3``
    fits the level's table and by the spatial hash ``xor_d(c_d * pi_d) mod T`` above; parameters uniform in
    [-1e-4, 1e-4]. (tinn's HashGrid follows tcnn exactly; this one is close, not bit-equal.)"""

    def __init__(self, config):
        super().__init__()
        self.table_size = 2 ** config["log2_hashmap_size"]
        self.resolutions = [math.floor(config["base_resolution"] * config["per_level_scale"] ** l)
                            for l in range(config["n_levels"])]
        sizes = [min(self.table_size, (r + 1) ** 3) for r in self.resolutions]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        self.table = torch.nn.Parameter(torch.empty(self.offsets[-1], config["n_features_per_level"]).uniform_(-1e-4, 1e-4))
        corners = torch.tensor([[(k >> d) & 1 for d in range(3)] for k in range(8)])
        self.register_buffer("corners", corners)

    def forward(self, x):
        out = []
        for level, res in enumerate(self.resolutions):
            pos = x * (res - 1) + 0.5
            base = torch.floor(pos)
            frac = pos - base
            c = base.long()[:, None, :] + self.corners                         # (n, 8, 3)
            size = self.offsets[level + 1] - self.offsets[level]
            if (res + 1) ** 3 <= self.table_size:
                c = c.clamp(0, res)
                index = c[..., 0] + (res + 1) * (c[..., 1] + (res + 1) * c[..., 2])
            else:
                index = (c[..., 0] * PRIMES[0]) ^ (c[..., 1] * PRIMES[1]) ^ (c[..., 2] * PRIMES[2])
            index = index % size + self.offsets[level]
            w = torch.where(self.corners.bool(), frac[:, None, :], 1 - frac[:, None, :]).prod(-1)   # (n, 8)
            features = self.table.index_select(0, index.reshape(-1)).view(*index.shape, -1)   # backward: index_add_
            out.append((features * w[..., None]).sum(1))
        return torch.cat(out, -1)


def spherical_harmonics(d):
    """The 16 real spherical harmonics of degree < 4 (tcnn's and Instant-NGP's signs) of unit vectors ``d``."""
    x, y, z = d.unbind(-1)
    xy, xz, yz, x2, y2, z2 = x * y, x * z, y * z, x * x, y * y, z * z
    return torch.stack([
        torch.full_like(x, 0.28209479177387814), -0.48860251190291987 * y, 0.48860251190291987 * z,
        -0.48860251190291987 * x, 1.0925484305920792 * xy, -1.0925484305920792 * yz,
        0.94617469575755997 * z2 - 0.31539156525251999, -1.0925484305920792 * xz,
        0.54627421529603959 * x2 - 0.54627421529603959 * y2, 0.59004358992664352 * y * (-3.0 * x2 + y2),
        2.8906114426405538 * xy * z, 0.45704579946446572 * y * (1.0 - 5.0 * z2),
        0.3731763325901154 * z * (5.0 * z2 - 3.0), 0.45704579946446572 * x * (1.0 - 5.0 * z2),
        1.4453057213202769 * z * (x2 - y2), 0.59004358992664352 * x * (-x2 + 3.0 * y2)], -1)


def mlp(n_in, n_out, config):
    layers, width = [], n_in
    for _ in range(config["n_hidden_layers"]):
        layers += [torch.nn.Linear(width, config["n_neurons"], bias=False), torch.nn.ReLU()]
        width = config["n_neurons"]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, n_out, bias=False))


class Field(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.grid = HashGrid(grid_config())
        self.density = mlp(self.grid.table.shape[1] * len(self.grid.resolutions), 1 + N_FEATURES, DENSITY_NET)
        self.colour = mlp(16 + N_FEATURES, 3, COLOUR_NET)

    def sigma_and_features(self, q):
        h = self.density(self.grid(q))
        return torch.exp(h[:, 0].clamp(max=MAX_LOG_SIGMA)), h[:, 1:]

    def forward(self, q, d):
        sigma, features = self.sigma_and_features(q)
        return sigma, torch.sigmoid(self.colour(torch.cat([spherical_harmonics(d), features], -1)))


class Renderer:
    """``nerf.Renderer``'s sampling and quadrature on tensors."""

    def __init__(self, field, n_samples, bound, occupancy):
        self.field, self.n_samples, self.bound, self.occupancy = field, n_samples, bound, occupancy
        self.device = next(field.parameters()).device

    def render(self, o, d, jitter):
        """Colours ``(R, 3)`` of rays ``o, d (R, 3)`` with stratified offsets ``jitter (R, S)``."""
        S, lo, size = self.n_samples, -self.bound, 2 * self.bound
        inv = 1.0 / d
        ta, tb = (lo - o) * inv, (lo + size - o) * inv
        t_near = torch.minimum(ta, tb).amax(-1).clamp(min=0.0)
        t_far = torch.maximum(ta, tb).amin(-1)
        delta = (t_far - t_near).clamp(min=0.0) / S
        t = t_near[:, None] + (torch.arange(S, device=o.device)[None] + jitter) * delta[:, None]
        q = ((o[:, None] + t[..., None] * d[:, None] - lo) / size).clamp(0.0, 1.0 - 1e-6)
        g = (q * self.occupancy.res).long()
        occupied = torch.from_numpy(self.occupancy.occupied).to(o.device)[g[..., 0], g[..., 1], g[..., 2]]
        mask = occupied & (delta[:, None] > 0)
        sigma_delta, rgb = torch.zeros(mask.shape, device=o.device), torch.zeros(mask.shape + (3,), device=o.device)
        if mask.any():
            sigma, colour = self.field(q[mask], d[:, None].expand(-1, S, -1)[mask])
            sigma_delta = sigma_delta.masked_scatter(mask, sigma * delta[:, None].expand(-1, S)[mask])
            rgb = rgb.masked_scatter(mask[..., None], colour)
        tau = torch.cumsum(sigma_delta, -1)
        w = torch.exp(-(tau - sigma_delta)) * (1 - torch.exp(-sigma_delta))
        return (w[..., None] * rgb).sum(1) + torch.exp(-tau[:, -1:])

    def density_at(self, q):
        with torch.no_grad():
            return self.field.sigma_and_features(torch.from_numpy(q).to(self.device))[0].cpu().numpy()

    def render_images(self, c2w, height, width, focal, chunk=4096):
        o, d = nerf_data.camera_rays(c2w, height, width, focal)
        mid = torch.full((chunk, self.n_samples), 0.5, device=self.device)
        def on(a):
            return torch.from_numpy(a).to(self.device)

        with torch.no_grad():
            out = [self.render(on(o[s:s + chunk]), on(d[s:s + chunk]), mid[:len(o[s:s + chunk])]).cpu().numpy()
                   for s in range(0, len(o), chunk)]
        return np.concatenate(out).reshape(len(c2w), height, width, 3)


def main(ap, args):
    ensure_out_dir(ap, args.out)
    train, test = nerf_data.load_scene(args, ap)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    field = Field().to(args.device)
    optimizer = torch.optim.Adam(field.parameters(), lr=OPTIMIZER["learning_rate"],
                                 betas=(OPTIMIZER["beta1"], OPTIMIZER["beta2"]), eps=OPTIMIZER["epsilon"])
    occupancy = nerf_data.OccupancyGrid(args.occupancy, nerf_data.occupancy_step(args.bound, args.samples))
    renderer = Renderer(field, args.samples, args.bound, occupancy)
    o_train, d_train, c_train = (torch.from_numpy(a).to(args.device) for a in train.rays())
    print(f"{train.n} training views, {test.n} held-out views at {train.width}x{train.height}; "
          f"{sum(p.numel() for p in field.parameters())} parameters, {torch.get_num_threads()} torch threads")

    rng = np.random.default_rng(args.seed)
    log = nerf_data.TrainingLog(args.steps)
    for step in range(1, args.steps + 1):
        idx = torch.from_numpy(rng.integers(0, len(o_train), args.rays)).to(args.device)
        jitter = torch.from_numpy(rng.random((args.rays, args.samples), dtype=np.float32)).to(args.device)
        loss = ((renderer.render(o_train[idx], d_train[idx], jitter) - c_train[idx]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        occupied = nerf_data.update_occupancy(step, occupancy, renderer.density_at, rng)
        log.add(step, loss.item(), occupied)
    return nerf_data.report(args, "nerf_pytorch", log, test,
                            lambda c2w: renderer.render_images(c2w, test.height, test.width, test.focal))


if __name__ == "__main__":
    main(AP, ARGS)
