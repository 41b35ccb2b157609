"""What the fused MLP kernels (``_fused_mlp``) need of a GPU, from an MLP's plan and an arch's tiling, and how
their blocks address shared memory and samples: the shared words of a kernel and whether they fit, whether every
layer's weights stay staged for a run (``resident``), the shared loads per multiply-add of the inner loops, the
bytes kept per sample for the backward; the XOR-swizzled tile addressing (:func:`_at`) and a block's run of
samples (:func:`_run`, :func:`_row`) in each mode.
"""
import taichi as ti

from . import activations
from ._mlp_plan import thread_tile

MAX_WIDTH = 64
"""Widest layer the fused kernels take."""

SINGLE, DENSE, ROUTED = "single", "dense", "routed"
"""How a kernel's blocks find their samples: a single network's runs of tiles, a dense array's networks
(``(K, B_k)``: network k owns positions ``k B_k .. (k + 1) B_k``), a routed array's samples sorted by network."""

DW_PASSES = 4
"""Register tiles a thread may compute one after the other in a weight-gradient product (written to memory
after each, so only one is live)."""

SEGMENTS = 16
"""Partial-sum rows reduced per thread in the first of the two reduction loops (a single network's backward)."""


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class _Layout:
    """Where things live in a kernel's one shared array (float32 words), all static: ``CP`` the row length of
    an activation tile (``S`` rows of samples, the width rounded up to 32), each layer's weight block ``(cols,
    RP_i)`` (transposed: a row per input column) at ``w_base[i]``, and the tiles after them."""

    def __init__(self, plan, tiling, tiles: int, resident: bool):
        layers, S, T = plan.layers, tiling.samples, tiling.threads
        self.CP = _round_up(plan.width, 32)
        most = tiling.register
        self.fwd_tile = [thread_tile(layer.rows, S, T, most=most) for layer in layers]       # rows x samples
        self.dx_tile = [thread_tile(layer.cols, S, T, most=most) for layer in layers]        # cols x samples
        self.dw_tile = [thread_tile(layer.rows, layer.cols, T, DW_PASSES, most) for layer in layers]   # rows x cols
        self.RP = [_round_up(max(layer.rows, g * p), 32) for layer, (g, p, _, _) in zip(layers, self.fwd_tile)]
        sizes = [layer.cols * rp for layer, rp in zip(layers, self.RP)]
        if resident:
            self.w_base = [sum(sizes[:i]) for i in range(len(layers))]
            weights = sum(sizes)
        else:
            self.w_base = [0] * len(layers)
            weights = max(sizes)
        self.tiles = [weights + t * S * self.CP for t in range(tiles)]
        self.words = weights + tiles * S * self.CP


def shared_words(plan, tiling, tiles: int, resident: bool) -> int:
    """Float32 words of shared memory of a kernel with ``tiles`` activation tiles (1 forward, 2 backward)."""
    return _Layout(plan, tiling, tiles, resident).words


def fits(plan, tiling) -> bool:
    """Whether the fused kernels take an MLP of this plan on an arch of this tiling: no layer wider than
    ``MAX_WIDTH`` and the backward's shared array (a layer's weights, deltas and inputs) within the budget."""
    return plan.width <= MAX_WIDTH and 4 * shared_words(plan, tiling, 2, False) <= tiling.shared_bytes


def resident(plan, tiling, tiles: int) -> bool:
    """Whether a kernel with ``tiles`` activation tiles (the forward 1, the backward 2) keeps every layer's weights
    in shared memory for a whole run of tiles, staged once per run (else each layer's once per tile)."""
    return 4 * shared_words(plan, tiling, tiles, True) <= tiling.shared_bytes


def shared_loads_per_fma(plan, tiling) -> dict:
    """Shared-memory loads per multiply-add in the inner loops of each product, from the register tiles the
    kernels use (``pa + pb`` loads per ``pa * pb`` products), and ``total``: the mean weighted by multiply-adds
    per sample of a training step (forward, dW, and dL/dx of every layer but the first)."""
    S = tiling.samples
    out, loads, fmas = {}, 0.0, 0.0
    for i, layer in enumerate(plan.layers):
        T, most = tiling.threads, tiling.register
        for name, (ga, pa, gb, pb), work in (("forward", thread_tile(layer.rows, S, T, most=most), 1),
                                             ("dW", thread_tile(layer.rows, layer.cols, T, DW_PASSES, most), 1),
                                             ("dx", thread_tile(layer.cols, S, T, most=most), int(i > 0))):
            ratio = (pa + pb) / (pa * pb)
            out[f"{name}[{i}]"] = ratio
            macs = layer.rows * layer.cols * work
            loads, fmas = loads + ratio * macs, fmas + macs
    out["total"] = loads / fmas
    return out


def kept_bytes_per_sample(plan, half: bool) -> int:
    """Bytes the forward keeps per sample for the backward: the hidden outputs and the pre-activations of
    :func:`z_layers`, in float16 under half precision."""
    L = len(plan.layers)
    values = sum(layer.rows for layer in plan.layers[:L - 1])
    values += sum(plan.layers[i].rows for i in z_layers(plan))
    return values * (2 if half else 4)


def z_layers(plan) -> list:
    """The layers whose pre-activation the forward keeps: the output layer (its ``dL/dy`` times the output
    activation's slope) and the hidden layers whose activation is not differentiated from its output."""
    L = len(plan.layers)
    return [i for i, layer in enumerate(plan.layers)
            if i == L - 1 or not activations.ACTIVATIONS[layer.activation].from_output]


@ti.func
def _at(a, b, stride: ti.template()):
    """Word of element ``[a, b]`` of a shared tile with rows of ``stride`` words (a multiple of 32): the column
    XOR-ed with the row's low five bits, so that a warp reading along a row or a column hits distinct banks."""
    return a * stride + (b ^ (a & 31))


@ti.func
def _below(i, n: ti.template(), covered: ti.template()):
    """``i < n`` for an output index ``i < covered`` of a register tile: true by construction where the tiles cover
    exactly ``n`` (a compile-time constant then)."""
    inside = 1
    if ti.static(covered > n):
        inside = i < n
    return inside


@ti.func
def _run(mode: ti.template(), blk, n_blocks, n_tiles_total, S: ti.template(), per_network, offsets: ti.template()):
    """``(begin, end, k)``: block ``blk``'s positions ``begin .. end`` of network ``k``."""
    begin, end, k = 0, 0, 0
    if ti.static(mode == SINGLE):
        per = (n_tiles_total + n_blocks - 1) // n_blocks
        begin, end = ti.min(blk * per * S, per_network), ti.min((blk + 1) * per * S, per_network)
    elif ti.static(mode == DENSE):
        begin, end, k = blk * per_network, (blk + 1) * per_network, blk
    else:
        begin, end, k = offsets[0, blk], offsets[0, blk + 1], blk
    return begin, end, k


@ti.func
def _row(order: ti.template(), mode: ti.template(), j):
    """The batch row of position ``j``: ``order[j]`` for a routed array, ``j`` itself otherwise."""
    b = j
    if ti.static(mode == ROUTED):
        b = order[j]
    return b
