"""The register-blocked fused MLP kernels (``tinn.networks._fused_mlp``): what they keep, what they read from
shared memory, how their weight gradients are summed (no atomics: two runs give bit-identical gradients), and
that a dense array's pass needs no sort. Their values against NumPy are in test_device_path.py and
test_fused_arrays.py; the kernels need shared memory, so the tests that run them skip on x64."""
import numpy as np
import pytest
import taichi as ti

import tinn
from tinn.batch import buffers as _buffers
from tinn.runtime.probe import counting
from tinn.networks import _fused_layout, _fused_mlp
from tinn.networks._mlp_plan import FUSED_TILINGS, MLPPlan, thread_tile
from reference import assert_close
from test_device_path import use_mlp_kernels
from conftest import on_path

CONFIG_HASH_PLAN = MLPPlan.build(32, 3, 16, 64, 2, "ReLU", "None")
"""config_hash's MLP: 32 encoded inputs (16 levels x 2 features), 64 neurons x 2 hidden layers, 3 outputs."""


def test_config_hash_keeps_524_bytes_per_sample_for_the_backward():
    """Kept: the two hidden layers' ReLU outputs (64 floats each; ReLU's slope is read from its output) and the
    output layer's 3 pre-activations: (2 x 64 + 3) x 4 = 524 bytes per sample (1,036 when every pre-activation
    was kept too), half that in float16."""
    assert _fused_layout.kept_bytes_per_sample(CONFIG_HASH_PLAN, half=False) == (2 * 64 + 3) * 4 == 524
    assert _fused_layout.kept_bytes_per_sample(CONFIG_HASH_PLAN, half=True) == 262
    tanh = MLPPlan.build(32, 3, 16, 64, 2, "Tanh", "None")          # Tanh's slope needs its pre-activation
    assert _fused_layout.kept_bytes_per_sample(tanh, half=False) == (2 * 64 + 2 * 64 + 3) * 4


@pytest.mark.parametrize("arch", sorted(FUSED_TILINGS))
def test_a_hidden_layer_reads_one_shared_value_per_register_tile_side(arch):
    """A 64-wide hidden layer's products (forward, dW, dx) run on square register tiles of the arch's side p
    (CUDA 8, Vulkan and Metal 4): 2p shared loads per p^2 multiply-adds (0.25 on CUDA); the step's mean over all
    products stays within 1.2 times that; every kernel's shared array fits the arch."""
    tiling = FUSED_TILINGS[arch]
    p = tiling.register
    loads = _fused_layout.shared_loads_per_fma(CONFIG_HASH_PLAN, tiling)
    assert loads["forward[1]"] == loads["dW[1]"] == loads["dx[1]"] == 2 * p / p ** 2
    assert loads["total"] < 1.2 * 2 / p
    assert FUSED_TILINGS["cuda"].register == 8
    assert _fused_layout.fits(CONFIG_HASH_PLAN, tiling)
    for tiles in (1, 2):                                   # the forward's one activation tile, the backward's two
        resident = _fused_layout.resident(CONFIG_HASH_PLAN, tiling, tiles)
        assert 4 * _fused_layout.shared_words(CONFIG_HASH_PLAN, tiling, tiles, resident) <= tiling.shared_bytes


