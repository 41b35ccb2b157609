"""A swarm in which every agent has its own tiny network, trained through a differentiable Taichi simulation.

    python examples/swarm.py [--agents N] [--horizon T] [--steps S] [--budget SECONDS] [--arch cpu] [--out DIR]

N agents start spread over a ring around three obstacles; each must reach the point opposite its start (through
the centre) within T
simulation steps. Agent i is steered by network i of a network array (K = N networks of Identity
encoding and a 16-wide MLP) that sees its position, velocity, goal and its two nearest neighbours
(the goal and the neighbours relative to its own position). One simulation step, for every agent at once::

    neighbours (brute force, no gradient) -> features -> [tinn.ad.stage, routed by agent id] -> a = A tanh(out)
    v' = D v + dt (a + collision forces + obstacle forces),   p' = p + dt v'

with soft collisions (a spring pushes overlapping agents apart, and overlaps are penalised) and soft
obstacles. The objective, differentiated by ``ti.ad.Tape`` through all T steps and the stages::

    L = mean_i (|p_T,i - goal_i|^2 + W_S |v_T,i|^2) + W_C sum_t mean_i sum_m overlap_tim^2 + W_O sum_t mean_i sum_o overlap_tio^2
        + W_A sum_t mean_i |out_ti|^2 / T

The same program with one shared network (K = 1; the goal is among its inputs, so it can tell agents
apart) of about the same number of parameters (a wider MLP) trains for the same time. The example
prints both runs' goal distance and collisions, and writes ``swarm_trajectories.png`` (array left,
shared right) and ``swarm.gif`` to ``--out``.
"""
import argparse
import math
import os
import time

import numpy as np
import taichi as ti

import tinn
from sdf_eikonal import ensure_out_dir

N_NEIGHBOURS = 2
N_INPUTS = 6 + 2 * N_NEIGHBOURS                 # position, velocity, goal, neighbours' relative positions
RADIUS = 0.0025                                 # an agent's radius (the unit square is the world)
OBSTACLES = ((0.5, 0.5, 0.08), (0.36, 0.62, 0.05), (0.64, 0.38, 0.05))         # (x, y, radius)
DT, DAMPING, MAX_ACCELERATION = 0.05, 0.9, 3.0
K_COLLISION, K_OBSTACLE = 60.0, 60.0            # spring constants of the soft contacts (K dt^2 << 1: stiffer
                                                # springs make the contacts, and the gradients, explode)
W_COLLISION, W_OBSTACLE, W_ACTION, W_STOP = 10.0, 10.0, 1e-3, 0.1
ENCODING = {"otype": "Identity"}
AGENT_NET = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "None", "n_neurons": 16,
             "n_hidden_layers": 1}
OPTIMIZER = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99}
SHARED_OPTIMIZER = {"otype": "Adam", "learning_rate": 3e-4, "beta1": 0.9, "beta2": 0.99}


def ring(n, rng):
    """Starts spread over a ring (radii 0.3 to 0.48) around the centre, each goal the point opposite its start
    (through the centre, where the obstacles are)."""
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = np.sqrt(rng.uniform(0.3 ** 2, 0.48 ** 2, n))                       # uniform over the ring's area
    start = 0.5 + radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], 1)
    return start.astype(np.float32), (1.0 - start).astype(np.float32)


def shared_width(n_params):
    """The width (a multiple of 16) of a 2-hidden-layer MLP of about ``n_params`` parameters (inputs and outputs
    padded to 16: 16 W + W^2 + 16 W)."""
    return max(16, int(round((-32 + math.sqrt(32 ** 2 + 4 * n_params)) / 2 / 16)) * 16)


def make_network(n_agents, shared, agent_params=None):
    """The agents' networks: an array of ``n_agents`` small MLPs, or one MLP of about their total size."""
    if not shared:
        return quiet_start(tinn.NetworkWithInputEncoding(N_INPUTS, 2, ENCODING, AGENT_NET, n_instances=n_agents))
    width = shared_width(n_agents * agent_params)
    return quiet_start(tinn.NetworkWithInputEncoding(N_INPUTS, 2, ENCODING, dict(
        AGENT_NET, otype="CutlassMLP", n_neurons=width, n_hidden_layers=2)))


