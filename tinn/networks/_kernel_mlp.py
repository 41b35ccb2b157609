"""The MLP of ``mlp.py`` as Taichi kernels on device buffers (the device path, ``tinn._device``).

Same math as the host path (no biases, activations differentiated from the pre-activation)::

    forward, layer i:  z_i[b, r] = sum_c W_i[k_b, r, c] h_i[b, c],   h_{i+1} = act_i(z_i)
    backward:          delta_NL = out_act'(z_NL) * dL/dy
                       dL/dW_i[k, r, c] = sum over samples b of network k of delta_i[b, r] h_i[b, c]
                       delta_{i-1}[b, c] = act_{i-1}'(z_{i-1}[b, c]) * sum_r W_i[k_b, r, c] delta_i[b, r]

``k_b`` is sample b's network in an array. Of the output matrix only the ``n_output_dims`` rows that
are outputs are computed (the padding rows get zero gradients, as in tcnn). Weights and gradients are
read and written in the parameter store's fields; activations live in ``ti.ndarray``s.

Weight gradients are reduced per tile: a tile is up to ``TILE`` consecutive samples of one network
(samples sorted by network for an array), one thread sums a weight's products over its tile, and a
tile adds its sum to the gradient once. On CUDA the fused kernels of ``_fused_mlp.py`` take a single
network's batches (layers up to 64 wide) instead.
"""
import numpy as np
import taichi as ti

from taichi.lang import impl

from .. import _device
from .._kernels import fill_columns
from ..object import Context
from ..routing import TILE
from . import activations
from ._fused_mlp import FusedKernels, fits
from ._mlp_host import HostMLP

FUSED_TILE = {ti.cuda: 64, ti.vulkan: 32}
"""Samples per block of the fused kernels, by arch (Vulkan's software driver has 32 KiB of shared memory)."""

FUSED_ARCHS = (ti.cuda,)
"""Archs where single networks up to 64 wide use the fused kernels (tests add Vulkan to check them there)."""

FUSED_BLOCKS = 512
"""Blocks of the fused backward: each walks over several tiles, so gradients get one add per block."""

_f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
_i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
_i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)


@ti.func
def _network(inst: ti.template(), b, routed: ti.template()):
    k = 0
    if ti.static(routed):
        k = inst[b]
    return k


@ti.kernel
def _layer_forward(W: ti.template(), off: ti.i32, h: _f32_2d, inst: _i32_1d, routed: ti.template(),
                   act: ti.template(), keep_z: ti.template(), z: _f32_2d, out: _f32_2d):
    """``out = act(z)``, ``z[b, r] = sum_c W[k_b, off + r * cols + c] h[b, c]`` (z kept if ``keep_z``)."""
    cols = h.shape[1]
    for b, r in ti.ndrange(out.shape[0], out.shape[1]):
        k = _network(inst, b, routed)
        acc = 0.0
        for c in range(cols):
            acc += W[k, off + r * cols + c] * h[b, c]
        if ti.static(keep_z):
            z[b, r] = acc
        out[b, r] = activations.value(act, acc)


@ti.kernel
def _output_delta(dy: _f32_2d, z: _f32_2d, act: ti.template(), delta: _f32_2d):
    """``delta = out_act'(z) * dL/dy`` over the computed output columns."""
    for b, r in ti.ndrange(delta.shape[0], delta.shape[1]):
        delta[b, r] = dy[b, r] * activations.derivative(act, z[b, r])


@ti.kernel
def _input_grad(W: ti.template(), off: ti.i32, delta: _f32_2d, inst: _i32_1d, routed: ti.template(),
                z: _f32_2d, act: ti.template(), out: _f32_2d):
    """``out[b, c] = act'(z[b, c]) * sum_r W[k_b, off + r * cols + c] delta[b, r]``."""
    cols = out.shape[1]
    for b, c in ti.ndrange(out.shape[0], cols):
        k = _network(inst, b, routed)
        acc = 0.0
        for r in range(delta.shape[1]):
            acc += W[k, off + r * cols + c] * delta[b, r]
        if ti.static(act != "None"):
            acc *= activations.derivative(act, z[b, c])
        out[b, c] = acc


