"""tinn as tinycudann's PyTorch extension: ``import tinn.torch as tcnn``.

    model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward(); optimizer.step()

Requires torch (``pip install "tinn[torch]"``); ``import tinn`` alone never imports it.
See :mod:`tinn.torch.modules` for the modules and :mod:`tinn.torch.distributed` for training
across processes with ``torch.distributed``.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:          # pragma: no cover - exercised only without torch
    raise ImportError("tinn.torch needs PyTorch: pip install \"tinn[torch]\" (or any torch>=2.0)") from e

from .modules import (Encoding, Module, Network, NetworkWithInputEncoding, free_temporary_memory,
                      supports_jit_fusion)

__all__ = ["Encoding", "Module", "Network", "NetworkWithInputEncoding", "free_temporary_memory",
           "supports_jit_fusion"]
