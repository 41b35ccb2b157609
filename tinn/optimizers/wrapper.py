"""Common base of tcnn's wrapper optimizers: one ``nested`` optimizer plus some state.

``nested`` is a full optimizer config (default ``{}`` -> Adam with its defaults).
A wrapper forwards ``learning_rate`` (get and set), ``step_counts()`` and the
inference weights to its nested optimizer unless it overrides them;
``hyperparams()`` reports ``{"otype", "nested": nested.hyperparams(), **own keys}``;
``update_hyperparams`` changes its own keys, forwards ``nested``, and treats a
top-level ``learning_rate`` as tcnn's ``set_learning_rate``. ``state_dict()`` holds
the wrapper's own arrays plus the nested state under ``nested.``.
"""

import numpy as np

from ..registry import create_optimizer
from ..keys import Options
from .optimizer import LEARNING_RATE, Optimizer, Slot, prefixed, unprefixed


def check_learning_rate(optimizer, value) -> float:
    """A learning rate set on a wrapper (tcnn's ``set_learning_rate``), checked as the key."""
    return LEARNING_RATE.convert(value, f"optimizer '{optimizer.otype}'", "learning_rate")


class Wrapper(Optimizer):
    """An optimizer wrapped around ``self.nested``.

    Subclasses hook into a step with ``_before(active)`` / ``_after(active)`` (around
    the nested step) or ``_nested_lr_scale``; ``COUNTS_STEPS`` makes the wrapper keep
    its own step counter (Batched) instead of reporting the nested one.
    """

    COUNTS_STEPS = False

    def __init__(self, nested=None, **hparams):
        super().__init__(**hparams)
        if nested is None:
            nested = create_optimizer({})
        if not isinstance(nested, Optimizer):
            raise TypeError(f"nested must be an Optimizer, got {type(nested).__name__}")
        self.nested = nested

    @classmethod
    def from_config(cls, config, *, otype=None):
        opt = Options("optimizer", otype or cls.otype, config)
        values = opt.read(cls.KEYS)
        nested = opt.raw("nested", {})
        if not isinstance(nested, dict):
            raise ValueError(f"{opt.where}: key 'nested' must be an optimizer config (a dict), got {nested!r}")
        nested = create_optimizer(nested)
        opt.done()
        return cls(nested, **values)

    def hyperparams(self):
        return {"otype": self.otype, "nested": self.nested.hyperparams(), **self.hparams}

    def update_hyperparams(self, config: dict):
        if not isinstance(config, dict):
            raise TypeError(f"optimizer hyperparameters must be a dict, got {type(config).__name__}")
        own = self._validated({k: v for k, v in config.items() if k not in ("otype", "nested", "learning_rate")})
        lr = check_learning_rate(self, config["learning_rate"]) if "learning_rate" in config else None
        if "nested" in config:
            self._update_nested(config["nested"])
        self._set_hparams(own)
        if lr is not None:
            self.learning_rate = lr

    def _update_nested(self, config):
        self.nested.update_hyperparams(config)

    def _set_hparams(self, values: dict):
        self.hparams = values

    @property
    def learning_rate(self) -> float:
        return self.nested.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.nested.learning_rate = check_learning_rate(self, value)

    # -- allocation and stepping ---------------------------------------------------------
    def _allocate(self, slot: Slot, layer_sizes):
        self._bind_slot(slot, layer_sizes)
        self.nested._allocate(self._nested_slot(slot), layer_sizes)
        if self.n_params:
            self._setup()

    def _nested_slot(self, slot: Slot) -> Slot:
        return slot

    def _update(self, active, loss_scale, lr_scale):
        self._before(active)
        self.nested._update(active, loss_scale, self._nested_lr_scale(active, lr_scale))
        self._after(active)

    def _before(self, active):
        """Runs before the nested step."""

    def _after(self, active):
        """Runs after the nested step."""

    def _nested_lr_scale(self, active, lr_scale):
        return lr_scale

    def step_counts(self) -> np.ndarray:
        return super().step_counts() if self.COUNTS_STEPS else self.nested.step_counts()

    def _custom(self):
        return self.nested._custom()

    def _nested_weights(self):
        """``(field, offset)`` of the nested optimizer's inference weights: its own, else the trained ones."""
        return self.nested._custom() or (self._slot.params, self._slot.p_off)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        self._require_allocated()
        state = {"current_step": self._steps.copy()} if self.COUNTS_STEPS else {}
        state.update(self._own_state())
        state.update(prefixed("nested", self.nested.state_dict()))
        return state

    def _load_state(self, state: dict):
        if self.COUNTS_STEPS:
            self._steps[...] = state["current_step"]
        self._load_own(state)
        self.nested._load_state(unprefixed("nested", state))
