"""Multiresolution grid encodings (tcnn ``encodings/grid.h``): ``HashGrid``, ``DenseGrid``, ``TiledGrid``, ``Grid``.

Keys (defaults): ``type`` ("Hash"; "Dense" for DenseGrid, "Tiled" for TiledGrid),
``n_levels`` L (16) or ``n_features`` (= L * F), ``n_features_per_level`` F (2; 1, 2, 4 or 8),
``log2_hashmap_size`` (19), ``base_resolution`` N_min (16), ``per_level_scale`` b (2.0;
Dense: (256 / N_min)^(1 / (L - 1))), ``interpolation`` ("Linear", "Nearest", "Smoothstep"),
``hash`` ("CoherentPrime").

Level l, computed in float32 as tcnn does::

    scale_l = exp2(l * log2(b)) * N_min - 1,   res_l = ceil(scale_l) + 1
    entries_l = min(next_multiple(res_l^D, 8), 2^log2_hashmap_size)      (Hash)
    pos = scale_l * x + 0.5,  p = floor(pos),  t = pos - p
    y_{l,f} = sum over corners c of  prod_d (c_d ? w(t_d) : 1 - w(t_d)) * theta_l[index(p + c)]_f

with ``w(t) = t`` (Linear) or ``t^2 (3 - 2t)`` (Smoothstep). A level is indexed densely
(``sum_d p_d res^d``) unless it is a Hash level too large for its table, which then uses
tcnn's coherent prime hash ``XOR_d p_d * pi_d``; the index is taken modulo ``entries_l``.
Parameters: level after level, F features per entry, uniform in [-1e-4, 1e-4].
The backward pass on the CPU scatters ``weight * dL/dy`` into per-thread private gradient tables
(no atomics) and reduces them in thread order: bit-identical results for the same data and thread
count. Those tables take threads x instances x n_params floats, so they are used only while that
stays within ``SCRATCH_BUDGET_BYTES`` (n_params rounded up to a power of two where that fits too, so that grids of
other sizes share the tables and their kernels); beyond it each level's gradients are owned by one thread,
which adds the whole batch into them in sample order (no tables, no atomics; up to L threads busy;
bit-identical whatever the thread count). Other archs add atomically: levels whose table fits a block's
shared memory are summed per block first (``_grid_block.py``), the others level after level, a thread summing
the corners its consecutive samples share before adding them (``_grid_kernels.RUN``; the second order adds
per sample). The input gradient is analytic,
and so is the second order (``backward_backward_input``, tcnn's non-JIT formulas): for
``L2 = sum_b <G_b, dL/dx_b>`` and a corner c of level l with slopes
``s_{c,d} = d weight_c / dx_d = ±scale_l w'_d prod_{d' != d}(...)``::

    dL2/d(dL/dy_{l,f}) = sum_c theta_c,f  sum_d G_d s_{c,d}
    dL2/dtheta_c,f    += dL/dy_{l,f}      sum_d G_d s_{c,d}
    dL2/dx_e           = sum_c (sum_f dL/dy_{l,f} theta_c,f) sum_d G_d ds_{c,d}/dx_e

with ``ds_{c,d}/dx_d = ±scale_l^2 w''_d prod_{d' != d}(...)`` (0 unless Smoothstep) and, for e != d,
``±±scale_l^2 w'_d w'_e prod_{d' != d, e}(...)``. Nearest has no second-order terms.
Any float input is defined: tcnn's unsigned 32-bit index arithmetic wherever scale_l * x + 0.5 fits
in int32, a position clamped to that range beyond it; NaN reads as 0 and |x| > 2^64 (infinities too) as
+-2^64, decided on the bits before any float math; every read and write stays in the level's table.
"""

import dataclasses
import math

import numpy as np
import taichi as ti

from ..keys import OFF, POSITIVE_INT, Key, Options, above, between, one_of, reported
from ..object import Context
from ..registry import encodings
from ..runtime.program import is_cpu
from ._grid_funcs import DENSE, HASHED, MODULO, OFFSET_MASK, level_funcs
from ._grid_kernels import grid_kernels
from ._grid_tables import scratch_capacity
from .encoding import Encoding, next_multiple