def quiet_start(network, scale=0.1):
    """Scale the output layer of the MLP(s) by ``scale``: the agents start almost still (actions near 0), so
    the first steps learn where to go instead of undoing random initial actions."""
    rows, cols = network.network.layer_sizes()[-1]
    end = sum(r * c for r, c in network.network.layer_sizes())          # the network's matrices come first
    params = network.params().copy()
    params[..., end - rows * cols:end] *= scale
    network.set_params(params)
    return network


class Swarm:
    """The simulation of ``start.shape[0]`` agents for ``horizon`` steps as fields and kernels, the network as a
    ``tinn.ad.stage`` routed by agent id (for an array)."""

    def __init__(self, network, start, goal, horizon):
        N, T = len(start), horizon
        self.network, self.n_agents, self.horizon = network, N, T
        self.p = ti.Vector.field(2, ti.f32, (T + 1, N), needs_grad=True)
        self.v = ti.Vector.field(2, ti.f32, (T + 1, N), needs_grad=True)
        self.goal = ti.Vector.field(2, ti.f32, N)
        self.features = ti.Vector.field(N_INPUTS, ti.f32, N, needs_grad=True)
        self.out = ti.Vector.field(2, ti.f32, N, needs_grad=True)
        self.action = ti.Vector.field(2, ti.f32, (T, N), needs_grad=True)     # out of every step, kept
        self.neighbour = ti.field(ti.i32, (T, N, N_NEIGHBOURS))
        self.agent = ti.field(ti.i32, N)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.goal.from_numpy(goal)
        self.agent.from_numpy(np.arange(N, dtype=np.int32))
        self.p.from_numpy(np.repeat(start[None], T + 1, 0))
        self.v.fill(0.0)
        self.stage = tinn.ad.stage(network, self.features, self.out,
                                   instance=self.agent if network.n_instances > 1 else None)
        self._build_kernels()

    def _build_kernels(self):
        p, v, goal, features, out, action, neighbour, loss = (self.p, self.v, self.goal, self.features, self.out,
                                                              self.action, self.neighbour, self.loss)
        N, T = self.n_agents, self.horizon
        obstacles = [ti.Vector(o) for o in OBSTACLES]

        @ti.func
        def push(q, reach, stiffness):
            """The soft contact of a point ``q`` away from a centre: ``(force, overlap)``, overlap = reach - |q|."""
            d = ti.sqrt(q.dot(q) + 1e-12)
            overlap = ti.max(reach - d, 0.0)
            return stiffness * overlap * q / d, overlap

        @ti.ad.no_grad
        @ti.kernel
        def nearest(t: ti.i32):
            """The N_NEIGHBOURS nearest other agents of each agent at step t (brute force; indices get no gradient)."""
            for i in range(N):
                best = ti.Vector([1e9] * N_NEIGHBOURS)
                who = ti.Vector([i] * N_NEIGHBOURS)
                for j in range(N):
                    if j != i:
                        q = p[t, j] - p[t, i]
                        d = q.dot(q)
                        for m in ti.static(range(N_NEIGHBOURS)):     # insertion into the sorted list
                            if d < best[m]:
                                for s in ti.static(range(N_NEIGHBOURS - 1, m, -1)):
                                    best[s], who[s] = best[s - 1], who[s - 1]
                                best[m], who[m] = d, j
                                d = 1e10
                for m in ti.static(range(N_NEIGHBOURS)):
                    neighbour[t, i, m] = who[m]

        @ti.kernel
        def sense(t: ti.i32):
            for i in range(N):
                f = ti.Vector.zero(ti.f32, N_INPUTS)
                for c in ti.static(range(2)):
                    f[c] = 2.0 * (p[t, i][c] - 0.5)
                    f[2 + c] = v[t, i][c]
                    f[4 + c] = 2.0 * (goal[i][c] - p[t, i][c])
                for m in ti.static(range(N_NEIGHBOURS)):
                    q = p[t, neighbour[t, i, m]] - p[t, i]
                    for c in ti.static(range(2)):
                        f[6 + 2 * m + c] = 20.0 * q[c]
                features[i] = f

        @ti.kernel
        def keep(t: ti.i32):
            for i in range(N):
                action[t, i] = out[i]

        @ti.kernel
        def move(t: ti.i32):
            for i in range(N):
                force = MAX_ACCELERATION * ti.tanh(action[t, i])
                penalty = W_ACTION * action[t, i].dot(action[t, i]) / T
                for m in ti.static(range(N_NEIGHBOURS)):
                    f, overlap = push(p[t, i] - p[t, neighbour[t, i, m]], 2 * RADIUS, K_COLLISION)
                    force += f
                    penalty += W_COLLISION * overlap ** 2
                for o in ti.static(obstacles):
                    f, overlap = push(p[t, i] - ti.Vector([o[0], o[1]]), o[2] + RADIUS, K_OBSTACLE)
                    force += f
                    penalty += W_OBSTACLE * overlap ** 2
                v[t + 1, i] = DAMPING * v[t, i] + DT * force
                p[t + 1, i] = p[t, i] + DT * v[t + 1, i]
                loss[None] += penalty / N

        @ti.kernel
        def arrive():
            for i in range(N):
                e = p[T, i] - goal[i]
                loss[None] += (e.dot(e) + W_STOP * v[T, i].dot(v[T, i])) / N

        @ti.kernel
        def clear():
            loss[None] = 0.0

        self._nearest, self._sense, self._keep, self._move, self._arrive, self._clear = \
            nearest, sense, keep, move, arrive, clear

    def run(self):
        """The simulation, forward (recorded by an enclosing Tape); the objective is in ``loss``."""
        for t in range(self.horizon):
            self._nearest(t)
            self._sense(t)
            self.stage()
            self._keep(t)
            self._move(t)
        self._arrive()

    def objective(self):
        """The objective, forward only (outside a Tape): a float."""
        self._clear()
        self.run()
        return float(self.loss[None])

    def gradients(self):
        """Tape over the simulation; the network holds dL/dθ afterwards (the loss is not read)."""
        self.network.zero_grad()
        with ti.ad.Tape(loss=self.loss):               # (which sets the loss to 0 first)
            self.run()

    def trajectories(self):
        """Positions ``(T + 1, N, 2)``."""
        return self.p.to_numpy()


