"""What the fused MLP kernels (``_fused_mlp``) need of a GPU, from an MLP's plan and an arch's tiling, and how
their blocks address shared memory and samples: the shared words of a kernel and whether they fit, whether every
layer's weights stay staged for a run (``resident``), the shared loads per multiply-add of the inner loops, the
bytes kept per sample for the backward; the XOR-swizzled tile addressing (:func:`_at`), a block's run of
samples (:func:`_run`, :func:`_row`) in each mode, and the moves into a block's shared array (:func:`stager`,
:func:`row_loader`, :func:`kept_loader`, :func:`encoding_loader`).
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


@ti.func
def _put(y: ti.template(), order: ti.template(), mode: ti.template(), j, per_network, r, v):
    """``y[row(j), r] = v``; outputs ``y`` in a dense batch's ``(K, B_k, n)`` layout take position ``j`` at
    ``[j // B_k, j % B_k]`` (``per_network = B_k``)."""
    if ti.static(len(y.shape) == 3):
        y[j // per_network, j % per_network, r] = v
    else:
        y[_row(order, mode, j), r] = v


# -- moves into a block's shared array: thread ``s`` of ``T`` takes elements ``s, s + T, ...`` --------------------
def stager(plan, tiling, lay):
    """``stage(W, off, k, sh, s, li)``: layer ``li``'s weights of network ``k`` into its block of ``sh``
    (transposed: ``sh[w_base + at(c, r)] = W[k, off + start + r cols + c]``; a coalesced read)."""
    T = tiling.threads

    @ti.func
    def stage(W: ti.template(), off, k, sh: ti.template(), s, li: ti.template()):
        rows, cols, start = ti.static(plan.layers[li].rows, plan.layers[li].cols, plan.layers[li].start)
        base, RP = ti.static(lay.w_base[li], lay.RP[li])
        for i in range((rows * cols + T - 1) // T):
            e = s + i * T
            if e < rows * cols:
                r, c = e // cols, e % cols
                sh[base + _at(c, r, RP)] = ti.cast(W[k, off + start + e], ti.f32)
    return stage


def row_loader(tiling, lay):
    """``load(sh, tile, a, mode, order, j0, end, s, n)``: ``tile[s, c] = a[row(j0 + s), c]`` for ``c < n``
    (0 past ``end``): consecutive memory."""
    S, T, CP = tiling.samples, tiling.threads, lay.CP

    @ti.func
    def load(sh: ti.template(), tile: ti.template(), a: ti.template(), mode: ti.template(), order: ti.template(),
             j0, end, s, n: ti.template()):
        for i in range((S * n + T - 1) // T):
            e = s + i * T
            if e < S * n:
                q, c = e // n, e % n
                v = 0.0
                if j0 + q < end:
                    v = a[_row(order, mode, j0 + q), c]
                sh[tile + _at(q, c, CP)] = v
    return load


def kept_loader(tiling, lay):
    """``load(sh, tile, buf, li, j0, end, s, n)``: ``tile[s, c] = buf[li, c, j0 + s]`` (0 past ``end``): thread
    ``s`` reads positions ``s, s + T, ...`` of each neuron (consecutive memory)."""
    S, T, CP = tiling.samples, tiling.threads, lay.CP

    @ti.func
    def load(sh: ti.template(), tile: ti.template(), buf: ti.template(), li, j0, end, s, n: ti.template()):
        for i in range((S * n + T - 1) // T):
            e = s + i * T
            if e < S * n:
                c, q = e // S, e % S
                v = 0.0
                if j0 + q < end:
                    v = ti.cast(buf[li, c, j0 + q], ti.f32)
                sh[tile + _at(q, c, CP)] = v
    return load


def encoding_loader(tiling, lay, encoder: tuple, n_in: int):
    """``load(sh, tile, W, base, x, mode, order, j0, end, s, k)``: ``tile[s, :]`` the features of ``x[row(j0 + s)]``
    for network ``k`` (0 past ``end``), from ``encoder = (features_into, n_raw, n_features, fill)``: an encoding's
    in-kernel writer (``Encoding._features_into``, parameters ``W[k, base + i]``), its input and raw output widths
    and the value of its padded columns up to ``n_in``. Thread ``s`` encodes the tile's samples ``s, s + T, ...``,
    so that the MLP reads the encoding without a batch of features in between."""
    S, T, CP = tiling.samples, tiling.threads, lay.CP
    features_into, n_raw, n_features, fill = encoder

    @ti.func
    def put(sh: ti.template(), tile, q, c, v):
        sh[tile + _at(q, c, CP)] = v

    @ti.func
    def load(sh: ti.template(), tile: ti.template(), W: ti.template(), base, x: ti.template(), mode: ti.template(),
             order: ti.template(), j0, end, s, k):
        for i in range((S + T - 1) // T):
            q = s + i * T
            if q < S:
                if j0 + q < end:
                    b = _row(order, mode, j0 + q)
                    xs = ti.Vector.zero(ti.f32, n_raw)
                    for d in ti.static(range(n_raw)):
                        xs[d] = x[b, d]
                    features_into(W, base, k, xs, put, sh, tile, q, 0)
                    for c in ti.static(range(n_features, n_in)):
                        put(sh, tile, q, c, fill)
                else:
                    for c in range(n_in):
                        put(sh, tile, q, c, 0.0)
    return load
