"""Spherical-harmonics encoding (tcnn ``encodings/spherical_harmonics.h``).

Key: ``degree`` (4), the number of bands, 1 to 8; the input must have exactly 3 dims,
a direction ``v`` given as ``(v + 1) / 2`` (not renormalised). With
``(x, y, z) = 2 * input - 1`` the ``degree^2`` outputs are the real spherical harmonics
of bands ``l < degree``, output ``i = l^2 + l + m`` for ``m = -l .. l``::

    C_m + i S_m = (x + i y)^m
    K(l, m)     = sqrt((2l + 1) / (4 pi) * (l - |m|)! / (l + |m|)!)
    P(m, m)     = (1 - 2m) P(m - 1, m - 1),   P(m + 1, m) = (2m + 1) z P(m, m),
    P(l, m)     = ((2l - 1) z P(l - 1, m) - (l + m - 1) P(l - 2, m)) / (l - m)
    Y(l, m)     = sqrt(2) K(l, m) C_m P(l, m)  (m > 0),  sqrt(2) K(l, |m|) S_|m| P(l, |m|)  (m < 0),
                  K(l, 0) P(l, 0)  (m = 0)

which are tcnn's hard-coded polynomials (e.g. ``Y_6 = 0.31539156525252 (3 z^2 - 1)``).
Backward: ``dL/dinput = 2 * sum_i dL/dY_i * grad_(x,y,z) Y_i`` (the factor 2 is the
``[0, 1] -> [-1, 1]`` map), using ``dC_m/dx = m C_(m-1)``, ``dC_m/dy = -m S_(m-1)``,
``dS_m/dx = m S_(m-1)``, ``dS_m/dy = m C_(m-1)`` and the z-derivative of the recurrence. The
second order (``L2 = <v, dL/dinput>``) applies them twice: ``dL2/dY_i = 2 grad Y_i . v``,
``dL2/dinput = 4 sum_i dL/dY_i * (Hessian of Y_i) v``.

The kernels evaluate this recurrence (about ``degree^2`` multiply-adds, unrolled at
compile time) rather than 64 expanded polynomials. Padding (fill 1) is placed *after*
the values, as for every other encoding (tcnn's non-JIT path puts it before).
"""
import math

import numpy as np
import taichi as ti

from ..keys import Key, between
from ..registry import encodings
from ..runtime.kernels import specialised, static_chunks
from ..runtime.types import F32_2D
from .encoding import KernelEncoding, Kernels



def sh_plan(degree: int):
    """The static evaluation plan of bands ``l < degree``.

    Returns ``(steps, outputs, n_p)``: ``steps`` computes the associated Legendre values
    ``P[i] = const + a * z * P[j] - b * P[k]`` in order (``j``/``k`` = -1 when absent), and
    each output ``(i, coefficient, m, uses_sine, P index)`` is ``coefficient * (S_m or C_m) * P``.
    """
    index, steps = {}, []
    for m in range(degree):
        for l in range(m, degree):
            i = index[l, m] = len(index)
            if l == m:                            # P(m, m) = (1 - 2m) P(m-1, m-1) = prod_k (1 - 2k)
                steps.append((i, float(np.prod([1.0 - 2 * k for k in range(1, m + 1)])), 0.0, -1, 0.0, -1))
            elif l == m + 1:
                steps.append((i, 0.0, float(2 * m + 1), index[m, m], 0.0, -1))
            else:
                steps.append((i, 0.0, (2 * l - 1) / (l - m), index[l - 1, m], (l + m - 1) / (l - m), index[l - 2, m]))
    outputs = []
    for l in range(degree):
        for m in range(-l, l + 1):
            a = abs(m)
            K = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - a) / math.factorial(l + a))
            coefficient = K if m == 0 else math.sqrt(2.0) * K
            outputs.append((l * l + l + m, coefficient, a, m < 0, index[l, a]))
    return steps, outputs, len(index)


