"""Fully fused MLP kernels for GPUs (the device path on CUDA), in the manner of tcnn's FullyFusedMLP.

A block of ``T`` threads owns a tile of ``T`` samples, one thread per sample, and keeps the tile's
activations in shared memory (``ti.simt.block.SharedArray``, ``(width, T + 1)`` floats: a row per
neuron, padded so that a warp reading one column of a row block hits 32 banks). Weights are streamed
from the parameter store (every thread of a warp reads the same weight: one broadcast load).

* forward, one kernel for all layers: load the input tile (coalesced), then per layer every thread
  computes its sample's ``rows`` outputs in registers, the block synchronises, writes them back as
  the next layer's input; pre-activations (and hidden outputs) are kept for the backward in
  ``(layer, neuron, sample)`` buffers (coalesced stores).
* backward, one kernel for all layers: each block walks over tiles with its weight-gradient partial
  sums in registers (thread t owns weights ``t, t + T, ...`` of every matrix); per tile and layer,
  deltas and the layer's input tile sit in shared memory, every thread adds its weights' products over
  the tile's samples, then computes its sample's delta of the layer below. After its last tile a
  block adds its partial sums to the gradients: one global atomic add per weight per block.

Same math as ``_kernel_mlp`` (whose kernels serve the other archs, network arrays and wider MLPs).
"""
import taichi as ti

from . import activations

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)

MAX_WIDTH = 64
"""Widest layer the fused kernels take (two ``(64, T + 1)`` float tiles of shared memory per block)."""


def fits(mlp) -> bool:
    return max(max(r, c) for r, c in mlp.layer_sizes()) <= MAX_WIDTH


class FusedKernels:
    """The fused forward and backward kernels of one MLP layout, for tiles of ``T`` samples."""

    def __init__(self, n_in: int, layers, acts, T: int):
        """``layers``: ``(rows, cols, start)`` per matrix (the output matrix with only the computed rows);
        ``acts``: the activation of each layer."""
        self.T, self.n_layers = T, len(layers)
        self.width = max(max(r, c) for r, c, _ in layers)
        self.forward = _forward_kernel(n_in, layers, acts, T, self.width)
        self.backward = _backward_kernel(n_in, layers, acts, T, self.width)


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


def _forward_kernel(n_in, layers, acts, T, width):
    L, n_out = len(layers), layers[-1][0]

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
                rows, cols, start = ti.static(layers[li][0], layers[li][1], layers[li][2])
                acc = ti.Vector.zero(ti.f32, rows)
                for c in range(cols):
                    h = a[c, s]
                    for r in ti.static(range(rows)):
                        acc[r] += W[0, off + start + r * cols + c] * h
                ti.simt.block.sync()                              # every thread has read its inputs
                for r in ti.static(range(rows)):
                    v = activations.value(acts[li], acc[r])
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


def _backward_kernel(n_in, layers, acts, T, width):
    L, n_out = len(layers), layers[-1][0]
    per_thread = [-(-(r * c) // T) for r, c, _ in layers]        # weight-gradient sums per thread and matrix
    first, total = [sum(per_thread[:li]) for li in range(L)], sum(per_thread)

    @ti.kernel
    def backward(W: ti.template(), G: ti.template(), off: ti.i32, x: _f32_2d, dy: _f32_2d, zs: _f32_3d,
                 hs: _f32_3d, n_blocks: ti.i32, need_dx: ti.template(), dx: _f32_2d):
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
                    rows, cols, start = ti.static(layers[li][0], layers[li][1], layers[li][2])
                    if ti.static(li > 0):
                        for c in range(cols):
                            h[c, s] = hs[li - 1, c, b]
                    else:
                        _load_tile(h, x, b0, s, n_in, T)
                    ti.simt.block.sync()
                    for j in range(per_thread[li]):                   # dL/dW over the tile's samples
                        w = s + j * T
                        if w < rows * cols:
                            r, c = w // cols, w % cols
                            acc = 0.0
                            for q in range(T):
                                acc += d[r, q] * h[c, q]
                            sums[first[li] + j] += acc
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
                rows, cols, start = ti.static(layers[li][0], layers[li][1], layers[li][2])
                for j in range(per_thread[li]):
                    w = s + j * T
                    if w < rows * cols:
                        ti.atomic_add(G[0, off + start + w], sums[first[li] + j])

    return backward
