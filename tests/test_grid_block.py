"""The grid's parameter gradients off the CPU (CUDA, Vulkan): the levels of small tables are summed per
block in shared memory (``tinn/encodings/_grid_block.py``), the others in runs of consecutive samples that sum
the corners they share (first order) or per sample (second order); first and second order, overwrite and
accumulate, routed or not, against the NumPy reference. (The CPU sums per thread:
``tests/test_grid_backward.py``.)"""
from collections import namedtuple

import numpy as np
import pytest
import taichi as ti
from taichi.lang import impl

import tinn
from tinn.encodings import _grid_block
from reference import assert_close, grid_geometry, grid_param_grad_ref, grid_second_order_param_grad_ref

Case = namedtuple("Case", "D type interpolation F base L log2_T B lo hi block_levels")
CASES = {
    # level 0 (16^3 entries, F = 1) fits a block, levels 1 and 2 do not
    "3d-hash-mixed": Case(3, "Hash", "Linear", 1, 16, 3, 19, 3000, 0.0, 1.0, 1),
    # more samples than MAX_BLOCKS tiles: a block takes two tiles; inputs beyond [0, 1) wrap
    "2d-hash-two-tiles": Case(2, "Hash", "Smoothstep", 2, 4, 4, 12, 40000, -0.2, 1.2, 4),
    # every sample of a tile on one entry: T rounds per tile
    "2d-dense-nearest-crowded": Case(2, "Dense", "Nearest", 4, 4, 3, 19, 1000, 0.40, 0.41, 3),
    "1d-tiled-f8": Case(1, "Tiled", "Linear", 8, 64, 2, 19, 700, -1.0, 2.0, 2),
}

off_cpu = pytest.mark.skipif(impl.current_cfg().arch in (ti.x64, ti.arm64),
                                reason="off the CPU only: the CPU sums per thread")


def setup(name):
    c = CASES[name]
    cfg = {"otype": "Grid", "type": c.type, "n_levels": c.L, "n_features_per_level": c.F, "base_resolution": c.base,
           "per_level_scale": 2.0, "interpolation": c.interpolation, "log2_hashmap_size": c.log2_T}
    enc = tinn.create_encoding(c.D, cfg)
    assert enc._get_kernels().block_levels == c.block_levels
    rng = np.random.default_rng(len(name))
    enc.set_params(rng.uniform(-1, 1, enc.n_params).astype(np.float32))
    x = rng.uniform(c.lo, c.hi, (c.B, c.D)).astype(np.float32)
    dy = rng.normal(size=(c.B, enc.n_output_dims)).astype(np.float32)
    return c, enc, grid_geometry(c.D, c.type, c.L, c.log2_T, c.base, 2.0), x, dy


@off_cpu
@pytest.mark.parametrize("name", list(CASES))
def test_block_sums_match_the_reference(name):
    c, enc, levels, x, dy = setup(name)
    ref = grid_param_grad_ref(x, dy, levels, c.F, c.interpolation, enc.n_params)
    _, ctx = enc.forward(x)
    enc.backward(ctx, dy, input_gradient=False)
    assert_close(enc.gradients(), ref, rtol=1e-4, atol_rel=1e-5)
    enc.backward(ctx, dy, input_gradient=False, mode="accumulate")
    assert_close(enc.gradients(), 2 * ref, rtol=1e-4, atol_rel=1e-5)


@off_cpu
@pytest.mark.parametrize("name", ["3d-hash-mixed", "2d-hash-two-tiles"])
def test_block_sums_of_the_second_order_match_the_reference(name):
    c, enc, levels, x, dy = setup(name)
    G = np.random.default_rng(7).normal(size=x.shape).astype(np.float32)
    ref = grid_second_order_param_grad_ref(x, G, dy, levels, c.F, c.interpolation, enc.n_params)
    _, ctx = enc.forward(x)
    enc.backward_backward_input(ctx, G, dy)
    assert_close(enc.gradients(), ref, rtol=1e-4, atol_rel=1e-5)


