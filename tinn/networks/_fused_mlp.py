"""Fully fused MLP kernels for GPUs (the device path on CUDA), in the manner of tcnn's FullyFusedMLP.

A block of ``T`` threads owns a tile of ``T`` samples, one thread per sample, and keeps the tile's
activations in shared memory (``ti.simt.block.SharedArray``, ``(width, T + 1)`` floats: a row per
neuron, padded so that a warp reading one column of a row block hits 32 banks). Weights are streamed
from the parameter store (every thread of a warp reads the same weight: one broadcast load).

* forward, one kernel for all layers: load the input tile (coalesced), then per layer every thread
  computes its sample's ``rows`` outputs in registers, the block synchronises, writes them back as
  the next layer's input; pre-activations (and hidden outputs) are kept for the backward in
  ``(layer, neuron, sample)`` buffers (coalesced stores).
* backward, one kernel for all layers: in overwrite mode a first loop zeroes the MLP's gradients (every
  network's of an array). Then each block walks over tiles with its weight-gradient partial sums in
  registers; per tile and layer, deltas and the layer's input tile sit in shared memory, every thread
  adds its weights' products over the tile's samples, then computes its sample's delta of the layer
  below. After its last tile a block adds its partial sums to the gradients: one global atomic add per
  weight per block.
  The weight gradients are register-tiled: a matrix is cut into ``RT x RT`` blocks of weights (edge
  blocks cover the rows and columns past its edge, whose sums are never written), thread t owns
  blocks ``t, t + T, ...`` of every matrix, and per sample a block loads ``RT`` deltas and ``RT``
  inputs from shared memory for ``RT^2`` products (``2 / RT`` loads per product, not 2).

Network arrays run the ``*_routed`` kernels: the batch's samples sorted by network into tiles of at
most ``TILE`` samples of one network (``Routing.tiles``: rows ``(start, end, k)`` of samples
``order[start:end]``), a tile cut into ``TILE / T`` *parts* of ``T`` sorted positions, a block per part
in the forward. A block gathers its part's samples (``order[j]``, zero rows past ``end``; an empty part
does nothing) and runs every layer with network k's weights; the saved activations are kept by sorted
position ``j`` (``(layer, neuron, batch)``). In the backward a block walks over a contiguous run of
parts and adds its partial sums to network k's gradients whenever the network changes, and at its end.

The kernels are specialised to an MLP's plan (``_mlp_plan.MLPPlan``), the tile size and whether the
activations are half precision (``half``: every hidden output is rounded to float16 before the next layer
reads it, and the kept buffers are float16, ``tinn.params.KEPT_ACTIVATIONS``), and built once per
combination (:func:`fused_kernels`): models of one config share them.

Same math as ``_kernel_mlp`` (whose kernels serve the other archs and wider MLPs).
"""
import taichi as ti

from .._census import TILE
from .._kernels import ARENA, arena_kernel, cast_to, specialised
from .._types import ANY_3D
from . import activations

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
_i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)

MAX_WIDTH = 64
"""Widest layer the fused kernels take (two ``(64, T + 1)`` float tiles of shared memory per block)."""

RT = 4
"""Rows and columns of a thread's register tile of weight gradients (``RT^2`` sums per ``2 RT`` loads)."""


def fits(plan) -> bool:
    """Whether the fused kernels take an MLP of this plan (no layer wider than ``MAX_WIDTH``)."""
    return plan.width <= MAX_WIDTH


class FusedKernels:
    """The fused forward and backward kernels of one MLP plan, for tiles of ``T`` samples. A single network:
    ``forward(W, off, x, n_threads, keep, zs, hs, y)``,
    ``backward(W, G, off, x, dy, zs, hs, n_blocks, need_dx, overwrite, dx)``; an array routed by ``tiles``
    ``(n_tiles, 3)`` and ``order`` ``(batch,)``: ``forward_routed(W, off, x, tiles, order, keep, zs, hs, y)``,
    ``backward_routed(W, G, off, n_rows, x, dy, zs, hs, tiles, order, n_blocks, need_dx, overwrite, dx)``
    (``n_rows``: the networks whose gradients an overwrite zeroes). ``parts``: blocks per routing tile."""

    def __init__(self, plan, T: int, half: bool = False):
        if TILE % T:
            raise ValueError(f"the fused tile size {T} must divide the routing's tile size {TILE}")
        self.T, self.n_layers, self.width, self.parts = T, len(plan.layers), plan.width, TILE // T
        passes = _Passes(plan, T, half)
        self.forward, self.forward_routed = passes.forward_kernels()
        self.backward, self.backward_routed = passes.backward_kernels()


