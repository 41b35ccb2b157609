"""Kernels shared by the encodings that treat every input dimension alike.

Identity, Frequency (and any encoding of the same shape) produce ``width``
outputs per input dim, ``y[d * width + j] = value(x_d, j)``, so their backward
is ``dL/dx_d = sum_j dL/dy[d * width + j] * slope(x_d, j)`` and their second order (for
``L2 = <v, dL/dx>``) ``dL2/d(dL/dy[d * width + j]) = slope(x_d, j) v_d``,
``dL2/dx_d = v_d sum_j dL/dy[d * width + j] * curvature(x_d, j)``. A component only
supplies the three ``ti.func``s; the batch kernels (and the writer of one sample's features
into a fused MLP kernel's tile) are built here once per (component, config) and shared by
every object with that config. A component may replace the batch forward where its formula
allows a faster one (Frequency on the CPU).
"""


import taichi as ti

from ..runtime.kernels import specialised
from ..runtime.types import F32_2D
from .encoding import KernelEncoding, Kernels



@ti.func
def exp2i(e):
    """2^e for an integer -126 <= e <= 127, exactly, from the float's bit pattern (no pow call)."""
    return ti.bit_cast((ti.cast(e, ti.i32) + 127) << 23, ti.f32)


@specialised
def _kernels(cls, constants: tuple, n_dims: int, width: int, n_padding: int, fill: float):
    value, slope, curvature = cls.funcs(*constants)
    raw = n_dims * width

    @ti.kernel
    def forward(x: F32_2D, y: F32_2D):
        for b, d in ti.ndrange(x.shape[0], n_dims):
            for j in range(width):
                y[b, d * width + j] = value(x[b, d], j)
        for b, j in ti.ndrange(x.shape[0], n_padding):
            y[b, raw + j] = fill

    @ti.kernel
    def backward(x: F32_2D, dy: F32_2D, dx: F32_2D):
        for b, d in ti.ndrange(x.shape[0], n_dims):
            acc = 0.0
            for j in range(width):
                acc += dy[b, d * width + j] * slope(x[b, d], j)
            dx[b, d] = acc

    @ti.func
    def func(x, k=0):
        y = ti.Vector.zero(ti.f32, raw + n_padding)
        for d in ti.static(range(n_dims)):
            for j in range(width):
                y[d * width + j] = value(x[d], j)
        for j in ti.static(range(n_padding)):
            y[raw + j] = fill
        return y

    @ti.func
    def backward_func(x, dy, k=0):
        dx = ti.Vector.zero(ti.f32, n_dims)
        for d in ti.static(range(n_dims)):
            for j in range(width):
                dx[d] += dy[d * width + j] * slope(x[d], j)
        return dx

    @ti.kernel
    def backward_backward(x: F32_2D, v: F32_2D, dy: F32_2D, d_dy: F32_2D, dx: F32_2D):
        for b, d in ti.ndrange(x.shape[0], n_dims):
            acc = 0.0
            for j in range(width):
                d_dy[b, d * width + j] = slope(x[b, d], j) * v[b, d]
                acc += dy[b, d * width + j] * curvature(x[b, d], j)
            dx[b, d] = acc * v[b, d]
        for b, j in ti.ndrange(x.shape[0], n_padding):
            d_dy[b, raw + j] = 0.0

    @ti.func
    def features_into(weights: ti.template(), base, k, xs, put: ti.template(), sh: ti.template(), tile, q, col0):
        for d in ti.static(range(n_dims)):
            for j in range(width):
                put(sh, tile, q, col0 + d * width + j, value(xs[d], j))

    return Kernels(forward, backward, func, backward_func, backward_backward, features_into)


class PerDimEncoding(KernelEncoding):
    """An encoding given by ``value(x, j)``, its derivative ``slope(x, j)`` and second derivative
    ``curvature(x, j)`` per input dim."""

    width_per_dim: int

    def __init__(self, n_input_dims: int, *, n_instances: int = 1, seed: int = 1337):
        super().__init__(n_input_dims, n_input_dims * self.width_per_dim, n_instances=n_instances, seed=seed)

    def constants(self) -> tuple:
        """The config values ``funcs`` closes over."""
        return ()

    @staticmethod
    def funcs(*constants):
        """``(value, slope, curvature)`` ``ti.func``s of ``(x: f32, j: i32) -> f32``: the output and its first and
        second derivative in x."""
        raise NotImplementedError

    def _kernels(self):
        return _kernels(type(self), self.constants(), self.n_input_dims, self.width_per_dim,
                        self.n_padding, float(self.fill_value))
