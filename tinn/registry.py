"""The ground floor: the otype registries, tcnn's component factories and config reading.

``create_encoding``, ``create_network``, ``create_loss`` and ``create_optimizer`` look a
config's ``otype`` up case-insensitively (tcnn's aliases included) and build the registered
class (``create_encoding`` / ``create_network`` also allocate its parameters; ``build_encoding`` /
``build_network`` give the structure a model allocates as one). A config is a dict, a path to a JSON file, which
may contain comments, or the name of a config shipped in ``tinn/configs`` (``"config_hash"``). Every
component module imports its registry from here; the top-level model and
``create_from_config`` live a floor above, in ``tinn.config``.
"""
from __future__ import annotations

import json
import os
import re

from ._files import check_json_depth
from .keys import check_int, check_precision, check_seed, describe
from .params import allocate


def load_config(config) -> dict:
    """A config dict; the JSON file (comments allowed) at path ``config``; or, where no such file exists, one
    of tcnn's standard configs shipped in ``tinn/configs`` by name: ``"config_hash"``, ``"config"``,
    ``"config_oneblob"``, ``"config_network_array"`` (``".json"`` optional).

    A file that does not parse gives ``ValueError("<file>: invalid JSON at line L, column C: ...")``;
    its top level must be a JSON object. Neither a file nor a shipped name: ``FileNotFoundError`` listing
    the shipped names.
    """
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            path = shipped_config(path)
        with open(path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            column = e.start - raw.rfind(b"\n", 0, e.start)
            raise ValueError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at line {line}, column {column} "
                             f"({e.reason})") from None
        data = parse_json(text, path)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config must be a JSON object, got {type(data).__name__}")
        return data
    raise TypeError("config must be a dict or a path to a JSON file (or the name of a config shipped with tinn), "
                    f"not {type(config).__name__}")


CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def shipped_configs() -> list:
    """The names of the configs shipped in ``tinn/configs`` (``"config_hash"``, ...), sorted."""
    return sorted(name[:-len(".json")] for name in os.listdir(CONFIG_DIR) if name.endswith(".json"))


def shipped_config(name: str) -> str:
    """The path of the shipped config ``name`` (``".json"`` optional); ``FileNotFoundError`` otherwise."""
    stem = name[:-len(".json")] if name.endswith(".json") else name
    if stem in shipped_configs():
        return os.path.join(CONFIG_DIR, stem + ".json")
    raise FileNotFoundError(f"no config file {name!r} and no config of that name shipped with tinn "
                            f"(shipped: {', '.join(shipped_configs())})")


MAX_CONFIG_DEPTH = 100      # arrays and objects nested in a config (tcnn's nest optimizers a few levels deep)

# One pass over the text finds, left to right: a string (kept), a comment (// or # to the end of the line, or
# /* ... */) or a trailing comma (one before a closing bracket, comments between allowed): the comments and
# trailing commas become spaces, so positions in the text stay the file's.
_COMMENT = r'//[^\n]*|#[^\n]*|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/'       # a block comment ends at its first */
_TOKENS = re.compile(rf'"(?:[^"\\\n]|\\.)*"|{_COMMENT}|,(?=(?:\s|{_COMMENT})*[\]}}])', re.DOTALL)
_CONSTANT = re.compile(r'-?\b(?:NaN|Infinity)\b')


def _blank(match) -> str:
    text = match.group()
    return text if text[0] == '"' else re.sub(r"[^\n]", " ", text)


def parse_json(text: str, where: str):
    """JSON with comments, as commentjson and tcnn read it: ``//``, ``#`` and ``/* */`` comments, trailing commas
    and a UTF-8 byte-order mark accepted; NaN and Infinity refused; in time linear in the text's length (the
    comments become spaces, then the standard library parses). Errors are ``ValueError`` naming ``where``, the
    line, the column and the character; arrays and objects nested more than ``MAX_CONFIG_DEPTH`` deep are refused
    before any parser recurses into them."""
    text = _TOKENS.sub(_blank, text[1:] if text.startswith("\ufeff") else text)
    try:
        check_json_depth(text.encode("utf-8", "surrogatepass"), MAX_CONFIG_DEPTH)
    except ValueError as e:
        raise ValueError(f"{where}: invalid JSON: {e} (the limit for a config)") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        pos, line, column, why = e.pos, e.lineno, e.colno, e.msg
    except _Constant:
        strings = _TOKENS.sub(lambda m: " " * len(m.group()), text)          # the constant outside strings
        pos = _CONSTANT.search(strings).start()
        line = text.count("\n", 0, pos) + 1
        column, why = pos - text.rfind("\n", 0, pos), "NaN and Infinity are not JSON"
    what = f"unexpected character {text[pos]!r}" if pos < len(text) else "unexpected end of file"
    raise ValueError(f"{where}: invalid JSON at line {line}, column {column}: {what} ({why})") from None


