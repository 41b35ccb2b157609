"""Fully fused, register-blocked MLP kernels for GPUs (the device path on CUDA, Vulkan and Metal).

A block of ``T`` threads works through *runs* of sample tiles: ``S`` samples of one network at a time, with
the tile's activations, the layer's weights and (backward) its deltas in one shared-memory array. Every
product is a small GEMM in which each thread owns a register tile of ``pa x pb`` outputs (indexed only
statically, so it lives in registers) and reads ``pa + pb`` shared values per ``pa * pb`` multiply-adds::

    forward, layer i (rows R, cols C):  z[r, s] = sum_c W_i[r, c] h[c, s]        thread tile: rows x samples
    backward:  dW_i[r, c] += sum_s d[r, s] h[c, s]                                 thread tile: rows x cols
               d_below[c, s] = act'(h[c, s]) * sum_r W_i[r, c] d[r, s]            thread tile: cols x samples

``_mlp_plan.FusedTiling`` holds the sizes per arch (``S``, ``T``, blocks, shared-memory budget) and
``_mlp_plan.thread_tile`` the register tile of each product; ``_fused_layout.shared_loads_per_fma`` counts the
shared loads per multiply-add of the inner loops from the same choices. Shared arrays are laid out row by row
with the column index XOR-ed with the row's low five bits (``_fused_layout._at``), so that a warp reading a row or
a column of a tile hits distinct banks.

Weights: each kernel stages every layer's weights once per run of tiles when they fit beside its activation
tiles (``resident``: the forward's one tile; the backward's two, the deltas and the layer's input), else each
layer's once per tile.

Kept for the backward (``(layer, neuron, position)`` buffers, float16 under half precision): the hidden layers'
outputs ``hs``; pre-activations ``zs`` only of the output layer and of hidden layers whose activation is not
differentiated from its output (``activations.Activation.from_output``: ReLU, LeakyReLU and None are).

Weight gradients are written without atomics: a single network's batch is cut into ``blocks`` contiguous
runs, each block writes its sums into its own row of a partials buffer (split-K), and two more loops of the
same kernel reduce the rows in a fixed order; an array's block owns whole networks (a dense batch's network
``k`` is block ``k``; a routed batch's network ``k`` is the ``k``-th run of its samples sorted by network) and
writes that network's gradients itself. Two runs of a step give bit-identical gradients.

An inference may run an encoding inside the forward (:meth:`FusedKernels.encoded_forward`): a tile's samples are
encoded into its shared tile by the encoding's in-kernel writer (a grid's per-level formulas), and the outputs of
a dense batch are written in its ``(K, B_k, n)`` layout, so an inference is the census and this one kernel.

The kernels are specialised to an MLP's plan, the tiling and whether the activations are half precision
(``half``: every hidden output is rounded to float16 before the next layer reads it), and built once per
combination (:func:`fused_kernels`): models of one config share them.
"""
import taichi as ti

from ..runtime.kernels import ARENA, arena_kernel, cast_to, specialised
from ..runtime.types import ANY_3D, F32_2D, F32_ANY, I32_1D, I32_2D
from . import activations
from ._fused_layout import (SEGMENTS, SINGLE, _at, _below, _Layout, _put, _row, _run, encoding_loader, kept_loader,
                            resident, row_loader, stager, z_layers)


