"""Grid level scales bit-equal to tcnn's: ``log2(b)`` the correctly rounded float32 of the float64 log2
(tcnn's ``std::log2`` of a float), for the ``per_level_scale`` values public clients use."""
import math

import numpy as np
import pytest

import tinn

# torch-ngp / instant-nsr-pl, instant-ngp's 2^(log2(2048/16)/15), tcnn's data configs
SCALES = (1.3819, 1.3195, 1.5, 2.0, 1.447269237440378, 2.0 ** (math.log2(2048 / 16) / 15), 1.26)


def _bits(v) -> int:
    return int(np.float32(v).view(np.uint32))


@pytest.mark.x64_only("host-side level geometry; nothing device-specific")
@pytest.mark.parametrize("b", SCALES)
def test_level_scales_are_tcnns_to_the_bit(b):
    enc = tinn.create_encoding(3, {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2,
                                   "log2_hashmap_size": 10, "base_resolution": 16, "per_level_scale": b})
    log2b = np.float32(math.log2(float(np.float32(b))))            # float64 log2, rounded once
    for l, level in enumerate(enc.levels):
        step = np.float32(np.float32(l) * log2b)
        want = np.float32(np.float32(2.0 ** float(step)) * np.float32(16)) - np.float32(1)
        assert _bits(level[0]) == _bits(want), (b, l, level[0], want)


@pytest.mark.x64_only("host-side level geometry; nothing device-specific")
def test_finest_level_of_torch_ngps_grid_is_tcnns_figure():
    enc = tinn.create_encoding(3, {"otype": "HashGrid", "n_levels": 16, "log2_hashmap_size": 10,
                                   "base_resolution": 16, "per_level_scale": 1.3819})
    assert enc.levels[15][0] == np.float32(2046.71228)           # tcnn's scale at level 15 (issue 25)
