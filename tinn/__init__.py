"""tinn: tiny neural networks in Taichi, with tiny-cuda-nn's configs, components and math.

    import taichi as ti, tinn
    tinn.init()          # or any ti.init(...): the user initialises Taichi, importing tinn never does
    model = tinn.create_from_config(2, 3, "config_hash")     # tcnn's config, shipped in tinn/configs
    loss = model.trainer.training_step(x, y)   # x (B, 2), y (B, 3) float32
    y_hat = model.network.inference(x)
"""
import os as _os
import sys as _sys
from importlib import metadata as _metadata

if "-m" in _sys.orig_argv and _sys.orig_argv[_sys.orig_argv.index("-m") + 1:][:1] == ["tinn.deploy"]:
    _os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "0")    # `python -m tinn.deploy --cflags`: only flags on stdout

from .runtime import compiling as _compiling, parsing as _parsing

_parsing.apply()                                # before tinn's own kernels are decorated (see its docstring)
_compiling.apply()                              # tinn's kernels compile without Taichi's CFG pass on the CPU

from . import ad, encodings, losses, networks, optimizers
from .config import TrainableModel, create_from_config
from .encodings import Encoding
from .losses import Loss
from .network_with_input_encoding import NetworkWithInputEncoding
from .networks import Network
from .optimizers import Optimizer
from .registry import create_encoding, create_loss, create_network, create_optimizer, load_config
from .runtime.program import ForkedProcessError, RuntimeResetError, init
from .trainer import Trainer

try:
    __version__ = _metadata.version("tinn")      # the installed distribution's version (pyproject.toml)
except _metadata.PackageNotFoundError:          # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Encoding", "ForkedProcessError", "Loss", "Network", "NetworkWithInputEncoding", "Optimizer", "RuntimeResetError", "Trainer",
    "TrainableModel", "create_encoding", "create_from_config", "create_loss", "create_network",
    "create_optimizer", "init", "load_config",
]
