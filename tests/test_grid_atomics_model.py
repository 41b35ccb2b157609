"""The NumPy model behind ``docs/encodings.md``'s count of the grid's global atomic adds
(``benchmarks/grid_atomics_model.py``): its corners are the spec's, and its counts follow the kernels' rules
on batches small enough to count by hand."""
import os
import sys

import numpy as np
import pytest

from reference import grid_corners, grid_geometry

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import grid_atomics_model as model  # noqa: E402


@pytest.mark.parametrize("D", [2, 3])
def test_the_models_corners_are_the_specs(D):
    x = np.random.default_rng(D).uniform(-0.2, 1.2, (500, D)).astype(np.float32)
    for level in grid_geometry(D, "Hash", 6, 10, 16, 2.0):
        keys = model.corner_keys(x, tuple(level), level.hashed)
        expected = np.stack([idx for idx, _ in grid_corners(x, level, "Linear")], 1)
        np.testing.assert_array_equal(np.sort(keys, 1), np.sort(expected, 1))     # corners in any order


def test_a_run_adds_an_entry_when_its_samples_move_on():
    keys = np.array([[1, 2], [2, 1], [1, 3], [4, 5]], np.uint32)
    # run of 8: sample 0 -> 1 keeps both entries; 1 -> 2 keeps entry 1, adds 2; 2 -> 3 adds 1 and 3; end adds 4, 5
    assert model.run_adds(keys, 8) == 5
    assert model.run_adds(keys, 2) == 2 + 2 + 2 + 0     # runs [0, 1] and [2, 3]: kept 0 -> 1, none 2 -> 3
    assert model.run_adds(keys, 1) == keys.size


def test_a_block_adds_each_entry_it_touched_once():
    B = 3 * model.block.T
    keys = np.zeros((B, 4), np.uint32)
    keys[:, 1] = 7
    keys[model.block.T:, 2] = np.arange(B - model.block.T) % 5      # tiles 1 and 2: entries 0..4
    # three tiles, one per block: tile 0 touches {0, 7}, tiles 1 and 2 {0, 1, 2, 3, 4, 7} each
    assert model.block.n_blocks(B) == 3
    assert model.block_adds(keys, 8) == 2 + 6 + 6
