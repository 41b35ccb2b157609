"""The autograd functions behind :class:`tinn.torch.Module` (tinycudann's ``_module_function`` pair).

``_ModuleFunction``: ``y = f(x; params)`` by the native object's ``forward``; its backward is itself a
differentiable function, ``_ModuleFunctionBackward``: ``(dL/dx, dL/dparams) = g(dL/dy, x; params)`` by the
native ``backward``, whose own backward is the native ``backward_backward_input``: for
``L2 = <dL2/d(dL/dx), dL/dx>`` it gives ``dL2/d(dL/dy)``, ``dL2/dx`` and ``dL2/dparams`` (an Eikonal loss on
an input gradient reaches the parameters and the inputs).

Both functions run on contiguous float32 tensors on the device :mod:`tinn.torch._tensors` names for
Taichi's arch (the module converts around them, so torch differentiates the conversions), and every
tensor crosses to the native calls and back there: numpy views without copies on the CPU's own path,
one copy kernel per tensor into and out of ``ti.ndarray``s on the device path (CUDA tensors with Taichi
on CUDA: nothing passes through the host), numpy and one upload where torch cannot hold Taichi's memory
(Vulkan, Metal). Each forward keeps its own native context, so several forwards may precede their
backwards. Parameter gradients are read from the native store right after each native call, so calls
never see each other's gradients.

A module of float16 parameters scales as tinycudann does: the output gradient is multiplied by
``native.loss_scale`` (128) before the native backward (which sums the parameter gradients in float32), and every
gradient it returns is divided by it (float32 modules: scale 1, nothing is multiplied).
"""
from __future__ import annotations

import torch

from ._store import read_gradients
from ._tensors import from_tinn, to_tinn


def _scaled(t, scale: float):
    return t if scale == 1.0 else (t * scale).contiguous()


def _unscaled(t, scale: float):
    return t if scale == 1.0 else t / scale


def _none_if_empty(t):
    return None if t is None or t.dim() == 0 else t


class _ModuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, native, x, params, instance):
        ctx.set_materialize_grads(False)
        y, native_ctx = native.forward(to_tinn(x), instance)
        ctx.native, ctx.native_ctx = native, native_ctx
        ctx.save_for_backward(x, params)
        return from_tinn(y)

    @staticmethod
    def backward(ctx, dy):
        if dy is None:
            return None, None, None, None
        ctx.native._check_runtime()         # a graph built before ti.reset(): RuntimeResetError
        x, params = ctx.saved_tensors
        dx, dparams = _ModuleFunctionBackward.apply(ctx, dy.to(torch.float32), x, params)
        return None, _none_if_empty(dx), _none_if_empty(dparams), None


class _ModuleFunctionBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fwd, dy, x, params):
        ctx.set_materialize_grads(False)
        ctx.fwd = fwd
        ctx.save_for_backward(dy, x, params)
        native = fwd.native
        want_dx, want_dparams = fwd.needs_input_grad[1], fwd.needs_input_grad[2]
        scale = native.loss_scale
        dx = native.backward(fwd.native_ctx, to_tinn(_scaled(dy, scale)), input_gradient=want_dx)
        dx = _unscaled(from_tinn(dx), scale) if want_dx else torch.empty(())
        dparams = _unscaled(read_gradients(native.object, params), scale) if want_dparams else torch.empty(())
        return dx, dparams

    @staticmethod
    def backward(ctx, d_dx, d_dparams):
        if d_dparams is not None:
            raise RuntimeError("tinn.torch: a loss on the parameter gradient cannot be differentiated (only "
                               "losses on the input gradient, e.g. Eikonal terms, have second derivatives)")
        if d_dx is None:
            return None, None, None, None
        dy, x, params = ctx.saved_tensors
        fwd = ctx.fwd
        native = fwd.native
        native._check_runtime()
        scale = native.loss_scale
        d_dy, dx = native.backward_backward_input(fwd.native_ctx, to_tinn(_scaled(d_dx, scale)), to_tinn(dy))
        d_dy = _unscaled(from_tinn(d_dy), scale) if ctx.needs_input_grad[1] else None
        dx = _unscaled(from_tinn(dx), scale) if ctx.needs_input_grad[2] else None
        dparams = _unscaled(read_gradients(native.object, params), scale) if ctx.needs_input_grad[3] else None
        return None, d_dy, dx, dparams
