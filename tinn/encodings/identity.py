"""Identity encoding (tcnn ``encodings/identity.h``): ``y_j = scale * x_j + offset``.

Keys: ``scale`` (1.0), ``offset`` (0.0). Backward: ``dL/dx_j = scale * dL/dy_j``.
"""
import taichi as ti

from ..config import Options, encodings
from ._per_dim import PerDimEncoding


@encodings.register("Identity")
class IdentityEncoding(PerDimEncoding):
    width_per_dim = 1

    def __init__(self, n_input_dims: int, scale: float = 1.0, offset: float = 0.0, **kwargs):
        self.scale, self.offset = float(scale), float(offset)
        super().__init__(n_input_dims, **kwargs)

    @classmethod
    def from_config(cls, n_input_dims, config, *, otype="Identity", **kwargs):
        opt = Options("encoding", otype, config)
        enc = cls(n_input_dims, opt.get("scale", 1.0), opt.get("offset", 0.0), **kwargs)
        opt.done()
        return enc

    def hyperparams(self):
        return {"otype": "Identity", "scale": self.scale, "offset": self.offset}

    def constants(self):
        return (self.scale, self.offset)

    @staticmethod
    def funcs(scale, offset):
        @ti.func
        def value(x, j):
            return scale * x + offset

        @ti.func
        def slope(x, j):
            return scale

        return value, slope
