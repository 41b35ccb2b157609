"""The otype registries and tcnn's factories.

``create_encoding``, ``create_network``, ``create_loss`` and ``create_optimizer``
look a config's ``otype`` up case-insensitively (tcnn's aliases included) and
build the registered class; ``create_from_config`` builds the whole
``TrainableModel`` (loss, optimizer, network, trainer) as tcnn's ``config.h``.
A config is a dict or a path to a JSON file, which may contain comments.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import commentjson


def load_config(config) -> dict:
    """A config dict, or the JSON file (comments allowed) at path ``config``."""
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            return commentjson.load(f)
    raise TypeError(f"config must be a dict or a path to a JSON file, not {type(config).__name__}")


class Registry:
    """Case-insensitive map from otype (and aliases) to a component class."""

    def __init__(self, kind: str, default: str):
        self.kind, self.default = kind, default
        self._classes: dict[str, type] = {}
        self._names: dict[str, str] = {}

    def register(self, *names: str):
        """Class decorator: ``@register("HashGrid", "Grid")``; the first name is canonical."""
        def deco(cls):
            for name in names:
                key = name.lower()
                if key in self._classes:
                    raise ValueError(f"{self.kind} otype '{name}' is registered twice")
                self._classes[key], self._names[key] = cls, name
            return cls
        return deco

    def names(self) -> list[str]:
        return sorted(self._names.values(), key=str.lower)

    def lookup(self, config: dict):
        """``(canonical name as written in the registry, class)`` for ``config['otype']``."""
        otype = config.get("otype", self.default)
        if not isinstance(otype, str) or otype.lower() not in self._classes:
            raise ValueError(f"unknown {self.kind} otype {otype!r}; valid otypes: {', '.join(self.names())}")
        return self._names[otype.lower()], self._classes[otype.lower()]


encodings = Registry("encoding", default="OneBlob")
networks = Registry("network", default="CutlassMLP")
losses = Registry("loss", default="RelativeL2")
optimizers = Registry("optimizer", default="Adam")


class Options:
    """Reads a component's keys with tcnn's defaults and names the key in every error."""

    def __init__(self, kind: str, otype: str, config: dict):
        if not isinstance(config, dict):
            raise TypeError(f"{kind} config must be a dict, got {type(config).__name__}")
        self.where = f"{kind} '{otype}'"
        self.config = config
        self.used = {"otype"}

    def get(self, key: str, default, kind=float, *, choices=None, check=None, rule: str = ""):
        """The value of ``key`` (or ``default``), converted to ``kind`` and validated."""
        self.used.add(key)
        value = self.config.get(key, default)
        try:
            if kind is bool:
                if not isinstance(value, bool):
                    raise TypeError
            elif kind is int:
                if isinstance(value, bool) or float(value) != int(value):
                    raise TypeError
                value = int(value)
            elif kind is str:
                if not isinstance(value, str):
                    raise TypeError
            else:
                value = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{self.where}: key '{key}' must be {kind.__name__}, got {value!r}") from None
        if choices is not None:
            match = [c for c in choices if c.lower() == value.lower()]
            if not match:
                raise ValueError(f"{self.where}: key '{key}' must be one of {', '.join(choices)}; got {value!r}")
            value = match[0]
        if check is not None and not check(value):
            raise ValueError(f"{self.where}: key '{key}' {rule}; got {value!r}")
        return value

    def has(self, key: str) -> bool:
        return key in self.config

    def done(self):
        """Warn about keys nobody read (tcnn ignores them; a typo is the usual cause)."""
        unknown = sorted(set(self.config) - self.used)
        if unknown:
            warnings.warn(f"{self.where}: ignoring unknown keys {unknown}", stacklevel=3)


def _build(registry: Registry, config, *args, **kwargs):
    config = load_config(config)
    if not isinstance(config, dict):
        raise TypeError(f"{registry.kind} config must be a dict")
    name, cls = registry.lookup(config)
    return cls.from_config(*args, config, otype=name, **kwargs)


def create_encoding(n_input_dims: int, config, *, alignment: int = 0, n_instances: int = 1, seed: int = 1337):
    """An encoding of ``n_input_dims`` inputs. ``alignment`` pads the output width (tcnn's torch API: 0)."""
    enc = _build(encodings, config, _check_dims(n_input_dims, "n_input_dims"), n_instances=n_instances, seed=seed)
    if alignment:
        enc.set_alignment(alignment)
    return enc


def create_network(n_input_dims: int, n_output_dims: int, config, *, n_instances: int = 1, seed: int = 1337):
    """An MLP from ``n_input_dims`` to ``n_output_dims``."""
    return _build(networks, config, _check_dims(n_input_dims, "n_input_dims"),
                  _check_dims(n_output_dims, "n_output_dims"), n_instances=n_instances, seed=seed)


def create_loss(config):
    return _build(losses, config)


def create_optimizer(config):
    return _build(optimizers, config)


def _check_dims(n, name):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return n


@dataclass
class TrainableModel:
    """What ``create_from_config`` returns, as tcnn's ``TrainableModel``."""
    loss: object
    optimizer: object
    network: object
    trainer: object


def create_from_config(n_input_dims: int, n_output_dims: int, config, *, n_instances: int = 1,
                       seed: int = 1337) -> TrainableModel:
    """Loss, optimizer, ``NetworkWithInputEncoding`` and ``Trainer`` from one tcnn config."""
    from .network_with_input_encoding import NetworkWithInputEncoding
    from .trainer import Trainer

    config = load_config(config)
    unknown = set(config) - {"loss", "optimizer", "encoding", "network"}
    if unknown:
        warnings.warn(f"create_from_config: ignoring unknown sections {sorted(unknown)}", stacklevel=2)
    loss = create_loss(config.get("loss", {}))
    optimizer = create_optimizer(config.get("optimizer", {}))
    network = NetworkWithInputEncoding(n_input_dims, n_output_dims, config.get("encoding", {}),
                                       config.get("network", {}), n_instances=n_instances, seed=seed)
    return TrainableModel(loss, optimizer, network, Trainer(network, optimizer, loss))
