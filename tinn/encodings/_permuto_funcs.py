"""The permutohedral encoding's per-sample funcs of one level (the formulas: ``permutohedral.py``), with
the signatures of the grid's (``_grid_funcs.level_funcs``), so that the grid's batch kernels and
in-kernel funcs (``_grid_kernels.py``) run them unchanged.

One level of D input dims, for a point x (Adams et al. 2010, PermutoSDF / Dr.Jit's ``PermutoEncoding``):

1. embed into the hyperplane sum = 0 of R^(D+1): ``c_j = scale_l x_j / sqrt((j + 1)(j + 2))``,
   ``e_i = sum_{j >= i} c_j - i c_{i-1}`` (i = 0..D);
2. the remainder-0 lattice point nearest per coordinate (multiples of D + 1), ``r0``;
3. the enclosing simplex: ``rank_i`` = the place of ``e_i - r0_i`` among them, largest first (ties by
   index), shifted by ``s = sum_i r0_i / (D + 1)`` and wrapped into 0..D (``r0_i`` moved by -+(D + 1));
4. barycentric weights: ``delta_i = (e_i - r0_i) / (D + 1)`` adds to ``b[D - rank_i]`` and subtracts from
   ``b[D + 1 - rank_i]``; ``b[0] += 1 + b[D + 1]``;
5. vertex r (0..D) has the key ``v_i = r0_i + r - (D + 1) [rank_i > D - r]`` (i < D; the last is
   redundant) and its table entry ``(XOR_i v_i pi_i) mod 2^log2_hashmap_size``.

The features are ``sum_r b_r theta[v_r]``. The weights are linear in x inside a simplex, so
``d b_r / dx_j = sum_i (([rank_i = D - r] - [rank_i = (D + 1 - r) mod (D + 1)]) / (D + 1)) de_i/dx_j``
with ``de_i/dx_j = scale_l / sqrt((j + 1)(j + 2)) ([j >= i] - i [j = i - 1])``, and every second
derivative in x is 0.
"""
import math
import types

import taichi as ti

from . import _grid_funcs

PRIMES = (1, 2654435761, 805459861, 3674653429, 2097192037, 1434869437, 2165219737, 2246822519)
"""tcnn's seven hash primes, and xxHash's PRIME32_2 for an eighth dim."""
MAX_DIMS = len(PRIMES)
CLAMP = float(2 ** 22)
"""|c_j| is clamped to 2^22 lattice units: the keys stay exact int32 (float32 has no fraction there)."""


