"""One-blob encoding (tcnn ``encodings/oneblob.h``): a quartic kernel integrated over K bins.

Key: ``n_bins`` K (16, a power of two). With the kernel CDF
``Q(t) = clamp(15/16 u (1 - 2/3 u^2 + 1/5 u^4) + 1/2, 0, 1)``, ``u = K t``, and its
periodic sum ``C(t) = Q(t) + Q(t - 1) + Q(t + 1)`` (the blob wraps around [0, 1])::

    y[d, k] = C((k + 1) / K - x_d) - C(k / K - x_d)
    dy/dx_d = C'(k / K - x_d) - C'((k + 1) / K - x_d),   Q'(t) = K * 15/16 * max(1 - u^2, 0)^2
    d2y/dx_d2 = C''((k + 1) / K - x_d) - C''(k / K - x_d),  Q''(t) = -K^2 * 15/4 * u * max(1 - u^2, 0)

The K outputs of one dim sum to 1. Any power of two up to ``MAX_BINS`` (4096) works, including K > 32;
more bins than that would make every sample's encoding alone wider than any network takes.
"""
import taichi as ti

from ..keys import Key, power_of_two
from ..registry import encodings
from ._per_dim import PerDimEncoding


MAX_BINS = 4096
BINS = power_of_two(MAX_BINS)


@encodings.register("OneBlob")
class OneBlobEncoding(PerDimEncoding):
    KEYS = {"n_bins": Key(16, BINS, "K, bins per input dim")}

    def __init__(self, n_input_dims: int, n_bins: int = 16, **kwargs):
        if not (isinstance(n_bins, int) and BINS(n_bins)):
            raise ValueError(f"OneBlob: key 'n_bins' {BINS.text}, got {n_bins!r}")
        self.n_bins = self.width_per_dim = n_bins
        super().__init__(n_input_dims, **kwargs)

    def constants(self):
        return (self.n_bins,)

    @staticmethod
    def funcs(K):
        @ti.func
        def cdf(t):
            u = K * t
            return ti.math.clamp(15.0 / 16.0 * u * (1.0 - 2.0 / 3.0 * u * u + 0.2 * u ** 4) + 0.5, 0.0, 1.0)

        @ti.func
        def pdf(t):
            u = K * t
            return K * 15.0 / 16.0 * ti.max(1.0 - u * u, 0.0) ** 2

        @ti.func
        def periodic(f: ti.template(), t):
            return f(t) + f(t - 1.0) + f(t + 1.0)

        @ti.func
        def value(x, k):
            return periodic(cdf, (k + 1.0) / K - x) - periodic(cdf, ti.cast(k, ti.f32) / K - x)

        @ti.func
        def slope(x, k):
            return periodic(pdf, ti.cast(k, ti.f32) / K - x) - periodic(pdf, (k + 1.0) / K - x)

        @ti.func
        def pdf_slope(t):
            u = K * t
            return -K * K * 15.0 / 4.0 * u * ti.max(1.0 - u * u, 0.0)

        @ti.func
        def curvature(x, k):
            return periodic(pdf_slope, (k + 1.0) / K - x) - periodic(pdf_slope, ti.cast(k, ti.f32) / K - x)

        return value, slope, curvature
