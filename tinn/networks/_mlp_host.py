"""The MLP's host batch path: numpy's BLAS for the products, on tinn's worker threads.

Samples are grouped per network (``tinn.batch.routing.Groups``: a zero-padded ``(R, S, n)`` stack of *row
blocks*, R of them with S samples each), cut into cache-sized blocks of samples, and each block
goes through every layer (the activation applied while the block is in cache). When a batch reaches
every network of a large array, the products read the weights and write the gradients in the
parameter store's own memory (``ParamStore.rows_view``) instead of copies.

The layout is the MLP's plan (``_mlp_plan.MLPPlan``): only the first ``n_output_dims`` rows of ``W_NL``
are computed, so outputs and output gradients are exactly ``(batch, n_output_dims)``, with no copy to
cut or pad them, and the padding rows' gradients are zero, as in tcnn.

A half-precision MLP (``tinn.params.KEPT_ACTIVATIONS``) rounds its hidden outputs and kept pre-activations to
float16 as the device paths do, but holds them in float32 arrays: numpy converts to and from float16 in
scalar code (5 and 3 ns a value on a Zen 3 core, which would double a training step), so the rounding is
done in float32 arithmetic (:func:`round_to_half`) and the host path keeps float32's memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..batch.routing import Groups
from ..object import Context
from ..params import FLOAT16_MAX
from ..runtime import blas as _blas
from . import activations
from .activations import Activation

SAMPLES_PER_BLOCK = 4096
"""Samples per block: few enough that a block's activations stay in cache (L2/L3), many enough that
numpy's per-call cost and the threads' turns at the GIL stay small (measured on a 2-core Zen 3: 4096
beat 512, 1024, 2048 and 8192 by 5-40 %)."""


PARTIALS_PER_WORKER = 4
"""Partial sums of weight gradients per worker thread when a batch is split along its samples: each
partial sum covers a fixed run of consecutive blocks (so the result does not depend on which thread
took which block), and the threads take partial sums first-come (four per thread leave room to even
out a slower thread)."""


class Blocks:
    """How a ``(R, S, n)`` stack is cut into blocks for tinn's BLAS workers: along the samples when row
    blocks are few and large (``split_samples``), else into groups of whole row blocks (each one's weight
    gradient written once).

    Split along the samples, block ``b`` adds its weight gradients to partial sum ``b // per_partial``
    after the blocks before it in that run, and the partial sums are added in their order: for a given
    batch and thread count the sums, so training, are bit-identical run to run."""

    def __init__(self, groups: Groups):
        self.n_row_blocks, self.size = groups.n_rows, groups.size
        self.split_samples = self.size >= SAMPLES_PER_BLOCK or self.n_row_blocks < _blas.n_workers()
        self.n_partials, self.per_partial = 1, 1
        if self.split_samples:
            n_blocks = -(-self.size // SAMPLES_PER_BLOCK)
            self.per_partial = -(-n_blocks // (PARTIALS_PER_WORKER * _blas.n_workers()))
            self.n_partials = -(-n_blocks // self.per_partial)

    def run(self, fn):
        """``fn(partial, index)`` per block: ``index`` selects the block in a ``(R, S, ...)`` stack, ``partial``
        the partial sum of weight gradients it adds to (no two blocks at once add to the same one)."""
        if self.split_samples:
            span = self.per_partial * SAMPLES_PER_BLOCK

            def run_partial(worker, partial, _):
                for lo in range(partial * span, min((partial + 1) * span, self.size), SAMPLES_PER_BLOCK):
                    fn(partial, (slice(None), slice(lo, min(lo + SAMPLES_PER_BLOCK, self.size))))

            _blas.for_blocks(self.n_partials, 1, run_partial)
        else:
            per_block = max(1, SAMPLES_PER_BLOCK // self.size)
            _blas.for_blocks(self.n_row_blocks, per_block, lambda w, lo, hi: fn(0, (slice(lo, hi),)))

    @staticmethod
    def row_blocks(index):
        """The row blocks (and so the networks' weights) a block touches (all of them when split along samples)."""
        return index[:1]


@dataclass
class Layer:
    """One matrix of the MLP in a batch: ``y = act(z)``, ``z = x W^T`` per row block.

    ``w`` is ``(R, n_out, n_in)`` (the last layer: only its computed rows), ``x`` / ``z`` / ``y`` are
    ``(R, S, n)`` stacks; ``y`` is the next layer's ``x``. ``z`` is kept only where act' needs it, and
    in inference only the network's input and output exist."""

    w: np.ndarray
    act: Activation
    x: np.ndarray | None
    z: np.ndarray | None
    y: np.ndarray | None

    def slope_source(self) -> np.ndarray:
        """What act' is computed from: the output for the ``from_output`` activations, else ``z``."""
        return self.y if self.act.from_output else self.z


HALF_SPLIT = np.float32(2 ** 13 + 1)
"""Veltkamp's splitter for float32's 24 significant bits -> float16's 11."""


def round_to_half(a: np.ndarray) -> np.ndarray:
    """``a`` (float32) rounded in place to the nearest float16 value, ties to even, as ``a.astype(np.float16)``
    (Veltkamp's split: ``t = a (2^13 + 1)``, ``a = t - (t - a)``; three vector operations where numpy's
    conversion runs scalar code). Below float16's normal range (|a| < 6.1e-5) it keeps 11 significant bits
    where float16 has fewer (a difference below 3e-8); a block with a value beyond float16's range (an
    infinity, a NaN) is converted exactly instead, so such values become infinite as in float16."""
    if a.size and not (a.max() <= FLOAT16_MAX and a.min() >= -FLOAT16_MAX):
        with np.errstate(over="ignore"):
            a[...] = a.astype(np.float16)
        return a
    t = a * HALF_SPLIT
    np.subtract(t, np.subtract(t, a), out=a)
    return a


class HostMLP:
    """The batch path of one ``MLP`` on the host."""

    def __init__(self, mlp):
        self.mlp = mlp
        self._zero_buffer = np.zeros(0, np.float32)
        plan = mlp.plan                                 # each matrix's computed columns, read at every call
        self._matrices = [(slice(layer.start, layer.end), (layer.rows, layer.cols)) for layer in plan.layers]
        self._padding_start = plan.padding_start

    def _zeros(self, n: int) -> np.ndarray:
        """At least ``n`` float32 zeros, for ReLU (:func:`activations.host_value`); read by every worker thread
        (one that needs more makes a larger buffer for itself and leaves it for the next)."""
        zeros = self._zero_buffer
        if zeros.size < n:
            zeros = self._zero_buffer = np.zeros(n, np.float32)
        return zeros

    # -- weights and gradients in the store -----------------------------------------
    def _split(self, flat: np.ndarray) -> list:
        """``(..., n_params)`` -> one ``(..., rows, cols)`` view per matrix (its computed rows)."""
        return [flat[..., columns].reshape(flat.shape[:-1] + shape) for columns, shape in self._matrices]

    def _weights(self, groups: Groups, field) -> list:
        """One ``(R, rows, cols)`` array per matrix, a row per row block (in the store's memory where it
        allows, else a copy); the last matrix with its computed rows only."""
        mlp = self.mlp
        flat = mlp.store.rows_view(field, mlp._offset, mlp.n_params, groups.active)
        if flat is None:
            flat = mlp.store.read_rows(field, mlp._offset, mlp.n_params, groups.active)
        return self._split(groups.per_row(flat))

    # -- forward ------------------------------------------------------------------------
    def run(self, x: np.ndarray, batch, keep: bool):
        """``(y (batch, computed outputs), ctx or None)``; ``keep`` keeps what backward needs."""
        mlp = self.mlp
        groups = batch.routing.groups
        weights = self._weights(groups, mlp.store.params if keep else mlp.store.inference_params)
        blocks, n = Blocks(groups), len(weights)
        stack, half = (groups.n_rows, groups.size), mlp.store.precision == "float16"
        layers, h = [], groups.gather(x)
        for i, (w, plan) in enumerate(zip(weights, mlp.plan.layers)):
            act = activations.ACTIVATIONS[plan.activation]
            y = np.empty(stack + (w.shape[1],), np.float32) if keep or i == n - 1 else None
            z = np.empty_like(y) if keep and not act.from_output else None
            layers.append(Layer(w, act, h, z, y))
            h = y

        def block(partial, index):
            sel = blocks.row_blocks(index)
            h = layers[0].x[index]
            for i, layer in enumerate(layers):
                target = layer.y if layer.act.from_output else layer.z
                z = np.matmul(h, layer.w[sel].transpose(0, 2, 1), out=None if target is None else target[index])
                h = activations.host_value(layer.act, z, self._zeros(z.size))
                if half and i < n - 1:
                    round_to_half(h)                        # what the next layer reads and the backward keeps
                if not layer.act.from_output and layer.y is not None:
                    layer.y[index] = h
                if half and layer.z is not None:
                    round_to_half(z)                        # kept for act', after act took it unrounded

        blocks.run(block)
        y = groups.scatter(layers[-1].y)
        return y, (Context(mlp, x, batch, groups=groups, blocks=blocks, layers=layers) if keep else None)

    # -- backward -----------------------------------------------------------------------
    def _gradient_buffer(self, ctx, overwrite: bool):
        """``(flat, per-layer views, target, accumulate)``: where the blocks put dL/dW and whether they add
        to it. Straight into the store's gradients (``target``, written or added to) when each network is
        one row block, the batch is not split along samples and the networks are a run the store can view;
        else a ``(partials, R, n_params)`` buffer that :meth:`_commit_gradients` sums and writes or adds."""
        mlp, groups, blocks = self.mlp, ctx.groups, ctx.blocks
        store = mlp.store
        target = None
        if not blocks.split_samples and groups.row_group is None:
            target = store.rows_view(store.grads, mlp._offset, mlp.n_params, groups.active)
        if target is not None:
            flat = target[None]
        else:
            flat = (np.zeros if blocks.split_samples else np.empty)((blocks.n_partials, groups.n_rows, mlp.n_params),
                                                                     np.float32)
        if target is None or overwrite:
            flat[..., self._padding_start:] = 0.0            # the padded outputs' rows get no gradient
        return flat, self._split(flat), target, blocks.split_samples or (target is not None and not overwrite)

    def _commit_gradients(self, ctx, flat, target, overwrite: bool):
        """Sum the partial sums and the row blocks of each network; write or add them to the store."""
        if target is not None:
            return
        mlp, groups, store = self.mlp, ctx.groups, self.mlp.store
        flat = groups.sum_rows(flat, axis=1)
        total = flat.sum(axis=0) if flat.shape[0] > 1 else flat[0]
        (store.write_rows if overwrite else store.add_rows)(store.grads, mlp._offset, groups.active, total)

    @staticmethod
    def _add_weight_gradient(dW, g, h, accumulate: bool):
        """``dW (+)= g^T h`` per row block."""
        if accumulate:
            dW += np.matmul(g.transpose(0, 2, 1), h)
        else:
            np.matmul(g.transpose(0, 2, 1), h, out=dW)

    def backward(self, ctx, dL_dy: np.ndarray, input_gradient: bool, overwrite: bool):
        """dL/dW to the store (written if ``overwrite``, else added); dL/dx if ``input_gradient``."""
        groups, blocks, layers = ctx.groups, ctx.blocks, ctx.layers
        g_all = groups.gather(np.ascontiguousarray(dL_dy[:, : layers[-1].w.shape[1]]))
        dx = np.empty_like(layers[0].x) if input_gradient else None
        flat, dWs, target, accumulate = self._gradient_buffer(ctx, overwrite)

        def block(partial, index):
            sel = blocks.row_blocks(index)
            g = g_all[index].copy()
            for i in reversed(range(len(layers))):
                layer = layers[i]
                activations.host_times_derivative(layer.act, layer.slope_source()[index], g)
                dW = dWs[i][partial][sel]
                self._add_weight_gradient(dW, g, layer.x[index], accumulate)
                if i > 0 or input_gradient:
                    g = np.matmul(g, layer.w[sel], out=dx[index] if i == 0 else None)

        blocks.run(block)
        self._commit_gradients(ctx, flat, target, overwrite)
        return groups.scatter(dx) if input_gradient else None

    # -- second order ---------------------------------------------------------------------
    def output_adjoints(self, ctx, dL_dy: np.ndarray, input_gradient: bool):
        """The first half of the second order: the first-order backward pass without parameter gradients,
        keeping each layer's output adjoint ``ybar_i = dL/dy_i`` (``(R, S, n)``); returns ``(dL/dx or None,
        ybars)``."""
        groups, blocks, layers = ctx.groups, ctx.blocks, ctx.layers
        ybars = [np.empty_like(layer.y) for layer in layers[:-1]]
        ybars.append(groups.gather(np.ascontiguousarray(dL_dy[:, : layers[-1].w.shape[1]])))
        dx = np.empty_like(layers[0].x) if input_gradient else None

        def block(partial, index):
            sel = blocks.row_blocks(index)
            for i in reversed(range(1 if dx is None else 0, len(layers))):
                g = ybars[i][index].copy()
                activations.host_times_derivative(layers[i].act, layers[i].slope_source()[index], g)
                np.matmul(g, layers[i].w[sel], out=ybars[i - 1][index] if i > 0 else dx[index])

        blocks.run(block)
        return (groups.scatter(dx) if input_gradient else None), ybars

    def second_order(self, ctx, ybars: list, dL_ddLdx: np.ndarray, overwrite: bool):
        """The second half: for ``L2 = <v, dL/dx>`` with ``v = dL_ddLdx``, a tangent pass
        ``xdot_0 = v, zdot_i = xdot_i W_i^T, xdot_(i+1) = act_i'(z_i) zdot_i`` and its reverse with two adjoints,
        of the tangents (the first-order ``delta_i = act_i' ybar_i``) and of the values
        (``zbar_i = act_i'' zdot_i ybar_i + act_i' xbar_(i+1)``, ``xbar_i = zbar_i W_i``, ``xbar_n = 0``)::

            dL2/dW_i = delta_i^T xdot_i + zbar_i^T x_i,   dL2/d(dL_dy) = xdot_n,   dL2/dx = xbar_0

        ``zbar`` is 0 until a layer with a curved activation (act'' != 0): with only ReLU, LeakyReLU and None
        it is never computed and dL2/dx is ``None`` (0). Returns ``(dL2/d(dL_dy), dL2/dx or None)``."""
        groups, blocks, layers = ctx.groups, ctx.blocks, ctx.layers
        v_all = groups.gather(np.ascontiguousarray(dL_ddLdx))
        tangent_out = np.empty_like(ybars[-1])
        curved = [layer.act.host_second is not None for layer in layers]
        dx = np.zeros_like(layers[0].x) if any(curved) else None
        flat, dWs, target, accumulate = self._gradient_buffer(ctx, overwrite)

        def block(partial, index):
            sel = blocks.row_blocks(index)
            slopes, tangents, xdot = [], [], v_all[index]
            for layer in layers:
                slope = activations.host_derivative(layer.act, layer.slope_source()[index])
                zdot = np.matmul(xdot, layer.w[sel].transpose(0, 2, 1))
                slopes.append(slope)
                tangents.append((xdot, zdot))
                xdot = zdot if slope is None else zdot * slope
            tangent_out[index] = xdot
            xbar = None                                     # adjoint of the values, None while it is 0
            for i in reversed(range(len(layers))):
                layer, slope, (xdot, zdot), ybar = layers[i], slopes[i], tangents[i], ybars[i][index]
                delta = ybar if slope is None else ybar * slope
                zbar = activations.host_second(layer.act, layer.z[index]) * zdot * ybar if curved[i] else None
                if xbar is not None:
                    xbar = xbar if slope is None else xbar * slope
                    zbar = xbar if zbar is None else zbar + xbar
                dW = dWs[i][partial][sel]
                self._add_weight_gradient(dW, delta, xdot, accumulate)
                xbar = None
                if zbar is not None:
                    self._add_weight_gradient(dW, zbar, layer.x[index], True)
                    xbar = np.matmul(zbar, layer.w[sel], out=dx[index] if i == 0 else None)

        blocks.run(block)
        self._commit_gradients(ctx, flat, target, overwrite)
        return groups.scatter(tangent_out), (None if dx is None else groups.scatter(dx))
