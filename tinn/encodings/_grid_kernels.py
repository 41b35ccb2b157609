"""The grid encoding's batch kernels and the funcs a user's kernel calls (the per-level formulas: ``_grid_funcs.py``;
the permutohedral encoding runs them with its own, ``_permuto_funcs.py``)."""
import taichi as ti
from taichi.lang.any_array import AnyArray

from ..runtime.program import is_cpu
from ..runtime.kernels import ARENA, CHUNK, arena_kernel, specialised
from ..runtime.types import F32_2D, I32_1D
from . import _grid_block as block
from . import _grid_tables as tables
from ._grid_funcs import DENSE, HASHED, MODULO, ConstantGeometry, entry_mask, level_funcs

# Taichi 1.7's CPU backend hands a parallel range to its threads in chunks of 512 iterations (a
# shorter range runs on one thread, whatever ti.loop_config says), so per-thread work is spread
# one iteration per chunk.
CPU_CHUNK = 512
RUN = 8
"""Off the CPU, consecutive samples a thread of the first-order scatter takes on one level (``run_scatter``)."""


def grid_kernels(D: int, F: int, n: int, width: int, interp: str, levels: tuple, scratch: int, checked: bool,
                 funcs=level_funcs, modes: tuple = ()):
    """The kernels of a grid of ``levels`` (scale, res, entries, entry offset, hashed per level) and ``n``
    parameters per network, output padded to ``width`` columns: its kind's (``_Kernels``, shared by grids that
    differ only in geometry, number of networks or padding) with that geometry.
    ``scratch``: on the CPU, the columns per network of the private gradient tables (``_grid_tables.Scratch``),
    or 0 for none.
    ``modes``: the index modes the encoding's levels take, in level order (a HashGrid's are dense, then hashed):
    its runs are those, some maybe empty, so that its kernels do not depend on where one mode gives way to the
    next. Off the CPU, whether a level is summed per block (its table fits a block's shared memory) is part of
    its run's kind: only grids whose levels all are, or none, have the runs of ``modes``; and the per-block sums
    take static shared memory, for the largest such table rounded up to a power of two (one kernel per power)."""
    cpu = is_cpu()
    kinds, starts = [], []                      # per run of levels: (index mode, summed per block?), first level
    for l, (scale, res, entries, offset, hashed) in enumerate(levels):
        mode = HASHED if hashed else DENSE if res ** D <= entries else MODULO
        kind = (mode, not cpu and funcs is level_funcs and block.fits(entries, F))   # off the CPU: per block?
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
            starts.append(l)
    observed = [mode for mode, _ in kinds]
    shared = {shared for _, shared in kinds}
    if len(shared) == 1 and all(m in modes for m in observed) and observed == sorted(observed, key=modes.index):
        starts = [next((s for m, s in zip(observed, starts) if modes.index(m) >= i), len(levels))
                  for i in range(len(modes))]
        kinds = [(m, *shared) for m in modes]
    rows = tuple((float(scale), res % 2 ** 32, entries, offset) for scale, res, entries, offset, _ in levels)
    table, gb, g0 = tables.place(rows, tuple(starts))
    block_sizes = tuple(levels[l][2] for (_, shared), first, stop in zip(kinds, starts, starts[1:] + [len(levels)])
                        if shared for l in range(first, stop))
    kernels = _Kernels(D, F, interp, tuple(kinds), scratch > 0, checked, funcs, table, entry_mask(F, n))
    rows_of_runs = tuple(g0 + l for l in starts) + (g0 + len(levels),)
    block_size = max(block_sizes, default=0)
    if block_size and block.fits(1 << (block_size - 1).bit_length(), F):
        block_size = 1 << (block_size - 1).bit_length()
    return tables.Bound(kernels, gb, n, width, rows_of_runs, block_size, levels, scratch)


