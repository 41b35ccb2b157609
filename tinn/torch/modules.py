"""tinycudann's PyTorch modules on tinn: ``Module``, ``Network``, ``Encoding``, ``NetworkWithInputEncoding``.

Each module wraps a native tinn object (``native_tcnn_module``, as tinycudann names it) and holds that
object's parameters as one ``torch.nn.Parameter`` ``params``: ``(n_params,)`` in tcnn's order (network
matrices row-major, then the encoding's parameters), ``(n_instances, n_params)`` for a network array.
Its initial values are the native object's for the same ``seed`` (tcnn's ``initial_params(seed)``).

``module(x)`` takes a ``(batch, n_input_dims)`` tensor of any floating dtype and device (any batch size
>= 1) and returns ``(batch, n_output_dims)`` in ``x``'s dtype and device; a network array also takes
``instance=ids`` (``(batch,)`` integers routing each sample to its network) or a dense
``(n_instances, batch, n_input_dims)`` batch. Gradients flow to ``params`` and, when it requires grad, to
``x``, through tinn's hand-written backward; second derivatives of a loss on ``dL/dx`` go through
``backward_backward_input``.

Where tensors are computed on follows Taichi's arch (:mod:`tinn.torch._tensors`): inputs are converted
to float32 on the device tinn reads directly (CUDA tensors when Taichi runs on CUDA, CPU tensors
otherwise) and outputs moved back to ``x``'s device and dtype, so CUDA tensors with Taichi on CUDA stay
on the GPU; on the CPU, numpy views of the tensors reach tinn without copies; on Vulkan or Metal, CPU
tensors are uploaded and read back once per call.

``params`` is owned by torch (optimizers, ``load_state_dict``, ``torch.nn.init``, ``DistributedDataParallel``,
writes under ``torch.no_grad()`` or through ``params.data``, another module holding the same tensor): the
native store is brought up to date before a call only when ``params``' version counter or storage moved
since the last copy (``params`` is a :class:`tinn.torch._native.Params`, whose ``.data`` shares its version
counter), so an ordinary step costs one copy of the parameters and a call that changed nothing none.
A ``params`` replaced by a plain tensor (``load_state_dict(..., assign=True)``) is followed by its storage
and version, but its ``.data`` writes are not seen.

``module.native_tcnn_module`` has tinycudann's native methods (:class:`tinn.torch._native.NativeModule`).

If Taichi is not initialised when the first module is built, ``tinn.init()`` is called (a tinycudann
script has no ``ti.init``); ``supports_jit_fusion()`` is ``False``.

Precision, as tinycudann's ``dtype``: every module takes ``dtype=None``, ``torch.float32`` or ``torch.float16``
(tinycudann's ``Encoding`` argument; ``Network`` and ``NetworkWithInputEncoding`` take it as a keyword).
``torch.float16`` stores the native parameters as float16 and their gradients as float32 (tinn's
``precision="float16"``, on the archs that have float16 fields): ``module.dtype`` is ``torch.float16``,
``param_precision()`` and ``output_precision()`` are ``Fp16``, outputs are half tensors, ``loss_scale`` is 128
(applied inside the backward and divided out of the gradients), and ``params`` stays the float32 master copy,
as tinycudann's.
Otherwise the parameters are float32, ``loss_scale`` is 1, and the output has ``dtype``, or with ``None``
``x``'s dtype (tinycudann's default is its build's half precision; tinn's is float32).
"""
from __future__ import annotations

import gc
import operator

import numpy as np
import torch
from taichi.lang import impl

from .. import NetworkWithInputEncoding as _NativeNetworkWithInputEncoding
from ..registry import create_encoding
from ..runtime import program as _program
from . import _tensors
from ._autograd import _ModuleFunction
from ._native import NativeModule, as_params
from ._store import publish_inference, write_params


def supports_jit_fusion() -> bool:
    """tinycudann's JIT fusion of a model into the user's CUDA kernels: not available (tinn models join
    Taichi kernels through their ``func`` instead)."""
    return False


def free_temporary_memory():
    """Free temporaries held by dead Python objects (tinn allocates its temporaries per call)."""
    gc.collect()


def _ensure_taichi():
    if impl.get_runtime().prog is None:
        _program.init()


def _dims(n, name: str) -> int:
    try:
        return operator.index(n)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {n!r}") from None