@specialised
def fused_kernels(plan, T: int, half: bool = False) -> FusedKernels:
    """The fused kernels of ``plan`` for tiles of ``T`` samples (``half``: float16 activations), built once per
    Taichi program."""
    return FusedKernels(plan, T, half)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@ti.func
def _row(order: ti.template(), routed: ti.template(), j):
    """The batch row of sorted position ``j``: ``order[j]`` for an array, ``j`` itself for a single network."""
    b = j
    if ti.static(routed):
        b = order[j]
    return b


@ti.func
def _saved(buf: ti.template(), li, r, j, inside, routed: ti.template()):
    """``buf[li, r, j]``; for an array 0 at a position past its tile (``not inside``: no column there)."""
    v = 0.0
    if ti.static(routed):
        if inside:
            v = buf[li, r, j]
    else:
        v = buf[li, r, j]                                      # a single network's buffers are padded
    return v


@ti.func
def _save(buf: ti.template(), li, r, j, inside, routed: ti.template(), v):
    """``buf[li, r, j] = v`` (in the buffer's dtype); for an array only at a position inside its tile."""
    if ti.static(routed):
        if inside:
            buf[li, r, j] = ti.static(cast_to(buf))(v)
    else:
        buf[li, r, j] = ti.static(cast_to(buf))(v)


@ti.func
def _load_tile(tile: ti.template(), x: ti.template(), order: ti.template(), routed: ti.template(), j0, end, s,
               n_in: ti.template(), T: ti.template()):
    """``tile[c, r] = x[row(j0 + r), c]`` for the block's ``T`` positions (0 from ``end`` on): thread ``s`` reads
    elements ``s, s + T, ...`` of the tile's rows, so a warp reads consecutive memory (a single network's)."""
    for e_ in range(n_in):
        e = s + e_ * T
        row, col = e // n_in, e % n_in
        v = 0.0
        if j0 + row < end:
            v = x[_row(order, routed, j0 + row), col]
        tile[col, row] = v


