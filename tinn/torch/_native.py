"""tinycudann's native module (``module.native_tcnn_module``) over a tinn object, and the parameter
tensor whose every write reaches it.

:class:`NativeModule` answers tinycudann's native methods: ``n_input_dims()``, ``n_output_dims()``,
``n_params()``, ``param_precision()``, ``output_precision()``, ``initial_params(seed)`` (a float32 tensor,
``(n_params,)`` or ``(n_instances, n_params)``), ``hyperparams()``, ``name()``; every other attribute is the
wrapped tinn object's (``forward``, ``backward``, ``store``, ...), and ``.object`` is that object.

:class:`Params` is the modules' ``params``: a ``torch.nn.Parameter`` whose ``.data`` is ``detach()``, the same
memory with the *same* version counter (a plain Parameter's ``.data`` has a counter of its own), so a write
through ``params.data`` moves ``params._version`` as in-place writes, ``torch.nn.init``, optimizers and
``load_state_dict`` do. ``Module`` compares ``(_version, data_ptr)`` before each call and copies the
parameters into the native store only when they moved: a call that changed nothing costs no copy.
"""
import enum

import numpy as np
import torch

from ..runtime.rng import Pcg32


class Precision(enum.Enum):
    """tinycudann's ``Precision``: the type a native module holds its parameters and outputs in."""
    Fp32 = 0
    Fp16 = 1


class NativeModule:
    """tinycudann's native methods over the tinn object ``obj`` (which computes in float32 and stores its
    parameters in its store's precision: float16 for a module built with ``dtype=torch.float16``)."""

    def __init__(self, obj):
        self.object = obj

    def __getattr__(self, name):
        return getattr(self.__dict__["object"], name)

    def n_input_dims(self) -> int:
        return self.object.n_input_dims

    def n_output_dims(self) -> int:
        return self.object.n_output_dims

    def n_params(self) -> int:
        return self.object.n_params

    def param_precision(self) -> Precision:
        return Precision.Fp16 if self.object.store.precision == "float16" else Precision.Fp32

    def output_precision(self) -> Precision:
        """As tinycudann's: the parameters' precision (a module returns its outputs in that dtype)."""
        return self.param_precision()

    @property
    def loss_scale(self) -> float:
        """tinycudann's: 128 for float16 parameters (gradients are scaled by it inside the backward), else 1."""
        return 128.0 if self.param_precision() is Precision.Fp16 else 1.0

    def initial_params(self, seed: int) -> torch.Tensor:
        """Initial parameters for ``seed`` (instance k draws from ``pcg32(seed, seq=k+1)``), as the module's
        ``params`` has them."""
        K = self.object.n_instances
        values = self.object.initial_params(Pcg32(int(seed), seq=np.arange(1, K + 1)))
        return torch.from_numpy(np.ascontiguousarray(values[0] if K == 1 else values))

    def hyperparams(self) -> dict:
        return self.object.hyperparams()

    def name(self) -> str:
        return self.object.name


class Params(torch.nn.Parameter):
    """A ``Parameter`` whose ``.data`` shares its version counter (see the module docstring)."""

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, value):
        torch.Tensor.data.__set__(self, value)

    def __repr__(self):
        return "Parameter containing:\n" + repr(self.detach().as_subclass(torch.Tensor))


def as_params(values: torch.Tensor, requires_grad: bool = True) -> Params:
    """``values`` as a :class:`Params` (no copy)."""
    return Params(values.detach() if isinstance(values, torch.Tensor) else torch.as_tensor(values), requires_grad)