class FusedKernels:
    """The fused forward and backward of one MLP plan and tiling. Both take how their blocks find samples
    (``mode``: ``_fused_layout``'s ``SINGLE``, ``DENSE``, ``ROUTED``) and the run arguments of that mode:
    ``n_blocks``, ``per_network`` (dense ``B_k``), ``order`` ``(batch,)`` and ``offsets`` ``(2, K + 1)`` (routed:
    the samples sorted by network, ``offsets[0]`` each network's first sorted position)::

        forward(W, off, x, mode, n_blocks, per_network, order, offsets, keep, zs, hs, y, base)
        backward(W, G, off, n_rows, x, dy, zs, hs, mode, n_blocks, per_network, order, offsets, partials,
                 sums, need_dx, overwrite, dx)

    ``y`` is ``(batch, n_outputs)``, or a dense batch's ``(K, B_k, n_outputs)``; ``base`` is the column of an encoding
    run inside (:meth:`encoded_forward`; 0 otherwise). ``zs`` ``(len(z_layers), z_rows, batch)`` and ``hs``
    ``(L - 1, width, batch)`` are indexed by position (sorted position for a routed array); ``partials`` ``(n_blocks, n_params)`` and ``sums`` ``(SEGMENTS, n_params)``
    float32 (a single network's split-K rows)."""

    def __init__(self, plan, tiling, half: bool = False):
        self.plan, self.tiling = plan, tiling
        self.S, self.T, self.n_layers, self.width = tiling.samples, tiling.threads, len(plan.layers), plan.width
        self.z_layers = z_layers(plan)
        self.z_rows = max(plan.layers[i].rows for i in self.z_layers)
        self.resident = {"forward": resident(plan, tiling, 1), "backward": resident(plan, tiling, 2)}
        self._passes, self._encoded = _Passes(plan, tiling, half, self.resident, self.z_layers), {}
        self.forward = self._passes.forward_kernel()
        self.backward = self._passes.backward_kernel()

    def encoded_forward(self, encoder: tuple):
        """The forward with an encoding inside (``_fused_layout.encoding_loader``'s ``encoder``, of the encoding's
        config: models of one config share it): ``x`` is the encoding's input, ``base`` its parameters' column."""
        if encoder not in self._encoded:
            self._encoded[encoder] = self._passes.forward_kernel(encoder)
        return self._encoded[encoder]


@specialised
def fused_kernels(plan, tiling, half: bool = False) -> FusedKernels:
    """The fused kernels of ``plan`` on an arch of ``tiling`` (``half``: float16 activations), built once per
    Taichi program."""
    return FusedKernels(plan, tiling, half)


