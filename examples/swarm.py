"""Many tiny networks against one large one: a swarm whose agents differ in something their inputs do not show.

    python examples/swarm.py [--agents N] [--horizon T] [--steps S] [--sweep-steps S'] [--turn DEGREES]
                             [--budget SECONDS] [--seed 0] [--arch cpu] [--out DIR]

N agents start spread over a ring around three obstacles; each must reach the point opposite its start (through
the centre) within T simulation steps. Every agent's thrusters are mounted turned by its own hidden angle
(uniform in +-``--turn`` degrees): the same command moves two agents in different directions, and nothing an
agent senses says how its own thrusters are turned. An agent senses its position, velocity, goal and its two
nearest neighbours (the goal and the neighbours relative to its own position). One simulation step, for every
agent at once::

    neighbours (brute force, no gradient) -> features -> [tinn.ad.stage] -> a = A R_i tanh(out)
    v' = D v + dt (a + collision forces + obstacle forces),   p' = p + dt v'

with R_i agent i's hidden rotation, soft collisions (a spring pushes overlapping agents apart, and overlaps are
penalised) and soft obstacles. The objective, differentiated by ``ti.ad.Tape`` through all T steps and the stage::

    L = mean_i (|p_T,i - goal_i|^2 + W_S |v_T,i|^2) + W_C sum_t mean_i sum_m overlap_tim^2 + W_O sum_t mean_i sum_o overlap_tio^2
        + W_A sum_t mean_i |out_ti|^2 / T

Three learners steer the agents, in the same Taichi program, each trained for the same S steps of Adam:

* ``array``: a network array of K = N tiny networks (Identity encoding, a 16-wide MLP), the stage routed by the
  agent's id: each network fits its own agent's thrusters;
* ``shared``: one network for all (two hidden layers, as wide as the next one's), blind to which agent it steers;
* ``shared_with_id``: the same network given the agent's id as one more input, encoded by OneBlob (a soft
  one-hot over a bin per agent), with at least the array's parameter count.

Each learner's learning rate is picked by a short sweep (printed): S' steps at each of three rates from the
same initial parameters; the rate with the lowest objective trains the S steps. The example prints a table of
the three (objective, distance to the goal, collisions, steps, parameters, wall time) and writes to ``--out``:
``summary.json``, ``swarm_curves.png`` (the objective of each during training), ``swarm_trajectories.png`` and
``swarm.gif`` (one titled panel per learner).
"""
import argparse
import json
import math
import os
import time

import numpy as np
import taichi as ti

import tinn
from _progress import Heartbeat, Progress, clock
from _swarm_pictures import save_pictures
from sdf_eikonal import ensure_out_dir

N_NEIGHBOURS = 2
N_INPUTS = 6 + 2 * N_NEIGHBOURS                 # position, velocity, goal, neighbours' relative positions
RADIUS = 0.0025                                 # an agent's radius (the unit square is the world)
OBSTACLES = ((0.5, 0.5, 0.08), (0.36, 0.62, 0.05), (0.64, 0.38, 0.05))         # (x, y, radius)
DT, DAMPING, MAX_ACCELERATION = 0.05, 0.9, 3.0
K_COLLISION, K_OBSTACLE = 60.0, 60.0            # spring constants of the soft contacts (K dt^2 << 1: stiffer
                                                # springs make the contacts, and the gradients, explode)
W_COLLISION, W_OBSTACLE, W_ACTION, W_STOP = 10.0, 10.0, 1e-3, 0.1
AGENT_NET = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "None", "n_neurons": 16,
             "n_hidden_layers": 1}
OPTIMIZER = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99}
LEARNERS = ("array", "shared", "shared_with_id")
SWEEP = {"array": (3e-3, 1e-2, 3e-2), "shared": (3e-4, 1e-3, 3e-3), "shared_with_id": (1e-3, 3e-3, 1e-2)}


def ring(n, rng):
    """Starts spread over a ring (radii 0.3 to 0.48) around the centre, each goal the point opposite its start
    (through the centre, where the obstacles are)."""
    angle = rng.uniform(0, 2 * np.pi, n)
    radius = np.sqrt(rng.uniform(0.3 ** 2, 0.48 ** 2, n))                       # uniform over the ring's area
    start = 0.5 + radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], 1)
    return start.astype(np.float32), (1.0 - start).astype(np.float32)


