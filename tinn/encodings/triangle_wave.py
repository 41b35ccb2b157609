"""Triangle-wave encoding (tcnn ``encodings/triangle_wave.h``).

Key: ``n_frequencies`` F (12). Output ``d * F + k``, k < F::

    v = x_d * 2^(k - 1) + 0.25 k,   y = 4 |v - floor(v) - 0.5| - 1
    dy/dx_d = 2^(k + 1) * s,  s = -1 if floor(2 v) is even else +1   (C's % on negatives: -1 % 2 is odd)

Piecewise linear: its second derivative is 0 (the kinks are not differentiated, as tcnn's slope).
"""
import taichi as ti

from ..keys import Key, between
from ..registry import encodings
from ._per_dim import PerDimEncoding, exp2i


@encodings.register("TriangleWave")
class TriangleWaveEncoding(PerDimEncoding):
    KEYS = {"n_frequencies": Key(12, between(1, 32), "F, octaves per input dim")}

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, **kwargs):
        self.n_frequencies = self.width_per_dim = n_frequencies
        super().__init__(n_input_dims, **kwargs)

    @staticmethod
    def funcs():
        @ti.func
        def phase(x, k):
            return x * exp2i(k - 1) + 0.25 * k

        @ti.func
        def value(x, k):
            v = phase(x, k)
            return 4.0 * ti.abs(v - ti.floor(v) - 0.5) - 1.0

        @ti.func
        def slope(x, k):
            even = ti.cast(ti.floor(2.0 * phase(x, k)), ti.i32) % 2 == 0
            return exp2i(k + 1) * ti.select(even, -1.0, 1.0)

        @ti.func
        def curvature(x, k):                        # piecewise linear (the kinks are ignored, as the slope's jumps)
            return 0.0

        return value, slope, curvature
