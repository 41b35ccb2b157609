"""``python -m tinn.torch --device cpu``: a tinycudann script that hard-codes CUDA runs on the CPU.

Inside :func:`cuda_on_cpu` (a context manager):

* a device argument that names CUDA names the CPU instead: ``"cuda"``, ``"cuda:1"``, a ``torch.device`` of
  type ``cuda``, and a bare device index given as ``device=`` or as ``Tensor.to``'s first argument. That covers
  ``torch.zeros(..., device="cuda")`` and every factory function, ``x.to(device)``, ``x.cuda()``,
  ``module.to("cuda")`` and ``module.cuda()`` (a ``TorchFunctionMode``, which sees every torch function and
  tensor method called from Python in this thread);
* ``torch.cuda.synchronize``, ``torch.cuda.set_device`` and the ``torch.cuda.device(i)`` context do nothing:
  nothing runs on CUDA.

``torch.device("cuda")`` itself still builds a CUDA device object; it is mapped where a tensor meets it, so a
script's own ``x.device == device`` comparison sees the CPU. Leaving the context restores torch exactly.
"""
import contextlib

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")


def _names_cuda(device) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _is_index(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaAsCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch call to the CPU; ``Tensor.cuda`` becomes ``Tensor.cpu``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0].cpu()
        device = kwargs.get("device")
        if _names_cuda(device) or _is_index(device):
            kwargs["device"] = _CPU
        args = tuple(_CPU if _names_cuda(a) else a for a in args)
        if func is torch.Tensor.to and len(args) > 1 and _is_index(args[1]):
            args = (args[0], _CPU) + args[2:]
        return func(*args, **kwargs)


class _NoDevice(contextlib.nullcontext):
    """``torch.cuda.device(i)`` on the CPU: selects nothing."""

    def __init__(self, device=None):
        super().__init__()


def _synchronize(device=None):
    """``torch.cuda.synchronize`` on the CPU: torch's CPU ops are done when they return."""


def _set_device(device):
    """``torch.cuda.set_device`` on the CPU: there is one device."""


_STANDINS = {"synchronize": _synchronize, "set_device": _set_device, "device": _NoDevice}


@contextlib.contextmanager
def cuda_on_cpu():
    """Run the enclosed code with every request for CUDA served by the CPU (see the module's docstring)."""
    saved = {name: getattr(torch.cuda, name) for name in _STANDINS}
    try:
        for name, standin in _STANDINS.items():
            setattr(torch.cuda, name, standin)
        with _CudaAsCpu():
            yield
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)


def asks_for_missing_cuda(error: BaseException) -> bool:
    """Whether ``error`` is torch refusing CUDA on a machine without it (a CPU build: "Torch not compiled with
    CUDA enabled"; a CUDA build without a GPU: "Found no NVIDIA driver ..."). An error whose ``str()`` fails
    is not (the script's own error is then reported as it is)."""
    try:
        message = str(error)
    except Exception:
        return False
    return (isinstance(error, (AssertionError, RuntimeError)) and not torch.cuda.is_available()
            and ("CUDA" in message or "NVIDIA" in message))