@specialised
class _Kernels:
    """The grid's Taichi kernels, specialised to one kind of grid and shared by every grid of that kind:
    the parameter fields are template arguments, the encoding's column offset ``base`` a runtime one, and so
    is the row ``gb`` of the grid's geometry in the program's tables (``_grid_tables.py``). The number of
    networks is the gradients' rows and the padded width the output's columns: both are read at run time.

    Levels are a loop at run time over a small table of their geometry (scale, resolution, table size, entry
    offset), so that a kernel holds one level's code rather than L copies: Taichi re-parses the Python of every
    kernel at start-up, even on an offline-cache hit. A level's index mode stays a compile-time constant;
    consecutive levels sharing it form a run with a loop of its own (a Hash grid has two: its dense coarse
    levels, then hashed ones), whose first and last level the kernel reads from the table; off the CPU, levels
    whose tables fit a block's shared memory form runs of their own, summed per block (``_grid_block.py``)
    before the global adds.

    The batch kernels go level by level: on the CPU each thread takes a contiguous share of
    the batch and runs through it once per level, so that the level's table stays in the
    core's cache (elsewhere a parallel iteration is one sample, all its levels in turn).
    """

    def __init__(self, D: int, F: int, interp: str, kinds: tuple, private: bool, checked: bool, funcs, table: int,
                 entry_mask: int):
        cpu = is_cpu()
        n_workers = max(1, ti.lang.impl.current_cfg().cpu_max_num_threads) if cpu else 1

        runs = [(mode, r) for r, (mode, _) in enumerate(kinds)]    # (index mode, its bounds' row after gb)
        R = len(runs)
        block_runs = [run for run, (_, shared) in zip(runs, kinds) if shared]
        atomic_runs = [run for run, (_, shared) in zip(runs, kinds) if not shared]
        program_tables = tables.tables(table)
        geometry, bounds = program_tables.geometry, program_tables.bounds

        fn = funcs(D, F, interp, entry_mask, any_input=not checked)    # batches checked on the host: finite
        at, row, gs_row, level_features, level_scatter = fn.at, fn.row, fn.gs_row, fn.level_features, fn.level_scatter
        level_input_gradient, level_second_order = fn.level_input_gradient, fn.level_second_order
        one = funcs(D, F, interp, entry_mask)          # a user's kernel may pass any input

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

        @arena_kernel
        def forward(weights: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, inst: I32_1D, y: F32_2D,
                    routed: ti.template()):
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                g0 = bounds[gb]
                for mode, r in ti.static(runs):
                    for l in range(bounds[gb + r], bounds[gb + r + 1]):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            acc = level_features(weights, base, k, row(x, b, D, 0), lv, mode)
                            for f in ti.static(range(F)):
                                y[b, (l - g0) * F + f] = acc[f]
                for b in range(start, end):
                    for j in range((bounds[gb + R] - g0) * F, y.shape[1]):     # the padded columns
                        y[b, j] = 0.0

        @ti.func
        def add_private(S: ti.template(), base, w_id, k, i, v):   # worker w_id owns S[w_id]: no atomic
            S[w_id, k, i] = S[w_id, k, i] + v

        @ti.func
        def add_atomic(G: ti.template(), base, w_id, k, i, v):
            ti.atomic_add(G[k, at(base, i)], v)

        def scatter_kernel(runs):
            """The kernel adding each sample's gradients of the levels of ``runs``: into the private tables ``S``
            (``[worker, k, i]``) on the CPU, else atomically (``S`` then unused)."""

            @arena_kernel
            def scatter(G: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                        routed: ti.template(), second: ti.template(), g: F32_2D, zero_n: ti.i32, S: ti.template()):
                for k, i in ti.ndrange(G.shape[0], zero_n):    # overwrite off the CPU: zeros under the adds
                    G[k, at(base, i)] = 0.0
                B = x.shape[0]
                for i in range(n_iterations(B)):
                    start, end = samples(i, B)
                    w_id = i // CPU_CHUNK                   # owns its private tables (add_atomic ignores it)
                    g0 = bounds[gb]
                    for mode, r in ti.static(runs):
                        for l in range(bounds[gb + r], bounds[gb + r + 1]):
                            lv = geometry[l]
                            for b in range(start, end):
                                k = inst[b] if ti.static(routed) else 0
                                xs, dy_l, gs = row(x, b, D, 0), row(dy, b, F, (l - g0) * F), gs_row(second, g, b)
                                if ti.static(private):
                                    level_scatter(add_private, S, base, w_id, k, xs, lv, mode, dy_l, second, gs)
                                else:
                                    level_scatter(add_atomic, G, base, w_id, k, xs, lv, mode, dy_l, second, gs)

            return scatter

        scatter = scatter_kernel(runs)

        C = 1 if interp == "Nearest" else 1 << D

        @ti.func
        def flush(G: ti.template(), base, k, lv, key, sums: ti.template(), c: ti.template()):
            """Add corner c's sums to entry ``key`` of level ``lv`` (none if key < 0): F global atomic adds."""
            if key >= 0:
                e = ti.cast((lv.offset & entry_mask) + (ti.cast(key, ti.u32) & entry_mask), ti.i32) * F
                for f in ti.static(range(F)):
                    ti.atomic_add(G[k, at(base, e + f)], sums[c, f])

        def run_scatter_kernel(runs):
            """The first-order scatter off the CPU of the levels of ``runs``, level after level (the threads
            running at a time share one level's table in the cache), a thread taking ``RUN`` consecutive samples
            of its level: it holds each corner's sum in registers while the next sample touches the same entry
            (of the same network) and adds it to the gradients once the samples move on. Neighbours in the batch
            that are neighbours in space (an image's pixels, samples along a ray) share corners on the coarser
            levels: their adds are summed before they reach global memory (``benchmarks/grid_atomics_model.py``)."""

            @arena_kernel
            def run_scatter(G: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                            routed: ti.template(), zero_n: ti.i32):
                for k, i in ti.ndrange(G.shape[0], zero_n):    # overwrite: zeros under the adds
                    G[k, at(base, i)] = 0.0
                B = x.shape[0]
                n_runs = (B + RUN - 1) // RUN
                g0 = bounds[gb]
                for mode, q in ti.static(runs):
                    # an ndrange: a flat loop with l = first + i // n_runs stopped Taichi 1.7's SPIR-V codegen
                    # ("Not supported") in some configs
                    for l, r in ti.ndrange((bounds[gb + q], bounds[gb + q + 1]), n_runs):
                        start = r * RUN
                        lv = geometry[l]
                        keys, sums, held = ti.Vector([-1] * C, ti.i32), ti.Matrix.zero(ti.f32, C, F), 0
                        for b in range(start, ti.min(start + RUN, B)):
                            k = inst[b] if ti.static(routed) else 0
                            new_keys, values = fn.corner_terms(row(x, b, D, 0), lv, mode, row(dy, b, F, (l - g0) * F),
                                                               False, ti.Vector.zero(ti.f32, D))
                            same_network = ti.select(k == held, 1, 0)
                            for h in ti.static(range(C)):             # the held sums: kept or added
                                kept = 0
                                for c in ti.static(range(C)):
                                    if ti.select(new_keys[c] == keys[h], same_network, 0) > kept:
                                        for f in ti.static(range(F)):
                                            values[c, f] = values[c, f] + sums[h, f]
                                        kept = 1
                                if kept == 0:
                                    flush(G, base, held, lv, keys[h], sums, h)
                            keys, sums, held = new_keys, values, k
                        for h in ti.static(range(C)):
                            flush(G, base, held, lv, keys[h], sums, h)

            return run_scatter

        @arena_kernel
        def reduce_private(G: ARENA, base: ti.i32, S: ti.template(), n: ti.i32, overwrite: ti.template()):
            tasks = (n + CHUNK - 1) // CHUNK        # runs of CHUNK columns: no division by n per column
            for task in range(S.shape[1] * tasks):
                k, c = task // tasks, task % tasks
                for i in range(c * CHUNK, ti.min(c * CHUNK + CHUNK, n)):
                    acc = 0.0 if ti.static(overwrite) else ti.cast(G[k, at(base, i)], ti.f32)
                    for w_id in ti.static(range(n_workers)):
                        acc += S[w_id, k, i]
                        S[w_id, k, i] = 0.0
                    G[k, at(base, i)] = acc

        @ti.func
        def add_owned(G: ti.template(), base, slot, k, i, v):   # the level's owner is the only thread writing there
            G[k, at(base, i)] = G[k, at(base, i)] + v

        @arena_kernel
        def scatter_levels(G: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                           routed: ti.template(), overwrite: ti.template(), second: ti.template(), g: F32_2D):
            """One parallel chunk per level (chunks go to whichever thread is free): its thread owns the
            level's gradients and adds the whole batch into them, sample after sample."""
            B = x.shape[0]
            g0 = bounds[gb]
            L = bounds[gb + R] - g0
            for i in range(L * CPU_CHUNK):
                if i % CPU_CHUNK == 0:
                    l = g0 + i // CPU_CHUNK
                    lv = geometry[l]
                    if ti.static(overwrite):
                        start = base + ti.cast(lv.offset, ti.i32) * F
                        for k in range(G.shape[0]):
                            for j in range(start, start + ti.cast(lv.size, ti.i32) * F):
                                G[k, j] = 0.0
                    for mode, r in ti.static(runs):
                        if bounds[gb + r] <= l < bounds[gb + r + 1]:
                            for b in range(B):
                                k = inst[b] if ti.static(routed) else 0
                                level_scatter(add_owned, G, base, 0, k, row(x, b, D, 0), lv, mode,
                                              row(dy, b, F, (l - g0) * F), second, gs_row(second, g, b))

        @arena_kernel
        def per_sample_backward(weights: ARENA, base: ti.i32, gb: ti.i32, x: F32_2D, inst: I32_1D, dy: F32_2D,
                                dx: F32_2D, routed: ti.template(), second: ti.template(), g: F32_2D, d_dy: F32_2D):
            """dL/dx into dx; with ``second``, dL2/dx into dx and dL2/d(dL/dy) into d_dy for L2 = <g, dL/dx>."""
            B = x.shape[0]
            for i in range(n_iterations(B)):
                start, end = samples(i, B)
                g0 = bounds[gb]
                for b in range(start, end):
                    for d in ti.static(range(D)):
                        dx[b, d] = 0.0
                    if ti.static(second):
                        for j in range((bounds[gb + R] - g0) * F, d_dy.shape[1]):     # the padded columns
                            d_dy[b, j] = 0.0
                for mode, r in ti.static(runs):
                    for l in range(bounds[gb + r], bounds[gb + r + 1]):
                        lv = geometry[l]
                        for b in range(start, end):
                            k = inst[b] if ti.static(routed) else 0
                            xs, dy_l = row(x, b, D, 0), row(dy, b, F, (l - g0) * F)
                            h = ti.Vector.zero(ti.f32, D)
                            if ti.static(second):
                                d_dy_l, h2 = level_second_order(weights, base, k, xs, lv, mode, dy_l, row(g, b, D, 0))
                                h = h2
                                for f in ti.static(range(F)):
                                    d_dy[b, (l - g0) * F + f] = d_dy_l[f]
                            else:
                                h = level_input_gradient(weights, base, k, xs, lv, mode, dy_l)
                            for d in ti.static(range(D)):
                                dx[b, d] = dx[b, d] + h[d]

        def backward_params(grid, G, base, x, inst, dy, routed, overwrite, g=None):
            """dL/dθ of the grid ``grid`` (a ``_grid_tables.Bound``), or with ``g`` (dL2/d(dL/dx)) dL2/dθ, added to the
            gradients ``G`` (written if ``overwrite``: on the CPU by the reduction, elsewhere by a first loop of the first
            kernel that zeroes every network's gradients under the atomic adds)."""
            second = g is not None
            g = g if second else x                  # not read by the first order
            gb, n = grid.gb, grid.n
            zero_n = n if overwrite else 0
            if private:
                with tables.scratch(n_workers, G.shape[0]).filling(grid.scratch) as S:
                    scatter(G, base, gb, x, inst, dy, routed, second, g, 0, S)
                    reduce_private(G, base, S, n, overwrite)
            elif cpu:
                scatter_levels(G, base, gb, x, inst, dy, routed, overwrite, second, g)
            elif block_runs and not routed:
                block_scatter(grid.block_size)(G, base, gb, x, dy, block.n_blocks(x.shape[0]), second, g, zero_n)
                if second:
                    scatter_atomic(G, base, gb, x, inst, dy, routed, second, g, 0, 0)
                elif atomic_runs:
                    run_scatter_atomic(G, base, gb, x, inst, dy, routed, 0)
            elif second or run_scatter is None:
                scatter(G, base, gb, x, inst, dy, routed, second, g, zero_n, 0)
            else:
                run_scatter(G, base, gb, x, inst, dy, routed, zero_n)

        scatter_atomic, run_scatter, run_scatter_atomic, block_kernels = None, None, None, {}
        if not cpu and funcs is level_funcs:    # the grid's corners (the permutohedral encoding's: per sample)
            run_scatter = run_scatter_kernel(runs)
            if block_runs:          # the levels of small tables per block, the others in runs of samples
                scatter_atomic = scatter_kernel(atomic_runs)
                run_scatter_atomic = run_scatter_kernel(atomic_runs)

        def block_scatter(size: int):
            """The per-block sums of levels of at most ``size`` entries (their shared memory is static)."""
            if size not in block_kernels:
                block_kernels[size] = block.block_scatter(D, F, interp, fn, geometry, bounds, block_runs, size)
            return block_kernels[size]

        features = {}

        def features_into_of(rows: tuple):
            """For the grid whose runs start at the table's rows ``rows`` (its last level + 1 last): a func of
            one sample's features for network ``k``, each handed to ``put(sh, tile, q, col0 + column, value)`` (a
            fused MLP kernel's shared tile: the encoding inside the MLP's launch); the padded columns are the
            caller's (0 for grids). Its levels are constants: a fused kernel compiles per geometry."""
            if rows not in features:
                @ti.func
                def features_into(weights: ti.template(), base, k, xs, put: ti.template(), sh: ti.template(), tile,
                                  q, col0):
                    for mode, r in ti.static(runs):
                        for l in range(rows[r], rows[r + 1]):
                            acc = level_features(weights, base, k, xs, geometry[l], mode)
                            for f in ti.static(range(F)):
                                put(sh, tile, q, col0 + (l - rows[0]) * F + f, acc[f])
                features[rows] = features_into
            return features[rows]

        # -- one sample inside a user's kernel --------------------------------------
        def sample_funcs(weights, grads, base: int, rows: tuple, levels: tuple, width: int):
            """``(forward, vjp)`` ti.funcs of one sample of the grid of ``levels`` whose runs start at the table's
            ``rows`` (its features padded to ``width``), reading ``weights[k, base + i]``; the vjp scatters dL/dθ
            into the gradients (``grads``, the store's) atomically unless ``grads`` is None. Weights that are a
            kernel's ndarray argument make the funcs read the levels' geometry from constants, not from the table's
            field: such a kernel (``tinn.deploy``'s AOT module) has its arguments as its only data."""
            with_grads = grads is not None
            constant = ConstantGeometry(levels)

            @ti.func
            def constant_level(l):
                """Row ``l`` of the table as constants (the grid's level ``l - rows[0]``)."""
                return constant[l - rows[0]]

            @ti.func
            def table_level(l):
                return geometry[l]

            level = constant_level if isinstance(weights, AnyArray) else table_level

            @ti.func
            def forward(xs, k=0):
                y = ti.Vector.zero(ti.f32, width)
                for mode, r in ti.static(runs):
                    for l in range(rows[r], rows[r + 1]):
                        acc = one.level_features(weights, base, k, xs, level(l), mode)
                        for f in ti.static(range(F)):
                            y[(l - rows[0]) * F + f] = acc[f]
                return y

            @ti.func
            def vjp(xs, dy, k=0):
                g = ti.Vector.zero(ti.f32, D)
                for mode, r in ti.static(runs):
                    for l in range(rows[r], rows[r + 1]):
                        lv = level(l)
                        dy_l = ti.Vector.zero(ti.f32, F)
                        for f in ti.static(range(F)):
                            dy_l[f] = dy[(l - rows[0]) * F + f]
                        if ti.static(with_grads):
                            one.level_scatter(add_atomic, grads, base, 0, k, xs, lv, mode, dy_l, False, xs)
                        g += one.level_input_gradient(weights, base, k, xs, lv, mode, dy_l)
                return g

            return forward, vjp

        self.private, self.cpu, self.kinds = private, cpu, kinds
        self.forward, self.per_sample_backward, self.backward_params = forward, per_sample_backward, backward_params
        self.features_into_of, self.sample_funcs = features_into_of, sample_funcs
