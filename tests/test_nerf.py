"""The NeRF example's renderer against NumPy (sample points, the volume rendering quadrature), its gradients
through both stages against finite differences, and a short run that learns a tiny analytic scene."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tinn
from conftest import sample, spread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import nerf  # noqa: E402
import nerf_data  # noqa: E402
from pictures import has_text  # noqa: E402

BOUND = 1.5
TINY_GRID = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
             "base_resolution": 3, "per_level_scale": 2.0}
SMOOTH_NET = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "None", "n_neurons": 16,
              "n_hidden_layers": 1}


def tiny_renderer(rng, n_rays, n_samples, instances=1, occupancy_res=4):
    """Tanh networks (smooth: finite differences hold) on a small grid, rays from a camera at distance 4."""
    density = tinn.NetworkWithInputEncoding(3, 1 + nerf.N_FEATURES, TINY_GRID, SMOOTH_NET, n_instances=instances)
    colour = tinn.NetworkWithInputEncoding(3 + nerf.N_FEATURES, 3, nerf.DIRECTION, SMOOTH_NET, n_instances=instances)
    for net in (density, colour):                       # larger weights than the init: a field with contrast
        net.set_params(net.params() * 3 + rng.normal(0, 0.3, net.params().shape).astype(np.float32))
    occupancy = nerf.OccupancyGrid(occupancy_res, 0.1)
    renderer = nerf.Renderer(density, colour, n_rays, n_samples, -BOUND, BOUND, occupancy)
    c2w = nerf_data.look_at([3.0, 2.0, 1.5])
    o, d = nerf_data.camera_rays(c2w[None].astype(np.float32), 8, 8, 6.0)
    pick = rng.choice(len(o), n_rays, replace=False)
    return renderer, o[pick], d[pick]


def reference_samples(o, d, jitter):
    """Ray-box entry and exit, delta = (t_far - t_near) / S (0 for a ray that misses), points normalised to
    the box and clamped into it, in float64."""
    o, d = o.astype(np.float64), d.astype(np.float64)
    ta, tb = (-BOUND - o) / d, (BOUND - o) / d
    t_near = np.maximum(np.minimum(ta, tb).max(1), 0.0)
    t_far = np.maximum(ta, tb).min(1)
    delta = np.maximum(t_far - t_near, 0.0) / jitter.shape[1]
    t = t_near[:, None] + (np.arange(jitter.shape[1]) + jitter) * delta[:, None]
    q = (o[:, None] + t[..., None] * d[:, None] + BOUND) / (2 * BOUND)
    return delta, np.clip(q, 0.0, 1.0 - 1e-6)                   # a ray that misses the box keeps its points in it


def reference_quadrature(sigma, delta, rgb_raw):
    """T_i = exp(-sum_{j<i} sigma_j delta_j), w_i = T_i (1 - exp(-sigma_i delta_i)),
    C = sum_i w_i sigmoid(rgb_i) + T_S * white, ray by ray and sample by sample."""
    n_rays, n_samples = sigma.shape
    w, colour = np.zeros((n_rays, n_samples)), np.zeros((n_rays, 3))
    for r in range(n_rays):
        optical_depth = 0.0
        for i in range(n_samples):
            w[r, i] = math.exp(-optical_depth) * (1 - math.exp(-sigma[r, i] * delta[r]))
            colour[r] += w[r, i] / (1 + np.exp(-rgb_raw[r, i]))
            optical_depth += sigma[r, i] * delta[r]
        colour[r] += math.exp(-optical_depth)
    return w, colour


@pytest.mark.parametrize("instances", sample([1, 8], keep=[8]))
def test_samples_and_compositing_match_the_numpy_quadrature(rng, instances):
    R, S = 12, 10
    renderer, o, d = tiny_renderer(rng, R, S, instances)
    occupied = (rng.random((4, 4, 4)) < 0.7).astype(np.int32)      # some empty cells: masked samples
    renderer.occupancy.field.from_numpy(occupied)
    jitter = rng.random((R, S), dtype=np.float32)
    renderer.set_rays(o, d, jitter)
    renderer.render()

    delta, q = reference_samples(o, d, jitter)
    np.testing.assert_allclose(renderer.delta.to_numpy(), delta, rtol=1e-5)
    cells = round(instances ** (1 / 3))
    cell = np.floor(q * cells).astype(int)
    np.testing.assert_allclose(renderer.pts.to_numpy(), q * cells - cell, atol=2e-5)
    np.testing.assert_array_equal(renderer.instance.to_numpy(), (cell[..., 2] * cells + cell[..., 1]) * cells + cell[..., 0])
    g = np.floor(q * 4).astype(int)
    mask = occupied[g[..., 0], g[..., 1], g[..., 2]] * (delta[:, None] > 0)   # occupied cells of rays that hit
    np.testing.assert_array_equal(renderer.mask.to_numpy(), mask)
    assert 0 < mask.sum() < mask.size

    h = renderer.h.to_numpy()
    flat = renderer.pts.to_numpy().reshape(-1, 3)
    inst = renderer.instance.to_numpy().reshape(-1).astype(np.int32) if instances > 1 else None
    expected_h = renderer.density_net.inference(flat, inst).reshape(R, S, -1)
    np.testing.assert_allclose(h[mask == 1], expected_h[mask == 1], atol=1e-5)
    sigma = np.where(mask == 1, np.exp(np.minimum(h[..., 0].astype(np.float64), nerf.MAX_LOG_SIGMA)), 0.0)
    w, colour = reference_quadrature(sigma, delta, renderer.rgb.to_numpy())
    assert w.max() > 0.05 and np.exp(-(sigma * delta[:, None]).sum(1)).min() < 0.9    # the quadrature matters
    np.testing.assert_allclose(renderer.weight.to_numpy(), w, atol=2e-6)
    np.testing.assert_allclose(renderer.colour.to_numpy(), colour, atol=2e-6)


@pytest.mark.long_compile("two stages of a grid and an SH network, compiled through llvmpipe")
@pytest.mark.full_only("two stages' finite differences; by default test_ad checks stage gradients")
@pytest.mark.parametrize("instances", [1, 8])
def test_gradient_through_both_stages_matches_finite_differences(rng, instances):
    R, S = 6, 8
    renderer, o, d = tiny_renderer(rng, R, S, instances)
    renderer.set_rays(o, d, rng.random((R, S), dtype=np.float32))
    renderer.target.from_numpy(rng.random((R, 3), dtype=np.float32))
    renderer.loss_and_gradients()

    def loss():
        renderer.loss[None] = 0.0
        renderer.render()
        renderer._mse()
        return float(renderer.loss[None])

    for net in (renderer.density_net, renderer.colour_net):
        params, grads = net.params().reshape(-1), net.gradients().reshape(-1)
        assert np.isfinite(grads).all() and np.abs(grads).max() > 1e-4
        for k in np.argsort(-np.abs(grads))[:6]:                     # the parameters that matter most
            e = 1e-2
            p = params.copy()
            p[k] += e
            net.set_params(p.reshape(net.params().shape))
            up = loss()
            p[k] -= 2 * e
            net.set_params(p.reshape(net.params().shape))
            down = loss()
            net.set_params(params.reshape(net.params().shape))
            fd = (up - down) / (2 * e)
            assert abs(fd - grads[k]) <= 3e-2 * abs(grads[k]) + 2e-5, (net.name, k, fd, grads[k])


def write_sphere_scene(folder, size=24, n_train=16, n_test=3):
    """A NeRF-synthetic folder of a sphere of radius 0.8 coloured by its normal, ray-traced in NumPy."""
    import imageio.v2 as imageio
    rng = np.random.default_rng(1)
    focal = 0.5 * size / math.tan(0.5 * nerf_data.FOV_X)
    for split, n in (("train", n_train), ("test", n_test)):
        os.makedirs(os.path.join(folder, split))
        frames = []
        for k, c2w in enumerate(nerf_data.orbit(n, rng=rng)):
            o, d = nerf_data.camera_rays(c2w[None].astype(np.float32), size, size, focal)
            b = (o * d).sum(1)
            disc = b * b - ((o * o).sum(1) - 0.64)
            hit = disc > 0
            t = -b - np.sqrt(np.maximum(disc, 0))
            normal = (o + t[:, None] * d) / 0.8
            rgba = np.concatenate([0.5 + 0.45 * normal, hit[:, None]], 1) * hit[:, None]
            imageio.imwrite(os.path.join(folder, split, f"r_{k}.png"),
                            (rgba.reshape(size, size, 4) * 255 + 0.5).astype(np.uint8))
            frames.append({"file_path": f"./{split}/r_{k}", "transform_matrix": c2w.tolist()})
        with open(os.path.join(folder, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": nerf_data.FOV_X, "frames": frames}, f)


def tiny_scene_run(tmp_path, *args):
    """examples/nerf.py on a tiny sphere scene (``write_sphere_scene``), output into ``tmp_path / "out"``."""
    if not (tmp_path / "scene").exists():
        write_sphere_scene(tmp_path / "scene")
    arch = ["--arch", os.environ["TINN_ARCH"]] if "TINN_ARCH" in os.environ else []
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "nerf.py"), "--data", str(tmp_path / "scene"),
                             "--downscale", "1", "--rays", "512", "--samples", "32", "--occupancy", "16", *args, *arch,
                             "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\r" not in result.stdout + result.stderr                   # a log file holds the progress
    return result.stdout


@pytest.mark.long_compile("the example's stages and renderer, compiled through llvmpipe, then 100 steps")
@pytest.mark.full_only("the example's 100 training steps; its stages, renderer and arguments are checked above "
                       "and below")
@pytest.mark.parametrize("instances", ["1", "8"])
def test_nerf_example_learns_a_tiny_scene(tmp_path, instances):
    no_render = ["--no-render"] if instances == "8" else []          # the turntable is skipped
    stdout = tiny_scene_run(tmp_path, "--steps", "120", "--turntable", "2", "--instances", instances, *no_render)
    found = re.search(r"held-out PSNR ([\d.]+) dB .*mean-colour baseline ([\d.]+) dB", stdout)
    assert found, stdout
    psnr, baseline = float(found.group(1)), float(found.group(2))
    assert psnr > baseline + 6, stdout
    import imageio.v2 as imageio
    picture = imageio.imread(tmp_path / "out" / "nerf_test.png")
    assert has_text(picture, "HELD-OUT VIEWS (TARGETS)")
    assert has_text(picture, f"RENDERS OF THE SAME VIEWS (PSNR {psnr:.2f} DB)")
    if no_render:
        assert sorted(os.listdir(tmp_path / "out")) == ["nerf_test.png"] and "turntable" not in stdout
    else:
        assert sorted(os.listdir(tmp_path / "out")) == ["nerf_test.png", "nerf_turntable.gif"]
        assert "turntable: step 2/2" in stdout                          # the turntable shows progress


COMPARE_STEPS = 50


@pytest.mark.long_compile("two fields' stages and renderers, compiled through llvmpipe")
@pytest.mark.full_only("the example trained twice (one network, then 8); the default suite checks its stages, "
                       "renderer, arguments and picture titles above and below")
def test_nerf_compare_trains_both_for_the_same_time_and_titles_its_picture(tmp_path):
    stdout = tiny_scene_run(tmp_path, "--steps", str(COMPARE_STEPS), "--compare", "--instances", "8")
    with open(tmp_path / "out" / "nerf_compare.json") as f:
        summary = json.load(f)
    one, array = summary["one"], summary["array"]
    assert set(one) == set(array) == {"n_networks", "n_params", "steps", "train_s", "first_step_s", "steps_per_s",
                                      "psnr", "render_s_per_view", "psnr_reached_at_s"}
    assert (one["n_networks"], array["n_networks"], one["steps"]) == (1, 8, COMPARE_STEPS)
    assert 0.9 <= array["n_params"] / one["n_params"] <= 1.1                  # the same parameters within 10 %
    assert one["train_s"] <= array["train_s"] <= 2 * one["train_s"]           # the array trains as long, in chunks
    for r in (one, array):
        assert r["steps_per_s"] == pytest.approx((r["steps"] - 1) / r["train_s"])
        assert r["render_s_per_view"] > 0 and r["psnr"] > 0
    for row in ("held-out PSNR, dB", "render time per held-out view", "training steps per second"):
        assert row in stdout, stdout
    import imageio.v2 as imageio
    picture = imageio.imread(tmp_path / "out" / "nerf_compare.png")
    times = f"TRAINING TIME {one['train_s']:.0f} / {array['train_s']:.0f} S"
    for title in ("HELD-OUT VIEW 0 (TARGET)", "ONE NETWORK: ", "8 NETWORKS: ", times,
                  "ONE NETWORK AGAINST A KILONERF-STYLE ARRAY, SAME VIEW"):
        assert has_text(picture, title), title


def test_the_micro_networks_hold_as_many_parameters_as_the_one_network():
    one = sum(n.n_params for n in nerf.make_field(1))
    for k in (8, 27, 64):
        density, colour = nerf.make_field(k)
        assert density.n_instances == colour.n_instances == k
        total = k * (density.n_params + colour.n_params)
        assert 0.9 <= total / one <= 1.1, (k, total, one)
        assert nerf.field_params(k, nerf.array_grid(k), nerf.ARRAY_NEURONS) == total     # the count that sized it


def test_the_scene_is_cached_under_out_unless_told_otherwise(tmp_path):
    _, args = nerf.parse_args(["--out", str(tmp_path / "o")])
    assert args.scene == os.path.join(str(tmp_path / "o"), "nerf_scene") and not args.compare
    _, args = nerf.parse_args(["--scene", str(tmp_path / "s"), "--compare"])
    assert args.scene == str(tmp_path / "s") and args.instances == 8          # --compare: 8 micro-networks


def test_the_held_out_picture_titles_its_rows():
    targets, renders = np.zeros((3, 20, 30, 3), np.float32), np.ones((3, 20, 30, 3), np.float32)
    picture = nerf_data.test_picture(targets, renders, 23.456)
    assert has_text(picture, "HELD-OUT VIEWS (TARGETS)")
    assert has_text(picture, "RENDERS OF THE SAME VIEWS (PSNR 23.46 DB)")
    assert picture.shape[1] >= 400                                       # tiny views are enlarged: the titles fit


def test_nerf_example_refuses_bad_arguments(tmp_path):
    for args, message in spread([(["--instances", "6"], "--instances must be a cube"),
                                 (["--data", str(tmp_path)], "has no transforms_train.json"),
                                 (["--steps", "0"], "must be a positive integer")], 2):
        result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "nerf.py"), *args,
                                 "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_the_training_log_spreads_a_mean_loss_over_the_steps_it_covers():
    log = nerf_data.TrainingLog(50)
    log.add(25, 0.01, 1.0)
    log.add(50, 0.001, 1.0)
    assert log.n_steps == 50 and log.losses[:25] == [0.01] * 25 and log.losses[25:] == [0.001] * 25
    assert {20, 25, 28} <= set(log.reached)            # 20 dB at step 25, 30 dB (of 0.001) at step 50
