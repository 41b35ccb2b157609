"""Empty encoding (tcnn ``encodings/empty.h``): swallows its inputs.

No keys. Raw output width 0, so the output is only padding, filled with 1 (tcnn's
normal path; its JIT path fills 0). Backward: ``dL/dx = 0``; so is everything of
the second order.
Typical use is inside a ``Composite``, to drop input dims.
"""
import taichi as ti

from ..object import Context
from ..registry import encodings
from .encoding import Encoding


@encodings.register("Empty")
class EmptyEncoding(Encoding):
    """No outputs (tcnn's ``Empty``): drops its inputs, e.g. as one part of a Composite encoding."""

    def __init__(self, n_input_dims: int, **kwargs):
        super().__init__(n_input_dims, 0, **kwargs)

    def _sample_funcs(self, weights, grads):
        """Per sample: ones of the padded width; dL/dx = 0."""
        width, fill, n = self.padded_output_width, self.fill_value, self.n_input_dims
        if not width:
            raise ValueError("an Empty encoding without padding has no outputs, so no per-sample func")

        @ti.func
        def forward(x, k=0):
            return ti.Vector([fill] * width, ti.f32)

        @ti.func
        def vjp(x, dy, k=0):
            return ti.Vector.zero(ti.f32, n)
        return forward, vjp

    def _forward(self, x, batch):
        return batch.ops.full_like(x, self.fill_value, (x.shape[0], self.padded_output_width)), Context(self, x, batch)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        return ctx.batch.ops.full_like(ctx.x, 0.0) if input_gradient else None

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        return ctx.batch.ops.full_like(ctx.x, 0.0, (ctx.x.shape[0], self.padded_output_width)), None
