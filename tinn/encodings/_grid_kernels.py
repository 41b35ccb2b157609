"""The grid encoding's Taichi kernels and per-sample funcs (the formulas, first and second order: ``grid.py``)."""
import taichi as ti

from .._device import is_cpu
from .._kernels import specialised
from .._memory import FieldTree
from .._types import F32_2D, I32_1D

PRIMES = (1, 2654435761, 805459861, 3674653429)
HASHED, DENSE, MODULO = 0, 1, 2          # how a level reduces its vertex index to a table entry
# Taichi 1.7's CPU backend hands a parallel range to its threads in chunks of 512 iterations (a
# shorter range runs on one thread, whatever ti.loop_config says), so per-thread work is spread
# one iteration per chunk.
CPU_CHUNK = 512
INT32_MIN_F32, INT32_MAX_F32 = -2.0 ** 31, 2.0 ** 31 - 128     # the float32 values at the ends of the int32 range
OFFSET_MASK = (1 << 30) - 1
"""An encoding's column offset in its store and its parameter indices are below 2^30 (``GridEncoding``
checks it): masking them with this changes neither, but shows LLVM that their sum cannot overflow, so
that it folds the sum into the load addresses (unmasked, the runtime offset cost ~40 % of a forward)."""


@specialised
def grid_kernels(*constants):
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
            """Lower corner p (u32), interpolation weights w and their first and second derivatives dw, ddw
            in t of point xs (any finite xs)."""
            # tcnn casts floor(pos) to int, then to uint32; clamping pos to the int32 range first keeps that
            # cast defined and t finite for any input (x * scale may overflow to inf), without changing a
            # position that fits
            pos = ti.min(ti.max(xs * lv.scale + 0.5, INT32_MIN_F32), INT32_MAX_F32)
            pf = ti.floor(pos)
            t = pos - pf
            w, dw, ddw = t, ti.Vector.one(ti.f32, D), ti.Vector.zero(ti.f32, D)
            if ti.static(interp == "Smoothstep"):
                w, dw, ddw = t * t * (3.0 - 2.0 * t), 6.0 * t * (1.0 - t), 6.0 - 12.0 * t
            return ti.cast(ti.cast(pf, ti.i32), ti.u32), w, dw, ddw

        def corners():
            """Static list of corner offsets: 2^D of them (one for Nearest)."""
            n_corners = 1 if interp == "Nearest" else 1 << D
            return [tuple((c >> d) & 1 for d in range(D)) for c in range(n_corners)]

        @ti.func
        def corner_weight(w, bits: ti.template(), skip: ti.template()):
            """prod over dims d not in skip (a tuple) of (w_d if the corner is upper in d else 1 - w_d)."""
            weight = 1.0
            if ti.static(interp != "Nearest"):
                for d in ti.static(range(D)):
                    if ti.static(d not in skip):
                        weight *= w[d] if ti.static(bits[d]) else 1.0 - w[d]
            return weight

        def sign(bits, d):
            return 1.0 if bits[d] else -1.0

        @ti.func
        def corner_slopes(w, dw, bits: ti.template(), scale):
            """d weight / dx_d of the corner for every d: sign_d scale w'_d prod_{d' != d}(...)."""
            s = ti.Vector.zero(ti.f32, D)
            for d in ti.static(range(D)):
                s[d] = ti.static(sign(bits, d)) * corner_weight(w, bits, (d,)) * scale * dw[d]
            return s

        @ti.func
        def corner_curvature(w, dw, ddw, bits: ti.template(), scale, gs):
            """sum_d gs_d d^2 weight / dx_d dx_e of the corner, for every e."""
            h = ti.Vector.zero(ti.f32, D)
            for e in ti.static(range(D)):
                for d in ti.static(range(D)):
                    if ti.static(d == e):
                        if ti.static(interp == "Smoothstep"):
                            h[e] += gs[d] * ti.static(sign(bits, d)) * corner_weight(w, bits, (d,)) * ddw[d]
                    else:
                        h[e] += gs[d] * ti.static(sign(bits, d) * sign(bits, e)) * corner_weight(w, bits, (d, e)) \
                            * dw[d] * dw[e]
            return h * (scale * scale)

        @ti.func
        def entry(lv, mode: ti.template(), p, bits: ti.template()):
            """Index of the corner's first feature, relative to the encoding's parameters: (offset + index) F."""
            idx = grid_index(lv, mode, p + ti.Vector(bits, ti.u32))
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
        def level_scatter(add: ti.template(), G: ti.template(), base, slot, k, xs, lv, mode: ti.template(), dy,
                          second: ti.template(), gs):
            """add(G, base, slot, k, i, coefficient * dL/dy_f) for every corner entry i (relative to the
            encoding): the corner's weight (dL/dθ), or with ``second`` its slope along gs, sum_d gs_d s_d
            (dL2/dθ)."""
            if ti.static(not second or interp != "Nearest"):
                p, w, dw, _ = locate(xs, lv)
                for bits in ti.static(corners()):
                    coefficient = 0.0
                    if ti.static(second):
                        coefficient = gs.dot(corner_slopes(w, dw, bits, lv.scale))
                    else:
                        coefficient = corner_weight(w, bits, ())
                    e = entry(lv, mode, p, bits)
                    for f in ti.static(range(F)):
                        add(G, base, slot, k, e + f, coefficient * dy[f])

        @ti.func
        def level_input_gradient(weights: ti.template(), base, k, xs, lv, mode: ti.template(), dy):
            g = ti.Vector.zero(ti.f32, D)
            if ti.static(interp != "Nearest"):
                p, w, dw, _ = locate(xs, lv)
                for bits in ti.static(corners()):
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
                for bits in ti.static(corners()):
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
            ti.atomic_add(G[k, at(base, i)], v)

        @ti.kernel
        def scatter(add: ti.template(), G: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                    routed: ti.template(), second: ti.template(), g: F32_2D):
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                w_id = i // CPU_CHUNK                   # owns scratch[w_id] (add_atomic ignores it)
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            level_scatter(add, G, base, w_id, k, row(x, b, D, 0), lv, mode, row(dy, b, F, l * F),
                                          second, gs_row(second, g, b))

        @ti.kernel
        def reduce_private(G: ti.template(), base: ti.i32, overwrite: ti.template()):
            for k, i in ti.ndrange(K, n):
                acc = 0.0 if ti.static(overwrite) else G[k, at(base, i)]
                for w_id in ti.static(range(n_workers)):
                    acc += scratch[w_id, k, i]
                    scratch[w_id, k, i] = 0.0
                G[k, at(base, i)] = acc

        @ti.func
        def add_owned(G: ti.template(), base, slot, k, i, v):   # the level's owner is the only thread writing there
            G[k, at(base, i)] = G[k, at(base, i)] + v

        @ti.kernel
        def scatter_levels(G: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                           routed: ti.template(), overwrite: ti.template(), second: ti.template(), g: F32_2D):
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
                                              row(dy, b, F, l * F), second, gs_row(second, g, b))

        @ti.kernel
        def per_sample_backward(weights: ti.template(), base: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                                dx: F32_2D, routed: ti.template(), second: ti.template(), g: F32_2D, d_dy: F32_2D):
            """dL/dx into dx; with ``second``, dL2/dx into dx and dL2/d(dL/dy) into d_dy for L2 = <g, dL/dx>."""
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                for b in range(start, end):
                    for d in ti.static(range(D)):
                        dx[b, d] = 0.0
                    if ti.static(second):
                        for j in ti.static(range(raw, width)):
                            d_dy[b, j] = 0.0
                for mode, first, stop in ti.static(runs):
                    for l in range(first, stop):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            xs, dy_l = row(x, b, D, 0), row(dy, b, F, l * F)
                            h = ti.Vector.zero(ti.f32, D)
                            if ti.static(second):
                                d_dy_l, h2 = level_second_order(weights, base, k, xs, lv, mode, dy_l, row(g, b, D, 0))
                                h = h2
                                for f in ti.static(range(F)):
                                    d_dy[b, l * F + f] = d_dy_l[f]
                            else:
                                h = level_input_gradient(weights, base, k, xs, lv, mode, dy_l)
                            for d in ti.static(range(D)):
                                dx[b, d] = dx[b, d] + h[d]

        def backward_input(weights, base, x, inst, dy, dx, routed):
            per_sample_backward(weights, base, x, inst, dy, dx, routed, False, x, dx)

        def backward_backward(weights, base, x, inst, g, dy, d_dy, dx, routed):
            per_sample_backward(weights, base, x, inst, dy, dx, routed, True, g, d_dy)

        def backward_params(G, base, x, inst, dy, routed, overwrite, g=None):
            """dL/dθ, or with ``g`` (dL2/d(dL/dx)) dL2/dθ, added to the gradients ``G`` (written if
            ``overwrite``: only on the CPU, elsewhere the caller zeroes them first)."""
            second = g is not None
            g = g if second else x                  # not read by the first order
            if private:
                scatter(add_private, G, base, x, inst, dy, routed, second, g)
                reduce_private(G, base, overwrite)
            elif cpu:
                scatter_levels(G, base, x, inst, dy, routed, overwrite, second, g)
            else:
                scatter(add_atomic, G, base, x, inst, dy, routed, second, g)

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
                            level_scatter(add_atomic, grads, base, 0, k, xs, lv, mode, dy_l, False, xs)
                        g += level_input_gradient(weights, base, k, xs, lv, mode, dy_l)
                return g

            return forward, vjp

        self.private, self.cpu = private, cpu
        self.forward, self.backward_params, self.backward_input = forward, backward_params, backward_input
        self.backward_backward = backward_backward
        self.sample_funcs = sample_funcs
