"""Config keys, declared once per component.

A component lists its JSON keys in one table, ``KEYS = {"name": Key(default, rule, doc)}``,
with tcnn's names and defaults. That table drives everything else: ``from_config``
reads and validates the keys through :class:`Options`, ``hyperparams()`` reports them,
and :func:`describe` writes them into the component's documentation.

Validation rules, for every key:

* a ``bool`` key takes ``true`` / ``false`` only;
* an ``int`` key takes an integer (a Python or numpy integer, or an integral finite
  float such as ``64.0``), never a bool or a string, within int32 (``[-2^31, 2^31)``);
* a ``float`` key takes a finite real number (no NaN, no ±Inf, no bool, no string);
* a ``str`` key with ``choices`` takes one of them, case-insensitively;
* then the key's ``rule`` (a range or a set), if any.

Every failure is a ``ValueError`` naming the component and the key, e.g.
``optimizer 'Adam': key 'l2_reg' must be a finite number, got nan``.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np

INT32_MAX = 2 ** 31 - 1


class Rule:
    """A check on a converted value and the text that states it ("must be >= 1")."""

    def __init__(self, check, text: str):
        self.check, self.text = check, text

    def __call__(self, value) -> bool:
        return bool(self.check(value))


def at_least(lo) -> Rule:
    return Rule(lambda v: v >= lo, f"must be >= {lo}")


def above(lo) -> Rule:
    return Rule(lambda v: v > lo, f"must be > {lo}")


def between(lo, hi) -> Rule:
    return Rule(lambda v: lo <= v <= hi, f"must lie in [{lo}, {hi}]")


def one_of(*values) -> Rule:
    return Rule(lambda v: v in values, f"must be one of {', '.join(map(str, values))}")


NON_NEGATIVE = at_least(0)
POSITIVE_INT = at_least(1)
UNIT_INTERVAL = Rule(lambda v: 0 <= v < 1, "must lie in [0, 1)")
CLOSED_UNIT = between(0, 1)
def power_of_two(hi) -> Rule:
    return Rule(lambda v: 1 <= v <= hi and v & (v - 1) == 0, f"must be a power of two of at most {hi}")
OFF = Rule(lambda v: not v, "is not supported")


REQUIRED = None
"""The default of a key that has none (a Composite's ``nested``)."""


@dataclass(frozen=True)
class Key:
    """One config key: ``default``, optional ``rule``, ``doc``; the type is the default's
    (``kind`` overrides it; ``kind=list`` for a list of nested configs, which the component
    checks itself; a ``REQUIRED`` key has no default), ``choices`` lists a string key's values (matched
    case-insensitively), and ``report=False`` keeps it out of ``hyperparams()``."""

    default: object
    rule: Rule | None = None
    doc: str = ""
    kind: type | None = None
    choices: tuple = ()
    report: bool = True

    @property
    def type(self) -> type:
        if self.kind is not None:
            return self.kind
        d = self.default
        return bool if isinstance(d, bool) else int if isinstance(d, int) else float if isinstance(d, float) else str

    def convert(self, value, where: str, name: str):
        """``value`` converted to the key's type and checked, else ``ValueError`` naming ``where`` and ``name``."""
        kind = self.type
        converted = _convert(value, kind)
        if converted is None:
            raise ValueError(f"{where}: key '{name}' must be {_EXPECTED[kind]}, got {value!r}")
        if kind is list:
            return converted
        if kind is int and not -INT32_MAX - 1 <= converted <= INT32_MAX:
            raise ValueError(f"{where}: key '{name}' must fit a 32-bit integer (at most {INT32_MAX}), got {value!r}")
        if self.choices:
            match = [c for c in self.choices if c.lower() == converted.lower()]
            if not match:
                raise ValueError(f"{where}: key '{name}' must be one of {', '.join(self.choices)}; got {value!r}")
            converted = match[0]
        if self.rule is not None and not self.rule(converted):
            raise ValueError(f"{where}: key '{name}' {self.rule.text}; got {value!r}")
        return converted

    def describe(self, name: str) -> str:
        """``name`` (default; rule): doc — one line of documentation."""
        facts = ["required" if self.default is REQUIRED else repr(self.default)]
        if self.choices:
            facts.append("one of " + ", ".join(self.choices))
        if self.rule is not None:
            facts.append(self.rule.text)
        return f"``{name}`` ({'; '.join(facts)})" + (f": {self.doc}" if self.doc else "")


_EXPECTED = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", list: "a list"}


def _convert(value, kind):
    """The value as ``kind``, or None when it is not one (bools are never numbers, strings never numbers)."""
    if kind is bool:
        return bool(value) if isinstance(value, (bool, np.bool_)) else None
    if kind in (str, list):
        return value if isinstance(value, kind) else None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    if kind is int:
        if isinstance(value, numbers.Integral):
            return int(value)
        v = float(value)
        return int(v) if math.isfinite(v) and v == int(v) else None
    v = float(value)
    return v if math.isfinite(v) else None


def check_int(value, what: str, lo: int = 0, hi: int = INT32_MAX) -> int:
    """An integer argument (Python or numpy int, not bool) in ``[lo, hi]``, else ``ValueError`` naming ``what``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise ValueError(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def check_seed(seed) -> int:
    """A seed: an integer in ``[0, 2^64)`` (pcg32 takes 64-bit seeds)."""
    return check_int(seed, "seed", 0, 2 ** 64 - 1)


PRECISIONS = ("float32", "float16")
"""A model's ``precision`` keyword (``create_from_config``, ``NetworkWithInputEncoding``, ``create_encoding``,
``create_network``): the dtype its parameters and inference weights are stored in (gradients are float32 at
either precision). ``"float16"`` is tcnn's half precision: the trainer keeps float32 master weights and a
dynamic loss scale (``tinn.mixed_precision``)."""


def check_precision(precision) -> str:
    """``"float32"`` or ``"float16"`` from that name (any case) or a numpy dtype of it; else ``ValueError``."""
    name = precision.lower() if isinstance(precision, str) else None
    if name is None:
        try:
            name = np.dtype(precision).name if precision is not None else None
        except TypeError:
            name = None
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    return name


class Options:
    """Reads one component's config through its key table, naming the component in every error."""

    def __init__(self, kind: str, otype: str, config):
        self.where = f"{kind} '{otype}'"
        if not isinstance(config, dict):
            raise ValueError(f"{self.where}: the config must be a dict, got {type(config).__name__} {config!r}")
        self.config = config
        self.used = {"otype"}

    def read(self, keys: dict) -> dict:
        """``{name: value}`` of every key of the table (the config's value, else the default), validated."""
        return {name: self.get(name, key) for name, key in keys.items()}

    def get(self, name: str, key: Key):
        self.used.add(name)
        if key.default is REQUIRED and name not in self.config:
            raise ValueError(f"{self.where}: key '{name}' ({key.doc}) is required")
        return key.convert(self.config.get(name, key.default), self.where, name)

    def has(self, name: str) -> bool:
        return name in self.config

    def raw(self, name: str, default=None):
        """A key's value as given (a nested config, a list of them): the caller checks it."""
        self.used.add(name)
        return self.config.get(name, default)

    def accept(self, *names: str):
        """Keys allowed in the config that this component ignores (e.g. tcnn's ``n_input_dims``)."""
        self.used.update(names)

    def done(self):
        """Warn about keys nobody read (tcnn ignores them; a typo is the usual cause)."""
        unknown = sorted(set(self.config) - self.used)
        if unknown:
            warnings.warn(f"{self.where}: ignoring unknown keys {unknown}", stacklevel=3)


def reported(obj, keys: dict) -> dict:
    """The keys of ``keys`` that ``hyperparams()`` reports, read from ``obj``'s attributes."""
    return {name: getattr(obj, name) for name, key in keys.items() if key.report}


def describe(keys: dict) -> str:
    """The key table as documentation lines."""
    return "\n".join("* " + key.describe(name) for name, key in keys.items())