def thrusters(n, turn_degrees, rng):
    """Each agent's hidden rotation of its thrusters, ``(n, 2, 2)``: angles uniform in +-``turn_degrees``."""
    a = np.radians(turn_degrees) * rng.uniform(-1, 1, n)
    return np.stack([np.stack([np.cos(a), -np.sin(a)], 1), np.stack([np.sin(a), np.cos(a)], 1)], 1).astype(np.float32)


def id_bins(n_agents):
    """OneBlob's bins for the agent's id: a power of two, at least one per agent."""
    return 1 << max(n_agents - 1, 1).bit_length()


def shared_width(n_agents):
    """The hidden width (a multiple of 16) of both shared networks: the one given the id (inputs padded to
    ``16 + id_bins``, two hidden layers, outputs padded to 16: ``(16 + B) W + W^2 + 16 W``) has at least the
    array's ``512 N`` parameters."""
    a = 32 + id_bins(n_agents)
    return int(math.ceil((-a + math.sqrt(a * a + 4 * 512 * n_agents)) / 2 / 16)) * 16


def make_network(n_agents, learner, seed=1337):
    """The agents' networks of ``learner`` (one of ``LEARNERS``), their outputs scaled down (``quiet_start``)."""
    if learner == "array":
        return quiet_start(tinn.NetworkWithInputEncoding(N_INPUTS, 2, {"otype": "Identity"}, AGENT_NET,
                                                         n_instances=n_agents, seed=seed))
    mlp = dict(AGENT_NET, otype="CutlassMLP", n_neurons=shared_width(n_agents), n_hidden_layers=2)
    if learner == "shared":
        return quiet_start(tinn.NetworkWithInputEncoding(N_INPUTS, 2, {"otype": "Identity"}, mlp, seed=seed))
    encoding = {"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": N_INPUTS},
                                                 {"otype": "OneBlob", "n_bins": id_bins(n_agents)}]}
    return quiet_start(tinn.NetworkWithInputEncoding(N_INPUTS + 1, 2, encoding, mlp, seed=seed))


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
    ``tinn.ad.stage`` (routed by agent id for an array; a network of ``N_INPUTS + 1`` inputs also sees the id,
    ``(i + 1/2) / id_bins(N)``). ``turn``: each agent's hidden thruster rotation ``(N, 2, 2)`` (default none)."""

    def __init__(self, network, start, goal, horizon, turn=None):
        N, T = len(start), horizon
        self.network, self.n_agents, self.horizon = network, N, T
        self.with_id = network.n_input_dims == N_INPUTS + 1
        self.p = ti.Vector.field(2, ti.f32, (T + 1, N), needs_grad=True)
        self.v = ti.Vector.field(2, ti.f32, (T + 1, N), needs_grad=True)
        self.goal = ti.Vector.field(2, ti.f32, N)
        self.turn = ti.Matrix.field(2, 2, ti.f32, N)
        self.features = ti.Vector.field(network.n_input_dims, ti.f32, N, needs_grad=True)
        self.out = ti.Vector.field(2, ti.f32, N, needs_grad=True)
        self.action = ti.Vector.field(2, ti.f32, (T, N), needs_grad=True)     # out of every step, kept
        self.neighbour = ti.field(ti.i32, (T, N, N_NEIGHBOURS))
        self.agent = ti.field(ti.i32, N)
        self.loss = ti.field(ti.f32, (), needs_grad=True)
        self.goal.from_numpy(goal)
        self.turn.from_numpy(np.broadcast_to(np.eye(2, dtype=np.float32), (N, 2, 2)) if turn is None else turn)
        self.agent.from_numpy(np.arange(N, dtype=np.int32))
        self.p.from_numpy(np.repeat(start[None], T + 1, 0))
        self.v.fill(0.0)
        self.stage = tinn.ad.stage(network, self.features, self.out,
                                   instance=self.agent if network.n_instances > 1 else None)
        self._build_kernels()

    def _build_kernels(self):
        p, v, goal, turn, features, out, action, neighbour, loss = (
            self.p, self.v, self.goal, self.turn, self.features, self.out, self.action, self.neighbour, self.loss)
        N, T, with_id, bins = self.n_agents, self.horizon, self.with_id, id_bins(self.n_agents)
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
                f = ti.Vector.zero(ti.f32, N_INPUTS + with_id)
                for c in ti.static(range(2)):
                    f[c] = 2.0 * (p[t, i][c] - 0.5)
                    f[2 + c] = v[t, i][c]
                    f[4 + c] = 2.0 * (goal[i][c] - p[t, i][c])
                for m in ti.static(range(N_NEIGHBOURS)):
                    q = p[t, neighbour[t, i, m]] - p[t, i]
                    for c in ti.static(range(2)):
                        f[6 + 2 * m + c] = 20.0 * q[c]
                if ti.static(with_id):
                    f[N_INPUTS] = (i + 0.5) / bins
                features[i] = f

        @ti.kernel
        def keep(t: ti.i32):
            for i in range(N):
                action[t, i] = out[i]

        @ti.kernel
        def move(t: ti.i32):
            for i in range(N):
                a, r = ti.tanh(action[t, i]), turn[i]           # (r @ a, written out: Taichi's reverse of @ warns)
                force = MAX_ACCELERATION * ti.Vector([r[0, 0] * a[0] + r[0, 1] * a[1], r[1, 0] * a[0] + r[1, 1] * a[1]])
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
        """Tape over the simulation; the network holds dL/dθ afterwards (the objective is in ``loss``)."""
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


