"""Fully fused MLP kernels for GPUs (the device path on CUDA), in the manner of tcnn's FullyFusedMLP.

A block of ``T`` threads owns a tile of ``T`` samples, one thread per sample, and keeps the tile's
activations in shared memory (``ti.simt.block.SharedArray``, ``(width, T + 1)`` floats: a row per
neuron, padded so that a warp reading one column of a row block hits 32 banks). Weights are streamed
from the parameter store (every thread of a warp reads the same weight: one broadcast load).

* forward, one kernel for all layers: load the input tile (coalesced), then per layer every thread
  computes its sample's ``rows`` outputs in registers, the block synchronises, writes them back as
  the next layer's input; pre-activations (and hidden outputs) are kept for the backward in
  ``(layer, neuron, sample)`` buffers (coalesced stores).
* backward, one kernel for all layers: in overwrite mode a first loop zeroes the MLP's gradients. Then
  each block walks over tiles with its weight-gradient partial sums in registers; per tile and layer,
  deltas and the layer's input tile sit in shared memory, every thread adds its weights' products over
  the tile's samples, then computes its sample's delta of the layer below. After its last tile a
  block adds its partial sums to the gradients: one global atomic add per weight per block.
  The weight gradients are register-tiled: a matrix is cut into ``RT x RT`` blocks of weights (edge
  blocks cover the rows and columns past its edge, whose sums are never written), thread t owns
  blocks ``t, t + T, ...`` of every matrix, and per sample a block loads ``RT`` deltas and ``RT``
  inputs from shared memory for ``RT^2`` products (``2 / RT`` loads per product, not 2).

The kernels are specialised to an MLP's plan (``_mlp_plan.MLPPlan``) and the tile size, and built once
per pair (:func:`fused_kernels`): models of one config share them.

Same math as ``_kernel_mlp`` (whose kernels serve the other archs, network arrays and wider MLPs).
"""
import taichi as ti

from .._kernels import specialised
from . import activations

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)

MAX_WIDTH = 64
"""Widest layer the fused kernels take (two ``(64, T + 1)`` float tiles of shared memory per block)."""

RT = 4
"""Rows and columns of a thread's register tile of weight gradients (``RT^2`` sums per ``2 RT`` loads)."""


def fits(plan) -> bool:
    """Whether the fused kernels take an MLP of this plan (no layer wider than ``MAX_WIDTH``)."""
    return plan.width <= MAX_WIDTH


class FusedKernels:
    """The fused forward and backward kernels of one MLP plan, for tiles of ``T`` samples:
    ``forward(W, off, x, n_threads, keep, zs, hs, y)`` and
    ``backward(W, G, off, x, dy, zs, hs, n_blocks, need_dx, overwrite, dx)`` (module docstring)."""

    def __init__(self, plan, T: int):
        self.T, self.n_layers, self.width = T, len(plan.layers), plan.width
        self.forward = _forward_kernel(plan, T)
        self.backward = _backward_kernel(plan, T)


@specialised
def fused_kernels(plan, T: int) -> FusedKernels:
    """The fused kernels of ``plan`` for tiles of ``T`` samples, built once per Taichi program."""
    return FusedKernels(plan, T)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@ti.func
def _load_tile(tile: ti.template(), x: ti.template(), b0, s, n_in: ti.template(), T: ti.template()):
    """``tile[c, r] = x[b0 + r, c]`` for the block's ``T`` samples (0 past the batch): thread ``s`` reads
    elements ``s, s + T, ...`` of the tile's rows, so a warp reads consecutive memory."""
    for j in range(n_in):
        e = s + j * T
        row, col = e // n_in, e % n_in
        v = 0.0
        if b0 + row < x.shape[0]:
            v = x[b0 + row, col]
        tile[col, row] = v


def _forward_kernel(plan, T):
    layers, width = plan.layers, plan.width
    L, n_in, n_out = len(layers), plan.n_inputs, plan.n_outputs

    @ti.kernel
    def forward(W: ti.template(), off: ti.i32, x: _f32_2d, n_threads: ti.i32, keep: ti.template(),
                zs: _f32_3d, hs: _f32_3d, y: _f32_2d):
        B = x.shape[0]
        ti.loop_config(block_dim=T)
        for i in range(n_threads):
            s = i % T
            b0 = i - s
            a = ti.simt.block.SharedArray((width, T + 1), ti.f32)
            _load_tile(a, x, b0, s, n_in, T)
            ti.simt.block.sync()
            for li in ti.static(range(L)):
                rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                acc = ti.Vector.zero(ti.f32, rows)
                for c in range(cols):
                    h = a[c, s]
                    for r in ti.static(range(rows)):
                        acc[r] += W[0, off + start + r * cols + c] * h
                ti.simt.block.sync()                              # every thread has read its inputs
                for r in ti.static(range(rows)):
                    v = activations.value(layers[li].activation, acc[r])
                    if ti.static(keep):
                        zs[li, r, b0 + s] = acc[r]
                        if ti.static(li < L - 1):
                            hs[li, r, b0 + s] = v
                    a[r, s] = v
                ti.simt.block.sync()
            if b0 + s < B:
                for r in ti.static(range(n_out)):
                    y[b0 + s, r] = a[r, s]
            ti.simt.block.sync()                                  # before a next tile overwrites a

    return forward


