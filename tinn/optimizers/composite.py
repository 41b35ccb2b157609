"""Composite (tcnn ``optimizers/composite.h``): different optimizers for consecutive parameter slices.

Keys: ``nested`` — a non-empty list of optimizer configs, each with
``n_params_to_optimize`` (default 0). Slice ``i`` is
``[sum_{j<i} n_j, sum_{j<=i} n_j)``; parameters beyond ``sum n_j`` are never updated.

Layer slicing: the matrix layers (``layer_sizes``) lying inside a slice become that
slice's layers (so its nested optimizer sees them as matrix params, followed by its
non-matrix params); a slice boundary strictly inside a layer raises ``ValueError``.
tcnn's ``slice_weights`` instead hands every slice all layers from its first one on
(and its boundary search is off by one layer); tinn implements the intended rule.

``learning_rate`` is a factor (initially 1): setting it to ``f`` sets each nested
learning rate to ``base_i * f`` (``base_i`` = nested learning rate at construction;
changing a nested ``learning_rate`` through ``update_hyperparams`` sets
``base_i = value / f``). ``step_counts()`` are the first nested optimizer's. If any
nested optimizer keeps inference weights, the Composite keeps a full-size inference
buffer: after each nested step, slice ``i`` is copied from that optimizer's inference
weights (or its trained weights), and the unoptimized tail from the parameters.
``hyperparams()`` includes ``n_params_to_optimize`` in each nested entry (tcnn drops
it, so its configs do not round-trip).
State: ``base_learning_rates``, ``learning_rate_factor``, ``custom_weights`` (only with
inference weights) plus ``nested.<i>.*``.
"""
import warnings
from functools import partial

import numpy as np

from ..keys import NON_NEGATIVE, Key, Options
from ..params import Buffer
from ..registry import create_optimizer, optimizers
from ..runtime.kernels import copy_columns
from .optimizer import Slot
from .step import later
from .wrapper import Nesting, check_learning_rate


def _merged(config: dict, changes: dict) -> dict:
    """``config`` with the partial update ``changes`` applied, nested configs included."""
    out = dict(config)
    for key, value in changes.items():
        if key in ("otype", "n_params_to_optimize") or (key == "learning_rate" and "nested" in config):
            continue                                 # a wrapper's learning_rate is set_learning_rate, not a key
        old = config.get(key)
        if key == "nested" and isinstance(old, dict) and isinstance(value, dict):
            value = _merged(old, value)
        elif key == "nested" and isinstance(old, list) and isinstance(value, list) and len(old) == len(value):
            value = [_merged(o, v) if isinstance(o, dict) and isinstance(v, dict) else v for o, v in zip(old, value)]
        out[key] = value
    return out


def slice_layers(layer_sizes, offset: int, size: int):
    """The layers inside ``[offset, offset + size)``; a boundary inside a layer is an error."""
    out, start = [], 0
    for j, (rows, cols) in enumerate(layer_sizes):
        end = start + rows * cols
        for b in (offset, offset + size):
            if start < b < end:
                raise ValueError(f"Composite optimizer: the slice [{offset}, {offset + size}) cuts layer {j} "
                                 f"(params [{start}, {end})); slices may not split a layer")
        if offset <= start and end <= offset + size:
            out.append((rows, cols))
        start = end
    return out


N_PARAMS_TO_OPTIMIZE = Key(0, NON_NEGATIVE, "size of this nested optimizer's slice")