def collisions(paths):
    """Agent pairs closer than two radii, summed over the steps (each pair once per step)."""
    total = 0
    for frame in paths:
        d2 = ((frame[:, None, :] - frame[None, :, :]) ** 2).sum(-1)
        total += int(np.triu(d2 < (2 * RADIUS) ** 2, 1).sum())
    return total


def in_obstacles(paths):
    """Agent positions inside an obstacle, summed over the steps."""
    inside = np.zeros(paths.shape[:2], bool)
    for x, y, r in OBSTACLES:
        inside |= ((paths - [x, y]) ** 2).sum(-1) < r ** 2
    return int(inside.sum())


def train(name, swarm, trainer, steps, budget, goal, report_every=10):
    """Adam steps until ``steps`` or ``budget`` seconds of training (compiles excluded); returns the results."""
    swarm.gradients()                                 # compiles (not counted in the budget)
    start_objective = swarm.objective()
    start, step = time.perf_counter(), 0
    while step < steps and time.perf_counter() - start < budget:
        swarm.gradients()
        trainer.optimizer_step(active=swarm.stage.active)
        step += 1
        if step % report_every == 0:                  # the only reads of the loss: every report_every steps
            print(f"  {name}: step {step:4d}, objective {float(swarm.loss[None]):.4f}, "
                  f"{time.perf_counter() - start:5.1f} s", flush=True)
    seconds = time.perf_counter() - start
    objective = swarm.objective()
    paths = swarm.trajectories()
    distance = float(np.linalg.norm(paths[-1] - goal, axis=1).mean())
    return {"name": name, "steps": step, "seconds": seconds, "objective": (start_objective, objective),
            "distance": distance, "collisions": collisions(paths), "in_obstacles": in_obstacles(paths),
            "paths": paths}


# -- pictures: numpy rasterisation, imageio writes ------------------------------------------------------------
def colours(goal):
    """A colour per agent from the direction of its goal (a hue wheel)."""
    hue = (np.arctan2(goal[:, 1] - 0.5, goal[:, 0] - 0.5) / (2 * np.pi)) % 1.0
    k = (hue[:, None] * 6 + np.array([5, 3, 1])) % 6
    return (255 * (1 - np.clip(np.minimum(k, 4 - k), 0, 1) * 0.8)).astype(np.uint8)


def canvas(size):
    img = np.full((size, size, 3), 255, np.uint8)
    yy, xx = (np.mgrid[0:size, 0:size] + 0.5) / size
    for x, y, r in OBSTACLES:
        img[(xx - x) ** 2 + (1 - yy - y) ** 2 < r ** 2] = 90
    return img


