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
``learning_rate`` uses instance 0's factor (a read-back). The factor is a kernel array updated
by one small kernel per step from the device step counts, which also writes the nested scale.
State: ``learning_rate_factor`` ``(K,)`` plus ``nested.*``.
"""
import dataclasses

import numpy as np
import taichi as ti

from ..keys import CLOSED_UNIT, NON_NEGATIVE, POSITIVE_INT, Key
from ..registry import optimizers
from ..runtime.kernels import ARENA, arena_kernel
from .optimizer import F32_1D, I32_1D, zeros
from .step import count_skipped, gate, gate_args
from .wrapper import Wrapper, check_learning_rate


@arena_kernel
def _decay(factor: F32_1D, scale: F32_1D, outer: F32_1D, active: I32_1D, steps: I32_1D, base: ti.f32,
           start: ti.i32, interval: ti.i32, end: ti.i32, scaled: ti.template(), source: I32_1D, G: ARENA,
           go: ti.i32, gn: ti.i32, skipped: I32_1D, inv_scale: ti.f32):
    """The step's first kernel: its gate (``step.py``), then update ``factor`` of the ``active`` networks (module
    docstring) and write ``scale = factor`` (times ``outer``, an enclosing wrapper's scale, with ``scaled``)."""
    gate(source, G, 0, go, gn, inv_scale, active)
    for k in range(factor.shape[0]):
        s = steps[k]
        if active[k]:
            if s == 0:
                factor[k] = 1.0
            if s >= start and (s - start) % interval == 0 and s <= end:
                factor[k] *= base
        scale[k] = factor[k]
        if ti.static(scaled):
            scale[k] = outer[k] * factor[k]
        count_skipped(source, active, skipped, k)


@optimizers.register("ExponentialDecay")
class ExponentialDecay(Wrapper):
    otype = "ExponentialDecay"
    KEYS = {"decay_base": Key(0.1, CLOSED_UNIT, "factor applied to the learning rate at each decay"),
            "decay_start": Key(10000, NON_NEGATIVE, "steps before the first decay"),
            "decay_interval": Key(10000, POSITIVE_INT, "steps between decays"),
            "decay_end": Key(10000000, NON_NEGATIVE, "no decay after this step")}
    STATE = ("learning_rate_factor",)

    def create_state(self):
        self.learning_rate_factor = zeros((self.n_instances,), ti.f32)
        self.learning_rate_factor.fill(1.0)
        self._scale = zeros((self.n_instances,), ti.f32)

    def _factor(self) -> np.float32:
        if self.slot is None or not self.n_params:
            return np.float32(1)
        return self.learning_rate_factor.to_numpy()[0]

    @property
    def learning_rate(self) -> float:
        return float(np.float32(self.nested.learning_rate) * self._factor())

    @learning_rate.setter
    def learning_rate(self, value: float):
        self.nested.learning_rate = float(np.float32(check_learning_rate(self, value)) / self._factor())

    def gates_before(self) -> bool:
        return bool(self.n_params)

    def before_nested(self, step):
        if self.n_params:
            h, outer = self.hparams, step.lr_scale
            _decay(self.learning_rate_factor, self._scale, self._scale if outer is None else outer, step.mask,
                   self.nested.steps_array(), h["decay_base"], h["decay_start"], h["decay_interval"],
                   h["decay_end"], outer is not None, *gate_args(step, self.slot.grads, self._skipped),
                   1.0 / step.loss_scale)

    def nested_step(self, step):
        return dataclasses.replace(step, lr_scale=self._scale) if self.n_params else step
