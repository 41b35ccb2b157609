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

A warning that a torch call raises (torch's C++ warnings name the innermost Python frame, which is now the
mode's) is shown at the line of the script that made the call, as it would be without the mode.
"""
import contextlib
import os
import sys
import warnings

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
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _callers_frame():
    """The frame of the code that made the torch call now inside the mode: the first frame outside torch
    beyond the mode's ``__torch_function__`` (``None`` outside a call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not _CudaAsCpu.__torch_function__.__code__:
        frame = frame.f_back
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.startswith(_TORCH_DIR)):
        frame = frame.f_back
    return frame


def _shown_at_callers_line(showwarning):
    """``warnings.showwarning`` that shows a warning raised inside the mode at the caller's line."""
    def show(message, category, filename, lineno, file=None, line=None):
        frame = _callers_frame() if filename == __file__ else None
        if frame is not None:
            filename, lineno, line = frame.f_code.co_filename, frame.f_lineno, None
        showwarning(message, category, filename, lineno, file, line)
    return show


@contextlib.contextmanager
def cuda_on_cpu():
    """Run the enclosed code with every request for CUDA served by the CPU (see the module's docstring)."""
    saved = {name: getattr(torch.cuda, name) for name in _STANDINS}
    showwarning = warnings.showwarning
    shown = _shown_at_callers_line(showwarning)
    try:
        for name, standin in _STANDINS.items():
            setattr(torch.cuda, name, standin)
        warnings.showwarning = shown
        with _CudaAsCpu():
            yield
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)
        if warnings.showwarning is shown:
            warnings.showwarning = showwarning


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