class _Passes:
    """Builds the two kernels of one plan and tiling; every product is a ``ti.func`` over static sizes."""

    def __init__(self, plan, tiling, half, resident, zl):
        self.plan, self.tiling, self.half, self.resident = plan, tiling, half, resident
        self.z_index = {li: n for n, li in enumerate(zl)}          # layer -> row of zs

    # -- forward ------------------------------------------------------------------------------------------
    def forward_kernel(self, encoder=None):
        """The forward; with ``encoder`` (``_fused_layout.encoding_loader``'s) its ``x`` is the encoding's input,
        encoded sample by sample into each tile, the encoding's parameters at column ``base`` of ``W``."""
        plan, tiling, half = self.plan, self.tiling, self.half
        layers = plan.layers
        L, n_in = len(layers), plan.n_inputs
        S, T = tiling.samples, tiling.threads
        resident_, z_index = self.resident["forward"], self.z_index
        lay = _Layout(plan, tiling, 1, resident_)
        CP, A, words = lay.CP, lay.tiles[0], lay.words
        stage, load = stager(plan, tiling, lay), row_loader(tiling, lay)
        encoded = encoder is not None
        load_encoded = encoding_loader(tiling, lay, encoder, n_in) if encoded else None
        acts = [layer.activation for layer in layers]

        @ti.func
        def layer_pass(sh: ti.template(), li: ti.template(), s, j0, end, n, mode: ti.template(), order: ti.template(),
                       keep: ti.template(), zs: ti.template(), hs: ti.template(), y: ti.template()):
            """Layer ``li`` of the tile in ``sh``: its outputs replace the tile's inputs (or go to ``y``)."""
            rows, cols = ti.static(layers[li].rows, layers[li].cols)
            ga, pa, gb, pb = ti.static(lay.fwd_tile[li])
            base, RP = ti.static(lay.w_base[li], lay.RP[li])
            ra, sb = s // gb, s % gb
            acc = ti.Matrix.zero(ti.f32, pa, pb)
            if ra < ga:
                for c in range(cols):
                    w, h = ti.Vector.zero(ti.f32, pa), ti.Vector.zero(ti.f32, pb)
                    for e in ti.static(range(pa)):
                        w[e] = sh[base + _at(c, ra + ga * e, RP)]
                    for f in ti.static(range(pb)):
                        h[f] = sh[A + _at(sb + gb * f, c, CP)]
                    for e in ti.static(range(pa)):
                        for f in ti.static(range(pb)):
                            acc[e, f] += w[e] * h[f]
            ti.simt.block.sync()                                   # every thread has read the layer's inputs
            if ra < ga:
                for e in ti.static(range(pa)):
                    r = ra + ga * e
                    if _below(r, rows, ga * pa):
                        for f in ti.static(range(pb)):
                            q = sb + gb * f
                            z = acc[e, f]
                            v = z                                  # the output layer: its pre-activation
                            if ti.static(li < L - 1):
                                v = activations.value(acts[li], z)
                                if ti.static(half):                # a hidden output, as the next layer reads it
                                    v = ti.cast(ti.cast(v, ti.f16), ti.f32)
                                if ti.static(keep and li in z_index):
                                    if j0 + q < end:
                                        zs[z_index[li], r, j0 + q] = ti.static(cast_to(zs))(z)
                            sh[A + _at(q, r, CP)] = v
            ti.simt.block.sync()
            if ti.static(li == L - 1 or keep):                     # the tile's rows out, coalesced
                for i in range((S * rows + T - 1) // T):
                    e = s + i * T
                    r, q = e // S, e % S
                    if r < rows and j0 + q < end:
                        v = sh[A + _at(q, r, CP)]
                        if ti.static(li == L - 1):
                            _put(y, order, mode, j0 + q, n, r, activations.value(acts[li], v))
                            if ti.static(keep):
                                zs[z_index[li], r, j0 + q] = ti.static(cast_to(zs))(v)
                        else:
                            hs[li, r, j0 + q] = ti.static(cast_to(hs))(v)
                if ti.static(li == L - 1):
                    ti.simt.block.sync()                           # before the next tile's inputs

        @arena_kernel
        def forward(W: ARENA, off: ti.i32, x: F32_2D, mode: ti.template(), n_blocks: ti.i32, per_network: ti.i32,
                    order: I32_1D, offsets: I32_2D, keep: ti.template(), zs: ANY_3D, hs: ANY_3D, y: F32_ANY,
                    base: ti.i32):
            n_tiles = (x.shape[0] + S - 1) // S
            ti.loop_config(block_dim=T)
            for i in range(n_blocks * T):
                s, blk = i % T, i // T
                sh = ti.simt.block.SharedArray((words,), ti.f32)
                n = per_network
                if ti.static(mode == SINGLE):
                    n = x.shape[0]
                begin, end, k = _run(mode, blk, n_blocks, n_tiles, S, n, offsets)
                if ti.static(resident_):
                    if begin < end:                                # the same for the whole block
                        for li in ti.static(range(L)):
                            stage(W, off, k, sh, s, li)
                for t in range((end - begin + S - 1) // S):
                    j0 = begin + t * S
                    if ti.static(encoded):
                        load_encoded(sh, A, W, base, x, mode, order, j0, end, s, k)
                    else:
                        load(sh, A, x, mode, order, j0, end, s, n_in)
                    if ti.static(resident_):
                        ti.simt.block.sync()
                    for li in ti.static(range(L)):
                        if ti.static(not resident_):
                            stage(W, off, k, sh, s, li)
                            ti.simt.block.sync()
                        layer_pass(sh, li, s, j0, end, n, mode, order, keep, zs, hs, y)

        return forward

    # -- backward -----------------------------------------------------------------------------------------
    def backward_kernel(self):
        plan, tiling = self.plan, self.tiling
        layers = plan.layers
        L, n_in, n_out, n_params, padding = len(layers), plan.n_inputs, plan.n_outputs, plan.n_params, plan.padding_start
        S, T = tiling.samples, tiling.threads
        resident_ = self.resident["backward"]
        lay = _Layout(plan, tiling, 2, resident_)
        CP, D, H, words = lay.CP, lay.tiles[0], lay.tiles[1], lay.words
        stage, load_rows, load_kept = stager(plan, tiling, lay), row_loader(tiling, lay), kept_loader(tiling, lay)
        z_index = self.z_index
        acts = [layer.activation for layer in layers]
        from_output = [activations.ACTIVATIONS[a].from_output for a in acts]

        @ti.func
        def output_deltas(sh: ti.template(), dy: ti.template(), zs: ti.template(), mode: ti.template(),
                          order: ti.template(), j0, end, s):
            """``D[s, r] = out_act'(z[r]) dL/dy[r]`` for the tile's positions (0 past ``end``)."""
            for i in range((S * n_out + T - 1) // T):
                e = s + i * T
                if e < S * n_out:
                    r, q = e // S, e % S
                    v = 0.0
                    if j0 + q < end:
                        z = ti.cast(zs[z_index[L - 1], r, j0 + q], ti.f32)
                        v = dy[_row(order, mode, j0 + q), r] * activations.derivative(acts[L - 1], z)
                    sh[D + _at(q, r, CP)] = v

        @ti.func
        def weight_grads(sh: ti.template(), li: ti.template(), s, target: ti.template(), row, col0):
            """``target[row, col0 + start + r cols + c] += sum_s D[s, r] H[s, c]``: each thread its register tiles, with
            plain loads and stores (the thread owns those entries)."""
            rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
            ga, pa, gb, pb = ti.static(lay.dw_tile[li])
            for u in range((ga * gb + T - 1) // T):
                g = s + u * T
                ra, cb = g // gb, g % gb
                if ra < ga:
                    acc = ti.Matrix.zero(ti.f32, pa, pb)
                    for q in range(S):
                        d, h = ti.Vector.zero(ti.f32, pa), ti.Vector.zero(ti.f32, pb)
                        for e in ti.static(range(pa)):
                            d[e] = sh[D + _at(q, ra + ga * e, CP)]
                        for f in ti.static(range(pb)):
                            h[f] = sh[H + _at(q, cb + gb * f, CP)]
                        for e in ti.static(range(pa)):
                            for f in ti.static(range(pb)):
                                acc[e, f] += d[e] * h[f]
                    for e in ti.static(range(pa)):
                        for f in ti.static(range(pb)):
                            r, c = ra + ga * e, cb + gb * f
                            if _below(r, rows, ga * pa) and _below(c, cols, gb * pb):
                                p = col0 + start + r * cols + c
                                target[row, p] = target[row, p] + acc[e, f]

        @ti.func
        def input_grads(sh: ti.template(), li: ti.template(), s, k, j0, end, mode: ti.template(), order: ti.template(),
                        zs: ti.template(), dx: ti.template()):
            """The delta of the layer below, ``act'_{li-1} * sum_r W[r, c] D[s, r]`` (or dL/dx for ``li == 0``):
            computed in registers, then, once every thread has read D and H, written over D (or to ``dx``)."""
            rows, cols = ti.static(layers[li].rows, layers[li].cols)
            ga, pa, gb, pb = ti.static(lay.dx_tile[li])
            base, RP = ti.static(lay.w_base[li], lay.RP[li])
            ca, sb = s // gb, s % gb
            acc = ti.Matrix.zero(ti.f32, pa, pb)
            if ca < ga:
                for r in range(rows):
                    w, d = ti.Vector.zero(ti.f32, pa), ti.Vector.zero(ti.f32, pb)
                    for e in ti.static(range(pa)):
                        w[e] = sh[base + _at(ca + ga * e, r, RP)]
                    for f in ti.static(range(pb)):
                        d[f] = sh[D + _at(sb + gb * f, r, CP)]
                    for e in ti.static(range(pa)):
                        for f in ti.static(range(pb)):
                            acc[e, f] += w[e] * d[f]
                if ti.static(li > 0):
                    for e in ti.static(range(pa)):
                        c = ca + ga * e
                        if _below(c, cols, ga * pa):
                            for f in ti.static(range(pb)):
                                q = sb + gb * f
                                if ti.static(from_output[li - 1]):
                                    acc[e, f] *= activations.derivative(acts[li - 1], sh[H + _at(q, c, CP)])
                                elif j0 + q < end:
                                    z = ti.cast(zs[z_index[li - 1], c, j0 + q], ti.f32)
                                    acc[e, f] *= activations.derivative(acts[li - 1], z)
            ti.simt.block.sync()                                   # D and H are read: overwrite D
            if ca < ga:
                for e in ti.static(range(pa)):
                    c = ca + ga * e
                    if _below(c, cols, ga * pa):
                        for f in ti.static(range(pb)):
                            sh[D + _at(sb + gb * f, c, CP)] = acc[e, f]
            if ti.static(li == 0):                                 # dL/dx out of D, coalesced
                ti.simt.block.sync()
                for i in range((S * cols + T - 1) // T):
                    e = s + i * T
                    q, c = e // cols, e % cols
                    if q < S and j0 + q < end:
                        dx[_row(order, mode, j0 + q), c] = sh[D + _at(q, c, CP)]

        @ti.func
        def tile_pass(W: ti.template(), G: ti.template(), P: ti.template(), off, k, blk, sh: ti.template(), s,
                      j0, end, x: ti.template(), dy: ti.template(), zs: ti.template(), hs: ti.template(),
                      mode: ti.template(), order: ti.template(), need_dx: ti.template(), dx: ti.template()):
            """Every layer of one tile, from the output down: its weight-gradient sums and its deltas."""
            output_deltas(sh, dy, zs, mode, order, j0, end, s)
            for li in ti.static(list(reversed(range(L)))):
                if ti.static(not resident_):
                    stage(W, off, k, sh, s, li)
                if ti.static(li > 0):
                    load_kept(sh, H, hs, li - 1, j0, end, s, layers[li].cols)
                else:
                    load_rows(sh, H, x, mode, order, j0, end, s, n_in)
                ti.simt.block.sync()
                if ti.static(mode == SINGLE):
                    weight_grads(sh, li, s, P, blk, 0)
                else:
                    weight_grads(sh, li, s, G, k, off)
                if ti.static(li > 0 or need_dx):
                    input_grads(sh, li, s, k, j0, end, mode, order, zs, dx)
                ti.simt.block.sync()

        @ti.func
        def clear(target: ti.template(), row, col0, s, lo: ti.template(), hi: ti.template()):
            """``target[row, col0 + lo : col0 + hi] = 0`` by the block's threads."""
            for i in range((hi - lo + T - 1) // T):
                p = lo + s + i * T
                if p < hi:
                    target[row, col0 + p] = 0.0

        @arena_kernel
        def backward(W: ARENA, G: ARENA, off: ti.i32, n_rows: ti.i32, x: F32_2D, dy: F32_2D, zs: ANY_3D, hs: ANY_3D,
                     mode: ti.template(), n_blocks: ti.i32, per_network: ti.i32, order: I32_1D, offsets: I32_2D,
                     partials: F32_2D, sums: F32_2D, need_dx: ti.template(), overwrite: ti.template(), dx: F32_2D):
            n_tiles = (x.shape[0] + S - 1) // S
            ti.loop_config(block_dim=T)
            for i in range(n_blocks * T):
                s, blk = i % T, i // T
                sh = ti.simt.block.SharedArray((words,), ti.f32)
                n = per_network
                if ti.static(mode == SINGLE):
                    n = x.shape[0]
                begin, end, k = _run(mode, blk, n_blocks, n_tiles, S, n, offsets)
                if ti.static(mode == SINGLE):
                    clear(partials, blk, 0, s, 0, padding)         # the block's row of partial sums
                elif ti.static(overwrite):
                    clear(G, k, off, s, 0, n_params)               # the network's gradients (and padding rows)
                if ti.static(resident_):
                    if begin < end:                                # (read after the first tile's sync)
                        for li in ti.static(range(L)):
                            stage(W, off, k, sh, s, li)
                for t in range((end - begin + S - 1) // S):        # (the first tile synchronises before adding)
                    tile_pass(W, G, partials, off, k, blk, sh, s, begin + t * S, end, x, dy, zs, hs, mode,
                              order, need_dx, dx)
            if ti.static(mode == SINGLE):                          # split-K: the blocks' rows, in a fixed order
                for g, p in ti.ndrange(SEGMENTS, padding):
                    v = 0.0
                    for u in range((n_blocks - g + SEGMENTS - 1) // SEGMENTS):
                        v += partials[g + u * SEGMENTS, p]
                    sums[g, p] = v
                for p in range(n_params):
                    v = 0.0
                    if ti.static(not overwrite):
                        v = G[0, off + p]
                    if p < padding:
                        for g in ti.static(range(SEGMENTS)):
                            v += sums[g, p]
                    G[0, off + p] = v

        return backward
