"""The MLP of ``mlp.py`` as Taichi kernels on device buffers (the device path, ``tinn.runtime.program``).

Same math as the host path (no biases, activations differentiated from the pre-activation)::

    forward, layer i:  z_i[b, r] = sum_c W_i[k_b, r, c] h_i[b, c],   h_{i+1} = act_i(z_i)
    backward:          delta_NL = out_act'(z_NL) * dL/dy
                       dL/dW_i[k, r, c] = sum over samples b of network k of delta_i[b, r] h_i[b, c]
                       delta_{i-1}[b, c] = act_{i-1}'(z_{i-1}[b, c]) * sum_r W_i[k_b, r, c] delta_i[b, r]

``k_b`` is sample b's network in an array. Of the output matrix only the ``n_output_dims`` rows that
are outputs are computed (the padding rows get zero gradients, as in tcnn). Weights and gradients are
read and written in the parameter store's fields; activations live in ``ti.ndarray``s.

Second order (``backward_backward_input``, the formulas of ``HostMLP.second_order``) runs on the same
kernels: its products are the forward's (``zdot_i = xdot_i W_i^T``), the backward's input gradient
(``ybar_{i-1} = delta_i W_i``, ``xbar_i = zbar_i W_i``) and weight gradient (``delta_i^T xdot_i``,
``zbar_i^T h_i``); two element-wise kernels apply act' and act''. Nothing batch-sized leaves the device.

The layout (rows computed, offsets, activations) is the MLP's plan (``_mlp_plan.MLPPlan``). In overwrite
mode the first weight-gradient kernel of a backward (or second-order) pass zeroes the MLP's gradient
columns in a first loop (Taichi runs a kernel's top-level loops in order), and an output activation
``None`` costs no kernel: a pass makes no launch but its products.

Kept activations may be float16 (a half-precision MLP, ``tinn.params.KEPT_ACTIVATIONS``): the kernels take
them in any dtype, read them as float32 and compute in float32.

Weight gradients are reduced per tile: a tile is up to ``TILE`` consecutive samples of one network
(samples sorted by network for an array), one thread sums a weight's products over its tile, and a
tile adds its sum to the gradient once. On CUDA the fused kernels of ``_fused_mlp.py`` take MLPs with
layers up to 64 wide instead, single networks and arrays (a block's samples belong to one network, the
batch's tiles); the second order of such a pass recomputes its layers with the per-layer kernels (the
fused kernels keep them in a layout of their own).
"""
import numpy as np
import taichi as ti

from taichi.lang import impl

from ..batch import buffers as _buffers
from ..batch.ops import DEVICE
from ..batch.routing import TILE
from ..object import Context
from ..params import KEPT_ACTIVATIONS
from ..runtime.kernels import ARENA, arena_kernel, cast_to, columns_per_task
from ..runtime.types import ANY_2D
from . import _fused_layout, _fused_mlp
from . import activations
from ._mlp_plan import FUSED_TILINGS

FUSED_ARCHS = (ti.cuda, ti.vulkan, ti.metal)
"""Archs where MLPs up to 64 wide use the fused kernels, with the tiling ``_mlp_plan.FUSED_TILINGS`` gives the arch."""

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
_i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)


@ti.func
def _network(inst: ti.template(), b, routed: ti.template()):
    k = 0
    if ti.static(routed):
        k = inst[b]
    return k


@arena_kernel
def _layer_forward(W: ARENA, off: ti.i32, h: ANY_2D, inst: _i32_1d, routed: ti.template(),
                   act: ti.template(), keep_z: ti.template(), z: ANY_2D, out: ANY_2D):
    """``out = act(z)``, ``z[b, r] = sum_c W[k_b, off + r * cols + c] h[b, c]`` (z kept if ``keep_z``), each
    stored in its buffer's dtype (a half-precision MLP keeps float16 ones)."""
    cols = h.shape[1]
    for b, r in ti.ndrange(out.shape[0], out.shape[1]):
        k = _network(inst, b, routed)
        acc = 0.0
        for c in range(cols):
            acc += W[k, off + r * cols + c] * ti.cast(h[b, c], ti.f32)
        if ti.static(keep_z):
            z[b, r] = ti.static(cast_to(z))(acc)
        out[b, r] = ti.static(cast_to(out))(activations.value(act, acc))


