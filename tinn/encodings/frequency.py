"""Frequency encoding (tcnn ``encodings/frequency.h``), NeRF's positional encoding with pi.

Key: ``n_frequencies`` F (12). For input dim d and frequency f < F the outputs
``d*2F + 2f + s`` are ``sin(2^f * pi * x_d + s * pi/2)``, s in {0, 1}
(sin, then cos). Backward: ``dy/dx_d = 2^f * pi * cos(2^f * pi * x_d + s * pi/2)``.
"""
import math

import numpy as np
import taichi as ti

from ..config import Options, encodings
from ._per_dim import PerDimEncoding, exp2i


@encodings.register("Frequency")
class FrequencyEncoding(PerDimEncoding):
    def __init__(self, n_input_dims: int, n_frequencies: int = 12, **kwargs):
        self.n_frequencies = n_frequencies
        self.width_per_dim = 2 * n_frequencies
        super().__init__(n_input_dims, **kwargs)

    @classmethod
    def from_config(cls, n_input_dims, config, *, otype="Frequency", **kwargs):
        opt = Options("encoding", otype, config)
        n = opt.get("n_frequencies", 12, int, check=lambda v: 1 <= v <= 32, rule="must lie in [1, 32]")
        opt.done()
        return cls(n_input_dims, n, **kwargs)

    def hyperparams(self):
        return {"otype": "Frequency", "n_frequencies": self.n_frequencies}

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

        return value, slope

    @staticmethod
    def host_value():
        def value(x, j):                            # the same float32 operations as phase() above
            octave_pi = np.exp2(j // 2).astype(np.float32) * np.float32(math.pi)
            shift = (j % 2).astype(np.float32) * np.float32(math.pi / 2)
            return np.sin(octave_pi * x + shift)

        return value