def level_funcs(D: int, F: int, interp: str, entry_mask: int, any_input: bool = True):
    """The ti.funcs of one sample and one level ``lv`` (scale, size, offset of the geometry table) for D
    input dims and F features; ``interp`` is unused (always barycentric), ``entry_mask`` and ``any_input``
    as the grid's."""
    if not 1 <= D <= MAX_DIMS:
        raise ValueError(f"the permutohedral encoding takes 1 to {MAX_DIMS} input dims, got {D}")
    grid = _grid_funcs.level_funcs(D, F, "Linear", entry_mask, any_input)
    at, bounded, n = grid.at, grid.bounded, D + 1
    sf = [1.0 / math.sqrt((j + 1) * (j + 2)) for j in range(D)]

    @ti.func
    def simplex(xs, lv):
        """(entries, b): the parameter index (relative to the encoding) of each vertex's first feature and
        its barycentric weight, plus the ranks for the slopes."""
        p = bounded(xs) if ti.static(any_input) else xs
        e = ti.Vector.zero(ti.f32, n)
        total = 0.0
        for i in ti.static(range(D, 0, -1)):
            c = ti.min(ti.max(p[i - 1] * lv.scale * sf[i - 1], -CLAMP), CLAMP)
            e[i] = total - i * c
            total += c
        e[0] = total
        r0 = ti.Vector.zero(ti.i32, n)
        s = 0
        for i in ti.static(range(n)):
            v = e[i] * (1.0 / n)
            up, down = ti.ceil(v) * n, ti.floor(v) * n
            r0[i] = ti.cast(ti.select(up - e[i] < e[i] - down, up, down), ti.i32)
            s += r0[i]
        s = s // n
        rank = ti.Vector.zero(ti.i32, n)
        for i in ti.static(range(D)):
            for j in ti.static(range(i + 1, n)):
                if e[i] - r0[i] < e[j] - r0[j]:
                    rank[i] += 1
                else:
                    rank[j] += 1
        for i in ti.static(range(n)):
            rank[i] += s
            if rank[i] < 0:
                rank[i] += n
                r0[i] += n
            elif rank[i] > D:
                rank[i] -= n
                r0[i] -= n
        delta = by_rank(rank, (e - ti.cast(r0, ti.f32)) * (1.0 / n))
        b = ti.Vector.zero(ti.f32, n)
        for r in ti.static(range(n)):
            b[r] = delta[D - r] - delta[(D + 1 - r) % n] + (1.0 if r == 0 else 0.0)
        entries = ti.Vector.zero(ti.i32, n)
        for r in ti.static(range(n)):
            idx = ti.u32(0)
            for i in ti.static(range(D)):
                v = r0[i] + r - ti.select(rank[i] > D - r, n, 0)
                idx = idx ^ (ti.cast(v, ti.u32) * ti.u32(PRIMES[i]))
            entries[r] = ti.cast((lv.offset & entry_mask) + (idx & (lv.size - 1) & entry_mask), ti.i32) * F
        return entries, b, rank

    @ti.func
    def by_rank(rank, u):
        """u permuted by rank: out[q] = u_i for the i with rank_i = q (ranks are a permutation of 0..D)."""
        out = ti.Vector.zero(ti.f32, n)
        for q in ti.static(range(n)):
            for i in ti.static(range(n)):
                if rank[i] == q:
                    out[q] = u[i]
        return out

    @ti.func
    def slopes_along(rank, lv, gs):
        """gs . db_r/dx for every vertex r: with u = E gs, (scale_l / (D + 1)) (u_{i+} - u_{i-}) where
        rank_{i+} = D - r and rank_{i-} = (D + 1 - r) mod (D + 1)."""
        u = ti.Vector.zero(ti.f32, n)
        total = 0.0
        for i in ti.static(range(D, 0, -1)):
            c = gs[i - 1] * sf[i - 1]
            u[i] = total - i * c
            total += c
        u[0] = total
        q = by_rank(rank, u)
        out = ti.Vector.zero(ti.f32, n)
        for r in ti.static(range(n)):
            out[r] = q[D - r] - q[(D + 1 - r) % n]
        return out * (lv.scale * (1.0 / n))

    @ti.func
    def input_gradient(rank, lv, v):
        """sum_r v_r db_r/dx: dL/de_i = (v_{D - rank_i} - v_{(D + 1 - rank_i) mod (D + 1)}) / (D + 1), then
        dL/dx_j = scale_l sum_i dL/de_i de_i/dx_j (E transposed)."""
        w = ti.Vector.zero(ti.f32, n)
        for q in ti.static(range(n)):
            w[q] = v[D - q] - v[(D + 1 - q) % n]
        g_e = ti.Vector.zero(ti.f32, n)
        for i in ti.static(range(n)):
            for q in ti.static(range(n)):
                if rank[i] == q:
                    g_e[i] = w[q]
        g = ti.Vector.zero(ti.f32, D)
        total = g_e[0]
        for j in ti.static(range(D)):
            g[j] = sf[j] * (total - (j + 1) * g_e[j + 1])
            total += g_e[j + 1]
        return g * (lv.scale * (1.0 / n))

    @ti.func
    def vertex_features(weights: ti.template(), base, k, entries, r):
        """The F features of vertex r's table entry."""
        e = at(base, entries[r])
        return ti.Vector([weights[k, e + f] for f in ti.static(range(F))])

    @ti.func
    def level_features(weights: ti.template(), base, k, xs, lv, mode: ti.template()):
        entries, b, _ = simplex(xs, lv)
        acc = ti.Vector.zero(ti.f32, F)
        for r in ti.static(range(n)):
            acc += b[r] * vertex_features(weights, base, k, entries, r)
        return acc

    @ti.func
    def level_scatter(add: ti.template(), G: ti.template(), base, slot, k, xs, lv, mode: ti.template(), dy,
                      second: ti.template(), gs):
        """add(G, base, slot, k, i, coefficient * dL/dy_f) for every vertex entry i: the coefficient is b_r
        (dL/dθ), or with ``second`` gs . db_r/dx (dL2/dθ)."""
        entries, coefficients, rank = simplex(xs, lv)
        if ti.static(second):
            coefficients = slopes_along(rank, lv, gs)
        for r in ti.static(range(n)):
            for f in ti.static(range(F)):
                add(G, base, slot, k, entries[r] + f, coefficients[r] * dy[f])

    @ti.func
    def level_input_gradient(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy):
        entries, _, rank = simplex(xs, lv)
        v = ti.Vector.zero(ti.f32, n)
        for r in ti.static(range(n)):
            v[r] = dy.dot(vertex_features(weights, base, k, entries, r))
        return input_gradient(rank, lv, v)

    @ti.func
    def level_second_order(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy, gs):
        """(dL2/d(dL/dy_l), dL2/dx) of one level for L2 = <gs, dL/dx>; the second is 0 (weights linear in x)."""
        entries, _, rank = simplex(xs, lv)
        slopes = slopes_along(rank, lv, gs)
        d_dy = ti.Vector.zero(ti.f32, F)
        for r in ti.static(range(n)):
            e = at(base, entries[r])
            for f in ti.static(range(F)):
                d_dy[f] += slopes[r] * weights[k, e + f]
        return d_dy, ti.Vector.zero(ti.f32, D)

    return types.SimpleNamespace(
        at=at, level_features=level_features, level_scatter=level_scatter, level_input_gradient=level_input_gradient,
        level_second_order=level_second_order, row=grid.row, gs_row=grid.gs_row)