@specialised
def _kernels(degree: int, n_padding: int, fill: float):
    steps, outputs, n_p = sh_plan(degree)
    steps, outputs = static_chunks(steps), static_chunks(outputs)       # static loops of <= 32 (Taichi warns beyond)
    raw = degree * degree
    width = raw + n_padding
    columns = static_chunks(list(range(width)))

    @ti.func
    def basis(v):
        """C_m, S_m (m < degree) and P, dP/dz, d2P/dz2 at the direction v = 2 * input - 1."""
        C = ti.Vector.zero(ti.f32, degree)
        S = ti.Vector.zero(ti.f32, degree)
        C[0] = 1.0
        for m in ti.static(range(1, degree)):
            C[m] = v[0] * C[m - 1] - v[1] * S[m - 1]
            S[m] = v[0] * S[m - 1] + v[1] * C[m - 1]
        P = ti.Vector.zero(ti.f32, n_p)
        dP = ti.Vector.zero(ti.f32, n_p)
        ddP = ti.Vector.zero(ti.f32, n_p)
        for chunk in ti.static(steps):
            for i, const, a, j, c, k in ti.static(chunk):
                if ti.static(j < 0):
                    P[i] = const
                elif ti.static(k < 0):
                    P[i] = a * v[2] * P[j]
                    dP[i] = a * (P[j] + v[2] * dP[j])
                    ddP[i] = a * (2.0 * dP[j] + v[2] * ddP[j])
                else:
                    P[i] = a * v[2] * P[j] - c * P[k]
                    dP[i] = a * (P[j] + v[2] * dP[j]) - c * dP[k]
                    ddP[i] = a * (2.0 * dP[j] + v[2] * ddP[j]) - c * ddP[k]
        return C, S, P, dP, ddP

    @ti.func
    def harmonic(C, S, m: ti.template(), sine: ti.template()):
        """``(A, A_x, A_y, A_xx, A_xy, A_yy)`` of A = S_m (``sine``) or C_m: ``dC_m/dx = m C_(m-1)``,
        ``dC_m/dy = -m S_(m-1)``, ``dS_m/dx = m S_(m-1)``, ``dS_m/dy = m C_(m-1)``, applied twice."""
        a = ti.Vector.zero(ti.f32, 6)
        if ti.static(m == 0):
            a[0] = 1.0
        elif ti.static(sine):
            a[0], a[1], a[2] = S[m], m * S[m - 1], m * C[m - 1]
        else:
            a[0], a[1], a[2] = C[m], m * C[m - 1], -m * S[m - 1]
        if ti.static(m >= 2):
            mm = ti.static(m * (m - 1))
            if ti.static(sine):
                a[3], a[4], a[5] = mm * S[m - 2], mm * C[m - 2], -mm * S[m - 2]
            else:
                a[3], a[4], a[5] = mm * C[m - 2], -mm * S[m - 2], -mm * C[m - 2]
        return a

    @ti.func
    def func(x, k=0):
        """The padded output for one input ``x`` (a 3-vector in [0, 1])."""
        C, S, P, _, _ = basis(2.0 * x - 1.0)
        y = ti.Vector.zero(ti.f32, width)
        for chunk in ti.static(outputs):
            for i, coefficient, m, sine, p in ti.static(chunk):
                if ti.static(sine):
                    y[i] = coefficient * S[m] * P[p]
                else:
                    y[i] = coefficient * C[m] * P[p]
        for chunk in ti.static(columns):
            for j in ti.static(chunk):
                if ti.static(j >= raw):
                    y[j] = fill
        return y

    @ti.func
    def features_into(weights: ti.template(), base, k, xs, put: ti.template(), sh: ti.template(), tile, q, col0):
        """The raw outputs of one input ``xs``, each handed to ``put`` (``Encoding._features_into``)."""
        C, S, P, _, _ = basis(2.0 * xs - 1.0)
        for chunk in ti.static(outputs):
            for i, coefficient, m, sine, p in ti.static(chunk):
                if ti.static(sine):
                    put(sh, tile, q, col0 + i, coefficient * S[m] * P[p])
                else:
                    put(sh, tile, q, col0 + i, coefficient * C[m] * P[p])

    @ti.func
    def backward_func(x, dy, k=0):
        """dL/dinput = 2 * sum_i dy_i * grad Y_i for one input ``x`` and output gradient ``dy`` (padded width)."""
        C, S, P, dP, _ = basis(2.0 * x - 1.0)
        g = ti.Vector.zero(ti.f32, 3)
        for chunk in ti.static(outputs):
            for i, coefficient, m, sine, p in ti.static(chunk):
                w = dy[i] * coefficient
                if ti.static(m == 0):
                    g[2] += w * dP[p]
                elif ti.static(sine):
                    g += w * ti.Vector([m * S[m - 1] * P[p], m * C[m - 1] * P[p], S[m] * dP[p]])
                else:
                    g += w * ti.Vector([m * C[m - 1] * P[p], -m * S[m - 1] * P[p], C[m] * dP[p]])
        return 2.0 * g

    @ti.func
    def backward_backward_func(x, v, dy):
        """Second order for ``L2 = <v, dL/dinput>``: ``(dL2/dy_i = 2 grad Y_i . v, dL2/dinput = 4 sum_i dy_i H_i v)``
        with H_i the Hessian of Y_i (the factors 2 are the ``[0, 1] -> [-1, 1]`` map)."""
        C, S, P, dP, ddP = basis(2.0 * x - 1.0)
        w = 2.0 * v
        t = ti.Vector.zero(ti.f32, width)
        h = ti.Vector.zero(ti.f32, 3)
        for chunk in ti.static(outputs):
            for i, coefficient, m, sine, p in ti.static(chunk):
                a = harmonic(C, S, m, sine)
                t[i] = coefficient * (a[1] * P[p] * w[0] + a[2] * P[p] * w[1] + a[0] * dP[p] * w[2])
                h += dy[i] * coefficient * ti.Vector([
                    (a[3] * w[0] + a[4] * w[1]) * P[p] + a[1] * dP[p] * w[2],
                    (a[4] * w[0] + a[5] * w[1]) * P[p] + a[2] * dP[p] * w[2],
                    (a[1] * w[0] + a[2] * w[1]) * dP[p] + a[0] * ddP[p] * w[2]])
        return t, 2.0 * h

    @ti.func
    def row(a: ti.template(), b, n: ti.template(), used: ti.template()):
        """Row b of a batch array as an n-vector of its first ``used`` columns (0 after them)."""
        g = ti.Vector.zero(ti.f32, n)
        for chunk in ti.static(static_chunks(list(range(used)))):
            for j in ti.static(chunk):
                g[j] = a[b, j]
        return g

    @ti.kernel
    def forward(x: F32_2D, y: F32_2D):
        for b in range(x.shape[0]):
            out = func(row(x, b, 3, 3))
            for chunk in ti.static(columns):
                for j in ti.static(chunk):
                    y[b, j] = out[j]

    @ti.kernel
    def backward(x: F32_2D, dy: F32_2D, dx: F32_2D):
        for b in range(x.shape[0]):
            d = backward_func(row(x, b, 3, 3), row(dy, b, width, raw))
            for i in ti.static(range(3)):
                dx[b, i] = d[i]

    @ti.kernel
    def backward_backward(x: F32_2D, v: F32_2D, dy: F32_2D, d_dy: F32_2D, dx: F32_2D):
        for b in range(x.shape[0]):
            t, h = backward_backward_func(row(x, b, 3, 3), row(v, b, 3, 3), row(dy, b, width, raw))
            for chunk in ti.static(columns):
                for j in ti.static(chunk):
                    d_dy[b, j] = t[j]
            for i in ti.static(range(3)):
                dx[b, i] = h[i]

    return Kernels(forward, backward, func, backward_func, backward_backward, features_into)


@encodings.register("SphericalHarmonics")
class SphericalHarmonicsEncoding(KernelEncoding):
    KEYS = {"degree": Key(4, between(1, 8), "outputs degree^2 terms")}

    def __init__(self, n_input_dims: int = 3, degree: int = 4, **kwargs):
        if n_input_dims != 3:
            raise ValueError("encoding 'SphericalHarmonics' encodes a direction: n_input_dims must be 3, "
                             f"got {n_input_dims}")
        if not 1 <= degree <= 8:
            raise ValueError(f"encoding 'SphericalHarmonics': key 'degree' must lie in [1, 8]; got {degree!r}")
        self.degree = int(degree)
        super().__init__(n_input_dims, self.degree ** 2, **kwargs)

    def _kernels(self):
        return _kernels(self.degree, self.n_padding, float(self.fill_value))
