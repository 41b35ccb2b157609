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
stays within ``SCRATCH_BUDGET_BYTES``; beyond it each level's gradients are owned by one thread,
which adds the whole batch into them in sample order (no tables, no atomics; up to L threads busy;
bit-identical whatever the thread count). Other archs add atomically. The input gradient is analytic.
"""

import dataclasses
import math

import numpy as np
import taichi as ti

from .. import _device
from .._kernels import F32_2D, I32_1D, specialised
from .._runtime import FieldTree, is_cpu
from ..registry import encodings
from ..keys import OFF, POSITIVE_INT, Key, Options, above, between, one_of, reported
from ..object import Context
from .encoding import Encoding, next_multiple

PRIMES = (1, 2654435761, 805459861, 3674653429)
MAX_BASE = {1: 0xFFFFFFFF, 2: 0xFFFF, 3: 0x659, 4: 0xFF}   # largest res with res^D < 2^32
GRID_TYPES = ("Hash", "Dense", "Tiled")
HASHED, DENSE, MODULO = 0, 1, 2          # how a level reduces its vertex index to a table entry
# Taichi 1.7's CPU backend hands a parallel range to its threads in chunks of 512 iterations (a
# shorter range runs on one thread, whatever ti.loop_config says), so per-thread work is spread
# one iteration per chunk.
CPU_CHUNK = 512
INTERPOLATIONS = ("Nearest", "Linear", "Smoothstep")
SCRATCH_BUDGET_BYTES = 256 << 20        # largest size of one grid's private gradient tables (all threads)
INT32_MIN_F32, INT32_MAX_F32 = -2.0 ** 31, 2.0 ** 31 - 128     # the float32 values at the ends of the int32 range



def level_geometry(n_dims, grid_type, n_levels, log2_hashmap_size, base_resolution, per_level_scale):
    """Per level: (scale float32, resolution, entries, entry offset, hashed) exactly as tcnn."""
    f32 = np.float32
    log2b = np.log2(f32(per_level_scale))
    levels, offset = [], 0
    for l in range(n_levels):
        scale = f32(np.exp2(f32(l) * log2b) * f32(base_resolution) - f32(1))
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


@encodings.register("HashGrid", "Grid", "DenseGrid", "TiledGrid")
class GridEncoding(Encoding):
    fill_value = 0.0
    device_batches = True                   # takes ti.ndarray batches and answers in kind (tinn._device)
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
        self.n_params = n_entries * n_features_per_level
        self.required_output_alignment = n_features_per_level
        super().__init__(n_input_dims, n_levels * n_features_per_level, n_instances=n_instances, seed=seed)
        self._kernels = None

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

    def initial_params(self, rng):
        return (rng.uniform_fill(self.n_params) * np.float32(2) - np.float32(1)) * np.float32(1e-4)

    # -- batch API ---------------------------------------------------------------
    def _encode(self, weights, x, instance):
        y = _device.empty_like(x, (x.shape[0], self.padded_output_width))     # on the device for a device x
        self._get_kernels().forward(weights, self._offset, x, _routing(instance), y, instance is not None)
        return y

    def _inference(self, x, routing):
        return self._encode(self.store.inference_params, x, routing.instance)

    def _forward(self, x, routing):
        return self._encode(self.store.params, x, routing.instance), Context(self, x, routing)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        k = self._get_kernels()
        if overwrite and not k.cpu:                 # atomic adds need zeros underneath
            self._zero_gradients()
            overwrite = False
        dL_dy = dL_dy if _device.is_device(dL_dy) else np.ascontiguousarray(dL_dy)
        instance = ctx.routing.instance
        k.backward_params(self.store.grads, self._offset, ctx.x, _routing(instance), dL_dy, instance is not None,
                          overwrite)
        if not input_gradient:
            return None
        dx = _device.empty_like(ctx.x)
        k.backward_input(self.store.params, self._offset, ctx.x, _routing(instance), dL_dy, dx, instance is not None)
        return dx

    def _get_kernels(self):
        """The kernels of this config, shared with every grid of the same config (fields and the column
        offset are arguments)."""
        if self._kernels is None:
            self.store                          # bind before the first kernel call
            cpu = is_cpu()
            n_workers = max(1, ti.lang.impl.current_cfg().cpu_max_num_threads) if cpu else 1
            private = cpu and n_workers * self.n_instances * self.n_params * 4 <= SCRATCH_BUDGET_BYTES
            self._kernels = _grid_kernels(self.n_input_dims, self.n_features_per_level, self.n_instances,
                                          self.n_params, self.n_raw_output_dims, self.padded_output_width,
                                          self.interpolation, tuple(self.levels), private)
        return self._kernels

    def set_padded_output_width(self, width):
        super().set_padded_output_width(width)
        self._kernels = None

    def _sample_funcs(self, weights, grads):
        return self._get_kernels().sample_funcs(weights, grads, self._offset)


def _routing(instance):
    return instance if instance is not None else np.zeros(1, np.int32)


@specialised
def _grid_kernels(*constants):
    return _GridKernels(*constants)


@specialised
def _tables(levels: tuple, scratch_shape):
    """The table of the levels' geometry (scale, resolution, table size, entry offset) and, on the CPU,
    the workers' private gradient tables ``scratch_shape``: one field tree shared by every grid of one
    config, not one per model (Taichi allows 512 trees). Sharing the scratch is safe: a backward pass
    leaves it zeroed."""
    geometry = ti.types.struct(scale=ti.f32, res=ti.u32, size=ti.u32, offset=ti.u32).field()
    scratch = ti.field(ti.f32) if scratch_shape else None

    def place(builder):
        builder.dense(ti.i, len(levels)).place(geometry)
        if scratch_shape:
            builder.dense(ti.ijk, scratch_shape).place(scratch)

    tree = FieldTree(place, "grid encoding tables")
    for l, (scale, res, size, offset) in enumerate(levels):
        geometry[l] = dict(scale=scale, res=res, size=size, offset=offset)
    return tree, geometry, scratch


class _GridKernels:
    """The grid's Taichi kernels, specialised to one config and shared by every grid of that config:
    the parameter fields are template arguments and the encoding's column offset ``base`` a runtime one.

    Levels are a loop at run time over a small table of their geometry (scale, resolution,
    table size, entry offset), so that a kernel holds one level's code rather than L copies:
    Taichi re-parses the Python of every kernel at start-up, even on an offline-cache hit.
    A level's index mode stays a compile-time constant; consecutive levels sharing it form a
    run with a loop of its own (a Hash grid has two: its dense coarse levels, then hashed ones).

    The batch kernels go level by level: on the CPU each thread takes a contiguous share of
    the batch and runs through it once per level, so that the level's table stays in the
    core's cache (elsewhere a parallel iteration is one sample, all its levels in turn).
    """

    def __init__(self, D: int, F: int, K: int, n: int, raw: int, width: int, interp: str, levels: tuple,
                 private: bool):
        L = len(levels)
        cpu = is_cpu()
        n_workers = max(1, ti.lang.impl.current_cfg().cpu_max_num_threads) if cpu else 1

        runs = []                                           # (index mode, first level, last level + 1)
        for l, (scale, res, entries, offset, hashed) in enumerate(levels):
            mode = HASHED if hashed else DENSE if res ** D <= entries else MODULO
            if runs and runs[-1][0] == mode:
                runs[-1] = (mode, runs[-1][1], l + 1)
            else:
                runs.append((mode, l, l + 1))
        # Table indices and offsets are below the encoding's entry count: masking them with the power of
        # two above it changes nothing, but shows LLVM that they are small and non-negative, so that it
        # folds them into the load addresses, as it did the constants of unrolled levels (~15% of a forward).
        entry_mask = (1 << (n // F - 1).bit_length()) - 1

        self._tables = _tables(tuple((float(scale), res % 2 ** 32, entries, offset)
                                     for scale, res, entries, offset, _ in levels),
                               (n_workers, K, n) if private else None)
        geometry, scratch = self._tables[1:]

        @ti.func
        def grid_index(lv, mode: ti.template(), p):
            """tcnn's index of vertex p modulo the level's table size, with a division only where needed:
            hashed  (XOR_d p_d pi_d) & (size - 1)     (hashed tables are powers of two);
            dense   p_0 + res (p_1 + res (p_2 + res p_3)), wrapping in u32 like tcnn's sum_d p_d res^d,
                    then mod size (DENSE: only when beyond the table, which inputs in [0, 1) rarely are).
            Any u32 p gives an index inside the level's table. (No ``u32 -= ...``: SPIR-V cannot negate it.)"""
            idx = ti.u32(0)
            if ti.static(mode == HASHED):
                for d in ti.static(range(D)):
                    idx = idx ^ (p[d] * ti.u32(PRIMES[d]))
                idx = idx & (lv.size - 1)
            else:
                for d in ti.static(range(D - 1, -1, -1)):
                    idx = idx * lv.res + p[d]
                if ti.static(mode == DENSE):
                    if idx >= lv.size:
                        idx = idx % lv.size
                else:
                    idx = idx % lv.size
            return idx

        @ti.func
        def locate(xs, lv):
            """Lower corner p (u32), interpolation weights w and their slopes dw of point xs (any finite xs)."""
            # tcnn casts floor(pos) to int, then to uint32; clamping pos to the int32 range first keeps that
            # cast defined and t finite for any input (x * scale may overflow to inf), without changing a
            # position that fits
            pos = ti.min(ti.max(xs * lv.scale + 0.5, INT32_MIN_F32), INT32_MAX_F32)
            pf = ti.floor(pos)
            t = pos - pf
            w, dw = t, ti.Vector.one(ti.f32, D)
            if ti.static(interp == "Smoothstep"):
                w, dw = t * t * (3.0 - 2.0 * t), 6.0 * t * (1.0 - t)
            return ti.cast(ti.cast(pf, ti.i32), ti.u32), w, dw

        def corners():
            """Static list of corner offsets: 2^D of them (one for Nearest)."""
            n_corners = 1 if interp == "Nearest" else 1 << D
            return [tuple((c >> d) & 1 for d in range(D)) for c in range(n_corners)]

        @ti.func
        def corner_weight(w, bits: ti.template(), skip: ti.template()):
            """prod over dims d != skip of (w_d if the corner is upper in d else 1 - w_d)."""
            weight = 1.0
            if ti.static(interp != "Nearest"):
                for d in ti.static(range(D)):
                    if ti.static(d != skip):
                        weight *= w[d] if ti.static(bits[d]) else 1.0 - w[d]
            return weight

        @ti.func
        def entry(lv, mode: ti.template(), p, bits: ti.template()):
            """Index of the corner's first feature, relative to the encoding's parameters: (offset + index) F."""
            idx = grid_index(lv, mode, p + ti.Vector(bits, ti.u32))
            return ti.cast((lv.offset & entry_mask) + (idx & entry_mask), ti.i32) * F

        # -- one sample, one level: shared by the batch kernels and the in-kernel funcs --
        @ti.func
        def level_features(weights: ti.template(), base, k, xs, lv, mode: ti.template()):
            p, w, _ = locate(xs, lv)
            acc = ti.Vector.zero(ti.f32, F)
            for bits in ti.static(corners()):
                weight = corner_weight(w, bits, -1)
                e = base + entry(lv, mode, p, bits)
                for f in ti.static(range(F)):
                    acc[f] += weight * weights[k, e + f]
            return acc

        @ti.func
        def level_scatter(add: ti.template(), G: ti.template(), base, slot, k, xs, lv, mode: ti.template(), dy):
            """add(G, base, slot, k, i, weight * dL/dy_f) for every corner entry i (relative to the encoding)."""
            p, w, _ = locate(xs, lv)
            for bits in ti.static(corners()):
                weight = corner_weight(w, bits, -1)
                e = entry(lv, mode, p, bits)
                for f in ti.static(range(F)):
                    add(G, base, slot, k, e + f, weight * dy[f])

        @ti.func
        def level_input_gradient(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy):
            g = ti.Vector.zero(ti.f32, D)
            if ti.static(interp != "Nearest"):
                p, w, dw = locate(xs, lv)
                for bits in ti.static(corners()):
                    e = base + entry(lv, mode, p, bits)
                    value = 0.0
                    for f in ti.static(range(F)):
                        value += dy[f] * weights[k, e + f]
                    for d in ti.static(range(D)):
                        sign = 1.0 if ti.static(bits[d]) else -1.0
                        g[d] += sign * corner_weight(w, bits, d) * value * lv.scale * dw[d]
            return g

        @ti.func
        def row(a: ti.template(), b, n: ti.template(), start):
            v = ti.Vector.zero(ti.f32, n)
            for i in ti.static(range(n)):
                v[i] = a[b, start + i]
            return v

        # -- batch kernels ---------------------------------------------------------
        @ti.func
        def n_iterations(B):
            """The parallel range of a batch kernel: one chunk per worker on the CPU, else one sample each."""
            return n_workers * CPU_CHUNK if ti.static(cpu) else B

        @ti.func
        def samples(i, B):
            """Samples [start, end) of parallel iteration i: on the CPU, worker i // CPU_CHUNK's contiguous
            share of the batch for the first iteration of its chunk and none for the others; else sample i."""
            start, end = i, i + 1
            if ti.static(cpu):
                w_id = i // CPU_CHUNK
                start, end = w_id * B // n_workers, (w_id + 1) * B // n_workers
                if i % CPU_CHUNK != 0:
                    end = start
            return start, end

        @ti.kernel
        def forward(weights: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, y: F32_2D, routed: ti.template()):
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            acc = level_features(weights, base, k, row(x, b, D, 0), lv, mode)
                            for f in ti.static(range(F)):
                                y[b, l * F + f] = acc[f]
                for b in range(start, end):
                    for j in ti.static(range(raw, width)):
                        y[b, j] = 0.0

        @ti.func
        def add_private(G: ti.template(), base, w_id, k, i, v):   # worker w_id owns scratch[w_id]: no atomic
            scratch[w_id, k, i] = scratch[w_id, k, i] + v

        @ti.func
        def add_atomic(G: ti.template(), base, w_id, k, i, v):
            ti.atomic_add(G[k, base + i], v)

        @ti.kernel
        def scatter(add: ti.template(), G: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                    routed: ti.template()):
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                w_id = i // CPU_CHUNK                   # owns scratch[w_id] (add_atomic ignores it)
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            level_scatter(add, G, base, w_id, k, row(x, b, D, 0), lv, mode, row(dy, b, F, l * F))

        @ti.kernel
        def reduce_private(G: ti.template(), base: ti.i32, overwrite: ti.template()):
            for k, i in ti.ndrange(K, n):
                acc = 0.0 if ti.static(overwrite) else G[k, base + i]
                for w_id in ti.static(range(n_workers)):
                    acc += scratch[w_id, k, i]
                    scratch[w_id, k, i] = 0.0
                G[k, base + i] = acc

        @ti.func
        def add_owned(G: ti.template(), base, slot, k, i, v):   # the level's owner is the only thread writing there
            G[k, base + i] = G[k, base + i] + v

        @ti.kernel
        def scatter_levels(G: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                           routed: ti.template(), overwrite: ti.template()):
            """One parallel chunk per level (chunks go to whichever thread is free): its thread owns the
            level's gradients and adds the whole batch into them, sample after sample."""
            B = x.shape[0]
            for i in range(L * CPU_CHUNK):
                if i % CPU_CHUNK == 0:
                    l = i // CPU_CHUNK
                    lv = geometry[l]
                    if ti.static(overwrite):
                        start = base + ti.cast(lv.offset, ti.i32) * F
                        for k in range(K):
                            for j in range(start, start + ti.cast(lv.size, ti.i32) * F):
                                G[k, j] = 0.0
                    for mode, first, stop in ti.static(runs):
                        if first <= l < stop:
                            for b in range(B):
                                k = inst[b] if ti.static(routed) else 0
                                level_scatter(add_owned, G, base, 0, k, row(x, b, D, 0), lv, mode,
                                              row(dy, b, F, l * F))

        @ti.kernel
        def backward_input(weights: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D, dx: F32_2D,
                           routed: ti.template()):
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                for b in range(start, end):
                    for d in ti.static(range(D)):
                        dx[b, d] = 0.0
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            g = level_input_gradient(weights, base, k, row(x, b, D, 0), lv, mode,
                                                     row(dy, b, F, l * F))
                            for d in ti.static(range(D)):
                                dx[b, d] = dx[b, d] + g[d]

        def backward_params(G, base, x, inst, dy, routed, overwrite):
            if private:
                scatter(add_private, G, base, x, inst, dy, routed)
                reduce_private(G, base, overwrite)
            elif cpu:
                scatter_levels(G, base, x, inst, dy, routed, overwrite)
            else:
                scatter(add_atomic, G, base, x, inst, dy, routed)

        # -- one sample inside a user's kernel --------------------------------------
        def sample_funcs(weights, grads, base: int):
            """``(forward, vjp)`` ti.funcs of one sample reading ``weights[k, base + i]``; the vjp scatters
            dL/dθ into the gradients (``grads``, the store's) atomically unless ``grads`` is None."""
            with_grads = grads is not None

            @ti.func
            def forward(xs, k=0):
                y = ti.Vector.zero(ti.f32, width)
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        acc = level_features(weights, base, k, xs, geometry[l], mode)
                        for f in ti.static(range(F)):
                            y[l * F + f] = acc[f]
                return y

            @ti.func
            def vjp(xs, dy, k=0):
                g = ti.Vector.zero(ti.f32, D)
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        dy_l = ti.Vector.zero(ti.f32, F)
                        for f in ti.static(range(F)):
                            dy_l[f] = dy[l * F + f]
                        if ti.static(with_grads):
                            level_scatter(add_atomic, grads, base, 0, k, xs, lv, mode, dy_l)
                        g += level_input_gradient(weights, base, k, xs, lv, mode, dy_l)
                return g

            return forward, vjp

        self.private, self.cpu = private, cpu
        self.forward, self.backward_params, self.backward_input = forward, backward_params, backward_input
        self.sample_funcs = sample_funcs