def test_block_budget():
    """A level fits while its sums, half-word claim counters and the round count take the arch's shared
    memory budget (CUDA 48 KiB, else 32 KiB)."""
    assert _grid_block.shared_words(4096, 2) == 4096 * 2 + 2048 + 1
    cuda = impl.current_cfg().arch == ti.cuda
    assert _grid_block.fits(4096, 1) and _grid_block.fits(4096, 2) == cuda and not _grid_block.fits(4096, 3)
    assert _grid_block.n_blocks(1) == 1 and _grid_block.n_blocks(10 ** 7) == _grid_block.MAX_BLOCKS


def raster(side, D):
    """The centres of a side^D grid of cells in raster order: neighbours in the batch are neighbours in space."""
    axes = np.meshgrid(*[(np.arange(side) + 0.5) / side] * D, indexing="ij")[::-1]
    return np.stack(axes, -1).reshape(-1, D).astype(np.float32)


@off_cpu
@pytest.mark.parametrize("D, interpolation, F, K", [(2, "Linear", 2, 1), (3, "Smoothstep", 1, 1),
                                                     (2, "Linear", 2, 3), (1, "Nearest", 4, 2)])
def test_runs_of_samples_sharing_corners_match_the_reference(D, interpolation, F, K):
    """The levels added by runs of consecutive samples (``run_scatter``): inputs in raster order, so that a
    thread's samples share corners and sum them in registers, and repeated samples (a run entirely on the
    same entries); with K networks, a run whose samples change network mid-way."""
    side = {1: 300, 2: 24, 3: 9}[D]
    x = np.concatenate([raster(side, D), np.repeat(raster(3, D), 5, axis=0)])
    B = len(x)
    base = {1: 1024, 2: 16, 3: 16}[D]
    cfg = {"otype": "Grid", "type": "Hash", "n_levels": 4, "n_features_per_level": F, "base_resolution": base,
           "per_level_scale": 2.0, "interpolation": interpolation, "log2_hashmap_size": 14}
    enc = tinn.create_encoding(D, cfg, n_instances=K)
    assert enc._get_kernels().block_levels < 4             # some levels (all if routed) added in runs
    levels = grid_geometry(D, "Hash", 4, 14, base, 2.0)
    rng = np.random.default_rng(D + K)
    enc.set_params(rng.uniform(-1, 1, (K, enc.n_params)).astype(np.float32)[0 if K == 1 else slice(None)])
    dy = rng.normal(size=(B, enc.n_output_dims)).astype(np.float32)
    inst = None if K == 1 else np.minimum(np.arange(B) * K // B + (np.arange(B) % 11 == 0), K - 1).astype(np.int32)
    if inst is None:
        ref = grid_param_grad_ref(x, dy, levels, F, interpolation, enc.n_params)
    else:
        ref = np.stack([grid_param_grad_ref(x[inst == k], dy[inst == k], levels, F, interpolation, enc.n_params)
                        for k in range(K)])
    _, ctx = enc.forward(x, inst)
    enc.backward(ctx, dy, input_gradient=False)
    assert_close(enc.gradients(), ref, rtol=1e-4, atol_rel=1e-5)
    enc.backward(ctx, dy, input_gradient=False, mode="accumulate")
    assert_close(enc.gradients(), 2 * ref, rtol=1e-4, atol_rel=1e-5)


@off_cpu
def test_every_sample_on_the_same_corners():
    """A batch of one point repeated: every level's every add lands on the same 2^D entries, on the levels
    summed per block (rounds of claims) and on those summed in runs; the gradient is B times one sample's."""
    B = 5000
    cfg = {"otype": "HashGrid", "n_levels": 6, "n_features_per_level": 2, "base_resolution": 16,
           "per_level_scale": 2.0, "log2_hashmap_size": 14}
    enc = tinn.create_encoding(2, cfg)
    assert 0 < enc._get_kernels().block_levels < 6
    levels = grid_geometry(2, "Hash", 6, 14, 16, 2.0)
    x = np.tile(np.float32([[0.3141, 0.2718]]), (B, 1))
    dy = np.tile(np.random.default_rng(3).normal(size=(1, 12)).astype(np.float32), (B, 1))
    ref = B * grid_param_grad_ref(x[:1], dy[:1], levels, 2, "Linear", enc.n_params)
    _, ctx = enc.forward(x)
    enc.backward(ctx, dy, input_gradient=False)
    assert_close(enc.gradients(), ref, rtol=1e-4, atol_rel=1e-5)
