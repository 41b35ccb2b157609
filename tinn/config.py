"""tcnn's ``config.h``: ``create_from_config`` builds the whole ``TrainableModel`` (loss,
optimizer, ``NetworkWithInputEncoding``, trainer) from one config.

This is the top floor: it imports the model and the trainer it wires. The registries, the
component factories (``create_encoding``, ``create_network``, ``create_loss``,
``create_optimizer``) and ``load_config`` live on the ground floor, ``tinn.registry``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from .keys import check_seed
from .network_with_input_encoding import NetworkWithInputEncoding
from .registry import _check_dims, _check_instances, create_loss, create_optimizer, load_config
from .trainer import Trainer

SECTIONS = ("loss", "optimizer", "encoding", "network")


def section(config: dict, name: str, where: str = "create_from_config") -> dict:
    """``config[name]`` (default ``{}``), which must be a dict: a section is never read as a file path."""
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}: section '{name}' must be a dict (a JSON object) with an 'otype', "
                         f"got {type(value).__name__} {value!r}")
    return value


@dataclass
class TrainableModel:
    """What ``create_from_config`` returns, as tcnn's ``TrainableModel``."""
    loss: object
    optimizer: object
    network: object
    trainer: object


def create_from_config(n_input_dims: int, n_output_dims: int, config, *, n_instances: int = 1,
                       seed: int = 1337, precision: str = "float32") -> TrainableModel:
    """Loss, optimizer, ``NetworkWithInputEncoding`` and ``Trainer`` from one tcnn config. ``precision="float16"``
    trains in tcnn's half precision: float16 parameters and inference weights, float32 gradients
    (``tinn.params.DTYPES``), float32 master weights in the trainer and a dynamic loss
    scale (``tinn.mixed_precision``)."""
    config = load_config(config)
    unknown = set(config) - set(SECTIONS)
    if unknown:
        warnings.warn(f"create_from_config: ignoring unknown sections {sorted(unknown)}", stacklevel=2)
    loss, optimizer, encoding, network = (section(config, name) for name in SECTIONS)
    loss, optimizer = create_loss(loss), create_optimizer(optimizer)
    network = NetworkWithInputEncoding(_check_dims(n_input_dims, "n_input_dims"),
                                       _check_dims(n_output_dims, "n_output_dims"), encoding, network,
                                       n_instances=_check_instances(n_instances), seed=check_seed(seed),
                                       precision=precision)
    return TrainableModel(loss, optimizer, network, Trainer(network, optimizer, loss))