def train(name, swarm, learning_rate, steps, goal, budget=None, every=3.0):
    """``steps`` Adam steps at ``learning_rate`` from the network's current parameters (stopping early only when
    ``budget`` seconds of training pass; compiles excluded), a progress line at least every ``every`` seconds;
    returns the results, ``curve``: the objective before each step and after the last."""
    trainer = tinn.Trainer(swarm.network, tinn.create_optimizer(dict(OPTIMIZER, learning_rate=learning_rate)),
                           tinn.create_loss({"otype": "L2"}))
    with Heartbeat(f"  {name}: compiling"):
        swarm.gradients()                             # compiles (not counted in the wall time)
    curve, progress = [], Progress(steps, f"  {name}", every=every)
    start, cpu = time.perf_counter(), time.process_time()
    while len(curve) < steps and (budget is None or time.perf_counter() - start < budget):
        swarm.gradients()
        curve.append(float(swarm.loss[None]))        # a read-back per step: the curve (cheap next to a step)
        trainer.optimizer_step(active=swarm.stage.active)
        progress.update(len(curve), objective=curve[-1])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    curve.append(swarm.objective())
    paths = swarm.trajectories()
    return {"objective": curve[-1], "goal_distance": float(np.linalg.norm(paths[-1] - goal, axis=1).mean()),
            "collisions": collisions(paths), "in_obstacles": in_obstacles(paths), "steps": len(curve) - 1,
            "n_params": int(swarm.network.n_params * swarm.network.n_instances), "wall_s": round(seconds, 2),
            "cpu_s": round(cpu, 2), "learning_rate": learning_rate, "curve": curve, "paths": paths}


