"""Frequency encoding (tcnn ``encodings/frequency.h``), NeRF's positional encoding with pi.

Key: ``n_frequencies`` F (12). For input dim d and frequency f < F the outputs
``d*2F + 2f + s`` are ``sin(2^f * pi * x_d + s * pi/2)``, s in {0, 1}
(sin, then cos). Backward: ``dy/dx_d = 2^f * pi * cos(2^f * pi * x_d + s * pi/2)``; second
derivative ``-(2^f * pi)^2 * sin(2^f * pi * x_d + s * pi/2)``.

The batch forward of a numpy batch on the CPU takes sin and cos of the phase every ``RESTART`` octaves from
numpy (whose float32 ``sin``/``cos`` are SIMD, several times faster than the scalar calls of
Taichi's CPU code) and the octaves between from the double-angle formulas
``sin 2a = 2 sin a cos a``, ``cos 2a = (cos a - sin a)(cos a + sin a)`` in a kernel that
writes the encoding row by row. Each doubling at most doubles the error: a few float32 ulps
in all, below the rounding of the phase itself. A ``ti.ndarray`` batch (the device path) and every
other arch evaluate ``sin`` in the kernel, as the other per-dim encodings.
"""
import math

import numpy as np
import taichi as ti

from ..keys import Key, between
from ..object import Context
from ..registry import encodings
from ..runtime import blas as _blas
from ..runtime.program import is_cpu
from ..runtime.kernels import specialised
from ..runtime.types import F32_2D, F32_4D
from ._per_dim import PerDimEncoding, exp2i

RESTART = 4
"""Octaves per direct sin/cos evaluation in the CPU forward (the others by doubling)."""

SINE_BLOCK = 1 << 16
"""Samples per block of the host sines (numpy releases the GIL: the blocks run in parallel)."""


@specialised
def _expand_kernel(n_frequencies: int, n_dims: int, n_padding: int, fill: float):
    width = 2 * n_frequencies

    @ti.kernel
    def expand(sincos: F32_4D, y: F32_2D):
        """``sincos[r, 0 / 1, d, b]``: sin / cos of the phase at octave ``r * RESTART`` -> ``y``."""
        for b, d in ti.ndrange(y.shape[0], n_dims):
            s, c = 0.0, 0.0
            for f in ti.static(range(n_frequencies)):
                if ti.static(f % RESTART == 0):
                    s, c = sincos[f // RESTART, 0, d, b], sincos[f // RESTART, 1, d, b]
                else:
                    s, c = 2.0 * s * c, (c - s) * (c + s)
                y[b, d * width + 2 * f] = s
                y[b, d * width + 2 * f + 1] = c
        for b, j in ti.ndrange(y.shape[0], n_padding):
            y[b, n_dims * width + j] = fill

    return expand


@encodings.register("Frequency")
class FrequencyEncoding(PerDimEncoding):
    KEYS = {"n_frequencies": Key(12, between(1, 32), "F, octaves per input dim")}

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, **kwargs):
        self.n_frequencies = n_frequencies
        self.width_per_dim = 2 * n_frequencies
        super().__init__(n_input_dims, **kwargs)

    @staticmethod
    def funcs():
        @ti.func
        def octave(j):                              # 2^f for output j = 2f + s, exact in float32
            return exp2i(j // 2)

        @ti.func
        def phase(x, j):
            return octave(j) * math.pi * x + (j % 2) * (math.pi / 2)

        @ti.func
        def value(x, j):
            return ti.sin(phase(x, j))

        @ti.func
        def slope(x, j):
            return octave(j) * math.pi * ti.cos(phase(x, j))

        @ti.func
        def curvature(x, j):
            w = octave(j) * math.pi
            return -w * w * ti.sin(phase(x, j))

        return value, slope, curvature

    def _forward(self, x, batch):
        if batch.on_device or not is_cpu():                # numpy's sin/cos for host batches on the CPU
            return super()._forward(x, batch)
        theta = np.multiply(np.float32(math.pi), x.T, order="C")      # phase() at octave 0, (D, B)
        n_restarts = -(-self.n_frequencies // RESTART)
        sincos = np.empty((n_restarts, 2) + theta.shape, np.float32)

        def block(worker, lo, hi):
            for r in range(n_restarts):
                phase = theta[:, lo:hi] * np.float32(2.0 ** (r * RESTART))    # exact: a power of 2
                np.sin(phase, out=sincos[r, 0, :, lo:hi])
                np.cos(phase, out=sincos[r, 1, :, lo:hi])

        _blas.for_blocks(x.shape[0], SINE_BLOCK, block)
        y = np.empty((x.shape[0], self.padded_output_width), np.float32)
        _expand_kernel(self.n_frequencies, self.n_input_dims, self.n_padding,
                       float(self.fill_value))(sincos, y)
        return y, Context(self, x, batch)