class _Constant(Exception):
    pass


def _no_constant(name):
    raise _Constant(name)


def check_config_depth(config, what: str):
    """``ValueError`` if the dict ``config`` nests dicts and lists more than ``MAX_CONFIG_DEPTH`` deep (found
    without recursion)."""
    level = [config]
    for _ in range(MAX_CONFIG_DEPTH + 1):
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, (dict, list))]
        if not level:
            return
    raise ValueError(f"{what} config nests dicts and lists more than {MAX_CONFIG_DEPTH} deep")


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
            if "otype" not in cls.__dict__:
                cls.otype = names[0]
            keys = cls.__dict__.get("KEYS")
            if keys:                             # the key table documents itself
                cls.__doc__ = f"{(cls.__doc__ or names[0]).rstrip()}\n\nKeys (tcnn's names and defaults):\n\n" \
                              f"{describe(keys)}\n"
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


def _build(registry: Registry, config, *args, **kwargs):
    config = load_config(config)
    name, cls = registry.lookup(config)
    return cls.from_config(*args, config, otype=name, **kwargs)


def build_encoding(n_input_dims: int, config, *, alignment: int = 0, n_instances: int = 1, seed: int = 1337):
    """An encoding of ``n_input_dims`` inputs, structure only (no parameter memory): a part of a model or
    composite, whose owner allocates one store for all its parts. ``alignment`` pads the output width."""
    enc = _build(encodings, config, _check_dims(n_input_dims, "n_input_dims"),
                 n_instances=_check_instances(n_instances), seed=check_seed(seed))
    if alignment:
        enc.set_alignment(alignment)
    return enc


def build_network(n_input_dims: int, n_output_dims: int, config, *, n_instances: int = 1, seed: int = 1337):
    """An MLP from ``n_input_dims`` to ``n_output_dims``, structure only (see :func:`build_encoding`)."""
    return _build(networks, config, _check_dims(n_input_dims, "n_input_dims"),
                  _check_dims(n_output_dims, "n_output_dims"), n_instances=_check_instances(n_instances),
                  seed=check_seed(seed))


def create_encoding(n_input_dims: int, config, *, alignment: int = 0, n_instances: int = 1, seed: int = 1337,
                    precision: str = "float32"):
    """An encoding of ``n_input_dims`` inputs, ready to use: built, then its parameter store allocated and
    initialised from ``seed`` (``tinn.params.allocate``). ``alignment`` pads the output width (tcnn's torch
    API: 0); ``precision`` (``tinn.keys.PRECISIONS``) is its parameters' dtype."""
    precision = check_precision(precision)
    enc = build_encoding(n_input_dims, config, alignment=alignment, n_instances=n_instances, seed=seed)
    allocate(enc, precision=precision)
    return enc


def create_network(n_input_dims: int, n_output_dims: int, config, *, n_instances: int = 1, seed: int = 1337,
                   precision: str = "float32"):
    """An MLP from ``n_input_dims`` to ``n_output_dims``, ready to use (its parameters allocated, as
    :func:`create_encoding`)."""
    precision = check_precision(precision)
    net = build_network(n_input_dims, n_output_dims, config, n_instances=n_instances, seed=seed)
    allocate(net, precision=precision)
    return net


def create_loss(config):
    """The loss of ``config["otype"]`` (default ``RelativeL2``; tcnn's names and aliases,
    case-insensitive), from a dict or a JSON file. Losses have no other keys."""
    return _build(losses, config)


def create_optimizer(config):
    """The optimizer of ``config["otype"]`` (default ``Adam``) with the config's keys, from a dict
    or a JSON file. Wrappers (EMA, Average, Batched, ExponentialDecay, Lookahead) take their
    inner optimizer's config under ``nested``; Composite a list of them. Unknown keys warn;
    a bad value is a ``ValueError`` naming the optimizer and the key. The optimizer allocates
    its state on its first ``step`` (or ``allocate``)."""
    if isinstance(config, dict):
        check_config_depth(config, "optimizer")
    return _build(optimizers, config)


def _check_dims(n, name):
    return check_int(n, name, 1)


def _check_instances(n):
    return check_int(n, "n_instances", 1)