def _backward_kernel(plan, T):
    layers = plan.layers
    L, n_in, n_out, n_params = len(layers), plan.n_inputs, plan.n_outputs, plan.n_params
    acts = [layer.activation for layer in layers]
    width = _round_up(plan.width, RT)                             # edge register tiles read past a layer
    col_blocks = [-(-layer.cols // RT) for layer in layers]
    blocks_of = [-(-layer.rows // RT) * n for layer, n in zip(layers, col_blocks)]    # RT x RT blocks per matrix
    per_thread = [-(-n // T) for n in blocks_of]                  # register tiles per thread and matrix
    first = [RT * RT * sum(per_thread[:li]) for li in range(L)]
    total = RT * RT * sum(per_thread)

    @ti.kernel
    def backward(W: ti.template(), G: ti.template(), off: ti.i32, x: _f32_2d, dy: _f32_2d, zs: _f32_3d,
                 hs: _f32_3d, n_blocks: ti.i32, need_dx: ti.template(), overwrite: ti.template(), dx: _f32_2d):
        if ti.static(overwrite):                                      # runs before the loop below
            for j in range(n_params):
                G[0, off + j] = 0.0
        B = x.shape[0]
        n_tiles = (B + T - 1) // T
        ti.loop_config(block_dim=T)
        for i in range(n_blocks * T):
            s = i % T
            block = i // T
            d = ti.simt.block.SharedArray((width, T + 1), ti.f32)      # deltas of the current layer
            h = ti.simt.block.SharedArray((width, T + 1), ti.f32)      # the current layer's input
            sums = ti.Vector.zero(ti.f32, total)
            for k in range((n_tiles - block + n_blocks - 1) // n_blocks):
                b0 = (block + k * n_blocks) * T
                b = b0 + s
                for r in ti.static(range(n_out)):
                    g = 0.0
                    if b < B:
                        g = dy[b, r] * activations.derivative(acts[L - 1], zs[L - 1, r, b])
                    d[r, s] = g
                for li in ti.static(list(reversed(range(L)))):
                    rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                    if ti.static(li > 0):
                        for c in range(cols):
                            h[c, s] = hs[li - 1, c, b]
                    else:
                        _load_tile(h, x, b0, s, n_in, T)
                    ti.simt.block.sync()
                    for j in range(per_thread[li]):                   # dL/dW over the tile's samples
                        u = s + j * T
                        if u < blocks_of[li]:
                            r0, c0 = (u // col_blocks[li]) * RT, (u % col_blocks[li]) * RT
                            acc = ti.Matrix.zero(ti.f32, RT, RT)
                            for q in range(T):
                                dv, hv = ti.Vector.zero(ti.f32, RT), ti.Vector.zero(ti.f32, RT)
                                for a in ti.static(range(RT)):
                                    dv[a], hv[a] = d[r0 + a, q], h[c0 + a, q]
                                acc += dv.outer_product(hv)
                            for a in ti.static(range(RT)):
                                for e in ti.static(range(RT)):
                                    sums[first[li] + (j * RT + a) * RT + e] += acc[a, e]
                    if ti.static(li > 0 or need_dx):
                        below = ti.Vector.zero(ti.f32, cols)            # delta of the layer below
                        for r in range(rows):
                            g = d[r, s]
                            for c in ti.static(range(cols)):
                                below[c] += W[0, off + start + r * cols + c] * g
                        ti.simt.block.sync()                            # d and h are read: overwrite
                        for c in range(cols):
                            v = below[c]
                            if ti.static(li > 0):
                                v *= activations.derivative(acts[li - 1], zs[li - 1, c, b])
                                d[c, s] = v
                            elif b < B:
                                dx[b, c] = v
                    ti.simt.block.sync()
            for li in ti.static(range(L)):
                rows, cols, start = ti.static(layers[li].rows, layers[li].cols, layers[li].start)
                for j in range(per_thread[li]):
                    u = s + j * T
                    if u < blocks_of[li]:
                        r0, c0 = (u // col_blocks[li]) * RT, (u % col_blocks[li]) * RT
                        for a in ti.static(range(RT)):
                            for e in ti.static(range(RT)):
                                if r0 + a < rows and c0 + e < cols:
                                    ti.atomic_add(G[0, off + start + (r0 + a) * cols + c0 + e],
                                                  sums[first[li] + (j * RT + a) * RT + e])

    return backward
