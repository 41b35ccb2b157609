"""The MLP's layout, written once: which matrices, where each starts, which rows are computed, which
activation follows. Every backend (host BLAS, per-layer kernels, fused kernels, per-sample ``ti.func``s)
reads it; none derives it again.

Parameters are the matrices in order, each row-major: ``W_0`` (H x n_in), ``NL - 1`` times H x H, then
``W_NL`` (P x H, P the output width padded to 16; NL = 0: one P x n_in matrix). Of ``W_NL`` only the
first ``n_output_dims`` rows are computed: the padded outputs are no part of the result and their rows'
gradients are zero, as in tcnn. A layer's computed weights are therefore the contiguous columns
``[start, start + rows * cols)`` of the MLP's parameters, and the padding rows are ``[padding_start, n_params)``.

The plan is a frozen, hashable value: models of one config have equal plans, and kernels specialised
to a plan (``tinn._kernels.specialised``) are built once for all of them.
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
