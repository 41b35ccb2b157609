"""Identity encoding (tcnn ``encodings/identity.h``): ``y_j = scale * x_j + offset``.

Keys: ``IdentityEncoding.KEYS``. Backward: ``dL/dx_j = scale * dL/dy_j``; linear, so its second derivative is 0.
"""
import taichi as ti

from ..keys import Key
from ..registry import encodings
from ._per_dim import PerDimEncoding


@encodings.register("Identity")
class IdentityEncoding(PerDimEncoding):
    width_per_dim = 1
    KEYS = {"scale": Key(1.0, doc="multiplies the input"), "offset": Key(0.0, doc="added after scaling")}

    def __init__(self, n_input_dims: int, scale: float = 1.0, offset: float = 0.0, **kwargs):
        self.scale, self.offset = float(scale), float(offset)
        super().__init__(n_input_dims, **kwargs)

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

        @ti.func
        def curvature(x, j):
            return 0.0

        return value, slope, curvature
