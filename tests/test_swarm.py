"""examples/swarm.py in small: a network array steering agents through a differentiable Taichi simulation."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tinn.runtime import program as _program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import swarm  # noqa: E402


def small_swarm(n_agents, horizon, seed=0):
    start, goal = swarm.ring(n_agents, np.random.default_rng(seed))
    net = swarm.make_network(n_agents, shared=False)
    return swarm.Swarm(net, start, goal, horizon), goal


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_the_arrays_gradient_through_two_simulation_steps_matches_central_differences(device, monkeypatch):
    monkeypatch.setattr(_program, "FORCE", device)
    sim, _ = small_swarm(6, horizon=2)
    net = sim.network
    net.set_params(net.params() * 4)                  # actions well away from 0: every term of the objective moves
    sim.gradients()
    grads, params = net.gradients(), net.params()
    assert grads.shape == (6, net.n_params) and np.abs(grads).max() > 1e-3
    picks = [np.unravel_index(i, grads.shape) for i in np.argsort(-np.abs(grads), axis=None)[:8]]
    for k, j in picks:
        def at(value):
            p = params.copy()
            p[k, j] = value
            net.set_params(p)
            return np.float64(sim.objective())
        e = 1e-2
        fd = (at(params[k, j] + e) - at(params[k, j] - e)) / (2 * e)
        net.set_params(params)
        np.testing.assert_allclose(grads[k, j], fd, rtol=2e-2, atol=1e-3 * np.abs(grads).max(),
                                   err_msg=f"network {k}, parameter {j}")


def test_training_lowers_the_objective():
    sim, goal = small_swarm(16, horizon=6, seed=1)
    trainer = swarm.tinn.Trainer(sim.network, swarm.tinn.create_optimizer(swarm.OPTIMIZER),
                                 swarm.tinn.create_loss({"otype": "L2"}))
    result = swarm.train("array", sim, trainer, steps=30, budget=120.0, goal=goal, report_every=1000)
    before, after = result["objective"]
    assert result["steps"] == 30 and after < 0.9 * before
    assert result["paths"].shape == (7, 16, 2)


def test_the_example_compares_both_models_and_writes_its_pictures_only_to_out(tmp_path):
    out = tmp_path / "pictures"
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "swarm.py"), "--agents", "8", "--horizon", "3",
                             "--steps", "3", "--budget", "60", *arch, "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("array", "shared"):
        assert re.search(rf"^\s*{name}: 3 steps in .* mean distance to the goal [\d.]+, \d+ collisions", result.stdout,
                         re.M), result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["swarm.gif", "swarm_trajectories.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pictures"]
    assert "\r" not in result.stdout + result.stderr