MAX_BASE = {1: 0xFFFFFFFF, 2: 0xFFFF, 3: 0x659, 4: 0xFF}   # largest res with res^D < 2^32
GRID_TYPES = ("Hash", "Dense", "Tiled")
INTERPOLATIONS = ("Nearest", "Linear", "Smoothstep")
SCRATCH_BUDGET_BYTES = 256 << 20        # largest size of one grid's private gradient tables (all threads)



def level_geometry(n_dims, grid_type, n_levels, log2_hashmap_size, base_resolution, per_level_scale):
    """Per level: (scale float32, resolution, entries, entry offset, hashed) exactly as tcnn.

    ``log2(b)`` and ``exp2`` are the correctly rounded float32 of their float64 values (tcnn's ``std::log2``
    of a float; numpy's float32 ``log2`` / ``exp2`` may be an ulp off, depending on the CPU's SIMD path)."""
    f32, f64 = np.float32, np.float64
    log2b = f32(np.log2(f64(f32(per_level_scale))))
    levels, offset = [], 0
    for l in range(n_levels):
        scale = f32(f32(np.exp2(f64(f32(l) * log2b))) * f32(base_resolution) - f32(1))
        res = int(math.ceil(float(scale))) + 1
        dense = res ** n_dims
        entries = next_multiple(min(dense, (2 ** 32 - 1) // 2), 8)
        if grid_type == "Tiled":
            entries = min(entries, base_resolution ** n_dims)
        elif grid_type == "Hash":
            entries = min(entries, 1 << log2_hashmap_size)
        stride = dense if res <= MAX_BASE[n_dims] else 0xFFFFFFFF
        hashed = grid_type == "Hash" and entries < stride
        levels.append((scale, res, entries, offset, hashed))
        offset += entries
    return levels, offset


class TableEncoding(Encoding):
    """An encoding whose features per level interpolate rows of a parameter table (``levels``: scale, res,
    entries, entry offset, hashed), run by the grid's kernels (``_grid_kernels.py``) with the per-level
    funcs ``level_funcs`` of the subclass; ``n_params`` and ``interpolation`` are set by the subclass, and
    ``index_modes``, the index modes its levels may take in level order (grids of any geometry of those modes
    share their kernels)."""
    fill_value = 0.0
    level_funcs = staticmethod(level_funcs)
    index_modes = ()

    def __init__(self, n_input_dims, n_levels, n_features_per_level, *, n_instances, seed):
        self.required_output_alignment = n_features_per_level
        super().__init__(n_input_dims, n_levels * n_features_per_level, n_instances=n_instances, seed=seed)
        self._kernels = {}

    def initial_params(self, rng):
        return (rng.uniform_fill(self.n_params) * np.float32(2) - np.float32(1)) * np.float32(1e-4)

    # -- batch API ---------------------------------------------------------------
    def _encode(self, weights, x, batch):
        y = batch.ops.empty_like(x, (x.shape[0], self.padded_output_width))     # on the device for a device x
        ids, routed = batch.kernel_ids()
        self._get_kernels(batch).forward(weights, self._offset, x, ids, y, routed)
        return y

    def _inference(self, x, batch):
        return self._encode(self.store.inference_params, x, batch)

    def _features_into(self, batch):
        return self._get_kernels(batch).features_into

    def _forward(self, x, batch):
        return self._encode(self.store.params, x, batch), Context(self, x, batch)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        dL_dy = self._scatter_gradients(ctx, dL_dy, overwrite)[1]
        return self._input_gradient(ctx, dL_dy) if input_gradient else None

    def _input_gradient(self, ctx, dL_dy):
        ops = ctx.batch.ops
        inst, routed = ctx.batch.kernel_ids()
        dx = ops.empty_like(ctx.x)
        self._get_kernels(ctx.batch).backward_input(self.store.params, self._offset, ctx.x, inst,
                                                    ops.contiguous(dL_dy), dx, routed)
        return dx

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        """tcnn's exact second order (every interpolation and dimension): dL2/dθ to the gradients, and
        ``(dL2/d(dL_dy), dL2/dx)``; padded columns of the first are 0, Nearest gives 0 throughout."""
        ops = ctx.batch.ops
        dL_ddLdx = ops.contiguous(dL_ddLdx)
        k, dL_dy, inst, routed = self._scatter_gradients(ctx, dL_dy, overwrite, dL_ddLdx)
        d_dy = ops.empty_like(ctx.x, (ctx.x.shape[0], self.padded_output_width))
        dx = ops.empty_like(ctx.x)
        k.backward_backward(self.store.params, self._offset, ctx.x, inst, dL_ddLdx, dL_dy, d_dy, dx, routed)
        return d_dy, dx

    def _scatter_gradients(self, ctx, dL_dy, overwrite, dL_ddLdx=None):
        """Add (write if ``overwrite``) dL/dθ, or dL2/dθ given ``dL_ddLdx``; the kernels, the contiguous dL_dy
        and the batch's ids for a per-sample kernel that follows."""
        k = self._get_kernels(ctx.batch)
        dL_dy = ctx.batch.ops.contiguous(dL_dy)
        inst, routed = ctx.batch.kernel_ids()
        k.backward_params(self.store.grads, self._offset, ctx.x, inst, dL_dy, routed, overwrite, dL_ddLdx)
        return k, dL_dy, inst, routed

    def _get_kernels(self, batch=None):
        """The kernels of this config, shared with every grid of the same config (fields and the column
        offset are arguments). Whether the batch's values were checked on the host is part of the config: a
        host ``batch``'s were; a device batch's are checked by kernels, so its grid kernels take any input.
        The per-sample funcs (no ``batch``) take any input too: whichever variant is built serves them."""
        if batch is None:
            checked = next(iter(self._kernels), True)
        else:
            checked = not batch.on_device
        if checked not in self._kernels:
            self._kernels[checked] = self._build_kernels(checked)
        return self._kernels[checked]

    def _build_kernels(self, checked: bool):
        """The config's kernels; on the CPU the backward adds into private per-worker gradient tables where
        they fit ``SCRATCH_BUDGET_BYTES``."""
        if self._offset + self.n_params > OFFSET_MASK + 1:
            raise ValueError(f"{type(self).__name__}: {self.n_params} parameters at column {self._offset} of the store: "
                             f"the grid kernels address fewer than 2^30 columns")
        cpu = is_cpu()
        n_workers = max(1, ti.lang.impl.current_cfg().cpu_max_num_threads) if cpu else 1
        tables = n_workers * self.n_instances * 4           # bytes of the private tables per column
        capacity = scratch_capacity(self.n_params)          # shared by grids of other sizes, if in budget
        capacity = capacity if capacity * tables <= SCRATCH_BUDGET_BYTES else self.n_params
        private = cpu and capacity * tables <= SCRATCH_BUDGET_BYTES
        return grid_kernels(self.n_input_dims, self.n_features_per_level, self.n_params, self.padded_output_width,
                            self.interpolation, tuple(self.levels), capacity if private else 0, checked,
                            self.level_funcs, self.index_modes)

    def set_padded_output_width(self, width):
        super().set_padded_output_width(width)
        self._kernels = {}

    def _sample_funcs(self, weights, grads):
        return self._get_kernels().sample_funcs(weights, grads, self._offset)


@encodings.register("HashGrid", "Grid", "DenseGrid", "TiledGrid")
class GridEncoding(TableEncoding):
    hash = "CoherentPrime"
    KEYS = {
        "type": Key("Hash", choices=GRID_TYPES + ("Tile",), doc="DenseGrid: Dense, TiledGrid: Tiled"),
        "n_levels": Key(16, between(1, 128), "L, resolution levels"),
        "n_features_per_level": Key(2, one_of(1, 2, 4, 8), "F, features per level"),
        "log2_hashmap_size": Key(19, between(1, 30), "log2 of a Hash level's most entries"),
        "base_resolution": Key(16, POSITIVE_INT, "N_min, the coarsest level's resolution"),
        "per_level_scale": Key(2.0, above(0), "b, resolution factor between levels; "
                                              "Dense: (256 / N_min)^(1 / (L - 1))"),
        "interpolation": Key("Linear", choices=INTERPOLATIONS, doc="Nearest, Linear or Smoothstep"),
        "hash": Key("CoherentPrime", choices=("CoherentPrime",), doc="the spatial hash"),
        "n_features": Key(32, POSITIVE_INT, "L * F, instead of n_levels", report=False),
        "n_grid_features": Key(32, POSITIVE_INT, "alias of n_features", report=False),
        "fixed_point_pos": Key(False, OFF, "tcnn's JIT-only mode", report=False),
        "stochastic_interpolation": Key(False, OFF, report=False),
    }

    def __init__(self, n_input_dims: int, *, type: str = "Hash", n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, per_level_scale: float = 2.0,
                 interpolation: str = "Linear", n_instances: int = 1, seed: int = 1337):
        if not 1 <= n_input_dims <= 4:
            raise ValueError(f"grid encodings take 1 to 4 input dims, got {n_input_dims}")
        self.type, self.n_levels, self.n_features_per_level = type, n_levels, n_features_per_level
        self.log2_hashmap_size, self.base_resolution = log2_hashmap_size, base_resolution
        self.per_level_scale, self.interpolation = float(per_level_scale), interpolation
        self.levels, n_entries = level_geometry(n_input_dims, type, n_levels, log2_hashmap_size,
                                                base_resolution, per_level_scale)
        shrunk = [l for l, level in enumerate(self.levels) if not level[0] >= 0]
        if shrunk:          # a scale below 0 leaves a level less than one cell (resolution 1, or 0 in float32)
            raise ValueError(f"{type}Grid: key 'per_level_scale' {per_level_scale!r} with base_resolution "
                             f"{base_resolution} shrinks level {shrunk[0]} below one cell: every level's "
                             f"base_resolution * per_level_scale^level must be at least 1 (levels 0 to {n_levels - 1})")
        self.n_params = n_entries * n_features_per_level
        self.index_modes = (DENSE, HASHED) if type == "Hash" else (DENSE, MODULO)   # coarse levels dense
        super().__init__(n_input_dims, n_levels, n_features_per_level, n_instances=n_instances, seed=seed)

    @classmethod
    def from_config(cls, n_input_dims, config, *, otype="HashGrid", **kwargs):
        opt, keys = Options("encoding", otype, config), cls.KEYS
        default_type = {"densegrid": "Dense", "tiledgrid": "Tiled"}.get(otype.lower(), "Hash")
        grid_type = opt.get("type", dataclasses.replace(keys["type"], default=default_type))
        grid_type = "Tiled" if grid_type == "Tile" else grid_type
        F = opt.get("n_features_per_level", keys["n_features_per_level"])
        if opt.has("n_levels") and (opt.has("n_features") or opt.has("n_grid_features")):
            raise ValueError(f"{opt.where}: give either 'n_levels' or 'n_features', not both")
        key = "n_features" if opt.has("n_features") else "n_grid_features"
        if opt.has(key):
            n_features = opt.get(key, keys[key])
            if n_features % F:
                raise ValueError(f"{opt.where}: key '{key}' must be a multiple of n_features_per_level ({F}); "
                                 f"got {n_features!r}")
            n_levels = n_features // F
            if not keys["n_levels"].rule(n_levels):
                raise ValueError(f"{opt.where}: key '{key}' gives {n_levels} levels; n_levels "
                                 f"{keys['n_levels'].rule.text}")
        else:
            n_levels = opt.get("n_levels", keys["n_levels"])
        base = opt.get("base_resolution", keys["base_resolution"])
        dense_scale = math.exp(math.log(256 / base) / (n_levels - 1)) if n_levels > 1 else 1.0
        scale = opt.get("per_level_scale", dataclasses.replace(keys["per_level_scale"],
                                                               default=dense_scale if grid_type == "Dense" else 2.0))
        if math.log2(base) + (n_levels - 1) * math.log2(scale) >= 32:      # tcnn's resolutions are uint32
            raise ValueError(f"{opt.where}: key 'per_level_scale' {scale!r} makes the finest level's resolution "
                             f"base_resolution * per_level_scale^(n_levels - 1) reach 2^32")
        values = opt.read({k: v for k, v in keys.items() if k in ("log2_hashmap_size", "interpolation", "hash",
                                                                   "fixed_point_pos", "stochastic_interpolation")})
        opt.done()
        return cls(n_input_dims, type=grid_type, n_levels=n_levels, n_features_per_level=F, base_resolution=base,
                   per_level_scale=scale, log2_hashmap_size=values["log2_hashmap_size"],
                   interpolation=values["interpolation"], **kwargs)

    def hyperparams(self):
        return {"otype": "Grid", **reported(self, self.KEYS)}