@ti.kernel
def _times_derivative(g: _f32_2d, z: ANY_2D, act: ti.template(), out: _f32_2d):
    """``out = act'(z) * g`` element-wise (the output delta ``out_act'(z) * dL/dy``, a tangent ``act'(z) * zdot``)."""
    for b, r in ti.ndrange(out.shape[0], out.shape[1]):
        out[b, r] = g[b, r] * activations.derivative(act, ti.cast(z[b, r], ti.f32))


@ti.kernel
def _curvature(z: ANY_2D, zdot: _f32_2d, ybar: _f32_2d, act: ti.template(), add: ti.template(), zbar: _f32_2d):
    """``zbar = act''(z) * zdot * ybar``, plus the ``zbar`` already there if ``add`` (all ``(batch, rows)``)."""
    for b, r in ti.ndrange(zbar.shape[0], zbar.shape[1]):
        t = activations.second_derivative(act, ti.cast(z[b, r], ti.f32)) * zdot[b, r] * ybar[b, r]
        if ti.static(add):
            t += zbar[b, r]
        zbar[b, r] = t


def _slope_times(g, z, act: str):
    """``act'(z) * g`` as a new buffer (``g`` itself for the identity)."""
    if act == "None":
        return g
    out = DEVICE.empty_like(g)
    _times_derivative(g, z, act, out)
    return out


@arena_kernel
def _input_grad(W: ARENA, off: ti.i32, delta: _f32_2d, inst: _i32_1d, routed: ti.template(),
                z: ANY_2D, act: ti.template(), out: _f32_2d):
    """``out[b, c] = act'(z[b, c]) * sum_r W[k_b, off + r * cols + c] delta[b, r]``."""
    cols = out.shape[1]
    for b, c in ti.ndrange(out.shape[0], cols):
        k = _network(inst, b, routed)
        acc = 0.0
        for r in range(delta.shape[1]):
            acc += W[k, off + r * cols + c] * delta[b, r]
        if ti.static(act != "None"):
            acc *= activations.derivative(act, ti.cast(z[b, c], ti.f32))
        out[b, c] = acc


@arena_kernel
def _weight_grad(G: ARENA, off: ti.i32, delta: _f32_2d, h: ANY_2D, tiles: _i32_2d, order: _i32_1d,
                 routed: ti.template(), zero: ti.template(), zero_off: ti.i32, zero_n: ti.i32, zero_tasks: ti.i32):
    """``G[k, off + r * cols + c] += sum_{b in tile} delta[b, r] h[b, c]``: a thread per (tile, r, c), one
    add per tile. Tile t is samples ``order[tiles[t, 0] : tiles[t, 1]]`` of network ``tiles[t, 2]``.
    If ``zero``, a first loop sets ``G[k, zero_off : zero_off + zero_n] = 0`` for every network k
    (``zero_tasks``: networks x ``ceil(zero_n / columns_per_task())``, a task per row and that many columns,
    counted on the host: SPIR-V miscompiles a top-level range computed in the kernel)."""
    if ti.static(zero):
        C = ti.static(columns_per_task())
        for task in range(zero_tasks):
            tasks = (zero_n + C - 1) // C
            k, c0 = task // tasks, task % tasks * C
            for i in range(c0, ti.min(c0 + C, zero_n)):
                G[k, zero_off + i] = 0.0
    cols = h.shape[1]
    for t, r, c in ti.ndrange(tiles.shape[0], delta.shape[1], cols):
        acc = 0.0
        for j in range(tiles[t, 0], tiles[t, 1]):
            b = j
            if ti.static(routed):
                b = order[j]
            acc += delta[b, r] * h[b, c]
        if tiles[t, 1] > tiles[t, 0]:               # a census's table ends in empty tiles
            ti.atomic_add(G[tiles[t, 2], off + r * cols + c], acc)