def sweep(name, swarm, rates, steps, goal, every=3.0):
    """The learning rate of ``rates`` whose ``steps`` steps from the network's initial parameters end at the lowest
    objective (each try starts from those parameters; they are restored afterwards)."""
    initial, scores = swarm.network.params().copy(), {}
    for lr in rates:
        swarm.network.set_params(initial)
        scores[lr] = train(f"{name} sweep lr={lr:g}", swarm, lr, steps, goal, every=every)["objective"]
    swarm.network.set_params(initial)
    ok = {lr: s for lr, s in scores.items() if np.isfinite(s)}
    best = min(ok, key=ok.get) if ok else min(rates)
    print(f"  {name}: learning rate {best:g} (objective after {steps} steps: "
          + ", ".join(f"{lr:g} -> {s:.4f}" for lr, s in scores.items()) + ")", flush=True)
    return best


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--agents", type=int, default=256, help="agents (each with its own network in the array)")
    ap.add_argument("--horizon", type=int, default=24, help="simulation steps the objective looks through")
    ap.add_argument("--steps", type=int, default=150, help="training steps of each learner (the same for all)")
    ap.add_argument("--sweep-steps", type=int, default=None,
                    help="steps of each try of the learning-rate sweep (None: a fifth of --steps)")
    ap.add_argument("--turn", type=float, default=180.0, help="the agents' hidden thruster turns, uniform in "
                    "+-DEGREES (0: every agent alike, and nothing is hidden)")
    ap.add_argument("--budget", type=float, default=None,
                    help="most seconds of training for each learner (None: no limit; a learner it stops "
                    "early gets fewer steps, and the table says so)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the scene and of the models")
    ap.add_argument("--arch", default="cpu", choices=["cpu", "vulkan", "cuda", "metal", "gpu"], help="Taichi arch")
    ap.add_argument("--out", default="out", help="folder for the pictures and summary.json (created)")
    args = ap.parse_args(argv)
    for name in ("agents", "horizon", "steps"):
        if getattr(args, name) < (2 if name == "agents" else 1):
            ap.error(f"--{name} must be at least {2 if name == 'agents' else 1}")
    if args.agents > 4096:
        ap.error("--agents must be at most 4096 (the id's OneBlob bins)")
    if args.sweep_steps is None:
        args.sweep_steps = max(1, args.steps // 5)
    if args.sweep_steps < 1:
        ap.error("--sweep-steps must be at least 1")
    if args.budget is not None and not args.budget > 0:
        ap.error("--budget must be > 0")
    if not 0 <= args.turn <= 180:
        ap.error("--turn must be in [0, 180]")
    return ap, args


def table(results, start_distance):
    """The comparison as lines of text."""
    head = f"{'learner':<15} {'objective':>9} {'goal distance':>13} {'collisions':>10} {'steps':>5} " \
           f"{'parameters':>10} {'wall':>7} {'CPU':>7} {'lr':>6}"
    lines = [head, f"{'(start)':<15} {'':>9} {start_distance:>13.3f}"]
    for name, r in results.items():
        lines.append(f"{name:<15} {r['objective']:>9.4f} {r['goal_distance']:>13.3f} {r['collisions']:>10} "
                     f"{r['steps']:>5} {r['n_params']:>10} {r['wall_s']:>6.1f}s {r['cpu_s']:>6.1f}s "
                     f"{r['learning_rate']:>6g}")
    return lines


def main(argv=None):
    ap, args = parse_args(argv)
    ensure_out_dir(ap, args.out)
    t0, cpu0 = time.perf_counter(), time.process_time()
    tinn.init(getattr(ti, args.arch))
    rng = np.random.default_rng(args.seed)
    start, goal = ring(args.agents, rng)
    turn = thrusters(args.agents, args.turn, rng)
    print(f"{args.agents} agents, {args.horizon} simulation steps, thrusters turned by hidden angles in "
          f"+-{args.turn:g} degrees; {args.steps} training steps for each learner", flush=True)
    results = {}
    for name in LEARNERS:
        net = make_network(args.agents, name, seed=args.seed + 1)
        swarm = Swarm(net, start, goal, args.horizon, turn)
        print(f"{name}: {net.n_instances} network(s), {net.n_params * net.n_instances} parameters in all; "
              f"compiling, then the sweep of {args.sweep_steps} steps per learning rate", flush=True)
        lr = sweep(name, swarm, SWEEP[name], args.sweep_steps, goal)
        results[name] = train(name, swarm, lr, args.steps, goal, budget=args.budget)
    start_distance = float(np.linalg.norm(start - goal, axis=1).mean())
    print("\n".join(table(results, start_distance)))
    array = results["array"]["objective"]
    print(f"objective of the array / of the shared network: {array / results['shared']['objective']:.2f}; "
          f"/ of the shared network with id: {array / results['shared_with_id']['objective']:.2f}")
    if len({r["steps"] for r in results.values()}) > 1:
        print("note: --budget stopped some learners early, so their steps differ")
    summary = os.path.join(args.out, "summary.json")
    with open(summary, "w") as f:
        json.dump({n: {k: v for k, v in r.items() if k != "paths"} for n, r in results.items()}, f, indent=1)
    print(f"wrote {summary}", flush=True)
    with Heartbeat("drawing the pictures"):
        pictures = save_pictures(args.out, results, goal, OBSTACLES)
    for path in pictures:
        print(f"wrote {path}")
    print(f"whole run {clock(time.perf_counter() - t0)} ({time.process_time() - cpu0:.0f} s of CPU)")
    return results


if __name__ == "__main__":
    main()
