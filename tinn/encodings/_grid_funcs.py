"""The grid encoding's per-sample funcs of one level (the formulas, first and second order: ``grid.py``),
shared by the batch kernels (``_grid_kernels.py``), the block-aggregated backward (``_grid_block.py``)
and the funcs a user's kernel calls."""
import types

import taichi as ti
from taichi.lang.expr import make_constant_expr

PRIMES = (1, 2654435761, 805459861, 3674653429)
HASHED, DENSE, MODULO = 0, 1, 2          # how a level reduces its vertex index to a table entry
INT32_MIN_F32, INT32_MAX_F32 = -2.0 ** 31, 2.0 ** 31 - 128     # the float32 values at the ends of the int32 range
MAX_X_BITS, INF_BITS = 0x5F800000, 0x7F800000                   # the bits of 2^64 and of +inf
OFFSET_MASK = (1 << 30) - 1
"""An encoding's column offset in its store and its parameter indices are below 2^30 (``GridEncoding``
checks it): masking them with this changes neither, but shows LLVM that their sum cannot overflow, so
that it folds the sum into the load addresses (unmasked, the runtime offset cost ~40 % of a forward)."""


def entry_mask(F: int, n: int) -> int:
    """The mask of a level's entry offset and of an entry index of an encoding of ``n`` parameters, F per entry: a
    power of two less one above both, which changes neither but shows LLVM that they are small and non-negative,
    so that it folds them into the load addresses. Where ``n <= 2^29`` (every grid but the largest), offset and
    index are each below 2^29 / F: the mask 2^29 / F - 1 keeps an entry's columns below 2^30, so that ``at``'s
    masks of them fold away too and an entry's F loads share one address (``docs/performance.md``); above,
    2^30 / F - 1. Not the power of two above ``n``: kernels of grids of other sizes are shared."""
    return (OFFSET_MASK + 1) // (1 if n > (OFFSET_MASK + 1) // 2 else 2) // F - 1