def takes_fused(plan) -> bool:
    """Whether device batches of an MLP of ``plan`` run on the fused kernels here (a fused arch with a tiling, the
    plan within it)."""
    arch = impl.current_cfg().arch
    tiling = FUSED_TILINGS.get(arch.name)
    return arch in FUSED_ARCHS and tiling is not None and _fused_layout.fits(plan, tiling)


class _Zeroing:
    """The gradient zeroing of an overwrite pass, done by the pass's first ``_weight_grad`` launch: the
    arguments ``(zero, zero_off, zero_n, zero_tasks)`` of each launch, zeroing on the first only."""

    def __init__(self, mlp, overwrite: bool):
        self.mlp, self.pending = mlp, overwrite

    def args(self):
        mlp, zero = self.mlp, self.pending
        self.pending = False
        tasks = mlp.n_instances * -(-mlp.n_params // columns_per_task())
        return (True, mlp._offset, mlp.n_params, tasks) if zero else (False, 0, 0, 0)


class KernelMLP:
    """Forward and backward of one :class:`~tinn.networks.mlp.MLP` as kernels over ``ti.ndarray``s."""

    def __init__(self, mlp):
        self.mlp = mlp
        self.rows = [layer.rows for layer in mlp.plan.layers]             # output padding rows not computed
        self.acts = [layer.activation for layer in mlp.plan.layers]
        self._tiles = {}
        self._none3 = _buffers.buffer((1, 1, 1))
        self._none2 = _buffers.buffer((1, 1))
        self._partials = None
        self._no_order, self._no_offsets = _buffers.buffer((1,), ti.i32), _buffers.buffer((1, 1), ti.i32)
        self._pool = _buffers.Pool()                 # the fused kernels' activations, reused across steps

    @property
    def kept(self):
        """The dtype of the activations the layers keep (``tinn.params.KEPT_ACTIVATIONS``)."""
        return KEPT_ACTIVATIONS[self.mlp.store.precision]

    @property
    def offsets(self):
        """Where each matrix starts in the store (the MLP may be bound to a new offset at any time)."""
        return [self.mlp._offset + layer.start for layer in self.mlp.plan.layers]

    def _fused_kernels(self, batch):
        """The fused kernels where they apply (on a fused arch, a routed batch or a single network's), else ``None``."""
        plan = self.mlp.plan
        if not takes_fused(plan) or not (batch.routing.routed or self.mlp.n_instances == 1):
            return None
        return _fused_mlp.fused_kernels(plan, FUSED_TILINGS[impl.current_cfg().arch.name], self.kept == ti.f16)

    def takes_encoding(self, encoding, batch) -> bool:
        """Whether an inference of ``batch`` runs ``encoding`` inside the fused forward (see :meth:`run`)."""
        return self._fused_kernels(batch) is not None and encoding._features_into(batch) is not None

    def run(self, x, batch, keep: bool, out=None, encoding=None):
        """``(y, ctx)``: outputs ``(batch, n_output_dims)`` (a ``ti.ndarray``: ``out`` if given, written by the
        last kernel; a dense batch's ``out`` may be ``(K, B_k, n_output_dims)``) and, if ``keep``, what the backward
        needs (each layer's input and pre-activation).
        ``encoding`` (an inference where :meth:`takes_encoding`): ``x`` is its input, encoded inside the fused
        forward."""
        store = self.mlp.store
        weights = store.params if keep else store.inference_params
        h = DEVICE.adopt(x)                                   # one upload, not one per kernel
        fused = self._fused_kernels(batch)
        if fused is not None:
            return self._run_fused(fused, weights, x, h, batch, keep, out, encoding)
        inst, routed = batch.kernel_ids()
        dense_out = out is not None and len(out.shape) == 3
        hs, zs = self._layers(weights, h, inst, routed, keep, None if dense_out else out)
        ctx = Context(self.mlp, x, batch, hs=hs, zs=zs, inst=inst, routed=routed) if keep else None
        return (DEVICE.copy_into(out, hs[-1]) if dense_out else hs[-1]), ctx

    def _layers(self, weights, h, inst, routed, keep: bool, y=None):
        """``(hs, zs)``: the per-layer kernels' pass over a device batch ``h`` ``(batch, n_input_dims)``; ``hs`` is
        ``h`` then each layer's output ``(batch, rows_i)`` (the last one ``y`` if given), ``zs`` each pre-activation
        (the outputs again unless ``keep``). Hidden outputs and pre-activations are in :attr:`kept`'s dtype."""
        B, kept = h.shape[0], self.kept
        hs, zs, offsets = [h], [], self.offsets
        for i, rows in enumerate(self.rows):
            last = i == len(self.rows) - 1
            out = y if y is not None and last else _buffers.buffer((B, rows), ti.f32 if last else kept)
            z = _buffers.buffer((B, rows), kept) if keep else out
            _layer_forward(weights, offsets[i], h, inst, routed, self.acts[i], keep, z, out)
            hs.append(out)
            zs.append(z)
            h = out
        return hs, zs

    def _schedule(self, fused, batch, B: int) -> tuple:
        """``(mode, n_blocks, per_network, order, offsets)`` of a fused pass over a batch of ``B``: a single network's
        batch in runs of tiles (at most ``tiling.blocks`` blocks), a dense array's networks (``(K, B_k)``: a block
        each) or a routed array's networks (a block each over its samples sorted by network)."""
        unused_1, unused_2 = self._no_order, self._no_offsets
        if not batch.routing.routed:
            return _fused_layout.SINGLE, max(min(-(-B // fused.S), fused.tiling.blocks), 1), B, unused_1, unused_2
        if batch.dense is not None:
            return _fused_layout.DENSE, batch.dense[0], batch.dense[1], unused_1, unused_2
        order, offsets = batch.routing.runs
        return _fused_layout.ROUTED, self.mlp.n_instances, 0, order, offsets

    def _run_fused(self, fused, weights, x, h, batch, keep, out=None, encoding=None):
        """The fused forward; what it keeps is indexed by position (sorted position for a routed array):
        ``zs`` ``(len(z_layers), z_rows, batch)``, ``hs`` ``(L - 1, width, batch)``, in :attr:`kept`'s dtype."""
        B, L = x.shape[0], fused.n_layers
        ctx = Context(self.mlp, x, batch, fused=fused, h=h) if keep else None
        columns = max(B, 1)
        zs = self._pool.take((len(fused.z_layers), fused.z_rows, columns), ctx, self.kept) if keep else self._none3
        hs = self._pool.take((max(L - 1, 1), fused.width, columns), ctx, self.kept) if keep else self._none3
        y = _buffers.buffer((B, self.rows[-1])) if out is None else out
        mode, blocks, per, order, offsets = self._schedule(fused, batch, B)
        forward, base = fused.forward, 0
        if encoding is not None:
            encoder = (encoding._features_into(batch), encoding.n_input_dims, encoding.n_raw_output_dims,
                       float(encoding.fill_value))
            forward, base = fused.encoded_forward(encoder), encoding._offset
        forward(weights, self.mlp._offset, h, mode, blocks, per, order, offsets, keep, zs, hs, y, base)
        if keep:
            ctx.zs, ctx.hs = zs, hs
        return y, ctx

    def _split_k(self, blocks: int) -> tuple:
        """``(partials, sums)``: a single network's rows of partial weight-gradient sums, ``(blocks, n_params)`` and
        ``(SEGMENTS, n_params)``, kept for the next pass (the kernels of one queue run in order)."""
        if self._partials is None or self._partials[0].shape[0] != blocks:
            n = self.mlp.n_params
            self._partials = (_buffers.buffer((blocks, n)), _buffers.buffer((_fused_layout.SEGMENTS, n)))
        return self._partials

    def _backward_fused(self, ctx, dL_dy, input_gradient, overwrite):
        """The fused backward: dL/dW without atomics (a single network's blocks sum into rows of partial sums,
        reduced in the same kernel), dL/dx ``(batch, n_input_dims)`` if ``input_gradient``."""
        store, fused, B = self.mlp.store, ctx.fused, ctx.x.shape[0]
        dx = _buffers.buffer((B, self.mlp.n_input_dims) if input_gradient else (1, 1))
        dy = DEVICE.adopt(dL_dy)
        mode, blocks, per, order, offsets = self._schedule(fused, ctx.batch, B)
        if mode == _fused_layout.SINGLE:
            partials, sums = self._split_k(blocks)
        else:
            partials = sums = self._none2
        fused.backward(store.params, store.grads, self.mlp._offset, self.mlp.n_instances, ctx.h, dy, ctx.zs, ctx.hs,
                       mode, blocks, per, order, offsets, partials, sums, input_gradient, overwrite, dx)
        return dx if input_gradient else None

    def backward(self, ctx, dL_dy, input_gradient: bool, overwrite: bool):
        """dL/dW to the store (written if ``overwrite``, else added); dL/dx ``(batch, n_input_dims)`` if
        ``input_gradient``. ``dL_dy`` is ``(batch, n_output_dims)``."""
        if getattr(ctx, "fused", None) is not None:
            return self._backward_fused(ctx, dL_dy, input_gradient, overwrite)
        store = self.mlp.store
        tile_table, order = self._tile_tables(ctx.batch, ctx.x.shape[0])
        offsets, zeroing = self.offsets, _Zeroing(self.mlp, overwrite)
        delta = _slope_times(DEVICE.adopt(dL_dy), ctx.zs[-1], self.acts[-1])
        for i in reversed(range(len(self.rows))):
            _weight_grad(store.grads, offsets[i], delta, ctx.hs[i], tile_table, order, ctx.routed, *zeroing.args())
            if i == 0 and not input_gradient:
                return None
            below = DEVICE.empty_like(delta, (delta.shape[0], ctx.hs[i].shape[1]))
            z, act = (ctx.zs[i - 1], self.acts[i - 1]) if i > 0 else (below, "None")
            _input_grad(store.params, offsets[i], delta, ctx.inst, ctx.routed, z, act, below)
            delta = below
        return delta

    # -- second order: the formulas of HostMLP.output_adjoints / second_order, on the kernels above ------
    def _per_layer(self, ctx):
        """``(hs, zs, inst, routed)`` of a forward pass: the per-layer kernels' own, or for a pass of the fused
        kernels (their own layout) recomputed by the per-layer kernels from its input."""
        if getattr(ctx, "fused", None) is None:
            return ctx.hs, ctx.zs, ctx.inst, ctx.routed
        inst, routed = ctx.batch.kernel_ids()
        return (*self._layers(self.mlp.store.params, ctx.h, inst, routed, keep=True), inst, routed)

    def output_adjoints(self, ctx, dL_dy, input_gradient: bool):
        """The first half of the second order: the first-order backward without parameter gradients,
        ``ybar_NL = dL_dy``, ``delta_i = act_i'(z_i) * ybar_i``, ``ybar_{i-1} = delta_i W_i`` (all ``(batch, rows)``).
        Returns ``(dL/dx = delta_0 W_0`` ``(batch, n_input_dims)`` or ``None, state)``; the state keeps every
        ``delta_i`` and, for the curved layers (act'' != 0), ``ybar_i``."""
        hs, zs, inst, routed = self._per_layer(ctx)
        weights, offsets, n = self.mlp.store.params, self.offsets, len(self.rows)
        curved = [activations.ACTIVATIONS[act].host_second is not None for act in self.acts]
        deltas, ybars = [None] * n, [None] * n
        ybar = DEVICE.adopt(dL_dy)
        for i in reversed(range(n)):
            deltas[i] = _slope_times(ybar, zs[i], self.acts[i])
            ybars[i] = ybar if curved[i] else None
            if i == 0 and not input_gradient:
                break
            ybar = _buffers.buffer((ybar.shape[0], hs[i].shape[1]))
            _input_grad(weights, offsets[i], deltas[i], inst, routed, ybar, "None", ybar)
        dx = ybar if input_gradient else None
        return dx, (hs, zs, inst, routed, deltas, ybars)

    def second_order(self, ctx, state, dL_ddLdx, overwrite: bool):
        """The second half, for ``L2 = <v, dL/dx>`` with ``v = dL_ddLdx`` ``(batch, n_input_dims)``: the tangent pass
        ``xdot_0 = v``, ``zdot_i = xdot_i W_i^T``, ``xdot_{i+1} = act_i'(z_i) * zdot_i``, then the reverse pass of the
        value adjoint from ``xbar_NL+1 = 0``: ``zbar_i = act_i''(z_i) * zdot_i * ybar_i + act_i'(z_i) * xbar_{i+1}``,
        ``xbar_i = zbar_i W_i``; with it::

            dL2/dW_i += delta_i^T xdot_i + zbar_i^T h_i,   dL2/d(dL_dy) = xdot_NL+1,   dL2/dx = xbar_0

        (``overwrite``: this MLP's gradients are zeroed first). ``zbar`` is 0 below no curved layer and is not
        computed there; without any, dL2/dx is ``None``. Returns ``(dL2/d(dL_dy)`` ``(batch, n_output_dims)``,
        ``dL2/dx`` ``(batch, n_input_dims)`` or ``None)``, of ``ctx.x``'s kind."""
        hs, zs, inst, routed, deltas, ybars = state
        store, offsets, zeroing = self.mlp.store, self.offsets, _Zeroing(self.mlp, overwrite)
        tile_table, order = self._tile_tables(ctx.batch, ctx.x.shape[0])
        xdots, zdots = [DEVICE.adopt(dL_ddLdx)], []
        for i, rows in enumerate(self.rows):
            zdot = _buffers.buffer((xdots[i].shape[0], rows))
            _layer_forward(store.params, offsets[i], xdots[i], inst, routed, "None", False, zdot, zdot)
            zdots.append(zdot)
            xdots.append(_slope_times(zdot, zs[i], self.acts[i]))
        below = None                        # act_i'(z_i) * xbar_{i+1} on the way down, xbar_0 at the end
        for i in reversed(range(len(self.rows))):
            _weight_grad(store.grads, offsets[i], deltas[i], xdots[i], tile_table, order, routed, *zeroing.args())
            zbar = below
            if ybars[i] is not None:
                zbar = DEVICE.empty_like(zdots[i]) if below is None else below
                _curvature(zs[i], zdots[i], ybars[i], self.acts[i], below is not None, zbar)
            if zbar is None:
                continue
            _weight_grad(store.grads, offsets[i], zbar, hs[i], tile_table, order, routed, *zeroing.args())
            below = DEVICE.empty_like(zbar, (zbar.shape[0], hs[i].shape[1]))
            z, act = (zs[i - 1], self.acts[i - 1]) if i > 0 else (below, "None")
            _input_grad(store.params, offsets[i], zbar, inst, routed, z, act, below)
        return xdots[-1], below

    def _tile_tables(self, batch, size):
        """``(table, order)`` of the batch's tiles (``batch.routing.tiles``); a single network's batch is
        tiled in order (its table kept per batch size, ``order`` a placeholder)."""
        if batch.routing.routed:
            return batch.routing.tiles
        if size not in self._tiles:
            starts = np.arange(0, size, TILE, dtype=np.int32)
            table = np.stack([starts, np.minimum(starts + TILE, size), np.zeros_like(starts)], axis=1)
            self._tiles = {size: (_buffers.put(table, ti.i32), _buffers.zeros_i32())}
        return self._tiles[size]