@pytest.mark.parametrize("arch", sorted(FUSED_TILINGS))
def test_weights_are_staged_once_per_run_where_they_fit(arch):
    """Every layer's weights stay in shared memory for a run of tiles where they fit beside the kernel's tiles:
    a 32-wide MLP's in both kernels on every arch (so the value tests on Vulkan run that path), config_hash's in
    the forward on CUDA (32 KiB of weights, a 16 KiB tile), its backward staging each layer per tile there (its two
    tiles make 64 KiB), and per tile in both kernels on Vulkan (32 KiB in all)."""
    tiling = FUSED_TILINGS[arch]
    small = MLPPlan.build(8, 3, 16, 32, 2, "ReLU", "None")
    assert _fused_layout.resident(small, tiling, 1) and _fused_layout.resident(small, tiling, 2)
    weights = sum(4 * layer.cols * -(-max(layer.rows, 32) // 32) * 32 for layer in CONFIG_HASH_PLAN.layers)
    tile = 4 * tiling.samples * 64
    assert weights == 32 * 1024
    for tiles in (1, 2):
        assert _fused_layout.resident(CONFIG_HASH_PLAN, tiling, tiles) == (weights + tiles * tile <= tiling.shared_bytes)
    assert _fused_layout.resident(CONFIG_HASH_PLAN, tiling, 1) == (arch == "cuda")
    assert not _fused_layout.resident(CONFIG_HASH_PLAN, tiling, 2)


@pytest.mark.parametrize("a, b, threads", [(64, 64, 64), (3, 64, 64), (64, 32, 32), (13, 64, 64), (64, 3, 64)])
def test_a_register_tile_covers_every_output_once(a, b, threads):
    """The tiles ``g < ga gb`` of ``thread_tile`` own every output of an ``a x b`` product exactly once (outputs past
    the edge are dropped), within ``threads`` threads and 8 x 8 outputs each."""
    ga, pa, gb, pb = thread_tile(a, b, threads)
    assert ga * gb <= threads and pa <= 8 and pb <= 8
    owned = [(g // gb + ga * e, g % gb + gb * f) for g in range(ga * gb) for e in range(pa) for f in range(pb)]
    inside = [(r, c) for r, c in owned if r < a and c < b]
    assert sorted(inside) == [(r, c) for r in range(a) for c in range(b)]


def fused_net(monkeypatch, n_instances=1, **cfg):
    use_mlp_kernels(monkeypatch, "fused")
    config = {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2, "activation": "ReLU",
              "output_activation": "None", **cfg}
    return tinn.create_network(8, 3, config, n_instances=n_instances, seed=5)


@pytest.mark.parametrize("n_instances", [1, 4])
def test_two_backward_passes_give_bit_identical_gradients(rng, monkeypatch, device_path, n_instances):
    """Weight gradients are sums in a fixed order (no atomics): the same backward twice writes the same bits,
    for a single network over several blocks of partial sums and for a routed array."""
    net = fused_net(monkeypatch, n_instances)
    B = 2000
    x, dy = rng.normal(size=(B, 8)).astype(np.float32), rng.normal(size=(B, 3)).astype(np.float32)
    ids = rng.integers(0, n_instances, B).astype(np.int32) if n_instances > 1 else None
    grads = []
    for _ in range(2):
        _, ctx = net.forward(x, ids)
        assert isinstance(ctx.fused, _fused_mlp.FusedKernels)
        net.backward(ctx, dy)
        grads.append(net.gradients().copy())
    assert np.array_equal(grads[0].view(np.uint32), grads[1].view(np.uint32))
    assert np.abs(grads[0]).sum() > 0


def test_a_backward_without_overwrite_adds_to_the_gradients(rng, monkeypatch, device_path):
    """``overwrite=False``: the pass's sums are added to the gradients already there (a single network's reduction
    and an array's blocks alike), so two passes give twice one pass."""
    for n_instances in (1, 3):
        net = fused_net(monkeypatch, n_instances)
        B = 300
        x, dy = rng.normal(size=(B, 8)).astype(np.float32), rng.normal(size=(B, 3)).astype(np.float32)
        ids = (np.arange(B) % n_instances).astype(np.int32) if n_instances > 1 else None
        _, ctx = net.forward(x, ids)
        net.backward(ctx, dy)
        once = net.gradients().copy()
        net.backward(ctx, dy, mode="accumulate")
        assert_close(net.gradients(), 2 * once, rtol=1e-6, atol_rel=1e-7, atol=1e-8)


def test_a_dense_array_pass_needs_no_sort(rng, monkeypatch, device_path):
    """A dense ``(K, B_k, dims)`` batch: block k owns network k's samples, so its forward and backward launch the
    fused kernels alone (no id census, sort or tile table)."""
    net = fused_net(monkeypatch, 4)
    x, dy = _buffers.put(rng.normal(size=(4, 70, 8)).astype(np.float32)), rng.normal(size=(280, 3)).astype(np.float32)
    net.backward(net.forward(x)[1], dy)
    with counting() as seen:
        _, ctx = net.forward(x)
        net.backward(ctx, dy)
    assert seen.kernels["forward"] == 1 and seen.kernels["backward"] == 1
    assert not {"_sort_ids", "_tile_table", "_id_census"} & set(seen.kernels)


def test_what_the_forward_keeps_is_the_bytes_it_reports(rng, monkeypatch, device_path):
    """The buffers a training forward keeps hold ``kept_bytes_per_sample`` bytes per sample: a 32-wide ReLU MLP
    with 3 outputs keeps its two hidden outputs and the output's pre-activations, (2 x 32 + 3) x 4 bytes."""
    net = fused_net(monkeypatch)
    B = 500
    _, ctx = net.forward(rng.normal(size=(B, 8)).astype(np.float32))
    assert ctx.zs.shape == (1, 3, B) and ctx.hs.shape == (2, 32, B)
    kept = sum(a.shape[0] * a.shape[1] * a.shape[2] for a in (ctx.zs, ctx.hs)) * 4
    assert kept == _fused_layout.kept_bytes_per_sample(net.plan, half=False) * B == (2 * 32 + 3) * 4 * B


GRIDS = {"HashGrid": {"otype": "HashGrid", "n_levels": 6, "n_features_per_level": 2, "log2_hashmap_size": 8,
                      "base_resolution": 4, "per_level_scale": 1.6},
         "DenseGrid": {"otype": "DenseGrid", "n_levels": 3, "n_features_per_level": 4, "base_resolution": 3,
                       "per_level_scale": 2.0, "interpolation": "Smoothstep"},
         "TiledGrid": {"otype": "TiledGrid", "n_levels": 3, "n_features_per_level": 1, "log2_hashmap_size": 6,
                       "base_resolution": 5, "per_level_scale": 1.5, "interpolation": "Nearest"},
         "Permutohedral": {"otype": "Permutohedral", "n_levels": 3, "n_features_per_level": 2, "base_resolution": 4,
                           "log2_hashmap_size": 8},
         "Frequency": {"otype": "Frequency", "n_frequencies": 3},
         "OneBlob": {"otype": "OneBlob", "n_bins": 4},
         "SphericalHarmonics": {"otype": "SphericalHarmonics", "degree": 4},
         "Composite": {"otype": "Composite", "nested": [      # a gap after Identity; the second grid's parameters
             {"otype": "HashGrid", "n_dims_to_encode": 2, "n_levels": 3, "n_features_per_level": 2,
              "log2_hashmap_size": 7, "base_resolution": 4},
             {"otype": "Identity", "n_dims_to_encode": 1},
             {"otype": "DenseGrid", "n_dims_to_encode": 1, "n_levels": 2, "n_features_per_level": 2,
              "base_resolution": 5}]},
         "NeRF direction": {"otype": "Composite", "nested": [   # examples/nerf.py's colour network's input
             {"otype": "SphericalHarmonics", "degree": 4, "n_dims_to_encode": 3}, {"otype": "Identity"}]}}
INPUT_DIMS = {"Composite": 4, "NeRF direction": 5}


@pytest.mark.parametrize("grid, routing, precision", [("HashGrid", "single", "float32"), ("HashGrid", "routed", "float32"),
                                                      ("HashGrid", "dense", "float32"), ("DenseGrid", "routed", "float32"),
                                                      ("TiledGrid", "single", "float32"), ("HashGrid", "routed", "float16"),
                                                      ("Permutohedral", "routed", "float32"),
                                                      ("Frequency", "dense", "float32"), ("OneBlob", "single", "float32"),
                                                      ("SphericalHarmonics", "single", "float32"),
                                                      ("Composite", "routed", "float32"),
                                                      ("NeRF direction", "dense", "float32")])
def test_an_inference_runs_the_encoding_inside_the_fused_kernel(rng, monkeypatch, device_path, grid, routing,
                                                                precision):
    """A model's inference on the fused kernels is one launch after the census when its encoding has an in-kernel
    writer (grids, the permutohedral lattice, the per-dimension encodings, spherical harmonics, and a
    concatenation of such): each tile's samples are encoded into shared memory by the encoding's own formulas,
    and the outputs land in the caller's layout. It equals the forward (the encoding's own kernel, then the fused
    MLP) and, in float32, the host path."""
    use_mlp_kernels(monkeypatch, "fused")
    K, n_in = 1 if routing == "single" else 3, INPUT_DIMS.get(grid, 3)
    net = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh"}
    model = tinn.NetworkWithInputEncoding(n_in, 2, GRIDS[grid], net, n_instances=K, precision=precision)
    model.set_params((rng.normal(size=model.params().shape) * 0.5).astype(np.float32))
    B = 3 * 70
    xh = rng.random((K, B // K, n_in) if routing == "dense" else (B, n_in), dtype=np.float32)
    ids = rng.integers(0, K, B).astype(np.int32) if routing == "routed" else None
    x, inst = _buffers.put(xh), None if ids is None else _buffers.put(ids, ti.i32)
    model.inference(x, inst)
    with counting() as seen:
        y = model.inference(x, inst)
    assert seen.launches == 2 and set(seen.kernels) == {"_census_kernel", "forward"}, seen.kernels
    assert y.shape == xh.shape[:-1] + (2,)
    y_forward = model.forward(x, inst)[0]
    assert_close(y.to_numpy(), y_forward.to_numpy(), rtol=1e-6, atol_rel=1e-6)
    if precision == "float32":
        with on_path(False):
            host = model.inference(xh, ids)
        assert_close(y.to_numpy(), host, rtol=1e-5, atol_rel=1e-5)