@optimizers.register("Composite")
class Composite(Nesting):
    """Several optimizers, each stepping its own consecutive slice of the parameters (tcnn's
    ``Composite``; see the module docstring for the keys)."""

    otype = "Composite"

    def __init__(self, nested, sizes):
        super().__init__()
        if not nested or len(nested) != len(sizes):
            raise ValueError("Composite optimizer needs a non-empty list of nested optimizers and their sizes")
        self.nested_list, self.sizes = list(nested), [int(n) for n in sizes]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]))
        self.base_learning_rates = np.array([o.learning_rate for o in self.nested_list], np.float64)
        self.learning_rate_factor = np.array(1.0)
        self._has_custom = False

    @classmethod
    def from_config(cls, config, *, otype=None):
        opt = Options("optimizer", otype or cls.otype, config)
        entries = opt.raw("nested")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise ValueError(f"{opt.where}: key 'nested' must be a non-empty list of optimizer configs")
        nested, sizes = [], []
        for i, entry in enumerate(entries):
            sizes.append(N_PARAMS_TO_OPTIMIZE.convert(entry.get("n_params_to_optimize", 0),
                                                      f"{opt.where} nested[{i}]", "n_params_to_optimize"))
            nested.append(create_optimizer({k: v for k, v in entry.items() if k != "n_params_to_optimize"}))
        opt.done()
        return cls(nested, sizes)

    def hyperparams(self):
        return {"otype": self.otype, "nested": [{**o.hyperparams(), "n_params_to_optimize": n}
                                                for o, n in zip(self.nested_list, self.sizes)]}

    def _planned_nested(self, config):
        if not isinstance(config, list) or len(config) != len(self.nested_list):
            raise ValueError(f"Composite optimizer: 'nested' must be a list of {len(self.nested_list)} configs")
        for i, (entry, n) in enumerate(zip(config, self.sizes)):
            if not isinstance(entry, dict):
                raise ValueError(f"Composite optimizer: nested[{i}] must be a dict")
            if entry.get("n_params_to_optimize", n) != n:
                raise ValueError(f"Composite optimizer: nested[{i}] 'n_params_to_optimize' cannot change "
                                 f"({n} -> {entry['n_params_to_optimize']})")
        with warnings.catch_warnings():              # validate every entry before changing any
            warnings.simplefilter("ignore")
            for opt, entry in zip(self.nested_list, config):
                create_optimizer(_merged(opt.hyperparams(), entry))
        phases = []
        for i, entry in enumerate(config):
            entry = {k: v for k, v in entry.items() if k != "n_params_to_optimize"}
            phases += self.nested_list[i]._planned_update(entry)
            if "learning_rate" in entry:
                phases.append(partial(self._rebase, i))
        return phases

    def _rebase(self, i: int):
        """``base_i`` from nested optimizer ``i``'s learning rate just set (module docstring; can run again)."""
        lr, factor = np.float32(self.nested_list[i].learning_rate), np.float32(self.learning_rate_factor)
        self.base_learning_rates[i] = lr / factor

    @property
    def learning_rate(self) -> float:
        return float(self.learning_rate_factor)

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.learning_rate_factor = np.array(float(np.float32(check_learning_rate(self, value))))
        for opt, base in zip(self.nested_list, self.base_learning_rates):
            opt.learning_rate = float(np.float32(base) * np.float32(value))

    # -- allocation and stepping ------------------------------------------------------
    def _bind(self, slot: Slot, layer_sizes):
        total = sum(self.sizes)
        if total > slot.n:
            raise ValueError(f"Composite optimizer: n_params_to_optimize sums to {total}, "
                             f"but the model has only {slot.n} params")
        self._set_slot(slot, layer_sizes)
        for opt, off, n in zip(self.nested_list, self.offsets, self.sizes):
            opt._bind(Slot(slot.store, slot.params, slot.p_off + off, slot.grads, slot.g_off + off, n),
                      slice_layers(self.layer_sizes, off, n))
        self._has_custom = bool(self.n_params) and any(o.inference_weights() is not None for o in self.nested_list)
        if self._has_custom:
            self.create_state()

    def create_state(self):
        """The full-size inference buffer (only when a nested optimizer keeps inference weights)."""
        slot = self.slot
        self.custom_weights_buffer = C = Buffer(self.n_instances, self.n_params, "Composite inference weights")
        copy_columns(C.field, C.offset, slot.params, slot.p_off, self.n_params, self.all_networks())

    def _phases(self, step):
        """Each slice's step with the same record (its mask already a kernel array; the first slice's first kernel
        evaluates the gate, over every slice's gradients), then the inference copies."""
        s, C = self.slot, getattr(self, "custom_weights_buffer", None)
        phases = []
        for i, (opt, off, n) in enumerate(zip(self.nested_list, self.offsets, self.sizes)):
            phases += opt._phases(step if i == 0 else later(step))
            if self._has_custom:
                phases.append(partial(copy_columns, C.field, C.offset + off,
                                      *(opt.inference_weights() or (s.params, s.p_off + off)), n, step.mask))
        if self._has_custom:                               # the unoptimized tail mirrors the parameters
            total = sum(self.sizes)
            phases.append(partial(copy_columns, C.field, C.offset + total, s.params, s.p_off + total,
                                  self.n_params - total, step.mask))
        return phases

    def _children(self):
        return [(f"nested.{i}", opt) for i, opt in enumerate(self.nested_list)]

    def inference_weights(self):
        return (self.custom_weights_buffer.field, self.custom_weights_buffer.offset) if self._has_custom else None

    def state_arrays(self):
        state = {"base_learning_rates": self.base_learning_rates, "learning_rate_factor": self.learning_rate_factor}
        if self._has_custom:
            state["custom_weights"] = self.custom_weights_buffer
        return state
