"""tinn as tinycudann's PyTorch extension: ``import tinn.torch as tcnn``.

    model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward(); optimizer.step()

Requires torch (``pip install "tinn[torch]"``); ``import tinn`` alone never imports it.
See :mod:`tinn.torch.modules` for the modules and :mod:`tinn.torch.distributed` for training
across processes with ``torch.distributed``.

A script that imports tinycudann runs unchanged after :func:`as_tinycudann` (``import tinycudann`` then
gives this package), or as ``python -m tinn.torch SCRIPT [ARGS]``.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:          # pragma: no cover - exercised only without torch
    raise ImportError("tinn.torch needs PyTorch: pip install \"tinn[torch]\" (or any torch>=2.0)") from e

import sys as _sys

from ._native import Precision
from .modules import (Encoding, Module, Network, NetworkWithInputEncoding, free_temporary_memory,
                      supports_jit_fusion)

__all__ = ["Encoding", "Module", "Network", "NetworkWithInputEncoding", "Precision", "as_tinycudann",
           "free_temporary_memory", "supports_jit_fusion"]


def as_tinycudann():
    """Make ``import tinycudann`` (and ``tinycudann.modules``) resolve to ``tinn.torch`` in this process,
    so a tinycudann client runs without an edit. Returns this package."""
    _sys.modules["tinycudann"] = _sys.modules[__name__]
    _sys.modules["tinycudann.modules"] = _sys.modules[__name__ + ".modules"]
    return _sys.modules[__name__]