class Module(torch.nn.Module):
    """Base of the tinycudann-compatible modules: a native tinn object and its flat ``params``."""

    def __init__(self, seed: int = 1337, n_instances: int = 1, dtype=None):
        super().__init__()
        if dtype not in (None, torch.float32, torch.float16):
            raise ValueError(f"{type(self).__name__} only supports fp32 or fp16 precision, but got {dtype}")
        _ensure_taichi()
        self.seed = _dims(seed, "seed")
        self.n_instances = _dims(n_instances, "n_instances")
        self.output_dtype = dtype
        self.native_tcnn_module = NativeModule(self._native_tcnn_module())
        self.dtype = torch.float16 if dtype == torch.float16 else torch.float32
        self.loss_scale = self.native_tcnn_module.loss_scale
        self.jit_fusion = False
        self.params = as_params(torch.from_numpy(np.array(self.native_tcnn_module.params())))
        self._synced = self._published = self._params_key()

    def _native_tcnn_module(self):
        raise NotImplementedError

    @property
    def _precision(self) -> str:
        """The native object's parameter precision (``tinn.keys.PRECISIONS``)."""
        return "float16" if getattr(self, "output_dtype", None) == torch.float16 else "float32"

    @property
    def n_params(self) -> int:
        return self.native_tcnn_module.n_params()

    @property
    def jit_fusion(self) -> bool:
        """tinycudann's switch for JIT fusion: stored and read back; tinn computes the same way either way."""
        return self._jit_fusion

    @jit_fusion.setter
    def jit_fusion(self, value: bool):
        self._jit_fusion = bool(value)

    def set_jit_fusion(self, value: bool):
        self.jit_fusion = value

    def hyperparams(self) -> dict:
        """The native object's full config (tcnn's ``hyperparams()``)."""
        return self.native_tcnn_module.hyperparams()

    # -- parameters: torch owns them, the native store follows ---------------------------------------
    def _params_key(self):
        p = self.params
        return p._version, p.data_ptr(), p.dtype, p.device

    def _sync_params(self, inference: bool):
        """Copy ``params`` into the native store if torch changed them since the last copy (and into its
        inference weights too before an inference call)."""
        key = self._params_key()
        if key != self._synced:
            write_params(self.native_tcnn_module.object, self.params)
            self._synced = key
        if inference and key != self._published:
            publish_inference(self.native_tcnn_module.object)
            self._published = key

    # -- calls -----------------------------------------------------------------------------------------
    def forward(self, x, instance=None):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, not {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
        self.native_tcnn_module._check_runtime()
        inst = _tensors.instances(instance)
        train = torch.is_grad_enabled() and (x.requires_grad or self.params.requires_grad)
        self._sync_params(inference=not train)
        x32 = x.to(_tensors.device(), torch.float32).contiguous()
        if train:
            y = _ModuleFunction.apply(self.native_tcnn_module, x32, self.params, inst)
        else:
            y = _tensors.from_tinn(self.native_tcnn_module.inference(_tensors.to_tinn(x32), inst))
        return y.to(x.device, self._output_dtype(x))

    def _output_dtype(self, x):
        dtype = getattr(self, "output_dtype", None)
        return x.dtype if dtype is None else dtype

    # -- pickling and copies (tcnn's __getstate__): the native object is rebuilt, params carried -------
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["native_tcnn_module"]
        state["_synced"] = state["_published"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        _ensure_taichi()
        self.native_tcnn_module = NativeModule(self._native_tcnn_module())
        self._parameters["params"] = as_params(self.params, self.params.requires_grad)

    def extra_repr(self):
        return (f"n_input_dims={self.n_input_dims}, n_output_dims={self.n_output_dims}, seed={self.seed}, "
                f"dtype={self.dtype}, hyperparams={self.hyperparams()}")


class NetworkWithInputEncoding(Module):
    """An input encoding followed by a network (one native ``tinn.NetworkWithInputEncoding``).

    ``x``: ``(batch, n_input_dims)``; output ``(batch, n_output_dims)``. ``encoding_config`` and
    ``network_config`` are tcnn's JSON sections (dicts, or paths to JSON files).
    """

    def __init__(self, n_input_dims, n_output_dims, encoding_config, network_config, seed=1337, *,
                 n_instances=1, dtype=None):
        self.n_input_dims = _dims(n_input_dims, "n_input_dims")
        self.n_output_dims = _dims(n_output_dims, "n_output_dims")
        self.encoding_config, self.network_config = encoding_config, network_config
        super().__init__(seed=seed, n_instances=n_instances, dtype=dtype)

    def _native_tcnn_module(self):
        return _NativeNetworkWithInputEncoding(self.n_input_dims, self.n_output_dims, self.encoding_config,
                                               self.network_config, n_instances=self.n_instances, seed=self.seed,
                                               precision=self._precision)


class Network(Module):
    """A network (MLP) from ``n_input_dims`` to ``n_output_dims`` configured by tcnn's ``network`` section,
    laid out as tinycudann's: a network behind an Identity encoding, so the inputs are padded to a multiple
    of 16 with constant-1 columns (a bias of the first layer). For 31 inputs and a 64x2 FullyFusedMLP,
    ``n_params = 32*64 + 64*64 + 64*16 = 7168``. (``tinn.Network`` takes its inputs unpadded.)
    """

    def __init__(self, n_input_dims, n_output_dims, network_config, seed=1337, *, n_instances=1, dtype=None):
        self.n_input_dims = _dims(n_input_dims, "n_input_dims")
        self.n_output_dims = _dims(n_output_dims, "n_output_dims")
        self.network_config = network_config
        super().__init__(seed=seed, n_instances=n_instances, dtype=dtype)

    def _native_tcnn_module(self):
        return _NativeNetworkWithInputEncoding(self.n_input_dims, self.n_output_dims, {"otype": "Identity"},
                                               self.network_config, n_instances=self.n_instances, seed=self.seed,
                                               precision=self._precision)


class Encoding(Module):
    """An input encoding configured by tcnn's ``encoding`` section; ``n_output_dims`` follows from the config
    (no padding, as tinycudann's ``Encoding``).

    ``dtype``: tinycudann's precision (module docstring): ``torch.float16`` stores the parameters as float16
    and returns half outputs; ``torch.float32`` float32; ``None`` float32 parameters, outputs in ``x``'s dtype.
    """

    def __init__(self, n_input_dims, encoding_config, seed=1337, dtype=None, *, n_instances=1):
        self.n_input_dims = _dims(n_input_dims, "n_input_dims")
        self.encoding_config = encoding_config
        super().__init__(seed=seed, n_instances=n_instances, dtype=dtype)
        self.n_output_dims = self.native_tcnn_module.n_output_dims()

    def _native_tcnn_module(self):
        return create_encoding(self.n_input_dims, self.encoding_config, n_instances=self.n_instances, seed=self.seed,
                               precision=self._precision)
