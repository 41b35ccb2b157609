"""The permutohedral lattice encoding of PermutoSDF (Rosu & Behnke 2023; Dr.Jit's ``PermutoEncoding``).

Keys (defaults), HashGrid's: ``n_levels`` L (16), ``n_features_per_level`` F (2; 1, 2, 4 or 8),
``log2_hashmap_size`` (19), ``base_resolution`` N_min (16), ``per_level_scale`` b (2.0). Any number of
input dims D from 1 to 8.

Level l has the scale ``scale_l = exp2(l log2 b) N_min`` (float32) and a hashed table of
``T = 2^log2_hashmap_size`` entries of F features (every level hashed, ``L F T`` parameters, level after
level, uniform in [-1e-4, 1e-4]). A point x is embedded into the permutohedral lattice A*_D of level l,
the simplex enclosing it is found by sorting, and its D + 1 vertices are hashed (the steps and the
derivatives: ``_permuto_funcs.py``)::

    y_{l,f} = sum_{r=0..D} b_r(x) theta_l[hash(v_r(x)) mod T]_f

with barycentric weights ``b_r`` (>= 0, summing to 1): D + 1 lookups per level where a grid takes 2^D.
The weights are linear in x inside a simplex: dL/dθ scatters ``b_r dL/dy``, dL/dx is
``sum_r (dL/dy . theta_r) db_r/dx``, and in the second order (``backward_backward_input``, as the grid's)
``dL2/d(dL/dy_{l,f}) = sum_r theta_r,f G . db_r/dx``, ``dL2/dθ_r += dL/dy G . db_r/dx`` and
``dL2/dx = 0``. A simplex edge is about ``sqrt(D) / scale_l`` long in x. The batch kernels, the
per-sample funcs and the device path are the grid's (``_grid_kernels.py``, without its per-block sums).
"""
import dataclasses
import math

import numpy as np

from ..registry import encodings
from . import _permuto_funcs
from .grid import GridEncoding, TableEncoding


@encodings.register("Permutohedral")
class PermutohedralEncoding(TableEncoding):
    interpolation = "Linear"
    level_funcs = staticmethod(_permuto_funcs.level_funcs)
    KEYS = {
        **{k: GridEncoding.KEYS[k] for k in ("n_levels", "n_features_per_level", "log2_hashmap_size",
                                               "base_resolution")},
        "per_level_scale": dataclasses.replace(GridEncoding.KEYS["per_level_scale"],
                                               doc="b, lattice scale factor between levels"),
    }

    def __init__(self, n_input_dims: int, *, n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, per_level_scale: float = 2.0,
                 n_instances: int = 1, seed: int = 1337):
        if not 1 <= n_input_dims <= _permuto_funcs.MAX_DIMS:
            raise ValueError(f"the permutohedral encoding takes 1 to {_permuto_funcs.MAX_DIMS} input dims, "
                             f"got {n_input_dims}")
        if math.log2(base_resolution) + (n_levels - 1) * math.log2(per_level_scale) >= 32:
            raise ValueError(f"Permutohedral: per_level_scale {per_level_scale!r} makes the finest level's scale "
                             f"base_resolution * per_level_scale^(n_levels - 1) reach 2^32")
        self.n_levels, self.n_features_per_level = n_levels, n_features_per_level
        self.log2_hashmap_size, self.base_resolution = log2_hashmap_size, base_resolution
        self.per_level_scale = float(per_level_scale)
        self.levels = level_geometry(n_levels, log2_hashmap_size, base_resolution, per_level_scale)
        self.n_params = n_levels * (1 << log2_hashmap_size) * n_features_per_level
        super().__init__(n_input_dims, n_levels, n_features_per_level, n_instances=n_instances, seed=seed)


def level_geometry(n_levels, log2_hashmap_size, base_resolution, per_level_scale):
    """Per level: (scale float32, 0, entries, entry offset, hashed), the rows the grid kernels read."""
    f32, size = np.float32, 1 << log2_hashmap_size
    log2b = np.log2(f32(per_level_scale))
    return tuple((f32(np.exp2(f32(l) * log2b) * f32(base_resolution)), 0, size, l * size, True)
                 for l in range(n_levels))