def level_funcs(D: int, F: int, interp: str, entry_mask: int, any_input: bool = True):
    """The ti.funcs of one sample and one level ``lv`` (a row of the geometry table: scale, res, size,
    offset) for D input dims, F features and the interpolation ``interp``; ``entry_mask``
    is ``entry_mask(F, n)`` of the encoding's ``n`` parameters. ``any_input``: inputs may be NaN or +-Inf (see
    ``bounded``); without it they are finite, as the CPU path's batches are checked before any kernel."""

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
    def bounded(xs):
        """xs with NaN -> 0 and |xs| > 2^64 (infinities included) -> +-2^64, decided on the bits (fast math
        may assume floats finite): scale_l < 2^32 keeps every position finite, and since a position beyond
        the int32 range is clamped anyway, no finite input changes its features."""
        out = xs
        for d in ti.static(range(D)):
            bits = ti.bit_cast(xs[d], ti.u32)
            magnitude = bits & ti.u32(0x7FFFFFFF)
            clamped = (bits & ti.u32(0x80000000)) | ti.min(magnitude, ti.u32(MAX_X_BITS))
            out[d] = ti.bit_cast(ti.select(magnitude > ti.u32(INF_BITS), ti.u32(0), clamped), ti.f32)
        return out

    @ti.func
    def locate(xs, lv):
        """Lower corner p (u32), interpolation weights w and their first and second derivatives dw, ddw
        in t of point xs (any float xs: see ``bounded``)."""
        # tcnn casts floor(pos) to int, then to uint32; clamping pos to the int32 range first keeps that
        # cast defined for any input, without changing a position that fits
        pos = ti.min(ti.max((bounded(xs) if ti.static(any_input) else xs) * lv.scale + 0.5, INT32_MIN_F32),
                     INT32_MAX_F32)
        pf = ti.floor(pos)
        t = pos - pf
        w, dw, ddw = t, ti.Vector.one(ti.f32, D), ti.Vector.zero(ti.f32, D)
        if ti.static(interp == "Smoothstep"):
            w, dw, ddw = t * t * (3.0 - 2.0 * t), 6.0 * t * (1.0 - t), 6.0 - 12.0 * t
        return ti.cast(ti.cast(pf, ti.i32), ti.u32), w, dw, ddw

    n_corners = 1 if interp == "Nearest" else 1 << D

    def corners():
        """Static list of corner offsets: 2^D of them (one for Nearest)."""
        return [tuple((c >> d) & 1 for d in range(D)) for c in range(n_corners)]

    @ti.func
    def corner(c):
        """The offsets of corner c (a loop index at run time): a u32 vector of D bits.

        A corner's ``bits`` are a static tuple of ints (``corners()``, the corner loop unrolled: the forward
        and the first-order scatter, the hot paths) or such a vector (a loop at run time: the input
        gradients and the second order, whose unrolled corners compiled for tens of seconds)."""
        bits = ti.Vector.zero(ti.u32, D)
        for d in ti.static(range(D)):
            bits[d] = (ti.cast(c, ti.u32) >> d) & ti.u32(1)
        return bits

    @ti.func
    def corner_weight(w, bits: ti.template(), skip: ti.template()):
        """prod over dims d not in skip (a tuple) of (w_d if the corner is upper in d else 1 - w_d)."""
        weight = 1.0
        if ti.static(interp != "Nearest"):
            for d in ti.static(range(D)):
                if ti.static(d not in skip):
                    if ti.static(isinstance(bits[d], int)):
                        weight *= w[d] if ti.static(bits[d]) else 1.0 - w[d]
                    else:
                        weight *= ti.select(bits[d] != 0, w[d], 1.0 - w[d])
        return weight

    @ti.func
    def signed(bit: ti.template(), v):
        """v if the corner is upper in the dim of ``bit``, else -v."""
        out = v
        if ti.static(isinstance(bit, int)):
            if ti.static(not bit):
                out = -v
        else:
            out = ti.select(bit != 0, v, -v)
        return out

    @ti.func
    def corner_slopes(w, dw, bits: ti.template(), scale):
        """d weight / dx_d of the corner for every d: sign_d scale w'_d prod_{d' != d}(...)."""
        s = ti.Vector.zero(ti.f32, D)
        for d in ti.static(range(D)):
            s[d] = signed(bits[d], corner_weight(w, bits, (d,)) * scale * dw[d])
        return s

    @ti.func
    def corner_curvature(w, dw, ddw, bits: ti.template(), scale, gs):
        """sum_d gs_d d^2 weight / dx_d dx_e of the corner, for every e."""
        h = ti.Vector.zero(ti.f32, D)
        for e in ti.static(range(D)):
            for d in ti.static(range(D)):
                if ti.static(d == e):
                    if ti.static(interp == "Smoothstep"):
                        h[e] += gs[d] * signed(bits[d], corner_weight(w, bits, (d,)) * ddw[d])
                else:
                    h[e] += gs[d] * signed(bits[d], signed(bits[e], corner_weight(w, bits, (d, e)))) \
                        * dw[d] * dw[e]
        return h * (scale * scale)

    @ti.func
    def offsets(bits: ti.template()):
        """The corner's offsets as a u32 vector (``bits``: a static tuple, or such a vector already)."""
        if ti.static(isinstance(bits, tuple)):
            return ti.Vector(bits, ti.u32)
        else:
            return bits

    @ti.func
    def entry(lv, mode: ti.template(), p, bits: ti.template()):
        """Index of the corner's first feature, relative to the encoding's parameters: (offset + index) F."""
        idx = grid_index(lv, mode, p + offsets(bits))
        return ti.cast((lv.offset & entry_mask) + (idx & entry_mask), ti.i32) * F

    @ti.func
    def at(base, i):
        """Column ``base + i`` of the parameter fields (see ``OFFSET_MASK``)."""
        return (base & OFFSET_MASK) + (i & OFFSET_MASK)

    # -- one sample, one level: shared by the batch kernels and the in-kernel funcs --
    @ti.func
    def level_features(weights: ti.template(), base, k, xs, lv, mode: ti.template()):
        p, w, _, _ = locate(xs, lv)
        acc = ti.Vector.zero(ti.f32, F)
        for bits in ti.static(corners()):
            weight = corner_weight(w, bits, ())
            e = at(base, entry(lv, mode, p, bits))
            for f in ti.static(range(F)):
                acc[f] += weight * weights[k, e + f]
        return acc

    @ti.func
    def corner_coefficient(w, dw, bits: ti.template(), scale, second: ti.template(), gs):
        """What the corner's entries get per unit of dL/dy: its weight (dL/dθ), or with ``second`` its
        slope along gs, sum_d gs_d s_d (dL2/dθ)."""
        coefficient = 0.0
        if ti.static(second):
            coefficient = gs.dot(corner_slopes(w, dw, bits, scale))
        else:
            coefficient = corner_weight(w, bits, ())
        return coefficient

    @ti.func
    def corner_terms(xs, lv, mode: ti.template(), dy, second: ti.template(), gs):
        """The sample's corners on level ``lv``: their indices in the level's table (a vector of 2^D i32, one
        for Nearest) and what they add to their entries (2^D x F: ``corner_coefficient`` times dL/dy_f)."""
        p, w, dw, _ = locate(xs, lv)
        keys, values = ti.Vector.zero(ti.i32, n_corners), ti.Matrix.zero(ti.f32, n_corners, F)
        for c in ti.static(range(n_corners)):
            bits = ti.static(corners()[c])
            keys[c] = ti.cast(grid_index(lv, mode, p + ti.Vector(bits, ti.u32)), ti.i32)
            coefficient = corner_coefficient(w, dw, bits, lv.scale, second, gs)
            for f in ti.static(range(F)):
                values[c, f] = coefficient * dy[f]
        return keys, values

    @ti.func
    def level_scatter(add: ti.template(), G: ti.template(), base, slot, k, xs, lv, mode: ti.template(), dy,
                      second: ti.template(), gs):
        """add(G, base, slot, k, i, coefficient * dL/dy_f) for every corner entry i (relative to the
        encoding), see ``corner_coefficient``."""
        if ti.static(not second or interp != "Nearest"):
            p, w, dw, _ = locate(xs, lv)
            if ti.static(second):
                for c in range(n_corners):
                    scatter_corner(add, G, base, slot, k, lv, mode, p, w, dw, corner(c), second, gs, dy)
            else:
                for bits in ti.static(corners()):
                    scatter_corner(add, G, base, slot, k, lv, mode, p, w, dw, bits, second, gs, dy)

    @ti.func
    def scatter_corner(add: ti.template(), G: ti.template(), base, slot, k, lv, mode: ti.template(), p, w, dw,
                       bits: ti.template(), second: ti.template(), gs, dy):
        """The adds of one corner (``bits``: static or at run time, see ``corner``) for ``level_scatter``."""
        coefficient = corner_coefficient(w, dw, bits, lv.scale, second, gs)
        e = entry(lv, mode, p, bits)
        for f in ti.static(range(F)):
            add(G, base, slot, k, e + f, coefficient * dy[f])

    @ti.func
    def level_input_gradient(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy):
        g = ti.Vector.zero(ti.f32, D)
        if ti.static(interp != "Nearest"):
            p, w, dw, _ = locate(xs, lv)
            for c in range(n_corners):
                bits = corner(c)
                e = at(base, entry(lv, mode, p, bits))
                value = 0.0
                for f in ti.static(range(F)):
                    value += dy[f] * weights[k, e + f]
                g += corner_slopes(w, dw, bits, lv.scale) * value
        return g

    @ti.func
    def level_second_order(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy, gs):
        """(dL2/d(dL/dy_l) (F values), dL2/dx (D values)) of one level for L2 = <gs, dL/dx>."""
        d_dy, h = ti.Vector.zero(ti.f32, F), ti.Vector.zero(ti.f32, D)
        if ti.static(interp != "Nearest"):
            p, w, dw, ddw = locate(xs, lv)
            for c in range(n_corners):
                bits = corner(c)
                e = at(base, entry(lv, mode, p, bits))
                slope = gs.dot(corner_slopes(w, dw, bits, lv.scale))
                value = 0.0
                for f in ti.static(range(F)):
                    theta = weights[k, e + f]
                    d_dy[f] += slope * theta
                    value += dy[f] * theta
                h += corner_curvature(w, dw, ddw, bits, lv.scale, gs) * value
        return d_dy, h

    @ti.func
    def row(a: ti.template(), b, n: ti.template(), start):
        v = ti.Vector.zero(ti.f32, n)
        for i in ti.static(range(n)):
            v[i] = a[b, start + i]
        return v

    @ti.func
    def gs_row(second: ti.template(), g: ti.template(), b):
        """Row b of dL2/d(dL/dx) for the second order; nothing read for the first."""
        v = ti.Vector.zero(ti.f32, D)
        if ti.static(second):
            v = row(g, b, D, 0)
        return v

    return types.SimpleNamespace(
        grid_index=grid_index, bounded=bounded, locate=locate, corners=corners, corner_terms=corner_terms, at=at,
        level_features=level_features, level_scatter=level_scatter, level_input_gradient=level_input_gradient,
        level_second_order=level_second_order, row=row, gs_row=gs_row)


class ConstantGeometry:
    """The levels' geometry table (``levels``: rows of scale, resolution, table size, entry offset, ...) as
    constants: ``table[l]`` in Taichi scope is row ``l`` (a run-time index) chosen among them by ``ti.select``,
    for kernels that read no field (an AOT module's only data are its ndarray arguments)."""

    def __init__(self, levels):
        self.rows = [(float(scale), res % 2 ** 32, size, offset) for scale, res, size, offset, *_ in levels]

    def __getitem__(self, l):
        def pick(column, dtype):
            value = make_constant_expr(self.rows[0][column], dtype)
            for i in range(1, len(self.rows)):
                value = ti.select(l == i, make_constant_expr(self.rows[i][column], dtype), value)
            return value

        return ti.Struct(scale=pick(0, ti.f32), res=pick(1, ti.u32), size=pick(2, ti.u32), offset=pick(3, ti.u32))