class _Passes:
    """Builds the kernels of one plan and tile size ``T``: one block's forward or backward over ``T`` sorted
    positions ``j0 .. j0 + T`` (valid below ``end``) of network ``k`` is a ``ti.func``, and each kernel
    maps its blocks onto it (a single network: consecutive tiles; an array: the routing's parts)."""

    def __init__(self, plan, T, half):
        self.plan, self.T, self.half = plan, T, half
        layers = plan.layers
        self.col_blocks = [-(-layer.cols // RT) for layer in layers]
        self.blocks_of = [-(-layer.rows // RT) * n for layer, n in zip(layers, self.col_blocks)]   # RT x RT blocks
        self.per_thread = [-(-n // T) for n in self.blocks_of]           # register tiles per thread and matrix
        self.first = [RT * RT * sum(self.per_thread[:li]) for li in range(len(layers))]
        self.total = RT * RT * sum(self.per_thread)

    def forward_kernels(self):
        plan, T, half = self.plan, self.T, self.half
        layers, width = plan.layers, plan.width
        L, n_in, n_out = len(layers), plan.n_inputs, plan.n_outputs

        @ti.func
        def block(W: ti.template(), off, x: ti.template(), order: ti.template(), routed: ti.template(), j0, end, k,
                  s, a: ti.template(), keep: ti.template(), zs: ti.template(), hs: ti.template(), y: ti.template()):
            j = j0 + s
            inside = j < end
            _load_tile(a, x, order, routed, j0, end, s, n_in, T)
            ti.simt.block.sync()
            for li in ti.static(range(L)):
                rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                acc = ti.Vector.zero(ti.f32, rows)
                for c in range(cols):
                    h = a[c, s]
                    for r in ti.static(range(rows)):
                        acc[r] += W[k, off + start + r * cols + c] * h
                ti.simt.block.sync()                              # every thread has read its inputs
                for r in ti.static(range(rows)):
                    v = activations.value(layers[li].activation, acc[r])
                    if ti.static(half and li < L - 1):            # a hidden output, as the next layer reads it
                        v = ti.cast(ti.cast(v, ti.f16), ti.f32)
                    if ti.static(keep):
                        _save(zs, li, r, j, inside, routed, acc[r])
                        if ti.static(li < L - 1):
                            _save(hs, li, r, j, inside, routed, v)
                    a[r, s] = v
                ti.simt.block.sync()
            if inside:
                for r in ti.static(range(n_out)):
                    y[_row(order, routed, j), r] = a[r, s]

        @arena_kernel
        def forward(W: ARENA, off: ti.i32, x: _f32_2d, n_threads: ti.i32, keep: ti.template(),
                    zs: ANY_3D, hs: ANY_3D, y: _f32_2d):
            B = x.shape[0]
            ti.loop_config(block_dim=T)
            for i in range(n_threads):
                s = i % T
                a = ti.simt.block.SharedArray((width, T + 1), ti.f32)
                block(W, off, x, x, False, i - s, B, 0, s, a, keep, zs, hs, y)
                ti.simt.block.sync()                              # before a next tile overwrites a

        @arena_kernel
        def forward_routed(W: ARENA, off: ti.i32, x: _f32_2d, tiles: _i32_2d, order: _i32_1d,
                           keep: ti.template(), zs: ANY_3D, hs: ANY_3D, y: _f32_2d):
            ti.loop_config(block_dim=T)
            for i in range(tiles.shape[0] * TILE):                # TILE / T blocks per routing tile
                s, t = i % T, i // TILE
                j0, end = tiles[t, 0] + i % TILE - s, tiles[t, 1]
                a = ti.simt.block.SharedArray((width, T + 1), ti.f32)
                if j0 < end:                                      # the same for the whole block
                    block(W, off, x, order, True, j0, end, tiles[t, 2], s, a, keep, zs, hs, y)
                    ti.simt.block.sync()                          # before a next part overwrites a

        return forward, forward_routed

    def backward_kernels(self):
        plan, T = self.plan, self.T
        layers = plan.layers
        L, n_in, n_out, n_params = len(layers), plan.n_inputs, plan.n_outputs, plan.n_params
        acts = [layer.activation for layer in layers]
        width = _round_up(plan.width, RT)                         # edge register tiles read past a layer
        col_blocks, blocks_of, per_thread, first, total = (self.col_blocks, self.blocks_of, self.per_thread,
                                                           self.first, self.total)
        parts = TILE // T

        @ti.func
        def block(W: ti.template(), sums: ti.template(), d: ti.template(), h: ti.template(), off, x: ti.template(),
                  dy: ti.template(), zs: ti.template(), hs: ti.template(), order: ti.template(), routed: ti.template(),
                  j0, end, k, s, need_dx: ti.template(), dx: ti.template()):
            """Adds the block's products over positions ``j0 .. j0 + T`` to ``sums``; writes their dL/dx."""
            j = j0 + s
            inside = j < end
            b = j
            if inside:
                b = _row(order, routed, j)
            for r in ti.static(range(n_out)):
                g = 0.0
                if inside:
                    g = dy[b, r] * activations.derivative(acts[L - 1], _saved(zs, L - 1, r, j, inside, routed))
                d[r, s] = g
            for li in ti.static(list(reversed(range(L)))):
                rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                if ti.static(li > 0):
                    for c in range(cols):
                        h[c, s] = _saved(hs, li - 1, c, j, inside, routed)
                else:
                    _load_tile(h, x, order, routed, j0, end, s, n_in, T)
                ti.simt.block.sync()
                for jt in range(per_thread[li]):                   # dL/dW over the block's samples
                    u = s + jt * T
                    if u < blocks_of[li]:
                        r0, c0 = (u // col_blocks[li]) * RT, (u % col_blocks[li]) * RT
                        acc = ti.Matrix.zero(ti.f32, RT, RT)
                        for q in range(T):
                            dv, hv = ti.Vector.zero(ti.f32, RT), ti.Vector.zero(ti.f32, RT)
                            for e in ti.static(range(RT)):
                                dv[e], hv[e] = d[r0 + e, q], h[c0 + e, q]
                            acc += dv.outer_product(hv)
                        for e in ti.static(range(RT)):
                            for f in ti.static(range(RT)):
                                sums[first[li] + (jt * RT + e) * RT + f] += acc[e, f]
                if ti.static(li > 0 or need_dx):
                    below = ti.Vector.zero(ti.f32, cols)            # delta of the layer below
                    for r in range(rows):
                        g = d[r, s]
                        for c in ti.static(range(cols)):
                            below[c] += W[k, off + start + r * cols + c] * g
                    ti.simt.block.sync()                            # d and h are read: overwrite
                    for c in range(cols):
                        v = below[c]
                        if ti.static(li > 0):
                            v *= activations.derivative(acts[li - 1], _saved(zs, li - 1, c, j, inside, routed))
                            d[c, s] = v
                        elif inside:
                            dx[b, c] = v
                ti.simt.block.sync()

        @ti.func
        def flush(G: ti.template(), off, k, sums: ti.template(), s):
            """Adds the thread's partial sums to network ``k``'s gradients (not the edge tiles' extra sums)."""
            for li in ti.static(range(L)):
                rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                for jt in range(per_thread[li]):
                    u = s + jt * T
                    if u < blocks_of[li]:
                        r0, c0 = (u // col_blocks[li]) * RT, (u % col_blocks[li]) * RT
                        for e in ti.static(range(RT)):
                            for f in ti.static(range(RT)):
                                if r0 + e < rows and c0 + f < cols:
                                    ti.atomic_add(G[k, off + start + (r0 + e) * cols + c0 + f],
                                                  sums[first[li] + (jt * RT + e) * RT + f])

        @arena_kernel
        def backward(W: ARENA, G: ARENA, off: ti.i32, x: _f32_2d, dy: _f32_2d, zs: ANY_3D,
                     hs: ANY_3D, n_blocks: ti.i32, need_dx: ti.template(), overwrite: ti.template(), dx: _f32_2d):
            if ti.static(overwrite):                                  # runs before the loop below
                for p in range(n_params):
                    G[0, off + p] = 0.0
            B = x.shape[0]
            n_tiles = (B + T - 1) // T
            ti.loop_config(block_dim=T)
            for i in range(n_blocks * T):
                s, blk = i % T, i // T
                d = ti.simt.block.SharedArray((width, T + 1), ti.f32)      # deltas of the current layer
                h = ti.simt.block.SharedArray((width, T + 1), ti.f32)      # the current layer's input
                sums = ti.Vector.zero(ti.f32, total)
                for w in range((n_tiles - blk + n_blocks - 1) // n_blocks):
                    block(W, sums, d, h, off, x, dy, zs, hs, x, False, (blk + w * n_blocks) * T, B, 0, s, need_dx, dx)
                flush(G, off, 0, sums, s)

        @arena_kernel
        def backward_routed(W: ARENA, G: ARENA, off: ti.i32, n_rows: ti.i32, x: _f32_2d, dy: _f32_2d,
                            zs: ANY_3D, hs: ANY_3D, tiles: _i32_2d, order: _i32_1d, n_blocks: ti.i32,
                            need_dx: ti.template(), overwrite: ti.template(), dx: _f32_2d):
            if ti.static(overwrite):                                  # runs before the loop below
                for k, p in ti.ndrange(n_rows, n_params):
                    G[k, off + p] = 0.0
            n_parts = tiles.shape[0] * parts
            per = (n_parts + n_blocks - 1) // n_blocks
            ti.loop_config(block_dim=T)
            for i in range(n_blocks * T):
                s, blk = i % T, i // T
                d = ti.simt.block.SharedArray((width, T + 1), ti.f32)
                h = ti.simt.block.SharedArray((width, T + 1), ti.f32)
                sums = ti.Vector.zero(ti.f32, total)
                network = -1                                          # whose products sums holds
                for u in range(blk * per, ti.min(blk * per + per, n_parts)):   # the same for the whole block
                    t = u // parts
                    j0, end, k = tiles[t, 0] + u % parts * T, tiles[t, 1], tiles[t, 2]
                    if j0 < end:
                        if k != network:
                            if network >= 0:
                                flush(G, off, network, sums, s)
                                sums = ti.Vector.zero(ti.f32, total)
                            network = k
                        block(W, sums, d, h, off, x, dy, zs, hs, order, True, j0, end, k, s, need_dx, dx)
                if network >= 0:
                    flush(G, off, network, sums, s)

        return backward, backward_routed
