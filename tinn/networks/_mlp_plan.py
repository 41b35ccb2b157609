"""The MLP's layout, written once: which matrices, where each starts, which rows are computed, which
activation follows. Every backend (host BLAS, per-layer kernels, fused kernels, per-sample ``ti.func``s)
reads it; none derives it again.

Parameters are the matrices in order, each row-major: ``W_0`` (H x n_in), ``NL - 1`` times H x H, then
``W_NL`` (P x H, P the output width padded to 16; NL = 0: one P x n_in matrix). Of ``W_NL`` only the
first ``n_output_dims`` rows are computed: the padded outputs are no part of the result and their rows'
gradients are zero, as in tcnn. A layer's computed weights are therefore the contiguous columns
``[start, start + rows * cols)`` of the MLP's parameters, and the padding rows are ``[padding_start, n_params)``.

The plan is a frozen, hashable value: models of one config have equal plans, and kernels specialised
to a plan (``tinn.runtime.kernels.specialised``) are built once for all of them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerPlan:
    """One matrix: ``z = W h`` with ``W`` ``(rows, cols)`` (``rows`` computed), then ``activation`` (a name of
    ``activations.ACTIVATIONS``); ``W[r, c]`` is parameter ``start + r * cols + c`` of the MLP, which stores
    ``stored_rows`` rows (more than ``rows`` only for the padded output matrix)."""

    rows: int
    cols: int
    start: int
    activation: str
    stored_rows: int

    @property
    def end(self) -> int:
        """One past the layer's last computed weight."""
        return self.start + self.rows * self.cols


@dataclass(frozen=True)
class MLPPlan:
    """The layers of an MLP (``layers[-1]`` the output matrix, its computed rows only), the widest layer
    (``width``: inputs or outputs) and the parameter count with the padding rows (``n_params``)."""

    layers: tuple
    width: int
    n_params: int

    @classmethod
    def build(cls, n_inputs: int, n_outputs: int, padded_outputs: int, n_neurons: int, n_hidden_layers: int,
              activation: str, output_activation: str) -> "MLPPlan":
        """The plan of ``n_inputs -> n_neurons x n_hidden_layers -> n_outputs`` (stored as ``padded_outputs``)."""
        widths = [n_inputs] + [n_neurons] * n_hidden_layers
        layers, start = [], 0
        for i, cols in enumerate(widths):
            last = i == len(widths) - 1
            rows = n_outputs if last else widths[i + 1]
            stored = padded_outputs if last else rows
            layers.append(LayerPlan(rows, cols, start, output_activation if last else activation, stored))
            start += stored * cols
        return cls(tuple(layers), max(max(layer.rows, layer.cols) for layer in layers), start)

    @property
    def n_inputs(self) -> int:
        return self.layers[0].cols

    @property
    def n_outputs(self) -> int:
        return self.layers[-1].rows

    @property
    def padding_start(self) -> int:
        """Where the output matrix's padding rows (never computed, zero gradients) begin."""
        return self.layers[-1].end

    def stored_sizes(self) -> list:
        """``(rows, cols)`` of each matrix as stored (the output matrix with its padding rows)."""
        return [(layer.stored_rows, layer.cols) for layer in self.layers]


@dataclass(frozen=True)
class FusedTiling:
    """How the fused kernels (``_fused_mlp``) cut the work on one arch: ``samples`` per tile (``S``), ``threads``
    per block (``T``), ``blocks``: the most blocks of a single network's pass (the backward's split-K factor:
    each block sums its run of tiles into its own row of partial sums), and ``shared_bytes``: the shared memory a
    block may use."""

    samples: int
    threads: int
    blocks: int
    shared_bytes: int
    register: int = 8


FUSED_TILINGS = {
    "cuda": FusedTiling(samples=64, threads=64, blocks=528, shared_bytes=48 * 1024),
    "vulkan": FusedTiling(samples=32, threads=128, blocks=64, shared_bytes=32 * 1024, register=4),
    "metal": FusedTiling(samples=32, threads=128, blocks=64, shared_bytes=32 * 1024, register=4),
}
"""The tiling of each GPU arch by name. CUDA: 48 KiB of static shared memory a block; tiles of 64 samples and 64
threads give each thread an 8 x 8 register tile of a 64-wide layer (0.25 shared loads per multiply-add); 528
blocks are 4 per SM of a 132-SM H100/H200, which 48 KiB blocks allow (228 KiB per SM). Vulkan and Metal: 32 KiB
(Mesa's llvmpipe, Apple GPUs), so tiles of 32 samples, on 128 threads of 4 x 4 register tiles (0.5 shared loads
per multiply-add; the same kernels with a quarter of the unrolled code, which Taichi compiles about four times
faster: Vulkan is where CI runs every test). ``benchmarks/fused_sweep.py``
times other tilings on a GPU."""


def thread_tile(a: int, b: int, threads: int, passes: int = 1, most: int = 8) -> tuple:
    """The register tile of a product with ``a x b`` outputs on ``threads`` threads: ``(ga, pa, gb, pb)``, tile
    ``g`` owning outputs ``(g // gb + ga e, g % gb + gb f)`` for ``e < pa``, ``f < pb``; thread ``t`` computes tiles
    ``t, t + threads, ...`` one after the other (``ga gb <= threads * passes``). Chosen for the fewest outputs per
    thread (the critical path), then the fewest shared loads per multiply-add ``(pa + pb) / (pa pb)``; at most
    ``most`` per side (registers). A side's outputs ``g p`` stay within its length rounded up to 32 (the row
    length of the shared tiles), so a tile of ``S`` samples (a multiple of 32) is covered exactly."""
    best = None
    for pb in range(1, most + 1):
        for pa in range(1, most + 1):
            ga, gb = -(-a // pa), -(-b // pb)
            if ga * gb > threads * passes or ga * pa > -(-a // 32) * 32 or gb * pb > -(-b // 32) * 32:
                continue
            work = -(-ga * gb // threads) * pa * pb
            key = (work, (pa + pb) / (pa * pb), ga * pa + gb * pb)
            if best is None or key < best[0]:
                best = (key, (ga, pa, gb, pb))
    if best is None:
        raise ValueError(f"a {a} x {b} product does not fit {threads} threads x {passes} of {most} x {most} outputs")
    return best[1]
