"""ExponentialDecay (tcnn ``optimizers/exponential_decay.h``): piecewise-constant learning-rate decay.

Keys: ``nested`` ({} -> Adam) and ``ExponentialDecay.KEYS``.

Before each nested step, with ``s = nested.step_counts()`` (completed steps, per instance)::

    if s == 0: factor = 1
    if s >= start and (s - start) mod interval == 0 and s <= end: factor *= decay_base

and the nested step runs with learning rate ``base_lr * factor``; the first reduced
update is update number ``start + 1``. ``base_lr`` is the nested optimizer's
``learning_rate``. ``learning_rate`` returns ``base_lr * factor``; setting it sets
``base_lr = value / factor``.

Differences from tcnn: the factor is kept per instance (a network that skipped steps
decays on its own schedule); tinn passes ``factor`` to the nested kernels as a
learning-rate scale instead of overwriting the nested ``learning_rate``, so the nested
config keeps reporting ``base_lr`` (and changing ``nested.learning_rate`` changes
the base, where tcnn would overwrite it on the next step). With K > 1 networks
``learning_rate`` uses instance 0's factor.
State: ``learning_rate_factor`` ``(K,)`` plus ``nested.*``.
"""
import numpy as np

from ..registry import optimizers
from ..keys import CLOSED_UNIT, NON_NEGATIVE, POSITIVE_INT, Key
from .wrapper import Wrapper, check_learning_rate


@optimizers.register("ExponentialDecay")
class ExponentialDecay(Wrapper):
    otype = "ExponentialDecay"
    KEYS = {"decay_base": Key(0.1, CLOSED_UNIT, "factor applied to the learning rate at each decay"),
            "decay_start": Key(10000, NON_NEGATIVE, "steps before the first decay"),
            "decay_interval": Key(10000, POSITIVE_INT, "steps between decays"),
            "decay_end": Key(10000000, NON_NEGATIVE, "no decay after this step")}
    STATE = ("learning_rate_factor",)

    def create_state(self):
        self.learning_rate_factor = np.ones(self.n_instances, np.float32)

    def _factor(self) -> np.float32:
        return self.learning_rate_factor[0] if self.slot is not None and self.n_params else np.float32(1)

    @property
    def learning_rate(self) -> float:
        return float(np.float32(self.nested.learning_rate) * self._factor())

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.nested.learning_rate = float(np.float32(check_learning_rate(self, value)) / self._factor())

    def nested_lr_scale(self, active, lr_scale):
        if not self.n_params:
            return lr_scale
        h, f = self.hparams, self.learning_rate_factor
        s = self.nested.step_counts()
        on = active != 0
        f[on & (s == 0)] = 1
        start = h["decay_start"]
        decay = on & (s >= start) & ((s - start) % h["decay_interval"] == 0) & (s <= h["decay_end"])
        f[decay] *= np.float32(h["decay_base"])
        return f.copy() if lr_scale is None else (lr_scale * f).astype(np.float32)
