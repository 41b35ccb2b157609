"""examples/swarm.py in small: a network array, a shared network and a shared network given the agent's id,
steering agents with hidden thruster turns through a differentiable Taichi simulation."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import _curves  # noqa: E402
import _progress  # noqa: E402
import _swarm_pictures  # noqa: E402
import swarm  # noqa: E402


def small_swarm(n_agents, horizon, seed=0, learner="array", turn=180.0):
    rng = np.random.default_rng(seed)
    start, goal = swarm.ring(n_agents, rng)
    net = swarm.make_network(n_agents, learner)
    return swarm.Swarm(net, start, goal, horizon, swarm.thrusters(n_agents, turn, rng)), goal


def test_thrusters_are_rotations_within_the_turn():
    r = swarm.thrusters(500, 30.0, np.random.default_rng(0))
    np.testing.assert_allclose(r @ r.transpose(0, 2, 1), np.broadcast_to(np.eye(2), r.shape), atol=1e-6)
    angle = np.degrees(np.arctan2(r[:, 1, 0], r[:, 0, 0]))
    assert np.abs(angle).max() <= 30.0 and np.abs(angle).max() > 25.0


def test_the_shared_network_with_id_has_at_least_the_arrays_parameters():
    for n in (8, 100, 256):
        array, with_id = swarm.make_network(n, "array"), swarm.make_network(n, "shared_with_id")
        assert array.n_instances == n and array.n_params == 16 * 16 + 16 * 16        # inputs, outputs padded to 16
        assert with_id.n_instances == 1 and with_id.n_params >= n * array.n_params
    for n in (8, 100, 256, 1024):                     # and its width is the least that gets there
        array = n * 512                               # 16-wide MLP, inputs and outputs padded to 16
        w, b = swarm.shared_width(n), swarm.id_bins(n)
        assert w % 16 == 0 and b >= n and b & (b - 1) == 0
        assert (16 + b) * w + w * w + 16 * w >= array > (16 + b) * (w - 16) + (w - 16) ** 2 + 16 * (w - 16)


@pytest.mark.parametrize("learner", ["array", "shared_with_id"])
def test_one_simulation_step_matches_numpy(learner):
    """Agents far apart, clear of the obstacles: p_1 = p_0 + dt^2 A R tanh(out), v_1 = dt A R tanh(out)."""
    n = 6
    angle = np.arange(n) * 2 * np.pi / n + 0.3
    start = (0.5 + 0.45 * np.stack([np.cos(angle), np.sin(angle)], 1)).astype(np.float32)
    goal = (1 - start).astype(np.float32)
    turn = swarm.thrusters(n, 180.0, np.random.default_rng(3))
    net = swarm.make_network(n, learner)
    net.set_params(net.params() * 6)
    sim = swarm.Swarm(net, start, goal, 1, turn)
    objective = sim.objective()
    features = np.concatenate([2 * (start - 0.5), np.zeros((n, 2)), 2 * (goal - start)], 1)
    d2 = ((start[:, None] - start[None]) ** 2).sum(-1) + np.eye(n) * 1e9
    near = np.argsort(d2, 1)[:, :swarm.N_NEIGHBOURS]
    features = np.concatenate([features] + [20 * (start[near[:, m]] - start) for m in range(swarm.N_NEIGHBOURS)], 1)
    if learner == "shared_with_id":
        features = np.concatenate([features, ((np.arange(n) + 0.5) / swarm.id_bins(n))[:, None]], 1)
        out = net.inference(features.astype(np.float32))
    else:
        out = net.inference(features.astype(np.float32), instance=np.arange(n, dtype=np.int32))
    v1 = swarm.DT * swarm.MAX_ACCELERATION * np.einsum("nij,nj->ni", turn, np.tanh(out))
    p1 = start + swarm.DT * v1
    expected = (swarm.W_ACTION * (out ** 2).sum(1) + ((p1 - goal) ** 2).sum(1) + swarm.W_STOP * (v1 ** 2).sum(1)).mean()
    assert np.abs(out).max() > 0.1
    np.testing.assert_allclose(sim.trajectories()[1], p1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(objective, expected, rtol=1e-5)


@pytest.mark.parametrize("learner,device", sample([("array", False), ("array", True), ("shared_with_id", False)],
                                                  keep=[0]),
                         ids=["array-host", "array-device", "shared_with_id-host"])
def test_the_gradient_through_two_simulation_steps_matches_central_differences(learner, device, set_path):
    set_path(device)
    sim, _ = small_swarm(6, horizon=2, learner=learner)
    net = sim.network
    net.set_params(net.params() * 4)                  # actions well away from 0: every term of the objective moves
    sim.gradients()
    grads, params = net.gradients().reshape(net.n_instances, -1), net.params().reshape(net.n_instances, -1)
    assert np.abs(grads).max() > 1e-3
    picks = [np.unravel_index(i, grads.shape) for i in np.argsort(-np.abs(grads), axis=None)[:8]]
    for k, j in picks:
        def at(value):
            p = params.copy()
            p[k, j] = value
            net.set_params(p.reshape(net.params().shape))
            return np.float64(sim.objective())
        e = 1e-2
        fd = (at(params[k, j] + e) - at(params[k, j] - e)) / (2 * e)
        net.set_params(params.reshape(net.params().shape))
        np.testing.assert_allclose(grads[k, j], fd, rtol=2e-2, atol=1e-3 * np.abs(grads).max(),
                                   err_msg=f"network {k}, parameter {j}")


@pytest.mark.full_only("30 training steps of the swarm; the default suite checks a step and its gradients above")
def test_training_lowers_the_objective():
    sim, goal = small_swarm(16, horizon=6, seed=1)
    result = swarm.train("array", sim, 1e-2, steps=30, goal=goal)
    assert result["steps"] == 30 and result["objective"] < 0.9 * result["curve"][0]
    assert len(result["curve"]) == 31 and result["paths"].shape == (7, 16, 2)


def test_a_heartbeat_prints_while_a_silent_call_runs_and_stops_after_it():
    import io
    import time
    stream = io.StringIO()
    with _progress.Heartbeat("compiling", every=0.05, stream=stream):
        time.sleep(0.4)
    lines = stream.getvalue().splitlines()
    time.sleep(0.2)
    assert len(lines) >= 3 and all(line.startswith("compiling: ") for line in lines)
    assert stream.getvalue().splitlines() == lines


def fake_results(n=12, steps=5):
    rng = np.random.default_rng(0)
    paths = 0.5 + 0.3 * rng.standard_normal((4, n, 2))
    return {name: {"curve": list(np.linspace(1.0, 0.1 * (i + 1), steps + 1)), "paths": paths, "n_params": 512 * n}
            for i, name in enumerate(swarm.LEARNERS)}, 1 - paths[0]


def test_the_pictures_title_every_panel_and_label_every_curve(tmp_path, monkeypatch):
    drawn = []
    real = _curves.text
    monkeypatch.setattr(_curves, "text", lambda img, x, y, s: (drawn.append(s), real(img, x, y, s)))
    results, goal = fake_results()
    _swarm_pictures.save_pictures(str(tmp_path), results, goal, swarm.OBSTACLES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swarm.gif", "swarm_curves.png", "swarm_trajectories.png"]
    titles = [_swarm_pictures.TITLES[n] for n in swarm.LEARNERS]
    assert len(set(titles)) == 3
    assert any("OBJECTIVE" in s and "(LOG)" in s for s in drawn)          # the chart's title says its axis is log
    for title in titles:                              # the legend, the paths' panels (with parameters), each GIF frame
        assert drawn.count(title) == 1 + 4, (title, drawn)
        assert sum(s.startswith(title + " (") and "PARAMS" in s for s in drawn) == 1


def test_a_chart_of_several_series_draws_each_in_its_colour_with_a_legend(monkeypatch):
    xs, drawn = np.arange(10), []
    real = _curves.text
    monkeypatch.setattr(_curves, "text", lambda img, x, y, s: (drawn.append(s), real(img, x, y, s)))
    img = _curves.draw_series("TWO (LOG)", [_curves.Series("A", xs, 10.0 ** -xs), _curves.Series("B", xs, xs + 1.0)],
                              log=True)
    assert img.shape[1] == 640 and img.shape[0] > 300                  # the legend's lines below the chart
    assert drawn[0] == "TWO (LOG)" and drawn[-2:] == ["A", "B"] and "9 STEPS" in drawn
    assert "10" in drawn and "1E-09" in drawn                         # the y range, from the values, not their logs
    for colour in _curves.COLOURS[:2]:
        assert (img[:300] == colour).all(-1).sum() > 50 and (img[300:] == colour).all(-1).any()
    assert not (img == _curves.COLOURS[2]).all(-1).any()


@pytest.mark.full_only("the example's whole run; the default suite checks its simulation, gradients, training, "
                       "pictures and arguments (test_examples_output) in-process")
def test_the_example_compares_three_learners_for_the_same_steps_and_writes_only_to_out(tmp_path):
    out = tmp_path / "pictures"
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "swarm.py"), "--agents", "8",
                             "--horizon", "3", "--steps", "3", "--budget", "60", *arch, "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in swarm.LEARNERS:
        assert re.search(rf"^  {name}: learning rate [\d.e-]+ \(objective after 1 steps: ", result.stdout, re.M)
        row = rf"^{name}\s+[\d.]+\s+[\d.]+\s+\d+\s+3\s+\d+\s+[\d.]+s\s+[\d.]+s"     # objective ... steps = 3 ...
        assert re.search(row, result.stdout, re.M), result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "swarm.gif", "swarm_curves.png",
                                                    "swarm_trajectories.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pictures"]
    assert "\r" not in result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary) == sorted(swarm.LEARNERS)
    for name, r in summary.items():
        assert {"objective", "goal_distance", "collisions", "steps", "n_params", "wall_s"} <= set(r)
        assert r["steps"] == 3 and len(r["curve"]) == 4 and np.isfinite(r["objective"])
    assert summary["array"]["n_params"] == 8 * 512
    assert summary["shared_with_id"]["n_params"] >= summary["array"]["n_params"]
