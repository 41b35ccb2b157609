"""Common base of tcnn's wrapper optimizers: one ``nested`` optimizer plus some state.

``nested`` is a full optimizer config (default ``{}`` -> Adam with its defaults).
A wrapper forwards ``learning_rate`` (get and set), ``step_counts()`` and the
inference weights to its nested optimizer unless it overrides them;
``hyperparams()`` reports ``{"otype", "nested": nested.hyperparams(), **own keys}``;
``update_hyperparams`` changes its own keys, forwards ``nested``, and treats a
top-level ``learning_rate`` as tcnn's ``set_learning_rate`` (all checked first, then changed at one commit
point). ``state_dict()`` holds the wrapper's own arrays plus the nested state under ``nested.``.

Writing a wrapper: ``KEYS``, ``STATE`` and ``create_state()`` as any optimizer (the nested
optimizer is bound first), then ``before_nested(step)`` and / or ``after_nested(step)``
around the nested step (phases of the step: each changes state only in its last line, see ``step.py``; a
``before_nested`` that launches a kernel says so in ``gates_before()`` and evaluates the step's gate there);
``nested_step(step)`` to hand the nested optimizer another step record (a schedule's learning-rate scale;
it changes nothing); ``nested_slot(slot)`` to hand the nested optimizer other
gradients (a pool); ``inference_weights()`` for averaged weights (``nested_weights()`` gives the
weights to average: the nested optimizer's own inference weights, else the trained ones).
A wrapper's kernels read the nested step counts where they live (``nested.steps_array()``)
and the step's mask, so a device step hands them no host table.
"""

from functools import partial

from ..keys import Options
from ..registry import create_optimizer
from .optimizer import LEARNING_RATE, Optimizer, Slot
from .step import later


def check_learning_rate(optimizer, value) -> float:
    """A learning rate set on a wrapper (tcnn's ``set_learning_rate``), checked as the key."""
    return LEARNING_RATE.convert(value, f"optimizer '{optimizer.otype}'", "learning_rate")


class Nesting(Optimizer):
    """An optimizer made of nested ones (:class:`Wrapper`: one; ``Composite``: one per slice).

    ``update_hyperparams`` validates its own keys, plans ``nested`` with ``_planned_nested`` and
    treats a top-level ``learning_rate`` as tcnn's ``set_learning_rate``; the step counts are
    the first nested optimizer's.
    """

    COUNTS_STEPS = False

    def _planned_update(self, config: dict) -> list:
        if not isinstance(config, dict):
            raise TypeError(f"optimizer hyperparameters must be a dict, got {type(config).__name__}")
        own = self._validated({k: v for k, v in config.items() if k not in ("otype", "nested", "learning_rate")})
        lr = check_learning_rate(self, config["learning_rate"]) if "learning_rate" in config else None
        phases = self._planned_nested(config["nested"]) if "nested" in config else []
        phases.append(partial(self._set_hparams, own))
        if lr is not None:
            phases.append(partial(setattr, self, "learning_rate", lr))     # (a setter that can run again)
        return phases

    def _planned_nested(self, config) -> list:
        """The phases of the nested optimizers' update (every value checked first)."""
        raise NotImplementedError

    def _set_hparams(self, values: dict):
        self.hparams = values


class Wrapper(Nesting):
    """An optimizer wrapped around ``self.nested`` (module docstring)."""

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

    def _planned_nested(self, config):
        return self.nested._planned_update(config)

    @property
    def learning_rate(self) -> float:
        return self.nested.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.nested.learning_rate = check_learning_rate(self, value)

    # -- allocation and stepping ---------------------------------------------------------
    def _bind(self, slot: Slot, layer_sizes):
        self._set_slot(slot, layer_sizes)
        self.nested._bind(self.nested_slot(slot) if self.n_params else slot, layer_sizes)
        if self.n_params:
            self.create_state()

    def nested_slot(self, slot: Slot) -> Slot:
        """Where the nested optimizer finds its weights and gradients (default: the same)."""
        return slot

    def _phases(self, step):
        inner = later(step) if self.gates_before() else step
        return ([partial(self.before_nested, step)] + self.nested._phases(self.nested_step(inner)) +
                [partial(self.after_nested, later(step))])

    def gates_before(self) -> bool:
        """Whether :meth:`before_nested` launches the step's first kernel (which then evaluates ``step.gate``)."""
        return False

    def before_nested(self, step):
        """Runs before each nested step (:class:`~tinn.optimizers.step.Step`); with :meth:`gates_before`, the step's
        first kernel."""

    def after_nested(self, step):
        """Runs after each nested step."""

    def nested_step(self, step):
        """The step record passed to the nested optimizer (default: the same); changes nothing."""
        return step

    def _children(self):
        return [("nested", self.nested)]

    def inference_weights(self):
        return self.nested.inference_weights()

    def nested_weights(self):
        """``(field, offset)`` of the nested optimizer's inference weights: its own, else the trained ones."""
        return self.nested.inference_weights() or (self.slot.params, self.slot.p_off)
