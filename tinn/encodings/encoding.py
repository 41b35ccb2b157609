"""The encoding base class (tcnn's ``encoding.h``).

An encoding maps ``n_input_dims`` inputs in [0, 1] to ``n_output_dims`` features.
Its raw width can be padded (``set_alignment``, ``set_padded_output_width``);
padded columns hold ``fill_value`` — 1 for most encodings, which gives the MLP
that follows an implicit bias input, and 0 for grids.
"""
from __future__ import annotations

from math import lcm
from typing import Any, NamedTuple

from ..keys import Options, reported
from ..object import Context, DifferentiableObject
from ..runtime.memory import next_multiple


class Encoding(DifferentiableObject):
    """Base of every encoding; ``n_output_dims`` is the padded width, as tcnn's ``output_width()``."""

    fill_value = 1.0
    required_output_alignment = 1
    KEYS: dict = {}
    """Config key -> :class:`~tinn.keys.Key`; the constructor takes each key as a keyword."""

    def __init__(self, n_input_dims: int, n_raw_output_dims: int, *, n_instances: int = 1, seed: int = 1337):
        super().__init__(n_instances, seed)
        self.n_input_dims = n_input_dims
        self.n_raw_output_dims = n_raw_output_dims
        self.padded_output_width = n_raw_output_dims

    @classmethod
    def from_config(cls, n_input_dims: int, config: dict, *, otype: str, **kwargs):
        """The encoding of ``config``, read and validated through ``KEYS``."""
        opt = Options("encoding", otype, config)
        values = opt.read(cls.KEYS)
        opt.done()
        return cls(n_input_dims, **values, **kwargs)

    def hyperparams(self) -> dict:
        return {"otype": self.otype, **reported(self, self.KEYS)}

    @property
    def n_output_dims(self) -> int:
        return self.padded_output_width

    @property
    def n_padding(self) -> int:
        return self.padded_output_width - self.n_raw_output_dims

    def set_padded_output_width(self, width: int):
        if width < self.n_raw_output_dims:
            raise ValueError(f"padded width {width} is below the encoding's width {self.n_raw_output_dims}")
        self.padded_output_width = width

    def _features_into(self, batch):
        """``ti.func (weights, base, k, xs, put, sh, tile, q, col0)`` handing each raw feature of one sample ``xs`` of
        network ``k`` (parameters ``weights[k, base + i]``) to ``put(sh, tile, q, col0 + column, value)``, for an MLP
        kernel that runs the encoding inside its own launch (``NetworkWithInputEncoding``'s inference; ``col0``: where
        the encoding's columns begin, 0 but inside a Composite); ``None`` (the default): the encoding runs its own
        kernel first. The caller fills the padded columns (``fill_value``)."""
        return None

    def set_alignment(self, alignment: int):
        """Pad the output to a multiple of lcm(alignment, required_output_alignment)."""
        if alignment > 0:
            self.set_padded_output_width(
                next_multiple(self.padded_output_width, lcm(alignment, self.required_output_alignment)))


class Kernels(NamedTuple):
    """The kernels of a parameter-free encoding: batch ``forward(x, y)``, ``backward(x, dL_dy, dL_dx)``,
    ``backward_backward(x, dL_ddLdx, dL_dy, dL_ddLdy, dL_dx)`` (second order), the in-kernel
    ``func`` / ``backward_func`` and, if the encoding has one, its writer into an MLP kernel's tile
    (:meth:`Encoding._features_into`)."""

    forward: Any
    backward: Any
    func: Any
    backward_func: Any
    backward_backward: Any
    features_into: Any = None


class KernelEncoding(Encoding):
    """A parameter-free encoding run by the :class:`Kernels` from ``_kernels()``. Batches are numpy arrays
    or ``ti.ndarray``s (the device path, ``tinn.runtime.program``); results are of the kind of the forward input."""

    def _kernels(self) -> Kernels:
        raise NotImplementedError

    def _sample_funcs(self, weights, grads):
        kernels = self._kernels()                   # no parameters: the weights do not matter
        return kernels.func, kernels.backward_func

    def _features_into(self, batch):
        return self._kernels().features_into

    def _forward(self, x, batch):
        y = batch.ops.empty_like(x, (x.shape[0], self.padded_output_width))
        self._kernels().forward(x, y)
        return y, Context(self, x, batch)

    def _backward(self, ctx, dL_dy, input_gradient, overwrite=False):
        if not input_gradient:
            return None
        ops = ctx.batch.ops
        dx = ops.empty_like(ctx.x)
        self._kernels().backward(ctx.x, ops.contiguous(dL_dy), dx)
        return dx

    def _backward_backward_input(self, ctx, dL_ddLdx, dL_dy, overwrite):
        ops = ctx.batch.ops
        dy = ops.empty_like(ctx.x, (ctx.x.shape[0], self.padded_output_width))
        dx = ops.empty_like(ctx.x)
        self._kernels().backward_backward(ctx.x, ops.contiguous(dL_ddLdx), ops.contiguous(dL_dy), dy, dx)
        return dy, dx