def dots(img, points, rgb, radius=1):
    size = img.shape[0]
    px = np.clip((points[:, 0] * size).astype(int), 0, size - 1)
    py = np.clip(((1 - points[:, 1]) * size).astype(int), 0, size - 1)
    for dy in range(-radius + 1, radius):
        for dx in range(-radius + 1, radius):
            img[np.clip(py + dy, 0, size - 1), np.clip(px + dx, 0, size - 1)] = rgb


def trajectory_picture(paths, rgb, size=384, sub=6, shown=96):
    """The paths of ``shown`` agents (every k-th), each step drawn as ``sub`` points along its segment, and
    where every agent ended (black)."""
    img = canvas(size)
    pick = slice(None, None, max(1, paths.shape[1] // shown))
    for t in range(len(paths) - 1):
        for s in range(sub):
            dots(img, (paths[t] + (paths[t + 1] - paths[t]) * s / sub)[pick], rgb[pick], radius=2)
    dots(img, paths[-1], 0)
    return img


def save_pictures(out, results, goal):
    import imageio.v2 as imageio
    rgb = colours(goal)
    gap = np.full((384, 8, 3), 255, np.uint8)
    pictures = [trajectory_picture(r["paths"], rgb) for r in results]
    path = os.path.join(out, "swarm_trajectories.png")
    imageio.imwrite(path, np.concatenate([pictures[0], gap, pictures[1]], 1))
    frames = []
    for t in range(len(results[0]["paths"])):
        panels = []
        for r in results:
            img = canvas(256)
            dots(img, r["paths"][t], rgb, radius=2)
            panels.append(img)
        frames.append(np.concatenate([panels[0], gap[:256], panels[1]], 1))
    gif = os.path.join(out, "swarm.gif")
    imageio.mimsave(gif, frames, duration=0.1, loop=0)
    return path, gif


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--agents", type=int, default=1024, help="agents (each with its own network in the array)")
    ap.add_argument("--horizon", type=int, default=24, help="simulation steps the objective looks through")
    ap.add_argument("--steps", type=int, default=1000, help="most training steps of each model")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of training for each model")
    ap.add_argument("--seed", type=int, default=0, help="seed of the scene and of both models")
    ap.add_argument("--arch", default="cpu", choices=["cpu", "vulkan", "cuda", "metal", "gpu"], help="Taichi arch")
    ap.add_argument("--out", default="out", help="folder for the pictures (created)")
    args = ap.parse_args(argv)
    for name in ("agents", "horizon", "steps"):
        if getattr(args, name) < (2 if name == "agents" else 1):
            ap.error(f"--{name} must be at least {2 if name == 'agents' else 1}")
    if args.budget <= 0:
        ap.error("--budget must be > 0")
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    ensure_out_dir(ap, args.out)
    tinn.init(getattr(ti, args.arch))
    start, goal = ring(args.agents, np.random.default_rng(args.seed))
    array = make_network(args.agents, shared=False)
    shared = make_network(args.agents, shared=True, agent_params=array.n_params)
    print(f"{args.agents} agents, {args.horizon} simulation steps; array: {args.agents} networks of "
          f"{array.n_params} parameters ({args.agents * array.n_params} in all); shared: one network of "
          f"{shared.n_params}", flush=True)
    results = []
    for name, net, optimizer in (("array", array, OPTIMIZER), ("shared", shared, SHARED_OPTIMIZER)):
        trainer = tinn.Trainer(net, tinn.create_optimizer(optimizer), tinn.create_loss({"otype": "L2"}))
        results.append(train(name, Swarm(net, start, goal, args.horizon), trainer, args.steps, args.budget, goal))
    start_distance = float(np.linalg.norm(start - goal, axis=1).mean())
    print(f"mean distance to the goal at the start {start_distance:.3f}")
    for r in results:
        print(f"{r['name']:>6}: {r['steps']} steps in {r['seconds']:.0f} s, objective {r['objective'][0]:.4f} -> "
              f"{r['objective'][1]:.4f}, mean distance to the goal {r['distance']:.3f}, {r['collisions']} "
              f"collisions, {r['in_obstacles']} agent-steps inside obstacles")
    for path in save_pictures(args.out, results, goal):
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