@ti.kernel
def _weight_grad(G: ti.template(), off: ti.i32, delta: _f32_2d, h: _f32_2d, tiles: _i32_2d, order: _i32_1d,
                 routed: ti.template()):
    """``G[k, off + r * cols + c] += sum_{b in tile} delta[b, r] h[b, c]``: a thread per (tile, r, c), one
    add per tile. Tile t is samples ``order[tiles[t, 0] : tiles[t, 1]]`` of network ``tiles[t, 2]``."""
    cols = h.shape[1]
    for t, r, c in ti.ndrange(tiles.shape[0], delta.shape[1], cols):
        acc = 0.0
        for j in range(tiles[t, 0], tiles[t, 1]):
            b = j
            if ti.static(routed):
                b = order[j]
            acc += delta[b, r] * h[b, c]
        ti.atomic_add(G[tiles[t, 2], off + r * cols + c], acc)


class KernelMLP:
    """Forward and backward of one :class:`~tinn.networks.mlp.MLP` as kernels over ``ti.ndarray``s."""

    def __init__(self, mlp):
        self.mlp = mlp
        sizes = mlp.layer_sizes()
        self._starts = [sum(r * c for r, c in sizes[:i]) for i in range(len(sizes))]
        self.rows = [r for r, _ in sizes[:-1]] + [mlp.n_output_dims]      # output padding rows not computed
        self.acts = [mlp.layer_activation(i) for i in range(len(sizes))]
        self._tiles = {}
        self._fused = None
        self._none3 = _device.buffer((1, 1, 1))
        self._pool = _device.Pool()                 # the fused kernels' activations, reused across steps

    @property
    def offsets(self):
        """Where each matrix starts in the store (the MLP may be bound to a new offset at any time)."""
        return [self.mlp._offset + s for s in self._starts]

    def _fused_kernels(self, instance):
        """The fused kernels where they apply (a single network's batch on a fused arch), else ``None``."""
        arch = impl.current_cfg().arch
        if instance is not None or self.mlp.n_instances != 1 or arch not in FUSED_ARCHS or not fits(self.mlp):
            return None
        if self._fused is None:
            layers = [(rows, c, start) for rows, (_, c), start in zip(self.rows, self.mlp.layer_sizes(), self._starts)]
            self._fused = FusedKernels(self.mlp.n_input_dims, layers, self.acts, FUSED_TILE[arch])
        return self._fused

    def run(self, x, routing, keep: bool):
        """``(y, ctx)``: outputs ``(batch, n_output_dims)`` (a ``ti.ndarray``) and, if ``keep``, what the
        backward needs (each layer's input and pre-activation)."""
        instance = routing.instance
        store = self.mlp.store
        weights = store.params if keep else store.inference_params
        B = x.shape[0]
        h = x if _device.is_device(x) else _device.put(x)          # one upload, not one per kernel
        fused = self._fused_kernels(instance)
        if fused is not None:
            return self._run_fused(fused, weights, x, h, routing, keep)
        inst, routed = routing.kernel_ids(h)
        hs, zs, offsets = [h], [], self.offsets
        for i, rows in enumerate(self.rows):
            out = _device.buffer((B, rows))
            z = _device.buffer((B, rows)) if keep else out
            _layer_forward(weights, offsets[i], h, inst, routed, self.acts[i], keep, z, out)
            hs.append(out)
            zs.append(z)
            h = out
        ctx = Context(self.mlp, x, routing, hs=hs, zs=zs, inst=inst, routed=routed) if keep else None
        return h, ctx

    def _run_fused(self, fused, weights, x, h, routing, keep):
        B, T, L = x.shape[0], fused.T, fused.n_layers
        padded = -(-B // T) * T
        ctx = Context(self.mlp, x, routing, fused=fused, h=h) if keep else None
        zs = self._pool.take((L, fused.width, padded), ctx) if keep else self._none3
        hs = self._pool.take((max(L - 1, 1), fused.width, padded), ctx) if keep else self._none3
        y = _device.buffer((B, self.rows[-1]))
        fused.forward(weights, self.mlp._offset, h, padded, keep, zs, hs, y)
        if keep:
            ctx.zs, ctx.hs = zs, hs
        return y, ctx

    def _backward_fused(self, ctx, dL_dy, input_gradient):
        store, fused, B = self.mlp.store, ctx.fused, ctx.x.shape[0]
        dx = _device.buffer((B, self.mlp.n_input_dims) if input_gradient else (1, 1))
        blocks = min(-(-B // fused.T), FUSED_BLOCKS)
        fused.backward(store.params, store.grads, self.mlp._offset, ctx.h, dL_dy, ctx.zs, ctx.hs, blocks,
                       input_gradient, dx)
        return _device.same_kind(dx, ctx.x) if input_gradient else None

    def backward(self, ctx, dL_dy, input_gradient: bool, overwrite: bool):
        store, mlp = self.mlp.store, self.mlp
        if overwrite:
            fill_columns(store.grads, mlp._offset, mlp.n_params, mlp.n_instances, 0.0)
        if getattr(ctx, "fused", None) is not None:
            return self._backward_fused(ctx, dL_dy, input_gradient)
        tile_table, order = self._tile_tables(ctx.routing, ctx.x.shape[0])
        offsets = self.offsets
        delta = _device.empty_like(ctx.hs[-1])
        _output_delta(dL_dy, ctx.zs[-1], self.acts[-1], delta)
        for i in reversed(range(len(self.rows))):
            _weight_grad(store.grads, offsets[i], delta, ctx.hs[i], tile_table, order, ctx.routed)
            if i == 0 and not input_gradient:
                return None
            below = _device.empty_like(delta, (delta.shape[0], ctx.hs[i].shape[1]))
            z, act = (ctx.zs[i - 1], self.acts[i - 1]) if i > 0 else (below, "None")
            _input_grad(store.params, offsets[i], delta, ctx.inst, ctx.routed, z, act, below)
            delta = below
        return _device.same_kind(delta, ctx.x)

    # -- second order runs on the host (numpy's BLAS), from the forward pass's inputs --------------
    def _host_pass(self, ctx):
        """The host path and its forward context for the inputs of the kernel forward ``ctx``."""
        host = self.__dict__.setdefault("_host", HostMLP(self.mlp))
        return host, host.run(np.ascontiguousarray(_device.host(ctx.x)), ctx.routing, keep=True)[1]

    def output_adjoints(self, ctx, dL_dy, input_gradient: bool):
        host, host_ctx = self._host_pass(ctx)
        dx, state = host.output_adjoints(host_ctx, np.ascontiguousarray(_device.host(dL_dy)), input_gradient)
        return dx, (host, host_ctx, state)

    def second_order(self, ctx, state, dL_ddLdx, overwrite: bool):
        host, host_ctx, state = state
        return host.second_order(host_ctx, state, np.ascontiguousarray(_device.host(dL_ddLdx)), overwrite)

    def _tile_tables(self, routing, batch):
        """``(table, order)`` of the batch's tiles (``Routing.tiles``); a single network's batch is tiled in
        order (its table kept per batch size, ``order`` a placeholder)."""
        if routing.routed:
            return routing.tiles
        if batch not in self._tiles:
            starts = np.arange(0, batch, TILE, dtype=np.int32)
            table = np.stack([starts, np.minimum(starts + TILE, batch), np.zeros_like(starts)], axis=1)
            self._tiles = {batch: (_device.put(table, ti.i32), _device.zeros_i32())}
        return self._tiles[batch]
