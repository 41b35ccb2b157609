"""Empty encoding (tcnn ``encodings/empty.h``, spec §1.7): swallows its inputs.

No keys. Raw output width 0, so the output is only padding, filled with 1 (tcnn's
normal path; its JIT path fills 0, spec §8 A6). Backward: ``dL/dx = 0``.
Typical use is inside a ``Composite``, to drop input dims.
"""
import numpy as np

from ..config import Options, encodings
from ..object import Context
from .encoding import Encoding


@encodings.register("Empty")
class EmptyEncoding(Encoding):
    def __init__(self, n_input_dims: int, **kwargs):
        super().__init__(n_input_dims, 0, **kwargs)

    @classmethod
    def from_config(cls, n_input_dims, config, *, otype="Empty", **kwargs):
        Options("encoding", otype, config).done()
        return cls(n_input_dims, **kwargs)

    def hyperparams(self):
        return {"otype": "Empty"}

    def _forward(self, x, instance):
        return np.full((x.shape[0], self.padded_output_width), self.fill_value, np.float32), Context(self, x, instance)

    def _backward(self, ctx, dL_dy, input_gradient):
        return np.zeros_like(ctx.x) if input_gradient else None
